"""Live regression check on rank 0: is this window slower than the run's recent healthy windows,
and which stage's exposed time grew?

Rule (docs/regressions.md): the baseline is the last ``baseline_windows`` healthy windows.
Once it holds ``min_baseline`` windows, a new window regresses when the median of its per-step
exposed times exceeds the baseline's median by more than both ``min_increase`` of that median
and ``noise_factor`` standard errors of the difference of the two medians (each step's spread
estimated robustly as 1.4826 x the baseline's median absolute deviation; the standard error of
a median of n steps is about 1.2533 x spread / sqrt(n)). Medians make a few slow steps (a
checkpoint, a GC pause) harmless; the relative floor keeps a very steady run from alarming on
small shifts. An increase above the threshold is flagged at once when it is more than twice the
threshold, else only when the window before was above the threshold too: one slow window on a
busy machine is noise, two in a row or a large jump is news. Only windows at or below the
threshold join the baseline, so a window that a slowdown starts inside does not soften it for
the next ones; after ``baseline_windows`` windows in a row above it, those windows become the
baseline (a lasting change is reported for that long, then taken as the new normal); the
baseline follows the run's phases and pauses (``analysis.baseline_phases``), and may roll
(``RegressionConfig.rolling``). A regression is split exactly into stage advance changes
with ``analysis.compare``.

A flagged regression is then placed (``kind``). It is a ``stage`` regression when one stage's
mean advance per step grew beyond its even share of the slowdown (its baseline advances scaled
by the ratio of the mean steps) by at least ``min_increase`` of the baseline's median step and
by more than ``noise_factor`` standard errors of the difference of the means, taken over blocks
of ``BLOCK_STEPS`` steps (``analysis.noise.mean_shift``: means, because a stall that falls on
one step in a few moves a mean, not a median), and that excess is at least ``LOCALIZED_SHARE``
of the most it could be: the window's mean increase times the part of the baseline step the
stage did not already hold (a stall in a stage that held most of the step leaves the others
little share to give up) (accumulation substages ``name[i]`` are judged
together, as their broad stage); that stage is the top stage (with substages, the one that grew
most), unless the ranks show a neighbour's slowdown (``regression_spread.spread_beyond_stage``:
every rank grew in that stage and, materially, outside its own largest stage too): then it is the
whole job's. Otherwise every stage grew with the step. That is a ``whole_job`` slowdown (a noisy
neighbour, CPU throttling, a slower shared filesystem or network), reported as such and never
worth a trace of one rank, only when it is spread over the ranks as well: more than half of
them (two at least) grew outside their own largest stage by half the most any rank did, or
every rank by a tenth of it (a neighbour burning CPU slows every rank unevenly)
(``regression_spread.rank_spread``; from node summaries, which keep only the top stage's
largest rank means, more than half the ranks grew in the top stage by half the most any
did). A rank slower in every stage than the others (a stall in every microstep of its data
wait, a straggler host) holds them up only in the collectives they meet it in, where their own
growth then sits: it is a ``stage`` regression of a stage that rank grew in beyond the others,
when its lead over the others there grew by the margin a stage's own growth must clear
(``min_increase`` of the baseline's median step and ``noise_factor`` standard errors over blocks
of steps); else the whole job's (a busy machine slows the ranks unevenly).

A flagged window whose increase does not also stand out of the baseline windows' wander
(``noise.window_wander``, ``WANDER_SIGMAS`` of it) is a ``whole_job`` slowdown whatever its
stages say (``within_wander``): on a busy machine a window of short steps runs faster or slower
as a whole with other jobs' load, and one stage of some ranks then grows beyond its share by
chance (a run of 5 ms steps read a 5.8 ms window against a 4.4 ms one as a 33% regression of one
rank's backward and opened an incident). The flag itself is unchanged: a whole-job line is what
such a window is.

A window collected as node summaries (``check_summary``) is checked by the same rule on the same
numbers: its per-step exposed times and stage advances come from the summary's frontier, which
node summaries combine exactly (to their stated rounding). Which ranks grew needs each rank's
own time in the stage, which stays on its node; the summary keeps per stage the ``top_k``
largest rank means and the smallest. A rank is named when its growth is proven: its mean now
minus an upper bound of its baseline mean (its own where it was among the largest of every
baseline window, else that window's smallest kept value) reaches half the stage's delta; every
rank grew when the smallest mean now exceeds the largest baseline mean by that much. The deltas
listed (the ``top_k`` slowest ranks now) are lower bounds; ``rank_deltas_exact`` says when every
one is exact (each rank was kept in every baseline window, as when the summaries keep every
rank).

While the baseline fills (fewer than ``min_baseline`` windows), its first windows may be a
warm-up (compilation, cold caches: two to ten times slower). A new window that the baseline so
far would count as slower than itself, by the same rule with the two sides swapped, shows that
those windows were a warm-up: they leave the baseline, which starts again from the new window.
A window above the threshold of a baseline still filling is held out of it, and flagged only
when it exceeds twice the threshold and the window before it was above too (never on a first
jump), so that a slowdown right after a warm-up is caught.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from operator import attrgetter
from typing import Any

import numpy as np

from ..errors import StageFrontierError
from .accounting import FloatArray, advances, advances_from_frontier, frontier
from .baseline_phases import CHANGED_INSIDE, Marks, PhaseBaselines
from .compare import Side, compare
from .noise import block_means, mean_shift, median_shift, window_wander
from .regression_spread import rank_spread, spread_beyond_stage, spread_over_ranks
from .semantic import stage_groups
from .summary import WindowSummary

BLOCK_STEPS = 4
"""Steps per block when a stage's growth is judged against the steps' noise: a DataLoader with
up to 4 workers hands its batches over together, so its wait falls on one step in a few."""
LOCALIZED_SHARE = 0.5
"""The least part of the most a stage's growth beyond its even share could be (the window's
increase times the baseline step's share the stage did not hold) that it must reach for the
regression to be that stage's rather than the whole job's."""
WHOLE_JOB = "whole_job"
STAGE = "stage"
STEAL_SHARE = 0.05
"""CPU steal at or above this share of the CPU time is named as a cause."""


@dataclass(frozen=True)
class RegressionConfig:
    """When a window counts as slower than the run's recent healthy windows."""

    baseline_windows: int = 5
    min_baseline: int = 2
    min_increase: float = 0.15
    noise_factor: float = 4.0
    follow_phases: bool = True
    """Keep a baseline per phase the user names, start it again after paused steps and when
    the step's make-up changes (``analysis.baseline_phases``); False: one baseline for the
    whole run, as before."""
    rolling: bool = False
    """Every window joins the baseline, a flagged one too, so the baseline is always the last
    ``baseline_windows`` windows: a lasting change is reported for a few windows, not
    ``baseline_windows``, at the cost of a slow drift going unreported."""

    def __post_init__(self) -> None:
        if self.baseline_windows < 1 or not 1 <= self.min_baseline <= self.baseline_windows:
            raise StageFrontierError(
                "RegressionConfig needs baseline_windows >= 1 and "
                "1 <= min_baseline <= baseline_windows"
            )
        if self.min_increase < 0 or self.noise_factor < 0:
            raise StageFrontierError("RegressionConfig thresholds must be >= 0")


