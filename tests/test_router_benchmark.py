"""The router benchmark's verdict (``benchmarks/router.py``): the first step after a capture is
judged against the ordinary steps before the capture only. The steps +2 to +11 run beside the
trace writers' CPU, so a slowdown the capture leaves there must not raise the figure it is
judged by. The step times here are built, not measured: the test reads the script's verdict."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from bench_support import BENCHMARKS, table_rows

FIRST, LAST = 40, 44  # the captured steps; the lead-in is step 39
STEPS = 80


@pytest.fixture(scope="module")
def router() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import router as module
    finally:
        sys.path.remove(str(BENCHMARKS))
    yield module


def test_a_slowdown_the_capture_leaves_does_not_pass_the_step_after(router: ModuleType) -> None:
    """Before: the verdict read the first step after over the local median, whose later half
    (steps +2 to +11) the capture had slowed to 200 ms: 160 ms over 150 ms passed the target.
    Now it reads the first step after over the 100 ms steps before: 1.6, over 1.5, not met; the
    local median's ratio is still shown, in its own column."""
    step_s = [0.1] * STEPS
    step_s[LAST + 1] = 0.16
    for t in range(LAST + 2, LAST + 2 + router.LOCAL_STEPS):
        step_s[t] = 0.2
    figures = router.phases(step_s, [0.01] * STEPS, FIRST, LAST)
    assert figures["after_ratio"] == pytest.approx(1.6)
    assert figures["local_ratio"] == pytest.approx(160 / 150)
    run = {
        "load": "1.00 / 1.00 / 1.00 -> 1.00 / 1.00 / 1.00",
        "captured_steps": [FIRST, LAST],
        "steps": {"0": figures},
        "worst_after_ratio": figures["after_ratio"],
        "worst_local_ratio": figures["local_ratio"],
    }
    lines = router.run_rows([run])
    (row,) = table_rows("\n".join(lines), lines[0])
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    judged = dict(zip(header, row, strict=True))
    assert judged["at most 1.5 on every rank"] == "no"
    assert judged["first step after / median before, per rank"] == "1.60"
    local = next(key for key in judged if key.startswith("first step after / local median"))
    assert "not judged" in local and judged[local] == "1.07"
