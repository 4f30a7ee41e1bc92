"""Benchmark: flat collection against node summaries, simulated from 8 to 100,000 ranks.

For each rank count ``R`` (``G`` ranks per node) and each scenario (one straggler rank, one
straggler node) the script draws one window of lognormal stage times as integer nanoseconds,
then runs both paths in this process with the real serialization:

* flat: every rank's window is encoded as the collectors send it (``collect.wire``); rank 0
  reads all of them from the job's store, decodes them and runs ``analyze`` on ``[N, R, S]``;
* hierarchical: the collector's own tree (``collect.node_tree`` at its default fan-in) and its
  own parts: each node leader makes its node's part (``node_payload.node_group``, the compact
  summary in its envelope; the rank windows stay on the node), a head decodes its children's
  parts, combines them and sends the group's part up; rank 0 (node 0's leader) does the same
  at every level it heads and analyzes the top group (``analyze_group``).

It records per row the bytes rank 0 reads, the bytes that pass through the job's store per
window (flat: the rank windows of ranks 1 .. R-1; hierarchical: the parts of nodes 1 .. M-1,
by tree level), the job store's operations per window (one set and one get per payload),
rank 0's time per window, one node's part time, rank 0's peak traced memory, and whether the
hierarchical report agrees with the flat one: the same top stage and leader rank of it,
advances and shares within what the parts' stated rounding allows, and every stage's lag
within its reported ``lag_error_bound_s``. The crossover is the smallest rank count from which
rank 0's time per window is lower hierarchically at every larger count measured.

Usage::

    python benchmarks/scale.py            # full run, writes benchmarks/results/scale.md
    python benchmarks/scale.py --quick    # small rank counts, for a smoke check
    python benchmarks/scale.py --out PATH # write the markdown somewhere else
    python benchmarks/scale.py --ranks 100000 --out PATH   # some rank counts only
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
from harness_common import load_1min, quiet_check, result_header, script_parser, write_result
from stagefrontier.collect.node import NodeIdentity
from stagefrontier.collect.node_payload import (
    Group,
    analyze_group,
    combine_groups,
    decode_group,
    node_group,
)
from stagefrontier.collect.node_tree import DEFAULT_FAN_IN, headed_levels, top_level
from stagefrontier.collect.wire import decode_window, encode_window
from stagefrontier.window.rank import RankWindow

FULL_RANKS = (8, 16, 32, 64, 128, 256, 512, 1_000, 4_000, 16_000, 50_000, 100_000)
QUICK_RANKS = (8, 64, 512)
PER_NODE = 8
"""G: ranks per node."""
FAN_IN = DEFAULT_FAN_IN
"""F: the collector's fan-in (a head reads at most F - 1 parts per level)."""
STEPS = 20
STAGES = list(sf.DEFAULT_STAGES)
STAGE_MEDIANS_S = np.array([0.012, 0.045, 0.095, 0.010, 0.020, 0.010])
STALL_S = 0.120
SEED = 20251122
ROOT_REPEATS = 21
FLAT_MAX = 100_000
"""The largest rank count the flat path is timed at by default."""
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
    flat_store_bytes: int | None
    flat_root_ms: float | None
    flat_peak_mb: float | None
    node_bytes: int
    hier_root_bytes: int
    hier_level_bytes: tuple[int, ...]
    """Job-store bytes per window by the level of the part sent (0: a node's own part)."""
    hier_root_ms: float
    node_ms: float
    hier_peak_mb: float
    agreement: dict[str, bool]
    max_lag_bound_ms: float
    rounding_us: float
    load_1min: float | None
    """The 1-minute load average right after the row was measured."""

    @property
    def agrees(self) -> bool:
        return all(self.agreement.values())

    @property
    def hier_store_bytes(self) -> int:
        return sum(self.hier_level_bytes)

    @property
    def flat_store_ops(self) -> int:
        return 2 * (self.ranks - 1)

    @property
    def hier_store_ops(self) -> int:
        return 2 * (self.nodes - 1)


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
    """The job store's bytes (ranks 1 .. R-1 send theirs to rank 0), rank 0's time (decode +
    analyze, median of repeats), peak MB and report."""
    payloads = [encode_window(rank_window(d_ns, r)) for r in range(d_ns.shape[1])]

    def root() -> sf.WindowReport:
        windows = [decode_window(p) for p in payloads]
        d = np.stack([w.durations_ns for w in windows], axis=1) / 1e9
        return sf.analyze(d, STAGES)

    report, ms = timed(root, repeats=1 if d_ns.shape[1] > 20_000 else 3)
    return sum(map(len, payloads[1:])), ms, peak_mb(root), report


