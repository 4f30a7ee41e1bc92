"""The HTA reducer: the same traces through Holistic Trace Analysis' dataframes give the same
matrix as the direct Kineto reader (skipped, with the reason, where HTA is not installed)."""

from __future__ import annotations

import gzip
import importlib
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stagefrontier.cli import main
from stagefrontier.reducers import (
    MissingDependencyError,
    TraceFormatError,
    reduce_hta,
    reduce_kineto,
)
from trace_support import DATA, SLOW_RANK, load_events, trace

try:
    importlib.import_module("hta.common.trace")
    HTA_MISSING = ""
except ImportError as exc:  # the optional extra: pip install 'stagefrontier[hta]'
    HTA_MISSING = f"HolisticTraceAnalysis is not installed ({exc}); pip install '.[hta]'"

needs_hta = pytest.mark.skipif(bool(HTA_MISSING), reason=HTA_MISSING)


@pytest.fixture(scope="module")
def single_gz(tmp_path_factory: pytest.TempPathFactory, single: Path) -> Path:
    """The committed single-process trace, gzipped."""
    path = tmp_path_factory.mktemp("single") / "trace.json.gz"
    path.write_bytes(gzip.compress(single.read_bytes()))
    return path


def assert_same(a: Any, b: Any) -> None:
    assert a.ranks == b.ranks and a.step_ids == b.step_ids and a.stages == b.stages
    assert a.world_size == b.world_size and a.missing_ranks == b.missing_ranks
    np.testing.assert_array_equal(a.d, b.d)
    np.testing.assert_array_equal(a.overlap_s, b.overlap_s)


@needs_hta
def test_hta_equals_the_direct_reader_on_a_gloo_job(gloo_dir: Path) -> None:
    via_hta = reduce_hta(gloo_dir)
    assert via_hta.source == "hta"
    assert_same(via_hta, reduce_kineto(gloo_dir))
    report = via_hta.analyze()
    assert report.top1 == DATA and report.leaders[DATA] == SLOW_RANK


@needs_hta
def test_hta_equals_the_direct_reader_on_gzip_with_a_rank_mapping(single_gz: Path) -> None:
    assert_same(reduce_hta(single_gz, ranks={single_gz.name: 0}), reduce_kineto(single_gz))
    assert_same(reduce_hta(single_gz), reduce_kineto(single_gz))


@needs_hta
def test_hta_equals_the_direct_reader_on_step_annotations() -> None:
    path = trace("numbered-steps-3.json")
    assert_same(reduce_hta(path), reduce_kineto(path))


@needs_hta
def test_hta_microsecond_rounding_is_off_unless_asked(single: Path) -> None:
    before = os.environ.get("HTA_DISABLE_NS_ROUNDING")
    exact = reduce_hta(single)
    rounded = reduce_hta(single, ns_rounding=True)
    assert rounded.meta["hta_ns_rounding"] and not exact.meta["hta_ns_rounding"]
    # HTA rounds each range inward to whole microseconds: at most 2 us per range, and the
    # residual absorbs the difference of the step's ranges
    assert np.abs(rounded.d - exact.d).max() <= 2 * 2e-6 * len(exact.stages)
    assert os.environ.get("HTA_DISABLE_NS_ROUNDING") == before  # restored after each load


@needs_hta
def test_hta_refuses_two_files_of_one_rank(single: Path, tmp_path: Path) -> None:
    other = tmp_path / "copy.json.gz"
    shutil.copy(single, other)
    with pytest.raises(TraceFormatError, match="HTA holds one trace per rank"):
        reduce_hta([single, other], ranks={str(single): 0, str(other): 0})


@needs_hta
def test_hta_names_a_file_it_cannot_load(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"schemaVersion": 1, "traceEvents": [')
    with pytest.raises(TraceFormatError, match=r"bad\.json"):
        reduce_hta(path)


@needs_hta
def test_hta_missing_rank_and_stage_rules_match(gloo_dir: Path, single: Path) -> None:
    rank0 = next(
        p for p in gloo_dir.glob("*.json") if load_events(p)[0]["distributedInfo"]["rank"] == 0
    )
    with pytest.raises(TraceFormatError, match="world size 2"):
        reduce_hta(rank0)
    assert_same(
        reduce_hta(rank0, missing_ranks="allow"), reduce_kineto(rank0, missing_ranks="allow")
    )
    with pytest.raises(TraceFormatError, match=r"extra\.cpu_wall"):
        reduce_hta(single, [DATA, "extra.cpu_wall"])


@needs_hta
def test_cli_format_hta(gloo_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["analyze", str(gloo_dir), "--format", "hta"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert f"top-1: {DATA}" in out and "source=hta" in out


def test_missing_hta_is_a_clear_error(
    single: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.import_module

    def no_hta(name: str, *args: Any) -> Any:
        if name.startswith("hta"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_hta)
    with pytest.raises(MissingDependencyError, match=r"stagefrontier\[hta\]"):
        reduce_hta(single)
    assert main(["analyze", str(single), "--format", "hta"]) == 2
    assert "needs HolisticTraceAnalysis" in capsys.readouterr().err
