"""The router's policy on rank 0: which analyzed window opens an incident, on which ranks, and
when the next may open (the cooldown and the budget of captures). It reads windows and
requests, and decides; it writes nothing (``coordinator`` acts on its plans)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from ..analysis.collectives import CollectiveReading
from ..window.merged import AnalyzedWindow
from .decide import Decision, decide, regression_decision
from .requests import MAX_CAPTURE_STEPS, ManualRequest

logger = logging.getLogger("stagefrontier")

WINDOW_STEPS_KEPT = 256
"""Step ranges of recent windows kept to tell whether an earlier trace fell in a baseline."""
NAMED_WINDOWS_KEPT = 2
"""What the last windows named kept: a late rank, or a lead under the large-jump bar, is
captured when the window before named it too (``decide``)."""


@dataclass
class Named:
    """What one window named, for the next window's decision: the rank the timed collectives
    name late in it, and the (stage, suspect) of each lead or regression it held back
    (``repeat_needed``)."""

    late: CollectiveReading | None = None
    leads: set[tuple[str, int]] = field(default_factory=set)


@dataclass(frozen=True)
class EarlierTrace:
    """A trace captured earlier in this run, kept as a possible reference for a regression."""

    rank: int
    path: str
    first_step: int
    last_step: int
    incident: str

    def as_reference(self, baseline: bool) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "path": self.path,
            "steps": [self.first_step, self.last_step],
            "incident": self.incident,
            "from_baseline": baseline,
        }


@dataclass(frozen=True)
class Plan:
    """An incident to open: why (``decision``), what opened it (``trigger``: window,
    regression or manual), the ranks to capture, how many steps (None: the router's), the
    incident's extra fields and the manual request it answers."""

    decision: Decision
    trigger: str
    ranks: list[int]
    steps: int | None = None
    extra: dict[str, Any] | None = None
    manual_id: str | None = None


class CapturePolicy:
    """Decides on each window, and on manual requests, within the router's budget
    (``max_captures``) and cooldown (``cooldown_windows`` after each incident's window, and
    never on a window whose steps ran while the router's own work for an incident did)."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.captures = 0
        # The last step during which an incident's capture, trace export or reduction ran (the
        # step rank 0 settled it in, plus one of skew between ranks). On a busy machine rank 0
        # decides late, the capture runs late, and its cost can land past the cooldown: a
        # window that holds it measures the router, not the job.
        self.busy_until_step = -1
        self.next_window = 0  # the first window index the cooldown allows
        self.traces: dict[int, list[EarlierTrace]] = {}  # rank -> its local traces, oldest first
        self.window_steps: dict[int, tuple[int, int]] = {}
        self.named: dict[int, Named] = {}  # window -> what it named

    def remember(self, window: AnalyzedWindow) -> None:
        """The window's steps, to place earlier traces and a capture's regime later, and the
        rank the timed collectives name late in it, for the next window's decision."""
        ref = window.merged.reference
        self.window_steps[ref.window] = (ref.first_step, ref.last_step)
        while len(self.window_steps) > WINDOW_STEPS_KEPT:
            del self.window_steps[next(iter(self.window_steps))]
        reading = window.communication
        self.named[ref.window] = Named(None if reading is None else reading.late)
        while len(self.named) > NAMED_WINDOWS_KEPT:
            del self.named[next(iter(self.named))]

    def first_step(self, window: int | None, otherwise: int) -> int:
        """The first step of a remembered window (``otherwise`` when it is not)."""
        if window is None:
            return otherwise
        return self.window_steps.get(window, (otherwise, otherwise))[0]

    def keep_trace(self, trace: EarlierTrace) -> None:
        self.traces.setdefault(trace.rank, []).append(trace)

    def consider(self, window: AnalyzedWindow) -> Plan | None:
        """An incident for this window, when it is actionable or regressed and the budget and
        the cooldown allow one."""
        index = window.merged.reference.window
        if self.captures >= self.config.max_captures or index < self.next_window:
            return None
        if window.merged.reference.first_step <= self.busy_until_step:
            logger.debug(
                "stagefrontier router: window %d not judged: its steps ran while the router "
                "captured, exported or reduced an incident (until step %d)",
                index,
                self.busy_until_step,
            )
            return None
        before = self.named.get(index - 1, Named())
        decision, why = decide(
            window,
            self.config.gates,
            min_share=self.config.min_share,
            noise_factor=self.config.noise_factor,
            late_before=before.late,
        )
        if decision is not None and decision.repeat_needed:
            decision, why = self._repeated(decision, index, before)
        if decision is not None:
            return Plan(decision, "window", [decision.suspect_rank, decision.reference_rank])
        regressed, refused = regression_decision(
            window,
            min_share=self.config.min_share,
            noise_factor=self.config.noise_factor,
            late_before=before.late,
        )
        if regressed is not None and regressed.repeat_needed:
            regressed, refused = self._repeated(regressed, index, before)
        if regressed is None:
            why = "; ".join(x for x in (why, refused) if x)
            logger.debug("stagefrontier router: window %d not actionable: %s", index, why)
            return None
        return self._regression(regressed, window.regression or {})

    def _repeated(
        self, decision: Decision, index: int, before: Named
    ) -> tuple[Decision | None, str]:
        """A lead under the large-jump bar, or a lead or regression read from node summaries:
        remembered, and captured only when the window before named the same stage and suspect,
        by either (else None, with why)."""
        lead = (decision.stage, decision.suspect_rank)
        self.named.setdefault(index, Named()).leads.add(lead)
        if lead in before.leads:
            held = (
                f"{decision.repeat_needed}; rank {lead[1]} led {lead[0]} in the window before "
                "too: two windows in a row"
            )
            return replace(decision, reasons=(*decision.reasons, held)), ""
        return None, (
            f"{decision.repeat_needed} in this window alone (such a lead is captured two "
            "windows in a row)"
        )

    def _regression(self, decision: Decision, regression: dict[str, Any]) -> Plan:
        """A regression's capture: the suspect alone when it has a trace from the baseline
        windows (the reference), else the suspect and a rank that did not grow."""
        suspect = decision.suspect_rank
        first, last = regression["baseline_windows"]
        earlier = self.traces.get(suspect, [])
        lo = self.window_steps.get(first, (None, None))[0]
        hi = self.window_steps.get(last, (None, None))[1]
        in_baseline = [
            t for t in earlier if lo is not None and hi is not None and lo <= t.first_step <= hi
        ]
        reasons = list(decision.reasons)
        reference: dict[str, Any] | None = None
        ranks = [suspect, decision.reference_rank]
        if in_baseline:
            reference = in_baseline[-1].as_reference(baseline=True)
            ranks = [suspect]
            reasons.append(
                f"reference: rank {suspect}'s own trace of steps {reference['steps'][0]}-"
                f"{reference['steps'][1]} (incident {reference['incident']}), taken in the "
                "baseline windows"
            )
        return Plan(
            replace(decision, reasons=tuple(reasons)),
            "regression",
            ranks,
            extra={"regression": regression, "reference_capture": reference},
        )

    def manual(
        self, manual: ManualRequest, world: int | None, last: AnalyzedWindow | None
    ) -> Plan | str:
        """A manual request's incident, or why it is refused."""
        outside = [r for r in manual.ranks if world is not None and r >= world]
        if outside:
            return (
                f"rank{'s' if len(outside) > 1 else ''} {','.join(map(str, outside))} "
                f"outside the job's {world} ranks"
            )
        if self.captures >= self.config.max_captures:
            return f"max_captures={self.config.max_captures} reached"
        stage = manual.stage or (last.report.top1 if last is not None else None)
        ranks = list(dict.fromkeys(manual.ranks))
        steps = min(manual.steps, MAX_CAPTURE_STEPS)
        capped = f"; capped at {MAX_CAPTURE_STEPS} steps" if steps < manual.steps else ""
        decision = Decision(
            stage=stage or "",
            suspect_rank=ranks[0],
            reference_rank=ranks[1] if len(ranks) > 1 else ranks[0],
            share=float("nan"),
            window=last.merged.reference.window if last is not None else -1,
            reasons=(f"manual request for ranks {ranks}, {manual.steps} steps{capped}",),
        )
        return Plan(decision, "manual", ranks, steps, manual_id=manual.id)

    def settled(self, step: int) -> None:
        """An incident settled while the job ran ``step``: no window up to it is judged."""
        self.busy_until_step = max(self.busy_until_step, step)

    def opened(self, window: int, counted: bool) -> None:
        """An incident of ``window`` was opened (``counted``: its request reached the store):
        the cooldown starts, and a capture is spent."""
        self.next_window = max(window, 0) + self.config.cooldown_windows + 1
        self.captures += counted
