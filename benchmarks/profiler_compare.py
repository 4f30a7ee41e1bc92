"""Benchmark (E9): StageFrontier against PyTorch Profiler traces reduced through Kineto and HTA.

One real Gloo DDP job per seed (4 spawned ranks on CPU, the demo's TinyDecoder on CharData)
runs five segments: no fault, then a 180 ms host delay on one hidden rank in the data stage
(data tail), inside a DDP communication hook (comm), in a callback followed by a barrier on every
rank (callback_sync) and in the forward (forward-host). In every segment ``torch.profiler`` (CPU
activities) captures 40 steps; the inner 20 are scored. StageTimer runs on every step of the same
job (its 20-step window lines up with the scored steps), so both see identical work. Every step
and stage is also a ``record_function`` range with the stage's name; the profiler's trace of a
segment is written by ``tensorboard_trace_handler`` (one file per rank) and reduced with
``stagefrontier.reducers.reduce_kineto`` and ``reduce_hta`` to the same ``[N, R, S]`` matrix,
scored by the same analyzer.

Reported per tool (like the paper's table 5): top-1 and top-2 hits of the injected stage,
routing-set hit (the stage is in the routing set) and routing-set size, the largest per-stage share
difference from StageFrontier, artifact size (the window's evidence packet vs the trace files on
disk), no-fault step overhead while capturing, and post-processing time (reduce + analyze).
Medians of size, overhead and post-processing come from the no-fault segments.

Overhead: each rank times every whole step with ``time.perf_counter`` (step body and
``prof.step()``); the no-fault overhead compares the median step time of the captured no-fault
steps with the median of the profiler's idle ("wait") steps of the same job. StageTimer is on for
every step, so its own (always-on) cost is not part of this comparison; see ``hotpath.md``.

Nsight Systems needs a GPU site; the command that reproduces its row there is printed in the
result file.

Usage::

    python benchmarks/profiler_compare.py            # 3 seeds x 4 ranks, writes the results
    python benchmarks/profiler_compare.py --quick    # 2 ranks, 1 seed, short segments (smoke)
    python benchmarks/profiler_compare.py --out PATH --keep DIR
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

import stagefrontier
from harness_common import load_text, result_header, script_parser, utc_now, write_result
from stagefrontier.analysis.schema import (
    BACKWARD_STAGE,
    CALLBACKS_STAGE,
    DATA_STAGE,
    FORWARD_STAGE,
    OPTIMIZER_STAGE,
    RESIDUAL_STAGE,
)
from stagefrontier.analysis.window_report import WindowReport
from stagefrontier.demo.faults import Fault, FaultInjector
from stagefrontier.demo.launch import run_ranks
from stagefrontier.formats.packet import read_packet
from stagefrontier.reducers import ReducedTrace, reduce_hta, reduce_kineto

COMMAND = "python benchmarks/profiler_compare.py"

SEGMENTS = ("none", "data", "comm", "callback_sync", "forward")
"""Segment fault kinds in job order; ``none`` is the no-fault control."""
EXPECTED = {
    "data": DATA_STAGE,
    "comm": BACKWARD_STAGE,
    "callback_sync": CALLBACKS_STAGE,
    "forward": FORWARD_STAGE,
}
LABELS = {
    "none": "no fault",
    "data": "data tail",
    "comm": "comm",
    "callback_sync": "callback_sync",
    "forward": "forward-host",
}
TOOLS = ("StageFrontier", "PyTorch Profiler (Kineto)", "HTA on Kineto")
NSYS_COMMAND = """\
# every rank under Nsight (torchrun sets RANK, so each rank writes its own report); the loop
# calls torch.cuda.profiler.start()/stop() around the 40 captured steps and emits an NVTX range
# per step (stagefrontier.step#N) and per ordered stage (torch.cuda.nvtx.range_push/pop)
torchrun --nproc-per-node 4 --no-python \\
  nsys profile -t nvtx,cuda --capture-range=cudaProfilerApi --capture-range-end=stop \\
  -o report_rank%q{RANK} python train.py
