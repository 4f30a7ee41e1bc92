"""The performance gate of ``stagefrontier compare --fail-above``: is NEW slower than BASE by
more than a stated bar, beyond the two runs' step-to-step noise, and where did the time go?

Three outcomes, each with its exit status:

- **fail** (1): a stage grew beyond its even share of NEW's step by more than the bar (a share
  of BASE's median step, or milliseconds, the larger when both are given) and the noise of its
  own steps (``beyond_even_share``: the rest of the step's growth is the machine's), whatever
  the whole step's median did: that median carries every stage's noise, and on a busy machine
  the other ranks' work fills a rank's wait, so it can hide a stall its stage shows plainly.
  Or the median of NEW's per-step exposed times lies above BASE's by more than the bar and
  stands above ``NOISE_FACTOR`` standard errors (``noise.median_shift``, each side's spread
  from its median absolute deviation) on a rank slower in every stage than the others. Medians
  of the steps, not means: one step a busy host preempted moves a mean by its whole length, and
  a median not at all.
  A slowdown past the bar and the noise spread evenly over every stage and rank fails too,
  unless the host signals of the two runs show the machine changed in a way that accounts for
  it (``machine_change``): a larger model or a slower kernel everywhere slows every stage alike
  on an unchanged machine.
- **pass** (0): no stage grew beyond its even share, and the shift stays at or under the bar,
  or it is past the bar but the growth is spread over the ranks
  (``regression_spread.rank_spread``) or inside the steps' noise, and the host signals say the
  machine changed (a CPU-burning neighbour, another run on the host, a hypervisor or quota
  taking CPU time) or are missing (folders written before they were recorded: the reason says
  so); ``strict`` refuses there.
- **not comparable** (3): the sides cannot be judged: different world sizes or stage schemas,
  fewer than ``MIN_STEPS`` steps a side, or, when ``strict``, a slowdown past the bar that
  the gate reads as the machine's (the reason says which, and how many steps a side would
  resolve a shift inside the noise).

The failing line's attribution is ``compare``'s exact split of the mean change: the stages that
grew, largest first, until they hold most of the growth, each with its share of the change and
the ranks whose own time in it grew.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import StageFrontierError
from .accounting import FloatArray, advances
from .compare import Comparison, Side
from .machine_change import MachineChange, host_reading, machine_change
from .noise import block_means, mean_shift, median_shift
from .regression import BLOCK_STEPS
from .regression_spread import rank_spread
from .semantic import stage_groups

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_NOT_COMPARABLE = 3

NOISE_FACTOR = 3.0
"""How many standard errors of the shift of medians a slowdown must clear."""
MIN_STEPS = 8
"""The fewest steps a side may hold: a median and its spread from fewer mean little."""
NAMED_SHARE = 0.8
"""The grown stages named are the fewest, largest first, that hold this share of the growth."""
MAX_STAGES = 3
RANK_SHARE = 0.5
"""A rank is named with a stage when its own growth there is at least this share of the
largest rank's."""

MS = 1e3

_PERCENT = re.compile(r"^\+?(?P<value>\d+(?:\.\d+)?)\s*%?$")


def parse_percent(text: str) -> float:
    """``10%``, ``+10%`` or ``10`` as 10.0; raises StageFrontierError on anything else."""
    match = _PERCENT.match(text.strip())
    if not match or float(match["value"]) <= 0:
        raise StageFrontierError(
            f"--fail-above {text!r}: expected a positive percentage such as 10% or +10%"
        )
    return float(match["value"])


@dataclass(frozen=True)
class Threshold:
    """The bar a slowdown must pass: a percentage of BASE's median step, milliseconds, or both
    (then the larger of the two)."""

    percent: float | None = None
    ms: float | None = None

    def __post_init__(self) -> None:
        if self.percent is None and self.ms is None:
            raise StageFrontierError("a gate needs --fail-above PCT or --fail-above-ms MS")
        if self.ms is not None and not (self.ms > 0 and math.isfinite(self.ms)):
            raise StageFrontierError(f"--fail-above-ms {self.ms!r}: expected a positive number")

    def bar_ms(self, base_median_ms: float) -> float:
        bars = [self.ms or 0.0]
        if self.percent is not None:
            bars.append(self.percent / 100 * base_median_ms)
        return max(bars)

    def __str__(self) -> str:
        parts = [f"{self.percent:g}%"] if self.percent is not None else []
        if self.ms is not None:
            parts.append(f"{self.ms:g} ms")
        return " and ".join(parts)


