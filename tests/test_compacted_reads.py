"""The readers of a folder the disk budget compacted and a job resumed into (issue 38):
``report``, ``report --html``, ``plot`` and ``compare`` say which packets the disk budget
deleted (from ``compacted.jsonl``), and keep the full-disk wording for a packet missing for
another reason. The folder is a real 2-rank job (``budget_support``) launched twice into one
folder with a 2 MiB budget: attempts 0 and 1 (the session's ``budget_run``, shared with
``test_disk_budget.py``)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from budget_support import BUDGET_WINDOWS
from stagefrontier.formats.compacted import listed_windows
from test_cli_bad_inputs import assert_one_line_error, run

WINDOWS = BUDGET_WINDOWS


@pytest.fixture(scope="module")
def resumed_run(budget_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the session's resumed job (``conftest.budget_run``): the readers below write
    their pages into it."""
    return Path(shutil.copytree(budget_run, tmp_path_factory.mktemp("compacted") / "run"))


def _compacted(out: Path) -> list[tuple[int, int]]:
    lines = (out / "compacted.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    return sorted(
        w for e in entries for key in ("windows", "flagged_windows") for w in listed_windows(e[key])
    )


def _said_compacted(text: str, count: int) -> None:
    line = re.search(
        r"(\d+) window\(s\) of windows.jsonl have no packet: compacted by the disk "
        r"budget \((\d+/\d+[^;]*); see compacted.jsonl\)",
        text,
    )
    assert line, text
    assert int(line[1]) == count


def test_the_readers_say_the_disk_budget_compacted_the_packets(
    resumed_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    compacted = _compacted(resumed_run)
    assert compacted
    for command, *rest in (["report"], ["report", "--html"], ["plot"]):
        code, out, err = run([command, str(resumed_run), *rest], capsys)
        assert code == 0, err
        _said_compacted(err, len(compacted))
        assert "full disk" not in err + out
    page = (resumed_run / "report.html").read_text()
    assert "compacted by the disk budget" in page and "full disk" not in page
    code, out, err = run(["report", str(resumed_run)], capsys)
    assert "compacted by the disk budget" in out
    code, out, err = run(["compare", str(resumed_run), str(resumed_run)], capsys)
    assert code == 0, err
    _said_compacted(err, len(compacted))
    assert "full disk" not in err


def test_a_packet_missing_for_another_reason_keeps_the_full_disk_wording(
    resumed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(resumed_run, copy)
    newest = copy / "packets" / f"window-{WINDOWS - 1:06d}.attempt-1.json"
    newest.unlink()  # the newest packets are never compacted: this one was not written
    code, _, err = run(["report", str(copy)], capsys)
    assert code == 0, err
    _said_compacted(err, len(_compacted(copy)))
    assert (
        f"1 window(s) of windows.jsonl have no packet (1/{WINDOWS - 1}: "
        "not written, on a full disk say)" in err
    )


def test_compare_names_the_attempt_of_a_range(
    resumed_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    last = WINDOWS - 1
    code, out, err = run(["compare", f"{resumed_run}:70-{last}", str(resumed_run)], capsys)
    assert_one_line_error(code, out, err, "the folder holds restart attempts 0, 1")
    assert f"{resumed_run}:1/70-{last}" in err
    code, out, err = run(["compare", f"{resumed_run}:0/50-", f"{resumed_run}:1/50-"], capsys)
    assert code == 0, err
    assert f"{resumed_run}:0/50-" in out and f"{resumed_run}:1/50-" in out, out
    code, out, err = run(["compare", f"{resumed_run}:0/", f"{resumed_run}:1/"], capsys)
    assert code == 0, err


def test_the_report_header_spans_every_attempt(
    resumed_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    span = f"steps 0-{WINDOWS * 10 - 1} (attempt 0), 0-{WINDOWS * 10 - 1} (attempt 1)"
    code, out, err = run(["report", str(resumed_run)], capsys)
    assert code == 0, err
    assert span in out.splitlines()[0], out.splitlines()[0]
    code, out, err = run(["report", str(resumed_run), "--html"], capsys)
    assert code == 0, err
    assert f"{WINDOWS * 2} ({span})" in (resumed_run / "report.html").read_text()
