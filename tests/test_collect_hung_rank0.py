"""A hung rank 0 (SIGSTOP, with the job's store server in its process, as ``env://`` start-up
places it) must not hold another rank's ``close()`` for the collect timeout: the sender's join is
bounded on its own, and the warning says what the sender was waiting for."""

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

pytest.importorskip("torch")

from rank_support import rank_context

STAGE = "data.next_wait"
WINDOW = 5
TIMEOUT_S = 10.0
DEADLINE_S = 120.0


def _timed_steps(timer: Any, steps: int) -> None:
    for _ in range(steps):
        with timer.step(), timer.stage(STAGE):
            time.sleep(0.002)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _rank0(folder: Path) -> None:
    import torch.distributed as dist

    from stagefrontier import StageTimer, TimerConfig
    from stagefrontier.collect import CollectorSettings, StoreCollector

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    (folder / "port").write_text(str(server.port))
    collector = StoreCollector(CollectorSettings(0, 2, folder, TIMEOUT_S), store=server)
    timer = StageTimer(config=TimerConfig(stages=[STAGE], window=WINDOW), collector=collector)
    _timed_steps(timer, 2 * WINDOW)
    _wait_for(folder / "windows.jsonl")
    (folder / "stopping").write_text("")
    os.kill(os.getpid(), signal.SIGSTOP)  # hung: the store server in this process stops too


def _rank1(folder: Path) -> None:
    import torch.distributed as dist

    from stagefrontier import StageTimer, TimerConfig
    from stagefrontier.collect import CollectorSettings, StoreCollector

    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    logging.getLogger("stagefrontier").addHandler(Keep(logging.WARNING))
    _wait_for(folder / "port")
    port = int((folder / "port").read_text())
    client = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    collector = StoreCollector(CollectorSettings(1, 2, folder, TIMEOUT_S), store=client)
    timer = StageTimer(config=TimerConfig(stages=[STAGE], window=WINDOW), collector=collector)
    _timed_steps(timer, 2 * WINDOW)
    _wait_for(folder / "stopping")
    time.sleep(0.2)
    _timed_steps(timer, 2 * WINDOW)  # these windows go to a store that no longer answers
    started = time.monotonic()
    timer.close()
    result = {"close_s": time.monotonic() - started, "warnings": warnings}
    (folder / "rank1.json").write_text(json.dumps(result))


def test_close_on_another_rank_is_bounded_and_says_what_it_waited_for(tmp_path: Path) -> None:
    context = rank_context()  # forked from the session's server: torch imported once
    rank0 = context.Process(target=_rank0, args=(tmp_path,), daemon=True)
    rank1 = context.Process(target=_rank1, args=(tmp_path,), daemon=True)
    rank0.start()
    rank1.start()
    try:
        rank1.join(DEADLINE_S)
        assert rank1.exitcode == 0, f"rank 1 exit code {rank1.exitcode}"
    finally:
        for proc in (rank0, rank1):
            if proc.is_alive():
                proc.kill()  # SIGKILL ends a stopped process too
            proc.join(10)
    result = json.loads((tmp_path / "rank1.json").read_text())
    waited = [w for w in result["warnings"] if "stagefrontier-sender thread still" in w]
    assert len(waited) == 1, result["warnings"]
    # The bound is the sender's own, not the 10 s collect timeout (+5 s) that rank 0 uses,
    # and the warning names the store call the sender is stuck in.
    assert "after 2.0 s at close" in waited[0]
    assert "the store" in waited[0] and "unprocessed" in waited[0]
    assert not any("analysis" in w for w in result["warnings"])