@dataclass(frozen=True)
class Growth:
    """A stage that grew: its change of mean advance (ms/step), its exact share of the change
    of mean exposed time, and the ranks whose own time in it grew (rank, ms/step)."""

    stage: str
    delta_ms: float
    share: float
    ranks: tuple[tuple[int, float], ...]
    every_rank: bool = False
    """Every rank of a multi-rank job grew in it alike (a slower host, or a heavier step, looks
    like this; a straggler does not)."""


@dataclass(frozen=True)
class Verdict:
    """The gate's outcome (``status`` is the exit status) and what it rests on."""

    status: int
    reason: str
    """Why, in one clause: the bar and noise met or missed, or why the sides are not comparable."""
    threshold: Threshold
    base_steps: int
    new_steps: int
    base_median_ms: float = math.nan
    new_median_ms: float = math.nan
    shift_ms: float = math.nan
    bar_ms: float = math.nan
    noise_ms: float = math.nan
    growth: tuple[Growth, ...] = field(default=())
    whole_job: bool = False
    """The shift is past the bar, but spread over every stage (and the ranks): the machine's."""
    machine: MachineChange | None = None
    """What the host signals say of an even slowdown past the bar; None when not asked or
    missing."""
    host_signals_missing: bool = False
    """An even slowdown past the bar whose sides carry no host signals."""

    @property
    def outcome(self) -> str:
        return {EXIT_PASS: "pass", EXIT_FAIL: "fail"}.get(self.status, "not comparable")

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "exit_status": self.status,
            "reason": self.reason,
            "threshold": {"percent": self.threshold.percent, "ms": self.threshold.ms},
            "base_steps": self.base_steps,
            "new_steps": self.new_steps,
            "base_median_ms_per_step": _finite(self.base_median_ms),
            "new_median_ms_per_step": _finite(self.new_median_ms),
            "median_shift_ms": _finite(self.shift_ms),
            "bar_ms": _finite(self.bar_ms),
            "noise_ms": _finite(self.noise_ms),
            "whole_job": self.whole_job,
            "machine": None if self.machine is None else self.machine.to_dict(),
            "host_signals_missing": self.host_signals_missing,
            "grew": [
                {
                    "stage": g.stage,
                    "delta_ms_per_step": g.delta_ms,
                    "share_of_change": g.share,
                    "ranks": [{"rank": r, "delta_ms_per_step": ms} for r, ms in g.ranks],
                    "every_rank": g.every_rank,
                }
                for g in self.growth
            ],
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def comparable(base: Side, new: Side, stages: Sequence[str] | None) -> str:
    """Why the two sides cannot be judged (empty when they can): what ``compare`` would refuse,
    and sides too short to hold a median and its spread."""
    if base.d.shape[1] != new.d.shape[1]:
        return (
            f"world sizes differ ({base.d.shape[1]} ranks in BASE, {new.d.shape[1]} in NEW): "
            "a step of another world size is another job"
        )
    if stages is None and base.stages != new.stages:
        return (
            f"stage schemas differ ({', '.join(base.stages)} vs {', '.join(new.stages)}): "
            "name the stages both runs have with --stages"
        )
    for name, side in (("BASE", base), ("NEW", new)):
        if stages is not None and any(s not in side.stages for s in stages):
            absent = [s for s in stages if s not in side.stages]
            return f"{name} has no stage {', '.join(absent)}"
        if side.d.shape[0] < MIN_STEPS:
            return (
                f"{name} holds {side.d.shape[0]} steps, too few to resolve any bar "
                f"(at least {MIN_STEPS} a side)"
            )
    return ""


def refused(reason: str, threshold: Threshold, base: Side, new: Side) -> Verdict:
    """The verdict on sides that ``comparable`` refused."""
    return Verdict(EXIT_NOT_COMPARABLE, reason, threshold, base.d.shape[0], new.d.shape[0])


