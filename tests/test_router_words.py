"""The router's words for a setting without a store (issue 37, item 12)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")


def _single_process_timer(tmp_path: Path, router: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A timer of one process with no store at all (no process group, no MASTER_ADDR/PORT)."""
    from stagefrontier import CollectConfig, StageTimer, TimerConfig

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    collection = CollectConfig("local", out_dir=tmp_path, log=False)
    return StageTimer(
        config=TimerConfig(
            stages=["data.next_wait"], window=5, collection=collection, router=router
        )
    )


def test_a_single_process_router_without_a_store_says_so_in_the_librarys_words(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37, item 12: a single-process timer with a router and no store said only
    ``'MASTER_ADDR'`` (a KeyError's text)."""
    from stagefrontier import ProfilerRouter

    caplog.set_level(logging.WARNING, logger="stagefrontier")
    timer = _single_process_timer(tmp_path, ProfilerRouter(), monkeypatch)
    for _ in range(5000):
        if "capture request" in caplog.text:
            break
        with timer.step(), timer.stage("data.next_wait"):
            time.sleep(0.01)
    timer.close()
    said = [r.getMessage() for r in caplog.records if "capture request" in r.getMessage()]
    assert len(said) == 1, said
    assert "no store to use: no process group, no store given" in said[0]


def test_a_single_process_router_without_a_store_tries_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the router tried to open a store every 5 s (backing off from its poll) for as
    long as the process ran, though a process given none never gets one."""
    from stagefrontier import ProfilerRouter
    from stagefrontier.collect import store

    opened: list[object] = []
    real = store.open_connection

    def counted(*args: object, **kwargs: object) -> object:
        opened.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "open_connection", counted)
    caplog.set_level(logging.WARNING, logger="stagefrontier")
    timer = _single_process_timer(tmp_path, ProfilerRouter(poll_s=0.01), monkeypatch)
    steps = 0
    while steps < 5000 and not opened:
        with timer.step(), timer.stage("data.next_wait"):
            time.sleep(0.01)
        steps += 1
    for _ in range(100):  # six back-offs of the poll's 10 ms and more: 0.6 s
        with timer.step(), timer.stage("data.next_wait"):
            time.sleep(0.01)
    timer.close()
    assert len(opened) == 1, len(opened)
    said = [r.getMessage() for r in caplog.records if "capture request" in r.getMessage()]
    assert len(said) == 1 and "no store to use" in said[0], said
