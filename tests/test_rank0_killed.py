"""Rank 0 killed (SIGKILL or SIGTERM) while the job's store stays up, as when the launcher's
agent holds the store (issue 37, item 4): the other ranks say it once and keep their own windows
on local disk, the last ones rank 0 never collected included; rank 0 ended by SIGTERM first
writes its window being recorded; a rank 0 that starts late is not taken for a dead one.

Real processes: the store server lives in the test process (the agent's place), rank 0 and
rank 1 are processes of their own, and rank 0 signals itself in the middle of a window.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rank_support import started_ranks

pytest.importorskip("torch")

STAGE = "data.next_wait"
WINDOW = 5
HALF = 2
"""The steps rank 0 records of its last window before its signal."""
TIMEOUT_S = 1.0
DEADLINE_S = 240.0
GONE = "rank 0 has collected no window"


def _timed_steps(timer: Any, steps: int) -> None:
    for _ in range(steps):
        with timer.step(), timer.stage(STAGE):
            time.sleep(0.05)


def _timer(rank: int, folder: Path, port: int) -> Any:
    import torch.distributed as dist

    from stagefrontier import StageTimer, TimerConfig
    from stagefrontier.collect import CollectorSettings, StoreCollector

    client = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    settings = CollectorSettings(rank, 2, folder, TIMEOUT_S, regression=None)
    return StageTimer(
        config=TimerConfig(stages=[STAGE], window=WINDOW),
        collector=StoreCollector(settings, store=client),
    )


def _rank0(rank: int, job: tuple[str, int], port: int) -> None:
    """Three windows collected, then ``HALF`` steps of the next one and the signal ``job[1]``:
    the signal, not this function, must end the process (it returns, exit 0, if not)."""
    folder = Path(job[0])
    timer = _timer(rank, folder, port)
    records = folder / "windows.jsonl"
    while not (records.exists() and records.read_bytes().count(b"\n") >= 3):
        _timed_steps(timer, WINDOW)
    _timed_steps(timer, HALF)
    os.kill(os.getpid(), job[1])
    _timed_steps(timer, WINDOW)


def _kept_warnings() -> list[str]:
    """The library's WARNING lines this process logs from now on."""
    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    logging.getLogger("stagefrontier").addHandler(Keep(logging.WARNING))
    return warnings


def _rank1(rank: int, job: tuple[str, int], port: int) -> None:
    folder = Path(job[0])
    warnings = _kept_warnings()
    timer = _timer(rank, folder, port)
    deadline = time.monotonic() + DEADLINE_S / 2
    while not any(GONE in w for w in warnings) and time.monotonic() < deadline:
        _timed_steps(timer, WINDOW)
    _timed_steps(timer, 2 * WINDOW)  # after the take-over: kept here at once
    timer.close()
    (folder / "rank1.json").write_text(json.dumps({"warnings": warnings}))


