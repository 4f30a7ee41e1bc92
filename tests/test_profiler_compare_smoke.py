"""Smoke test: the E9 profiler comparison runs end to end in its quick form (no timing checks)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from bench_support import run_benchmark

pytest.importorskip("torch")
try:
    importlib.import_module("hta.common.trace")
except ImportError as exc:
    pytest.skip(f"HolisticTraceAnalysis is not installed ({exc})", allow_module_level=True)


def test_quick_comparison_writes_its_tables(tmp_path: Path) -> None:
    out = tmp_path / "profiler_compare.md"
    proc = run_benchmark("profiler_compare", "--quick", "--out", str(out), timeout_s=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text(encoding="utf-8")
    assert "python benchmarks/profiler_compare.py --quick" in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Tool |"))
    rows = [line.split("|")[1].strip() for line in lines[start + 2 : start + 5]]
    assert rows == ["StageFrontier", "PyTorch Profiler (Kineto)", "HTA on Kineto"]
    assert "| 0 | data tail | 1 | data.next_wait |" in text
    assert "nsys export --type sqlite" in text
