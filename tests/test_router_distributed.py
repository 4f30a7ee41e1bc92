"""The profiler router in real 4-rank Gloo DDP runs (forked from the session's server around an
ephemeral-port store: ``rank_support.START_METHOD``).

Each run is 30 steps in windows of 10: the stall starts at step 0, rank 0 decides after window 0
and the capture (5 steps, from a start margin derived from the measured step time and the
router's poll interval) ends well inside the run. Faults only sleep, so every run reproduces the
fault-free run's losses.

A stall is four times the fault-free run's median step, measured in this session (120 ms at
least), and its run's deadline grows with it: on a busy machine the step and its noise grow with
the load while a fixed stall does not, and a 120 ms stall against 336 ms steps at load 32 was
co-critical in window 0 and decided only in window 1, its capture ending at step 28 of 30;
later still, it ran past the run's end.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

from rank_support import START_METHOD
from stagefrontier.demo import DemoConfig, launch, parse_fault
from stagefrontier.route.offline import reduce_offline
from trace_support import settled_incidents

RANKS = 4
STEPS = 30
WINDOW = 10
DEADLINE_S = 240.0


def _run(
    tmp_path: Path,
    name: str,
    faults: tuple[str, ...] = (),
    deadline_s: float = DEADLINE_S,
    **kwargs: Any,
) -> Any:
    config = DemoConfig(
        ranks=RANKS,
        steps=kwargs.pop("steps", STEPS),
        window=WINDOW,
        faults=tuple(parse_fault(f) for f in faults),
        out_dir=str(tmp_path / name),
        collect_timeout_s=5.0,
        quiet=True,
        router=True,
        router_timeout_s=kwargs.pop("router_timeout_s", 10.0),
        **kwargs,
    )
    return launch(config, deadline_s=deadline_s, start_method=START_METHOD)


def _stall_ms(healthy: Any) -> int:
    """Four times the fault-free run's median step, 120 ms at least."""
    steps = [s for times in healthy.step_s.values() for s in times]
    return max(120, round(4 * float(np.median(steps)) * 1e3))


def _stall_deadline_s(
    healthy: Any, stall_ms: int, steps: int = STEPS, stalled: int = STEPS
) -> float:
    """Three times what a run of ``steps`` steps, ``stalled`` of them stalled, should take (the
    fault-free run's wall time per step and the stall in each stalled step), ``DEADLINE_S`` at
    least: the stall grows with the load."""
    healthy_s = float(healthy.wall_s) * steps / STEPS
    return max(DEADLINE_S, 3 * (healthy_s + stalled * stall_ms / 1e3))


def _traces(out: Path) -> list[Path]:
    return sorted(out.rglob("*.pt.trace.json*"))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _run(tmp_path_factory.mktemp("healthy"), "healthy")


def test_a_run_without_a_fault_opens_no_incident(healthy: Any) -> None:
    assert len(healthy.windows) == STEPS // WINDOW
    assert settled_incidents(healthy.out_dir) == []
    assert _traces(healthy.out_dir) == []


