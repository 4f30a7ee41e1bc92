"""How a rank says its contract violations: the misuses of the timer (a stage outside a step,
out of schema order, an unknown name, ...) that never stop training. A strict timer raises
:class:`~stagefrontier.ContractViolation`; otherwise each kind is logged at WARNING once on the
rank, and an unknown stage name is said with the stage it most likely meant.

The counting is the window's (``record.timer_state``: each window's ``contract_violations`` and
its first reasons); only the rare paths reach this module.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable

from ..analysis.schema import RESIDUAL_STAGE
from ..errors import ContractViolation

logger = logging.getLogger("stagefrontier")

MAX_WARNED = 32
"""Distinct contract violations a rank logs at WARNING, each once (the count is always exact)."""
SUGGESTION_CUTOFF = 0.8
"""How alike (difflib's ratio) an unknown stage name and a stage must be for "did you mean"."""


class ContractWarnings:
    """What this rank has said of its violations. ``rank`` gives the rank the log lines name
    (the timer's: its collector may set it after the first violations)."""

    def __init__(self, stages: tuple[str, ...], strict: bool, rank: Callable[[], int]) -> None:
        self.stages = stages
        self.strict = strict
        self._rank = rank
        self._unknown_names: dict[str, str] = {}  # unknown stage name -> its violation reason
        self._warned: set[str] = set()  # the violations already logged on this rank

    def say(self, reason: str) -> None:
        """Raise the violation when strict; else log its kind the first time only."""
        if self.strict:
            raise ContractViolation(reason)
        if reason not in self._warned and len(self._warned) < MAX_WARNED:
            self._warned.add(reason)  # each kind of violation said once, then only counted
            logger.warning(
                "stagefrontier: rank %d: %s; such calls are counted in each window's "
                "contract_violations and not said again (TimerConfig(strict=True) raises instead)",
                self._rank(),
                reason,
            )

    def unknown_stage(self, name: str) -> str:
        """The violation of a stage name outside the schema, logged at WARNING the first time
        with the stage it most likely meant (a typo would otherwise show only in the window's
        record)."""
        reason = self._unknown_names.get(name)
        if reason is None:
            close = (
                difflib.get_close_matches(name, self.stages, n=1, cutoff=SUGGESTION_CUTOFF)
                if isinstance(name, str)
                else []
            )
            hint = f"; did you mean {close[0]!r}?" if close else ""
            stages = ", ".join(self.stages)
            reason = self._unknown_names[name] = f"unknown stage {name!r}{hint} (schema: {stages})"
            self._warned.add(reason)  # said here, in its own words
            logger.warning(
                "stagefrontier: unknown stage %r on rank %d%s Its time is counted in %s; "
                "the stages are: %s",
                name,
                self._rank(),
                hint or ".",
                RESIDUAL_STAGE,
                stages,
            )
        return reason