DEFAULT_REGRESSION = RegressionConfig()
"""What collectors use unless told otherwise (``regression=None`` turns the check off)."""


MS = 1e3


@dataclass(frozen=True)
class _Healthy:
    """What the check keeps of a window: the ranks' window ``d`` (flat), or the summary's
    frontier and rank means (node summaries)."""

    window: int
    exposed: FloatArray
    n_ranks: int
    d: FloatArray | None = None
    summary: WindowSummary | None = None
    above: bool = False
    """Above the threshold when checked (a rolling baseline keeps such windows too): left out
    of the baseline's wander, which a regression's own windows would widen."""

    @cached_property
    def mix(self) -> FloatArray:
        """The window's mean frontier advance per stage (``[S]`` seconds)."""
        return np.asarray(_entry_advances(self).mean(axis=0), dtype=np.float64)


class RegressionCheck:
    """Keeps the baseline and checks each window against it; one per run, on rank 0."""

    def __init__(self, config: RegressionConfig | None = None) -> None:
        self.config = config or RegressionConfig()
        self._phases: PhaseBaselines[_Healthy] = PhaseBaselines(self.config.baseline_windows)
        self._stages: tuple[str, ...] | None = None
        self.restarted: str | None = None
        """Why the last window checked started a new baseline (``analysis.baseline_phases``:
        a new phase, paused steps, a changed make-up of the step), or None."""

    @property
    def _healthy(self) -> deque[_Healthy]:
        return self._phases.healthy

    @property
    def _above(self) -> list[_Healthy]:
        """The windows in a row above the threshold, latest last."""
        return self._phases.above

    def check(
        self, window: int, d: FloatArray, stages: Sequence[str], marks: Marks = None
    ) -> dict[str, Any] | None:
        """The ``regression`` object for this window, or None; the window joins the baseline
        when it is not a regression. A change of schema or rank count restarts the baseline.
        ``marks``: the window's phase, whether the phase changed inside it and whether it
        holds paused steps (``analysis.baseline_phases``)."""
        entry = _Healthy(window, frontier(d)[:, -1], d.shape[1], d=d)
        return self._check(entry, tuple(stages), marks)

    def check_summary(
        self, window: int, summary: WindowSummary, marks: Marks = None
    ) -> dict[str, Any] | None:
        """``check`` for a window collected as node summaries (see the module docstring)."""
        entry = _Healthy(window, summary.top_prefix[:, -1, 0], summary.n_ranks, summary=summary)
        return self._check(entry, summary.stages, marks)

    def _check(
        self, entry: _Healthy, names: tuple[str, ...], marks: Marks
    ) -> dict[str, Any] | None:
        first = self._healthy[0] if self._healthy else None
        if (
            self._stages != names
            or (first is not None and first.n_ranks != entry.n_ranks)
            or (first is not None and (first.d is None) != (entry.d is None))
        ):
            self._phases.forget()
            self._stages = names
        self.restarted = None
        if self.config.follow_phases:
            self.restarted = self._phases.enter(marks, entry, attrgetter("mix"))
            if self.restarted == CHANGED_INSIDE:  # compared with nothing, joins nothing
                return None
        found, above = self._regression(entry, names)
        if self.config.rolling:
            self._healthy.append(replace(entry, above=above))
        if not above:
            if not self.config.rolling:
                self._healthy.append(entry)
            self._above.clear()
            return found
        self._above.append(entry)
        if len(self._above) == self.config.baseline_windows:
            # A level that held for a whole baseline's worth of windows is the run's new normal:
            # later windows are compared with it (this window still reports its regression).
            self._healthy.clear()
            self._healthy.extend(self._above)
            self._above.clear()
        return found

    def reference(self, stages: Sequence[str], n_ranks: int) -> tuple[FloatArray, list[int]] | None:
        """Each rank's median stage durations over the healthy windows (``[R, S]`` seconds) and
        the windows (first, last) they come from, as a no-stall reference for the direct gains;
        None until the baseline holds ``min_baseline`` windows of this schema and rank count."""
        healthy = [h.d for h in self._healthy if h.d is not None]
        if (
            len(healthy) < self.config.min_baseline
            or self._stages != tuple(stages)
            or healthy[0].shape[1] != n_ranks
        ):
            return None
        d = np.concatenate(healthy)
        return np.median(d, axis=0), [self._healthy[0].window, self._healthy[-1].window]

    def _regression(
        self, entry: _Healthy, stages: tuple[str, ...]
    ) -> tuple[dict[str, Any] | None, bool]:
        """The regression (or None) and whether the window is above the threshold."""
        exposed = entry.exposed
        if not self._healthy:
            return None, False
        base = np.concatenate([h.exposed for h in self._healthy])
        filling = len(self._healthy) < self.config.min_baseline
        if filling:
            back, back_threshold = self._shift(exposed, base)
            if back > back_threshold:  # the baseline so far is slower: it was a warm-up
                self._phases.restart()
                return None, False
        increase, threshold = self._shift(base, exposed)
        if increase <= threshold:
            return None, False
        if filling and not (self._above and increase > 2 * threshold):
            return None, True  # against a baseline still filling: two large jumps in a row
        if not self._above and increase <= 2 * threshold:
            return None, True
        top = self._localize(entry, base)
        split = (
            self._split(entry, stages, top)
            if entry.d is not None
            else self._split_summary(entry, top)
        )
        whole = split.pop("spread_over_ranks") and (top is None or entry.d is not None)
        # a step no slower than the baseline's windows move with the machine's load is never
        # one stage's or rank's: that window ran slower as a whole
        wandering = increase <= self._shift(base, exposed, wander=True)[1]
        found = {
            "baseline_windows": [self._healthy[0].window, self._healthy[-1].window],
            "median_increase_ms_per_step": increase * 1e3,
            "kind": WHOLE_JOB if whole or wandering else STAGE,
            "within_wander": wandering,
            # the mean step's growth, as the window line's +ms/step is the mean's
            "slowdown": split["delta_exposed_ms_per_step"] / (float(np.mean(base)) * MS),
            **split,
        }
        return found, True

    def _localize(self, entry: _Healthy, base: FloatArray) -> str | None:
        """The stage whose per-step advance grew beyond its even share of the slowdown, as the
        module docstring says (None: the whole job slowed)."""
        before = np.concatenate([_entry_advances(h) for h in self._healthy])
        now = _entry_advances(entry)
        base_mean = float(np.mean(base))
        ratio = float(np.mean(entry.exposed)) / base_mean if base_mean > 0 else 1.0
        mean_increase = float(np.mean(entry.exposed)) - base_mean
        floor = self.config.min_increase * float(np.median(base))
        best: tuple[float, str] | None = None
        assert self._stages is not None
        before_step = float(np.mean(before.sum(axis=1)))
        for members in stage_groups(self._stages)[1]:  # accumulation substages judged together
            was = block_means(before[:, members].sum(axis=1) * ratio, BLOCK_STEPS)
            grown = block_means(now[:, members].sum(axis=1), BLOCK_STEPS)
            excess = mean_shift(was, grown, floor, self.config.noise_factor)
            # Beyond its even share, a stage can grow by at most the rest of the step's share:
            # a stall in a stage that already held most of the step is still that stage's.
            share = float(np.mean(was)) / ratio / before_step if before_step > 0 else 0.0
            room = max(1.0 - share, 0.0)
            if excess.stands_out and excess.shift_s >= LOCALIZED_SHARE * room * mean_increase:
                # the split names the member that grew most
                growth = now[:, members].mean(axis=0) - before[:, members].mean(axis=0)
                stage = self._stages[members[int(np.argmax(growth))]]
                best = max(best or (excess.shift_s, stage), (excess.shift_s, stage))
        return best[1] if best else None

    def _split(self, entry: _Healthy, stages: tuple[str, ...], top: str | None) -> dict[str, Any]:
        """The change split into stages, and the ranks whose own time grew in ``top`` (by
        default the stage whose advance grew most), from every rank's columns."""
        assert entry.d is not None
        result = compare(
            Side.from_windows("baseline", [h.d for h in self._healthy if h.d is not None], stages),
            Side.from_windows(f"window {entry.window}", [entry.d], stages),
        )
        if top is None:
            # every stage grew with the step: the whole job's only if the ranks did too, and
            # the rank it is placed on stands out of the ranks in that stage
            spread, top = rank_spread(result, entry.n_ranks)
            spread = spread or not self._rank_stands_out(entry, top)
        else:  # one stage grew beyond its share: a neighbour's, if every rank grew in several
            spread = spread_beyond_stage(result, entry.n_ranks, top)
        grew = result.stage_rank_deltas(top)
        stage_delta = result.delta_advance_ms[top]
        grown = [row["rank"] for row in grew if row["delta_ms"] >= 0.5 * stage_delta]
        return {
            "delta_exposed_ms_per_step": result.delta_exposed_ms,
            "delta_advance_ms_per_step": result.delta_advance_ms,
            "top_stage": top,
            # The ranks whose own time in the stage grew by at least half the stage's delta;
            # all of them means a slowdown of the whole job (a slower mount, a new augmentation).
            "ranks": grown or [row["rank"] for row in grew[:1]],
            "all_ranks": len(grown) == len(grew) > 1,
            "rank_delta_ms_per_step": {str(row["rank"]): row["delta_ms"] for row in grew},
            "spread_over_ranks": spread,
        }

    def _rank_stands_out(self, entry: _Healthy, stage: str) -> bool:
        """Whether the rank whose own time in ``stage``'s broad stage grew most now spends
        longer there than every other rank by more than it did in the baseline: by at least
        ``min_increase`` of the baseline's median step and ``noise_factor`` standard errors
        (means over blocks of ``BLOCK_STEPS`` steps, ``noise.mean_shift``), the test a stage's
        own growth passes (``_localize``). A busy machine slows the ranks unevenly: a healthy
        run's 126 ms/step slowdown, 103 ms of it in backward, was placed on the rank whose data
        wait grew 33 ms/step (the others' 10, 8.5 and -11)."""
        assert entry.d is not None and self._stages is not None
        if entry.d.shape[1] < 2:
            return True
        index = self._stages.index(stage)
        members = next(g for g in stage_groups(self._stages)[1] if index in g)
        before = np.concatenate([h.d for h in self._healthy if h.d is not None])
        before, now = before[:, :, members].sum(axis=2), entry.d[:, :, members].sum(axis=2)
        rank = int(np.argmax(now.mean(axis=0) - before.mean(axis=0)))

        def ahead(x: FloatArray) -> FloatArray:
            return np.asarray(x[:, rank] - np.delete(x, rank, axis=1).max(axis=1))

        base = np.concatenate([h.exposed for h in self._healthy])
        floor = self.config.min_increase * float(np.median(base))
        was, grown = block_means(ahead(before), BLOCK_STEPS), block_means(ahead(now), BLOCK_STEPS)
        return mean_shift(was, grown, floor, self.config.noise_factor).stands_out

    def _split_summary(self, entry: _Healthy, top: str | None) -> dict[str, Any]:
        """``_split`` from node summaries (see the module docstring)."""
        now = entry.summary
        assert now is not None
        base = [h.summary for h in self._healthy if h.summary is not None]
        base_adv = np.concatenate([_advances(b) for b in base])
        new_adv = _advances(now)
        deltas = (new_adv.mean(axis=0) - base_adv.mean(axis=0)) * MS
        delta_advance = {s: float(v) for s, v in zip(now.stages, deltas, strict=True)}
        top = top or max(delta_advance, key=lambda s: delta_advance[s])
        j = now.stages.index(top)
        half = 0.5 * delta_advance[top]
        steps = np.array([b.n_steps for b in base], dtype=np.float64)
        exact = True
        grew: dict[int, float] = {}
        for rank, mean in zip(now.mean_top_rank[j].tolist(), now.mean_top[j].tolist(), strict=True):
            bound, known = _baseline_mean_bound(base, steps, j, rank)
            exact = exact and known
            grew[rank] = (mean - bound) * MS
        ordered = sorted(grew, key=lambda r: -grew[r])
        largest = [float(b.mean_top[j, 0]) if b.mean_top.shape[1] else np.inf for b in base]
        largest_before = float(np.dot(steps, largest) / steps.sum())
        every = now.n_ranks > 1 and (float(now.mean_min[j]) - largest_before) * MS >= half
        grown = [r for r in ordered if grew[r] >= half]
        # only the top stage's largest rank means are kept: its spread stands for the window's
        spread = spread_over_ranks({str(r): grew[r] for r in ordered}, now.n_ranks)
        return {
            "delta_exposed_ms_per_step": float(
                (new_adv.sum(axis=1).mean() - base_adv.sum(axis=1).mean()) * MS
            ),
            "delta_advance_ms_per_step": delta_advance,
            "top_stage": top,
            "ranks": grown or ordered[:1],
            "all_ranks": bool(every),
            "rank_delta_ms_per_step": {str(r): grew[r] for r in ordered},
            "rank_deltas_exact": exact,
            "spread_over_ranks": spread,
        }

    def _shift(
        self, base: FloatArray, exposed: FloatArray, wander: bool = False
    ) -> tuple[float, float]:
        """How much the median of ``exposed`` exceeds that of ``base``, and the threshold past
        which that is a slowdown (see the module doc); with ``wander``, past which it also
        stands out of the baseline windows' wander."""
        cfg = self.config
        floor = cfg.min_increase * float(np.median(base))
        moved = window_wander([h.exposed for h in self._healthy if not h.above]) if wander else 0.0
        shift = median_shift(
            base, exposed, floor, cfg.noise_factor, noisy_now=False, wander_s=moved
        )
        return shift.shift_s, shift.threshold_s


def _advances(summary: WindowSummary) -> FloatArray:
    return advances_from_frontier(summary.top_prefix[:, :, 0])


def _entry_advances(entry: _Healthy) -> FloatArray:
    """Per-step frontier advances ``[N, S]`` of a kept window, from its columns or summary."""
    if entry.d is not None:
        return advances(entry.d)
    assert entry.summary is not None
    return _advances(entry.summary)


def _baseline_mean_bound(
    base: Sequence[WindowSummary], steps: FloatArray, stage: int, rank: int
) -> tuple[float, bool]:
    """An upper bound of ``rank``'s mean time in ``stage`` over the baseline windows, and
    whether it is its exact mean (it was among the kept largest of every window, or the
    summaries kept every rank)."""
    values, exact = [], True
    for summary in base:
        kept = summary.mean_top_rank[stage].tolist()
        if rank in kept:
            values.append(float(summary.mean_top[stage, kept.index(rank)]))
        else:
            exact = False
            values.append(float(summary.mean_top[stage, -1]) if kept else np.inf)
    return float(np.dot(steps, values) / steps.sum()), exact
