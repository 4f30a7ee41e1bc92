"""How the tests' real jobs start their ranks, and what every rank does first (the job modules'
``run_rank``): one OpenMP thread, then the Gloo process group around the parent's TCPStore."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

START_METHOD = "forkserver"
"""The ranks are forked from a server that imported torch once per test session
(``stagefrontier.demo.launch.FORKSERVER_PRELOAD``) instead of spawned: a 2-rank job then starts in
about a second, where two spawned ranks each import torch first (13 to 22 s a job on a loaded
2-core machine). Each rank still sets itself up (seeds, environment, process group)."""


def join_gloo(rank: int, world_size: int, port: int, timeout_s: float = 60.0) -> Any:
    """Join the job's Gloo process group as ``rank`` through the parent's TCPStore on ``port``
    (``stagefrontier.demo.launch.run_ranks`` made it); ``timeout_s`` bounds every collective.
    Returns this rank's client of that store."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False)
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return store


def stacks_to_file(path: Path) -> None:
    """A crash of this rank (SIGSEGV, SIGABRT) writes every thread's Python stack to ``path``, so
    a test that sees a rank die has something to read (stderr of a spawned rank is not kept)."""
    import faulthandler

    faulthandler.enable(file=open(path, "w"), all_threads=True)  # noqa: SIM115 (lives with the rank)


def log_to_file(path: Path) -> None:
    """The library's log lines (INFO and up) of this rank, written to ``path`` for the test."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("stagefrontier")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
