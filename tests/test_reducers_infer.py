"""Reducing a trace without a stage list: the stages are the ranges on the step thread, in the
order they run. Real PyTorch Profiler traces of a loop that wraps only some of its stages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier.cli import main
from stagefrontier.reducers import AmbiguousStageOrderError, reduce_kineto
from stagefrontier.reducers.infer import infer_stages
from stagefrontier.reducers.ranges import RankRanges, Span
from trace_support import BWD, DATA, FWD, OTHER, THREE_RANGES, load_events, trace, write_events

THREE = THREE_RANGES


@pytest.fixture(scope="module")
def three_ranges() -> Path:
    """A loop whose record_function ranges cover only data, forward and backward."""
    return trace("three-ranges-4-steps.json")


def test_cli_reports_the_three_wrapped_stages_and_the_residual(
    three_ranges: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(three_ranges)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    table = out.split("\n\n")[1].splitlines()[2:]  # the stage table's rows
    assert [row.split()[0] for row in table] == [*THREE, OTHER]
    assert f"stages_inferred={', '.join(THREE)}" in out
    assert f"top-1: {DATA}" in out  # the 30 ms sleep in the data stage

    assert main(["analyze", str(three_ranges), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stages"] == [*THREE, OTHER]


def test_inferred_stages_reduce_like_the_same_stages_given(three_ranges: Path) -> None:
    inferred = reduce_kineto(three_ranges)
    given = reduce_kineto(three_ranges, THREE)
    assert inferred.stages_inferred and not given.stages_inferred
    assert inferred.stages == given.stages == (*THREE, OTHER)
    np.testing.assert_array_equal(inferred.d, given.d)
    loaded = sf.load_window(three_ranges)
    assert loaded.report.stages == [*THREE, OTHER]


def test_without_default_names_the_outermost_ranges_are_the_stages(
    three_ranges: Path, tmp_path: Path
) -> None:
    header, events = load_events(three_ranges)
    renamed = {DATA: "load", FWD: "forward", BWD: "backward"}
    for event in events:
        event["name"] = renamed.get(event.get("name"), event.get("name"))
    path = write_events(tmp_path / "renamed.json", header, events)
    reduced = reduce_kineto(path)
    # torch's own optimizer ranges sit at the top of each step too, after backward
    assert reduced.stages[:3] == ("load", "forward", "backward")
    assert any(name.startswith("Optimizer.step#") for name in reduced.stages[3:])
    assert reduced.stages[-1] == OTHER


def test_stages_in_different_orders_are_refused(
    three_ranges: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header, events = load_events(three_ranges)
    last_step = max(
        (e for e in events if str(e.get("name")).startswith("ProfilerStep#")),
        key=lambda e: e["ts"],
    )
    inside = last_step["ts"], last_step["ts"] + last_step["dur"]
    for event in events:  # in the last step, forward and backward trade names
        if event.get("cat") == "user_annotation" and inside[0] <= event["ts"] < inside[1]:
            event["name"] = {FWD: BWD, BWD: FWD}.get(event["name"], event["name"])
    path = write_events(tmp_path / "swapped.json", header, events)
    with pytest.raises(AmbiguousStageOrderError, match="stage order is ambiguous"):
        reduce_kineto(path)
    assert main(["analyze", str(path)]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "--stages" in err
    assert main(["analyze", str(path), "--stages", ",".join(THREE)]) == 0


def _rank(rank: int, steps: list[list[str]]) -> RankRanges:
    """A rank whose step i runs the named ranges back to back, 1 ms each."""
    thread = ("1", "1")
    spans: dict[str, list[Span]] = {}
    step_spans = []
    for i, names in enumerate(steps):
        start = i * 100_000_000
        step_spans.append(Span(f"ProfilerStep#{i}", start, 50_000_000, thread))
        for k, name in enumerate(names):
            spans.setdefault(name, []).append(Span(name, start + k * 1_000_000, 1_000_000, thread))
    return RankRanges(
        rank=rank,
        files=(f"rank{rank}.json",),
        step_ids=tuple(range(len(steps))),
        steps=tuple(step_spans),
        stages={name: tuple(v) for name, v in spans.items()},
        step_kind="profiler",
        ordinal_ids=False,
        thread=thread,
    )


def test_orders_met_in_different_steps_combine_and_circles_are_refused() -> None:
    # a before b (rank 0), b before c (rank 1): one order, a, b, c
    parts = [_rank(0, [["a", "b"]]), _rank(1, [["b", "c"]])]
    assert infer_stages(parts) == ("a", "b", "c")
    # ... and c before a in another step closes a circle
    circle = [_rank(0, [["a", "b"], ["c", "a"]]), _rank(1, [["b", "c"]])]
    with pytest.raises(AmbiguousStageOrderError) as err:
        infer_stages(circle)
    assert (
        "runs in a circle: a before b in rank 0 step 0; b before c in rank 1 step 0; "
        "c before a in rank 0 step 1" in str(err.value)
    )
