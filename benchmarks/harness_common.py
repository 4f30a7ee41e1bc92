"""The one harness every benchmark script shares.

Every script (``python benchmarks/NAME.py``) takes its options from ``script_parser`` (``--out``,
default ``benchmarks/results/NAME.md``, and ``--quick`` where it has a smoke mode), opens its
results file with ``result_header`` (title, the exact command, date), reads the machine's load
with ``load_average`` and says whether the machine was quiet enough for wall-clock ratios with
``quiet_check``; each script keeps only what it measures.

The demo-workload scripts (routing, overhead, aba, grad_accum, sharded, regression,
label_flips) also share ``harness_main``: it launches real multi-rank Gloo jobs of the demo
workload (``stagefrontier.demo``), pools the evidence packets of each run, scores StageFrontier
and the five rank-local baselines on the same matrix, and writes the result with its rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import faulthandler
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stagefrontier import analyze
from stagefrontier.analysis.baselines import BASELINES
from stagefrontier.analysis.routing import rank_order, routing_set
from stagefrontier.analysis.schema import (
    BACKWARD_STAGE,
    CALLBACKS_STAGE,
    DATA_STAGE,
    FORWARD_STAGE,
)
from stagefrontier.analysis.window_report import WindowReport
from stagefrontier.formats.packet import read_packet
from stagefrontier.formats.run_digest import method_shares

FloatArray = npt.NDArray[np.float64]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TAU_C = 0.80
"""The default cumulative-share threshold of the routing set."""
DEADLINE_BASE_S = 120.0
DEADLINE_PER_RANK_STEP_S = 0.5
"""A launched run's hard deadline: the base plus this per rank and step (about 5x a run's
time on 2 shared cores), so a stuck run of a quick smoke test is stopped in minutes."""

METHODS = ("stagefrontier", *BASELINES)
METHOD_TITLES = {
    "stagefrontier": "StageFrontier",
    "per_stage_max": "Per-stage max",
    "per_stage_mean": "Per-stage average",
    "rank_spread": "Raw rank spread",
    "slowest_rank": "Slowest-rank breakdown",
    "rank0_total": "Rank-0 local total",
}

SEEDED_STAGE = {
    "data": DATA_STAGE,
    "forward": FORWARD_STAGE,
    "backward": BACKWARD_STAGE,
    "backward_compute": BACKWARD_STAGE,
    "comm": BACKWARD_STAGE,
    "callback_sync": CALLBACKS_STAGE,
    "callback_host": CALLBACKS_STAGE,
}
"""The stage a fault of each kind is injected into: the right answer for routing. A comm delay
runs inside the DDP communication hook, which executes within ``loss.backward()``."""


def fault_rank(seed: int, ranks: int) -> int:
    """The rank a seed's fault goes to: varies with the seed and reaches rank 0 at 4 ranks."""
    return (3 * seed + 1) % ranks


# --- every script: command line, results header, load and the quiet-machine check ----------


def script_parser(name: str, doc: str | None, quick: str | None = None) -> argparse.ArgumentParser:
    """The options every benchmark script has: ``--out`` (default
    ``benchmarks/results/NAME.md``) and, when ``quick`` says what a smoke run shrinks,
    ``--quick``. The description is the first paragraph of the script's docstring."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0] or None)
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=f"{quick} (a smoke run, not a result)")
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS / f"{name}.md",
        help=f"markdown result file (default benchmarks/results/{name}.md)",
    )
    return p


def result_header(title: str, command: str, when: str | None = None) -> list[str]:
    """The opening lines of every results file, from the title down to "Environment:";
    ``when`` the runs' date when it is not now (tables re-rendered from stored rows)."""
    now = when or utc_now()
    return [
        f"# {title}",
        "",
        "Produced by:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Date: {now}",
        "",
        "Environment:",
        "",
    ]


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages, or None where the platform has none."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def load_1min() -> float | None:
    """The 1-minute load average now, or None where the platform has none."""
    loads = load_average()
    return None if loads is None else loads[0]


def load_text(loads: tuple[float, float, float] | None = None) -> str:
    """``1.20 / 0.90 / 0.70`` (1/5/15 min), read now unless given; ``n/a`` where unknown."""
    loads = load_average() if loads is None else loads
    return "n/a" if loads is None else " / ".join(f"{x:.2f}" for x in loads)


