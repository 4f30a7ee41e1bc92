"""``report`` and ``plot`` on a folder with a damaged summary packet, and on more packets than
one window may hold (issue 23, items 6 and 16; issue 38)."""

from __future__ import annotations

from pathlib import Path

import pytest

import stagefrontier as sf
from stagefrontier.formats.limits import LIMITS
from stagefrontier.formats.packet import read_packet
from stagefrontier.formats.summary_packet import SummaryPacket, write_summary_packet
from test_cli_bad_inputs import run, run_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_folder(tmp_path_factory.mktemp("run") / "run", steps=9)  # three windows


def _hierarchical_copy(folder: Path, out: Path) -> Path:
    """The run as hierarchical collection writes it: ``windows.jsonl`` and a summary packet per
    window (the node summaries of one node holding every rank), no per-rank packets."""
    (out / "packets").mkdir(parents=True)
    (out / "windows.jsonl").write_bytes((folder / "windows.jsonl").read_bytes())
    for path in sorted((folder / "packets").glob("window-*.json")):
        packet = read_packet(path)
        summary = sf.summarize(packet.d, range(packet.d.shape[1]), packet.stages)
        report = sf.analyze_summary(summary)  # default gates: a summary's own gain baseline
        name = path.name.replace("window-", "summary-")
        write_summary_packet(
            out / "packets" / name, SummaryPacket.of_summary(summary, report, meta=packet.meta)
        )
    return out


def test_report_and_plot_name_a_damaged_summary_packet_and_go_on(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = _hierarchical_copy(folder, tmp_path / "hier")
    cut = out_dir / "packets" / "summary-000001.json"
    cut.write_bytes(cut.read_bytes()[:-10])
    empty = out_dir / "packets" / "summary-000002.json"
    empty.write_bytes(b"")
    code, out, err = run(["report", str(out_dir)], capsys)
    assert code == 0, err
    assert "3 window(s)" in out  # windows.jsonl still reports every window
    lines = err.splitlines()
    assert all(line.startswith("stagefrontier: warning: skipped ") for line in lines), err
    assert len(lines) == 2, err
    assert sum(str(cut) in line for line in lines) == 1
    assert sum(str(empty) in line for line in lines) == 1
    pytest.importorskip("matplotlib")
    code, out, err = run(["plot", str(out_dir)], capsys)
    assert code == 0, err
    assert sum(str(cut) in line for line in err.splitlines()) == 1
    assert (out_dir / "shares_over_time.png").exists()


def test_report_and_plot_read_more_packets_than_a_window_may_hold(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cell bound is one window's (``STAGEFRONTIER_MAX_CELLS``), not the run's: ``report``
    and ``plot`` read the packets one at a time and keep the worst step's packet only, so a
    folder whose packets hold more cells in all than the bound is read whole (it used to be
    refused, "set STAGEFRONTIER_MAX_CELLS to raise it")."""
    sizes = [read_packet(p).d.size for p in (folder / "packets").glob("window-*.json")]
    assert len(sizes) == 3
    monkeypatch.setenv(LIMITS["cells"].env, str(max(sizes)))  # each fits; all three do not
    code, out, err = run(["report", str(folder)], capsys)
    assert code == 0 and not err, err
    assert "3 window(s)" in out
    pytest.importorskip("matplotlib")
    code, out, err = run(["plot", str(folder)], capsys)
    assert code == 0 and not err, err
    assert (folder / "frontier_worst_step.png").exists()
