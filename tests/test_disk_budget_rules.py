"""Which packets a compaction under the disk budget keeps and what it says
(``sinks.disk_budget``), on windows analyzed in this process and written by the real sinks."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stagefrontier.analysis.regression import RegressionCheck
from stagefrontier.formats.compacted import listed_windows
from stagefrontier.formats.run_folder import load_run
from stagefrontier.sinks import JsonlSink, PacketSink, Sink
from stagefrontier.sinks.disk_budget import (
    FIRST_SAMPLE,
    LOW_WATER,
    RECENT,
    folder_bytes,
)
from stagefrontier.sinks.output_folder import shared_folder
from stagefrontier.sinks.record_compaction import compact_records
from stagefrontier.window.merged import AnalyzedWindow, analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow
from test_cli_bad_inputs import run as cli_run

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "residual")
MS = 1_000_000
STEPS = 10
WINDOWS = 40
SLOW = (15, 27)
"""The regressions the check flags: window 15's forward stage takes five times as long (a stage
regression), window 27's every stage twice as long (a slowdown of the whole job)."""


def _windows() -> list[AnalyzedWindow]:
    """``WINDOWS`` 2-rank windows of ~20 ms steps, each checked by a real regression check."""
    rng = np.random.default_rng(0)
    check = RegressionCheck()
    out = []
    for index in range(WINDOWS):
        ranks = []
        for rank in range(2):
            durations = rng.integers(9 * MS, 11 * MS, size=(STEPS, len(STAGES)))
            durations[:, -1] = 0
            if index == SLOW[0]:
                durations[:, 1] *= 5
            elif index == SLOW[1]:
                durations *= 2
            first = index * STEPS
            ranks.append(
                RankWindow(
                    index, first, first + STEPS - 1, rank, STAGES, durations, durations.sum(1)
                )
            )
        analyzed = analyze_merged(merge_windows(ranks, 2))
        found = check.check(index, analyzed.d, analyzed.report.stages)
        out.append(dataclasses.replace(analyzed, regression=found))
    return out


def _write(out: Path, windows: list[AnalyzedWindow], budget: int) -> None:
    sinks: list[Sink] = [JsonlSink(out, budget), PacketSink(out, budget)]
    for window in windows:
        for sink in sinks:
            sink.write(window)
    for sink in sinks:
        sink.close()


def _compactions(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "compacted.jsonl").read_text().splitlines()]


def _held(out: Path) -> set[int]:
    return {int(p.name[len("window-") :][:6]) for p in (out / "packets").iterdir()}


