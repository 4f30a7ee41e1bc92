"""Stage names and the ordered schema that every rank and every window must share."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

from ..errors import StageNamesError

SCHEMA_VERSION = 1

DATA_STAGE = "data.next_wait"
FORWARD_STAGE = "model.fwd_loss_cpu_wall"
BACKWARD_STAGE = "model.backward_cpu_wall"
CALLBACKS_STAGE = "callbacks.cpu_wall"
OPTIMIZER_STAGE = "optim.step_cpu_wall"
RESIDUAL_STAGE = "step.other_cpu_wall"
COMMUNICATION_PREFIXES = ("pp.", "dp.", "tp.", "ep.", "cp.")
"""A stage named after a parallelism dimension holds that dimension's communication, so time in
it may be a wait for other ranks: ``pp.schedule`` or ``pp.recv_wait`` for the other pipeline
stages (other roles), ``dp.grad_sync`` for the data-parallel replicas."""
"""Step wall time not covered by any timed stage; computed, never timed by the user."""

STEP_ANNOTATION = "stagefrontier.step"
"""Name of the profiler/NVTX range ``StageTimer(annotate=True)`` emits per step, as
``stagefrontier.step#<global step>``; the trace reducers recognize it (bare or numbered)."""

_RANGE_SAFE = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\", "%"}
r"""What a profiler trace carries in a range name as it is: printable ASCII but ``"`` and ``\``
(Kineto writes the first unescaped and turns the second into ``/``; it writes a name holding a
control or non-ASCII character as "unknown") and ``%``, the escape character."""


def range_name(stage: str) -> str:
    r"""The name a stage's profiler and NVTX ranges carry: the stage's own name when a trace
    keeps it as it is (printable ASCII but ``"``, ``\`` and ``%``), else the name with each
    other character written as its UTF-8 bytes, ``%XX`` each (``"fwd\x07"`` -> ``"fwd%07"``).
    ``stage_of_range`` reads it back; the trace readers do, so a stage's range is found whatever
    characters its name holds."""
    if all(ch in _RANGE_SAFE for ch in stage):
        return stage
    return "".join(
        ch if ch in _RANGE_SAFE else "".join(f"%{b:02X}" for b in ch.encode("utf-8", "replace"))
        for ch in stage
    )


def stage_of_range(name: str) -> str:
    """The stage name a range name stands for (``range_name`` undone); any name that is not
    such an encoding (``"50%"``, ``"a%41"``: ``range_name`` writes neither) is its own."""
    if "%" not in name:
        return name
    try:
        stage = unquote(name, errors="strict")
    except UnicodeDecodeError:
        return name
    return stage if range_name(stage) == name else name


DEFAULT_STAGES: tuple[str, ...] = (
    DATA_STAGE,
    FORWARD_STAGE,
    BACKWARD_STAGE,
    CALLBACKS_STAGE,
    OPTIMIZER_STAGE,
    RESIDUAL_STAGE,
)

_SUBSTAGE = re.compile(r"^(?P<base>.+)\[(?P<index>\d+)\]$")


def semantic_stage(name: str) -> str:
    """The broad stage an accumulation-indexed substage belongs to: ``"x[2]" -> "x"``."""
    match = _SUBSTAGE.match(name)
    return match.group("base") if match else name


def microstep_index(name: str) -> int | None:
    """The accumulation index of a substage name, or None for a plain stage."""
    match = _SUBSTAGE.match(name)
    return int(match.group("index")) if match else None


def expand_microsteps(stages: Sequence[str], factor: int) -> tuple[str, ...]:
    """Ordered substages for gradient accumulation: each stage but the residual, per microstep.

    The microsteps run in order, so all stages of microstep 0 come before those of microstep 1;
    the residual closes the whole optimizer step and stays a single stage at the end.
    """
    if factor < 1:
        raise StageNamesError(f"accumulation factor must be >= 1, got {factor}")
    timed = [s for s in stages if s != RESIDUAL_STAGE]
    expanded = [f"{s}[{i}]" for i in range(factor) for s in timed]
    if RESIDUAL_STAGE in stages:
        expanded.append(RESIDUAL_STAGE)
    return tuple(expanded)


def check_stage_names(stages: Iterable[str], expected: int | None = None) -> tuple[str, ...]:
    """Validate an ordered stage list and return it as a tuple of str.

    Raises StageNamesError for a non-string name, an empty name, a duplicate, an empty list, a
    length that does not match ``expected`` (the stage axis of the matrix), a single string, or
    a set (its iteration order is arbitrary, and the order is the schema). Any other iterable,
    a generator included, is read once.
    """
    if isinstance(stages, str):
        raise StageNamesError("stages must be a sequence of names, not a single string")
    if isinstance(stages, (set, frozenset)):
        raise StageNamesError(
            "stages must be an ordered sequence (list or tuple), not a set: the stage order is "
            "the schema, and a set's order changes from run to run"
        )
    names = tuple(stages)
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise StageNamesError(
                f"stage name at position {i} must be a non-empty str, got {name!r}"
            )
    if not names:
        raise StageNamesError("stage list is empty")
    if expected is not None and len(names) != expected:
        raise StageNamesError(
            f"{len(names)} stage names given but the matrix has {expected} stages (last axis)"
        )
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise StageNamesError(f"duplicate stage name {name!r}: stage names must be unique")
        seen.add(name)
    return names


def stage_order_hash(stages: Sequence[str], version: int = SCHEMA_VERSION) -> str:
    """A short stable hash of the schema version and ordered stage list.

    Two ranks may only be merged into one frontier when their hashes agree.
    """
    text = f"v{version}\n" + "\n".join(stages)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
