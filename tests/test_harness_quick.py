"""Smoke test of the evaluation harness: every script runs end to end with ``--quick`` and writes
its result file with the command, the environment and its tables (no timing or routing
assertions: the machine is shared and a quick run is too short to judge)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench_support import run_benchmark

pytest.importorskip("torch")

SCRIPTS = {
    "routing": [
        "| Method | Exact acct. | Top-1 | Top-2 | Cand. hit | Avg cand. | Max cand. |",
        "| tau_C | Cand. hit | Avg cand. size | Max cand. size |",
        "| StageFrontier | yes |",
        "Detectability",
    ],
    "overhead": [
        "| Workload | Ranks | Step ms | Pairs x blocks x steps | Mean overhead |",
        "| demo | 4 |",
        "| 10ms | 4 |",
        "Self-reported (median rank)",
    ],
    "aba": ["| Seed | Fault | Median step A1 -> B -> A2 (ms) |", "callback_sync@"],
    "grad_accum": ["| Fault | Delay | Delay/p50 | Rows | Top-1 |", "| Pair | Ordered steps/s |"],
    "regression": ["| Run | Windows | Checked | False alarms |", "| Fault | First slowed window |"],
    "label_flips": ["| Ranks | Window steps | Windows | Windows per label | Label flips |"],
    "sharded": ["| Configuration | Fault | Delay/p50 |", "ZeRO-1", "FSDP2"],
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_quick_run_writes_its_result(tmp_path: Path, name: str) -> None:
    out = tmp_path / f"{name}.md"
    # The limit is above two deadlines of the longest run: a stuck run is retried once.
    args = ("--quick", "--out", str(out), "--work", str(tmp_path / "work"))
    proc = run_benchmark(name, *args, timeout_s=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    text = out.read_text(encoding="utf-8")
    assert f"python benchmarks/{name}.py --quick" in text
    assert "measured wall time of the whole script" in text
    assert "torch " in text and "CPUs usable" in text
    assert "Comparison with the paper" in text
    for expected in SCRIPTS[name]:
        assert expected in text, expected
    assert re.search(r"^\[\s*1/\d+\] ", proc.stdout, re.MULTILINE)  # a progress line per run
    stored = json.loads((tmp_path / f"{name}-rows.json").read_text(encoding="utf-8"))
    assert stored["rows"] and stored["meta"]["quick"] is True

    again = tmp_path / f"{name}-again.md"
    stored_rows = str(tmp_path / f"{name}-rows.json")
    rerender = run_benchmark(name, "--from-rows", stored_rows, "--out", str(again), timeout_s=120)
    assert rerender.returncode == 0, rerender.stderr[-4000:]
    rendered = again.read_text(encoding="utf-8")
    for expected in SCRIPTS[name]:
        assert expected in rendered, expected