def test_a_compaction_keeps_the_flagged_the_sample_and_the_newest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    windows = _windows()
    assert [
        (w.record["window"], w.record["regression"]["kind"]) for w in windows if w.regression
    ] == [
        (SLOW[0], "stage"),
        (SLOW[1], "whole_job"),
    ]
    whole = tmp_path / "whole"
    _write(whole, windows, 1 << 30)
    packets = folder_bytes(whole / "packets")
    budget = folder_bytes(whole) - packets // 2  # half the packets must go
    caplog.set_level(logging.INFO, logger="stagefrontier")
    out = tmp_path / "run"
    _write(out, windows, budget)
    assert folder_bytes(out) <= budget
    held = _held(out)
    newest = set(range(WINDOWS - RECENT, WINDOWS))
    sample = {w for w in range(WINDOWS) if w % FIRST_SAMPLE == 0}
    assert set(SLOW) | newest | sample <= held < set(range(WINDOWS))
    dropped = set(range(WINDOWS)) - held
    compactions = _compactions(out)
    listed = [w for c in compactions for _, w in listed_windows(str(c["windows"]))]
    assert sorted(listed) == sorted(dropped)
    assert not any(c["flagged_windows"] or c["over_budget"] for c in compactions)
    said = [r for r in caplog.records if "disk budget" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO  # the first compaction only
    assert len((out / "windows.jsonl").read_text().splitlines()) == WINDOWS  # every record


def test_a_whole_job_slowdown_gives_up_its_packet_before_a_stage_regression(
    tmp_path: Path,
) -> None:
    windows = _windows()
    whole = tmp_path / "whole"
    _write(whole, windows, 1 << 30)
    size = {
        int(p.name[len("window-") :][:6]): p.stat().st_size for p in (whole / "packets").iterdir()
    }
    # The compaction runs as the last window's record is written, before its packet: it keeps
    # the newest packets before that one, cuts the records before the newest 8, and leaves room
    # for one flagged packet, not for two.
    last = WINDOWS - 1
    kept = set(range(last - RECENT, last)) | {SLOW[0]}
    target = folder_bytes(whole) - sum(size[w] for w in size if w not in kept | {SLOW[1]})
    target -= size[SLOW[1]] // 2 + _cut_bytes(whole, tmp_path / "cut", (0, WINDOWS - RECENT))
    out = tmp_path / "run"
    sinks: list[Sink] = [JsonlSink(out, 1 << 30), PacketSink(out)]
    for window in windows:
        if window is windows[-1]:
            shared_folder(out, int(target / LOW_WATER))  # the budget shrinks: one compaction
        for sink in sinks:
            sink.write(window)
    held = _held(out)
    assert SLOW[0] in held and SLOW[1] not in held and held == kept | {last}
    assert _compactions(out)[0]["flagged_windows"] == f"0/{SLOW[1]}"


def test_old_healthy_records_are_cut_and_the_writer_goes_on_in_the_new_file(
    tmp_path: Path,
) -> None:
    windows = _windows()
    whole = tmp_path / "whole"
    _write(whole, windows, 1 << 30)
    budget = (whole / "windows.jsonl").stat().st_size  # the whole records alone fill it
    out = tmp_path / "run"
    _write(out, windows, budget)
    assert folder_bytes(out) <= budget
    records = [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines()]
    assert [r["window"] for r in records] == list(range(WINDOWS))  # none lost, in order
    cut = {r["window"] for r in records if r.get("compacted")}
    listed = {w for c in _compactions(out) for _, w in listed_windows(str(c["records"]))}
    assert cut and cut == listed
    assert not cut & (set(SLOW) | set(range(WINDOWS - RECENT, WINDOWS)))  # flagged, newest
    run = load_run(out)
    assert run.summarized and run.tallies.cut == len(cut) and run.count == WINDOWS
    assert not {meta["window"] for _, meta in run.windows} & cut  # never shown in full


def _cut_bytes(folder: Path, scratch: Path, newest: tuple[int, int]) -> int:
    """The bytes the records of ``folder`` lose when those before ``newest`` are cut down to
    their summary (on a copy)."""
    scratch.mkdir()
    copy = scratch / "windows.jsonl"
    copy.write_bytes((folder / "windows.jsonl").read_bytes())
    cut, freed = compact_records(copy, set(), newest)
    assert cut
    return freed


def test_a_folder_its_records_hold_over_budget_is_said_once_and_keeps_every_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(tmp_path, _windows(), 1)
    compactions = _compactions(tmp_path)
    assert compactions[-1]["over_budget"] is True
    assert _held(tmp_path) == set(range(WINDOWS - RECENT, WINDOWS))  # the newest only
    flagged = [w for c in compactions for _, w in listed_windows(str(c["flagged_windows"]))]
    assert flagged == list(SLOW)  # deleted last (as they left the newest), each listed
    over = [r for r in caplog.records if "over its disk budget" in r.getMessage()]
    assert len(over) == 1 and over[0].levelno == logging.WARNING
    assert len((tmp_path / "windows.jsonl").read_text().splitlines()) == WINDOWS


def test_a_compaction_that_fails_is_said_once_and_the_writes_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "packets" / "summary-000003.json"  # a folder: unlink fails
    blocker.mkdir(parents=True)
    (blocker / "filler").write_bytes(b"x" * 100_000)
    _write(tmp_path, _windows(), 50_000)
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING
    assert "deleting a packet failed" in failed[0].getMessage()
    assert len((tmp_path / "windows.jsonl").read_text().splitlines()) == WINDOWS
    assert blocker.is_dir()  # the rest of the compaction went on, each packet it deleted listed
    deleted = [
        w
        for c in _compactions(tmp_path)
        for key in ("windows", "flagged_windows")
        for _, w in listed_windows(str(c[key]))
    ]
    written = {p.name for p in (tmp_path / "packets").iterdir()} - {blocker.name}
    assert sorted(deleted) == sorted(set(range(WINDOWS)) - {int(n[7:13]) for n in written})


_FAILING_REWRITE = """
import json, logging, resource, signal, sys
from pathlib import Path
from stagefrontier.sinks.disk_budget import DiskBudget

out = Path(sys.argv[1])
handler = logging.StreamHandler(sys.stdout)
handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
logging.getLogger("stagefrontier").addHandler(handler)
logging.getLogger("stagefrontier").setLevel(logging.WARNING)
records = [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines()]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past the limit: EFBIG, as a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (16_384, 16_384))
budget = DiskBudget(out, 50_000)
for record in records:
    budget.written(record, out / "windows.jsonl", 0)
"""


def test_a_records_rewrite_that_fails_still_lists_the_deleted_packets_and_is_said_once(
    tmp_path: Path,
) -> None:
    _write(tmp_path, _windows(), 1 << 30)
    records = (tmp_path / "windows.jsonl").read_bytes()
    assert len(records) > 16_384  # its copy cannot be written under the file-size limit
    packets = _held(tmp_path)
    script = tmp_path / "child.py"
    script.write_text(_FAILING_REWRITE)
    child = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    failed = [line for line in child.stdout.splitlines() if "failed" in line]
    assert len(failed) == 1 and failed[0].startswith("WARNING"), child.stdout
    assert "windows.jsonl" in failed[0] and "File too large" in failed[0]
    assert (tmp_path / "windows.jsonl").read_bytes() == records  # left whole
    compactions = _compactions(tmp_path)
    assert len(compactions) == 1  # not walked again at every later window
    assert compactions[0]["records_cut"] == 0 and compactions[0]["over_budget"] is True
    deleted = {
        w
        for key in ("windows", "flagged_windows")
        for _, w in listed_windows(str(compactions[0][key]))
    }
    assert deleted and deleted == packets - _held(tmp_path)
    assert not list(tmp_path.glob(".windows.jsonl.*.tmp"))


def test_an_interrupted_records_rewrite_leaves_no_copy_that_counts_against_the_budget(
    tmp_path: Path,
) -> None:
    leftover = tmp_path / ".windows.jsonl.0123456789ab.tmp"  # a copy a killed rewrite left
    leftover.write_bytes(b"{}\n" * 400_000)
    windows = _windows()[:3]
    _write(tmp_path, windows, 1_000_000)  # the three windows fit; the copy alone would not
    assert not leftover.exists()
    assert not (tmp_path / "compacted.jsonl").exists()
    assert _held(tmp_path) == {0, 1, 2}


def test_a_short_run_whose_cut_records_compacted_jsonl_does_not_list_is_still_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    windows = _windows()
    whole = tmp_path / "whole"
    _write(whole, windows, 1 << 30)
    out = tmp_path / "run"
    _write(out, windows, (whole / "windows.jsonl").stat().st_size)
    records = [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines()]
    cut = {r["window"] for r in records if r.get("compacted")}
    assert cut
    (out / "compacted.jsonl").unlink()  # lost, or written by a rewrite it does not list
    run = load_run(out)
    assert run.tallies.cut == len(cut) and run.count == WINDOWS
    assert {meta["window"] for _, meta in run.windows} == set(range(WINDOWS)) - cut
    code, _, err = cli_run(["report", str(out)], capsys)
    assert code == 0, err
    assert f"{len(cut)} window(s) of windows.jsonl keep only their summary" in err
