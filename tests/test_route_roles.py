"""The router's decision on a window whose ranks play different roles: taken inside the role
that bounds the step, on that role's own report, with a reference rank of the same role."""

from __future__ import annotations

import numpy as np

from stagefrontier.route.decide import decide
from stagefrontier.window.merged import analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow

STAGES = ("data.next_wait", "pp.schedule", "dp.grad_sync", "step.other_cpu_wall")


def pipeline_window(stall_in: str) -> object:
    """10 steps of 2 pipeline stages x 2 replicas (ms): rank 3 (a replica of stage 1) stalls
    120 ms in its data stage (``stall_in="data"``) or in its compute inside the schedule; its
    replica waits in the gradient sync and its pipeline partner (rank 1) in the schedule."""
    rng = np.random.default_rng(0)
    d = np.zeros((10, 4, 4))
    d[:, :, 0] = 1.0
    d[:, :, 1] = 20.0
    d[:, 1, 1] += 120  # rank 1 waits for rank 3's backward inside its schedule
    d[:, 3, 0 if stall_in == "data" else 1] += 120
    d[:, 0, 2] = d[:, 2, 2] = 120  # the replicas wait in the gradient sync
    d += rng.uniform(0, 0.5, d.shape)
    ns = (d * 1e6).astype(np.int64)
    windows = [
        RankWindow(
            0,
            0,
            9,
            r,
            STAGES,
            ns[:, r],
            ns[:, r].sum(axis=1),
            role=f"pp{r // 2}",
            role_set=("pp0", "pp1"),
        )
        for r in range(4)
    ]
    return analyze_merged(merge_windows(windows, world_size=4))


def test_routed_inside_the_role_that_bounds_the_step() -> None:
    decision, why = decide(pipeline_window("data"))
    assert decision is not None, why
    assert decision.role == "pp1" and decision.stage == "data.next_wait"
    assert (decision.suspect_rank, decision.reference_rank) == (3, 2)
    assert decision.reasons[0] == "inside role pp1, on its own report"


def test_no_capture_while_the_bounding_role_is_open_unless_one_is_named() -> None:
    window = pipeline_window("compute")
    decision, why = decide(window)
    assert decision is None and "which bounds the step is open" in why
    named, why = decide(window, role="pp0")
    assert named is not None, why
    assert named.role == "pp0" and (named.suspect_rank, named.reference_rank) == (1, 0)
