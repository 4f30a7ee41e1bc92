"""A whole output folder (a demo's or a real job's) as one report: shares of StageFrontier next
to the five rank-local baselines on the same windows, routing, leaders, labels and reasons."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import baselines
from ..analysis.accounting import FloatArray
from ..analysis.routing import rank_order
from ..errors import StageFrontierError
from ..formats.packet import Packet, read_packet
from ..formats.records import WINDOWS_FILE, read_records
from ..sinks.core import lead_scope_text

METHOD_TITLES = {
    "stagefrontier": "frontier",
    "per_stage_max": "stage-max",
    "per_stage_mean": "stage-mean",
    "rank_spread": "spread",
    "slowest_rank": "slowest",
    "rank0_total": "rank0",
}


@dataclass(frozen=True)
class RunWindows:
    """The analyzed windows of one output folder, in (restart attempt, window) order."""

    folder: Path
    packets: list[Packet]
    records: list[dict[str, Any]]

    @property
    def stages(self) -> list[str]:
        return list(self.packets[0].stages) if self.packets else list(self.records[0]["stages"])


def load_run(folder: str | Path) -> RunWindows:
    """Read ``windows.jsonl`` and ``packets/`` from a folder; raises StageFrontierError if the
    folder does not exist or holds neither."""
    path = Path(folder)
    if not path.exists():
        raise StageFrontierError(f"{path} does not exist")
    if not path.is_dir():
        raise StageFrontierError(f"{path} is not a folder")
    packets = sorted(
        (read_packet(p) for p in (path / "packets").glob("window-*.json")),
        key=lambda packet: (packet.meta.get("attempt", 0), packet.meta.get("window", 0)),
    )
    jsonl = path / WINDOWS_FILE
    records = read_records(jsonl) if jsonl.exists() else []
    if not packets and not records:
        raise StageFrontierError(f"{path} holds no windows.jsonl and no packets/")
    return RunWindows(path, packets, records)


def method_shares(packet: Packet) -> dict[str, FloatArray]:
    """Stage shares of one window under StageFrontier and every baseline."""
    report = packet.report
    out = {"stagefrontier": np.array([report.shares[s] for s in report.stages])}
    for name, rule in baselines.BASELINES.items():
        out[name] = rule(packet.d)
    return out


def render_report(run: RunWindows) -> str:
    """The plain-text report printed by ``stagefrontier report`` and at the end of the demo."""
    lines = [_title(run), ""]
    if run.packets:
        lines += _comparison(run)
    else:
        lines.append(
            "(no packets/: baselines need the per-rank matrix; showing windows.jsonl only)"
        )
    lines += ["", *_windows_table(run), "", *_labels(run)]
    return "\n".join(lines)


def _reports(run: RunWindows) -> list[dict[str, Any]]:
    if run.packets:
        return [p.report.to_dict() | {"meta": p.meta} for p in run.packets]
    return run.records


def _title(run: RunWindows) -> str:
    reports = _reports(run)
    first, last = reports[0], reports[-1]
    steps = ""
    meta_first = first.get("meta", first)
    meta_last = last.get("meta", last)
    if "first_step" in meta_first and "last_step" in meta_last:
        steps = f", steps {meta_first['first_step']}-{meta_last['last_step']}"
    ranks = max(r["n_ranks"] for r in reports)
    return (
        f"StageFrontier report for {run.folder}: {len(reports)} window(s){steps}, {ranks} rank(s)"
    )


def _comparison(run: RunWindows) -> list[str]:
    per_window = [method_shares(p) for p in run.packets]
    stages = run.stages
    methods = list(METHOD_TITLES)
    mean = {m: np.mean([w[m] for w in per_window], axis=0) for m in methods}
    width = max(len("stage"), *(len(s) for s in stages))
    header = f"{'stage':<{width}}" + "".join(f"  {METHOD_TITLES[m]:>10}" for m in methods)
    lines = [
        "Stage shares, mean over windows: StageFrontier (frontier) vs rank-local baselines",
        header,
        "-" * len(header),
    ]
    for j, stage in enumerate(stages):
        lines.append(f"{stage:<{width}}" + "".join(f"  {mean[m][j]:>10.1%}" for m in methods))
    lines.append("")
    lines.append("top-1 stage per method (windows where it was top-1):")
    for m in methods:
        tops = Counter(stages[rank_order(w[m])[0]] for w in per_window)
        stage, count = tops.most_common(1)[0]
        lines.append(f"  {METHOD_TITLES[m]:<10} {stage} ({count}/{len(per_window)})")
    return lines


def _windows_table(run: RunWindows) -> list[str]:
    lines = ["Per window:", "  window  steps      ms/step  top-1 (share, leader)  labels"]
    for r in _reports(run):
        meta = r.get("meta", r)
        top = r["top1"]
        lead = r["leaders"].get(top) if top else None
        host = meta.get("hosts", {}).get(str(lead), "") if lead is not None else ""
        who = "-" if lead is None else f"rank {lead}" + (f"@{host}" if host else "")
        scope = lead_scope_text(meta.get("lead"))
        who += f"; {scope}" if scope else ""
        share = f"{r['shares'][top]:.0%}" if top and r["shares_defined"] else "n/a"
        flags = ",".join(x for x in r["labels"] if x != "frontier_accounting") or "-"
        span = f"{meta.get('first_step', '?')}-{meta.get('last_step', '?')}"
        ms = r["exposed_s"] / r["n_steps"] * 1e3
        index = str(meta.get("window", "?"))
        if meta.get("attempt"):  # a torchelastic restart counts windows from 0 again
            index = f"{meta['attempt']}/{index}"
        lines.append(f"  {index:>6}  {span:<9} {ms:>8.1f}  {top} ({share}, {who})  {flags}")
    return lines


def _labels(run: RunWindows) -> list[str]:
    reports = _reports(run)
    routes = Counter(" + ".join(r["routing_set"]) for r in reports)
    route, count = routes.most_common(1)[0]
    lines = [f"Routing set (most common, {count}/{len(reports)} windows): {route or '-'}"]
    co = Counter(" + ".join(r["co_critical_stages"]) for r in reports if r["co_critical_stages"])
    if co:
        stages, n = co.most_common(1)[0]
        lines.append(f"Co-critical stages (most common, {n}/{len(reports)} windows): {stages}")
    counts = Counter(label for r in reports for label in r["labels"])
    lines.append(
        "Labels: " + ", ".join(f"{label} {n}/{len(reports)}" for label, n in counts.items())
    )
    last = reports[-1]
    lines.append(f"Reasons (last window, {last.get('meta', last).get('window', '?')}):")
    for label in last["labels"]:
        for reason in last["reasons"].get(label, []):
            lines.append(f"  {label}: {reason}")
    return lines
