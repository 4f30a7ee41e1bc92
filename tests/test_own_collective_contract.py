"""``timer.collective(name, nbytes)`` with a name that is not a str or an nbytes that is not
an int >= 0: a contract violation (counted, said once, raised by a strict timer), never an
exception into training, and the window stays one rank 0 reads."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

from recorder_support import DATA, FWD, CaptureCollector
from stagefrontier import ContractViolation, StageTimer, TimerConfig
from stagefrontier.analysis.collective_checks import check_rank_collectives
from stagefrontier.analysis.collective_names import OWN_PREFIX


def capture(strict: bool = False) -> tuple[StageTimer, CaptureCollector]:
    collector = CaptureCollector()
    config = TimerConfig(stages=(DATA, FWD), window=2, strict=strict)
    return StageTimer(config=config, collector=collector), collector


def steps(timer: StageTimer, name: Any, nbytes: Any) -> None:
    for _ in range(2):
        with timer.step(), timer.stage(FWD), timer.collective(name, nbytes):
            pass


@pytest.mark.parametrize(
    ("name", "nbytes", "logged", "reason"),
    [
        (3, 8, None, "timer.collective name must be a str, got int"),
        ("loss", 1.5, 0, "timer.collective nbytes must be an int >= 0, got float"),
        ("loss", -4, 0, "timer.collective nbytes must be an int >= 0, got a negative int"),
    ],
)
def test_a_bad_argument_is_a_violation_and_the_window_is_read(
    name: Any, nbytes: Any, logged: int | None, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    timer, collector = capture()
    with caplog.at_level(logging.WARNING, logger="stagefrontier"):
        steps(timer, name, nbytes)
    timer.close()
    (window,) = collector.windows
    assert window.contract_violations == 2
    assert [r.split(" (")[0] for r in window.violation_reasons] == [reason]
    assert sum(reason in r.getMessage() for r in caplog.records) == 1  # said once
    collectives = check_rank_collectives(window.collectives, "rank 0")
    if logged is None:  # the block timed nothing
        assert not collectives.get("calls")
    else:  # timed with 0 bytes
        assert collectives["keys"] == [[OWN_PREFIX + "loss", 0, FWD, 0, logged]]
        assert len(collectives["calls"]) == 2


def test_a_strict_timer_raises_on_a_bad_argument() -> None:
    timer, _ = capture(strict=True)
    with pytest.raises(ContractViolation, match=re.escape("nbytes must be an int >= 0")):
        timer.collective("loss", -1)
    timer.close()


def test_a_numpy_int_nbytes_is_no_violation() -> None:
    np = pytest.importorskip("numpy")
    timer, collector = capture()
    steps(timer, "loss", np.int64(8))
    timer.close()
    (window,) = collector.windows
    assert window.contract_violations == 0
    assert window.collectives["keys"] == [[OWN_PREFIX + "loss", 0, FWD, 0, 8]]