def quiet_check(loads: Sequence[float | None]) -> list[str]:
    """A caveat line when the machine was busy (a 1-minute load average of half its CPUs or
    more) at any of ``loads``: wall-clock figures are then inflated and ratios noisy."""
    known = [x for x in loads if x is not None]
    cpus = os.cpu_count() or 1
    if not known or max(known) < 0.5 * cpus:
        return []
    return [
        f"- Caveat: the machine was busy (1-min load average up to {max(known):.1f} on {cpus} "
        "CPUs); wall-clock times are inflated and the ratios noisy. Re-run on an idle machine "
        "before relying on a verdict near its threshold."
    ]


# --- the demo-workload harness --------------------------------------------------------------


def parser(description: str, name: str) -> argparse.ArgumentParser:
    """The options of the demo-workload scripts: ``--quick``, ``--out``, ``--work`` and
    ``--from-rows``."""
    p = script_parser(name, description, quick="one seed, fewest steps, smallest rank count")
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep the runs' output folders here (default: a temp dir, removed)",
    )
    p.add_argument(
        "--from-rows",
        type=Path,
        default=None,
        metavar="JSON",
        help="re-render the tables from a stored NAME-rows.json instead of running",
    )
    return p


def command_line() -> str:
    """The command that produced this result, with the script path relative to the repo."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = script.relative_to(ROOT).as_posix()
    except ValueError:
        shown = script.name
    return shlex.join(["python", shown, *sys.argv[1:]])


@contextmanager
def work_dir(keep: Path | None) -> Iterator[Path]:
    """Where the runs write their folders: ``keep`` if given, else a temp dir removed after."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="stagefrontier-bench-") as tmp:
        yield Path(tmp)


@contextmanager
def cpu_burners(count: int) -> Iterator[None]:
    """``count`` processes that each keep a CPU busy (``while True: pass``) while the block runs,
    killed after it: a busy neighbour that comes with the command."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


# --- running rows ---------------------------------------------------------------------------


def prepare_process() -> None:
    """One intra-op thread per rank (ranks share the cores); set before the fork server starts.
    SIGUSR1 prints every thread's stack to stderr (a caller that finds the script stuck)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ["OMP_NUM_THREADS"] = "1"


class Progress:
    """Counts launched runs and prints one line per finished run."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.started = time.monotonic()

    def line(self, label: str, summary: str, wall_s: float) -> None:
        self.done += 1
        width = len(str(self.total))
        elapsed = time.monotonic() - self.started
        print(
            f"[{self.done:>{width}}/{self.total}] {label:<34} {summary}  "
            f"({wall_s:.1f} s; {elapsed / 60:.1f} min so far)",
            flush=True,
        )


LAUNCHES = [0]
"""Runs launched by this process (for the result header)."""
RETRIES: list[str] = []
"""Why each retried run was retried (for the result header)."""


def launch_run(config: Any) -> Any:
    """Launch one demo job (fork-server start: torch is imported once, not per rank).

    A run that overruns its deadline is stopped (the error names where each rank was stuck)
    and run once more; the retry and its reason go into the results file. Any other failure,
    or a second overrun, is raised."""
    from stagefrontier.demo import DeadlineExceeded, launch

    deadline_s = DEADLINE_BASE_S + DEADLINE_PER_RANK_STEP_S * config.ranks * config.steps
    LAUNCHES[0] += 1
    try:
        return launch(config, deadline_s=deadline_s, start_method="forkserver")
    except DeadlineExceeded as exc:
        print(f"run in {config.out_dir} retried once: {exc}", flush=True)
        RETRIES.append(str(exc).splitlines()[0])
    LAUNCHES[0] += 1
    return launch(config, deadline_s=deadline_s, start_method="forkserver")


def warm_up(ranks: int, work: Path) -> None:
    """A short untimed job before measuring throughput: starts the fork server and warms the
    caches, so the first measured run does not pay one-off costs."""
    launch_run(demo_config(ranks=ranks, steps=4, window=4, timed=False, out_dir=str(work / "warm")))


def demo_config(**kwargs: Any) -> Any:
    """A quiet DemoConfig with a collection deadline suited to an oversubscribed machine."""
    from stagefrontier.demo import DemoConfig

    kwargs.setdefault("quiet", True)
    kwargs.setdefault("collect_timeout_s", 30.0)
    return DemoConfig(**kwargs)


def fault(kind: str, rank: int, delay_ms: float, extra: str = "") -> Any:
    from stagefrontier.demo import parse_fault

    return parse_fault(f"{kind}@{rank}:{delay_ms:g}ms" + (f",{extra}" if extra else ""))


# --- pooling and scoring --------------------------------------------------------------------


@dataclass(frozen=True)
class Pooled:
    """The scored windows of one run, concatenated into one ``[N, R, S]`` matrix and analyzed."""

    stages: tuple[str, ...]
    report: WindowReport
    shares: dict[str, FloatArray]
    """Per method, the share vector over ``stages`` on the pooled matrix."""
    first_step: int
    last_step: int
    windows: int
    window_labels: list[list[str]]
    """Labels of each pooled window as the live analyzer emitted them."""
    skipped: int
    """Windows left out because not every rank's data arrived."""

    @property
    def steps(self) -> int:
        return self.report.n_steps

    def stagefrontier(self) -> dict[str, float]:
        return dict(zip(self.stages, self.shares["stagefrontier"].tolist(), strict=True))


