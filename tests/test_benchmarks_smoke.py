"""Smoke test: the analyzer benchmark runs end to end and writes its table (no timing checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "analyzer.py"
HEADER = "| R | N | S | bare ms | analyze ms | ratio | peak MB | peak/input | target met |"


def test_benchmark_quick_writes_table(tmp_path: Path) -> None:
    out = tmp_path / "analyzer.md"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    text = out.read_text(encoding="utf-8")
    assert HEADER in text
    lines = text.splitlines()
    start = lines.index(HEADER)
    rows = [line for line in lines[start + 2 :] if line.startswith("|")]
    assert [row.split("|")[1].strip() for row in rows] == ["8", "128", "4096"]
    assert all(row.split("|")[2].strip() == "100" for row in rows)
    assert "python benchmarks/analyzer.py" in text
