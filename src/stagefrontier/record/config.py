"""A timer's configuration: one tree of frozen dataclasses, checked when it is built.

``StageTimer(config=TimerConfig(...))`` takes the whole tree::

    TimerConfig                      stages, window, enabled, strict, annotate, roles
    ├── sampling=SamplingConfig      the CUDA-event sampling of the forward region
    ├── collection=CollectConfig     how windows reach rank 0, where the results go (its sinks,
    │                                gates and regression settings)
    └── router=ProfilerRouter        the profiler router's settings (off when None)

The timer's flat keywords of earlier releases (``StageTimer(stages, window=50, out_dir=...)``)
still build the same tree, through :func:`config_from_keywords`, for one release: each use warns
with the field that replaces it (``DEPRECATED``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..analysis.schema import DEFAULT_STAGES, RESIDUAL_STAGE, check_stage_names
from ..collect.config import CollectConfig, collect_config
from ..collect.settings import (
    MAX_WINDOW,
    check_flag,
    check_int,
    check_number,
    check_optional_callable,
    check_optional_text,
)
from ..errors import RolesError, StageFrontierError, TimerSettingError
from .instrumentation import Instrumentation


class AttachedRouter(Protocol):
    """A router started for one timer: while a capture is armed or runs, the step context
    calls ``on_step`` at a step's start, ``on_step_started`` once its live clock runs and
    ``on_step_end`` once the clock stopped at its end; ``pause`` calls
    ``on_pause``; the timer's ``close`` closes it, waiting at most ``join_s`` for its thread
    (``process_ends``: on another thread than the training one, as the process ends by a signal;
    a running capture is then dropped, the profiler left untouched)."""

    def on_step(self, step: int) -> None: ...

    def on_step_started(self) -> None: ...

    def on_step_end(self) -> None: ...

    def on_pause(self, step: int) -> None: ...

    def close(self, join_s: float, process_ends: bool = False) -> None: ...


class Router(Protocol):
    """What ``TimerConfig.router`` holds (a ``stagefrontier.ProfilerRouter``): the router lives
    on a floor above the recorder, which only calls what it is given."""

    def attach(self, timer: Instrumentation) -> AttachedRouter: ...


@dataclass(frozen=True)
class SamplingConfig:
    """CUDA-event sampling of the forward region (``timer.cuda_event_sample``).

    Attributes:
        cuda_event_fraction: fraction of steps whose forward region is bracketed by CUDA events
            (0 turns the sampling off).
        event_factory: callable returning a CUDA-event-like object (``record``, ``query``,
            ``elapsed_time``); None means ``torch.cuda.Event(enable_timing=True)``.
    """

    cuda_event_fraction: float = 0.0
    event_factory: Any = None

    def __post_init__(self) -> None:
        fraction = check_number("cuda_event_fraction", self.cuda_event_fraction, 0.0, 1.0)
        object.__setattr__(self, "cuda_event_fraction", fraction)
        check_optional_callable("event_factory", self.event_factory)


@dataclass(frozen=True)
class TimerConfig:
    """Everything a :class:`~stagefrontier.StageTimer` is built with (see the module doc).

    Attributes:
        stages: ordered stage names; the six defaults unless given. The residual
            ``step.other_cpu_wall`` is always last and computed, never timed.
        window: steps per window, 1 to 1,000,000 (the buffer is preallocated).
        sampling: the CUDA-event sampling (off by default).
        collection: how windows reach rank 0's analysis and where the results go: the mode,
            ``out_dir``, timeouts, extra sinks, gates, regression settings and the log line.
        router: a ``stagefrontier.ProfilerRouter``: an actionable window makes the suspect
            rank and a reference rank capture a profiler trace of a few steps (docs/router.md).
        enabled: False gives a timer whose contexts do nothing.
        strict: raise ContractViolation instead of counting (for tests and development).
        annotate: also emit every step and ordered stage as a ``torch.profiler.record_function``
            range (and an NVTX range when CUDA is available) named like the stage, so a trace
            taken while the timer runs carries the stage boundaries. Off by default: it costs a
            few microseconds per context.
        role: this rank's role (e.g. pipeline stage) for role-aware analysis.
        mesh: a ``DeviceMesh``; with ``role_dims``, this rank's role is its coordinate on those
            dimensions (``mesh=mesh, role_dims=("pp",)`` gives ``pp0``, ``pp1``, ...), and the
            analysis knows every role of the job. Give ``role`` or ``mesh``, not both.
        role_dims: the mesh dimensions that define a role.

    A setting of the wrong type or out of its range raises
    :class:`~stagefrontier.TimerSettingError` naming it.
    """

    stages: tuple[str, ...] = DEFAULT_STAGES
    window: int = 100
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    collection: CollectConfig = field(default_factory=CollectConfig)
    router: Router | None = None
    enabled: bool = True
    strict: bool = False
    annotate: bool = False
    role: str | None = None
    mesh: Any = None
    role_dims: tuple[str, ...] = ("pp",)

    def __post_init__(self) -> None:
        stages = tuple(check_stage_names(self.stages))
        if not any(s != RESIDUAL_STAGE for s in stages):
            raise StageFrontierError("at least one timed stage is needed besides the residual")
        object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "window", check_int("window", self.window, 1, MAX_WINDOW))
        for name, cls in (("sampling", SamplingConfig), ("collection", CollectConfig)):
            if not isinstance(getattr(self, name), cls):
                raise TimerSettingError(f"{name} must be a {cls.__name__}")
        if self.router is not None and not callable(getattr(self.router, "attach", None)):
            raise TimerSettingError(f"router must be a ProfilerRouter, got {self.router!r:.60}")
        for name in ("enabled", "strict", "annotate"):
            check_flag(name, getattr(self, name))
        check_optional_text("role", self.role)
        if self.role is not None and self.mesh is not None:
            raise RolesError("give StageTimer a role or a mesh to read it from, not both")
        object.__setattr__(self, "role_dims", tuple(self.role_dims))

    @property
    def timed_stages(self) -> tuple[str, ...]:
        """The stages the timer times: all but the computed residual."""
        return tuple(s for s in self.stages if s != RESIDUAL_STAGE)


DEPRECATED: dict[str, str] = {
    "stages": "stages",
    "window": "window",
    "collect": "collection",
    "out_dir": "collection.out_dir",
    "collect_timeout_s": "collection.timeout_s",
    "queue_size": "collection.queue_size",
    "sinks": "collection.sinks",
    "gates": "collection.gates",
    "log": "collection.log",
    "cuda_event_fraction": "sampling.cuda_event_fraction",
    "event_factory": "sampling.event_factory",
    "enabled": "enabled",
    "strict": "strict",
    "role": "role",
    "mesh": "mesh",
    "role_dims": "role_dims",
    "annotate": "annotate",
    "router": "router",
}
"""StageTimer's keywords of earlier releases, each with the TimerConfig field that replaces it."""
_COLLECTION = tuple(k for k, f in DEPRECATED.items() if f.startswith("collection."))
_SAMPLING = tuple(k for k, f in DEPRECATED.items() if f.startswith("sampling."))


