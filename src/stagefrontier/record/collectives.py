"""Always-on timing of the collectives a training step issues: DDP's gradient buckets.

``StageTimer.watch_ddp(model)`` puts a timed communication hook on a
``DistributedDataParallel`` model. Each bucket the hook sees inside a recorded step is logged
with the step, when the rank reached the bucket and when it issued the collective (offsets from
the step's start on the rank's own clock), the collective's size, the ordered stage open on the
training thread, how long the training thread had waited for a CPU since it last reached the
same collective (``record.run_queue``), and the rank's wait: from the issue until the
collective's future completed (a done callback on that future). The hook the user registers,
before or after ``watch_ddp`` through ``register_comm_hook`` (fp16 compression, PowerSGD, their
own), runs inside the timed hook, which counts from its call until the future the user's hook
returns completes; without one, the timed hook runs DDP's default all-reduce
(``allreduce_hook``, what DDP does itself).

Only a Gloo group's buckets are timed: NCCL (and other device backends) complete the future on
the host as soon as the collective is queued on the device, so its wait is not visible there;
such a model is left as it is and the window record says so.

Nothing here blocks or raises into the training loop: a failure to wrap or to time a bucket is
one line in the log and a reason in the window record (``untimed``), and training goes on.
The window's log is drained at the hand-off, on the training thread; the done callbacks append
from the communication thread (a list append, atomic under the GIL).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..analysis.collective_names import DEFAULT_FAMILY, OWN_PREFIX
from ..failures import say_failed
from .run_queue import RunQueueClock

if TYPE_CHECKING:
    from .instrumentation import Instrumentation

logger = logging.getLogger("stagefrontier")

_now = time.perf_counter_ns
US = 1000

EARLY_HOOK = (
    "DDP buckets not timed: a communication hook was registered before watch_ddp could put its "
    "timed hook in place (call timer.watch_ddp(model) before register_comm_hook)"
)
DEVICE_COMPLETION = (
    "DDP buckets not timed: the {backend} backend completes a collective's future on the host "
    "once the collective is queued on the device, so the host cannot see how long it waited"
)
OWN_CALLS = "the program's own torch.distributed calls are not timed outside timer.collective(name)"
Opened = tuple[int, tuple[str, int, "str | None", int, int], int, int, "int | None"]
"""A collective reached inside a step: the step, its key, the step's start, the arrival and the
run-queue wait since the previous arrival (None where unread)."""
MAX_KEYS = 4096
"""Distinct (family, bucket, stage, call, size) keys a rank keeps per window; more are counted
as untimed (a bucket layout that changes every step)."""


class CollectiveLog:
    """One rank's timed collectives of the open window (see the module doc)."""

    def __init__(self, timer: Instrumentation) -> None:
        self._timer = timer
        self._done: list[
            tuple[int, tuple[str, int, str | None, int, int], int, int, int, int | None]
        ] = []
        self._step = -1
        self._seen: dict[tuple[str, int, str | None], int] = {}  # counts in this step
        self.untimed: list[str] = [OWN_CALLS]
        self._said: set[tuple[str, str]] = set()
        self._watched: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._watched_ids: dict[int, bool] = {}  # for objects without weak references
        self.run_queue = RunQueueClock()  # started and stopped by the timer's steps

    def watched_once(self, target: Any, watch: Callable[[], bool]) -> bool:
        """``watch()``'s answer for ``target``, computed the first time only (a model or
        optimizer watched twice is wrapped once and gets the first answer again)."""
        try:
            known = self._watched.get(target)
        except TypeError:
            known = self._watched_ids.get(id(target))
        if known is not None:
            return known
        answer = watch()
        try:
            self._watched[target] = answer
        except TypeError:
            self._watched_ids[id(target)] = answer
        return answer

    def note(self, reason: str) -> None:
        if reason not in self.untimed:
            self.untimed.append(reason)

    def said(self, reason: str) -> None:
        """``reason`` noted in the record and warned once."""
        if reason not in self.untimed:
            logger.warning("stagefrontier: %s", reason)
            self.note(reason)

    def opened(
        self,
        family: str,
        nbytes: int,
        bucket: int | None = None,
        reached: tuple[int, int | None] | None = None,
    ) -> Opened | None:
        """A collective reached now (or as ``reached`` says: when, and the run-queue wait since
        the previous arrival), inside a recorded step (None outside one, or when the log
        cannot key it): hand it to ``closed`` when it completes. Without a ``bucket``, it is
        numbered by its order among its family's collectives in the stage this step."""
        where = self._timer.open_step()
        if where is None:
            return None
        reached_ns, queued_ns = (_now(), None) if reached is None else reached
        step, start_ns, stage = where
        if step != self._step:
            self._step = step
            self._seen.clear()
        if bucket is None:  # the n-th of its family in this stage
            bucket = self._seen.get((family, -1, stage), 0)
            self._seen[(family, -1, stage)] = bucket + 1
        call = self._seen.get((family, bucket, stage), 0)
        self._seen[(family, bucket, stage)] = call + 1
        if reached is None:
            queued_ns = self.run_queue.since_last((family, bucket, stage, call))
        return step, (family, bucket, stage, call, nbytes), start_ns, reached_ns, queued_ns

    def closed(self, opened: Opened, issued_ns: int | None = None) -> None:
        """The collective ``opened`` completed now (issued at ``issued_ns``, else when it was
        reached): its wait counts from the issue."""
        step, key, start_ns, reached_ns, queued_ns = opened
        issued_ns = reached_ns if issued_ns is None else issued_ns
        reached, issued = (reached_ns - start_ns) // US, (issued_ns - start_ns) // US
        self._done.append((step, key, reached, issued, _now() - issued_ns, queued_ns))

    def completes(self, opened: Opened | None, work: Any) -> None:
        """``closed(opened)`` when ``work`` (a ``torch.distributed`` Work, or None for a call
        that returned complete) completes."""
        if opened is None:
            return
        if work is None:
            self.closed(opened)
            return
        work.get_future().add_done_callback(lambda _: self.closed(opened))

    def queued_since_last(self, where: tuple[int, Any]) -> int | None:
        """``run_queue.since_last`` for a DDP model's bucket (``where``: the model's hook list's
        id and the bucket); None where the bucket does not say its index."""
        try:
            return self.run_queue.since_last((where[0], int(where[1].index())))
        except Exception:  # a bucket of another kind: its collective is said untimed in issued
            return None

    def issued(self, family: str, bucket: Any, reached: tuple[int, int | None], future: Any) -> Any:
        """A bucket's collective was issued now (its hook was called as ``reached`` says: when,
        and the run-queue wait since the hook's previous call for that bucket): the future to
        hand DDP, which logs the collective as ``future`` completes and then yields its value.
        Outside a recorded step nothing is logged (``future`` itself)."""
        try:
            issued_ns = _now()
            buffer = bucket.buffer()
            size = int(buffer.numel() * buffer.element_size())
            opened = self.opened(family, size, int(bucket.index()), reached)
            if opened is None:
                return future
            log = self

            def completed(fut: Any) -> Any:
                log.closed(opened, issued_ns)
                return fut.value()

            return future.then(completed)
        except Exception as exc:  # a bucket or future of another kind: not timed, said once
            self.failed("a DDP bucket", exc)
            return future

    def failed(self, what: str, exc: Exception) -> None:
        """Timing one collective failed: said once, noted in the record, training goes on."""
        say_failed(logger, f"timing {what}", exc, "it is not timed", self._said)
        self.note(f"some collectives not timed ({what}): {type(exc).__name__}")

    def drain(self, last_step: int) -> dict[str, Any]:
        """The window's timed collectives, those of steps up to ``last_step``, in the window
        record's form: ``keys`` ``[family, bucket, stage, call, bytes]``, ``calls`` ``[step,
        key, reached_us, issued_us, wait_us, queued_us]`` (``queued_us``, the run-queue wait
        since the collective's previous arrival, left off where unread), the
        ``untimed`` reasons and ``run_queue_us``, how long this thread waited for a CPU over
        the window's recorded steps (None when unknown)."""
        waited = self.run_queue.take()
        if self.run_queue.reason is not None:
            self.note(self.run_queue.reason)
        done = self._done
        taken = done[: len(done)]
        del done[: len(taken)]
        keys: dict[tuple[str, int, str | None, int, int], int] = {}
        calls = []
        for item in taken:
            step, key, reached, issued, wait_ns, queued_ns = item
            if step > last_step:  # completed early for a later window: keep it
                done.append(item)
                continue
            if key not in keys and len(keys) >= MAX_KEYS:
                self.note(f"more than {MAX_KEYS} distinct collectives in a window: some dropped")
                continue
            index = keys.setdefault(key, len(keys))
            call = [step, index, reached, issued, wait_ns // US]
            calls.append(call if queued_ns is None else [*call, queued_ns // US])
        return {
            "keys": [list(key) for key in keys],
            "calls": calls,
            "untimed": list(self.untimed),
            "run_queue_us": None if waited is None else waited // US,
        }


class OwnCollective:
    """``timer.collective(name)``: the program's own collective inside the block, timed from
    the block's start to its end (a blocking call, or an asynchronous one and its ``wait``) as
    the collective ``name``, numbered by its order among the blocks of that name in the stage
    and step. A block that raises is not logged."""

    def __init__(self, log: CollectiveLog, name: str, nbytes: int) -> None:
        self._log, self._name, self._nbytes = log, OWN_PREFIX + name, nbytes
        self._opened: Opened | None = None

    def __enter__(self) -> None:
        self._opened = self._log.opened(self._name, self._nbytes)

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is None and self._opened is not None:
            self._log.closed(self._opened)
        self._opened = None


def timed_hook(log: CollectiveLog, inner: list[Any]) -> Callable[..., Any]:
    """The hook DDP calls for each bucket: it runs ``inner`` (``[hook, state, family]``, set
    again when the user registers a hook later) and logs the bucket. Its signature carries no
    annotations: DDP checks any it finds against its own types."""

    def stagefrontier_timed_hook(state, bucket):  # type: ignore[no-untyped-def]
        reached = _now(), log.queued_since_last((id(inner), bucket))
        hook, hook_state, family = inner
        return log.issued(family, bucket, reached, hook(hook_state, bucket))

    return stagefrontier_timed_hook


def watch_ddp(log: CollectiveLog, model: Any) -> bool:
    """Put the timed hook on ``model`` (a DistributedDataParallel) and route its
    ``register_comm_hook`` and ``register_builtin_comm_hook`` through it. Returns whether the
    buckets are timed; when not, the reason is in the log's ``untimed`` and said once."""
    try:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        backend = str(dist.get_backend(model.process_group))
        if backend != "gloo":
            log.said(DEVICE_COMPLETION.format(backend=backend))
            return False
        inner: list[Any] = [default_hooks.allreduce_hook, model.process_group, DEFAULT_FAMILY]
        hook = timed_hook(log, inner)
        if getattr(model, "_comm_hooks", None):
            log.said(EARLY_HOOK)
            return False
        model.register_comm_hook(None, hook)
    except Exception as exc:
        say_failed(logger, "watching the DDP model's buckets", exc, "they are not timed")
        log.note(f"DDP buckets not timed: {type(exc).__name__}")
        return False
    _route_registration(model, inner)
    return True


def _route_registration(model: Any, inner: list[Any]) -> None:
    """The user's later ``register_comm_hook(state, hook)`` runs ``hook`` inside the timed
    one; a built-in hook type runs as its Python twin. A second registration raises as DDP's
    own does."""
    from torch.distributed import BuiltinCommHookType
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    registered: list[bool] = []

    def register_comm_hook(state: object, hook: Callable[..., Any]) -> None:
        model._check_comm_hook(hook)
        if registered:
            raise RuntimeError(
                "register_comm_hook or register_builtin_comm_hook can only be called once."
            )
        registered.append(True)
        inner[:] = [hook, state, getattr(hook, "__name__", type(hook).__name__)]

    def register_builtin_comm_hook(comm_hook_type: Any) -> None:
        twins = {
            BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
            BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
        }
        register_comm_hook(model.process_group, twins[comm_hook_type])

    model.register_comm_hook = register_comm_hook
    model.register_builtin_comm_hook = register_builtin_comm_hook
