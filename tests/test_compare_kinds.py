"""``compare`` names a file of another kind as such (issue 37, item 10): a profiler trace or a
``windows.jsonl`` given as a side read "packet is not JSON: 'utf-8' codec can't decode ...",
without the file's name."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from stagefrontier.cli import main
from trace_support import trace


@pytest.mark.parametrize("kind", ["trace", "gzipped trace"])
def test_a_trace_given_to_compare_is_named_a_trace(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = trace("single-3-steps.json")
    if kind == "gzipped trace":
        zipped = tmp_path / "rank0.pt.trace.json.gz"
        zipped.write_bytes(gzip.compress(path.read_bytes()))
        path = zipped
    assert main(["compare", str(path), str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path} starts like a PyTorch Profiler trace, not an evidence packet" in err
    assert "packet is not JSON" not in err


def test_a_broken_array_is_not_called_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, any file starting with ``[`` was called "a PyTorch Profiler trace" outright."""
    broken = tmp_path / "nested.json"
    broken.write_text("[[[[")
    assert main(["compare", str(broken), str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"{broken} starts like a PyTorch Profiler trace" in err
    assert "is a PyTorch Profiler trace" not in err


def test_a_broken_packet_is_named_with_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "window-000000.json"
    broken.write_text('{"format": ')
    assert main(["compare", str(broken), str(broken)]) == 2
    assert f"{broken}: packet is not JSON" in capsys.readouterr().err