def exposed_ms(side: Side) -> FloatArray:
    """The side's per-step exposed time in milliseconds (its stage advances summed)."""
    out: FloatArray = advances(side.d).sum(axis=1) * MS
    return out


def judge(c: Comparison, threshold: Threshold, strict: bool = False) -> Verdict:
    """The gate's verdict on a comparison of two comparable sides (``strict``: refuse, rather
    than pass, a slowdown past the bar that reads as the whole machine's)."""
    before, after = exposed_ms(c.base), exposed_ms(c.new)
    base_median = float(np.median(before))
    bar = threshold.bar_ms(base_median)
    diff = median_shift(before, after, bar, NOISE_FACTOR)
    noise = diff.noise_s
    measured = Verdict(
        EXIT_PASS,
        f"within the {threshold} bar ({bar:.1f} ms)",
        threshold,
        before.size,
        after.size,
        base_median_ms=base_median,
        new_median_ms=float(np.median(after)),
        shift_ms=diff.shift_s,
        bar_ms=bar,
        noise_ms=noise,
    )
    past = f"past the {threshold} bar ({bar:.1f} ms)"
    # A stage's own growth is judged first, whatever the whole step's median did: on a busy
    # machine the steps' noise is many times a stall, and while one rank waits the others' work
    # fills the time they would have spent waiting for a core, so the step's median may move
    # less than the stall (or not at all) while the stage's blocks hold it to a few ms.
    stage = beyond_even_share(c, bar)
    if stage is not None:
        name, excess = stage
        if diff.shift_s > bar:
            reason = f"{past}, and {name} grew beyond its even share by more than the bar"
        else:
            reason = (
                f"{name} grew beyond its even share by {excess:.1f} ms/step, {past} and its "
                "own noise, though the median step moved less (the steps' noise, or other "
                "ranks' work filling the wait on a busy machine, hides it there)"
            )
        return replace(measured, status=EXIT_FAIL, reason=reason, growth=grown_stages(c))
    if diff.shift_s <= bar:
        return measured
    spread = rank_spread(c, int(c.base.d.shape[1]))[0]
    if diff.stands_out and not spread:
        reason = f"{past} and the steps' noise ({noise:.1f} ms), on a rank slower in every stage"
        return replace(measured, status=EXIT_FAIL, reason=reason, growth=grown_stages(c))
    machine = machine_change(
        host_reading(c.base.host_signals),
        host_reading(c.new.host_signals),
        base_median,
        measured.new_median_ms,
        bar,
    )
    # NEW's steps at BASE's CPU per wall second: what the code alone made of them.
    code = (
        diff if machine is None else median_shift(before, after * machine.scale, bar, NOISE_FACTOR)
    )
    if machine is not None and not machine.explained and (diff.stands_out or code.stands_out):
        clears = diff if diff.stands_out else code
        beside = "" if diff.stands_out else ", at BASE's CPU per wall second,"
        reason = (
            f"{past} and{beside} the steps' noise ({clears.noise_s:.1f} ms): every stage "
            f"{'and rank ' if spread else ''}grew, and the machine did not change "
            f"({_host_text(machine)})"
        )
        return replace(
            measured, status=EXIT_FAIL, reason=reason, growth=grown_stages(c), machine=machine
        )
    where = "every stage and rank" if spread else "every stage, inside the steps' noise"
    reason = (
        f"{past} but spread evenly over {where}: the whole job slowed alike, as on a busier or "
        "slower machine, not in any stage of the code"
    )
    if machine is None:
        reason += (
            "; the host signals are missing (runs recorded before they were kept), so a "
            "slower machine cannot be told from slower code"
        )
    elif machine.explained:
        reason += f"; the machine changed ({_host_text(machine)})"
    else:
        reason = (
            f"{past} but spread evenly over every stage, inside the steps' noise ({noise:.1f} "
            f"ms) also at BASE's CPU per wall second; the machine did not change "
            f"({_host_text(machine)})"
        )
    measured = replace(measured, machine=machine, host_signals_missing=machine is None)
    if not strict:
        return replace(measured, reason=reason, whole_job=True)
    if not diff.stands_out:
        needed = _steps_needed(diff.shift_s, noise, c)
        reason += f" (about {needed} steps a side would tell it from the noise)"
    return replace(
        measured, status=EXIT_NOT_COMPARABLE, reason=f"{reason}; --strict", whole_job=True
    )


