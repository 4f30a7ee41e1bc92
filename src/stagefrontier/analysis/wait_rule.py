"""The between-step wait rule, shared by the recorder and the trace reducers.

``timer.iter``, ``timer.fetch`` and the framework callbacks measure the wait for a batch outside
any stage context: between two steps, or inside a step when the loop prefetches the next batch
at its end. The wait belongs to the step that consumes the batch, the next step to begin after
the wait: it becomes that step's data stage, that step's wall time is extended back over it, and
a wait made inside a step is taken out of that step's wall time (the recorder does this in
``StageTimer._charge_fetch`` and ``TimerState._begin_hooks``). One exception: a wait made inside
an accumulation microstep (``timer.microstep(k)``) with no stage open, as loops that fetch the
next microstep's batch between forward and backward do, is charged to that microstep's own data
stage (``name[k]``) and stays in its step's wall time, so each microstep carries its own wait.

While a rank captures a profiler trace, each such wait is also a range named
``<stage>@step#<N>`` (``wait_range_name``), where N is the consuming step as the recorder computes
it (``consuming_step``). The reducers charge these ranges with ``charge_waits``: to step N,
whichever step range they fall in, so a reduced trace and the live matrix agree by construction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .schema import range_name

WAIT_MARK = "@step#"


def consuming_step(next_step: int, inside_step: bool, in_microstep: bool = False) -> int:
    """The step a wait is charged to. ``next_step`` is the recorder's step index (the open step
    inside a step, the next one between steps); a wait made inside a step is the next step's,
    except one made inside an accumulation microstep, which is that microstep's own."""
    return next_step + 1 if inside_step and not in_microstep else next_step


def wait_range_name(stage: str, step: int) -> str:
    """``data.next_wait@step#17``: the wait for the batch step 17 consumes (the stage's part as
    ``schema.range_name`` writes it)."""
    return f"{range_name(stage)}{WAIT_MARK}{step}"


def parse_wait_range(name: str) -> tuple[str, int] | None:
    """``(stage, step)`` of a wait range's name, None for any other name."""
    stage, mark, tail = name.rpartition(WAIT_MARK)
    if not mark or not stage or not tail.isdigit():
        return None
    return stage, int(tail)


def charge_waits(
    step_ids: Sequence[int],
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    waits: Sequence[tuple[int, int, int]],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]:
    """Charge wait ranges ``(step id, start, duration)`` to their steps (``starts`` sorted).

    Returns the wait per step (to add to its data stage), the change of each step's wall time
    (the consuming step's grows by the wait; the step whose range holds the wait's start loses
    it; a microstep's own wait, inside its step's range, changes nothing), and how many waits
    name a step that has no range here (left out: the capture began after it, or it ended
    first)."""
    position = {step: i for i, step in enumerate(step_ids)}
    charged = np.zeros(len(step_ids), dtype=np.int64)
    wall = np.zeros(len(step_ids), dtype=np.int64)
    unmatched = 0
    for step, start, dur in waits:
        row = position.get(step)
        holder = int(np.searchsorted(starts, start, side="right")) - 1
        within = holder >= 0 and start < ends[holder]
        if within and holder == row:  # already inside the step's own wall time
            charged[row] += dur
            continue
        if within:
            wall[holder] -= dur
        if row is None:
            unmatched += 1
            continue
        charged[row] += dur
        wall[row] += dur
    return charged, wall, unmatched
