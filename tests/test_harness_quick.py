"""Smoke test of the evaluation harness: every script runs end to end with ``--quick`` and writes
its result file with the command, the environment and its tables (no timing or routing
assertions: the machine is shared and a quick run is too short to judge).

The scripts run once per module, ``AT_ONCE`` at a time: their runs mostly wait (injected sleeps,
the ranks' gradient exchange), so side by side they take about half the time they take one
after the other, and nothing here depends on how fast a run is."""

from __future__ import annotations

import json
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from subprocess import CompletedProcess

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


AT_ONCE = 3
LONGEST_FIRST = ("overhead", "grad_accum", "aba", "label_flips", "regression", "sharded", "routing")
"""The order the scripts start in, the longest first, so the last to start are short and the
fixture ends soon after the longest (each --quick run alone at a load of 30 to 60: overhead
214 s, grad_accum 119, aba 88, label_flips 86, regression 62, sharded 40, routing 38; in name
order it started fourth, once a first script had ended)."""
SCRIPT_LIMIT_S = 900
"""A script's limit, above two deadlines of its longest run: a stuck run is retried once."""


@pytest.fixture(scope="module")
def quick_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quick")


@pytest.fixture(scope="module")
def quick_runs(quick_dir: Path) -> dict[str, Future[CompletedProcess[str]]]:
    """Each script's ``--quick`` run, ended (its results: ``NAME.md`` in ``quick_dir``); a run
    that overran fails its own test, as ``result()`` raises there."""

    def run(name: str) -> CompletedProcess[str]:
        args = ("--quick", "--out", str(quick_dir / f"{name}.md"), "--work", str(quick_dir / name))
        return run_benchmark(name, *args, timeout_s=SCRIPT_LIMIT_S)

    with ThreadPoolExecutor(AT_ONCE) as pool:
        return {name: pool.submit(run, name) for name in sorted(SCRIPTS, key=LONGEST_FIRST.index)}


@pytest.mark.timeout(len(SCRIPTS) * SCRIPT_LIMIT_S // AT_ONCE + 600)  # its fixture runs them all
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_quick_run_writes_its_result(
    quick_runs: dict[str, Future[CompletedProcess[str]]],
    quick_dir: Path,
    tmp_path: Path,
    name: str,
) -> None:
    out = quick_dir / f"{name}.md"
    proc = quick_runs[name].result()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    text = out.read_text(encoding="utf-8")
    assert f"python benchmarks/{name}.py --quick" in text
    assert "measured wall time of the whole script" in text
    assert "torch " in text and "CPUs usable" in text
    assert "Comparison with the paper" in text
    for expected in SCRIPTS[name]:
        assert expected in text, expected
    assert re.search(r"^\[\s*1/\d+\] ", proc.stdout, re.MULTILINE)  # a progress line per run
    stored = json.loads((quick_dir / f"{name}-rows.json").read_text(encoding="utf-8"))
    assert stored["rows"] and stored["meta"]["quick"] is True

    again = tmp_path / f"{name}-again.md"
    stored_rows = str(quick_dir / f"{name}-rows.json")
    rerender = run_benchmark(name, "--from-rows", stored_rows, "--out", str(again), timeout_s=120)
    assert rerender.returncode == 0, rerender.stderr[-4000:]
    rendered = again.read_text(encoding="utf-8")
    for expected in SCRIPTS[name]:
        assert expected in rendered, expected
