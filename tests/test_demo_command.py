"""The demo as a newcomer runs it: the fault grammar, then ``stagefrontier demo`` end to end (real
spawned Gloo DDP ranks, with the profiler router on as ``make demo`` runs it), and ``report``,
``plot``, ``analyze`` and ``incident`` on the folder it leaves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import stagefrontier as sf
from cli_support import console_script
from stagefrontier.cli import main
from stagefrontier.demo import FaultSpecError, parse_fault
from stagefrontier.demo.faults import FaultInjector, check_faults
from stagefrontier.formats.packet import read_packet
from stagefrontier.render.headline import HEADLINE_MAX

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_fault_specs_parse_with_their_options() -> None:
    fault = parse_fault("data@2:120ms")
    assert (fault.kind, fault.rank, fault.delay_s) == ("data", 2, pytest.approx(0.120))
    assert fault.active(2, 0) and not fault.active(1, 0)
    spike = parse_fault("callback_sync@0:60ms,every=5")
    assert [t for t in range(12) if spike.active(0, t)] == [0, 5, 10]
    window = parse_fault("forward@3:12.5ms,from=10,to=20")
    assert window.delay_s == pytest.approx(0.0125)
    assert not window.active(3, 9) and window.active(3, 10) and window.active(3, 19)
    assert not window.active(3, 20)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("disk@1:10ms", "disk"),
        ("data@1:10", "KIND@RANK:DELAYms"),
        ("data@x:10ms", "KIND@RANK:DELAYms"),
        ("data@1:10ms,every=0", "every"),
        ("data@1:10ms,sometimes=3", "sometimes"),
        ("data@1:10ms,from=5,to=2", "never fires: to=2 must be after from=5"),
        ("data@1:10ms,to=0", "never fires: to=0 must be after from=0"),
    ],
)
def test_bad_fault_specs_say_what_is_wrong(spec: str, match: str) -> None:
    with pytest.raises(FaultSpecError, match=match):
        parse_fault(spec)


def test_faults_the_demo_cannot_run_are_refused_with_the_reason() -> None:
    with pytest.raises(FaultSpecError, match="targets rank 4 but --ranks is 4"):
        check_faults((parse_fault("data@4:10ms"),), ranks=4, cuda=False)
    for cuda in (False, True):
        with pytest.raises(FaultSpecError, match="forward@RANK:DELAYms"):
            check_faults((parse_fault("forward_device@1:10ms"),), ranks=4, cuda=cuda)


def test_a_fault_that_starts_after_the_last_step_is_refused() -> None:
    fault = parse_fault("data@1:10ms,from=120")
    check_faults((fault,), ranks=2, cuda=False, steps=121)
    with pytest.raises(FaultSpecError, match="never fires: it starts at step 120 but the run's"):
        check_faults((fault,), ranks=2, cuda=False, steps=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ranks", "1000"], "--ranks 1000 is more than the demo runs (at most 32)"),
        (["--ranks", "0"], "--ranks, --steps and --window must be >= 1"),
        (["--window", "-3"], "--ranks, --steps and --window must be >= 1"),
        (["--fault", "data@1:10ms,from=5,to=2"], "never fires"),
        (["--steps", "50", "--fault", "comm@1:10ms,from=60"], "starts at step 60"),
    ],
)
def test_demo_settings_it_cannot_run_are_one_line_before_any_rank_starts(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["demo", *args, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert message in captured.err
    assert not out.exists()  # refused before the folder was made or a rank spawned


def test_unknown_fault_kinds_are_answered_with_the_kinds_the_demo_runs() -> None:
    with pytest.raises(FaultSpecError, match="choose one of data, forward") as err:
        parse_fault("disk@1:10ms")
    assert "forward_device" not in str(err.value)


@dataclass(frozen=True)
class DemoFolder:
    out: Path
    stdout: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoFolder:
    """One real short demo run (2 spawned Gloo ranks, a data stall on rank 1, the router on). The
    stall is 300 ms, large against what a loaded machine adds to a step, so rank 1 leads every
    window whatever runs beside the suite (at 120 ms, one window at load 20 had no leader)."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    args = ["--ranks", "2", "--steps", "24", "--window", "8", "--fault", "data@1:300ms"]
    return DemoFolder(out, _cli("demo", *args, "--router", "--out", str(out), timeout=300))


def test_demo_then_report_and_plot_on_its_folder(demo: DemoFolder, tmp_path: Path) -> None:
    out = demo.out
    window_lines = [line for line in demo.stdout.splitlines() if " | exposed " in line]
    assert len(window_lines) == 3, demo.stdout  # one progress line per window while it trains
    assert all("top data.next_wait" in line and "led by rank 1" in line for line in window_lines)
    # Each window's line is its headline, short enough to scan (the details are at DEBUG).
    assert all(len(line.strip()) <= HEADLINE_MAX for line in window_lines), window_lines
    assert all("Next: profile " in line or "| same as window " in line for line in window_lines)
    assert "StageFrontier report for" in demo.stdout and "Routing set" in demo.stdout

    assert len((out / "windows.jsonl").read_text().splitlines()) == 3
    assert len(list((out / "packets").glob("window-*.json"))) == 3
    for figure in ("frontier_worst_step.png", "shares_over_time.png"):
        data = (out / figure).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, figure

    report = _cli("report", str(out))
    assert "3 window(s), steps 0-23, 2 rank(s)" in report
    assert report.count("data.next_wait (") >= 3  # the per-window table's top-1 column

    figure = tmp_path / "again.png"
    _cli("plot", str(out), "-o", str(figure))
    assert figure.read_bytes().startswith(PNG_MAGIC)
    assert (tmp_path / "again_shares.png").read_bytes().startswith(PNG_MAGIC)