def _records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``windows.jsonl`` (one SIGKILL cut short is skipped)."""
    from stagefrontier.formats.records import read_records

    return list(read_records(path))


def _windows(path: Path) -> list[int]:
    """The windows of a ``windows.jsonl``."""
    return [record["window"] for record in _records(path)]


def _with_every_rank(path: Path) -> bool:
    """Whether a window of ``path`` (a ``windows.jsonl``) holds every rank."""
    from stagefrontier.formats.records import read_records

    return path.exists() and any(not record["missing_ranks"] for record in read_records(path))


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_the_other_ranks_say_rank_0_is_gone_once_and_keep_their_windows(
    tmp_path: Path, signum: int
) -> None:
    """Before: rank 1 trained on and wrote every window into the store, said nothing, and no
    window after rank 0's death was kept anywhere. SIGTERM (a launcher ending rank 0, before
    SIGKILL): rank 0 closes first, and its last record is its window being recorded, ``HALF``
    steps (before, and with ``STAGEFRONTIER_SIGTERM=0``: those steps were lost)."""
    with started_ranks([_rank0, _rank1], (str(tmp_path), signum)) as (rank0, rank1):
        rank0.join(DEADLINE_S)
        assert rank0.exitcode == -signum
        rank1.join(DEADLINE_S)
        assert rank1.exitcode == 0, f"rank 1 exit code {rank1.exitcode}"
    warnings = json.loads((tmp_path / "rank1.json").read_text())["warnings"]
    gone = [w for w in warnings if GONE in w]
    assert len(gone) == 1, warnings
    assert str(tmp_path / "rank-1") in gone[0]
    collected = _windows(tmp_path / "windows.jsonl")
    kept = _windows(tmp_path / "rank-1" / "windows.jsonl")
    # every window of rank 1 is somewhere: rank 0's record up to its death, rank 1's own after
    # (the last one rank 0 wrote may be kept too: rank 0 died before it counted it done)
    assert collected == list(range(len(collected)))
    assert kept[0] in (len(collected) - 1, len(collected)), (collected, kept)
    assert kept == list(range(kept[0], kept[0] + len(kept)))
    assert len(kept) >= 3
    assert sorted(p.name for p in (tmp_path / "rank-1" / "packets").glob("window-*.json")) == [
        f"window-{w:06d}.json" for w in kept
    ]
    last = _records(tmp_path / "windows.jsonl")[-1]
    steps = (last["first_step"], last["last_step"], last["n_steps"])
    first = WINDOW * last["window"]
    if signum == signal.SIGTERM:  # rank 0's window being recorded: its record and its packet
        assert steps == (first, first + HALF - 1, HALF), last
        assert (tmp_path / "packets" / f"window-{last['window']:06d}.json").exists()
    else:
        assert steps == (first, first + WINDOW - 1, WINDOW), last


def _late_rank0(rank: int, job: str, port: int) -> None:
    folder = Path(job)
    while not (folder / "rank1-waited").exists():  # rank 1 trains alone first
        time.sleep(0.05)
    timer = _timer(rank, folder, port)
    records = folder / "windows.jsonl"
    while not _with_every_rank(records):  # rank 1's windows reach rank 0
        _timed_steps(timer, WINDOW)
    timer.close()
    (folder / "rank0-done").touch()


def _rank1_before_rank0(rank: int, job: str, port: int) -> None:
    from stagefrontier.collect.rank0_watch import SILENT_MARGIN_S

    folder = Path(job)
    warnings = _kept_warnings()
    timer = _timer(rank, folder, port)
    alone_until = time.monotonic() + 2 * TIMEOUT_S + SILENT_MARGIN_S + 1
    while time.monotonic() < alone_until:  # past the silence a dead rank 0 is judged by
        _timed_steps(timer, WINDOW)
    (folder / "rank1-waited").touch()
    while not (folder / "rank0-done").exists():
        _timed_steps(timer, WINDOW)
    timer.close()
    (folder / "rank1.json").write_text(json.dumps({"warnings": warnings}))


def test_a_rank_0_slow_to_start_is_not_judged_gone(tmp_path: Path) -> None:
    """Rank 1 trains alone for longer than a dead rank 0's silence, then rank 0 starts. Before,
    rank 1 judged it gone, stopped sending and kept its windows itself, and rank 0 collected
    none of them (a slow rank 0 under load failed the test above this way: rank 1 took back its
    windows from window 0, which rank 0 had written too)."""
    with started_ranks([_late_rank0, _rank1_before_rank0], str(tmp_path)) as ranks:
        for proc in ranks:
            proc.join(DEADLINE_S)
            assert proc.exitcode == 0, f"exit code {proc.exitcode}"
    warnings = json.loads((tmp_path / "rank1.json").read_text())["warnings"]
    assert not [w for w in warnings if GONE in w], warnings
    assert not (tmp_path / "rank-1").exists()
