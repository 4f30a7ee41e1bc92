"""Every ``STAGEFRONTIER_*`` environment variable the library reads, named and read here only.

The limits on what the readers take in (``formats.limits``) and the run id that scopes a job's
store keys and records (``record.attempt``) come from the environment, read at each use (a
test or a launcher may set them at any time). ``VARIABLES`` lists each with its default and
what it sets; the configuration page of the documentation is checked against it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import ReportFormatError

MiB = 1 << 20


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, its default and what it sets."""

    name: str
    default: int | str
    what: str


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
    "0",
    "1: SIGTERM closes every open timer before the process ends (record.on_sigterm)",
)
VARIABLES: dict[str, Variable] = {v.name: v for v in (*LIMITS.values(), RUN_ID, SIGTERM)}


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


def run_id() -> str:
    """The job's run id: ``TORCHELASTIC_RUN_ID``, else ``STAGEFRONTIER_RUN_ID``, else ``run``."""
    return (
        os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get(RUN_ID.name) or str(RUN_ID.default)
    )


def restart_count() -> int:
    """torchelastic's ``TORCHELASTIC_RESTART_COUNT`` (0 outside torchelastic)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def closes_on_sigterm() -> bool:
    """Whether a timer installs its SIGTERM handler (``STAGEFRONTIER_SIGTERM=1``)."""
    return os.environ.get(SIGTERM.name, "").strip() == "1"
