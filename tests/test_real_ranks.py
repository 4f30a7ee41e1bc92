"""Rank numbers, not column positions: every reader (Kineto, HTA, Nsight, packets) carries the
ranks its input names through to the leaders, the reasons, the verdict and the CLI's report, for
ranks that are not 0..R-1 (2 and 0; 5 and 9)."""

from __future__ import annotations

import importlib
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier.cli import main
from stagefrontier.errors import DurationsError
from stagefrontier.load import load_window
from stagefrontier.reducers import reduce_nsys
from stagefrontier.render.text import window_report_text
from stagefrontier.sinks import PacketSink
from stagefrontier.window.merged import analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow
from test_reducers_nsys import Report

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall", "residual")
DATA = STAGES[0]
MS = 1_000_000


def _slow_window(slow_column: int, n_ranks: int, seed: int = 0) -> np.ndarray:
    """30 steps of ~10 ms per stage; one column waits 60 ms more in data every step."""
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.009, 0.011, size=(30, n_ranks, len(STAGES)))
    d[:, :, -1] = 0.0
    d[:, slow_column, 0] += 0.06
    return d


# --- the analyzer ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rank_ids", [[2, 0], [5, 9], [9, 5]])
def test_the_analyzer_names_the_rank_of_the_column(rank_ids: list[int]) -> None:
    report = sf.analyze(_slow_window(0, 2), STAGES, rank_ids=rank_ids)
    slow = rank_ids[0]
    assert report.leaders[DATA] == slow
    assert report.localization[DATA].leading_ranks == [slow]
    text = window_report_text(report)
    assert f"rank {slow}" in text and "rank 1" not in text


def test_without_rank_ids_columns_are_ranks_0_to_r() -> None:
    assert sf.analyze(_slow_window(1, 3), STAGES).leaders[DATA] == 1


@pytest.mark.parametrize("bad", [[0], [1, 1], [-1, 2], [0.5, 1]])
def test_bad_rank_ids_are_refused(bad: list[float]) -> None:
    with pytest.raises(DurationsError, match="rank"):
        sf.analyze(_slow_window(0, 2), STAGES, rank_ids=bad)


# --- packets (the live path writes them) ----------------------------------------------------------


def _rank_windows(ranks: tuple[int, ...], slow: int) -> list[RankWindow]:
    rng = np.random.default_rng(1)
    out = []
    for rank in ranks:
        durations = rng.integers(9 * MS, 11 * MS, size=(30, len(STAGES)))
        durations[:, -1] = 0
        if rank == slow:
            durations[:, 0] += 60 * MS
        out.append(
            RankWindow(0, 0, 29, rank, STAGES, durations, durations.sum(axis=1), pid=100 + rank)
        )
    return out


@pytest.mark.parametrize(("present", "slow"), [((0, 2), 2), ((5, 9), 9)])
def test_a_window_of_some_ranks_names_them_live_and_from_its_packet(
    tmp_path: Path, present: tuple[int, int], slow: int, capsys: pytest.CaptureFixture[str]
) -> None:
    analyzed = analyze_merged(merge_windows(_rank_windows(present, slow), 10))
    assert analyzed.report.leaders[DATA] == slow
    assert analyzed.record["lead"]["ranks"] == [slow]
    PacketSink(tmp_path).write(analyzed)
    loaded = load_window(tmp_path, window=0)
    assert loaded.report.leaders[DATA] == slow
    assert loaded.stored_report == loaded.report
    assert main(["analyze", str(tmp_path), "--window", "0"]) == 0
    out, err = capsys.readouterr()
    assert f"on rank {slow}" in out and "differs" not in err


# --- Nsight Systems exports -----------------------------------------------------------------------


