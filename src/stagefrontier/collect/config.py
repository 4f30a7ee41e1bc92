"""The collection settings of a StageTimer, grouped in one frozen object: the ``collection``
part of its configuration tree (``TimerConfig(collection=CollectConfig(mode="store",
timeout_s=30.0))``, see ``record.config``).

The timer's deprecated flat keywords (``StageTimer(collect="store", collect_timeout_s=30.0)``)
build the same config through ``collect_config``; giving a setting both ways is an error, never
a silent choice.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..analysis.gates import Gates
from ..analysis.regression import DEFAULT_REGRESSION, RegressionConfig
from ..errors import StageFrontierError, TimerSettingError
from ..sinks import Sink
from .node_tree import DEFAULT_FAN_IN
from .settings import (
    MAX_QUEUE_SIZE,
    MAX_TIMEOUT_S,
    check_flag,
    check_has_methods,
    check_int,
    check_number,
    check_path,
)

MAX_FAN_IN = 1 << 16

MAX_DISK_BUDGET_MB = 1 << 30

COLLECT_MODES = ("auto", "local", "store", "gloo", "hierarchical")

AUTO_HIERARCHICAL_ABOVE = 1000
"""``auto`` collects hierarchically in a job of more ranks than this: the crossover measured in
``benchmarks/results/scale.md`` (8 ranks per node, the default fan-in), where rank 0's time per
window is still lower flat at 1,000 ranks (by a few percent) and lower hierarchically from 4,000
on, growing with the ranks flat and with the tree's parts hierarchically. The job store's
operations per window are 8x fewer hierarchically at every count."""


@dataclass(frozen=True)
class CollectConfig:
    """How a timer's windows reach rank 0's analysis, and where the results go.

    Attributes:
        mode: ``"auto"`` (the job's store once torch.distributed is initialized, hierarchically
            above ``AUTO_HIERARCHICAL_ABOVE`` ranks, this process alone otherwise), ``"local"``
            (this process only), ``"store"``, ``"gloo"`` or ``"hierarchical"`` (each node's
            windows gathered on the node, one summary per node through the job's store; see
            ``collect.hierarchical``).
        out_dir: where rank 0 writes ``windows.jsonl`` (and packets, with collection).
        timeout_s: how long rank 0 waits for the other ranks' windows; also the timeout of the
            collection's own store connection (or Gloo group).
        queue_size: completed windows that may wait for analysis before new ones are dropped.
        sinks: extra destinations for rank 0's analyzed windows, after ``windows.jsonl`` and
            the log line.
        gates: the labeler's gates for the live analysis (None: the defaults).
        regression: when rank 0 calls a window slower than the run's recent healthy windows,
            and the baseline for the direct gains (``analysis.regression``); None turns both
            off, leaving the gains relative to each window's own medians.
        log: write rank 0's one-line window summary to the ``stagefrontier`` logger (an INFO
            record: shown where the application's logging sends those); False leaves it out.
        keep_node_windows: under hierarchical collection, each node leader also writes the
            exact windows its node's part was built from under ``out_dir/node-windows/`` (for
            checking the combined analysis against the flat one on the same data); off by
            default.
        fan_in: under hierarchical collection, the most node parts one leader reads per
            window (the tree's fan-in, see ``collect.node_tree``).
        disk_budget_mb: the most MiB ``out_dir`` may hold; past it the packets of older
            windows are deleted, flagged windows and a sample of the others kept, each deletion
            listed in ``compacted.jsonl`` (``sinks.disk_budget``). None:
            ``STAGEFRONTIER_DISK_BUDGET_MB`` (1024 unset).
    """

    mode: str = "auto"
    out_dir: str | os.PathLike[str] = "stagefrontier"
    timeout_s: float = 10.0
    queue_size: int = 4
    sinks: tuple[Sink, ...] = ()
    gates: Gates | None = None
    regression: RegressionConfig | None = DEFAULT_REGRESSION
    log: bool = True
    keep_node_windows: bool = False
    fan_in: int = DEFAULT_FAN_IN
    disk_budget_mb: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in COLLECT_MODES:
            raise TimerSettingError(
                f"unknown collect mode {self.mode!r}; choose one of {COLLECT_MODES}"
            )
        check_path("out_dir", self.out_dir)
        timeout = check_number(
            "collect timeout_s", self.timeout_s, 0.0, MAX_TIMEOUT_S, open_low=True
        )
        object.__setattr__(self, "timeout_s", timeout)
        object.__setattr__(
            self, "queue_size", check_int("queue_size", self.queue_size, 1, MAX_QUEUE_SIZE)
        )
        if self.regression is not None and not isinstance(self.regression, RegressionConfig):
            raise TimerSettingError(
                f"regression must be a RegressionConfig or None, got {self.regression!r}"
            )
        if self.gates is not None and not isinstance(self.gates, Gates):
            raise TimerSettingError(f"gates must be a stagefrontier.Gates, got {self.gates!r}")
        check_flag("log", self.log)
        check_flag("keep_node_windows", self.keep_node_windows)
        object.__setattr__(self, "fan_in", check_int("fan_in", self.fan_in, 2, MAX_FAN_IN))
        if self.disk_budget_mb is not None:
            budget = check_int("disk_budget_mb", self.disk_budget_mb, 1, MAX_DISK_BUDGET_MB)
            object.__setattr__(self, "disk_budget_mb", budget)
        if isinstance(self.sinks, str) or not isinstance(self.sinks, Iterable):
            raise TimerSettingError(f"sinks must be a sequence of sinks, got {self.sinks!r:.60}")
        sinks = tuple(self.sinks)
        for sink in sinks:
            check_has_methods("sink", sink, "write", "close")
        object.__setattr__(self, "sinks", sinks)

    @property
    def disk_budget_bytes(self) -> int | None:
        """``disk_budget_mb`` in bytes (None when not set)."""
        return None if self.disk_budget_mb is None else self.disk_budget_mb << 20


def collect_config(collect: str | CollectConfig, keywords: Mapping[str, Any]) -> CollectConfig:
    """The config of ``StageTimer(collect=..., <flat keywords>)``: ``keywords`` maps the timer's
    collection keywords (``out_dir``, ``collect_timeout_s``, ``queue_size``, ``sinks``, ``gates``,
    ``log``) to their values. Those given (not None, sinks not empty) fill a config for
    ``collect`` as a mode, and must all be absent when ``collect`` is a CollectConfig already."""
    given: dict[str, Any] = {}
    for keyword, value in keywords.items():
        if keyword == "sinks":
            value = tuple(value) or None
        if value is not None:
            given[keyword] = value
    if isinstance(collect, CollectConfig):
        if given:
            raise StageFrontierError(
                f"give {', '.join(given)} in the CollectConfig passed as collect=, not also as "
                "StageTimer keywords"
            )
        return collect
    if not isinstance(collect, str):
        raise StageFrontierError(f"collect must be a mode name or a CollectConfig, got {collect!r}")
    if "collect_timeout_s" in given:
        given["timeout_s"] = given.pop("collect_timeout_s")
    return replace(CollectConfig(mode=collect), **given)