def node_identity(node: int) -> NodeIdentity:
    return NodeIdentity(node=node, first_rank=node * PER_NODE, size=PER_NODE, host=f"node{node}")


def own_part(d_ns: IntArray, node: int) -> Group:
    """A leader's part of its node: the node's windows summarized."""
    windows = [rank_window(d_ns, r) for r in node_identity(node).ranks]
    return node_group(node_identity(node), windows[0], windows, [], [], None)


@dataclass
class Tree:
    """The parts every node but node 0 sends up, encoded, and the median ms of one node's own
    part (summarize and encode)."""

    sent: dict[int, bytes]
    node_ms: float
    nodes: int

    def level_bytes(self) -> tuple[int, ...]:
        levels = [top_level(n, self.nodes, FAN_IN) for n in self.sent]
        out = [0] * (max(levels, default=0) + 1)
        for n, level in zip(self.sent, levels, strict=True):
            out[level] += len(self.sent[n])
        return tuple(out)


def build_tree(d_ns: IntArray) -> Tree:
    """Every node's part sent up the collector's tree, heads first combining their children's
    (deepest heads first, as the windows would arrive)."""
    nodes = d_ns.shape[1] // PER_NODE
    sent: dict[int, bytes] = {}
    times = []
    order = sorted(range(1, nodes), key=lambda n: top_level(n, nodes, FAN_IN))
    for node in order:
        start = time.perf_counter()
        group = own_part(d_ns, node)
        times.append(time.perf_counter() - start)
        sent[node] = head(group, node, nodes, sent).encode()
    if not times:
        start = time.perf_counter()
        own_part(d_ns, 0).encode()
        times.append(time.perf_counter() - start)
    return Tree(sent, statistics.median(times) * 1e3, nodes)


def head(group: Group, node: int, nodes: int, sent: dict[int, bytes]) -> Group:
    """``group`` combined with the children's parts of every level ``node`` heads."""
    for level in headed_levels(node, nodes, FAN_IN):
        children = {c: decode_group(sent[c]) for c in level.children}
        group = combine_groups(group, level.node_count, children, {}, [], PER_NODE)
        # a head holds its children's parts only while it combines them
    return group


def hierarchical_root(d_ns: IntArray, tree: Tree) -> tuple[sf.WindowReport, sf.WindowSummary]:
    """Rank 0's work for one window: its node's part, its children's parts at every level it
    heads, the analysis of the top group."""
    top = head(own_part(d_ns, 0), 0, tree.nodes, tree.sent)
    own = rank_window(d_ns, 0)
    analyzed = analyze_group(top, own, d_ns.shape[1], PER_NODE, None)
    assert analyzed is not None and analyzed.summary is not None
    return analyzed.report, analyzed.summary


def root_bytes(tree: Tree) -> int:
    """What rank 0 reads from the job store: its children's parts at every level."""
    return sum(
        len(tree.sent[c]) for level in headed_levels(0, tree.nodes, FAN_IN) for c in level.children
    )


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


def agreement(
    flat: sf.WindowReport, hier: sf.WindowReport, rounding_s: float
) -> tuple[dict[str, bool], float]:
    """The hierarchical report against the flat one. Each duration in the parts is within
    ``rounding_s``, so a stage's advance (one frontier difference per step) within twice that
    per step, and a share within three times that per step over the exposed time."""
    top = flat.top1
    bounds = {s: hier.localization[s].lag_error_bound_s for s in STAGES}
    lag_ok = all(
        abs(hier.localization[s].lag_mean_s - flat.localization[s].lag_mean_s) <= bounds[s]
        for s in STAGES
    )
    exposed = sum(flat.advances.values())
    advance_bound = 2 * STEPS * rounding_s + ROUNDOFF_S
    share_bound = (3 * STEPS * rounding_s + ROUNDOFF_S) / exposed
    return {
        "advances": all(abs(hier.advances[s] - flat.advances[s]) <= advance_bound for s in STAGES),
        "shares": all(abs(hier.shares[s] - flat.shares[s]) <= share_bound for s in STAGES),
        "top stage": hier.top1 == top,
        "leader": top is not None and hier.leaders[top] == flat.leaders[top],
        "lag in bound": lag_ok,
    }, max(bounds.values()) * 1e3


ROUNDOFF_S = 1e-9


