"""The sampled forward CUDA-event side channel, driven by a fake event type whose readiness the
test controls (the real ``torch.cuda.Event`` needs a GPU), and the no-torch guarantee at q = 0."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from recorder_support import FWD, OPTIM, CaptureCollector, read_records
from stagefrontier import CollectConfig, SamplingConfig, StageTimer, TimerConfig
from stagefrontier.analysis.side import EVENT_MISSING, EVENT_NOT_SAMPLED, EVENT_READY
from stagefrontier.record.cuda_events import MAX_PENDING_STEPS, is_sampled

MS = 1e-3
SCOPE_LIMITED = "forward_event_scope_limited"


class EventSource:
    """Creates fake events and decides when they complete: an end event is ready from its
    ``ready_after``-th query on (never when ``ready_after`` is None)."""

    def __init__(self, ms: float = 7.5, ready_after: int | None = 1) -> None:
        self.ms = ms
        self.ready_after = ready_after
        self.created = 0
        self.queries = 0

    def __call__(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    """``record``/``query``/``elapsed_time`` like ``torch.cuda.Event``; no ``synchronize``."""

    def __init__(self, source: EventSource) -> None:
        self.source = source
        self.recorded = False
        self.queried = 0

    def record(self) -> None:
        self.recorded = True

    def query(self) -> bool:
        assert self.recorded
        self.source.queries += 1
        self.queried += 1
        after = self.source.ready_after
        return after is not None and self.queried >= after

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.recorded and end.recorded
        return self.source.ms


def forward_steps(timer: StageTimer, n: int, fwd_s: float = 1 * MS) -> None:
    for _ in range(n):
        with timer.step():
            with timer.stage(FWD), timer.cuda_event_sample():
                time.sleep(fwd_s)
            with timer.stage(OPTIM):
                pass


def test_sampling_is_deterministic_and_evenly_spread() -> None:
    assert [s for s in range(100) if is_sampled(s, 0.05)] == [19, 39, 59, 79, 99]
    assert all(is_sampled(s, 1.0) for s in range(50))
    assert not any(is_sampled(s, 0.0) for s in range(50))


def test_ready_pairs_give_event_values_at_fraction_one(tmp_path: Path) -> None:
    source = EventSource(ms=40.0, ready_after=1)
    timer = StageTimer(
        config=TimerConfig(
            window=6,
            collection=CollectConfig(out_dir=tmp_path),
            sampling=SamplingConfig(cuda_event_fraction=1.0, event_factory=source),
        )
    )
    collector = CaptureCollector()
    captured = StageTimer(
        config=TimerConfig(
            window=6, sampling=SamplingConfig(cuda_event_fraction=1.0, event_factory=source)
        ),
        collector=collector,
    )
    for t in (timer, captured):
        forward_steps(t, 6, fwd_s=5 * MS)
        t.close()

    (w,) = collector.windows
    assert w.forward_stage == FWD
    assert w.event_state is not None and w.event_ms is not None
    assert list(w.event_state) == [EVENT_READY] * 6
    np.testing.assert_array_equal(w.event_ms, np.full(6, 40.0))
    assert source.created == 2 * 2 * 6  # two events per sampled step, two timers

    (record,) = read_records(tmp_path)
    event = record["forward_event"]
    assert event["sampled"] == 6
    assert event["ready"] == 6
    assert event["ready_ratio"] == 1.0
    assert event["event_mean_ms"] == pytest.approx(40.0)
    assert event["cpu_mean_ms"] >= 5.0
    assert SCOPE_LIMITED not in record["labels"]
    # The event value is side evidence: no stage is added to the ordered schema.
    assert record["stages"] == list(w.stages)
    assert not any("cuda_event" in s for s in record["stages"])


def test_fraction_five_percent_samples_steps_19_39_59_79_and_defers_99(tmp_path: Path) -> None:
    source = EventSource(ms=3.0, ready_after=2)  # ready at the second poll: a later boundary
    collector = CaptureCollector()
    timer = StageTimer(
        config=TimerConfig(
            window=100, sampling=SamplingConfig(cuda_event_fraction=0.05, event_factory=source)
        ),
        collector=collector,
    )
    forward_steps(timer, 120, fwd_s=0)
    timer.close()
    first, second = collector.windows
    assert first.event_state is not None and first.event_ms is not None
    sampled = np.flatnonzero(first.event_state != EVENT_NOT_SAMPLED).tolist()
    # Step 99 is the window's last: its pair would get one poll, at the hand-off right after
    # it, so the sample moves to step 100, the next window's first row.
    assert sampled == [19, 39, 59, 79]
    assert first.event_state[sampled].tolist() == [EVENT_READY] * 4
    np.testing.assert_array_equal(first.event_ms[sampled], [3.0] * 4)
    assert np.all(np.isnan(np.delete(first.event_ms, sampled)))
    assert second.event_state is not None and second.event_ms is not None
    assert np.flatnonzero(second.event_state != EVENT_NOT_SAMPLED).tolist() == [0, 19]
    assert second.event_state[0] == EVENT_READY and second.event_ms[0] == 3.0
    # Step 119 is last only because close() flushes a partial window: one poll, missing.
    assert second.event_state[19] == EVENT_MISSING
    assert source.created == 2 * 6


def test_never_ready_pairs_are_missing_and_scope_limited(tmp_path: Path) -> None:
    source = EventSource(ready_after=None)
    timer = StageTimer(
        config=TimerConfig(
            window=20,
            collection=CollectConfig(out_dir=tmp_path),
            sampling=SamplingConfig(cuda_event_fraction=1.0, event_factory=source),
        )
    )
    forward_steps(timer, 20)
    timer.close()
    (record,) = read_records(tmp_path)
    event = record["forward_event"]
    assert event["sampled"] == 20
    assert event["ready"] == 0
    assert "event_mean_ms" not in event
    assert SCOPE_LIMITED in record["labels"]
    assert any("0/20" in r for r in record["reasons"][SCOPE_LIMITED])
    # Pending pairs are aged out after MAX_PENDING_STEPS boundaries, never waited on.
    assert source.queries <= 20 * (MAX_PENDING_STEPS + 1)


def test_missing_and_ready_mix_at_five_percent(tmp_path: Path) -> None:
    source = EventSource(ms=2.0, ready_after=None)
    collector = CaptureCollector()
    timer = StageTimer(
        config=TimerConfig(
            window=100, sampling=SamplingConfig(cuda_event_fraction=0.05, event_factory=source)
        ),
        collector=collector,
    )
    forward_steps(timer, 50, fwd_s=0)  # samples at 19 and 39 never complete
    source.ready_after = 1
    forward_steps(timer, 50, fwd_s=0)  # samples at 59 and 79 complete; 99 moves to step 100
    timer.close()
    (w,) = collector.windows
    assert w.event_state is not None
    assert w.event_state[[19, 39]].tolist() == [EVENT_MISSING] * 2
    assert w.event_state[[59, 79]].tolist() == [EVENT_READY] * 2
    assert w.event_state[99] == EVENT_NOT_SAMPLED


def test_broken_event_factory_disables_sampling_without_raising() -> None:
    def factory() -> FakeEvent:
        raise RuntimeError("CUDA is not available")

    collector = CaptureCollector()
    timer = StageTimer(
        config=TimerConfig(
            window=4, sampling=SamplingConfig(cuda_event_fraction=1.0, event_factory=factory)
        ),
        collector=collector,
    )
    forward_steps(timer, 4)
    timer.close()
    (w,) = collector.windows
    assert w.event_state is not None
    assert np.all(w.event_state == EVENT_NOT_SAMPLED)
    assert w.n_steps == 4


def test_event_sample_outside_a_step_records_nothing() -> None:
    source = EventSource()
    timer = StageTimer(
        config=TimerConfig(
            window=2, sampling=SamplingConfig(cuda_event_fraction=1.0, event_factory=source)
        ),
        collector=CaptureCollector(),
    )
    with timer.cuda_event_sample():
        pass
    timer.close()
    assert source.created == 0


def test_fraction_zero_never_imports_torch(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        import stagefrontier as sf

        out = sys.argv[1]
        with sf.StageTimer(window=3, out_dir=out) as timer:
            for batch in timer.iter(range(7)):
                with timer.step():
                    with timer.stage("model.fwd_loss_cpu_wall"):
                        with timer.cuda_event_sample():
                            pass
                    with timer.stage("model.backward_cpu_wall"):
                        pass
                    with timer.probe("callbacks.image_logging"):
                        pass
                    with timer.stage("optim.step_cpu_wall"):
                        pass
        assert sys.modules["torch"] is None
        with open(out + "/windows.jsonl") as handle:
            print(json.dumps([json.loads(line)["n_steps"] for line in handle]))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[3, 3, 1]"