for r in 0 1 2 3; do nsys export --type sqlite -o report_rank$r.sqlite report_rank$r.nsys-rep; done
stagefrontier analyze . --format nsys --steps FIRST:LAST   # the inner 20 step ids
"""


@dataclass(frozen=True)
class Settings:
    """Job geometry. Segment i captures ``active`` steps after ``skip_first + i * cycle + wait +
    warmup`` idle/warm-up steps; the scored steps are the middle ``scored`` of them and must
    start on a StageTimer window boundary."""

    ranks: int = 4
    seeds: tuple[int, ...] = (0, 1, 2)
    segments: tuple[str, ...] = SEGMENTS
    skip_first: int = 10
    wait: int = 18
    warmup: int = 2
    active: int = 40
    scored: int = 20
    delay_ms: float = 180.0
    deadline_s: float = 480.0

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    @property
    def steps(self) -> int:
        return self.skip_first + self.cycle * len(self.segments)

    def capture(self, segment: int) -> range:
        start = self.skip_first + segment * self.cycle + self.wait + self.warmup
        return range(start, start + self.active)

    def scored_steps(self, segment: int) -> range:
        start = self.capture(segment).start + (self.active - self.scored) // 2
        return range(start, start + self.scored)

    def idle_steps(self) -> list[int]:
        """Steps in the profiler's wait phase (not recording, no fault), all segments."""
        return [
            self.skip_first + i * self.cycle + j
            for i in range(len(self.segments))
            for j in range(self.wait)
        ]

    def check(self) -> None:
        for i in range(len(self.segments)):
            if self.scored_steps(i).start % self.scored:
                raise SystemExit(f"segment {i}: scored steps do not start on a window boundary")


QUICK = Settings(
    ranks=2, seeds=(0,), segments=("none", "data"), skip_first=2, wait=3, warmup=1, active=8,
    scored=4, delay_ms=60.0, deadline_s=240.0,
)  # fmt: skip


def fault_rank(seed: int, ranks: int) -> int:
    """The hidden faulty rank of a seed (never rank 0, which also analyzes)."""
    return 1 + (seed * 2 + 1) % (ranks - 1) if ranks > 1 else 0


# --- the ranks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    settings: Settings
    seed: int
    out_dir: str
    faults: tuple[Fault, ...] = field(default_factory=tuple)


def run_rank(rank: int, job: Job, port: int) -> None:
    """One spawned rank: DDP training with StageTimer, record_function ranges and the profiler."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import (
        ProfilerActivity,
        profile,
        record_function,
        schedule,
        tensorboard_trace_handler,
    )

    from stagefrontier import CollectConfig, StageTimer, TimerConfig
    from stagefrontier.demo.model import CharData, TinyDecoder, load_corpus

    s = job.settings
    torch.set_num_threads(1)
    store = dist.TCPStore(
        "127.0.0.1", port, s.ranks, is_master=False, timeout=timedelta(seconds=60)
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=s.ranks)
    torch.manual_seed(job.seed)
    data = CharData(load_corpus(), 64, 8, seed=job.seed * 997 + rank)
    model = DDP(TinyDecoder(data.vocab_size, 64))
    # fused: one kernel per step instead of a dozen ops per parameter (a smaller trace)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    faults = FaultInjector(job.faults, rank)
    model.register_comm_hook(None, lambda state, bucket: faults.comm_hook(state, bucket))
    collection = CollectConfig(out_dir=job.out_dir, timeout_s=60.0)
    timer = StageTimer(config=TimerConfig(window=s.scored, collection=collection))

    traces = Path(job.out_dir) / "traces"
    cycles = iter(range(len(s.segments)))

    def on_trace_ready(prof: Any) -> None:
        folder = traces / f"segment{next(cycles)}"
        tensorboard_trace_handler(str(folder), worker_name=f"rank{rank}")(prof)

    walls: list[float] = []
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(
            skip_first=s.skip_first,
            wait=s.wait,
            warmup=s.warmup,
            active=s.active,
            repeat=len(s.segments),
        ),
        on_trace_ready=on_trace_ready,
    ) as prof:
        for step in range(s.steps):
            faults.step = step
            started = time.perf_counter()
            with timer.step():
                with timer.stage(DATA_STAGE), record_function(DATA_STAGE):
                    inputs, targets = next(data)
                    faults.delay("data")
                with timer.stage(FORWARD_STAGE), record_function(FORWARD_STAGE):
                    logits = model(inputs)
                    loss = F.cross_entropy(logits.reshape(-1, data.vocab_size), targets.reshape(-1))
                    faults.delay("forward")
                with timer.stage(BACKWARD_STAGE), record_function(BACKWARD_STAGE):
                    loss.backward()
                with timer.stage(CALLBACKS_STAGE), record_function(CALLBACKS_STAGE):
                    loss.item()
                    faults.delay("callback_sync")
                    if faults.barrier_now():
                        dist.barrier()
                with timer.stage(OPTIMIZER_STAGE), record_function(OPTIMIZER_STAGE):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            prof.step()
            walls.append(time.perf_counter() - started)
    timer.close()
    Path(job.out_dir, f"step-times-rank{rank}.json").write_text(json.dumps(walls))
    dist.barrier()
    dist.destroy_process_group()


def launch(job: Job) -> float:
    """Spawn the job's ranks around an ephemeral-port TCPStore; returns its wall time."""
    s = job.settings
    Path(job.out_dir).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    codes = run_ranks(run_rank, s.ranks, job, deadline_s=s.deadline_s)
    failed = {rank: code for rank, code in codes.items() if code != 0}
    if failed:
        raise SystemExit(f"seed {job.seed}: rank(s) failed with exit codes {failed}")
    return time.monotonic() - started