def run_row(ranks: int, scenario: str, flat_max: int) -> Row:
    d_ns = make_window(ranks, scenario)
    tree = build_tree(d_ns)
    (hier_report, summary), hier_ms = timed(lambda: hierarchical_root(d_ns, tree))
    flat_ms = flat_peak = None
    flat_bytes = sum(len(encode_window(rank_window(d_ns, r))) for r in range(1, ranks))
    agree: dict[str, bool] = {}
    bound_ms = max(loc.lag_error_bound_s for loc in hier_report.localization.values()) * 1e3
    if ranks <= flat_max:
        flat_bytes, flat_ms, flat_peak, flat_report = flat_path(d_ns)
        agree, bound_ms = agreement(flat_report, hier_report, summary.rounding_s)
    node_parts = [len(b) for n, b in tree.sent.items() if not headed_levels(n, tree.nodes, FAN_IN)]
    return Row(
        scenario=scenario,
        ranks=ranks,
        nodes=tree.nodes,
        levels=len(tree.level_bytes()),
        flat_store_bytes=flat_bytes,
        flat_root_ms=flat_ms,
        flat_peak_mb=flat_peak,
        node_bytes=int(statistics.median(node_parts or [len(own_part(d_ns, 0).encode())])),
        hier_root_bytes=root_bytes(tree),
        hier_level_bytes=tree.level_bytes() if tree.sent else (0,),
        hier_root_ms=hier_ms,
        node_ms=tree.node_ms,
        hier_peak_mb=peak_mb(lambda: hierarchical_root(d_ns, tree)),
        agreement=agree,
        max_lag_bound_ms=bound_ms,
        rounding_us=summary.rounding_s * 1e6,
        load_1min=load_1min(),
    )


HEADERS = (
    "scenario",
    "R",
    "nodes",
    "levels",
    "flat: store kB",
    "hier: store kB by level",
    "hier / flat store",
    "store ops flat, hier",
    "node part kB",
    "hier: rank 0 kB",
    "flat: rank 0 ms",
    "hier: rank 0 ms",
    "node ms",
    "flat: peak MB",
    "hier: peak MB",
    "rounding us",
    "lag bound ms",
    "advances, shares, top, leader, lag",
    "load",
)