@pytest.mark.parametrize(
    ("fault", "stage", "suspect"),
    [
        ("data@2", "data.next_wait", 2),
        ("forward@3", "model.fwd_loss_cpu_wall", 3),
    ],
)
def test_a_stall_opens_one_confirmed_incident_on_its_rank(
    tmp_path: Path, healthy: Any, fault: str, stage: str, suspect: int
) -> None:
    stall_ms = _stall_ms(healthy)
    deadline_s = _stall_deadline_s(healthy, stall_ms)
    run = _run(tmp_path, "stall", (f"{fault}:{stall_ms}ms",), deadline_s)
    incidents = settled_incidents(run.out_dir)
    assert len(incidents) == 1, incidents
    incident = incidents[0]
    assert incident["window"] is not None and incident["window"] < 3  # the stall starts at 0
    assert incident["stage"] == stage
    assert incident["leader_rank"] == suspect
    reference = incident["reference_rank"]
    assert reference != suspect
    assert incident["ranks"] == sorted([suspect, reference])
    assert incident["captured"] and incident["confirmed"] is True, incident["reasons"]
    assert incident["max_share_diff"] < 0.05
    first, last = incident["steps"]
    assert last - first + 1 == 5
    # Only the two named ranks wrote a trace.
    folder = run.out_dir / "incidents" / incident["id"]
    assert _traces(run.out_dir) == sorted(
        folder / f"rank{r}.pt.trace.json.gz" for r in (suspect, reference)
    )
    # The op diff's first entry is the user's function that sleeps, not a bare builtin.
    top = incident["op_diff"][0]
    assert "faults.py" in top["name"] and "delay" in top["name"], top
    assert "sleep" in top["name"]
    assert top["suspect_ms_per_step"] > 100 > 1 > top["reference_ms_per_step"]
    assert incident["capture_step_ms"] > 0 and incident["baseline_step_ms"] > 0
    assert (folder / "incident.md").exists() and (folder / "incident.html").exists()
    assert run.losses == healthy.losses
    # Offline, `stagefrontier incident` reaches the same verdict from the run's packets.
    offline = tmp_path / "copy"
    shutil.copytree(run.out_dir, offline)
    path = offline / "incidents" / incident["id"] / "incident.json"
    unreduced = {**incident, "confirmed": None, "max_share_diff": None, "op_diff": []}
    path.write_text(json.dumps(unreduced))
    again, reduced = reduce_offline(path.parent)
    assert reduced and again["confirmed"] is True
    assert again["max_share_diff"] == incident["max_share_diff"]
    assert again["op_diff"][0]["name"] == top["name"]


def test_a_suspect_rank_that_never_captures_is_recorded_not_captured(
    tmp_path: Path, healthy: Any
) -> None:
    """Rank 2 runs without a router (disabled): it never answers. Rank 0 records the incident
    as not captured with the reason, after the timeout; every rank trains as without it."""
    run = _run(tmp_path, "disabled", ("data@2:120ms",), router_off_ranks=(2,), router_timeout_s=2.0)
    incidents = settled_incidents(run.out_dir)
    assert len(incidents) == 1
    incident = incidents[0]
    assert incident["leader_rank"] == 2
    assert not incident["captured"] and incident["confirmed"] is None
    assert 2 not in incident["ranks"]
    assert any("rank 2 never answered" in r for r in incident["reasons"]), incident["reasons"]
    assert any(r.startswith("not captured") for r in incident["reasons"])
    assert len(run.windows) == STEPS // WINDOW
    assert run.losses == healthy.losses


def test_a_slowdown_of_every_rank_is_named_and_never_captured(tmp_path: Path, healthy: Any) -> None:
    """Every rank's data loading slows from step 40: no rank leads, the live regression check
    flags the first slowed window as the data stage's, on every rank, and the router captures
    nothing: no rank is left to serve as the suspect's reference. The slowdown is four times
    the fault-free run's median step (``_stall_ms``): a fixed 100 ms went unflagged beside CPU
    burners, where a step took about 300 ms and a window's median swung by a third."""
    stall_ms = _stall_ms(healthy)
    deadline_s = _stall_deadline_s(healthy, stall_ms, steps=70, stalled=30)
    run = _run(tmp_path, "every", (f"data@all:{stall_ms}ms,from=40",), deadline_s, steps=70)
    records = [
        json.loads(line) for line in (run.out_dir / "windows.jsonl").read_text().split("\n") if line
    ]
    flagged = [r for r in records if r.get("regression")]
    assert flagged and flagged[0]["window"] in (4, 5), flagged
    regression = flagged[0]["regression"]
    assert regression["kind"] == "stage" and regression["top_stage"] == "data.next_wait"
    assert regression["all_ranks"], regression
    assert settled_incidents(run.out_dir) == []
    assert _traces(run.out_dir) == []
