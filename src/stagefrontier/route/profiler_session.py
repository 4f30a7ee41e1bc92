"""Whether the profiler session running now is still the router's own.

torch runs one profiler session at a time, and a second ``start()`` does not fail: the new
session silently replaces the one running. If the user's code starts its own profiler while a
capture runs, the session belongs to the user from then on; the router stopping it would end the
user's session under them, and torch then crashes in the user's ``export_chrome_trace``
(SIGSEGV, after "disableProfiler called but no active profiling session found").

torch offers no handle on the running session, but every ``torch.profiler.profile`` and
``torch.autograd.profiler.profile`` start passes through ``torch.autograd.profiler``'s
``_run_on_profiler_start`` hook. Wrapping that hook once gives a count of the sessions started
in this process: the router notes the count right after starting its own, and any later count
means another session started since. A session that ended (the user stopped the one that
replaced ours) shows as no profiler enabled.

The capture drives the profiler through ``torch.profiler.profile``, its ``start`` and ``stop``
at the step boundaries the router chose. Private names remain where torch's public API has no
answer: the start hook above (whether a session started since ours),
``torch._C._autograd._profiler_enabled`` (whether any session is running, ours or the user's),
and, for a capture recording the ``record_function`` ranges without the operators (the
default), the scopes argument of ``torch._C._autograd._enable_profiler`` and the prepared
session's ``config``, ``kineto_activities`` and ``_start_trace`` it is reached through. Where a
torch lacks the hook, ``watch`` says so and only a session that ended is seen; where it lacks
the others, the capture records every operator. ``schedule`` and ``on_trace_ready`` do not
replace them: they order one session's own steps and say nothing of another's.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
import time
from typing import Any

from ..reducers import kineto
from ..render.html_page import templates

_lock = threading.Lock()
_started = 0
_installed: bool | None = None  # None: not tried yet; False: this torch has no hook


def _count_start(original: Any) -> Any:
    def counting_start() -> Any:
        global _started
        _started += 1
        return original()

    counting_start.__stagefrontier_counting__ = True  # type: ignore[attr-defined]
    return counting_start


def watch() -> bool:
    """Start counting sessions (once per process); False where this torch has no hook to count
    them with (then only a session that ended is seen)."""
    global _installed
    with _lock:
        if _installed is None:
            import torch.autograd.profiler as autograd_profiler

            hook = getattr(autograd_profiler, "_run_on_profiler_start", None)
            _installed = callable(hook)
            if _installed and not getattr(hook, "__stagefrontier_counting__", False):
                autograd_profiler._run_on_profiler_start = _count_start(hook)
        return _installed


QUIET_KINETO_LOG_LEVEL = "6"
"""Above Kineto's levels for its stage and start/stop lines (read when a profiler starts)."""

ROUTER_EXTRA_MODULES = ("isal.igzip",)
"""The ``router`` extra's module (the export's compressor), imported where installed: imported
at its first use, it would add to the first incident's CPU on the router threads. (msgspec, the
trace reduction's decoder, is imported with the package: the typed records use it.)"""


def warm_up() -> None:
    """Import what a first profiler start imports when nothing did yet (``torch._inductor``,
    which a ``torch.optim`` optimizer or DDP imports anyway: a second or more without them),
    and what the router thread imports (the ``router`` extra's modules and the pages' templates
    among them), and start
    counting sessions. Run where the router is attached (StageTimer's construction), so that
    the first capture does not stall a step.

    Not on a background thread: importing torch's packages on two threads at once can leave
    one half-initialized (``torch.distributed`` then aborts the process when imported again)."""
    import torch._inductor.config
    import torch.distributed  # noqa: F401

    # Kineto prints a start and a stop line on stderr at its default log level; a capture the
    # job did not ask for should not write into its log. A level the user set is kept. Set
    # here, before the router's threads start: setenv while another thread reads the
    # environment (C code's getenv) can crash a process.
    os.environ.setdefault("KINETO_LOG_LEVEL", QUIET_KINETO_LOG_LEVEL)

    for optional in ROUTER_EXTRA_MODULES:
        with contextlib.suppress(ImportError):  # not installed: the standard library serves
            importlib.import_module(optional)
    templates()  # the incident pages' (Jinja2 is imported at the first page otherwise)
    # the decoders of the trace's slice, built before a trace writer forks: not in each child
    kineto._range_decoders()
    watch()


def trace_only_config() -> Any:
    """The profiler's experimental config that makes its stop skip the post-processing a
    capture never reads (the per-event Python records and their tree: only the trace is
    exported, on the router thread), or None where this torch has no such option (the stop
    then does it all on the training thread, as before)."""
    import torch.profiler

    config = getattr(torch.profiler, "_ExperimentalConfig", None)
    try:
        return config(trace_only=True) if config is not None else None
    except TypeError:  # a torch before the option: the keyword is refused
        return None


def capture_profile(record_ops: bool = False) -> Any:
    """A capture's profiler session, not started: CPU, plus CUDA where available, trace-only
    where torch offers it; no shapes, memory, stacks (the Python stack is sampled instead) or
    FLOPs. Its stop, on the training thread, takes time in proportion to the operators
    recorded (see ``docs/router.md``, the cost of a capture): unless ``record_ops``, the
    session records only the ``record_function`` ranges (the steps' and stages' annotations,
    the DataLoader's and the optimizer's ranges), not each operator; the CUDA activity (kernels,
    copies) is recorded either way."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    session = torch.profiler.profile if record_ops else _ranges_only_profile()
    return session(activities=activities, experimental_config=trace_only_config())


@functools.cache
def _ranges_only_profile() -> Any:
    """``torch.profiler.profile`` recording the ``record_function`` ranges and no operator.

    ``torch.profiler`` takes no scopes, but the session it prepares starts by passing its
    config and activities to ``_enable_profiler``, which also takes the scopes its callbacks
    observe: this session's start is that call with the user-scope ranges only. Where this
    torch lacks one of those names, the class is torch's own (every operator recorded)."""
    import torch
    import torch.autograd.profiler as autograd_profiler

    scope = getattr(torch._C._profiler, "RecordScope", None)
    enable: Any = getattr(torch._C._autograd, "_enable_profiler", None)
    if scope is None or enable is None:
        return torch.profiler.profile
    ranges_only = {scope.USER_SCOPE}

    class RangesOnlyProfile(torch.profiler.profile):  # type: ignore[misc]
        def prepare_trace(self) -> None:
            super().prepare_trace()
            session = self.profiler
            if not (hasattr(session, "config") and hasattr(session, "kineto_activities")):
                return  # a session built otherwise: it starts as torch starts it

            def start_ranges_only() -> None:
                autograd_profiler._run_on_profiler_start()
                config = session.config(create_trace_id=False)
                enable(config, session.kineto_activities, ranges_only)
                session.profiling_start_time_ns = time.perf_counter_ns()  # torch's statistic

            session._start_trace = start_ranges_only

    return RangesOnlyProfile


def started() -> int:
    """Profiler sessions started in this process since ``watch()``."""
    return _started


def foreign(mark: int) -> str | None:
    """Why the running session is no longer the one started when ``started()`` was ``mark``;
    None while it is."""
    import torch

    if _started != mark:
        return "the application started its own profiler during the capture"
    if not torch._C._autograd._profiler_enabled():
        return "the profiler session ended under the capture (the application stopped it)"
    return None
