"""DataLoader workers timed from inside (``record.loader_workers``): real worker processes under
``fork`` and ``spawn``, persistent or not, map-style and iterable datasets, a worker that dies, and
data that does not come from a DataLoader. Counts are exact (every batch the workers made is
counted once); nothing here asserts a duration. The demo's workers are watched as a timed loop's
are."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")

from torch.utils.data import DataLoader

from loader_support import EXIT_THREAD, DiesAt, ExitHeldAt, MarkWorker, Samples, Stream
from rank_support import rank_context
from recorder_support import FWD, read_records
from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.collect.wire import decode_window, encode_window
from stagefrontier.errors import ReportFormatError
from stagefrontier.integrations._timer import train_loader
from stagefrontier.window.loader import loader_figures

BATCH = 4


def _train(tmp_path: Path, loader: Any, epochs: int = 1, window: int = 3) -> list[dict[str, Any]]:
    timer = StageTimer(
        config=TimerConfig(
            window=window,
            collection=CollectConfig(mode="local", out_dir=tmp_path / "sf", log=False),
        )
    )
    for _ in range(epochs):
        for _batch in timer.iter(loader):
            with timer.step(), timer.stage(FWD):
                pass
    timer.close()
    return [r["loader_workers"].get("0", {}) for r in read_records(tmp_path / "sf")]


@pytest.mark.parametrize(
    ("context", "persistent"), [("fork", False), ("spawn", True), ("fork", True)]
)
def test_every_batch_the_workers_make_is_counted_once(
    tmp_path: Path, context: str, persistent: bool
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    loader = DataLoader(
        Samples(24),
        batch_size=BATCH,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=persistent,
        worker_init_fn=MarkWorker(str(marks)),
    )
    figures = _train(tmp_path, loader, epochs=2)
    assert sum(f["batches"] for f in figures) == 2 * len(loader)
    assert sum(f["consumed"] for f in figures) == 2 * len(loader)
    assert all(f["workers"] == 2 for f in figures)
    timed = [f for f in figures if f["batches"]]
    assert timed and all(f["per_batch_s"] > 0 and 0 < f["busy"] <= 1 for f in timed)
    assert all(isinstance(f["saturated"], bool) for f in timed)
    # The user's own worker_init_fn still ran in every worker: two per epoch, or two in all.
    assert len(list(marks.iterdir())) == (2 if persistent else 4)


def test_an_iterable_dataset_is_timed_like_a_map_style_one(tmp_path: Path) -> None:
    loader = DataLoader(Stream(20), batch_size=BATCH, num_workers=2)
    figures = _train(tmp_path, loader)
    # Each worker yields 10 samples: 3 batches (4, 4, 2) each.
    assert sum(f["batches"] for f in figures) == 6 == sum(f["consumed"] for f in figures)


@pytest.mark.parametrize("loop", ["timer.iter", "the loop's own"])
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_a_worker_that_dies_is_named_and_training_sees_the_loader_error(
    tmp_path: Path, loop: str
) -> None:
    """Worker 2 dies in its first batch (batch 2), after batches 0 and 1 were used. The workers
    fork from the session's server (``rank_support.rank_context``), not from this process: a
    worker forked from a test process that earlier tests left threads in could crash on its
    own (a loaded run's stderr held workers' segmentation faults), and the loader then raises
    the same error for that worker before worker 2 reaches its batch."""
    loader = DataLoader(
        DiesAt(48, at=2 * BATCH + 1),
        batch_size=BATCH,
        num_workers=3,
        multiprocessing_context=rank_context(),
    )
    timer = StageTimer(
        config=TimerConfig(
            window=100, collection=CollectConfig(mode="local", out_dir=tmp_path / "sf", log=False)
        )
    )
    if loop == "timer.iter":
        batches: Any = timer.iter(loader)
    else:  # a framework iterates the loader itself; its callback watches it first
        counters = timer.watch_dataloader(loader)
        assert counters is not None
        batches = loader
    # The loader raises once it finds the worker's process gone (reaped); the timer reads the
    # figures at once. A worker inside its exit, not yet reapable, is held open in the next test.
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        for _batch in batches:
            with timer.step(), timer.stage(FWD):
                pass
            if loop != "timer.iter":
                counters.consumed += 1
    timer.close()
    (record,) = read_records(tmp_path / "sf")
    figures = record["loader_workers"]["0"]
    assert figures["note"] == "worker(s) 2 exited while in use", figures
    assert figures["consumed"] >= 2


@pytest.mark.skipif(
    EXIT_THREAD is None or not sys.platform.startswith("linux"),
    reason="holds a worker inside its exit with Linux's exit system call",
)
def test_a_worker_held_inside_its_exit_is_named_before_it_can_be_reaped(tmp_path: Path) -> None:
    """The state a dying worker passes through when the loader raises in the training loop
    (its sockets closed, the process not yet one its parent can reap), held open until the
    figures are read: before ``/proc``'s exiting flag was read, such a worker was not named."""
    told_read, told = os.pipe()
    release, release_write = os.pipe()
    dataset = ExitHeldAt(16, at=BATCH + 1, told=told, release=release)  # worker 1's first batch
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=2, multiprocessing_context="fork")
    timer = StageTimer(
        config=TimerConfig(
            window=100, collection=CollectConfig(mode="local", out_dir=tmp_path / "sf", log=False)
        )
    )
    counters = timer.watch_dataloader(loader)
    assert counters is not None
    batches = iter(loader)  # the workers start and take their first batches' indices
    try:
        assert os.read(told_read, 1) == b"1"  # worker 1 is ending its main thread
        worker = counters._procs[1]
        deadline = time.monotonic() + 60
        while _state(worker.pid) != b"Z":  # its main thread has exited
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert worker.is_alive()  # the process is not one its parent can reap yet
        figures = counters.read()
        assert figures["note"] == "worker(s) 1 exited while in use", figures
    finally:
        os.write(release_write, b"1")
        del batches  # the loader's iterator shuts its workers down
        for fd in (told_read, told, release, release_write):
            os.close(fd)
        timer.close()


