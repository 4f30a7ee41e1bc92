"""``machine_support``: a test marked ``machine_to_itself`` runs with no other worker's test
beside it; the others share the machine. Two real processes and real ``flock`` locks."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from machine_support import hold_machine


def _hold(alone: bool, run_id: str, held: Path, release: Path) -> None:
    import os

    os.environ["PYTEST_XDIST_TESTRUNUID"] = run_id
    with hold_machine(alone=alone):
        held.write_text("held")
        while not release.exists():
            time.sleep(0.01)


def _other_worker(alone: bool, run_id: str, tmp_path: Path) -> tuple[Any, Path, Path]:
    held, release = tmp_path / f"held-{alone}", tmp_path / f"release-{alone}"
    context = multiprocessing.get_context("spawn")
    proc = context.Process(target=_hold, args=(alone, run_id, held, release))
    proc.start()
    while not held.exists():
        assert proc.is_alive()
        time.sleep(0.01)
    return proc, held, release


def _hold_here(alone: bool, got: threading.Event, done: threading.Event) -> None:
    with hold_machine(alone=alone):
        got.set()
        done.wait()


@pytest.mark.parametrize(("theirs", "mine"), [(True, False), (False, True), (True, True)])
def test_an_exclusive_hold_waits_for_the_other_workers_test_and_keeps_it_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, theirs: bool, mine: bool
) -> None:
    run_id = f"test-{tmp_path.name}"
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run_id)
    proc, _, release = _other_worker(theirs, run_id, tmp_path)
    got, done = threading.Event(), threading.Event()
    here = threading.Thread(target=_hold_here, args=(mine, got, done))
    here.start()
    try:
        assert not got.wait(1.0)  # the other worker's test still holds the machine
        release.write_text("go")
        assert got.wait(60.0)
    finally:
        release.write_text("go")
        done.set()
        here.join(60.0)
        proc.join(60.0)
    assert proc.exitcode == 0


def test_shared_holds_run_side_by_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = f"test-{tmp_path.name}"
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run_id)
    proc, _, release = _other_worker(False, run_id, tmp_path)
    try:
        with hold_machine(alone=False):  # would wait forever if shared holds excluded each other
            release.write_text("go")
    finally:
        release.write_text("go")
        proc.join(60.0)
    assert proc.exitcode == 0


def test_without_xdist_nothing_is_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    with hold_machine(alone=True), hold_machine(alone=True):
        pass
