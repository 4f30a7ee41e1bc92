"""What the command line suggests works as printed: the demo's and the report's commands, the
demo's help, ``plot -o`` into a new folder, gates written as percentages, the report's columns
explained."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stagefrontier.cli import DEMO_EXAMPLES, main
from stagefrontier.formats.incident import new_incident
from stagefrontier.formats.run_folder import load_run
from stagefrontier.render.command import cli_command
from stagefrontier.render.incident import open_commands, write_incident
from stagefrontier.render.text import run_report_text
from stagefrontier.sinks import PacketSink
from stagefrontier.window.merged import analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall", "residual")
MS = 1_000_000


def _fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, on_path: bool) -> Path:
    """A virtual environment's bin folder holding ``python`` and the ``stagefrontier`` script."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "stagefrontier"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(bin_dir) if on_path else str(tmp_path / "empty"))
    return bin_dir


def test_an_environment_not_activated_gets_the_scripts_full_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = _fake_python(tmp_path / "a b", monkeypatch, on_path=False)
    assert cli_command() == shlex.quote(str(bin_dir / "stagefrontier"))
    assert "'" in cli_command()  # the space in the path is quoted for the shell


def test_an_activated_environment_gets_the_bare_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_python(tmp_path, monkeypatch, on_path=True)
    assert cli_command() == "stagefrontier"


def test_the_printed_command_runs_as_printed(tmp_path: Path) -> None:
    """This interpreter's suggestion, run through a shell whose PATH holds nothing of ours."""
    command = cli_command()
    done = subprocess.run(
        f"{command} --version",
        shell=True,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
        check=False,
    )
    assert done.returncode == 0, (command, done.stderr)
    assert done.stdout.startswith("stagefrontier ")


def _run_folder(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    windows = []
    for rank in range(3):
        durations = rng.integers(9 * MS, 11 * MS, size=(20, len(STAGES)))
        durations[:, -1] = 0
        if rank == 2:
            durations[:, 0] += 60 * MS
        windows.append(RankWindow(0, 0, 19, rank, STAGES, durations, durations.sum(axis=1)))
    PacketSink(folder).write(analyze_merged(merge_windows(windows, 3)))
    return folder


def test_the_report_and_the_incident_suggest_the_working_command(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path / "run dir")
    incident = new_incident("w00000", "window")
    trace = folder / "incidents" / "w00000" / "rank2.pt.trace.json.gz"
    incident.update(captured=True, steps=[3, 5], leader_rank=2, trace_files={"2": str(trace)})
    write_incident(trace.parent, incident)
    text = run_report_text(load_run(folder))
    assert f"`{cli_command()} incident {shlex.quote(str(folder))}`" in text
    commands = open_commands(incident)
    assert f"{cli_command()} incident {shlex.quote(str(trace.parent))}" in commands
    assert f"{cli_command()} analyze {shlex.quote(str(trace.parent))}" in "\n".join(commands)


def test_the_demo_help_shows_what_make_demo_runs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    demo_args = re.search(r"^DEMO_ARGS \?= (.*)$", makefile, re.MULTILINE)
    assert demo_args is not None
    line = next(x for x in DEMO_EXAMPLES.splitlines() if "make demo" in x)
    shown = line.split("#")[0].split()[2:]
    made = demo_args.group(1).split()
    flags = [a for a in made if a.startswith("--fault") or a == "--router"]
    assert [a for a in shown if a.startswith("--")] == flags
    assert made[made.index("--fault") + 1] == shown[shown.index("--fault") + 1]


def test_plot_writes_into_a_folder_that_does_not_exist_yet(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    folder = _run_folder(tmp_path / "run")
    target = tmp_path / "new" / "deeper" / "fig.png"
    assert main(["plot", str(folder), "-o", str(target)]) == 0
    assert target.is_file() and (target.parent / "fig_shares.png").is_file()


def test_the_report_explains_its_columns(tmp_path: Path) -> None:
    text = run_report_text(load_run(_run_folder(tmp_path)))
    header = next(x for x in text.splitlines() if x.startswith("stage "))
    legend = text.split("What each column is")[1].split("top-1 stage per method")[0]
    for column in ("frontier", "stage-max", "stage-mean", "spread", "slowest", "rank0"):
        assert column in header
        assert re.search(rf"^  {column} +\w", legend, re.MULTILINE), column
    assert "gain_threshold=0.1" not in text