def _nsys_ranks(folder: Path, ranks: tuple[int, int], slow: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        report = Report(pid=100 + rank, tid=100 + rank)
        report.steps(range(10, 16), extra_ms={"data.next_wait": 50.0} if rank == slow else None)
        report.write(folder / f"report_rank{rank}.sqlite")


@pytest.mark.parametrize(("ranks", "slow"), [((2, 0), 2), ((5, 9), 9), ((5, 9), 5)])
def test_nsight_reports_name_their_ranks(
    tmp_path: Path, ranks: tuple[int, int], slow: int, capsys: pytest.CaptureFixture[str]
) -> None:
    _nsys_ranks(tmp_path, ranks, slow)
    reduced = reduce_nsys(tmp_path)
    assert reduced.ranks == tuple(sorted(ranks))
    assert reduced.analyze().leaders["data.next_wait"] == slow
    assert main(["analyze", str(tmp_path)]) == 0
    assert f"on rank {slow}." in capsys.readouterr().out


# --- PyTorch Profiler traces, read directly and through HTA ---------------------------------------

try:
    importlib.import_module("hta.common.trace")
    HTA_MISSING = ""
except ImportError as exc:
    HTA_MISSING = f"HolisticTraceAnalysis is not installed ({exc}); pip install '.[hta]'"


@pytest.fixture(scope="module")
def traces() -> dict[str, Path]:
    """A slow and a fast single-process trace (the slow one sleeps in its data stage)."""
    from trace_support import trace

    return {"slow": trace("slow-data-4-steps.json"), "fast": trace("single-4-steps.json")}


def _as_ranks(traces: dict[str, Path], folder: Path, slow: int, fast: int, world_size: int) -> Path:
    """The two traces written as ranks ``slow`` and ``fast`` of a job of ``world_size`` ranks
    (their ``distributedInfo``, as torch writes it when the process group is up)."""
    from trace_support import load_events, write_events

    folder.mkdir(parents=True, exist_ok=True)
    for which, rank in (("slow", slow), ("fast", fast)):
        header, events = load_events(traces[which])
        header["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": world_size}
        write_events(folder / f"rank{rank}.pt.trace.json", header, events)
    return folder


@pytest.mark.parametrize(("slow", "fast"), [(2, 0), (9, 5), (5, 9)])
@pytest.mark.parametrize("fmt", ["kineto", "hta"])
def test_profiler_traces_name_their_ranks(
    traces: dict[str, Path],
    tmp_path: Path,
    slow: int,
    fast: int,
    fmt: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if fmt == "hta" and HTA_MISSING:
        pytest.skip(HTA_MISSING)
    folder = _as_ranks(traces, tmp_path / "job", slow, fast, world_size=10)
    code = main(["analyze", str(folder), "--allow-missing-ranks", "--format", fmt, "--json"])
    report = sf.WindowReport.from_json(capsys.readouterr().out)
    assert code == 0 and report.top1 == "data.next_wait"
    assert report.leaders["data.next_wait"] == slow
    assert main(["analyze", str(folder), "--allow-missing-ranks", "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert f"on rank {slow}." in out


def test_the_single_trace_an_incident_suggests_names_its_rank(
    traces: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _as_ranks(traces, tmp_path / "job", slow=2, fast=0, world_size=4)
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(folder / "rank2.pt.trace.json", one)
    assert main(["analyze", str(one / "rank2.pt.trace.json"), "--allow-missing-ranks"]) == 0
    out = capsys.readouterr().out
    leader_column = [line.split()[-1] for line in out.splitlines() if line.startswith(DATA)]
    assert leader_column == ["2"]


# --- an incident folder and several paths --------------------------------------------------------


def _incident_folder(traces: dict[str, Path], folder: Path) -> Path:
    """An incident folder as the router writes it: its traces (named for another host's folder,
    as after a copy) and ``incident.json`` giving each its rank."""
    from stagefrontier.formats.incident import new_incident
    from stagefrontier.render.incident import write_incident
    from trace_support import load_events, write_events

    incident = new_incident("w00003", "window")
    folder.mkdir(parents=True)
    for which, rank in (("slow", 2), ("fast", 0)):
        header, events = load_events(traces[which])  # no distributedInfo: only the incident says
        write_events(folder / f"rank{rank}.pt.trace.json", header, events)
        incident["trace_files"][str(rank)] = f"/elsewhere/incidents/w00003/rank{rank}.pt.trace.json"
    incident.update(captured=True, ranks=[0, 2], stage="data.next_wait", leader_rank=2)
    write_incident(folder, incident)
    return folder


def test_analyze_reads_an_incident_folder_with_its_ranks(
    traces: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _incident_folder(traces, tmp_path / "incidents" / "w00003")
    assert main(["analyze", str(folder), "--json"]) == 0
    report = sf.WindowReport.from_json(capsys.readouterr().out)
    assert report.top1 == "data.next_wait" and report.leaders["data.next_wait"] == 2
    assert main(["analyze", str(folder)]) == 0
    assert "on rank 2." in capsys.readouterr().out


def test_an_incident_without_traces_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stagefrontier.formats.incident import new_incident
    from stagefrontier.render.incident import write_incident

    write_incident(tmp_path, new_incident("w00001", "window"))
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "incident w00001 has no trace: nothing was captured" in err and "\n" not in err[:-1]


def test_analyze_takes_one_path_per_rank(
    traces: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _as_ranks(traces, tmp_path / "job", slow=2, fast=0, world_size=3)
    files = [str(folder / "rank2.pt.trace.json"), str(folder / "rank0.pt.trace.json")]
    assert main(["analyze", *files]) == 2
    err = capsys.readouterr().err
    assert "rank(s) 1 of world size 3 have no trace" in err and "--allow-missing-ranks" in err
    assert main(["analyze", *files, "--allow-missing-ranks", "--json"]) == 0
    report = sf.WindowReport.from_json(capsys.readouterr().out)
    assert report.n_ranks == 2 and report.leaders["data.next_wait"] == 2
    assert main(["analyze", files[0], str(tmp_path / "nothing.npz")]) == 2
    assert "nothing.npz: No such file" in capsys.readouterr().err


def test_several_paths_must_all_be_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _nsys_ranks(tmp_path / "job", (0, 1), slow=1)
    npz = tmp_path / "w.npz"
    np.savez(npz, d=_slow_window(0, 2), stages=np.array(STAGES))
    assert main(["analyze", str(tmp_path / "job" / "report_rank0.sqlite"), str(npz)]) == 2
    err = capsys.readouterr().err
    assert "only as the traces of one window" in err and f"not a trace: {npz} (npz)" in err
    sqlite = [str(tmp_path / "job" / f"report_rank{r}.sqlite") for r in (0, 1)]
    assert main(["analyze", *sqlite]) == 0
    assert "on rank 1." in capsys.readouterr().out


def test_one_path_in_a_list_is_that_path_with_its_window_and_attempt(tmp_path: Path) -> None:
    analyzed = analyze_merged(merge_windows(_rank_windows((0, 2), 2), 3))
    PacketSink(tmp_path).write(analyzed)
    restarted = tmp_path / "packets" / "window-000000.attempt-1.json"
    restarted.write_bytes((tmp_path / "packets" / "window-000000.json").read_bytes())
    loaded = load_window([tmp_path], window=0, attempt=1)
    assert loaded.report == load_window(restarted).report
