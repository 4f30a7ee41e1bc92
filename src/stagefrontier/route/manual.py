"""A capture request from outside the job (``stagefrontier capture``), through the job's store.

The client checks its arguments, reaches the store within its wait (a plain TCP connection
first, so a dead address is one line, not the store client's retries and C++ frames), fills
the manual slot only while it is empty (compare-and-set: two clients queue, neither overwrites
the other), and waits for the answer under its own request id.
"""

from __future__ import annotations

import math
import socket
import time
import uuid
from datetime import timedelta
from typing import Any

from ..errors import ReportFormatError, StageFrontierError
from ..formats.limits import MAX_CAPTURE_STEPS, limit
from ..formats.names import plain_name
from ..render.escape import first_line
from .requests import (
    MANUAL_KEY,
    ManualAnswer,
    ManualRequest,
    manual_answer_key,
    read_key,
)

POLL_S = 0.2
MAX_ROUTERS = 1023
"""The largest router index ``--router`` takes (routers open at once in one process)."""


def check_request(
    host: str, port: int, ranks: list[int], steps: int, attempt: int, wait_s: float, router: int = 0
) -> None:
    """Refuse what no job could answer, naming the option (StageFrontierError)."""
    if not host:
        raise StageFrontierError("--store must be HOST:PORT")
    if not 1 <= port <= 65535:
        raise StageFrontierError(f"--store port {port} is not a TCP port (1-65535)")
    top = limit("world_size") - 1
    if not ranks or any(not 0 <= r <= top for r in ranks):
        raise StageFrontierError(f"--ranks must name ranks in 0..{top}: {ranks}")
    if not 1 <= steps <= MAX_CAPTURE_STEPS:
        raise StageFrontierError(f"--steps must be 1..{MAX_CAPTURE_STEPS}: {steps}")
    if attempt < 0:
        raise StageFrontierError(f"--attempt is a restart count (>= 0): {attempt}")
    if not 0 <= router <= MAX_ROUTERS:
        raise StageFrontierError(
            f"--router counts a process's routers (0..{MAX_ROUTERS}): {router}"
        )
    if not (math.isfinite(wait_s) and wait_s > 0):
        raise StageFrontierError(f"--wait must be a positive number of seconds: {wait_s}")


def request_capture(
    host: str,
    port: int,
    ranks: list[int],
    steps: int,
    stage: str | None = None,
    run_id: str | None = None,
    attempt: int = 0,
    wait_s: float = 120.0,
    router: int = 0,
) -> ManualAnswer | None:
    """Write the request under the job's attempt prefix and wait for rank 0's answer to it;
    None when none came within ``wait_s``. ``router``: which router of rank 0's process to ask
    (0 the first opened, 1 the second: an evaluation timer's, say).

    Raises:
        StageFrontierError: a bad argument, or the store cannot be reached within ``wait_s``.
    """
    from ..collect.store import key_prefix
    from ..environment import current_attempt

    check_request(host, port, ranks, steps, attempt, wait_s, router)
    run = plain_name(run_id, "--run-id") if run_id is not None else current_attempt()[0]
    end = time.monotonic() + wait_s
    store = _connect(host, port, key_prefix(run, attempt, router), wait_s)
    request = ManualRequest(tuple(ranks), steps, stage, id=uuid.uuid4().hex[:16])
    assert request.id is not None
    encoded = request.encode()
    answer_key = manual_answer_key(request.id)
    placed = False
    try:
        while time.monotonic() < end:
            if not placed:
                placed = bytes(store.compare_set(MANUAL_KEY, b"", encoded)) == encoded
            elif (data := read_key(store, answer_key)) is not None:
                store.delete_key(answer_key)
                answer = ManualAnswer.decode(data)
                if answer.id != request.id:
                    raise ReportFormatError(f"answer to {answer.id}, not to {request.id}")
                return answer
            time.sleep(POLL_S)
        if placed and read_key(store, MANUAL_KEY) == encoded:
            store.delete_key(MANUAL_KEY)  # nobody took it: withdraw it
    except ReportFormatError as exc:
        raise StageFrontierError(f"rank 0's answer is unreadable: {exc}") from None
    except RuntimeError as exc:  # the store went away mid-way
        raise StageFrontierError(f"the store at {host}:{port} failed: {first_line(exc)}") from None
    return None


def _connect(host: str, port: int, prefix: str, wait_s: float) -> Any:
    """A client of the job's store under ``prefix``, or one line saying why there is none."""
    try:
        with socket.create_connection((host, port), timeout=min(wait_s, 10.0)):
            pass
    except OSError as exc:
        raise StageFrontierError(
            f"cannot reach the store at {host}:{port}: {exc.strerror or exc} (is the job "
            "running, and is this its MASTER_ADDR:MASTER_PORT?)"
        ) from None
    import torch.distributed as dist

    try:
        client = dist.TCPStore(
            host,
            port,
            is_master=False,
            timeout=timedelta(seconds=wait_s),
            wait_for_workers=False,
        )
    except RuntimeError as exc:
        raise StageFrontierError(
            f"{host}:{port} does not answer as a c10d store: {first_line(exc)}"
        ) from None
    return dist.PrefixStore(prefix, client)
