"""The project's own suite on a busy machine: ``make test`` run again and again beside CPU burners.

Each run is the README's test command (``make test``: ruff, mypy, the docs build, then the
suite on its default workers) with ``--burners`` processes that each keep a CPU busy (``while
True: pass``) for the whole run, started just before it and killed after. The set-up (``make
setup``) runs once before the first, untimed. Per run the table gives its exit status, its wall
time, pytest's own count and time, the load average at its start and the highest one read
during it (every 30 s), and the tests that failed; each run's whole output is kept beside the
results file (``suite_under_load-logs/``) when ``--keep-logs`` asks for it.

Usage::

    python benchmarks/suite_under_load.py                # five runs beside two burners
    python benchmarks/suite_under_load.py --workers 2    # the same on two pytest workers
    python benchmarks/suite_under_load.py --runs 1 --burners 0   # one run on the machine as it is
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import harness_common as hc

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(
    r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+|no tests ran) in (?P<seconds>[\d.]+)s", re.M
)
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)
LOAD_EVERY_S = 30.0


@dataclass
class SuiteRun:
    index: int
    status: int = -1
    wall_s: float = 0.0
    counts: str = "no summary"
    pytest_s: float | None = None
    load_start: float | None = None
    load_max: float | None = None
    failed: list[str] = field(default_factory=list)


def _watch_load(run: SuiteRun, done: threading.Event) -> None:
    while not done.wait(LOAD_EVERY_S):
        load = hc.load_1min()
        if load is not None:
            run.load_max = max(run.load_max or 0.0, load)


def suite_run(index: int, burners: int, workers: int | None, log: Path | None) -> SuiteRun:
    """One ``make test`` (on ``workers`` pytest workers, else the Makefile's default) beside
    ``burners`` CPU burners; its output written to ``log``."""
    run = SuiteRun(index, load_start=hc.load_1min())
    run.load_max = run.load_start
    done = threading.Event()
    watcher = threading.Thread(target=_watch_load, args=(run, done), daemon=True)
    watcher.start()
    start = time.monotonic()
    with hc.cpu_burners(burners):
        # its own session: an interrupted script ends the whole suite (workers, ranks) with it
        proc = subprocess.Popen(
            ["make", "test", *([] if workers is None else [f"PYTEST_WORKERS={workers}"])],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            done.set()
    run.wall_s = time.monotonic() - start
    watcher.join()
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(output, encoding="utf-8")
    run.status = proc.returncode
    summaries = list(SUMMARY.finditer(output))
    if summaries:  # the last: pytest's own, at the end
        found = summaries[-1]
        run.counts, run.pytest_s = found.group("counts"), float(found.group("seconds"))
    run.failed = FAILED.findall(output)
    return run


def render(runs: list[SuiteRun], args: argparse.Namespace, setup_s: float) -> str:
    green = sum(r.status == 0 for r in runs)
    rows = [
        [
            str(r.index),
            "passed" if r.status == 0 else f"FAILED (exit {r.status})",
            f"{r.wall_s / 60:.1f}",
            "-" if r.pytest_s is None else f"{r.pytest_s / 60:.1f}",
            r.counts,
            "-" if r.load_start is None else f"{r.load_start:.1f}",
            "-" if r.load_max is None else f"{r.load_max:.1f}",
            ", ".join(f"`{name}`" for name in r.failed) or "-",
        ]
        for r in runs
    ]
    lines = [
        *hc.result_header("The suite on a busy machine", hc.command_line()),
        *hc.environment(),
        f"- Set-up (`make setup`, once before the runs, not timed in the table): {setup_s:.0f} s",
        "",
        f"{green} of {len(runs)} consecutive `make test` runs passed, each beside "
        f"{args.burners} CPU-burning process(es) for its whole length.",
        "",
        *hc.table(
            [
                "Run",
                "Result",
                "make test (min)",
                "pytest (min)",
                "pytest's count",
                "Load at start",
                "Highest load read",
                "Failed tests",
            ],
            rows,
        ),
        "",
        "- `make test` is the README's test command: the lint, type and docs checks side by "
        "side, then the suite on "
        + (
            "its default workers (`PYTEST_WORKERS` in the Makefile)."
            if args.workers is None
            else f"{args.workers} pytest worker(s) (`PYTEST_WORKERS={args.workers}`)."
        ),
        "- The load averages are the 1-minute figure, read at the run's start and every "
        f"{LOAD_EVERY_S:.0f} s during it; the burners alone make {args.burners} of it.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = hc.script_parser("suite_under_load", __doc__)
    parser.add_argument("--runs", type=int, default=5, help="consecutive runs (default 5)")
    parser.add_argument(
        "--burners", type=int, default=2, help="CPU-burning processes beside each (default 2)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="pytest workers (make test PYTEST_WORKERS=N; default: the Makefile's)",
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep each run's output beside the results"
    )
    args = parser.parse_args()
    if args.runs < 1 or args.burners < 0 or (args.workers is not None and args.workers < 0):
        parser.error("--runs must be at least 1, --burners and --workers at least 0")
    start = time.monotonic()
    setup = subprocess.run(["make", "setup"], cwd=ROOT, capture_output=True, text=True)
    if setup.returncode != 0:
        print(f"make setup failed (exit {setup.returncode}):\n{setup.stdout}{setup.stderr}")
        return 1
    setup_s = time.monotonic() - start
    logs = args.out.parent / "suite_under_load-logs" if args.keep_logs else None
    runs = []
    for index in range(1, args.runs + 1):
        print(f"[{index}/{args.runs}] make test beside {args.burners} burner(s) ...", flush=True)
        log = logs / f"run{index}.log" if logs else None
        run = suite_run(index, args.burners, args.workers, log)
        runs.append(run)
        said = "passed" if run.status == 0 else f"FAILED: {', '.join(run.failed) or run.status}"
        print(f"[{index}/{args.runs}] {said}: {run.wall_s / 60:.1f} min, {run.counts}", flush=True)
        hc.write_result(args.out, render(runs, args, setup_s), echo=False)
    print(render(runs, args, setup_s))
    return 0 if all(r.status == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
