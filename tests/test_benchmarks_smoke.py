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


HOTPATH_SCRIPT = SCRIPT.parent / "hotpath.py"
HOTPATH_HEADER = "| variant | ns/op | x floor | x floor, quartiles | target |"


def test_hotpath_benchmark_quick_writes_table(tmp_path: Path) -> None:
    out = tmp_path / "hotpath.md"
    proc = subprocess.run(
        [sys.executable, str(HOTPATH_SCRIPT), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    text = out.read_text(encoding="utf-8")
    assert "python benchmarks/hotpath.py --quick" in text
    assert HOTPATH_HEADER in text
    lines = text.splitlines()
    start = lines.index(HOTPATH_HEADER)
    rows = [line for line in lines[start + 2 :] if line.startswith("|")]
    labels = [row.split("|")[1].strip() for row in rows]
    assert labels[0].startswith("floor")
    assert any("enabled=False" in label for label in labels)
    assert any("SimpleProfiler" in label for label in labels)
    assert "Verdicts:" in text
    assert HOTPATH_HEADER in proc.stdout


COLLECTION_SCRIPT = SCRIPT.parent / "collection.py"
COLLECTION_HEADER = (
    "| collect | R | window | windows | step ms | other exits us | hand-off us median (p90, max) "
    "| of which submit us median (p90) | latency ms median (max) | all sinks ms median "
    "| payload B/rank | packet KB | gather_ok | target met |"
)


def test_collection_benchmark_quick_writes_table(tmp_path: Path) -> None:
    out = tmp_path / "collection.md"
    proc = subprocess.run(
        [sys.executable, str(COLLECTION_SCRIPT), "--quick", "--window", "5", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text(encoding="utf-8")
    assert "python benchmarks/collection.py --quick --window 5" in text
    assert COLLECTION_HEADER in text
    lines = text.splitlines()
    start = lines.index(COLLECTION_HEADER)
    rows = [line.split("|") for line in lines[start + 2 :] if line.startswith("|")]
    assert [(row[1].strip(), row[2].strip()) for row in rows] == [("store", "2"), ("gloo", "2")]
    assert all(row[13].strip() == "2/2" for row in rows)  # both measured windows gathered
    assert "Verdicts:" in text
    assert COLLECTION_HEADER in proc.stdout