def config_from_keywords(keywords: Mapping[str, Any]) -> TimerConfig:
    """The TimerConfig that StageTimer's keywords of earlier releases (``DEPRECATED``) describe.
    A keyword it does not know raises TypeError, as a call would; ``collect`` and the flat
    collection keywords combine as before (``collect.config.collect_config``)."""
    unknown = sorted(set(keywords) - set(DEPRECATED))
    if unknown:
        raise TypeError(f"StageTimer got an unexpected keyword argument {unknown[0]!r}")
    config = TimerConfig()
    flat = {k: keywords[k] for k in _COLLECTION if k in keywords}
    if "collect" in keywords or flat:
        collection = collect_config(keywords.get("collect", "auto"), flat)
        config = replace(config, collection=collection)
    sampling = {k: keywords[k] for k in _SAMPLING if k in keywords}
    if sampling:
        config = replace(config, sampling=SamplingConfig(**sampling))
    rest = {k: v for k, v in keywords.items() if k not in (*_COLLECTION, *_SAMPLING, "collect")}
    if rest.get("stages", ()) is None:  # None meant the defaults
        rest["stages"] = DEFAULT_STAGES
    return replace(config, **rest)


def warn_deprecated(keywords: Sequence[str], stacklevel: int) -> None:
    """One DeprecationWarning for StageTimer's ``keywords`` of earlier releases, naming the
    TimerConfig field that replaces each."""
    fields = ", ".join(f"{k} -> TimerConfig.{DEPRECATED.get(k, k)}" for k in keywords)
    warnings.warn(
        f"StageTimer's keywords are deprecated and go in the next release: give "
        f"StageTimer(config=TimerConfig(...)) ({fields})",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )
