"""A capture request from outside the job (``stagefrontier capture``), through the job's store."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from .requests import MANUAL_ANSWER_KEY, MANUAL_KEY, ManualRequest

POLL_S = 0.2


def request_capture(
    host: str,
    port: int,
    ranks: list[int],
    steps: int,
    stage: str | None = None,
    run_id: str | None = None,
    attempt: int = 0,
    wait_s: float = 120.0,
) -> str | None:
    """Write the request under the job's attempt prefix and wait for rank 0's answer (the
    incident folder, or why it was refused); None when none came within ``wait_s``."""
    import torch.distributed as dist

    from ..record.attempt import current_attempt

    run = run_id or current_attempt()[0]
    client: Any = dist.TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    store = dist.PrefixStore(f"stagefrontier/{run}/{attempt}", client)
    if store.check([MANUAL_ANSWER_KEY]):
        store.delete_key(MANUAL_ANSWER_KEY)
    store.set(MANUAL_KEY, ManualRequest(tuple(ranks), steps, stage).encode())
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if store.check([MANUAL_ANSWER_KEY]):
            answer = bytes(store.get(MANUAL_ANSWER_KEY)).decode(errors="replace")
            store.delete_key(MANUAL_ANSWER_KEY)
            return answer
        time.sleep(POLL_S)
    return None