def cells(row: Row) -> list[str]:
    def opt(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    agree = ", ".join("yes" if ok else "NO" for ok in row.agreement.values()) or "no flat run"
    ratio = None if not row.flat_store_bytes else row.hier_store_bytes / row.flat_store_bytes
    return [
        row.scenario,
        f"{row.ranks:,}",
        f"{row.nodes:,}",
        str(row.levels),
        opt(None if row.flat_store_bytes is None else row.flat_store_bytes / 1e3, ",.1f"),
        " + ".join(f"{b / 1e3:,.1f}" for b in row.hier_level_bytes),
        opt(None if ratio is None else ratio * 100, ".1f") + ("%" if ratio is not None else ""),
        f"{row.flat_store_ops:,}, {row.hier_store_ops:,}",
        f"{row.node_bytes / 1e3:.2f}",
        f"{row.hier_root_bytes / 1e3:.1f}",
        opt(row.flat_root_ms, ",.1f"),
        f"{row.hier_root_ms:.1f}",
        f"{row.node_ms:.2f}",
        opt(row.flat_peak_mb, ",.1f"),
        f"{row.hier_peak_mb:.1f}",
        f"{row.rounding_us:.1f}",
        f"{row.max_lag_bound_ms:.2f}",
        agree,
        opt(row.load_1min, ".2f"),
    ]


def table(rows: Sequence[Row]) -> list[str]:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    return lines


def crossover(rows: Sequence[Row]) -> int | None:
    """The smallest rank count from which rank 0's time per window is lower hierarchically than
    flat in both scenarios at every larger count measured (None: never)."""
    timed_rows = [r for r in rows if r.flat_root_ms is not None]
    counts = sorted({r.ranks for r in timed_rows})
    wins = {n: all(r.hier_root_ms < r.flat_root_ms for r in timed_rows if r.ranks == n)  # type: ignore[operator]
            for n in counts}  # fmt: skip
    found = None
    for n in reversed(counts):
        if not wins[n]:
            break
        found = n
    return found


def verdicts(rows: Sequence[Row], loads: Sequence[float | None]) -> list[str]:
    big = [r for r in rows if r.ranks >= 1_000]
    out = []
    for scenario in ("rank", "node"):
        mine = [r for r in big if r.scenario == scenario]
        if len(mine) < 2:
            continue
        kb = [r.hier_root_bytes / 1e3 for r in mine]
        ms = [r.hier_root_ms for r in mine]
        per_node = [r.hier_store_bytes / (r.nodes - 1) / 1e3 for r in mine]
        out.append(
            f"- {scenario} straggler, R = {mine[0].ranks:,} to {mine[-1].ranks:,}: rank 0 reads "
            f"{min(kb):.1f}-{max(kb):.1f} kB and spends {min(ms):.1f}-{max(ms):.1f} ms "
            f"(spread {_spread(ms):.1%}) per window; the job's store carries "
            f"{min(per_node):.2f}-{max(per_node):.2f} kB per node per window."
        )
    ratios = [
        r.hier_store_bytes / r.flat_store_bytes for r in rows if r.flat_store_bytes and r.nodes > 1
    ]
    if ratios:
        out.append(
            f"- Job-store bytes per window, hierarchical over flat at {PER_NODE} ranks per node: "
            f"{min(ratios):.1%} to {max(ratios):.1%} (target: at most 25%)."
        )
    checked = [r for r in rows if r.agreement]
    if not checked:
        out.append(
            "- The flat path was not timed at these counts (above --flat-max): no crossover "
            "and no agreement with it to report."
        )
        return out + quiet_check(loads)
    cross = crossover(rows)
    out.append(
        "- Crossover of rank 0's time per window: "
        + (
            f"hierarchical is faster from {cross:,} ranks on (every larger count measured)."
            if cross is not None
            else "hierarchical is never faster at the counts measured."
        )
    )
    agree = all(r.agrees for r in checked)
    out.append(
        f"- Agreement with the flat path: {'every column true' if agree else 'NOT all true'} "
        f"in {len(checked)} rows with a flat run."
    )
    return out + quiet_check(loads)


def _spread(values: Sequence[float]) -> float:
    """(max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values)


def render(
    rows: Sequence[Row],
    quick: bool,
    loads: Sequence[float | None],
    flat_max: int = FLAT_MAX,
    ranks: Sequence[int] = (),
) -> str:
    command = COMMAND + (" --quick" if quick else "")
    command += f" --flat-max {flat_max}" if flat_max != FLAT_MAX else ""
    command += f" --ranks {' '.join(map(str, ranks))}" if ranks else ""
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
            "encodes it; ranks 1 .. R-1 send theirs through the job's store; rank 0 decodes all "
            "and runs `analyze`. Hierarchical: the collector's tree (`collect.node_tree`, "
            f"fan-in F={FAN_IN}; `levels` counts the node level) and its parts: each node "
            "leader's part is `node_payload.node_group` (the compact summary in its envelope), "
            "a head decodes its children's parts, combines and re-encodes; nodes 1 .. M-1 send "
            "one part each through the job's store (`store kB by level`: the parts sent, by "
            "the level of the group they cover; 0 = one node's own). Rank 0's work is node "
            "0's: its own part, its children's at every level it heads, `analyze_group`. "
            "Store operations: one set and one get per payload through the job's store. Times "
            f"are wall clock, medians of {ROOT_REPEATS} calls (flat: 3, one above 20,000 "
            "ranks); node ms is the median over nodes of one node's part (summarize + "
            "encode). Peak MB is tracemalloc's peak during rank 0's work for one window. "
            "Agreement compares the hierarchical report with the flat one: the same top stage "
            "and leader rank of it, advances and shares within what the stated rounding "
            "allows (`rounding us`: the largest error on one duration; an advance within "
            f"2 x {STEPS} x rounding, a share within 3 x {STEPS} x rounding over the exposed "
            "time), each stage's lag within its `lag_error_bound_s` (the largest bound is the "
            "`lag bound ms` column).",
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
        default=FLAT_MAX,
        help="largest rank count the flat path is timed at (default 100000; its bytes are "
        "counted at every count)",
    )
    parser.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=(),
        help="only these rank counts (multiples of 8; default: the full list, or --quick's)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    loads = [load_1min()]
    run_row(QUICK_RANKS[0], "rank", args.flat_max)  # warm-up: imports and first calls
    rows = []
    print(" | ".join(HEADERS), flush=True)
    for ranks in args.ranks or (QUICK_RANKS if args.quick else FULL_RANKS):
        for scenario in ("rank", "node"):
            start = time.perf_counter()
            row = run_row(ranks, scenario, args.flat_max)
            rows.append(row)
            print(" | ".join(cells(row)), flush=True)
            print(f"  R={ranks} {scenario}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    loads.append(load_1min())
    write_result(args.out, render(rows, args.quick, loads, args.flat_max, args.ranks), echo=False)
    return 0 if all(r.agrees for r in rows if r.agreement) else 1


if __name__ == "__main__":
    sys.exit(main())
