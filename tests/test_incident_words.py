"""An incident that was reduced but could not be judged says so once (issue 37, item 10).

Before: ``stagefrontier incident`` reduced it offline and then printed "not reduced" in its
summary and verdict, beside "reduced: offline".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stagefrontier.cli import main
from test_route_inputs import captured_incident


def test_a_reduced_incident_without_a_judgment_does_not_read_not_reduced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _ = captured_incident(tmp_path)  # the run holds no packets: nothing to judge by
    assert main(["incident", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "reduced: offline" in out
    assert "not reduced" not in out
    assert "- verdict: reduced, but neither confirmed nor refuted (the reasons say why)" in out
    assert "no live windows cover the captured steps" in out