def job_faults(settings: Settings, seed: int) -> tuple[Fault, ...]:
    """Each fault segment's delay, on the seed's hidden rank, during that segment's capture."""
    rank = fault_rank(seed, settings.ranks)
    faults = []
    for i, kind in enumerate(settings.segments):
        if kind == "none":
            continue
        window = settings.capture(i)
        faults.append(
            Fault(kind, rank, settings.delay_ms / 1e3, start=window.start, stop=window.stop)
        )
    return tuple(faults)


# --- scoring --------------------------------------------------------------------------------------


@dataclass
class ToolResult:
    report: WindowReport
    artifact_bytes: int
    postproc_s: float | None
    reduced: ReducedTrace | None = None


@dataclass
class Row:
    seed: int
    segment: int
    kind: str
    fault_rank: int
    tools: dict[str, ToolResult]
    overhead: float | None = None
    """No-fault rows: median captured step time over median idle step time, minus 1."""

    @property
    def expected(self) -> str | None:
        return EXPECTED.get(self.kind)


def score_segment(
    settings: Settings, seed: int, segment: int, out_dir: Path, walls: np.ndarray
) -> Row:
    kind = settings.segments[segment]
    steps = settings.scored_steps(segment)
    window = steps.start // settings.scored
    packet_path = out_dir / "packets" / f"window-{window:06d}.json"
    packet = read_packet(packet_path)
    if (packet.meta.get("first_step"), packet.meta.get("last_step")) != (steps[0], steps[-1]):
        raise SystemExit(f"{packet_path}: holds steps {packet.meta}, expected {steps}")
    tools = {TOOLS[0]: ToolResult(packet.reanalyze(), packet_path.stat().st_size, None)}
    folder = out_dir / "traces" / f"segment{segment}"
    trace_bytes = sum(p.stat().st_size for p in folder.iterdir())
    for name, reducer in ((TOOLS[1], reduce_kineto), (TOOLS[2], reduce_hta)):
        started = time.perf_counter()
        reduced = reducer(folder).select_steps(steps)
        report = reduced.analyze()
        elapsed = time.perf_counter() - started
        tools[name] = ToolResult(report, trace_bytes, elapsed, reduced)
    row = Row(seed, segment, kind, fault_rank(seed, settings.ranks), tools)
    if kind == "none":
        captured = np.median(walls[list(settings.capture(segment))])
        idle = np.median(walls[settings.idle_steps()])
        row.overhead = float(captured / idle - 1.0)
    return row


def share_diff(a: WindowReport, b: WindowReport) -> float:
    return max(abs(a.shares[s] - b.shares[s]) for s in a.stages)


# --- output ---------------------------------------------------------------------------------------


