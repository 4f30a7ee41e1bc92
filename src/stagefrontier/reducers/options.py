"""How a trace is reduced: one options record shared by every reducer.

``reduce_kineto(path, ranks={...}, align="strict")`` and
``reduce_kineto(path, options=TraceOptions(ranks={...}, align="strict"))`` are the same call: the
keyword form is folded into a ``TraceOptions`` by ``trace_options``, which refuses a keyword the
record does not have, and an option that the called reducer does not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ..analysis.schema import STEP_ANNOTATION
from .errors import TraceFormatError
from .files import RankMap

STEP_SOURCES = ("auto", "profiler", "annotation")
"""``auto``: ``ProfilerStep#N`` ranges when the trace has any, else the step annotation."""
ALIGN_MODES = ("intersect", "strict")
MISSING_RANK_MODES = ("error", "allow")
MISSING_STAGE_MODES = ("error", "zero")


@dataclass(frozen=True)
class TraceOptions:
    """Options of a trace reduction; every one has the default the reducers document.

    Attributes:
        ranks: explicit rank per file (path or file name -> rank); wins over what the file says.
        world_size: the job's world size; by default what the traces state (Nsight: unknown).
        step_name: the step annotation used when the trace has no ``ProfilerStep#N``.
        step_source: ``auto``, ``profiler`` or ``annotation``.
        align: ``intersect`` keeps the step ids every rank holds (noted), ``strict`` refuses
            ranks with different step ids.
        missing_ranks: ``error``, or ``allow`` to analyze the ranks present (noted; the analyzer
            downgrades its labels).
        missing_stages: ``error``, or ``zero`` to accept a stage with no range on a rank.
        process_ranks: Nsight only: pid -> rank, for one report holding several training
            processes.
        ns_rounding: HTA only: keep HTA's rounding of event times to whole microseconds.
    """

    ranks: RankMap | None = None
    world_size: int | None = None
    step_name: str = STEP_ANNOTATION
    step_source: str = "auto"
    align: str = "intersect"
    missing_ranks: str = "error"
    missing_stages: str = "error"
    process_ranks: Mapping[int, int] | None = None
    ns_rounding: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (
            ("step_source", STEP_SOURCES),
            ("align", ALIGN_MODES),
            ("missing_ranks", MISSING_RANK_MODES),
            ("missing_stages", MISSING_STAGE_MODES),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise TraceFormatError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")


ONLY_FOR = {"process_ranks": "reduce_nsys", "ns_rounding": "reduce_hta"}
"""Options that one reducer alone reads."""

_NAMES = frozenset(f.name for f in fields(TraceOptions))


def trace_options(
    reducer: str, options: TraceOptions | None, keywords: Mapping[str, Any]
) -> TraceOptions:
    """``options`` (or the defaults) with ``keywords`` applied, for the reducer named ``reducer``.

    Raises:
        TypeError: a keyword that is no option, or an option ``reducer`` does not read (set to
            anything but its default), as Python reports an unexpected keyword argument.
    """
    unknown = sorted(set(keywords) - _NAMES)
    if unknown:
        raise TypeError(f"{reducer}() got an unexpected keyword argument {unknown[0]!r}")
    merged = replace(options or TraceOptions(), **keywords)
    defaults = TraceOptions()
    for name, owner in ONLY_FOR.items():
        if owner != reducer and getattr(merged, name) != getattr(defaults, name):
            raise TypeError(f"{reducer}() does not read {name!r}: only {owner}() does")
    return merged