def _host_text(machine: MachineChange) -> str:
    return (
        f"{machine.signals}; the CPU time per step accounts for {machine.code_ms:+.1f} ms of "
        f"the shift, the machine for {machine.machine_ms:+.1f} ms"
    )


def beyond_even_share(c: Comparison, floor_ms: float) -> tuple[str, float] | None:
    """The stage that grew most beyond its even share of NEW's step, by more than ``floor_ms``
    and ``NOISE_FACTOR`` standard errors, with that excess in ms/step; None when every stage
    grew (or shrank) with the step.

    A stage's even share scales its BASE advance by how much the rest of the step grew (never
    below its BASE advance: a rest that shrank is faster code, not a faster machine): a busier
    machine slows every stage alike, so the rest of the step measures it, and a stage's own
    regression (however large a share of the step it holds) stays out of its own yardstick.
    Judged on means over blocks of ``BLOCK_STEPS`` steps (a DataLoader's batches come in bursts),
    accumulation substages together as their broad stage."""
    before, now = advances(c.base.d), advances(c.new.d)
    best: tuple[float, str] | None = None
    for members in stage_groups(c.stages)[1]:
        was, grown = before[:, members].sum(axis=1), now[:, members].sum(axis=1)
        rest_before = float(before.sum(axis=1).mean() - was.mean())
        rest_now = float(now.sum(axis=1).mean() - grown.mean())
        # a rest of the step that got faster is the code's doing, not a faster machine: the
        # stage keeps its own BASE time as its yardstick then
        machine = max(1.0, rest_now / rest_before) if rest_before > 0 else 1.0
        excess = mean_shift(
            block_means(was * machine, BLOCK_STEPS),
            block_means(grown, BLOCK_STEPS),
            floor_ms / MS,
            NOISE_FACTOR,
        )
        if excess.stands_out:
            growth = now[:, members].mean(axis=0) - before[:, members].mean(axis=0)
            stage = c.stages[members[int(np.argmax(growth))]]
            best = max(best or (excess.shift_s, stage), (excess.shift_s, stage))
    return None if best is None else (best[1], best[0] * MS)


def _steps_needed(shift: float, noise: float, c: Comparison) -> int:
    """Steps a side at which this shift would clear the noise (noise falls as one over the
    square root of the steps, both sides grown alike)."""
    steps = max(int(c.base.d.shape[0]), int(c.new.d.shape[0]))
    return math.ceil(steps * (noise / shift) ** 2) + 1


def grown_stages(c: Comparison) -> tuple[Growth, ...]:
    """The fewest stages, largest growth first, holding ``NAMED_SHARE`` of the stages' growth
    (at most ``MAX_STAGES``), each with its exact share of the change of mean exposed time and
    the ranks whose own time in it grew most."""
    deltas = c.delta_advance_ms
    grew = sorted((s for s in deltas if deltas[s] > 0), key=lambda s: -deltas[s])
    total = sum(deltas[s] for s in grew)
    change = c.delta_exposed_ms
    named: list[Growth] = []
    held = 0.0
    for stage in grew[:MAX_STAGES]:
        ranks = _ranks(c, stage)
        share = deltas[stage] / change if change else 0.0
        every = len(ranks) == len(c.rank_deltas) > 1
        named.append(Growth(stage, deltas[stage], share, ranks, every))
        held += deltas[stage]
        if held >= NAMED_SHARE * total:
            break
    return tuple(named)


def _ranks(c: Comparison, stage: str) -> tuple[tuple[int, float], ...]:
    rows = [(int(r["rank"]), float(r["delta_ms"])) for r in c.stage_rank_deltas(stage)]
    grew = [(r, ms) for r, ms in rows if ms > 0]
    if not grew:
        return ()
    top = grew[0][1]
    return tuple((r, ms) for r, ms in grew if ms >= RANK_SHARE * top)
