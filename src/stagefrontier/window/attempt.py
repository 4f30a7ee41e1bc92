"""Which attempt of a job this process belongs to: torchelastic's run id and restart count.

A restarted job starts its windows at 0 again, so the attempt scopes the store keys of a window
and tells the records and packets of one attempt from another's in the same output folder."""

from __future__ import annotations

from ..environment import restart_count, run_id


def current_attempt() -> tuple[str, int]:
    """``(run id, restart count)``: ``TORCHELASTIC_RUN_ID`` (else ``STAGEFRONTIER_RUN_ID``, else
    ``"run"``) and ``TORCHELASTIC_RESTART_COUNT`` (0 outside torchelastic)."""
    return run_id(), restart_count()