def pool_windows(
    out_dir: Path,
    *,
    drop: int = 1,
    first_step: int | None = None,
    last_step: int | None = None,
) -> Pooled:
    """Pool a run's evidence packets: drop the first ``drop`` windows (warm-up), keep windows
    inside ``[first_step, last_step]``, concatenate their matrices and score every method."""
    packets = [read_packet(p) for p in sorted((out_dir / "packets").glob("window-*.json"))]
    packets = packets[drop:]
    if first_step is not None:
        packets = [p for p in packets if p.meta["first_step"] >= first_step]
    if last_step is not None:
        packets = [p for p in packets if p.meta["last_step"] <= last_step]
    complete = [p for p in packets if p.meta.get("gather_ok") and not p.meta.get("missing_ranks")]
    if not complete:
        raise RuntimeError(f"{out_dir}: no complete window to score ({len(packets)} selected)")
    stages = complete[0].stages
    d = np.concatenate([p.d for p in complete if p.stages == stages], axis=0)
    report = analyze(d, stages)
    return Pooled(
        stages=stages,
        report=report,
        shares=method_shares(d, list(stages), report.shares),
        first_step=complete[0].meta["first_step"],
        last_step=complete[-1].meta["last_step"],
        windows=len(complete),
        window_labels=[list(p.report.labels) for p in complete],
        skipped=len(packets) - len(complete),
    )


@dataclass(frozen=True)
class Hit:
    """How one method's scores treat the seeded stage."""

    top1: bool
    top2: bool
    in_routing_set: bool
    routing_set_size: int
    rank: int
    """1-based position of the seeded stage in the method's order."""


def score(
    scores: Sequence[float] | FloatArray, stages: Sequence[str], seeded: str, tau: float = TAU_C
) -> Hit:
    """Top-1, top-2, routing-set hit and routing-set size of ``seeded`` under ``scores``."""
    order = [stages[i] for i in rank_order(scores)]
    candidates = routing_set(scores, stages, tau)
    return Hit(
        top1=order[0] == seeded,
        top2=seeded in order[:2],
        in_routing_set=seeded in candidates,
        routing_set_size=len(candidates),
        rank=order.index(seeded) + 1,
    )


def top_stage(shares: dict[str, float]) -> tuple[str, float]:
    stage = max(shares, key=lambda s: shares[s])
    return stage, shares[stage]


def step_times(run: Any, first_step: int, last_step: int | None = None) -> list[float]:
    """Rank 0's measured wall time of each step in ``[first_step, last_step]``."""
    times: list[float] = run.step_s[0]
    return times[first_step : None if last_step is None else last_step + 1]


def median_ms(values: Iterable[float]) -> float:
    return statistics.median(values) * 1e3


def paired_bootstrap(
    values: Sequence[float], *, resamples: int = 20000, seed: int = 12345
) -> tuple[float, float, float]:
    """Mean of ``values`` (one per paired block) and its 95% percentile bootstrap interval,
    resampling whole blocks with replacement."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, arr.size, size=(resamples, arr.size))
    means = arr[picks].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(arr.mean()), float(low), float(high)


# --- environment and markdown ---------------------------------------------------------------


def environment() -> list[str]:
    """Markdown bullet lines describing the machine and software, read at run time."""
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    lines = [
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"torch {torch.__version__}, numpy {np.__version__}",
        f"- Platform: {platform.platform()}; machine {platform.machine()}",
        f"- CPUs usable: {cores} (os.cpu_count() = {os.cpu_count()}); torch.distributed backend "
        "Gloo over loopback, one intra-op thread per rank, ranks forked from one server process",
    ]
    lines.append(
        f"- Load average (1/5/15 min) when the script started: {load_text()}; the machine is "
        "shared, so other jobs' load is part of the noise"
    )
    commit = _git_commit()
    if commit:
        lines.append(f"- Source revision: {commit}")
    return lines


def _git_commit() -> str | None:
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10, check=False
        )

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def write_result(out: Path, text: str, *, echo: bool = True) -> None:
    """The end of every script: the results file printed (unless ``echo`` is False, for a
    script that prints its own summary instead), written to ``out`` (its folder made) and the
    path said on stderr."""
    if echo:
        print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table of pre-formatted cells."""
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def pct(value: float, digits: int = 1) -> str:
    return f"{value * 100:.{digits}f}%"


