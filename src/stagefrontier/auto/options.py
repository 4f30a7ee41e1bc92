"""The settings of an automatically instrumented run, carried to every worker in its environment.

``stagefrontier run`` writes them into the environment torchrun hands its workers; a launcher
that cannot be wrapped (Slurm ``srun``, a Kubernetes PyTorchJob) sets the same variables
itself. Each worker reads them back with :func:`read_env`:

=============================  ==================================================================
variable                       meaning
=============================  ==================================================================
``STAGEFRONTIER_AUTO``         ``1``: instrument this process's training script (``0``: off)
``STAGEFRONTIER_OUT``          rank 0's output folder (default ``stagefrontier``)
``STAGEFRONTIER_WINDOW``       steps per window (default 100)
``STAGEFRONTIER_ROUTER``       ``1``: the profiler router captures the suspect and a reference
``STAGEFRONTIER_SINKS``        extra sinks, comma-separated: ``csv:PATH``, ``tensorboard[:DIR]``,
                               ``prometheus[:PORT]``
=============================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..collect.settings import MAX_WINDOW
from ..environment import AUTO, auto_env, auto_settings
from ..errors import TimerSettingError

SINK_KINDS = ("csv", "tensorboard", "prometheus")
DEFAULT_OUT = str(AUTO["out"].default)
DEFAULT_WINDOW = int(AUTO["window"].default)


@dataclass(frozen=True)
class AutoOptions:
    """What the automatic hooks build their timer with (see the module doc)."""

    out: str = DEFAULT_OUT
    window: int = DEFAULT_WINDOW
    router: bool = False
    sinks: tuple[str, ...] = field(default=())
    enabled: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.window <= MAX_WINDOW:
            raise TimerSettingError(f"--window must be in [1, {MAX_WINDOW}], got {self.window}")
        for spec in self.sinks:
            kind, _, value = spec.partition(":")
            if kind not in SINK_KINDS:
                raise TimerSettingError(
                    f"--sink {spec!r}: the kind must be one of {', '.join(SINK_KINDS)}"
                )
            if kind == "prometheus" and value and not value.isdigit():
                raise TimerSettingError(f"--sink {spec!r}: the port must be a whole number")

    def env(self) -> dict[str, str]:
        """The variables that carry these options to a worker."""
        return auto_env(
            {
                "switch": "1" if self.enabled else "0",
                "out": self.out,
                "window": str(self.window),
                "router": "1" if self.router else "0",
                "sinks": ",".join(self.sinks),
            }
        )

    def timer_arguments(self) -> tuple[list[Any], Any, dict[str, Any]]:
        """``(sinks, router, timer keywords)`` for ``integrations._timer.TimerArguments`` and
        the framework callbacks."""
        from ..route.router import ProfilerRouter

        router = ProfilerRouter() if self.router else None
        keywords = {"window": self.window, "out_dir": self.out}
        return [make_sink(spec) for spec in self.sinks], router, keywords


def read_env(environ: Mapping[str, str] | None = None) -> AutoOptions:
    """The options in ``environ`` (the process's environment by default); a malformed value
    raises TimerSettingError naming its variable."""
    got = auto_settings(environ)
    try:
        window = int(got.get("window") or DEFAULT_WINDOW)
    except ValueError:
        name = AUTO["window"].name
        raise TimerSettingError(f"{name} must be a whole number, got {got['window']!r}") from None
    return AutoOptions(
        out=got.get("out") or DEFAULT_OUT,
        window=window,
        router=got.get("router", "0") == "1",
        sinks=_split(got.get("sinks", "")),
        enabled=got.get("switch", "1") != "0",
    )


def switched_on(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment switch asks for instrumentation."""
    return auto_settings(environ).get("switch") == "1"


def make_sink(spec: str) -> Any:
    """The sink a ``--sink`` spec names: ``csv:PATH``, ``tensorboard[:DIR]`` or
    ``prometheus[:PORT]``."""
    from .. import sinks

    kind, _, value = spec.partition(":")
    if kind == "csv":
        return sinks.CsvSink(value or "stagefrontier.csv")
    if kind == "tensorboard":
        return sinks.TensorBoardSink(value or None)
    return sinks.PrometheusSink(int(value)) if value else sinks.PrometheusSink()


def _split(text: str) -> tuple[str, ...]:
    return tuple(part for part in (p.strip() for p in text.split(",")) if part)


def sink_list(specs: Sequence[str]) -> tuple[str, ...]:
    """``--sink`` given several times, each possibly comma-separated, as one tuple."""
    return tuple(part for spec in specs for part in _split(spec))