def test_the_demo_ends_with_the_router_incident(demo: DemoFolder) -> None:
    """Stage, rank, verdict and the top op-diff line close the demo; the folder's incident reads
    back through ``report`` and ``incident``, and its page embeds both figures."""
    assert "Profiler router incident w00000: stage data.next_wait, suspect rank 1" in demo.stdout
    assert "confirmed" in demo.stdout and "top op diff: inside data.next_wait, `" in demo.stdout
    # the sampled stack: the function, and the line it was at (the builtin it called)
    first_line = FaultInjector.delay.__code__.co_firstlineno
    assert f"faults.py({first_line}): delay › <line " in demo.stdout
    assert "time.sleep(delay_s)>` takes" in demo.stdout
    page = (demo.out / "incidents" / "w00000" / "incident.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "<table>" in page
    incident = json.loads((demo.out / "incidents" / "w00000" / "incident.json").read_text())
    opened, written = incident["wall_clock"]["start"], incident["wall_clock"]["end"]
    assert opened <= written and "<b>opened, last written</b>" in page
    records = [json.loads(line) for line in (demo.out / "windows.jsonl").read_text().splitlines()]
    assert records[0]["wall_clock"]["start"] <= opened <= records[-1]["wall_clock"]["end"]
    report = _cli("report", str(demo.out))
    assert "Incidents (1;" in report and "incident w00000 | data.next_wait on rank 1" in report
    incident = _cli("incident", str(demo.out))
    assert incident.startswith("# Incident w00000") and "ui.perfetto.dev" in incident


def test_the_summary_names_every_file_and_packets_share_the_jsonl_mode(demo: DemoFolder) -> None:
    summary = demo.stdout[demo.stdout.index("\nFiles in ") :]
    assert summary.startswith(
        f"\nFiles in {demo.out}: windows.jsonl, packets/ (3), frontier_worst_step.png, "
        "shares_over_time.png, incidents/ (1)\nThe demo's own per-rank records there: "
    )
    for entry in demo.out.iterdir():
        name = re.sub(r"\d+", "N", entry.name) + ("/" if entry.is_dir() else "")
        assert name in summary, (name, summary)
    modes = {p.stat().st_mode for p in [demo.out / "windows.jsonl", *demo.out.glob("packets/*")]}
    assert len(modes) == 1


def test_analyze_points_from_a_folder_to_report_or_one_window(
    demo: DemoFolder, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in (demo.out, demo.out / "packets"):
        assert main(["analyze", str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1
        assert f"stagefrontier report {demo.out}" in err and "--window N" in err
    assert main(["analyze", str(demo.out / "windows.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "3 window(s) (0, 1, 2)" in err and "--window N" in err
    assert main(["analyze", str(demo.out), "--window", "7"]) == 2
    assert "no window 7; it holds windows 0, 1, 2" in capsys.readouterr().err


def test_analyze_one_window_of_a_folder_its_packets_or_its_jsonl(
    demo: DemoFolder, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = read_packet(demo.out / "packets" / "window-000001.json").report
    for path in (demo.out, demo.out / "packets", demo.out / "windows.jsonl"):
        assert main(["analyze", str(path), "--window", "1", "--json"]) == 0
        assert sf.WindowReport.from_json(capsys.readouterr().out) == stored, path
    assert main(["analyze", str(demo.out / "windows.jsonl"), "--window", "1"]) == 0
    meta = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("meta:"))
    assert "window=1, first_step=8, last_step=15" in meta and "ranks=0-1" in meta
    assert "pids" not in meta and "{" not in meta  # per-rank tables stay out of the line
    assert "the stored report" in meta


def test_report_on_a_missing_folder_and_demo_help(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*console_script(), "report", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.strip().endswith("nope does not exist")
    help_text = _cli("demo", "--help")
    assert "(default: 4)" in help_text and "(default: stagefrontier-demo)" in help_text
    assert "examples:\n  stagefrontier demo --fault data@2:120ms" in help_text
    assert "forward_device" not in help_text


def _cli(*args: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        [*console_script(), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_a_window_repeated_by_a_restart_is_named_with_its_attempt(
    demo: DemoFolder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    restarted = tmp_path / "restarted"
    shutil.copytree(demo.out / "packets", restarted / "packets")
    shutil.copy(
        demo.out / "packets" / "window-000002.json",
        restarted / "packets" / "window-000001.attempt-1.json",
    )
    assert main(["analyze", str(restarted), "--window", "1"]) == 2
    assert "name one as ATTEMPT/1" in capsys.readouterr().err
    assert main(["analyze", str(restarted), "--window", "1/1", "--json"]) == 0
    moved = read_packet(demo.out / "packets" / "window-000002.json").report
    assert sf.WindowReport.from_json(capsys.readouterr().out) == moved


def test_a_fault_on_every_rank() -> None:
    fault = parse_fault("data@all:30ms,from=60")
    assert fault.rank is None and str(fault) == "data@all:30ms,from=60"
    assert all(fault.active(r, 60) for r in range(8)) and not fault.active(3, 59)
    check_faults((fault,), ranks=2, cuda=False)  # no rank to be out of range
