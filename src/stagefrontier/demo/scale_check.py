"""Flat against hierarchical collection on one job (``python -m stagefrontier.demo.scale_check``).

Runs the demo twice as torchrun nodes on this machine (``demo.torchrun``), once collected flat
through the job's store and once hierarchically with the same seed and faults, and prints per
window what must agree across the two runs (the top stage and who leads it: a rank or a node).
Two runs never time alike, so the exactness check is made within the hierarchical run: its node
leaders keep the exact windows their summaries were built from
(``CollectConfig.keep_node_windows``), and the flat analysis of those windows must give rank 0's
top stage and the leaders of the stages some rank leads alone, and its advances and shares within
the rounding the compact node parts state (``nodes.rounding_s`` in the record: each duration
within it, so each step's advance within twice it). With ``--router`` both runs route, and each
run's incidents are printed after the table.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..collect.base import merge_received
from ..collect.wire import decode_window
from ..route import list_incidents, summary_line
from ..window.merged import analyze_merged
from ..window.rank import RankWindow
from .faults import check_faults, parse_fault
from .torchrun import launch_nodes
from .train import DemoConfig

ROUNDOFF = 1e-9
"""Seconds of float roundoff allowed on top of the stated rounding (sums of ~1e3 float64
durations of ~1 s differ by ~1e-13)."""


def node_windows(out_dir: str | Path) -> dict[int, list[RankWindow]]:
    """The windows the node leaders kept (``node-windows/node-<i>/window-<w>-rank-<r>.bin``),
    by window index."""
    by_window: dict[int, list[RankWindow]] = {}
    for path in sorted(Path(out_dir, "node-windows").glob("node-*/window-*-rank-*.bin")):
        window = decode_window(path.read_bytes())
        by_window.setdefault(window.window, []).append(window)
    return by_window


@dataclass(frozen=True)
class Recheck:
    """One window of a hierarchical run against the flat analysis of the same windows."""

    window: int
    same_top: bool
    same_leaders: bool
    """The leader of every stage that holds at least ``share_tie`` of the exposed time and that
    one rank leads alone (its only leading rank). A stage that advances the frontier by next to
    nothing is led by whichever rank is a few microseconds ahead, below the rounding of the node
    parts; and where several ranks share a stage's lead, a step one of them leads alone by a gap
    near the tie tolerance is a tie after that rounding (CI: backward, led by rank 13 alone in 1
    of 5 steps flat, by no rank hierarchically)."""
    max_advance_diff_s: float
    max_share_diff: float
    advance_bound_s: float
    """What the node parts' rounding allows: one frontier difference per step, each within
    twice the rounding, plus float roundoff."""
    share_bound: float
    """The same for shares: a stage's advance and the window's exposed time both move."""

    @property
    def equal(self) -> bool:
        return (
            self.same_top
            and self.same_leaders
            and self.max_advance_diff_s <= self.advance_bound_s
            and self.max_share_diff <= self.share_bound
        )


def recheck(record: dict[str, Any], windows: Sequence[RankWindow]) -> Recheck:
    """Analyze ``windows`` flat and compare with rank 0's hierarchical ``record``."""
    flat = analyze_merged(merge_received(windows, int(record["world_size"]))).report
    advances, shares = record["advances"], record["shares"]
    steps = int(record["last_step"]) - int(record["first_step"]) + 1
    rounding = steps * float(record["nodes"]["rounding_s"])
    exposed = sum(flat.advances.values())
    return Recheck(
        window=int(record["window"]),
        same_top=flat.top1 == record["top1"],
        same_leaders=all(
            flat.leaders[s] == record["leaders"][s]
            for s in flat.stages
            if flat.shares.get(s, 0.0) >= flat.gates.share_tie
            and flat.localization[s].leading_ranks == [flat.leaders[s]]
        ),
        max_advance_diff_s=max(abs(flat.advances[s] - advances[s]) for s in flat.stages),
        max_share_diff=max(abs(flat.shares[s] - shares[s]) for s in flat.stages),
        advance_bound_s=2 * rounding + ROUNDOFF,
        share_bound=(3 * rounding + ROUNDOFF) / exposed if exposed > 0 else ROUNDOFF,
    )


def lead_of(record: dict[str, Any]) -> str:
    """``rank 5``, ``node node1@host (ranks 4-7)`` or ``no single leader``: who leads the top
    stage, as a record says it."""
    lead = record.get("lead") or {}
    ranks = sorted(lead.get("ranks", []))
    if lead.get("scope") == "rank":
        return f"rank {ranks[0]}"
    if lead.get("scope") == "node":
        return f"node {lead['hosts'][0]} (ranks {ranks[0]}-{ranks[-1]})"
    return "no single leader"


def regression_of(record: dict[str, Any]) -> str:
    """``data.next_wait, all ranks``, ``data.next_wait, rank 5`` or ``-``: what a record's live
    regression check flagged."""
    found = record.get("regression")
    if not found:
        return "-"
    ranks = found["ranks"]
    who = "all ranks" if found["all_ranks"] else "rank(s) " + ",".join(map(str, ranks))
    return f"{found['top_stage']}, {who}"


def comparison_rows(
    flat: Sequence[dict[str, Any]], hierarchical: Sequence[dict[str, Any]], out_dir: Path
) -> list[list[str]]:
    """One row per window: the two runs' top stage and lead, whether they agree, and the
    hierarchical run's recheck against the flat analysis of its own kept windows."""
    kept = node_windows(out_dir)
    by_index = {int(r["window"]): r for r in flat}
    rows = []
    for record in hierarchical:
        index = int(record["window"])
        other = by_index.get(index)
        check = recheck(record, kept[index]) if index in kept else None
        agree = other is not None and (other["top1"], lead_of(other)) == (
            record["top1"],
            lead_of(record),
        )
        rows.append(
            [
                str(index),
                f"{other['top1']} / {lead_of(other)}" if other else "missing",
                f"{record['top1']} / {lead_of(record)}",
                "yes" if agree else "NO",
                "not kept" if check is None else f"{check.max_advance_diff_s:.1e}",
                "not kept" if check is None else ("yes" if check.equal else "NO"),
                f"{regression_of(other) if other else 'missing'} / {regression_of(record)}",
            ]
        )
    return rows


HEADER = [
    "window",
    "flat: top / lead",
    "hierarchical: top / lead",
    "agree",
    "max |advance diff| (s)",
    "within the rounding",
    "regression: flat / hierarchical",
]


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [HEADER, *rows]
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def run_both(
    config: DemoConfig, *, nodes: int, per_node: int, side_by_side: bool = False
) -> list[list[str]]:
    """The two runs under ``config.out_dir``/flat and /hierarchical, compared. With
    ``side_by_side`` the two jobs run at once (each on its own rendezvous store): their ranks
    spend most of a stalled step waiting, so the pair takes little more than one, at the cost of
    twice the processes on the cores while they train."""
    out = Path(config.out_dir)
    hier_dir = out / "hierarchical"
    configs = (
        replace(config, out_dir=str(out / "flat"), collect="store"),
        replace(config, out_dir=str(hier_dir), collect="hierarchical", keep_node_windows=True),
    )

    def launch(run: DemoConfig) -> list[dict[str, Any]]:
        return launch_nodes(run, nodes=nodes, per_node=per_node)

    if side_by_side:
        with ThreadPoolExecutor(2) as pool:
            flat, hierarchical = pool.map(launch, configs)
    else:
        flat, hierarchical = map(launch, configs)
    return comparison_rows(flat, hierarchical, hier_dir)


def incident_lines(out: Path) -> list[str]:
    """Each run's incidents, one summary line each (or that it opened none)."""
    lines = []
    for run in ("flat", "hierarchical"):
        found = [summary_line(incident) for incident in list_incidents(out / run)]
        lines += [f"{run}: {line}" for line in found] or [f"{run}: no incident"]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stagefrontier.demo.scale_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--per-node", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        help="as the demo's, plus node targets: data@5:120ms,to=20 data@node1:120ms,from=20",
    )
    parser.add_argument("--out", default="stagefrontier-scale-check")
    parser.add_argument(
        "--router",
        action="store_true",
        help="turn the profiler router on in both runs and print each run's incidents",
    )
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.per_node < 1 or args.steps < 1 or args.window < 1:
        parser.error("--nodes, --per-node, --steps and --window must be >= 1")
    ranks = args.nodes * args.per_node
    try:
        faults = tuple(parse_fault(f) for f in args.fault)
        check_faults(faults, ranks, cuda=False, steps=args.steps, nodes=args.nodes)
    except ValueError as exc:
        parser.error(str(exc))
    config = DemoConfig(
        ranks=ranks,
        steps=args.steps,
        window=args.window,
        faults=faults,
        seed=args.seed,
        out_dir=args.out,
        router=args.router,
    )
    rows = run_both(small_config(config), nodes=args.nodes, per_node=args.per_node)
    print(table(rows))
    if args.router:
        print("\n".join(incident_lines(Path(args.out))))
    return 0 if rows and all(r[3] == r[5] == "yes" for r in rows) else 1


def small_config(config: DemoConfig) -> DemoConfig:
    """``config`` with the demo's model and batches shrunk so that many ranks train on a few
    cores (a check of collection, not of training speed), its ranks quiet."""
    return replace(config, batch_size=4, seq_len=32, d_model=32, n_layers=1, quiet=True)


if __name__ == "__main__":
    raise SystemExit(main())