def _state(pid: int) -> bytes:
    """A process's state letter in ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rsplit(b")", 1)[1].split()[0]


def test_data_that_is_not_a_dataloader_keeps_working_with_a_note(tmp_path: Path) -> None:
    batches = (i for i in range(6))
    figures = _train(tmp_path, batches)
    assert len(figures) == 2
    assert all(
        f == {"note": "data from a generator, not a torch DataLoader: no worker figures"}
        for f in figures
    )


def test_a_loader_without_workers_has_no_figures(tmp_path: Path) -> None:
    records_figures = _train(tmp_path, DataLoader(Samples(12), batch_size=BATCH))
    assert records_figures == [{}]


def test_persistent_workers_started_before_the_timer_are_left_alone(tmp_path: Path) -> None:
    loader = DataLoader(Samples(8), batch_size=BATCH, num_workers=1, persistent_workers=True)
    list(loader)  # the workers start here, before the timer sees the loader
    figures = _train(tmp_path, loader)
    assert figures == [{"note": "its persistent workers started before timer.iter saw the loader"}]


def test_figures_say_saturated_when_the_workers_cannot_keep_up() -> None:
    raw = {"workers": 2, "batches": 10, "busy_s": 1.2, "span_s": 0.6, "consumed": 10}
    # 10 steps of 0.6 s, 0.35 s of them waiting for data: the step needs a batch every 25 ms.
    slow = loader_figures(raw, wall_s=0.6, data_wait_s=0.35, steps=10)
    assert slow["per_batch_s"] == pytest.approx(0.12)
    assert slow["need_every_s"] == pytest.approx(0.025)
    assert slow["busy"] == pytest.approx(1.0)
    assert slow["saturated"] is True and slow["workers_needed"] == 5
    fast = loader_figures({**raw, "busy_s": 0.012}, wall_s=0.6, data_wait_s=0.35, steps=10)
    assert fast["saturated"] is False and fast["busy"] == pytest.approx(0.01)
    assert fast["workers_needed"] == 1


def test_the_counts_travel_on_the_wire_and_malformed_ones_are_rejected(tmp_path: Path) -> None:
    loader = DataLoader(Samples(12), batch_size=BATCH, num_workers=1)
    timer = StageTimer(
        config=TimerConfig(window=100, collection=CollectConfig(log=False)), collector=_Keep()
    )
    for _batch in timer.iter(loader):
        with timer.step(), timer.stage(FWD):
            pass
    timer.close()
    window = timer._collector.windows[0]  # type: ignore[union-attr]
    assert window.loader["batches"] == 3
    data = encode_window(window)
    assert decode_window(data).loader == window.loader
    for bad in ({"batches": -1}, {"busy_s": float("inf")}, {"workers": True}, {"other": 1}):
        tampered = data.replace(
            json.dumps(window.loader).encode(),
            json.dumps(bad).encode().ljust(len(json.dumps(window.loader))),
        )
        with pytest.raises(ReportFormatError):
            decode_window(tampered)


class _Keep:
    rank, world_size = 0, 1

    def __init__(self) -> None:
        self.windows: list[Any] = []

    def submit(self, window: Any) -> bool:
        self.windows.append(window.build())
        return True

    def close(self) -> None:
        pass


def test_the_callbacks_find_the_dataloader_in_what_the_framework_hands_them() -> None:
    loader = DataLoader(Samples(8), batch_size=BATCH, num_workers=1)
    wrapper = SimpleNamespace(base_dataloader=loader)  # Accelerate's DataLoaderShard holds one
    assert train_loader(loader) is loader
    assert train_loader(wrapper) is loader
    # Lightning's trainer.train_dataloader with several loaders: the first DataLoader.
    assert train_loader({"text": [1, 2], "images": [wrapper]}) is loader
    assert train_loader([range(3), loader]) is loader
    numbers = iter(range(3))
    assert train_loader(numbers) is numbers  # not a DataLoader: the timer notes what it is


def test_the_demos_workers_are_watched_as_a_timed_loop_has_them(tmp_path: Path) -> None:
    """``stagefrontier demo`` with DataLoader workers: each window carries the workers' counts,
    as a loop under ``timer.iter`` gives them. Before, the demo made its loader without telling
    the timer: its windows carried no worker figures, and a stall in its workers was judged step
    by step only, never over the workers' bursts."""
    from stagefrontier.demo.faults import FaultInjector
    from stagefrontier.demo.loader import worker_batches
    from stagefrontier.demo.model import CharData

    timer = StageTimer(
        config=TimerConfig(
            window=3, collection=CollectConfig(mode="local", out_dir=tmp_path / "sf", log=False)
        )
    )
    data = CharData("the demo's corpus, short " * 8, seq_len=8, batch_size=2, seed=0)
    batches = worker_batches(data, FaultInjector((), rank=0), 1, 2, 0, timer)
    for _ in range(6):
        with timer.step():
            with timer.stage("data.next_wait"):
                next(batches)
            with timer.stage(FWD):
                pass
    timer.close()
    figures = [r["loader_workers"].get("0", {}) for r in read_records(tmp_path / "sf")]
    assert [f.get("workers") for f in figures] == [2, 2], figures
    assert sum(f["consumed"] for f in figures) == 6, figures
