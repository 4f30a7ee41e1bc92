"""E8: sharded data parallelism, ZeRO-1 and FSDP2, on Gloo/CPU.

The demo job wrapped two ways: DDP with ``torch.distributed.optim.ZeroRedundancyOptimizer``
(ZeRO-1: optimizer state sharded, parameters broadcast after each step) and FSDP2
``torch.distributed.fsdp.fully_shard`` on every transformer block and the root (parameters,
gradients and optimizer state sharded; all-gather in forward and backward, reduce-scatter in
backward). 180 ms faults on one rank in data, backward and callback/sync (comm is a DDP
communication hook, so it is not used here), plus the callback/host control (no barrier).
Each row's windows after the first are pooled and scored (top-1, top-2, tau_C = 0.80 routing
hit of the seeded stage). A configuration that cannot run on this machine is reported with the
ranks' error message instead of numbers.

Usage::

    python benchmarks/sharded.py            # full run, writes benchmarks/results/sharded.md
    python benchmarks/sharded.py --quick    # one seed, few steps: a smoke run
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness_common as hc
from stagefrontier.demo import DemoError

SHARDINGS = {
    "zero1": "ZeRO-1 (DDP + ZeroRedundancyOptimizer)",
    "fsdp2": "FSDP2 fully_shard (FULL_SHARD)",
}
FAMILIES = ("data", "backward", "callback_sync", "callback_host")
POSITIVE = FAMILIES[:3]
DELAY_MS = 180.0


@dataclass(frozen=True)
class Plan:
    ranks: int
    seeds: tuple[int, ...]
    steps: int
    window: int
    families: tuple[str, ...] = FAMILIES


FULL = Plan(ranks=4, seeds=(0, 1, 2), steps=30, window=10)
QUICK = Plan(ranks=4, seeds=(0,), steps=9, window=3, families=("data", "callback_host"))


def collect(quick: bool, work: Path) -> list[dict[str, Any]]:
    plan = QUICK if quick else FULL
    per_sharding = 1 + len(plan.families) * len(plan.seeds)
    progress = hc.Progress(len(SHARDINGS) * per_sharding)
    rows: list[dict[str, Any]] = []
    for sharding in SHARDINGS:
        jobs = [("none", 0)] + [(f, s) for f in plan.families for s in plan.seeds]
        for family, seed in jobs:
            row = run_row(sharding, family, seed, plan, work, progress)
            rows.append(row)
            if "error" in row and family == "none":
                break  # the configuration does not run here: say why once, skip its faults
    return rows


def run_row(
    sharding: str, family: str, seed: int, plan: Plan, work: Path, progress: hc.Progress
) -> dict[str, Any]:
    faults = (
        () if family == "none" else (hc.fault(family, hc.fault_rank(seed, plan.ranks), DELAY_MS),)
    )
    config = hc.demo_config(
        ranks=plan.ranks,
        steps=plan.steps,
        window=plan.window,
        faults=faults,
        seed=seed,
        sharding=sharding,
        out_dir=str(work / f"{sharding}-{family}-s{seed}"),
    )
    label = f"{sharding} {family} seed {seed}" + (f" {faults[0]}" if faults else "")
    row: dict[str, Any] = {
        "sharding": sharding,
        "family": family,
        "seed": seed,
        "ranks": plan.ranks,
        "fault": str(faults[0]) if faults else None,
        "seeded": hc.SEEDED_STAGE.get(family),
    }
    try:
        run = hc.launch_run(config)
    except DemoError as exc:
        progress.line(label, f"could not run: {exc}", 0.0)
        return row | {"error": str(exc)}
    pooled = hc.pool_windows(run.out_dir)
    shares = pooled.stagefrontier()
    top, top_share = hc.top_stage(shares)
    summary = f"top-1 {top} {top_share:.0%}"
    if row["seeded"]:
        summary += f", seeded {shares[row['seeded']]:.0%}"
    progress.line(label, summary, run.wall_s)
    return row | {
        "stages": list(pooled.stages),
        "shares": {m: v.tolist() for m, v in pooled.shares.items()},
        "labels": sorted({x for labels in pooled.window_labels for x in labels}),
        "p50_step_ms": hc.median_ms(hc.step_times(run, pooled.first_step, pooled.last_step)),
        "steps_scored": pooled.steps,
        "wall_s": run.wall_s,
    }


def hit(row: dict[str, Any]) -> hc.Hit:
    return hc.score(row["shares"]["stagefrontier"], row["stages"], row["seeded"])


def render(rows: list[dict[str, Any]], result: hc.Result, quick: bool) -> None:
    ok = [r for r in rows if "error" not in r]
    failed = [r for r in rows if "error" in r]
    positive = [r for r in ok if r["family"] in POSITIVE]
    control = [r for r in ok if r["family"] == "callback_host"]
    hits = [hit(r) for r in positive]
    n = len(positive)
    ranks = rows[0]["ranks"]
    result.title = "E8 sharded data parallel: ZeRO-1 and FSDP2 on Gloo/CPU (paper 6.4)"
    control_text = "; ".join(
        f"{sharding} {sum(hit(r).top2 for r in control if r['sharding'] == sharding)}/"
        f"{sum(r['sharding'] == sharding for r in control)}"
        for sharding in SHARDINGS
        if any(r["sharding"] == sharding for r in control)
    )
    result.summary = [
        f"{ranks} ranks, {DELAY_MS:g} ms faults, seeds {sorted({r['seed'] for r in ok})}."
        f" Sync-bounded positive rows (data, backward, callback/sync): top-2"
        f" {sum(h.top2 for h in hits)}/{n}, top-1 {sum(h.top1 for h in hits)}/{n}."
        f" Callback/host control routed top-2: {control_text} (see the notes: ZeRO-1's"
        " optimizer broadcast right after the callback exposes it)."
        + (
            f" {len({r['sharding'] for r in failed})} configuration(s) could not run."
            if failed
            else ""
        )
        + " Paper: 90/90 top-2, 87/90 top-1 at 8/16/32 ranks; host-local control 0/18.",
    ]
    result.section("Per configuration and fault", config_table(ok))
    if failed:
        result.section("Configurations that could not run", error_lines(failed))
    result.section("Every row", row_table(ok))
    result.section("Comparison with the paper", notes(ok, failed, quick))


def config_table(ok: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for sharding, title in SHARDINGS.items():
        base = [r for r in ok if r["sharding"] == sharding and r["family"] == "none"]
        p50 = base[0]["p50_step_ms"] if base else None
        for family in FAMILIES:
            group = [r for r in ok if r["sharding"] == sharding and r["family"] == family]
            if not group:
                continue
            hits = [hit(r) for r in group]
            n = len(group)
            share = statistics.mean(
                r["shares"]["stagefrontier"][r["stages"].index(r["seeded"])] for r in group
            )
            out.append(
                [
                    title,
                    family + (" (control)" if family not in POSITIVE else ""),
                    f"{DELAY_MS / p50:.2f}" if p50 else "-",
                    n,
                    f"{sum(h.top1 for h in hits)}/{n}",
                    f"{sum(h.top2 for h in hits)}/{n}",
                    f"{sum(h.in_routing_set for h in hits)}/{n}",
                    f"{statistics.mean(h.routing_set_size for h in hits):.1f}",
                    f"{share:.2f}",
                ]
            )
    p50s = ", ".join(
        f"{SHARDINGS[r['sharding']]} {r['p50_step_ms']:.0f} ms" for r in ok if r["family"] == "none"
    )
    return [
        f"Delay/p50 uses the no-fault run's median step: {p50s}.",
        "",
        *hc.table(
            [
                "Configuration",
                "Fault",
                "Delay/p50",
                "Rows",
                "Top-1",
                "Top-2",
                "Cand. hit",
                "Cand. size",
                "Seeded share",
            ],
            out,
        ),
    ]


def error_lines(failed: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for r in failed:
        lines += [f"- {SHARDINGS[r['sharding']]} ({r['family']}, seed {r['seed']}):", "", "```"]
        lines += [*r["error"].splitlines(), "```", ""]
    return lines


def row_table(ok: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for r in ok:
        shares = dict(zip(r["stages"], r["shares"]["stagefrontier"], strict=True))
        top, share = hc.top_stage(shares)
        out.append(
            [
                r["sharding"],
                r["fault"] or "-",
                f"{r['p50_step_ms']:.0f}",
                f"{top} {share:.2f}",
                f"{shares[r['seeded']]:.2f}" if r["seeded"] else "-",
                ", ".join(x for x in r["labels"] if x != "frontier_accounting") or "-",
            ]
        )
    return hc.table(
        ["Sharding", "Fault", "p50 ms", "SF top-1 (share)", "Seeded share", "Window labels"], out
    )


def notes(ok: Sequence[dict[str, Any]], failed: Sequence[dict[str, Any]], quick: bool) -> list[str]:
    lines = ["- --quick smoke run: one seed, few steps."] if quick else []
    ranks = (ok or failed)[0]["ranks"]
    lines += [
        "- Paper: FSDP FULL_SHARD and ZeRO-1 on GPUs at 8/16/32 ranks, seeds 0-2, 180 ms"
        " injections, 90 sync-bounded rows; the host-local control was an optimizer delay"
        f" without a barrier. Here: {ranks} CPU ranks on 2 shared cores (the smallest paper"
        " scale, 8, does not fit the harness time budget with two wrappers and four fault"
        " kinds), Gloo for all collectives, FSDP2 (fully_shard, the successor of FSDP"
        " FULL_SHARD) instead of FSDP1, and callback/host as the no-barrier control.",
        "- Both wrappers ran on Gloo/CPU with torch as installed here"
        if not failed
        else "- Not every wrapper ran on Gloo/CPU here; the error messages are quoted above",
    ]
    lines[-1] += (
        "; ZeRO-1 keeps DDP's bucketed all-reduce in backward and adds a parameter broadcast in"
        " the optimizer step, FSDP2 moves communication into forward (all-gather) and backward"
        " (all-gather and reduce-scatter)."
    )
    for sharding, title in SHARDINGS.items():
        control = [r for r in ok if r["sharding"] == sharding and r["family"] == "callback_host"]
        routed = sum(hit(r).top2 for r in control)
        if not control:
            continue
        if routed and sharding == "zero1":
            lines.append(
                f"- {title}: the callback/host control routes to callbacks ({routed}/"
                f"{len(control)} top-2). Under ZeRO-1 the optimizer step right after the"
                " callbacks ends in a parameter broadcast from every rank, a synchronization"
                " point adjacent to the callback, so the host-only delay is exposed there as"
                " callback time: the control is not barrier-free under this wrapper (the paper's"
                " control was a host-local optimizer delay with no adjacent barrier)."
            )
        else:
            lines.append(
                f"- {title}: the callback/host control routes to callbacks in {routed}/"
                f"{len(control)} rows; with no synchronization right after the callback, the"
                " delay surfaces as the other ranks' wait in the next step's first collective"
                " (forward or backward), not as callback time."
            )
    return lines


if __name__ == "__main__":
    raise SystemExit(hc.harness_main("sharded", __doc__ or "", collect, render))
