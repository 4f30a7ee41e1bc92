"""Running a benchmark script as a subprocess and reading the tables it writes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE, CompletedProcess

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_benchmark(name: str, *args: str, timeout_s: float = 600.0) -> CompletedProcess[str]:
    """``python benchmarks/<name>.py *args``; fails the test, with the script's output and its
    threads' stacks (SIGUSR1, which the harness scripts register), if it overruns."""
    command = [sys.executable, str(BENCHMARKS / f"{name}.py"), *args]
    with subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            proc.kill()
            stdout, stderr = proc.communicate()
            pytest.fail(
                f"{name} overran {timeout_s:.0f} s; its output and stacks:\n{stdout}{stderr}"
            )
    return CompletedProcess(command, proc.returncode, stdout, stderr)


def benchmark_text(
    name: str, out: Path, *args: str, timeout_s: float = 600.0
) -> tuple[str, CompletedProcess[str]]:
    """``run_benchmark(name, *args, "--out", out)``: asserts the script exited 0 and returns the
    results file it wrote, and the run."""
    proc = run_benchmark(name, *args, "--out", str(out), timeout_s=timeout_s)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out.read_text(encoding="utf-8"), proc


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of the markdown table under ``header`` (the separator line skipped)."""
    lines = text.splitlines()
    rows = []
    for line in lines[lines.index(header) + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows
