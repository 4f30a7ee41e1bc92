"""Cross-rank collection cost: training-thread hand-off, rank-0 report latency, packet size.

Spawns real Gloo DDP jobs (a small MLP, every rank timed by StageTimer) at 2, 4 and 8 ranks with
the store collector (the default) and the opt-in Gloo collector, and measures:

(a) hand-off: the training-thread time of the ``timer.step()`` exit that completes a window
    (snapshot of the buffers and one ``put_nowait``), as the boundary exit minus the median exit
    of the other steps of the same rank; every rank, every measured window; target <= 50 us;
(b) latency on rank 0: from just before the boundary step's exit (the window end; the collector
    stamps its deadline right after) to the moment the window's line in ``windows.jsonl`` has
    been flushed, and to all sinks done (the evidence packet written); target <= 250 ms at 8 ranks;
(c) size: the wire payload one rank sends per window, and the evidence packet per window.

    python benchmarks/collection.py                 # 2, 4, 8 ranks, store and gloo
    python benchmarks/collection.py --quick --out collection.md

The first window of every run is a warm-up and is not measured. Times are wall clock on a shared
machine: run it when the load is low and read the load average recorded with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from harness_common import load_text, result_header, script_parser, write_result
from stagefrontier.demo.launch import run_ranks

COMMAND = "python benchmarks/collection.py"
HANDOFF_TARGET_US = 50.0
LATENCY_TARGET_MS = 250.0
LATENCY_TARGET_RANKS = 8
DEADLINE_S = 300.0


@dataclass(frozen=True)
class Config:
    ranks: int
    collect: str
    window: int
    windows: int
    data_sleep_s: float
    out_dir: str


# ---------------------------------------------------------------------------------- ranks
class _Stamp:
    """A sink that records when the sinks before it finished a window (rank 0 only)."""

    def __init__(self, stamps: dict[int, float], sizes: dict[int, list[int]] | None) -> None:
        self.stamps = stamps
        self.sizes = sizes

    def write(self, window: Any) -> None:
        self.stamps[window.merged.reference.window] = time.monotonic()
        if self.sizes is not None:
            from stagefrontier.collect.wire import encode_window

            index = window.merged.reference.window
            self.sizes[index] = [len(encode_window(w)) for w in window.merged.ranks]

    def close(self) -> None:
        return None


class _TimedSubmit:
    """Wraps the real collector and times its ``submit`` (the collector's share of the hand-off;
    the rest of the boundary exit is the recorder's snapshot of its buffers)."""

    def __init__(self, inner: Any, submit_ns: list[int]) -> None:
        self.inner = inner
        self.rank = inner.rank
        self.world_size = inner.world_size
        self.submit_ns = submit_ns

    def submit(self, window: Any) -> bool:
        t0 = time.perf_counter_ns()
        queued = bool(self.inner.submit(window))
        self.submit_ns.append(time.perf_counter_ns() - t0)
        return queued

    def close(self) -> None:
        self.inner.close()


def _collector(
    rank: int,
    config: Config,
    jsonl: dict[int, float],
    done: dict[int, float],
    sizes: dict[int, list[int]],
) -> Any:
    from stagefrontier.collect import CollectorSettings, GlooCollector, StoreCollector
    from stagefrontier.sinks import JsonlSink, LogSink, PacketSink

    sinks: list[Any] | None = None
    if rank == 0:  # the default sinks of rank 0, with stamps after windows.jsonl and after all
        sinks = [
            JsonlSink(config.out_dir),
            _Stamp(jsonl, sizes),
            LogSink(),
            PacketSink(config.out_dir),
            _Stamp(done, None),
        ]
    kind = GlooCollector if config.collect == "gloo" else StoreCollector
    return kind(CollectorSettings(rank, config.ranks, config.out_dir, 10.0, sinks=sinks))


def run_rank(rank: int, config: Config, port: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stagefrontier import CollectConfig, StageTimer, TimerConfig

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, config.ranks, is_master=False)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=config.ranks, timeout=timedelta(seconds=120)
    )
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    jsonl: dict[int, float] = {}
    done: dict[int, float] = {}
    sizes: dict[int, list[int]] = {}
    submit_ns: list[int] = []
    timer = StageTimer(
        config=TimerConfig(window=config.window, collection=CollectConfig(out_dir=config.out_dir)),
        collector=_TimedSubmit(_collector(rank, config, jsonl, done, sizes), submit_ns),
    )
    steps = config.window * (config.windows + 1)
    exit_ns: list[int] = []
    window_end: dict[int, float] = {}
    perf = time.perf_counter_ns
    for i in range(steps):
        step = timer.step()
        step.__enter__()
        with timer.stage("data.next_wait"):
            x = torch.randn(16, 32, generator=gen)
            y = torch.randint(0, 8, (16,), generator=gen)
            if config.data_sleep_s:
                time.sleep(config.data_sleep_s)
        with timer.stage("model.fwd_loss_cpu_wall"):
            loss = F.cross_entropy(model(x), y)
        with timer.stage("model.backward_cpu_wall"):
            loss.backward()
        with timer.stage("optim.step_cpu_wall"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        ended = time.monotonic()
        t0 = perf()
        step.__exit__(None, None, None)
        exit_ns.append(perf() - t0)
        if (i + 1) % config.window == 0:
            window_end[(i + 1) // config.window - 1] = ended
    timer.close()
    result = {"exit_ns": exit_ns, "window_end": window_end, "jsonl": jsonl, "done": done}
    result.update(sizes=sizes, submit_ns=submit_ns)
    Path(config.out_dir, f"result-rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def launch(config: Config) -> list[dict[str, Any]]:
    Path(config.out_dir).mkdir(parents=True, exist_ok=True)
    codes = run_ranks(run_rank, config.ranks, config, deadline_s=DEADLINE_S)
    if any(code != 0 for code in codes.values()):
        raise RuntimeError(f"ranks exited with {codes}")
    return [
        json.loads(Path(config.out_dir, f"result-rank{rank}.json").read_text())
        for rank in range(config.ranks)
    ]


# ---------------------------------------------------------------------------------- analysis
@dataclass(frozen=True)
class Row:
    collect: str
    ranks: int
    window: int
    windows: int
    step_ms: float
    other_exit_us: float
    handoff_us: list[float]
    submit_us: list[float]
    latency_ms: list[float]
    all_sinks_ms: list[float]
    payload_bytes: float
    packet_kb: float
    gather_ok: int

    @property
    def handoff_median(self) -> float:
        return statistics.median(self.handoff_us)

    @property
    def handoff_p90(self) -> float:
        return float(np.percentile(self.handoff_us, 90))

    @property
    def handoff_ok(self) -> bool:
        return self.handoff_median <= HANDOFF_TARGET_US

    @property
    def latency_median(self) -> float:
        return statistics.median(self.latency_ms)

    @property
    def latency_ok(self) -> bool:
        return self.latency_median <= LATENCY_TARGET_MS


def summarize(config: Config, results: list[dict[str, Any]]) -> Row:
    w = config.window
    handoff: list[float] = []
    others: list[float] = []
    submit: list[float] = []
    for res in results:
        submit.extend(ns / 1e3 for ns in res["submit_ns"][1 : config.windows + 1])
        exits = np.asarray(res["exit_ns"][w:], dtype=np.float64) / 1e3  # skip the warm-up
        boundary = np.zeros(exits.size, dtype=bool)
        boundary[w - 1 :: w] = True
        base = float(np.median(exits[~boundary]))
        others.append(base)
        handoff.extend((exits[boundary] - base).tolist())
    rank0 = results[0]
    measured = [str(i) for i in range(1, config.windows + 1)]
    ends = rank0["window_end"]
    latency = [1e3 * (rank0["jsonl"][i] - ends[i]) for i in measured if i in rank0["jsonl"]]
    all_sinks = [1e3 * (rank0["done"][i] - ends[i]) for i in measured if i in rank0["done"]]
    payload = [n for i in measured for n in rank0["sizes"].get(i, [])]
    packets = sorted(Path(config.out_dir, "packets").glob("*.json"))
    records = [
        json.loads(line)
        for line in Path(config.out_dir, "windows.jsonl").read_text().splitlines()
        if line.strip()
    ]
    walls = [r["step_wall_s"] / max(len(r["ranks_present"]), 1) for r in records[1:]]
    return Row(
        collect=config.collect,
        ranks=config.ranks,
        window=w,
        windows=len(latency),
        step_ms=1e3 * statistics.median(walls) / w if walls else float("nan"),
        other_exit_us=statistics.median(others),
        handoff_us=handoff,
        submit_us=submit,
        latency_ms=latency,
        all_sinks_ms=all_sinks,
        payload_bytes=statistics.mean(payload) if payload else float("nan"),
        packet_kb=statistics.mean(p.stat().st_size for p in packets[1:]) / 1e3
        if len(packets) > 1
        else float("nan"),
        gather_ok=sum(bool(r["gather_ok"]) for r in records[1:]),
    )


HEADER = (
    "| collect | R | window | windows | step ms | other exits us | hand-off us median (p90, max) "
    "| of which submit us median (p90) | latency ms median (max) | all sinks ms median "
    "| payload B/rank | packet KB | gather_ok | target met |"
)


def markdown_table(rows: Sequence[Row]) -> str:
    lines = [HEADER, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        latency_applies = r.ranks == LATENCY_TARGET_RANKS
        verdict = [
            f"hand-off {'yes' if r.handoff_ok else 'NO'}",
            f"latency {'yes' if r.latency_ok else 'NO'}" if latency_applies else "latency n/a",
        ]
        lines.append(
            f"| {r.collect} | {r.ranks} | {r.window} | {r.windows} | {r.step_ms:.2f} "
            f"| {r.other_exit_us:.1f} | {r.handoff_median:.1f} ({r.handoff_p90:.1f}, "
            f"{max(r.handoff_us):.1f}) | {statistics.median(r.submit_us):.1f} "
            f"({np.percentile(r.submit_us, 90):.1f}) "
            f"| {r.latency_median:.1f} ({max(r.latency_ms):.1f}) "
            f"| {statistics.median(r.all_sinks_ms):.1f} | {r.payload_bytes:.0f} "
            f"| {r.packet_kb:.1f} | {r.gather_ok}/{r.windows} | {', '.join(verdict)} |"
        )
    return "\n".join(lines)


def verdicts(rows: Sequence[Row]) -> list[str]:
    def outcome(misses: list[str], met: str) -> str:
        return met if not misses else "MISSED (" + "; ".join(misses) + ")."

    handoff = [
        f"{r.collect} R={r.ranks}: {r.handoff_median:.1f} us" for r in rows if not r.handoff_ok
    ]
    out = [
        "- Hand-off (boundary step exit minus the median other exit, median over ranks and "
        f"windows, <= {HANDOFF_TARGET_US:.0f} us): " + outcome(handoff, "met in every row.")
    ]
    shares = [statistics.median(r.submit_us) for r in rows]
    out.append(
        f"- Of the hand-off, the collector's `submit` (queue offer) takes {min(shares):.1f}-"
        f"{max(shares):.1f} us (median per row); the rest is the recorder's "
        "snapshot on the training thread (one copy of the raw rows plus the window's "
        "bookkeeping; the residual and the RankWindow are built on the collector thread), most "
        "of it cache and scheduler cold-start after the step's compute."
    )
    at_target = [r for r in rows if r.ranks == LATENCY_TARGET_RANKS]
    if at_target:
        latency = [f"{r.collect}: {r.latency_median:.1f} ms" for r in at_target if not r.latency_ok]
        out.append(
            f"- Rank-0 latency, window end to windows.jsonl flushed, R={LATENCY_TARGET_RANKS} "
            f"(median, <= {LATENCY_TARGET_MS:.0f} ms): " + outcome(latency, "met.")
        )
    else:
        out.append(f"- Latency target (R={LATENCY_TARGET_RANKS}): not measured in this run.")
    return out


# ---------------------------------------------------------------------------------- report
def source_revision() -> str:
    """The git commit of the checkout, and whether its sources have uncommitted changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    if not head:
        return "unknown"
    return f"commit {head}" + (" with uncommitted changes under src/" if dirty else "")


def environment() -> list[str]:
    import torch

    import stagefrontier

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
                cpu,
            )
    except OSError:
        pass
    return [
        f"- stagefrontier source: {source_revision()}",
        f"- Python: {platform.python_version()} ({platform.python_implementation()})",
        f"- torch: {torch.__version__}, numpy: {np.__version__}, "
        f"stagefrontier: {getattr(stagefrontier, '__version__', 'unknown')}",
        f"- CPU: {cpu}, {os.cpu_count()} logical CPUs",
        f"- Platform: {platform.platform()}",
    ]


def render(rows: Sequence[Row], command: str, loads: tuple[str, str], args: Any) -> str:
    return "\n".join(
        [
            *result_header("Collection benchmark: hand-off, rank-0 latency, packet size", command),
            *environment(),
            f"- Load average (1, 5, 15 min) at start: {loads[0]}; at end: {loads[1]}",
            "",
            "Method: for each row, R spawned processes train a DDP MLP (32-64-8, batch 16) over "
            f"Gloo with `OMP_NUM_THREADS=1`, {args.data_sleep_ms:g} ms of sleep in the data stage, "
            "and a StageTimer per rank with the named collector (rank 0 with its default sinks: "
            "windows.jsonl, the log line, the evidence packet). The first window is a warm-up. "
            "*Hand-off*: `time.perf_counter_ns()` around `timer.step().__exit__` in the loop; a "
            "boundary exit minus the median exit of that rank's other steps, pooled over all ranks "
            "and measured windows; *of which submit*: the collector's `submit` alone, timed inside "
            "that exit by a thin wrapper (about 0.3 us of timing overhead). *Latency*: rank 0, "
            "`time.monotonic()` just before the boundary "
            "exit to the window's windows.jsonl line flushed (a sink right after the JSONL sink); "
            "*all sinks*: to the packet written. *Payload*: the wire bytes per rank per window; "
            "*packet*: the evidence packet file per window. *Step ms*: mean step wall time "
            "(median over windows).",
            "",
            markdown_table(rows),
            "",
            "Verdicts:",
            "",
            *verdicts(rows),
            "",
        ]
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = script_parser("collection", __doc__, quick="2 ranks, 2 measured windows")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    modes = ["store", "gloo"]
    parser.add_argument("--collect", nargs="+", choices=modes, default=modes)
    parser.add_argument("--window", type=int, default=20, help="steps per window")
    parser.add_argument("--windows", type=int, default=6, help="measured windows per run")
    parser.add_argument("--data-sleep-ms", type=float, default=0.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.ranks, args.windows = [2], 2
    command = " ".join([COMMAND, *(sys.argv[1:] if argv is None else argv)])
    load_start = load_text()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="sf-collection-") as tmp:
        for collect in args.collect:
            for ranks in args.ranks:
                config = Config(
                    ranks=ranks,
                    collect=collect,
                    window=args.window,
                    windows=args.windows,
                    data_sleep_s=args.data_sleep_ms / 1e3,
                    out_dir=str(Path(tmp, f"{collect}-{ranks}")),
                )
                rows.append(summarize(config, launch(config)))
                print(f"done: {collect} R={ranks}", file=sys.stderr, flush=True)
    text = render(rows, command, (load_start, load_text()), args)
    write_result(args.out, text, echo=False)
    print(markdown_table(rows))
    print()
    print("\n".join(verdicts(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
