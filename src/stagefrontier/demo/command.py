"""``stagefrontier demo``: run the CPU demo end to end and print the report."""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import DemoSettingsError
from ..formats.incident import list_incidents
from ..formats.run_folder import load_run
from ..render.command import cli_command
from ..render.incident import top_op_line, verdict
from ..render.plots import plot_shares_over_time, plot_worst_step
from ..render.text import run_report_text
from .faults import check_faults, parse_fault
from .launch import launch
from .train import DemoConfig


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def run_demo(config: DemoConfig, faults: Sequence[str] = ()) -> list[Path]:
    """Train, print one line per window as it completes, then the report (and, with the
    profiler router on, its incidents); returns the files. ``faults``: the fault specs to
    inject (parsed here, replacing ``config.faults``).

    Raises:
        DemoSettingsError: ``ranks``, ``steps`` or ``window`` out of range.
        FaultSpecError: a fault that does not parse, or could not fire in this run.
    """
    ranks, steps, window, router = config.ranks, config.steps, config.window, config.router
    check_settings(ranks=ranks, steps=steps, window=window)
    parsed = tuple(parse_fault(spec) for spec in faults)
    check_faults(parsed, ranks, cuda=cuda_available(), steps=steps)
    config = replace(config, faults=parsed)
    fault_text = ", ".join(str(f) for f in parsed) or "none"
    print(
        f"StageFrontier demo: {ranks} Gloo DDP ranks (spawned), {steps} steps, window {window}, "
        f"faults: {fault_text}, profiler router {'on' if router else 'off'}\nTraining a small "
        "character-level transformer on CPU; one line per window as rank 0 analyzes it:",
        flush=True,
    )
    started = time.monotonic()
    launch(config)
    print(f"Training finished in {time.monotonic() - started:.1f} s.\n", flush=True)
    return write_report(config.out_dir)


MAX_RANKS = 32
"""The most ranks the demo spawns: each is a whole training process (its own Python, torch and
model copy) on this one machine, and Gloo connects every pair of them."""


def check_settings(*, ranks: int, steps: int, window: int) -> None:
    """Raise DemoSettingsError, in the command line's words, for a setting the demo cannot run."""
    if ranks < 1 or steps < 1 or window < 1:
        raise DemoSettingsError("--ranks, --steps and --window must be >= 1")
    if ranks > MAX_RANKS:
        raise DemoSettingsError(
            f"--ranks {ranks} is more than the demo runs (at most {MAX_RANKS}): each rank is a "
            "training process on this machine; profile a real job of that size instead"
        )


def write_report(out: str | Path) -> list[Path]:
    """Print the folder's report and write its two figures; returns every file in the folder."""
    run = load_run(out)
    print(run_report_text(run))
    folder = Path(out)
    if run.worst is not None:
        plot_worst_step(run, folder / "frontier_worst_step.png")
    plot_shares_over_time(run, folder / "shares_over_time.png")
    outputs = [folder / name for name in OUTPUTS if (folder / name).exists()]
    own = sorted(p for p in folder.iterdir() if p not in outputs)
    print(f"\nFiles in {folder}: {listing(outputs)}")
    if own:
        print(f"The demo's own per-rank records there: {listing(own)}")
    for incident in list_incidents(folder):
        print(incident_summary(incident, folder))
    return sorted(p for p in folder.rglob("*") if p.is_file())


OUTPUTS = (
    "windows.jsonl",
    "packets",
    "frontier_worst_step.png",
    "shares_over_time.png",
    "incidents",
)
"""What StageFrontier and its report write, in the order the summary names them."""


def listing(paths: list[Path]) -> str:
    """The entries named, numbered names collapsed (``losses-rankN.json (4)``), a folder with
    its file count (``packets/ (6)``)."""
    counts: dict[str, int] = {}
    for path in paths:
        if path.is_dir():
            name, count = path.name + "/", sum(1 for _ in path.iterdir())
        else:
            name, count = re.sub(r"\d+", "N", path.name), 1
        counts[name] = counts.get(name, 0) + count
    return ", ".join(
        f"{name} ({n})" if n > 1 or name.endswith("/") else name for name, n in counts.items()
    )


def incident_summary(incident: dict[str, Any], folder: Path) -> str:
    """The demo's closing lines for one incident: stage, rank, verdict, the top op-diff line."""
    lines = [
        f"\nProfiler router incident {incident['id']}: stage {incident['stage']}, suspect rank "
        f"{incident['leader_rank']} (reference rank {incident['reference_rank']}), "
        f"{verdict(incident)}"
        + (
            f" (largest share difference {incident['max_share_diff']:.3f})"
            if incident["max_share_diff"] is not None
            else ""
        )
    ]
    top = top_op_line(incident)
    lines.append(f"  top op diff: {top}" if top else "  no op diff")
    if not incident["captured"]:
        lines += [f"  {reason}" for reason in incident["reasons"][-2:]]
    lines.append(
        f"  open {folder / 'incidents' / incident['id'] / 'incident.html'}, or run "
        f"`{cli_command()} incident {shlex.quote(str(folder))}`"
    )
    return "\n".join(lines)
