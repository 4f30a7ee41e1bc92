"""Every ``STAGEFRONTIER_*`` environment variable the library reads, named and read here only.

The limits on what the readers take in (``formats.limits``) and the run id that scopes a job's
store keys and records (``current_attempt``) come from the environment, read at each use (a
test or a launcher may set them at any time). ``VARIABLES`` lists each with its default and
what it sets; the configuration page of the documentation is checked against it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ReportFormatError

MiB = 1 << 20


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, its default and what it sets; ``field``: the
    setting of the timer's configuration tree (``record.config.TimerConfig``) it gives, as a
    dotted path from ``TimerConfig``, or empty when it sets none (the readers' limits, say)."""

    name: str
    default: int | str
    what: str
    field: str = ""


LIMITS: dict[str, Variable] = {
    "packet_bytes": Variable("STAGEFRONTIER_MAX_PACKET_BYTES", 64 * MiB, "bytes for a packet"),
    "records_bytes": Variable(
        "STAGEFRONTIER_MAX_RECORDS_BYTES", 256 * MiB, "bytes for a windows.jsonl"
    ),
    "incident_bytes": Variable(
        "STAGEFRONTIER_MAX_INCIDENT_BYTES", 16 * MiB, "bytes for an incident.json"
    ),
    "trace_bytes": Variable("STAGEFRONTIER_MAX_TRACE_BYTES", 1024 * MiB, "bytes for a JSON trace"),
    "inflate_ratio": Variable(
        "STAGEFRONTIER_MAX_INFLATE_RATIO", 50, "times the compressed size when inflated"
    ),
    "cells": Variable("STAGEFRONTIER_MAX_CELLS", 1 << 25, "steps x ranks x stages in a window"),
    "world_size": Variable("STAGEFRONTIER_MAX_WORLD_SIZE", 1 << 17, "ranks in a world"),
}
"""The readers' size limits (``formats.limits``), by the name the readers use."""
RUN_ID = Variable(
    "STAGEFRONTIER_RUN_ID",
    "run",
    "the run id outside torchelastic (under it, TORCHELASTIC_RUN_ID is used)",
)
SIGTERM = Variable(
    "STAGEFRONTIER_SIGTERM",
    "1",
    "0: a SIGTERM no longer closes every open timer before the process ends (record.on_sigterm)",
)
AUTO: dict[str, Variable] = {
    "switch": Variable(
        "STAGEFRONTIER_AUTO",
        "0",
        "1: a launcher's worker times its script with the automatic hooks (stagefrontier run)",
    ),
    "out": Variable(
        "STAGEFRONTIER_OUT",
        "stagefrontier",
        "the automatic hooks' output folder",
        "collection.out_dir",
    ),
    "window": Variable(
        "STAGEFRONTIER_WINDOW", 100, "the automatic hooks' steps per window", "window"
    ),
    "router": Variable(
        "STAGEFRONTIER_ROUTER", "0", "1: the automatic hooks' profiler router on", "router"
    ),
    "sinks": Variable(
        "STAGEFRONTIER_SINKS",
        "",
        "the automatic hooks' extra sinks (a, b, ...)",
        "collection.sinks",
    ),
}
"""The settings of ``stagefrontier run`` carried to its workers (``auto.options``)."""
DISK_BUDGET = Variable(
    "STAGEFRONTIER_DISK_BUDGET_MB",
    1024,
    "MiB the output folder may hold before older packets are compacted (sinks.output_folder)",
)
CLOSE_DEADLINE = Variable(
    "STAGEFRONTIER_CLOSE_DEADLINE_S",
    "30",
    "seconds a timer's close() may take on a rank, from 1 to 3600 (deadline.close_deadline_s)",
)
VARIABLES: dict[str, Variable] = {
    v.name: v
    for v in (*LIMITS.values(), RUN_ID, SIGTERM, DISK_BUDGET, CLOSE_DEADLINE, *AUTO.values())
}


def auto_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The automatic hooks' settings as set in ``environ`` (the process's by default), by the
    names of ``AUTO``; those not set are left out."""
    env = os.environ if environ is None else environ
    return {key: env[v.name] for key, v in AUTO.items() if v.name in env}


def auto_env(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` (by the names of ``AUTO``) as environment variables."""
    return {AUTO[key].name: value for key, value in settings.items()}


def positive_int(name: str) -> int:
    """Variable ``name``'s value as a positive integer (``1_000`` allowed), its default when it
    is unset or blank.

    Raises:
        ReportFormatError: the variable is set to anything but a positive integer.
    """
    default = VARIABLES[name].default
    assert isinstance(default, int), name
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    value = text.strip().replace("_", "")
    if not value.isdigit() or int(value) < 1:
        raise ReportFormatError(f"{name}={text!r}: expected a positive integer")
    return int(value)


def disk_budget_bytes() -> int:
    """The output folder's byte budget: ``STAGEFRONTIER_DISK_BUDGET_MB`` MiB (1 GiB unset).

    Raises:
        ReportFormatError: the variable is set to anything but a positive integer.
    """
    return positive_int(DISK_BUDGET.name) * MiB


def run_id() -> str:
    """The job's run id: ``TORCHELASTIC_RUN_ID``, else ``STAGEFRONTIER_RUN_ID``, else ``run``."""
    return (
        os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get(RUN_ID.name) or str(RUN_ID.default)
    )


def restart_count() -> int:
    """torchelastic's ``TORCHELASTIC_RESTART_COUNT`` (0 outside torchelastic)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def current_attempt() -> tuple[str, int]:
    """Which attempt of a job this process belongs to: ``(run id, restart count)``. A restarted
    job starts its windows at 0 again, so the attempt scopes the store keys of a window and
    tells the records and packets of one attempt from another's in the same output folder."""
    return run_id(), restart_count()


def close_deadline_text() -> str:
    """``STAGEFRONTIER_CLOSE_DEADLINE_S`` as set, stripped (empty when unset): read at each
    close, its seconds checked by ``deadline.close_deadline_s``."""
    return os.environ.get(CLOSE_DEADLINE.name, "").strip()


def closes_on_sigterm() -> bool:
    """Whether a timer installs its SIGTERM handler (unless ``STAGEFRONTIER_SIGTERM=0``)."""
    return os.environ.get(SIGTERM.name, "").strip() != "0"
