"""A data-wait incident whose captured steps miss the main thread's wait is confirmed by the
suspect's DataLoader workers' own profile, only when their lead is material
(``route.worker_profile.confirm_by_workers``). Seen on pytorch/examples' DDP script with two
workers: three incidents of three stayed "not confirmed" while their op diff named the sleeping
``__getitem__``."""

from __future__ import annotations

from typing import Any

import pytest

from stagefrontier.route.worker_profile import confirm_by_workers

SLOW = "datautils.py(15): __getitem__ › <built-in method time.sleep>"


def _incident(stage: str = "data.next_wait", confirmed: bool | None = False) -> dict[str, Any]:
    return {
        "stage": stage,
        "confirmed": confirmed,
        "leader_rank": 2,
        "reference_rank": 0,
        "baseline_step_ms": 70.0,
        "capture_step_ms": 55.0,
        "reasons": [],
    }


def _rows(suspect_ms: float, reference_ms: float = 0.0) -> list[dict[str, Any]]:
    return [
        {"name": SLOW, "suspect_ms_per_batch": suspect_ms, "reference_ms_per_batch": reference_ms}
    ]


def test_a_material_lead_in_the_workers_confirms_and_says_how() -> None:
    incident = _incident()
    confirm_by_workers(incident, _rows(140.0), workers=2, min_share=0.1)
    assert incident["confirmed"] is True
    (reason,) = incident["reasons"]
    assert reason.startswith("confirmed by the DataLoader workers' profile: `" + SLOW), reason
    assert "140.0 ms per batch on rank 2 against 0.0 ms on rank 0" in reason, reason
    assert "70.0 ms per step among its 2 workers" in reason, reason
    assert "(55.0 ms a step during the capture)" in reason, reason


@pytest.mark.parametrize(
    ("incident", "rows", "workers"),
    [
        # 12 ms a batch among 2 workers is 6 ms a step, under 10% of the 70 ms step.
        (_incident(), _rows(12.0), 2),
        # The same lead on both ranks is no lead.
        (_incident(), _rows(140.0, 139.0), 2),
        # Only a data wait is the workers' to confirm.
        (_incident(stage="model.backward_cpu_wall"), _rows(140.0), 2),
        # Confirmed or not reduced: the traces' answer stands.
        (_incident(confirmed=True), _rows(140.0), 2),
        (_incident(confirmed=None), _rows(140.0), 2),
        # No worker count, no profile rows.
        (_incident(), _rows(140.0), 0),
        (_incident(), [], 2),
    ],
)
def test_anything_less_leaves_the_traces_answer(
    incident: dict[str, Any], rows: list[dict[str, Any]], workers: int
) -> None:
    before = incident["confirmed"]
    confirm_by_workers(incident, rows, workers=workers, min_share=0.1)
    assert incident["confirmed"] is before and incident["reasons"] == []
