"""The demo as a newcomer runs it: the fault grammar, then ``stagefrontier demo`` end to end (real
spawned Gloo DDP ranks), and ``report`` and ``plot`` on the folder it leaves."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stagefrontier.demo import FaultSpecError, parse_fault
from stagefrontier.demo.faults import check_faults
from test_cli import console_script

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


def test_demo_then_report_and_plot_on_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    args = ["--ranks", "2", "--steps", "24", "--window", "8", "--fault", "data@1:120ms"]
    demo = _cli("demo", *args, "--out", str(out), timeout=300)
    window_lines = [line for line in demo.splitlines() if " | exposed " in line]
    assert len(window_lines) == 3, demo  # one progress line per window while it trains
    assert all("top data.next_wait" in line and "led by rank 1" in line for line in window_lines)
    assert "StageFrontier report for" in demo and "Routing set" in demo

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


def _cli(*args: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        [*console_script(), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout
