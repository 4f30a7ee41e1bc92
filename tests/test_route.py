"""The profiler router's parts without a distributed job: the decision, the request and incident
formats, the op diff on hand-written traces, and one single-process capture end to end (a
manual request from Python and from ``stagefrontier capture``)."""

from __future__ import annotations

import gzip
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rank_support import run_job
from stagefrontier import CollectConfig, TimerConfig, analyze
from stagefrontier.errors import ReportFormatError
from stagefrontier.formats.incident import check_incident, new_incident, read_incident
from stagefrontier.render.incident import write_incident
from stagefrontier.route.decide import decide, start_margin
from stagefrontier.route.opdiff import OpTimes, op_diff, stage_op_times
from stagefrontier.route.requests import CaptureRequest, CaptureStatus, ManualRequest
from trace_support import manual_incident, thread_trace

STAGES = [
    "data.next_wait",
    "model.fwd_loss_cpu_wall",
    "model.backward_cpu_wall",
    "optim.step_cpu_wall",
    "step.other_cpu_wall",
]


# --- decide -------------------------------------------------------------------------------------


def _window(d: np.ndarray, ranks: list[int], workers: int = 0) -> Any:
    report = analyze(d, STAGES, rank_ids=ranks)  # as analyze_merged numbers the columns
    ref = SimpleNamespace(window=3, first_step=60)
    loader = {"workers": workers} if workers else {}
    merged = SimpleNamespace(
        ranks=[SimpleNamespace(rank=r, loader=loader) for r in ranks], reference=ref
    )
    return SimpleNamespace(
        report=report,
        merged=merged,
        d=d,
        summary=None,
        regression=None,
        record={},
        communication=None,  # no collectives watched
    )


def _matrix(stall_rank: int | None, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = np.zeros((10, 4, len(STAGES)))
    d[:, :, 0] = 0.001 + rng.uniform(0, 2e-4, (10, 4))
    d[:, :, 0] += np.arange(4) * 1e-4  # ranks' data times differ slightly: 0 < 1 < 3
    d[:, :, 1] = 0.010 + rng.uniform(0, 1e-3, (10, 4))
    d[:, :, 2] = 0.020
    d[:, :, 3] = 0.002
    if stall_rank is not None:
        d[:, stall_rank, 0] += 0.120
    return d


def test_a_data_stall_is_actionable_with_its_rank_and_the_median_reference() -> None:
    # Rank ids as collected (rank 1 missing from the axis would shift positions: map them).
    decision, why = decide(_window(_matrix(2), [0, 1, 2, 3]))
    assert decision is not None, why
    assert decision.stage == "data.next_wait" and not decision.below_top
    assert decision.suspect_rank == 2
    # The other ranks' data totals rank 0 < 1 < 3: the median is rank 1.
    assert decision.reference_rank == 1
    assert decision.window == 3


def test_rank_positions_map_to_rank_ids() -> None:
    decision, _ = decide(_window(_matrix(2), [0, 4, 5, 7]))
    assert decision is not None
    assert decision.suspect_rank == 5 and decision.reference_rank == 4


def test_jitter_without_a_stall_is_not_actionable() -> None:
    decision, why = decide(_window(_matrix(None), [0, 1, 2, 3]))
    assert decision is None
    assert why


def _paired(stall: bool) -> np.ndarray:
    """12 steps of 4 ranks whose data wait (50 ms on every rank) has one clear leader in every
    step, the rank a step's jitter puts ahead (rank ``step % 4``, 3 ms); with ``stall``, rank
    2's two DataLoader workers hand over their batches two at a time, 240 ms late: rank 2 waits
    on every other step, and the other ranks wait for it in the backward's all-reduce."""
    d = _matrix(None)
    d = np.concatenate([d, d[:2]])
    d[:, :, 0] += 0.050
    for step in range(12):
        d[step, step % 4, 0] += 0.003
        if stall and step % 2 == 0:
            d[step, 2, 0] += 0.240
            d[step, [0, 1, 3], 2] += 0.240
    return d


def test_a_wait_on_every_other_step_is_judged_over_the_loaders_bursts() -> None:
    alone, why = decide(_window(_paired(stall=True), [0, 1, 2, 3]))
    assert alone is None and "switches" in why, why  # step by step, the lead alternates
    decision, why = decide(_window(_paired(stall=True), [0, 1, 2, 3], workers=2))
    assert decision is not None, why
    assert decision.stage == "data.next_wait" and decision.suspect_rank == 2
    assert "judged over blocks of 2 steps" in decision.reasons[-1], decision.reasons
    # Jitter alone is judged over the same blocks and still opens nothing.
    healthy, why = decide(_window(_paired(stall=False), [0, 1, 2, 3], workers=2))
    assert healthy is None and "over blocks of 2 steps" in why, why


def test_a_steady_lead_on_every_other_step_is_measured_over_the_loaders_bursts() -> None:
    """A stall from the first step: rank 2's two workers hand over their batches two at a
    time, so it waits 480 ms on every other step, and on the steps between no rank waits
    longer than another. Rank 2 leads steadily step by step, but its excess alternates
    between 480 ms and nothing: the steps' own noise, unless measured over the workers'
    blocks (before, such a stall opened no incident in any window)."""
    d = _matrix(None)[:8]
    d[:, :, 0] = 0.001
    d[::2, 2, 0] += 0.480
    d[::2, [0, 1, 3], 2] += 0.480  # the others wait for rank 2 in the backward's all-reduce
    alone, why = decide(_window(d, [0, 1, 2, 3]))
    assert alone is None and "inside the steps' noise" in why, why
    decision, why = decide(_window(d, [0, 1, 2, 3], workers=2))
    assert decision is not None, why
    assert decision.stage == "data.next_wait" and decision.suspect_rank == 2
    assert "rank 2 leads it alone in 4/8 steps" in decision.reasons[1], decision.reasons
    assert "judged over blocks of 2 steps" in decision.reasons[-1], decision.reasons


def test_start_margin_covers_two_polls_and_the_latency_in_steps() -> None:
    # (2 * 0.05 + 0.5) s at 0.1 s/step = 6 steps, plus 2.
    assert start_margin(0.1, 0.05) == 8
    assert start_margin(1.0, 0.05) == 3
    assert start_margin(float("nan"), 0.05) == 8  # unknown: 0.1 s/step assumed


# --- formats ------------------------------------------------------------------------------------


def test_requests_round_trip_and_reject_bad_values() -> None:
    request = CaptureRequest("w00001", (2, 0), 40, 5, "data.next_wait")
    assert CaptureRequest.decode(request.encode()) == request
    assert request.last_step == 44
    status = CaptureStatus("w00001", 2, "captured", path="/x", size=3, host="h")
    assert CaptureStatus.decode(status.encode()) == status
    manual = ManualRequest((2, 0), 5, id="c0ffee")
    assert ManualRequest.decode(manual.encode()) == manual
    for bad in (b"not json", b"[1]", b'{"id": "x", "ranks": [], "first_step": 1, "steps": 1}'):
        with pytest.raises(ReportFormatError):
            CaptureRequest.decode(bad)
    with pytest.raises(ReportFormatError, match="state"):
        CaptureStatus.decode(b'{"id": "x", "rank": 0, "state": "maybe"}')
    with pytest.raises(ReportFormatError, match="exceeds"):
        ManualRequest.decode(b" " * (1 << 17))


def test_incident_is_validated_on_read(tmp_path: Path) -> None:
    incident = new_incident("w00002", "window")
    incident.update(steps=[10, 14], stage="data.next_wait", leader_rank=2, reference_rank=0)
    write_incident(tmp_path / "i", incident)
    assert read_incident(tmp_path / "i") == incident
    assert "data.next_wait" in (tmp_path / "i" / "incident.md").read_text()
    for field, value, match in (
        ("version", 2, "version"),
        ("window", True, "window"),
        ("steps", [1], "steps"),
        ("op_diff", [{"name": "x"}], "op_diff"),
    ):
        with pytest.raises(ReportFormatError, match=match):
            check_incident({**incident, field: value})
    broken = dict(incident)
    del broken["reasons"]
    with pytest.raises(ReportFormatError, match="reasons"):
        check_incident(broken)


# --- op diff ------------------------------------------------------------------------------------


def _step(t0: float, sleep_us: float) -> list[tuple[str, str, float, float]]:
    """One 1000 µs step: a 600 µs data stage (a user loader, maybe sleeping inside it, and an
    aten op) and a forward stage outside it."""
    return [
        ("user_annotation", f"stagefrontier.step#{int(t0 // 1000)}", t0, 1000),
        ("user_annotation", "data.next_wait", t0 + 10, 600),
        ("python_function", "loader.py(12): slow_collate", t0 + 20, 400),
        ("python_function", "<built-in function sleep>", t0 + 30, sleep_us),
        ("cpu_op", "aten::cat", t0 + 300, 50),
        ("python_function", "stagefrontier/record/recorder.py(80): __exit__", t0 + 605, 4),
        ("user_annotation", "model.fwd_loss_cpu_wall", t0 + 620, 300),
        ("python_function", "<built-in method mm of type object at 0x7f00>", t0 + 630, 250),
    ]


def test_op_diff_ranks_self_time_inside_the_stage_by_user_function(tmp_path: Path) -> None:
    suspect = thread_trace(tmp_path / "s.json.gz", _step(0, 250) + _step(1000, 250))
    reference = thread_trace(tmp_path / "r.json.gz", _step(0, 0) + _step(1000, 0))
    mine = stage_op_times(suspect, "data.next_wait")
    assert mine.steps == 2
    # sleep: 250 µs self per step; slow_collate: 400 - 250 (sleep) - 50 (aten::cat) = 100 µs.
    assert mine.self_s["loader.py(12): slow_collate › <built-in function sleep>"] == pytest.approx(
        500e-6
    )
    assert mine.self_s["loader.py(12): slow_collate"] == pytest.approx(200e-6)
    assert mine.self_s["loader.py(12): slow_collate › aten::cat"] == pytest.approx(100e-6)
    assert not any("recorder.py" in k or "mm" in k for k in mine.self_s)  # timer; other stage
    rows = op_diff(mine, stage_op_times(reference, "data.next_wait"))
    assert rows[0]["name"] == "loader.py(12): slow_collate › <built-in function sleep>"
    assert rows[0]["suspect_ms_per_step"] == pytest.approx(0.25)
    assert rows[0]["reference_ms_per_step"] == 0.0
    assert rows[0]["call_path"] == ["loader.py(12): slow_collate"]
    # Only step 1: the same per-step figures.
    one = stage_op_times(suspect, "data.next_wait", steps=[1])
    assert one.steps == 1
    forward = stage_op_times(suspect, "model.fwd_loss_cpu_wall")
    assert forward.self_s == {"<built-in method mm>": pytest.approx(500e-6)}


def _sampled_step(t0: float, rest_us: float) -> list[tuple[str, str, float, float]]:
    """One step as the stack sampler cuts it: the training loop's own frame (``_train``) opens
    at the first sample inside the data stage, where a 120 µs sleep stalls, and runs to the
    step's end, ``rest_us`` of forward, backward and optimizer after the data stage; its
    children there lie outside the data stage."""
    end = t0 + 140 + rest_us
    return [
        ("user_annotation", f"stagefrontier.step#{int(t0 // 10_000)}", t0, end - t0),
        ("user_annotation", "data.next_wait", t0 + 5, 130),
        ("python_function", "train.py(163): _train", t0 + 7, end - t0 - 8),
        ("python_function", "faults.py(171): delay", t0 + 8, 121),
        ("python_function", "<built-in function sleep>", t0 + 9, 120),
        ("user_annotation", "model.fwd_loss_cpu_wall", t0 + 140, rest_us),
        ("python_function", "model.py(30): forward", t0 + 141, rest_us - 2),
    ]


@pytest.mark.parametrize("rest_us", [30.0, 400.0])
def test_a_frame_running_past_the_stage_counts_only_its_time_inside_it(
    tmp_path: Path, rest_us: float
) -> None:
    """The training loop's frame starts inside the data stage and runs to the step's end: only
    its own time inside the stage is counted (about none: its children fill it), however long
    the rest of the step is. Counted whole, it led the op diff once the rest outgrew the stall
    (a loaded machine: the demo's op diff named ``_train`` at 180 ms/step, not ``delay``)."""
    trace = thread_trace(
        tmp_path / "s.json.gz", _sampled_step(0, rest_us) + _sampled_step(10_000, rest_us)
    )
    mine = stage_op_times(trace, "data.next_wait")
    rows = op_diff(mine, OpTimes({}, 2, {}))
    assert rows[0]["name"] == "faults.py(171): delay › <built-in function sleep>", rows
    assert mine.self_s["train.py(163): _train"] == pytest.approx(2 * 7e-6)  # 7-8 and 129-135
    assert mine.self_s["faults.py(171): delay"] == pytest.approx(2 * 1e-6)


# --- one process, end to end --------------------------------------------------------------------


UNTIL_DONE = 100_000
"""Steps a test trains while a command it started runs: a bound the command's own wait ends
long before."""


def _train(timer: Any, steps: int, done: Any = None) -> int:
    import torch

    model = torch.nn.Linear(8, 8)
    for step in range(steps):
        with timer.step():
            with timer.stage("data.next_wait"):
                time.sleep(0.02)
            with timer.stage("model.fwd_loss_cpu_wall"):
                model(torch.randn(4, 8)).sum().backward()
        if done is not None and done():
            return step
    return steps


def _settled(out_dir: Path) -> Any:
    """Whether the run's first manual incident is written: settled while training runs, so
    reduced on rank 0's router thread (one settled as the timer closes is reduced after the
    run, by a process of its own)."""
    return lambda: any(Path(out_dir).glob("incidents/w*-manual0/incident.json"))


def _manual_timer(tmp_path: Path, store: Any, record_ops: bool = False) -> tuple[Any, Any]:
    """A one-process timer (local collection, no regression check: on a loaded machine the step
    times swing, and a regression capture opened first would take the incident a test asks for)
    and its router, whose captures a test asks for by hand."""
    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig

    router = ProfilerRouter(steps=3, store=store, capture_timeout_s=30.0, record_ops=record_ops)
    collection = CollectConfig("local", out_dir=tmp_path, regression=None)
    timer = StageTimer(config=TimerConfig(window=5, collection=collection, router=router))
    return timer, router


@pytest.fixture
def store() -> Any:
    dist = pytest.importorskip("torch.distributed")
    from datetime import timedelta

    return dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )


def test_a_manual_request_from_python_captures_and_writes_an_incident(
    tmp_path: Path, store: Any
) -> None:
    timer, router = _manual_timer(tmp_path, store)
    _train(timer, 5)  # one window: the step time is measured
    # The stage is named: without it the request takes the last analyzed window's top stage,
    # and on a loaded machine the router can serve the request before window 0 reaches it.
    router.request_capture([0], stage="data.next_wait")
    _train(timer, UNTIL_DONE, done=_settled(tmp_path))  # reduced live, not after the run
    timer.close()
    incident = read_incident(manual_incident(tmp_path))
    assert incident["trigger"] == "manual" and incident["captured"], incident["reasons"]
    assert incident["ranks"] == [0] and incident["steps"][1] - incident["steps"][0] == 2
    assert Path(incident["trace_files"]["0"]).exists()
    assert incident["confirmed"] is not None
    assert incident["stage"] == "data.next_wait"
    assert "sleep" in incident["op_diff"][0]["name"] and "_train" in incident["op_diff"][0]["name"]
    assert (manual_incident(tmp_path) / "incident.html").exists()


def test_a_capture_keeps_its_windows_while_the_router_thread_exports_its_trace(
    tmp_path: Path, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router thread writes the trace while training goes on; the windows analyzed
    meanwhile wait for it, and it keeps only the latest ``LIVE_WINDOWS`` live. Here the export
    waits until more than that many windows were analyzed after it began (a slow export on a
    loaded machine): the capture kept the windows of its steps, and is confirmed or refuted
    against them (it was left unconfirmed: no live window covered the captured steps)."""
    import threading

    from stagefrontier.route import capture, coordinator

    timer, router = _manual_timer(tmp_path, store)
    _train(timer, 5)
    analyzed: list[int] = []  # the first step of each window analyzed after these
    seen = threading.Condition()
    waited: list[bool] = []

    class Analyzed:
        def take(self, window: Any) -> None:
            with seen:
                analyzed.append(window.merged.reference.first_step)
                seen.notify_all()

    timer._collector.consumers.register(Analyzed())  # type: ignore[union-attr]
    real_write = capture.write_trace

    def write_after_windows(*args: Any, **kwargs: Any) -> Any:
        past = timer._step_index + 5 * (coordinator.LIVE_WINDOWS + 2)  # windows of 5 steps
        with seen:
            waited.append(seen.wait_for(lambda: bool(analyzed) and analyzed[-1] >= past, 120))
        return real_write(*args, **kwargs)

    monkeypatch.setattr(capture, "write_trace", write_after_windows)
    router.request_capture([0], stage="data.next_wait")
    _train(timer, UNTIL_DONE, done=_settled(tmp_path))
    timer.close()
    incident = read_incident(manual_incident(tmp_path))
    assert waited == [True]
    assert incident["captured"] and incident["confirmed"] is not None, incident["reasons"]
    assert not any("analyzed window" in r for r in incident["reasons"]), incident["reasons"]


def test_captured_steps_that_no_analyzed_window_holds_are_said() -> None:
    """Lost (a window past them arrived: theirs was dropped or failed), or not yet analyzed
    when the capture settled (it timed out first)."""
    from stagefrontier.route.coordinator import unanalyzed

    def spans(*pairs: tuple[int, int]) -> Any:
        refs = [SimpleNamespace(first_step=a, last_step=b) for a, b in pairs]
        return [SimpleNamespace(merged=SimpleNamespace(reference=r)) for r in refs]

    lost: dict[str, Any] = {"steps": [13, 16], "reasons": []}
    unanalyzed(lost, spans((10, 14), (20, 24)))
    assert lost["reasons"] == [
        "no analyzed window holds captured step(s) 15, 16: their window was dropped from the "
        "analysis hand-off (its queue was full) or its analysis failed; the trace is compared "
        "with the live steps that remain"
    ]
    late: dict[str, Any] = {"steps": [13, 16], "reasons": []}
    unanalyzed(late, spans((10, 14)))
    assert "not analyzed before the capture settled" in late["reasons"][0]
    held: dict[str, Any] = {"steps": [13, 16], "reasons": []}
    unanalyzed(held, spans((10, 14), (15, 19)))
    assert held["reasons"] == []


def test_the_workers_profiles_are_diffed_within_the_incidents_reduction_cost(
    tmp_path: Path, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture of a rank whose batches come from 2 DataLoader workers: the workers' op diff
    names ``slow_sample``, and its CPU counts in the incident's ``router_cpu_s.reduction`` with
    the traces' (the diff is followed here by 0.3 s of CPU on the same thread: the reduction
    holds the traces' own CPU, as ``analyze_traces`` returns it, plus at least that)."""
    from torch.utils.data import DataLoader

    from loader_support import Samples
    from stagefrontier.route import incident_writer

    real_findings, real_traces = incident_writer.worker_findings, incident_writer.analyze_traces
    spent: list[float] = []

    def findings_then_cpu(incident: dict[str, Any], live: Any, min_share: float) -> None:
        real_findings(incident, live, min_share)
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass
        spent.append(time.thread_time() - start)

    def traces(*args: Any) -> float:
        spent.append(real_traces(*args))
        return spent[-1]

    monkeypatch.setattr(incident_writer, "worker_findings", findings_then_cpu)
    monkeypatch.setattr(incident_writer, "analyze_traces", traces)
    timer, router = _manual_timer(tmp_path, store)
    # until the incident is written (reduced live, not after the run): at ~10 ms a step the
    # capture starts some 60 steps after the request (the start margin covers the store polls
    # and the request latency, about 0.6 s)
    loader = DataLoader(Samples(4 * UNTIL_DONE, delay_s=0.005), batch_size=4, num_workers=2)
    settled = _settled(tmp_path)
    for step, _batch in enumerate(timer.iter(loader)):
        if step == 5:
            router.request_capture([0])
        with timer.step(), timer.stage("model.fwd_loss_cpu_wall"):
            time.sleep(0.005)
        if settled():
            break
    timer.close()
    incident = read_incident(manual_incident(tmp_path))
    assert incident["captured"], incident["reasons"]
    assert "slow_sample" in incident["worker_op_diff"][0]["name"], incident["worker_op_diff"][:3]
    assert len(spent) == 2 and incident["router_cpu_s"]["reduction"] >= round(sum(spent), 4)


@pytest.mark.parametrize("isal", [True, False], ids=["isal", "standard library"])
def test_a_trace_is_compressed_to_a_standard_gzip_file_with_or_without_isal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isal: bool
) -> None:
    """The export's compression: ISA-L where installed (the router extra), else the standard
    library's zlib; either writes a gzip file the standard library (and so every trace viewer)
    inflates to the JSON Kineto wrote."""
    from stagefrontier.route.trace_parts import GzipTarget, gzip_writer

    if isal:
        pytest.importorskip("isal")
    else:
        monkeypatch.setitem(sys.modules, "isal", None)  # ``from isal import igzip`` fails
    assert (gzip_writer() is gzip.GzipFile) is not isal
    source = tmp_path / "plain.json"
    source.write_text(
        '{"traceEvents": ['
        + ",".join(
            f'{{"ph": "X", "name": "op{i % 97}", "ts": {i}.5, "dur": 1}}' for i in range(50000)
        )
        + "]}"
    )
    target = tmp_path / "rank0.pt.trace.json.gz"
    zipped = GzipTarget(target)
    zipped.write(source.read_bytes())
    assert not target.exists()  # in place only once committed
    zipped.commit()
    assert gzip.decompress(target.read_bytes()) == source.read_bytes()
    assert target.stat().st_size < source.stat().st_size / 4
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, source.name])


def test_the_router_extra_is_imported_where_the_router_is_attached() -> None:
    """isal is imported by ``warm_up`` (StageTimer's construction), not at its first use on a
    router thread, where its import would count in an incident's CPU; msgspec, which decodes
    the traces and the typed records, is imported with the package."""
    pytest.importorskip("isal")
    script = (
        "import sys\n"
        "from stagefrontier.route import profiler_session\n"
        "names = [*profiler_session.ROUTER_EXTRA_MODULES, 'msgspec']\n"
        "before = [name in sys.modules for name in names]\n"
        "profiler_session.warm_up()\n"
        "print(before, [name in sys.modules for name in names])\n"
    )
    done = run_job([sys.executable, "-c", script], 300)
    assert done.stdout.split() == ["[False,", "True]", "[True,", "True]"], done.stdout


def test_the_reduction_reads_only_the_events_it_needs_from_the_writers_slice(
    tmp_path: Path, store: Any
) -> None:
    """A real capture's trace: the events ``load_for_reduction`` keeps for the routed stage
    (decoded by msgspec, cut to their range fields) give the same stage matrix and the same op
    times as the whole trace (decoded by the standard library), from far fewer: the operators
    outside the stage's ranges are left out, so the capture records them (``record_ops``)."""
    from stagefrontier.analysis.schema import DEFAULT_STAGES
    from stagefrontier.reducers import reduce_kineto
    from stagefrontier.reducers.kineto import load_trace
    from stagefrontier.route.trace_slice import load_for_reduction

    timer, router = _manual_timer(tmp_path, store, record_ops=True)
    _train(timer, 5)
    router.request_capture([0], stage="data.next_wait")
    _train(timer, 40)
    timer.close()
    incident = read_incident(manual_incident(tmp_path))
    assert incident["captured"], incident["reasons"]
    path = Path(incident["trace_files"]["0"])
    first, last = incident["steps"]
    steps = range(first, last + 1)
    whole = load_trace(path)
    kept = load_for_reduction(path, "data.next_wait", steps)
    assert 0 < len(kept[1]) < len(whole[1]) / 2, (len(kept[1]), len(whole[1]))
    matrices = [
        reduce_kineto(
            [path],
            DEFAULT_STAGES,
            step_source="annotation",
            missing_stages="zero",
            loaded={path: events},
        )
        for events in (whole, kept)
    ]
    assert matrices[1].step_ids == matrices[0].step_ids
    assert np.array_equal(matrices[1].d, matrices[0].d)
    times = [stage_op_times(path, "data.next_wait", steps, events[1]) for events in (whole, kept)]
    assert times[0] == times[1] and times[0].self_s
    _the_writer_left_the_reduction_its_slice(path, steps)


