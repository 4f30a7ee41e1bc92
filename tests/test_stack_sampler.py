"""The stack sampler's thread never keeps the sampled thread's objects alive.

A frame held by the sampling thread keeps its function's locals (a training loop's model, its
DataLoader and their tensors) alive after the function returned; they were then freed on the
sampling thread when it ended, which at interpreter shutdown aborted the process ("terminate
called without an active exception": freeing a tensor releases the GIL and cannot take it back
during finalization). Seen on captured ranks of the Lightning and Hugging Face router jobs."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

import pytest

from stagefrontier.route.stack_sampler import StackSampler, _sample, stack_events


class Held:
    """Stands for a training loop's model: something a frame's locals own."""


def _loop(seconds: float, sampler: StackSampler, refs: list[weakref.ref[Held]]) -> None:
    held = Held()
    refs.append(weakref.ref(held))
    sampler.begin()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_returned_function_s_locals_are_freed_on_its_own_thread() -> None:
    sampler = StackSampler(interval_s=0.001)
    refs: list[weakref.ref[Held]] = []
    try:
        _loop(0.1, sampler, refs)
        sampled = sampler.end()
        assert sampled.samples, "the sampler took no sample in 0.1 s"
        # The function returned: nothing but its frame held ``held``; the sampler took frames of
        # it while it ran, and must have dropped them.
        gc.disable()  # a frame is freed by its reference count, not by a collection
        try:
            assert refs[0]() is None, "the sampling thread still holds the sampled frame"
        finally:
            gc.enable()
    finally:
        sampler.close()


def test_close_ends_the_sampling_thread() -> None:
    before = {t.ident for t in threading.enumerate()}
    sampler = StackSampler()
    started = [t for t in threading.enumerate() if t.ident not in before]
    assert len(started) == 1
    sampler.begin()
    time.sleep(0.02)
    sampler.end()
    sampler.close()
    assert not started[0].is_alive()


def test_no_collection_runs_inside_a_sample() -> None:
    """Reading a thread's frames allocates, and a collection run inside the read (its
    finalizers and callbacks run Python, and may hand the GIL to the sampled thread) lets that
    thread pop the frames being walked: on Python 3.11 a rank died of SIGSEGV in the sampler.
    The sampler pauses the collector while it reads. With a threshold of one allocation a
    collection would start at nearly every allocation of a sample; none may."""
    seen: list[int] = []  # when each collection started

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(time.time_ns())

    ident = threading.get_ident()
    threshold = gc.get_threshold()
    inside = 0  # collections started while a sample was read
    gc.callbacks.append(note)
    gc.set_threshold(1)
    try:
        for _ in range(200):
            before = len(seen)
            sample = _sample(ident)
            inside += len(seen) - before
            assert sample is not None
            [object() for _ in range(10)]  # allocations between samples do collect
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(note)
    assert seen, "no collection ran between the samples"
    assert inside == 0, f"{inside} collections ran inside a sample"


@pytest.mark.parametrize("collecting", [True, False])
def test_a_sample_puts_back_the_switch_interval_and_the_collector(collecting: bool) -> None:
    """The sampler raises the switch interval and pauses the collector while it reads a stack
    (both process-wide): the user's settings come back exactly, sample after sample (Python
    keeps whole microseconds and reads 249 back as a float that, set again, is 248), and a
    disabled collector stays so."""
    switch_s = sys.getswitchinterval()
    was_enabled = gc.isenabled()
    sys.setswitchinterval(0.0002495)
    users = sys.getswitchinterval()
    if not collecting:
        gc.disable()
    try:
        for _ in range(3):
            assert _sample(threading.get_ident()) is not None
        assert sys.getswitchinterval() == users
        assert gc.isenabled() is collecting
    finally:
        sys.setswitchinterval(switch_s)
        if was_enabled:
            gc.enable()


def _waits_for(entered: threading.Event, released: threading.Event) -> None:
    """Stands for a stalled user function: it waits with the GIL released."""
    entered.set()
    released.wait(60)


def test_a_collection_on_another_thread_is_charged_to_the_stack_read_after_it() -> None:
    """A collection on another thread holds the GIL until it ends, and the sampled thread
    cannot move meanwhile. The sampler's collection callback reads no frame (it runs inside the
    collection, at any allocation of that thread: reading frames there is what crashed); it
    stamps the start, and the next regular sample is stamped there. One regular sample before
    the function is entered, one while it still waits (a 2 s interval): the function's time
    must cover the collection."""
    sampler = StackSampler(interval_s=2.0)
    started: list[int] = []
    taken: list[tuple[int, int]] = []  # samples before and just after the collection

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and threading.current_thread().name == "collector":
            started.append(time.time_ns())

    entered, released = threading.Event(), threading.Event()

    def collect() -> None:
        entered.wait(60)
        before = len(sampler._samples)
        gc.collect()
        taken.append((before, len(sampler._samples)))
        deadline = time.monotonic() + 60
        while len(sampler._samples) < 2 and time.monotonic() < deadline:  # the next regular one
            time.sleep(0.01)
        released.set()

    try:
        sampler.begin()
        deadline = time.monotonic() + 30
        while not sampler._samples and time.monotonic() < deadline:  # the first regular sample
            time.sleep(0.001)
        gc.callbacks.append(note)  # after the sampler's: called after it
        collector = threading.Thread(target=collect, name="collector")
        collector.start()
        _waits_for(entered, released)
        collector.join()
        sampled = sampler.end()
    finally:
        if note in gc.callbacks:
            gc.callbacks.remove(note)
        sampler.close()
    assert started, "no collection ran on the collecting thread"
    assert taken and taken[0][0] == taken[0][1], "a sample was read inside the collection"
    waited = [e for e in stack_events(sampled, 0) if e["name"].endswith(": _waits_for")]
    assert waited, "the function waited in during the collection was never sampled"
    assert waited[0]["ts"] * 1e3 <= started[0]


def test_a_cut_never_waits_for_the_sampling_thread() -> None:
    """The sampling thread holds its lock while it reads a stack, and on a busy machine the
    kernel may preempt it there. A cut (the training thread, as a captured step's range closes)
    must not wait for it: the wait stretched the live step after its range had closed, and the
    trace disagreed with the live record (a share differing by 0.16 on 35 ms steps). Here
    another thread holds the sampler's lock until the cut is done."""
    sampler = StackSampler(interval_s=1.0)
    holding, cut_done = threading.Event(), threading.Event()
    released_by_cut: list[bool] = []

    def hold() -> None:
        with sampler._wake:
            holding.set()
            released_by_cut.append(cut_done.wait(60))

    try:
        sampler.begin()
        holder = threading.Thread(target=hold)
        holder.start()
        holding.wait(60)
        sampler.cut()
        cut_done.set()
        holder.join()
        sampled = sampler.end()
    finally:
        sampler.close()
    assert released_by_cut == [True], "the cut waited for the thread holding the sampler's lock"
    stamps = [at_ns for at_ns, _, _ in sampled.samples]
    assert stamps == sorted(stamps) and any(not stack for _, stack, _ in sampled.samples)


def test_a_sample_read_after_a_cut_starts_after_it() -> None:
    """A sample is stamped before its stack is read, and a cut (which waits for nothing) can
    come in between: the stack read is then the next step's, and must not open inside the step
    the cut closed."""
    sampler = StackSampler(interval_s=1.0)
    try:
        sampler.begin()
        stamped = _sample(threading.get_ident())  # stamped here, before the cut
        assert stamped is not None
        sampler.cut()
        sampler._keep(stamped)  # as the sampling thread keeps it, its stack read after the cut
        sampled = sampler.end()
    finally:
        sampler.close()
    order = [bool(stack) for _, stack, _ in sampled.samples]
    cut_at = order.index(False)
    kept_at = next(i for i, (_, stack, _) in enumerate(sampled.samples) if stack is stamped[1])
    assert kept_at > cut_at, sampled.samples
