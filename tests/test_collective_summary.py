"""The timed collectives under hierarchical collection (``analysis.collective_summary``): node
summaries that combine into the reading of every rank's waits, exact but for the other ranks'
median and spread, which lie within the bound the reading states. The real multi-node run is in
``test_scale_torchrun.py``; these cases build the waits by hand to reach the edges."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stagefrontier.analysis.collective_summary import (
    CollectiveSummary,
    combine_collectives,
    read_collective_summary,
    summarize_collectives,
    summary_facts,
)
from stagefrontier.analysis.collectives import CollectiveTimes, read_collectives
from stagefrontier.analysis.step_facts import StepFacts
from stagefrontier.collect.node_payload import joined_collectives
from stagefrontier.collect.node_wire import NodePart, decode_node_part, encode_node_part
from stagefrontier.errors import ReportFormatError

KEYS = (
    ("all_reduce", 0, "model.backward_cpu_wall", 0),
    ("all_reduce", 1, "model.backward_cpu_wall", 0),
)
STEP_MS = 300.0


def _waits(late: int | None, ranks: int = 8, steps: int = 10, seed: int = 0) -> np.ndarray:
    """``[steps, ranks, 2]``: ranks arriving up to 30 ms apart (``late`` 100 ms after the
    others), two buckets that complete 5 ms and 3 ms after the last arrival."""
    rng = np.random.default_rng(seed)
    arrived = rng.uniform(0.0, 30.0, (steps, ranks))
    if late is not None:
        arrived[:, late] += 100.0
    last = arrived.max(axis=1, keepdims=True)
    waits = np.stack([last + 5.0 - arrived, last + 3.0 - arrived], axis=2)
    return np.round(waits, 3)  # whole microseconds, as the ranks time them


def _by_node(wait: np.ndarray, per_node: int, keys: tuple = KEYS) -> list[CollectiveSummary]:
    reached = np.ones_like(wait) * np.arange(wait.shape[1])[None, :, None]
    parts = []
    for first in range(0, wait.shape[1], per_node):
        cols = slice(first, first + per_node)
        times = CollectiveTimes(keys, (1 << 20,) * len(keys), wait[:, cols], reached[:, cols])
        parts.append(summarize_collectives(times, list(range(first, first + per_node))))
    return parts


def _flat(wait: np.ndarray, keys: tuple = KEYS) -> object:
    reached = np.ones_like(wait) * np.arange(wait.shape[1])[None, :, None]
    times = CollectiveTimes(keys, (1 << 20,) * len(keys), wait, reached)
    return read_collectives(times, list(range(wait.shape[1])), STEP_MS)


@pytest.mark.parametrize("late", [5, None])
@pytest.mark.parametrize("per_node", [2, 4])
def test_node_summaries_read_as_every_ranks_waits_within_the_stated_bound(
    late: int | None, per_node: int
) -> None:
    wait = _waits(late)
    flat = _flat(wait)
    hier = read_collective_summary(combine_collectives(_by_node(wait, per_node)), 8, STEP_MS)
    assert len(hier.collectives) == len(flat.collectives) == 2  # type: ignore[attr-defined]
    for want, got in zip(flat.collectives, hier.collectives, strict=True):  # type: ignore[attr-defined]
        for name in ("transfer_ms", "wait_ms", "spread_ms", "reached_ms", "steps", "last_bucket"):
            assert getattr(got, name) == pytest.approx(getattr(want, name), abs=1e-9), name
        assert got.late_rank == want.late_rank == late
        assert abs(got.lateness_ms - want.lateness_ms) <= got.bound_ms
        assert want.bound_ms == 0.0 and 0.0 < got.bound_ms < 0.02 * 130.0
    assert (hier.late is None) == (late is None)


def _random_waits(rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """``[steps, ranks, 2]`` waits of one of several shapes (even, long-tailed, two clusters,
    a late rank or not), whole microseconds, and the ranks per node."""
    per_node, nodes, steps = rng.choice([2, 4, 8]), rng.integers(2, 9), rng.integers(3, 13)
    shape = (steps, per_node * nodes)
    arrived = rng.choice(
        [
            lambda: rng.uniform(0.0, rng.uniform(1.0, 60.0), shape),
            lambda: rng.exponential(rng.uniform(1.0, 30.0), shape),
            lambda: rng.uniform(0.0, 5.0, shape) + 40.0 * rng.integers(0, 2, shape),
        ]
    )()
    if rng.random() < 0.5:
        arrived[:, rng.integers(shape[1])] += rng.uniform(5.0, 120.0)
    last = arrived.max(axis=1, keepdims=True)
    return np.round(np.stack([last + 5.0 - arrived, last + 3.0 - arrived], axis=2), 3), per_node


def test_the_lateness_and_the_noise_lie_within_the_bound_on_random_waits() -> None:
    """Seeded random windows, node summaries through the JSON wire form: the facts read from
    them against every rank's exact facts, the lateness and the noise (the others' median
    absolute deviation) each within ``bound_ms``, the late rank the same."""
    rng = np.random.default_rng(5)
    for case in range(300):
        wait, per_node = _random_waits(rng)
        ranks = wait.shape[1]
        parts = [
            CollectiveSummary.from_dict(json.loads(json.dumps(p.to_dict())))
            for p in _by_node(wait, per_node)
        ]
        facts = summary_facts(combine_collectives(parts), ranks)
        assert [c for c, _ in facts] == [0, 1]
        for c, got in facts:
            want = StepFacts.of_waits(wait[:, :, c], np.arange(ranks), 0 * wait[:, :, c])
            where = f"case {case}, collective {c}: {ranks} ranks, {wait.shape[0]} steps"
            assert got.late == want.late, where
            lateness = float(np.median(got.behind)) - float(np.median(want.behind))
            assert abs(lateness) <= got.bound_ms + 1e-9, where
            assert abs(got.noise - want.noise) <= got.bound_ms + 1e-9, where


def test_a_summary_crosses_the_node_wire_unchanged() -> None:
    parts = _by_node(_waits(3), 4)
    top = combine_collectives(parts)
    part = NodePart(window=0, first_step=0, last_step=9, first_node=0, node_count=2)
    back = decode_node_part(encode_node_part(NodePart(**{**part.__dict__, "collectives": top})))
    assert back.collectives is not None  # the same to the record's microsecond
    sent = read_collective_summary(top, 8, STEP_MS).to_dict()
    assert read_collective_summary(back.collectives, 8, STEP_MS).to_dict() == sent
    assert decode_node_part(encode_node_part(part)).collectives is None


def test_a_summary_stays_the_same_size_as_ranks_grow() -> None:
    sizes = [
        len(json.dumps(combine_collectives(_by_node(_waits(1, ranks=n), 8)).to_dict()))
        for n in (64, 512)
    ]
    assert sizes[1] <= sizes[0] * 1.1, sizes


def test_nodes_that_timed_other_collectives_or_other_steps_combine_or_say_why() -> None:
    wait = _waits(5)
    left = _by_node(wait[:, :4], 4)[0]
    right = _by_node(wait[:, 4:, :1], 4, KEYS[:1])[0]  # bucket 1 not timed on node 1
    right = CollectiveSummary(**{**right.__dict__, "low_rank": right.low_rank + 4})
    reading = read_collective_summary(combine_collectives([left, right]), 8, STEP_MS)
    assert [c.bucket for c in reading.collectives] == [0]  # bucket 1: no step timed by all
    assert reading.late is not None and reading.late.late_rank == 5
    shorter = _by_node(wait[:5, 4:], 4)[0]
    notes: list[str] = []
    parts = [
        NodePart(0, 0, 9, 0, 1, collectives=left),
        NodePart(0, 0, 9, 1, 1, collectives=shorter),
    ]
    assert joined_collectives(parts, notes) is None
    assert notes == [
        "communication evidence not combined: the groups' collectives cover different steps"
    ]


def test_a_malformed_summary_is_refused_with_the_reason() -> None:
    data = combine_collectives(_by_node(_waits(2), 4)).to_dict()
    with pytest.raises(ReportFormatError, match="must hold exactly"):
        CollectiveSummary.from_dict({**data, "extra": 1})
    with pytest.raises(ReportFormatError, match="do not fit"):
        CollectiveSummary.from_dict({**data, "count": data["count"][:-1]})
    with pytest.raises(ReportFormatError, match="do not fit"):
        CollectiveSummary.from_dict({**data, "n_ranks": 9})


def _queued_parts(own_ms: np.ndarray, queued: np.ndarray, per_node: int) -> list:
    """Node summaries through the JSON wire form of ranks arriving ``own_ms + queued`` after a
    moment they share, each carrying its run-queue wait ``queued`` before the collective."""
    arrived = own_ms + queued
    wait = np.round(arrived.max(axis=1, keepdims=True) + 5.0 - arrived, 3)[:, :, None]
    parts = []
    for first in range(0, wait.shape[1], per_node):
        cols = slice(first, first + per_node)
        times = CollectiveTimes(
            KEYS[:1], (1 << 20,), wait[:, cols], 0 * wait[:, cols], queued_ms=queued[:, cols, None]
        )
        part = summarize_collectives(times, list(range(first, first + per_node)))
        parts.append(CollectiveSummary.from_dict(json.loads(json.dumps(part.to_dict()))))
    return parts


@pytest.mark.parametrize("seed", range(3))
def test_node_summaries_carry_the_run_queue_waits_so_a_late_rank_is_told_from_a_starved_one(
    seed: int,
) -> None:
    """8 ranks scattered 0-350 ms a step by the scheduler, carried per arrival: from node
    summaries, rank 4 late 120 ms by its own code is named (as from every rank's waits, within
    the stated bound), and rank 2 late by 150 ms more of CPU wait a step is said starved, not
    late. Without the run-queue waits the summaries name neither."""
    rng = np.random.default_rng(seed)
    own, queued = rng.normal(200.0, 3.0, (10, 8)), np.round(rng.uniform(0.0, 350.0, (10, 8)), 3)
    own[:, 4] += 120.0
    hier = read_collective_summary(combine_collectives(_queued_parts(own, queued, 2)), 8, 430.0)
    assert hier.late is not None and hier.late.late_rank == 4, hier.collectives
    assert hier.late.lateness_ms == pytest.approx(120.0, abs=10.0 + hier.late.bound_ms)
    own[:, 4] -= 120.0
    queued = queued * 0.1
    queued[:, 2] += 150.0
    starved = read_collective_summary(combine_collectives(_queued_parts(own, queued, 4)), 8, 430.0)
    assert starved.late is None and starved.starved is not None
    assert starved.starved.starved_rank == 2 and (starved.starved.cpu_wait_ms or 0.0) > 100.0
    blind = [
        CollectiveSummary(**{**p.__dict__, "own": None}) for p in _queued_parts(own, queued, 4)
    ]
    plain = read_collective_summary(combine_collectives(blind), 8, 430.0)
    assert plain.starved is None  # without them a starved rank is not told apart
