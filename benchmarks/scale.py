"""Benchmark: flat collection against node summaries, simulated from 8 to 100,000 ranks.

For each rank count ``R`` (``G`` ranks per node) and each scenario (one straggler rank, one
straggler node) the script draws one window of lognormal stage times as integer nanoseconds,
then runs both paths in this process with the real serialization:

* flat: every rank's window is encoded as the collectors send it (``collect.wire``); rank 0
  reads all of them from the job's store, decodes them and runs ``analyze`` on ``[N, R, S]``;
* hierarchical: each node summarizes its ranks (``summarize`` + ``encode_summary``; the rank
  windows stay on the node), and summaries go up a tree of fan-in ``F`` whose top is rank 0:
  an aggregator decodes its children's summaries, combines and re-encodes them; rank 0 reads
  at most ``F`` summaries, combines them and runs ``analyze_summary``.

It records per row the bytes rank 0 reads, the bytes that pass through the job's store (flat:
all rank windows; hierarchical: every summary sent up the tree), rank 0's time per window,
one node's summary time, rank 0's peak traced memory, and whether the hierarchical report
agrees with the flat one: identical advances and shares, the same top stage and the same
leader rank of it, and every stage's lag within its reported ``lag_error_bound_s``.

Usage::

    python benchmarks/scale.py            # full run, writes benchmarks/results/scale.md
    python benchmarks/scale.py --quick    # small rank counts, for a smoke check
    python benchmarks/scale.py --out PATH # write the markdown somewhere else
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

import stagefrontier as sf
from analyzer import environment
from harness_common import load_1min, quiet_check, result_header, script_parser
from stagefrontier.collect.wire import decode_window, encode_window
from stagefrontier.record.window import RankWindow

FULL_RANKS = (8, 64, 1_000, 4_000, 16_000, 50_000, 100_000)
QUICK_RANKS = (8, 64, 512)
PER_NODE = 8
"""G: ranks per node."""
FAN_IN = 8
"""F: summaries an aggregator (and rank 0) reads."""
STEPS = 20
STAGES = list(sf.DEFAULT_STAGES)
STAGE_MEDIANS_S = np.array([0.012, 0.045, 0.095, 0.010, 0.020, 0.010])
STALL_S = 0.120
SEED = 20251122
ROOT_REPEATS = 21
COMMAND = "python benchmarks/scale.py"
IntArray = npt.NDArray[np.int64]


def make_window(ranks: int, scenario: str) -> IntArray:
    """Seeded ``[N, R, S]`` nanoseconds: lognormal stage times with a small per-rank bias.

    ``rank``: rank ``R // 3`` stalls 120 ms in its backward stage in every other step.
    ``node``: every rank of the node holding rank ``R // 2`` runs its backward stage 40% slower.
    """
    rng = np.random.default_rng([SEED, ranks, len(scenario)])
    bias = rng.lognormal(0.0, 0.03, size=(1, ranks, len(STAGES)))
    d = STAGE_MEDIANS_S * bias * rng.lognormal(0.0, 0.15, size=(STEPS, ranks, len(STAGES)))
    if scenario == "rank":
        d[::2, ranks // 3, 2] += STALL_S
    else:
        first = (ranks // 2) // PER_NODE * PER_NODE
        d[:, first : first + PER_NODE, 2] *= 1.4
    return np.round(d * 1e9).astype(np.int64)


@dataclass(frozen=True)
class Row:
    scenario: str
    ranks: int
    nodes: int
    levels: int
    flat_root_bytes: int | None
    flat_root_ms: float | None
    flat_peak_mb: float | None
    node_bytes: int
    hier_root_bytes: int
    hier_store_bytes: int
    hier_root_ms: float
    node_ms: float
    hier_peak_mb: float
    agreement: dict[str, bool]
    max_lag_bound_ms: float
    load_1min: float | None
    """The 1-minute load average right after the row was measured."""

    @property
    def agrees(self) -> bool:
        return all(self.agreement.values())


def rank_window(d_ns: IntArray, rank: int) -> RankWindow:
    rows = np.ascontiguousarray(d_ns[:, rank, :])
    return RankWindow(
        window=0,
        first_step=0,
        last_step=STEPS - 1,
        rank=rank,
        stages=tuple(STAGES),
        durations_ns=rows,
        wall_ns=rows.sum(axis=1),
        hostname=f"node{rank // PER_NODE}",
        local_rank=rank % PER_NODE,
    )


def flat_path(d_ns: IntArray) -> tuple[int, float, float, sf.WindowReport]:
    """Rank 0's bytes, time (decode + analyze, median of repeats), peak MB and report."""
    payloads = [encode_window(rank_window(d_ns, r)) for r in range(d_ns.shape[1])]

    def root() -> sf.WindowReport:
        windows = [decode_window(p) for p in payloads]
        d = np.stack([w.durations_ns for w in windows], axis=1) / 1e9
        return sf.analyze(d, STAGES)

    report, ms = timed(root, repeats=1 if d_ns.shape[1] > 20_000 else 3)
    return sum(map(len, payloads)), ms, peak_mb(root), report


