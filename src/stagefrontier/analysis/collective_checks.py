"""The timed collectives' fields checked as they are read: a rank's window field as sent and
the parts of a record's ``collectives`` (``analysis.collectives``); each check raises
ReportFormatError naming what is wrong."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ReportFormatError
from .values import is_int


def none_or_ms(value: Any) -> bool:
    """Null or a finite number of milliseconds >= 0."""
    return value is None or (
        type(value) in (int, float) and bool(np.isfinite(value)) and value >= 0
    )


def checked_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ReportFormatError(f"{where} must be a list")
    return value


def checked_key(value: Any, where: str) -> tuple[str, int, str | None, int, int]:
    """``[family, bucket, stage or null, call, bytes]``."""
    if (
        not isinstance(value, list)
        or len(value) != 5
        or not isinstance(value[0], str)
        or not (value[2] is None or isinstance(value[2], str))
        or not all(is_int(v) and v >= 0 for v in (value[1], value[3], value[4]))
    ):
        raise ReportFormatError(f"{where}: a key must be [family, bucket, stage, call, bytes]")
    return value[0], value[1], value[2], value[3], value[4]


def check_rank_collectives(value: Any, where: str) -> dict[str, Any]:
    """A rank's window field as sent (``record.collectives.CollectiveLog.drain``), checked:
    ``{}`` or ``keys``, ``calls`` (``[step, key, reached_us, issued_us, wait_us]`` and, where
    read, ``queued_us``; the key an index into ``keys``) and ``untimed``; raises
    ReportFormatError."""
    if not isinstance(value, dict):
        raise ReportFormatError(f"{where} must be an object")
    if not value:
        return value
    if set(value) - {"run_queue_us"} != {"keys", "calls", "untimed"}:
        raise ReportFormatError(f"{where} must hold keys, calls and untimed")
    queued = value.get("run_queue_us")
    if not (queued is None or (is_int(queued) and queued >= 0)):
        raise ReportFormatError(f"{where} run_queue_us must be null or a count of microseconds")
    keys = [checked_key(k, where) for k in checked_list(value["keys"], where)]
    for call in checked_list(value["calls"], where):
        if not (
            isinstance(call, list)
            and len(call) in (5, 6)
            and all(is_int(v) for v in call)
            and 0 <= call[1] < len(keys)
            and call[0] >= 0
            and min(call[4:]) >= 0
        ):
            raise ReportFormatError(
                f"{where}: a call must be [step, key, reached, issued, wait] and its queued wait"
            )
    if not all(isinstance(u, str) for u in checked_list(value["untimed"], where)):
        raise ReportFormatError(f"{where} untimed must be a list of strings")
    return value