class Result:
    """One result file: title, summary and sections, written as markdown with its provenance."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.title = ""
        self.summary: list[str] = []
        self.sections: list[tuple[str, list[str]]] = []

    def section(self, heading: str, lines: list[str]) -> None:
        """Add a section and print it (the tables go to stdout as well)."""
        self.sections.append((heading, lines))
        print(f"\n## {heading}\n" + "\n".join(lines), flush=True)

    def markdown(self) -> str:
        meta = self.meta
        wall = meta["wall_s"]
        lines = [
            *result_header(self.title, meta["command"], when=meta["when"]),
            f"- The measured wall time of the whole script: {wall:.0f} s ({wall / 60:.1f} min), "
            f"{meta['runs']} launched multi-rank run(s)"
            + ("; a --quick smoke run, not a result" if meta["quick"] else ""),
            *meta["env"],
        ]
        lines += [f"- Retried once after: {reason}" for reason in meta.get("retries", [])]
        if "rendered_by" in meta:
            lines.append(
                f"- Tables rendered from the stored rows (no new runs) by `{meta['rendered_by']}`"
            )
        lines += ["", *self.summary, ""]
        for heading, body in self.sections:
            lines += [f"## {heading}", "", *body, ""]
        return "\n".join(lines).rstrip() + "\n"


def rows_path(out: Path) -> Path:
    """Where a result's raw rows are stored next to its markdown."""
    return out.with_name(out.stem + "-rows.json")


def write_rows(path: Path, meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> None:
    """The raw rows as JSON, one row per line (compact, and diffs stay readable)."""
    body = ",\n".join(json.dumps(row, separators=(",", ":")) for row in rows)
    text = f'{{"meta": {json.dumps(meta, indent=1)},\n"rows": [\n{body}\n]}}\n'
    path.write_text(text, encoding="utf-8")


Collect = Callable[[bool, Path], list[dict[str, Any]]]
Render = Callable[[list[dict[str, Any]], Result, bool], None]


def harness_main(
    name: str,
    description: str,
    collect: Collect,
    render: Render,
    options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """Parse the common options (and the script's own, which ``options`` adds), run (or
    reload) the rows, render and write the result.

    ``collect(quick, work)`` launches the runs and returns JSON-able rows; ``render(rows,
    result, quick)`` fills the result's title, summary and sections from rows alone, so
    ``--from-rows`` can re-render stored rows without any new run.
    """
    arguments = parser(description, name)
    if options is not None:
        options(arguments)
    args = arguments.parse_args()
    if args.from_rows is not None:
        stored = json.loads(args.from_rows.read_text(encoding="utf-8"))
        meta, rows = stored["meta"], stored["rows"]
        meta["rendered_by"] = command_line()
    else:
        prepare_process()
        started = time.monotonic()
        meta = {
            "command": command_line(),
            "when": utc_now(),
            "env": environment(),
            "quick": args.quick,
        }
        with work_dir(args.work) as work:
            rows = collect(args.quick, work)
        loads = load_average()
        meta["env"].append(f"- Load average (1/5/15 min) when the runs ended: {load_text(loads)}")
        meta["env"] += quiet_check([None if loads is None else loads[0]])
        meta["wall_s"] = time.monotonic() - started
        meta["runs"] = LAUNCHES[0]
        meta["retries"] = RETRIES
    result = Result(meta)
    render(rows, result, bool(meta["quick"]))
    write_result(args.out, result.markdown(), echo=False)
    stored_path = rows_path(args.out)
    write_rows(stored_path, {k: v for k, v in meta.items() if k != "rendered_by"}, rows)
    print(f"wrote {stored_path} (script wall time {meta['wall_s']:.0f} s)", file=sys.stderr)
    return 0
