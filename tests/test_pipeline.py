"""A real pipeline-parallel job (``torch.distributed.pipelining``, GPipe, 2 stages x 2 replicas
on Gloo, roles from a ``DeviceMesh``): a stall in one replica of pipeline stage 1 is routed
inside role pp1 to that rank, a stall on both replicas of stage 0 moves the bound, and a
compute stall inside the schedule leaves the bound open.

One run, three phases (the fault grammar's from/to), one window each; the first window of a run
holds start-up, so each phase has a window to itself after it. The stalls are longer than the
benchmark's 120 ms so that a slow shared machine cannot make the pipeline's own compute rival
them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stagefrontier.analysis.window_report import WindowReport
from stagefrontier.demo.faults import parse_fault
from stagefrontier.demo.pipeline import PipelineConfig, run_pipeline
from stagefrontier.formats.run_digest import SHOWN_ALL
from stagefrontier.formats.run_folder import load_run
from stagefrontier.render.headline import HEADLINE_MAX, window_headline
from stagefrontier.render.plots import plot_shares_over_time
from stagefrontier.render.text import run_report_text, window_details

W = 6  # steps per window
FAULTS = (
    f"data@3:300ms,from={W},to={2 * W}",  # window 1: one replica of pipeline stage 1
    f"data@0:300ms,from={2 * W},to={3 * W}",  # window 2: both replicas of pipeline stage 0
    f"data@1:300ms,from={2 * W},to={3 * W}",
    f"forward@3:300ms,from={3 * W}",  # window 3: compute inside the schedule, on rank 3
)


def _config(out: Path, **kwargs: Any) -> PipelineConfig:
    faults = tuple(parse_fault(f) for f in FAULTS)
    return PipelineConfig(
        steps=4 * W, window=W, faults=faults, out_dir=str(out), quiet=True, **kwargs
    )


@pytest.fixture(scope="module")
def flat_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("flat")
    return out, run_pipeline(_config(out), deadline_s=240)


def test_pipeline_roles_route_inside_the_slowed_role(
    flat_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    tmp_path, windows = flat_run
    assert [w["window"] for w in windows] == [0, 1, 2, 3]
    assert all(w["roles"] == ["pp0", "pp0", "pp1", "pp1"] for w in windows)
    losses = (tmp_path / "losses-dp0.json").read_text()
    assert losses.startswith("[") and len(losses) > 2

    one = WindowReport.from_dict(windows[1])
    assert one.has("role_aware_needed") and one.role_reports is not None
    pp1 = one.role_reports["pp1"]
    assert pp1.top1 == "data.next_wait" and pp1.routing_set[0] == "data.next_wait"
    assert pp1.semantic_localization["data.next_wait"].leading_ranks == [3]
    assert "pp1 top data.next_wait" in window_details(one) and "led by rank 3" in window_details(
        one
    )
    assert "pp1 bounds the step" in window_details(one)
    # The headline names the role's stage to profile where the role bounds the step.
    headline = window_headline(one, windows[1])
    assert len(headline) <= HEADLINE_MAX, headline
    assert "| role pp1 bounds the step: top data.next_wait " in headline
    # (by its plain name alone when the line would pass 160 characters with both names)
    assert headline.endswith(
        (
            "| Next: profile data loading (data.next_wait) within pp1",
            "| Next: profile data loading within pp1",
        )
    ), headline

    both = WindowReport.from_dict(windows[2])
    assert both.role_reports is not None
    assert both.role_reports["pp0"].top1 == "data.next_wait"
    assert both.role_reports["pp1"].top1 == "pp.schedule"
    assert "pp0 bounds the step" in window_details(both)

    # A compute stall inside the schedule: still routed within pp1 to rank 3, but its pipeline
    # partner waits for it inside pp.schedule too, so which role bounds the step stays open.
    compute = WindowReport.from_dict(windows[3])
    assert compute.role_reports is not None
    pp1 = compute.role_reports["pp1"]
    assert pp1.top1 == "pp.schedule" and pp1.leaders["pp.schedule"] == 3
    assert "cannot tell which role the others wait for" in window_details(compute)

    run = load_run(tmp_path)
    table = run_report_text(run)
    assert "per role: pp0 top data.next_wait" in table and "pp1 top " in table
    assert plot_shares_over_time(run, tmp_path / "shares.png").read_bytes().startswith(b"\x89PNG")


def _fault_facts(records: list[dict[str, Any]]) -> list[Any]:
    """What each phase's fault decides, whatever the machine's load (the flat test above
    asserts each): the slowed role's top stage and the slowed rank leading it, the top stages
    of both roles when a whole role is slowed, and what the window line says bounds the step."""
    one, both, compute = (WindowReport.from_dict(w) for w in records[1:])
    assert one.role_reports and both.role_reports and compute.role_reports
    pp1 = one.role_reports["pp1"]
    schedule = compute.role_reports["pp1"]
    bounds = [
        "pp1 bounds the step" in window_details(one),
        "pp0 bounds the step" in window_details(both),
        "cannot tell which role the others wait for" in window_details(compute),
    ]
    return [
        (pp1.top1, pp1.leaders["data.next_wait"]),
        (both.role_reports["pp0"].top1, both.role_reports["pp1"].top1),
        (schedule.top1, schedule.leaders["pp.schedule"]),
        bounds,
    ]


def test_a_summarized_role_run_draws_each_roles_mean_shares_per_bucket(
    tmp_path: Path, flat_run: tuple[Path, list[dict[str, Any]]]
) -> None:
    """The run's records repeated past the length a report shows window by window: its
    buckets hold each role's own mean shares, and its figure a panel per role."""
    lines = (flat_run[0] / "windows.jsonl").read_text().splitlines()
    count = SHOWN_ALL + 4 * len(lines)
    with (tmp_path / "windows.jsonl").open("w") as out:
        for i in range(count):
            record = json.loads(lines[i % len(lines)])
            record.update(window=i, first_step=i * W, last_step=i * W + W - 1)
            out.write(json.dumps(record) + "\n")
    run = load_run(tmp_path)
    assert run.summarized
    records = [json.loads(line) for line in lines]
    for bucket in run.buckets:
        windows = range(bucket.first["window"], bucket.last["window"] + 1)
        for role in ("pp0", "pp1"):
            own = [records[w % len(records)]["role_reports"][role] for w in windows]
            own = [o["semantic_shares"] for o in own if o["shares_defined"]]
            expected = {s: sum(o[s] for o in own) / len(own) for s in own[0]}
            assert bucket.roles[role] == pytest.approx(expected)
    figure = plot_shares_over_time(run, tmp_path / "shares.png")
    assert figure.read_bytes().startswith(b"\x89PNG")


def test_pipeline_roles_collected_hierarchically_give_the_flat_answer(
    tmp_path: Path, flat_run: tuple[Path, list[dict[str, Any]]]
) -> None:
    """The same job with its 4 ranks as 4 nodes of one rank, collected as node summaries: each
    role's ranks are on two nodes, and their summaries combine into the same role reports."""
    hier = run_pipeline(_config(tmp_path, collect="hierarchical", per_node=1), deadline_s=240)
    assert [w["window"] for w in hier] == [0, 1, 2, 3]
    assert all(w["nodes"]["nodes"] == 4 and w["roles"] is None for w in hier)  # no rank list
    assert all(w["labels"].count("role_aware_needed") == 1 and w["top1"] is None for w in hier)
    expected = [
        ("data.next_wait", 3),
        ("data.next_wait", "pp.schedule"),
        ("pp.schedule", 3),
        [True, True, True],
    ]
    assert _fault_facts(hier) == _fault_facts(flat_run[1]) == expected
