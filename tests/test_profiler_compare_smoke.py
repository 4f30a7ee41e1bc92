"""Smoke test: the E9 profiler comparison runs end to end in its quick form (no timing checks)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
try:
    importlib.import_module("hta.common.trace")
except ImportError as exc:
    pytest.skip(f"HolisticTraceAnalysis is not installed ({exc})", allow_module_level=True)

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "profiler_compare.py"


def test_quick_comparison_writes_its_tables(tmp_path: Path) -> None:
    out = tmp_path / "profiler_compare.md"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text(encoding="utf-8")
    assert "python benchmarks/profiler_compare.py --quick" in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Tool |"))
    rows = [line.split("|")[1].strip() for line in lines[start + 2 : start + 5]]
    assert rows == ["StageFrontier", "PyTorch Profiler (Kineto)", "HTA on Kineto"]
    assert "| 0 | data tail | 1 | data.next_wait |" in text
    assert "nsys export --type sqlite" in text
