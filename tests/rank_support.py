"""How the tests' real jobs start their ranks, and what every rank does first (the job modules'
``run_rank``): one OpenMP thread, then the Gloo process group around the parent's TCPStore.

Jobs launched as commands (torchrun, ``stagefrontier run``, an example script) go through
``run_job``; torchrun's own launches use ``--standalone`` (``torchrun_command``), whose agent binds
its rendezvous store to a port of its own choosing. No test picks a free port and hands it on
later: another job on the machine (a second pytest worker's) could bind it in between.
``rendezvous_endpoint`` holds the store that several torchrun agents meet at, and
``refused_port`` holds a port that nothing can listen on.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

START_METHOD = "forkserver"
"""The ranks are forked from a server that imported torch once per test session
(``stagefrontier.demo.launch.FORKSERVER_PRELOAD``) instead of spawned: a 2-rank job then starts in
about a second, where two spawned ranks each import torch first (13 to 22 s a job on a loaded
2-core machine). Each rank still sets itself up (seeds, environment, process group)."""


def rank_context() -> Any:
    """The multiprocessing context of ``START_METHOD``, its server importing what the demo's
    ranks import (``stagefrontier.demo.launch.FORKSERVER_PRELOAD``, as ``run_ranks`` asks): for
    a test's own processes (a rank started by hand, DataLoader workers), which then fork from
    that single-threaded server, never from the test's process and its threads."""
    from stagefrontier.demo.launch import FORKSERVER_PRELOAD

    context = multiprocessing.get_context(START_METHOD)
    context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return context


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


@contextlib.contextmanager
def started_ranks(
    targets: Sequence[Callable[[int, Any, int], None]], payload: Any
) -> Iterator[list[Any]]:
    """Start ``targets[r](r, payload, port)`` as rank r of a job, each a process from the fork
    server (``START_METHOD``), around a loopback TCPStore this process holds (a launcher's
    agent's place: the store outlives any rank). Yields the processes, for a test that signals
    them itself; those still alive when the ``with`` ends are killed."""
    from stagefrontier.demo.launch import loopback_store

    store = loopback_store(len(targets))
    context = rank_context()
    procs = [
        context.Process(target=target, args=(rank, payload, store.port), daemon=True)
        for rank, target in enumerate(targets)
    ]
    for proc in procs:
        proc.start()
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)
        del store


def join_torchrun_gloo(timeout_s: float = 120.0) -> int:
    """What a rank torchrun started does first (the torchrun job modules): one OpenMP thread, then
    the Gloo process group from torchrun's environment, ``timeout_s`` bounding every collective.
    Returns this rank."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    return int(os.environ["RANK"])


def backward_and_step(timer: Any, loss: Any, optimizer: Any) -> None:
    """The end of a job module's step: the backward and the optimizer step, each its stage."""
    with timer.stage("model.backward_cpu_wall"):
        loss.backward()
    with timer.stage("optim.step_cpu_wall"):
        optimizer.step()
        optimizer.zero_grad()


def leave_gloo(timer: Any) -> None:
    """What a job module's rank does last: close its timer, wait for every rank to have closed
    its own (none tears the group down under another's last window), then leave the group and
    freeze what is left out of the collector's reach before the process ends (as
    ``stagefrontier.demo.train.leave_process_group`` does: the teardown's collections cost
    about 0.4 s of CPU a torchrun rank)."""
    import gc

    import torch.distributed as dist

    timer.close()
    dist.barrier()
    dist.destroy_process_group()
    gc.freeze()


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


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What a launcher tells its ranks: a job the tests start gets its own, never the test's."""


def job_env(**extra: str) -> dict[str, str]:
    """The environment of a job a test launches: this one without any rank's variables, one
    OpenMP thread, unbuffered output, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def run_job(
    command: Sequence[str],
    deadline_s: float,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (in ``job_env()`` unless ``env`` is given) to its end within
    ``deadline_s``; with ``check``, asserts it exited 0, the tail of its output in the message."""
    done = subprocess.run(
        list(command),
        env=job_env() if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=deadline_s,
        check=False,
    )
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def torchrun_command(script: Path, *args: str, ranks: int) -> list[str]:
    """``python -m torch.distributed.run --standalone`` with ``ranks`` workers on this machine and
    no restart, running ``script ARGS``. ``--standalone`` makes the agent host the rendezvous
    store on a port the kernel picks as it binds (torch's ``localhost:0`` endpoint), and the
    workers meet at a store the agent binds the same way: no port is chosen before it is held."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        "--max-restarts=0",
        str(script),
        *args,
    ]


@contextlib.contextmanager
def rendezvous_endpoint() -> Iterator[str]:
    """``HOST:PORT`` of a TCPStore this process holds on a loopback port of the kernel's choosing,
    for torchrun agents that must all be told where to meet (several nodes on this machine:
    ``--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-conf is_host=0``, each agent a client
    of it). The store lives until the ``with`` ends."""
    from stagefrontier.collect.node_store import LOOPBACK, loopback_store

    store = loopback_store()
    try:
        yield f"{LOOPBACK}:{store.port}"
    finally:
        del store


@contextlib.contextmanager
def agent_store_env() -> Iterator[dict[str, str]]:
    """The variables that make every rank of a job a framework starts itself (Lightning's ``ddp``
    strategy runs the script again per rank) a client of a store this process holds: its
    address, and torch's switch that a launcher's agent hosts the store, so that the ranks'
    ``env://`` rendezvous binds no port of its own (a port the framework picked free, then bound
    in rank 0 seconds later, could be taken in between). Valid until the ``with`` ends."""
    with rendezvous_endpoint() as endpoint:
        host, _, port = endpoint.rpartition(":")
        yield {"MASTER_ADDR": host, "MASTER_PORT": port, "TORCHELASTIC_USE_AGENT_STORE": "True"}


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port bound by this process and never listened on, for as long as the ``with``
    lasts: a connection to it is refused at once, and no other process can take it meanwhile (a
    port closed after it was picked could be bound by another job's store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