def node_summaries(d_ns: IntArray) -> tuple[list[bytes], float]:
    """Each node's encoded summary and the median time one node takes to make it."""
    d = d_ns / 1e9
    out, times = [], []
    for first in range(0, d.shape[1], PER_NODE):
        start = time.perf_counter()
        cols = range(first, min(first + PER_NODE, d.shape[1]))
        out.append(sf.encode_summary(sf.summarize(d[:, cols.start : cols.stop], cols, STAGES)))
        times.append(time.perf_counter() - start)
    return out, statistics.median(times) * 1e3


def tree(summaries: list[bytes]) -> tuple[list[bytes], int, int]:
    """Send node summaries up a tree of fan-in ``FAN_IN`` whose top is rank 0.

    Rank 0 has ``FAN_IN`` children (fewer with fewer nodes); below each child, summaries are
    aggregated ``FAN_IN`` at a time until one is left. Returns (the summaries rank 0 reads,
    bytes sent up through the job's store at every level, levels including the nodes')."""
    if len(summaries) <= FAN_IN:
        return summaries, sum(map(len, summaries)), 1
    store_bytes = sum(map(len, summaries))
    top, levels = [], 1
    for chunk in np.array_split(np.arange(len(summaries)), FAN_IN):
        items, depth = [summaries[i] for i in chunk], 1
        while len(items) > 1:
            items = [aggregate(items[i : i + FAN_IN]) for i in range(0, len(items), FAN_IN)]
            store_bytes += sum(map(len, items))
            depth += 1
        top.append(items[0])
        levels = max(levels, depth)
    return top, store_bytes, levels


def aggregate(children: Sequence[bytes]) -> bytes:
    return sf.encode_summary(sf.combine([sf.decode_summary(b) for b in children]))


def hierarchical_root(top: Sequence[bytes]) -> sf.WindowReport:
    return sf.analyze_summary(sf.combine([sf.decode_summary(b) for b in top]))


def timed(func: Callable[[], Any], repeats: int = ROOT_REPEATS) -> tuple[Any, float]:
    """The result and the median wall milliseconds of ``repeats`` calls."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = func()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times) * 1e3


def peak_mb(func: Callable[[], Any]) -> float:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        func()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 1e6


def agreement(flat: sf.WindowReport, hier: sf.WindowReport) -> tuple[dict[str, bool], float]:
    top = flat.top1
    bounds = {s: hier.localization[s].lag_error_bound_s for s in STAGES}
    lag_ok = all(
        abs(hier.localization[s].lag_mean_s - flat.localization[s].lag_mean_s) <= bounds[s]
        for s in STAGES
    )
    return {
        "advances": hier.advances == flat.advances,
        "shares": hier.shares == flat.shares,
        "top stage": hier.top1 == top,
        "leader": top is not None and hier.leaders[top] == flat.leaders[top],
        "lag in bound": lag_ok,
    }, max(bounds.values()) * 1e3


def run_row(ranks: int, scenario: str, flat_max: int) -> Row:
    d_ns = make_window(ranks, scenario)
    summaries, node_ms = node_summaries(d_ns)
    top, store_bytes, levels = tree(summaries)
    hier_report, hier_ms = timed(lambda: hierarchical_root(top))
    flat_bytes = flat_ms = flat_peak = None
    agree: dict[str, bool] = {}
    bound_ms = max(loc.lag_error_bound_s for loc in hier_report.localization.values()) * 1e3
    if ranks <= flat_max:
        flat_bytes, flat_ms, flat_peak, flat_report = flat_path(d_ns)
        agree, bound_ms = agreement(flat_report, hier_report)
    return Row(
        scenario=scenario,
        ranks=ranks,
        nodes=len(summaries),
        levels=levels,
        flat_root_bytes=flat_bytes,
        flat_root_ms=flat_ms,
        flat_peak_mb=flat_peak,
        node_bytes=int(statistics.median(map(len, summaries))),
        hier_root_bytes=sum(map(len, top)),
        hier_store_bytes=store_bytes,
        hier_root_ms=hier_ms,
        node_ms=node_ms,
        hier_peak_mb=peak_mb(lambda: hierarchical_root(top)),
        agreement=agree,
        max_lag_bound_ms=bound_ms,
        load_1min=load_1min(),
    )


HEADERS = (
    "scenario",
    "R",
    "nodes",
    "levels",
    "flat: rank 0 = store kB",
    "flat: rank 0 ms",
    "flat: peak MB",
    "node summary kB",
    "hier: rank 0 kB",
    "hier: store kB",
    "hier: rank 0 ms",
    "node ms",
    "hier: peak MB",
    "lag bound ms",
    "advances, shares, top, leader, lag",
    "load",
)


def cells(row: Row) -> list[str]:
    def opt(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    agree = ", ".join("yes" if ok else "NO" for ok in row.agreement.values()) or "no flat run"
    return [
        row.scenario,
        f"{row.ranks:,}",
        f"{row.nodes:,}",
        str(row.levels),
        opt(None if row.flat_root_bytes is None else row.flat_root_bytes / 1e3, ",.0f"),
        opt(row.flat_root_ms, ",.1f"),
        opt(row.flat_peak_mb, ",.1f"),
        f"{row.node_bytes / 1e3:.1f}",
        f"{row.hier_root_bytes / 1e3:.1f}",
        f"{row.hier_store_bytes / 1e3:,.0f}",
        f"{row.hier_root_ms:.1f}",
        f"{row.node_ms:.2f}",
        f"{row.hier_peak_mb:.1f}",
        f"{row.max_lag_bound_ms:.2f}",
        agree,
        opt(row.load_1min, ".2f"),
    ]


def table(rows: Sequence[Row]) -> list[str]:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    return lines


def verdicts(rows: Sequence[Row], loads: Sequence[float | None]) -> list[str]:
    big = [r for r in rows if r.ranks >= 1_000]
    out = []
    for scenario in ("rank", "node"):
        mine = [r for r in big if r.scenario == scenario]
        if len(mine) < 2:
            continue
        kb = [r.hier_root_bytes / 1e3 for r in mine]
        ms = [r.hier_root_ms for r in mine]
        per_node = [r.hier_store_bytes / r.nodes / 1e3 for r in mine]
        out.append(
            f"- {scenario} straggler, R = {mine[0].ranks:,} to {mine[-1].ranks:,}: rank 0 reads "
            f"{min(kb):.1f}-{max(kb):.1f} kB (spread {_spread(kb):.1%}) and spends "
            f"{min(ms):.1f}-{max(ms):.1f} ms (spread {_spread(ms):.1%}) per window; the job's "
            f"store carries {min(per_node):.1f}-{max(per_node):.1f} kB per node per window "
            "(node summaries and the tree above them)."
        )
    checked = [r for r in rows if r.agreement]
    agree = all(r.agrees for r in checked)
    out.append(
        f"- Agreement with the flat path: {'every column true' if agree else 'NOT all true'} "
        f"in {len(checked)} rows with a flat run."
    )
    return out + quiet_check(loads)


def _spread(values: Sequence[float]) -> float:
    """(max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values)