def _the_writer_left_the_reduction_its_slice(path: Path, steps: range) -> None:
    """The process that wrote the trace also wrote its slice beside it: the events the
    reduction keeps, cut for the routed stage and the captured steps, so that rank 0 reads
    them without parsing the trace. A slice cut for anything else, from another trace, or
    unreadable is ignored, and the trace is parsed instead."""
    from stagefrontier.route.trace_slice import cut_trace, read_slice, slice_path

    stage = "data.next_wait"
    assert slice_path(path) == path.with_name("rank0.pt.trace.slice.json")
    assert slice_path(path).is_file()
    assert read_slice(path, stage, steps) == cut_trace(path, stage, steps)
    assert read_slice(path, "forward", steps) is None
    assert read_slice(path, stage, range(steps.start, steps.stop - 1)) is None
    copy = path.with_name("rank9.pt.trace.json.gz")
    copy.write_bytes(path.read_bytes() + b"\0")  # another trace beside the same slice
    slice_path(copy).write_bytes(slice_path(path).read_bytes())
    assert read_slice(copy, stage, steps) is None
    slice_path(copy).write_bytes(b"{}")
    assert read_slice(copy, stage, steps) is None


def test_a_trace_that_cannot_be_cut_leaves_no_slice_and_says_so_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer cuts the slice after the trace is in place: when that fails (here a trace
    that is not JSON), the trace stands, no slice is left (not even a partial one), the cut
    logs nothing and says why (the writer's parent says it in one warning line: ``drop_slice``),
    and the reduction parses the trace itself (``load_for_reduction``), which raises its own
    error for such a file."""
    from stagefrontier.errors import TraceFormatError
    from stagefrontier.route.trace_slice import (
        drop_slice,
        load_for_reduction,
        slice_path,
        write_slice,
    )

    trace = tmp_path / "rank0.pt.trace.json.gz"
    trace.write_bytes(gzip.compress(b'{"traceEvents": [not json'))
    with caplog.at_level("WARNING", logger="stagefrontier"):
        why = write_slice(trace, "data.next_wait", range(3, 8))
        assert why.startswith("TraceFormatError: ") and not caplog.records
        drop_slice(trace, why)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith("stagefrontier: cutting the trace for the reduction failed (")
    assert lines[0].endswith("; rank 0 parses the trace"), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [trace.name]
    assert not slice_path(trace).exists()
    with pytest.raises(TraceFormatError, match="not a readable JSON trace"):
        load_for_reduction(trace, "data.next_wait", range(3, 8))


def test_stagefrontier_capture_asks_a_running_job(tmp_path: Path, store: Any) -> None:
    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer

    timer = StageTimer(
        config=TimerConfig(
            window=5,
            # no regression check: its captures would spend the budget first
            collection=CollectConfig("local", out_dir=tmp_path, regression=None),
            router=ProfilerRouter(steps=2, store=store, capture_timeout_s=30.0),
        )
    )
    cli = subprocess.Popen(
        [sys.executable, "-m", "stagefrontier.cli", "capture", "--store",
         f"127.0.0.1:{store.port}", "--ranks", "0", "--steps", "2", "--wait", "60"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:  # until the command ends (it waits at most 60 s once it runs: a loaded machine may
        # take many steps to start it)
        ran = _train(timer, UNTIL_DONE, done=lambda: cli.poll() is not None)
    finally:
        timer.close()
        out, _ = cli.communicate(timeout=60)
    assert cli.returncode == 0, out
    assert ran < UNTIL_DONE
    folder = Path(out.strip())
    assert folder.parent == (tmp_path / "incidents").resolve()
    assert read_incident(folder)["captured"]


def test_make_timer_and_both_callbacks_take_the_router(tmp_path: Path) -> None:
    from stagefrontier import ProfilerRouter
    from stagefrontier.integrations._timer import make_timer

    router = ProfilerRouter(capture_timeout_s=0.0)
    timer = make_timer(["x"], router=router, out_dir=tmp_path, collect="local")
    assert timer._router is not None and timer._router.config is router
    timer.close()
    for module in ("lightning", "transformers"):
        pytest.importorskip(module)
        callbacks = __import__(f"stagefrontier.integrations.{module}", fromlist=["_"])
        assert callbacks.StageFrontierCallback(router=router).arguments.router is router


# --- rank 0's budget, with a store stand-in ------------------------------------------------------


class _Channel:
    """The store as a dict (the coordinator's only dependency on it)."""

    scope = 0  # the router's key scope, as RequestChannel's

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}

    def read(self, key: str) -> bytes | None:
        return self.keys.get(key)

    def write(self, key: str, value: bytes) -> None:
        self.keys[key] = value

    def delete(self, *keys: str) -> None:
        for key in keys:
            self.keys.pop(key, None)


def _indexed(index: int) -> Any:
    window = _window(_matrix(2, seed=index), [0, 1, 2, 3])
    window.merged.reference = SimpleNamespace(
        window=index, first_step=10 * index, last_step=10 * index + 9
    )
    return window


def test_rank_0_keeps_one_capture_in_flight_a_cooldown_and_a_budget(tmp_path: Path) -> None:
    from stagefrontier import ProfilerRouter
    from stagefrontier.route.coordinator import Coordinator
    from stagefrontier.route.requests import REQUEST_KEY, status_key

    config = ProfilerRouter(cooldown_windows=2, max_captures=3, capture_timeout_s=0.0)
    channel = _Channel()
    step = [0]
    coordinator = Coordinator(
        config, out_dir=str(tmp_path), channel=channel, current_step=lambda: step[0]
    )  # type: ignore[arg-type]
    opened: list[tuple[int, str]] = []
    host = socket.gethostname()
    for index in range(11):
        step[0] = 10 * index + 10
        coordinator.take(_indexed(index))
        coordinator.tick()
        if REQUEST_KEY in channel.keys:
            request = CaptureRequest.decode(channel.keys[REQUEST_KEY])
            opened.append((index, request.id))
            assert request.ranks == (2, 1) and request.first_step > step[0]
            # The first: both ranks skip it; the second: nobody answers; the third: both say
            # they captured, but the traces never appear on this host.
            for rank in request.ranks if len(opened) != 2 else ():
                status = (
                    CaptureStatus(request.id, rank, "skipped", "a user profiler")
                    if len(opened) == 1
                    else CaptureStatus(
                        request.id, rank, "captured", path=str(tmp_path / "gone"), host=host
                    )
                )
                channel.write(status_key(request.id, rank), status.encode())
            coordinator.tick()
            if coordinator.open is not None:  # nobody answered: wait out the deadline
                time.sleep(max(0.0, coordinator.open.deadline - time.monotonic()) + 0.01)
                coordinator.tick()
            assert REQUEST_KEY not in channel.keys  # cleaned up when settled
    # Window 0 opens one; windows 1-2 are the cooldown; windows 3 and 6 open the next two;
    # then the budget of three is spent.
    assert [index for index, _ in opened] == [0, 3, 6]
    # No window is judged up to the step the last incident settled in (70), plus one of skew.
    assert coordinator.policy.busy_until_step == 71
    assert channel.keys == {}
    first = read_incident(tmp_path / "incidents" / opened[0][1])
    assert not first["captured"]
    assert "rank 2 skipped: a user profiler" in first["reasons"]
    second = read_incident(tmp_path / "incidents" / opened[1][1])
    assert any("rank 2 never answered" in r for r in second["reasons"])
    third = read_incident(tmp_path / "incidents" / opened[2][1])
    assert not third["captured"] and third["trace_files"] == {}
    assert any("never appeared on disk" in r for r in third["reasons"])


@pytest.mark.parametrize("case", ["user_profiler", "size_limit"])
def test_a_capture_is_skipped_under_a_user_profiler_and_dropped_over_the_size_limit(
    tmp_path: Path, store: Any, case: str
) -> None:
    import torch

    from stagefrontier import ProfilerRouter, StageTimer

    limit = 1e-4 if case == "size_limit" else 200.0
    router = ProfilerRouter(steps=2, store=store, capture_timeout_s=30.0, max_trace_mb=limit)
    timer = StageTimer(
        config=TimerConfig(
            window=5, collection=CollectConfig(mode="local", out_dir=tmp_path), router=router
        )
    )
    _train(timer, 5)
    router.request_capture([0])
    # Steps take at least the 20 ms sleep, so the start margin is at most
    # (2 x 50 ms + 0.5 s) / 20 ms + 2 = 32 steps: the capture ends inside these steps.
    steps = 40
    if case == "user_profiler":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            _train(timer, steps)
    else:
        _train(timer, steps)
    timer.close()
    incident = read_incident(manual_incident(tmp_path))
    assert not incident["captured"]
    expected = "a profiler the user started" if case == "user_profiler" else "exceeds the 104 bytes"
    assert any(expected in r for r in incident["reasons"]), incident["reasons"]
    assert not any("0.0 MiB" in r for r in incident["reasons"])  # issue 23, item 16
    assert list((tmp_path / "incidents").rglob("*.pt.trace.json.gz")) == []


def test_a_regression_is_captured_and_diffed_against_the_suspects_baseline_trace(
    tmp_path: Path,
) -> None:
    """Ranks 1 and 2's data stage grows by 51 and 50 ms from window 5: they tie for the lead,
    so no rank leads alone, but the live regression check flags it and rank 0 captures rank 1,
    which grew most and which a manual capture traced in the baseline windows; that earlier
    trace is the op diff's reference."""
    from stagefrontier import ProfilerRouter
    from stagefrontier.analysis.regression import RegressionCheck
    from stagefrontier.render.incident import summary_line
    from stagefrontier.route.coordinator import Coordinator
    from stagefrontier.route.requests import REQUEST_KEY, status_key

    config = ProfilerRouter(cooldown_windows=0, capture_timeout_s=30.0)
    channel = _Channel()
    step = [0]
    coordinator = Coordinator(
        config, out_dir=str(tmp_path), channel=channel, current_step=lambda: step[0]
    )  # type: ignore[arg-type]
    check = RegressionCheck()
    host = socket.gethostname()

    def feed(index: int, slower_s: float) -> None:
        d = _matrix(None, seed=index)
        d[:, 1, 0] += slower_s + 0.001 * bool(slower_s)
        d[:, 2, 0] += slower_s
        window = _window(d, [0, 1, 2, 3])
        window.merged.reference = SimpleNamespace(
            window=index, first_step=10 * index, last_step=10 * index + 9
        )
        window.regression = check.check(index, d, STAGES)
        step[0] = 10 * index + 10
        coordinator.take(window)
        coordinator.tick()

    def answer(sleep_us: float) -> CaptureRequest:
        request = CaptureRequest.decode(channel.keys[REQUEST_KEY])
        events = [
            e
            for s in range(request.first_step, request.last_step + 1)
            for e in _step(1000 * s, sleep_us)
        ]
        path = thread_trace(tmp_path / f"{request.id}.json.gz", events)
        for rank in request.ranks:
            status = CaptureStatus(
                request.id,
                rank,
                "captured",
                path=str(path),
                host=host,
                first_step=request.first_step,
                last_step=request.last_step,
            )
            channel.write(status_key(request.id, rank), status.encode())
        return request

    feed(0, 0.0)
    coordinator.request_capture([1], 2)
    coordinator.tick()
    manual = answer(sleep_us=0)
    for index in range(1, 5):
        feed(index, 0.0)
    assert coordinator.open is None and REQUEST_KEY not in channel.keys
    assert 10 <= manual.first_step <= 49  # inside the baseline windows 0-4

    feed(5, 0.050)
    request = CaptureRequest.decode(channel.keys[REQUEST_KEY])
    assert request.ranks == (1,)  # the rank that grew most, with a baseline trace
    answer(sleep_us=250)
    feed(6, 0.050)
    feed(7, 0.050)
    assert coordinator.open is None
    incident = read_incident(tmp_path / "incidents" / request.id)
    assert incident["trigger"] == "regression" and incident["window"] == 5
    assert incident["regression"]["ranks"] == [1, 2] and incident["stage"] == "data.next_wait"
    earlier = incident["reference_capture"]
    assert earlier["rank"] == 1 and earlier["from_baseline"]
    assert earlier["steps"] == [manual.first_step, manual.last_step]
    top = incident["op_diff"][0]
    assert "sleep" in top["name"]
    assert top["suspect_ms_per_step"] == pytest.approx(0.25) and top["reference_ms_per_step"] == 0
    line = summary_line(incident)
    assert "(regression)" in line and f"its steps {manual.first_step}-" in line, line
