"""Smoke tests: the analyzer and hot-path benchmarks run end to end and write their tables (no
timing checks)."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

from bench_support import BENCHMARKS, benchmark_text, table_rows

HEADER = (
    "| run | R | N | S | bare ms CPU | analyze ms CPU | ratio CPU | bare ms wall "
    "| analyze ms wall | ratio wall | peak MB | peak/input | target met | load |"
)
HOTPATH_HEADER = "| variant | ns/op | x floor | x floor, quartiles | target |"


def test_benchmark_quick_writes_table(tmp_path: Path) -> None:
    out = tmp_path / "analyzer.md"
    text, _ = benchmark_text("analyzer", out, "--quick")
    rows = table_rows(text, HEADER)
    assert [(row[0], row[1]) for row in rows] == [("1", "8"), ("1", "128"), ("1", "4096")]
    assert all(row[2] == "100" for row in rows)
    assert "python benchmarks/analyzer.py --quick" in text
    assert "median thread CPU time, every run" in text
    assert "- BLAS: " in text and "BLAS thread settings in the environment" in text


def test_hotpath_benchmark_quick_writes_table(tmp_path: Path) -> None:
    out = tmp_path / "hotpath.md"
    text, proc = benchmark_text("hotpath", out, "--quick")
    assert "python benchmarks/hotpath.py --quick" in text
    labels = [row[0] for row in table_rows(text, HOTPATH_HEADER)]
    assert labels[0].startswith("floor")
    assert any("enabled=False" in label for label in labels)
    assert any("SimpleProfiler" in label for label in labels)
    assert any("ProfilerRouter" in label for label in labels)
    assert "Verdicts:" in text
    assert HOTPATH_HEADER in proc.stdout
    # the cost per timed collective, one row per kind
    for kind in ("DDP gradient bucket", "FSDP2 all-gather", "ZeRO-1 broadcasts", "own collective"):
        assert f"| {kind} " in text, kind
    # the automatic hooks: both ratios and their verdict, or why a loaded quick run has none
    hooks = next(line for line in text.splitlines() if line.startswith("- automatic hooks"))
    if "not measured" not in hooks:
        assert "by the ratio of the medians" in hooks
        assert re.search(r"target <= 1\.5x: (MET|MISSED|unresolved at this load)", hooks), hooks
        assert "- instructions: not counted in this run" in text


@pytest.mark.parametrize(
    ("low", "per_round", "high", "of_medians", "said"),
    [
        (1.20, 1.30, 1.40, 1.32, "MET"),
        (1.55, 1.60, 1.70, 1.65, "MISSED"),
        (1.30, 1.40, 1.60, 1.42, "unresolved at this load"),  # the interval straddles it
        (1.40, 1.45, 1.50, 1.53, "unresolved at this load"),  # the two ratios disagree
        (0.59, 1.22, 2.02, 1.53, "unresolved at this load"),  # the loaded run that read "MET"
    ],
)
def test_the_hooks_verdict_needs_both_ratios_and_the_medians_interval_on_one_side(
    low: float, per_round: float, high: float, of_medians: float, said: str
) -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from hotpath_hooks import HOOKS_TARGET, verdict
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert HOOKS_TARGET == 1.5
    assert verdict(low, per_round, high, of_medians) == said


def test_the_medians_interval_is_the_binomial_order_statistics() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from hotpath_hooks import median_interval
    finally:
        sys.path.remove(str(BENCHMARKS))
    # n = 100: P(Binom(100, 1/2) <= 39) = 0.018 <= 0.025 < P(<= 40) = 0.028, so the 40th and
    # the 61st of the sorted values (the textbook table's ranks for n = 100)
    assert median_interval([float(v) for v in range(100, 0, -1)]) == (40.0, 61.0)
    assert median_interval([float(v) for v in range(6)]) == (0.0, 5.0)  # 2/64 <= 0.05
    unbounded = (-math.inf, math.inf)  # too few to bound the median at 95%
    assert median_interval([3.0, 1.0, 2.0]) == unbounded
    assert median_interval([5.0]) == unbounded


SOAK_HEADER = (
    "| window | rank | steps | loop s | us/step | RSS at warm-up MB | max rise after kB "
    "| rise at 40/60/80/100% kB | windows written | flat |"
)


def test_soak_benchmark_few_steps_writes_table(tmp_path: Path) -> None:
    out = tmp_path / "soak.md"
    # A few hundred steps are all warm-up: the smoke run checks the script, not the flatness.
    args = ("--steps", "400", "--windows", "10,100", "--limit-mb", "1000")
    text, _ = benchmark_text("soak", out, *args)
    assert "python benchmarks/soak.py --steps 400" in text
    rows = table_rows(text, SOAK_HEADER)
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("10", "0", "400"),
        ("10", "1", "400"),
        ("100", "0", "400"),
        ("100", "1", "400"),
    ]
    assert all(row[-1] == "yes" for row in rows)
    assert int(rows[0][-2]) >= 1  # rank 0 wrote windows.jsonl


SCALE_HEADER_START = "| scenario | R | nodes | levels |"


def test_scale_benchmark_quick_agrees_and_writes_table(tmp_path: Path) -> None:
    out = tmp_path / "scale.md"
    text, _ = benchmark_text("scale", out, "--quick")
    assert "python benchmarks/scale.py --quick" in text and "Load average" in text
    header = next(line for line in text.splitlines() if line.startswith(SCALE_HEADER_START))
    rows = table_rows(text, header)
    assert [(row[0], row[1]) for row in rows] == [
        (scenario, ranks) for ranks in ("8", "64", "512") for scenario in ("rank", "node")
    ]
    # Every agreement column (advances, shares, top stage, leader, lag in bound) holds.
    assert all(row[-2] == "yes, yes, yes, yes, yes" for row in rows)
    # Rank 0 reads node parts, never the rank windows; the job's store carries at most a
    # quarter of the flat path's bytes (8 ranks per node).
    flat_kb = {row[1]: float(row[4].replace(",", "")) for row in rows}
    hier_kb = {row[1]: float(row[9].replace(",", "")) for row in rows}
    assert hier_kb["512"] < flat_kb["512"] / 3
    ratios = [float(row[6].rstrip("%")) for row in rows if row[1] != "8"]
    assert ratios and all(ratio <= 25.0 for ratio in ratios), ratios


def test_node_transport_benchmark_writes_both_transports_and_the_bytes_per_level(
    tmp_path: Path,
) -> None:
    out = tmp_path / "node_transport.md"
    text, _ = benchmark_text("node_transport", out, "--rounds", "5", "--load", "1")
    assert "python benchmarks/node_transport.py --rounds 5 --load 1" in text
    assert "Load average" in text and str(tmp_path) not in text
    rows = table_rows(
        text, "| transport | gather ms median | gather ms p90 | ratio to node store |"
    )
    assert [row[0] for row in rows] == ["job store", "node store"] and rows[1][-1] == "1.00"
    levels = table_rows(text, "| what travels | bytes | note |")
    assert len(levels) == 5 and levels[0][0] == "a rank to its leader (node store)"
