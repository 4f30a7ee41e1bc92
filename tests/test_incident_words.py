"""An incident that was reduced but could not be judged says so once, and a trace it cannot read
is one line naming the file (issue 37, item 10).

Before: ``stagefrontier incident`` reduced it offline and then printed "not reduced" in its
summary and verdict, beside "reduced: offline".
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stagefrontier.cli import main
from test_route_inputs import captured_incident, cli


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


@pytest.mark.parametrize(
    ("trace", "said"),
    [
        (b'{"traceEvents": 3}', "not a Chrome trace (no traceEvents list)"),
        (b'{"traceEvents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not a readable JSON trace"),
    ],
    ids=["not-a-trace", "nested-past-the-readers-depth"],
)
def test_a_corrupt_trace_is_said_in_one_line_naming_the_file(
    tmp_path: Path, trace: bytes, said: str
) -> None:
    """Before: ``stagefrontier incident`` printed the reader's traceback, twice for a trace
    without an event list, and a trace nested past msgspec's depth was a bare
    ``RecursionError``. Now one line names the file and what is wrong with it, and the
    incident keeps the reason."""
    folder, _ = captured_incident(tmp_path)
    suspect = folder / "rank1.pt.trace.json.gz"
    suspect.write_bytes(gzip.compress(trace, mtime=0))
    done = cli("incident", str(folder))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"{suspect}: {said}" in done.stderr
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    reasons = json.loads((folder / "incident.json").read_text())["reasons"]
    assert any(f"{suspect}: {said}" in reason for reason in reasons), reasons