def render(rows: Sequence[Row], quick: bool, loads: Sequence[float | None]) -> str:
    command = COMMAND + (" --quick" if quick else "")
    return "\n".join(
        [
            *result_header("Scale benchmark: flat collection vs. node summaries", command),
            *environment(loads),
            "",
            f"Method: one window of N={STEPS} steps and the S={len(STAGES)} default stages, "
            "lognormal stage times (medians 10-95 ms, 15% spread, 3% per-rank bias) as integer "
            f"nanoseconds, G={PER_NODE} ranks per node. Scenario `rank`: one rank stalls "
            f"{STALL_S * 1e3:.0f} ms in backward in every other step; `node`: the 8 ranks of "
            "one node run backward 40% slower. Flat: each rank's window as `collect.wire` "
            "encodes it; rank 0 decodes all and runs `analyze`. Hierarchical: each node runs "
            "`summarize` + `encode_summary`; aggregators of fan-in "
            f"F={FAN_IN} decode, `combine` and re-encode up a tree (`levels` counts the node "
            f"level too); rank 0 reads at most {FAN_IN} summaries, combines them and runs "
            "`analyze_summary`. Store bytes: flat, every rank window; hierarchical, every "
            "summary sent up the tree (rank windows stay on their node). Times are wall "
            f"clock, medians of {ROOT_REPEATS} calls (flat above 20,000 ranks: one call); node "
            "ms is the median over nodes of one node's summarize + encode. Peak MB is "
            "tracemalloc's peak during rank 0's work for one window (flat: decoding the "
            "windows and analyzing; hierarchical: decoding, combining and analyzing). "
            "Agreement compares the hierarchical report with the flat one: advances and shares "
            "equal as floats, the same top stage and leader rank of it, each stage's lag within "
            "its `lag_error_bound_s` (the largest bound is the `lag bound ms` column).",
            "",
            *table(rows),
            "",
            "Verdicts:",
            "",
            *verdicts(rows, loads),
            "",
        ]
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = script_parser("scale", __doc__, quick="small rank counts")
    parser.add_argument(
        "--flat-max",
        type=int,
        default=100_000,
        help="largest rank count the flat path runs at (default 100000)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    loads = [load_1min()]
    run_row(QUICK_RANKS[0], "rank", args.flat_max)  # warm-up: imports and first calls
    rows = []
    print(" | ".join(HEADERS), flush=True)
    for ranks in QUICK_RANKS if args.quick else FULL_RANKS:
        for scenario in ("rank", "node"):
            start = time.perf_counter()
            row = run_row(ranks, scenario, args.flat_max)
            rows.append(row)
            print(" | ".join(cells(row)), flush=True)
            print(f"  R={ranks} {scenario}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    loads.append(load_1min())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(rows, args.quick, loads), encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(r.agrees for r in rows if r.agreement) else 1


if __name__ == "__main__":
    sys.exit(main())
