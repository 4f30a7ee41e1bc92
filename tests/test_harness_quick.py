"""Smoke test of the evaluation harness: every script runs end to end with ``--quick`` and writes
its result file with the command, the environment and its tables (no timing or routing
assertions: the machine is shared and a quick run is too short to judge)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE, CompletedProcess

import pytest

pytest.importorskip("torch")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

SCRIPTS = {
    "routing": [
        "| Method | Exact acct. | Top-1 | Top-2 | Cand. hit | Avg cand. | Max cand. |",
        "| tau_C | Cand. hit | Avg cand. size | Max cand. size |",
        "| StageFrontier | yes |",
        "Detectability",
    ],
    "overhead": ["| Ranks | Pairs | Steps/run | Mean overhead |", "| 4 | 1 |"],
    "aba": ["| Seed | Fault | Median step A1 -> B -> A2 (ms) |", "callback_sync@"],
    "grad_accum": ["| Fault | Delay | Delay/p50 | Rows | Top-1 |", "| Pair | Ordered steps/s |"],
    "sharded": ["| Configuration | Fault | Delay/p50 |", "ZeRO-1", "FSDP2"],
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_quick_run_writes_its_result(tmp_path: Path, name: str) -> None:
    out = tmp_path / f"{name}.md"
    command = [sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", "--out", str(out)]
    proc = _run_with_stacks_on_timeout([*command, "--work", str(tmp_path / "work")], 900.0)
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
    rerender = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / f"{name}.py"),
            "--from-rows",
            str(tmp_path / f"{name}-rows.json"),
            "--out",
            str(again),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert rerender.returncode == 0, rerender.stderr[-4000:]
    rendered = again.read_text(encoding="utf-8")
    for expected in SCRIPTS[name]:
        assert expected in rendered, expected


def _run_with_stacks_on_timeout(command: list[str], timeout_s: float) -> CompletedProcess[str]:
    """Run a script; if it overruns (above two deadlines of its longest run, since a stuck run
    is retried once), ask it for its threads' stacks (SIGUSR1) and fail with its output."""
    with subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            proc.kill()
            stdout, stderr = proc.communicate()
            pytest.fail(f"overran {timeout_s:.0f} s; its output and stacks:\n{stdout}{stderr}")
    return CompletedProcess(command, proc.returncode, stdout, stderr)