def _fmt_bytes(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def summary_rows(rows: Sequence[Row]) -> list[list[str]]:
    positive = [r for r in rows if r.expected]
    control = [r for r in rows if not r.expected]
    out = []
    for tool in TOOLS:
        reports = [r.tools[tool].report for r in positive]
        expected = [r.expected for r in positive]
        top1 = sum(rep.top1 == e for rep, e in zip(reports, expected, strict=True))
        top2 = sum(e in (rep.top1, rep.top2) for rep, e in zip(reports, expected, strict=True))
        hit = sum(e in rep.routing_set for rep, e in zip(reports, expected, strict=True))
        sizes = [len(rep.routing_set) for rep in reports]
        diffs = [share_diff(r.tools[tool].report, r.tools[TOOLS[0]].report) for r in positive]
        n = len(positive)
        artifact = statistics.median(r.tools[tool].artifact_bytes for r in control or rows)
        postproc = [r.tools[tool].postproc_s for r in control or rows]
        overhead = [r.overhead for r in control if r.overhead is not None]
        if tool == TOOLS[0]:
            overhead_text, postproc_text = "always on, see hotpath.md", "none (inline)"
        else:
            overhead_text = f"{statistics.median(overhead):+.1%}" if overhead else "n/a"
            postproc_text = f"{statistics.median(p for p in postproc if p is not None):.2f} s"
        out.append(
            [
                tool,
                str(n),
                f"{top1}/{n}",
                f"{top2}/{n}",
                f"{hit}/{n}",
                f"{statistics.mean(sizes):.2f}/{max(sizes)}" if sizes else "-",
                "-" if tool == TOOLS[0] else f"{max(diffs):.3f}" if diffs else "-",
                _fmt_bytes(artifact),
                overhead_text,
                postproc_text,
            ]
        )
    return out


SUMMARY_HEADER = [
    "Tool",
    "Pos. rows",
    "Top-1",
    "Top-2",
    "Cand. hit",
    "Cand. avg/max",
    "Max share diff vs SF",
    "Artifact (median)",
    "No-fault overhead during capture",
    "Postproc. (median)",
]


def detail_rows(rows: Sequence[Row]) -> list[list[str]]:
    out = []
    for r in rows:
        sf = r.tools[TOOLS[0]].report
        kin = r.tools[TOOLS[1]]
        hta = r.tools[TOOLS[2]]
        same = (
            kin.reduced is not None
            and hta.reduced is not None
            and np.array_equal(kin.reduced.d, hta.reduced.d)
        )
        cells = [str(r.seed), LABELS[r.kind], str(r.fault_rank), r.expected or "-"]
        for tool in TOOLS:
            rep = r.tools[tool].report
            share = f"{rep.shares[r.expected]:.3f}" if r.expected else "-"
            cells.append(f"{_short(rep.top1)} / {_short(rep.top2)} ({share})")
        cells += [
            f"{share_diff(kin.report, sf):.3f}",
            f"{share_diff(hta.report, sf):.3f}",
            "yes" if same else "NO",
            "-" if r.overhead is None else f"{r.overhead:+.1%}",
        ]
        out.append(cells)
    return out


DETAIL_HEADER = [
    "seed",
    "fault",
    "rank",
    "injected stage",
    "SF top-1 / top-2 (share)",
    "Kineto top-1 / top-2 (share)",
    "HTA top-1 / top-2 (share)",
    "diff Kineto",
    "diff HTA",
    "HTA == Kineto matrix",
    "capture overhead",
]


SHORT = {
    DATA_STAGE: "data",
    FORWARD_STAGE: "fwd",
    BACKWARD_STAGE: "bwd",
    CALLBACKS_STAGE: "callbacks",
    OPTIMIZER_STAGE: "optim",
    RESIDUAL_STAGE: "other",
}


def _short(stage: str | None) -> str:
    return "-" if stage is None else SHORT.get(stage, stage)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def render(
    rows: Sequence[Row], settings: Settings, quick: bool, wall_s: float, load: str, hta_ok: bool
) -> str:
    command = COMMAND + (" --quick" if quick else "")
    s = settings
    parts = [
        *result_header(
            "E9: StageFrontier vs. PyTorch Profiler traces reduced through Kineto and HTA",
            command,
            when=f"{utc_now()}; total wall time {wall_s:.0f} s.",
        ),
        f"- Python: {platform.python_version()}; torch: {_torch_version()}; "
        f"HTA: {_hta_version() if hta_ok else 'not installed'}",
        f"- stagefrontier: {stagefrontier.__version__}; numpy: {np.__version__}",
        f"- CPU count: {os.cpu_count()}; load average (1 min) at start: {load}",
        f"- Platform: {platform.platform()} ({platform.machine()})",
        "",
        "Method: per seed, one real Gloo DDP job of "
        f"{s.ranks} spawned CPU ranks (demo TinyDecoder on CharData, fused AdamW) runs "
        f"{len(s.segments)} segments ({', '.join(LABELS[k] for k in s.segments)}). In each, "
        f"`torch.profiler` (CPU activities, schedule wait={s.wait} warmup={s.warmup} "
        f"active={s.active}) captures {s.active} steps and the inner {s.scored} are scored; a "
        f"fault segment delays its hidden rank by {s.delay_ms:g} ms on every captured step "
        "(data stage; DDP comm hook on bucket 0; callback followed by a barrier on every rank; "
        "forward). StageTimer runs on every step with a "
        f"{s.scored}-step window aligned to the scored steps; each stage is also a "
        "`record_function` range of the same name. The traces (`tensorboard_trace_handler`, one "
        "file per rank) are reduced with `reduce_kineto` and `reduce_hta` and scored by the same "
        "analyzer as StageFrontier's evidence packet. Seeds "
        f"{', '.join(str(x) for x in s.seeds)}; hidden rank per seed: "
        f"{', '.join(str(fault_rank(x, s.ranks)) for x in s.seeds)}.",
        "",
        "Columns: top-1/top-2/routing-set hit count the positive rows whose injected stage is the "
        "top stage / among the top two / in the routing set (shares up to tau_C = 0.8); "
        "routing-set avg/max is the routing-set size; max share diff is the largest per-stage "
        "share difference from StageFrontier on any positive row; artifact is the scored "
        "window's evidence packet vs the segment's trace files on disk (uncompressed JSON, all "
        "ranks); overhead is the median step time of the captured no-fault steps over the "
        "median of the profiler's idle (wait) steps in the same job, minus 1; post-processing is "
        "reduce + select + analyze on this machine. Size, overhead and post-processing are "
        "medians over the no-fault segments.",
        "",
        *table(SUMMARY_HEADER, summary_rows(rows)),
        "",
        "Per segment (top-1 / top-2, and the injected stage's share):",
        "",
        *table(DETAIL_HEADER, detail_rows(rows)),
        "",
        "Nsight Systems: not run here: it needs a GPU site (the NVTX and CUDA capture of this "
        "comparison; this machine has no GPU). The reducer (`stagefrontier.reducers.nsys`) is "
        "tested on SQLite files built with the export schema. To reproduce the row on a GPU "
        "node, with the stages and steps emitted as NVTX ranges:",
        "",
        "```bash",
        NSYS_COMMAND.rstrip(),
        "```",
        "",
    ]
    return "\n".join(parts)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _hta_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("HolisticTraceAnalysis")
    except PackageNotFoundError:
        return "unknown"


def _hta_available() -> bool:
    import importlib

    try:
        importlib.import_module("hta.common.trace")
    except ImportError:
        return False
    return True


def run(settings: Settings, work: Path, log: Callable[[str], None]) -> list[Row]:
    rows: list[Row] = []
    for seed in settings.seeds:
        out = work / f"seed{seed}"
        if out.exists():
            shutil.rmtree(out)
        job = Job(settings, seed, str(out), job_faults(settings, seed))
        wall = launch(job)
        hidden = fault_rank(seed, settings.ranks)
        log(f"seed {seed}: job finished in {wall:.1f} s (hidden rank {hidden})")
        walls = np.array(json.loads((out / "step-times-rank0.json").read_text()))
        for segment in range(len(settings.segments)):
            row = score_segment(settings, seed, segment, out, walls)
            rows.append(row)
            tops = ", ".join(f"{t.split()[0]} {_short(row.tools[t].report.top1)}" for t in TOOLS)
            costs = ", ".join(
                f"{t.split()[0]} {row.tools[t].postproc_s:.1f} s"
                for t in TOOLS
                if row.tools[t].postproc_s is not None
            )
            log(f"  {LABELS[row.kind]:>13}: top-1 {tops}; post-processing {costs}")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = script_parser("profiler_compare", __doc__, quick="2 ranks, 1 seed, short segments")
    parser.add_argument("--keep", type=Path, help="keep the job folders (packets, traces) here")
    args = parser.parse_args(argv)
    # a terminated run still stops its ranks (the launcher's finally block)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    settings = QUICK if args.quick else Settings()
    settings.check()
    if not _hta_available():
        raise SystemExit("HTA is not installed: pip install '.[hta]' (the HTA row needs it)")
    load = load_text()
    work = args.keep or Path(tempfile.mkdtemp(prefix="profiler-compare-"))
    started = time.monotonic()
    try:
        rows = run(settings, work, lambda line: print(line, flush=True))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    text = render(rows, settings, args.quick, time.monotonic() - started, load, True)
    print()
    print("\n".join(table(SUMMARY_HEADER, summary_rows(rows))))
    write_result(args.out, text, echo=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
