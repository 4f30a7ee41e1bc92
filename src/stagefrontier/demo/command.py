"""``stagefrontier demo``: run the CPU demo end to end and print the report."""

from __future__ import annotations

import time
from pathlib import Path

from ..render.plots import plot_shares_over_time, plot_worst_step
from ..render.run_folder import load_run
from ..render.text import run_report_text
from .faults import check_faults, parse_fault
from .launch import launch
from .train import DemoConfig


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def run_demo(
    *,
    ranks: int,
    steps: int,
    window: int,
    faults: list[str],
    seed: int,
    out: str,
) -> list[Path]:
    """Train, print one line per window as it completes, then the report; returns the files."""
    parsed = tuple(parse_fault(spec) for spec in faults)
    check_faults(parsed, ranks, cuda=cuda_available())
    config = DemoConfig(
        ranks=ranks, steps=steps, window=window, faults=parsed, seed=seed, out_dir=out
    )
    fault_text = ", ".join(str(f) for f in parsed) or "none"
    print(
        f"StageFrontier demo: {ranks} Gloo DDP ranks (spawned), {steps} steps, window {window}, "
        f"faults: {fault_text}\nTraining a small character-level transformer on CPU; one line "
        "per window as rank 0 analyzes it:",
        flush=True,
    )
    started = time.monotonic()
    launch(config)
    print(f"Training finished in {time.monotonic() - started:.1f} s.\n", flush=True)
    return write_report(out)


def write_report(out: str | Path) -> list[Path]:
    """Print the folder's report and write its two figures; returns every file produced."""
    run = load_run(out)
    print(run_report_text(run))
    folder = Path(out)
    files = [folder / "windows.jsonl", *sorted((folder / "packets").glob("*.json"))]
    if run.packets:
        files.append(plot_worst_step(run, folder / "frontier_worst_step.png"))
    files.append(plot_shares_over_time(run, folder / "shares_over_time.png"))
    packets = len(run.packets)
    print(
        f"\nFiles in {folder}: windows.jsonl, packets/ ({packets} packet(s)), "
        "frontier_worst_step.png, shares_over_time.png"
    )
    return files
