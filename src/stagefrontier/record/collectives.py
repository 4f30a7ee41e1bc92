"""Always-on timing of the collectives a training step issues: DDP's gradient buckets.

``StageTimer.watch_ddp(model)`` puts a timed communication hook on a
``DistributedDataParallel`` model. Each bucket the hook sees inside a recorded step is logged
with the step, when the rank reached the bucket and when it issued the collective (offsets from
the step's start on the rank's own clock), the collective's size, the ordered stage open on the
training thread, and the rank's wait: from the issue until the collective's future completed (a
done callback on that future). The hook the user registers, before or after ``watch_ddp``
through ``register_comm_hook`` (fp16 compression, PowerSGD, their own), runs inside the timed
hook, which counts from its call until the future the user's hook returns completes; without
one, the timed hook runs DDP's default all-reduce (``allreduce_hook``, what DDP does itself).

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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..analysis.collectives import DEFAULT_FAMILY
from ..failures import say_failed

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
OWN_CALLS = "the program's own torch.distributed calls are not timed (only DDP's buckets)"
MAX_KEYS = 4096
"""Distinct (family, bucket, stage, call, size) keys a rank keeps per window; more are counted
as untimed (a bucket layout that changes every step)."""


class CollectiveLog:
    """One rank's timed collectives of the open window (see the module doc)."""

    def __init__(self, timer: Instrumentation) -> None:
        self._timer = timer
        self._done: list[tuple[int, tuple[str, int, str | None, int, int], int, int, int]] = []
        self._step = -1
        self._seen: dict[tuple[str, int], int] = {}  # calls of (family, bucket) in this step
        self.untimed: list[str] = [OWN_CALLS]
        self._said: set[tuple[str, str]] = set()

    def note(self, reason: str) -> None:
        if reason not in self.untimed:
            self.untimed.append(reason)

    def issued(self, family: str, bucket: Any, reached_ns: int, future: Any) -> Any:
        """A bucket's collective was issued now (its hook was called at ``reached_ns``): the
        future to hand DDP, which logs the collective as ``future`` completes and then yields
        its value. Outside a recorded step nothing is logged (``future`` itself)."""
        try:
            where = self._timer.open_step()
            if where is None:
                return future
            issued_ns = _now()
            step, start_ns, stage = where
            index = int(bucket.index())
            if step != self._step:
                self._step = step
                self._seen.clear()
            call = self._seen.get((family, index), 0)
            self._seen[(family, index)] = call + 1
            buffer = bucket.buffer()
            key = (family, index, stage, call, int(buffer.numel() * buffer.element_size()))
            reached = (reached_ns - start_ns) // US
            done = self._done

            def completed(fut: Any) -> Any:
                done.append((step, key, reached, (issued_ns - start_ns) // US, _now() - issued_ns))
                return fut.value()

            return future.then(completed)
        except Exception as exc:  # a bucket or future of another kind: not timed, said once
            say_failed(logger, "timing a DDP bucket", exc, "that bucket is not timed", self._said)
            self.note(f"some DDP buckets not timed: {type(exc).__name__}")
            return future

    def drain(self, last_step: int) -> dict[str, Any]:
        """The window's timed collectives, those of steps up to ``last_step``, in the window
        record's form: ``keys`` ``[family, bucket, stage, call, bytes]``, ``calls`` ``[step,
        key, reached_us, issued_us, wait_us]`` and the ``untimed`` reasons."""
        done = self._done
        taken = done[: len(done)]
        del done[: len(taken)]
        keys: dict[tuple[str, int, str | None, int, int], int] = {}
        calls = []
        for item in taken:
            step, key, reached, issued, wait_ns = item
            if step > last_step:  # completed early for a later window: keep it
                done.append(item)
                continue
            if key not in keys and len(keys) >= MAX_KEYS:
                self.note(f"more than {MAX_KEYS} distinct collectives in a window: some dropped")
                continue
            index = keys.setdefault(key, len(keys))
            calls.append([step, index, reached, issued, wait_ns // US])
        return {
            "keys": [list(key) for key in keys],
            "calls": calls,
            "untimed": list(self.untimed),
        }


def timed_hook(log: CollectiveLog, inner: list[Any]) -> Callable[..., Any]:
    """The hook DDP calls for each bucket: it runs ``inner`` (``[hook, state, family]``, set
    again when the user registers a hook later) and logs the bucket. Its signature carries no
    annotations: DDP checks any it finds against its own types."""

    def stagefrontier_timed_hook(state, bucket):  # type: ignore[no-untyped-def]
        reached = _now()
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
            log.note(DEVICE_COMPLETION.format(backend=backend))
            logger.warning("stagefrontier: %s", log.untimed[-1])
            return False
        inner: list[Any] = [default_hooks.allreduce_hook, model.process_group, DEFAULT_FAMILY]
        hook = timed_hook(log, inner)
        if getattr(model, "_comm_hooks", None):
            log.note(EARLY_HOOK)
            logger.warning("stagefrontier: %s", EARLY_HOOK)
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
