"""The profiler router under hierarchical collection, in a real job: the demo's Gloo DDP model as
2 torchrun agents of 2 ranks each (a c10d rendezvous, node stores on loopback, node parts
through the job's store), a 120 ms data stall on rank 2 (node 1) from step 0, run flat and
hierarchically by ``python -m stagefrontier.demo.scale_check --router``.

Rank 0 never sees a rank column: it decides on the combined node summaries, takes the reference
rank from the typical ranks the node parts carry, and confirms the traces against the rows of
the captured steps that the named ranks' node leaders sent up because the request asked for
them. The incident must say what the flat router says of the same stall
(``test_router_distributed.py``) and the flat run of the same job."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

pytest.importorskip("torch")

from node_support import check_communication_read_as_flat
from stagefrontier.demo.launch import read_windows
from stagefrontier.demo.scale_check import main
from trace_support import settled_incidents

NODES, PER_NODE = 2, 2
STEPS, WINDOW = 60, 10  # room for a decision made late, on a loaded machine


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The job run flat and hierarchically (``tmp_path/flat``, ``tmp_path/hierarchical``, the
    node leaders' windows kept) and what the comparison printed."""
    tmp_path = tmp_path_factory.mktemp("router_hierarchical")
    argv = ["--nodes", str(NODES), "--per-node", str(PER_NODE), "--steps", str(STEPS)]
    argv += ["--window", str(WINDOW), "--fault", "data@2:120ms", "--router", "--out", str(tmp_path)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(argv)  # its exit code says whether every window's top and lead agreed: not asserted
    return tmp_path, printed.getvalue()


def test_a_stall_opens_one_confirmed_incident_on_its_rank_from_node_summaries(
    runs: tuple[Path, str],
) -> None:
    tmp_path, printed = runs
    for run in ("flat", "hierarchical"):  # each run's incident, after the comparison table
        assert f"{run}: incident w" in printed and "data.next_wait on rank 2" in printed
    windows = read_windows(tmp_path / "hierarchical")
    assert [w["window"] for w in windows] == list(range(STEPS // WINDOW))
    for w in windows:  # collected as node summaries: no rank columns reached rank 0
        assert "ranks_present" not in w and w["nodes"]["nodes"] == NODES, w
    flat = settled_incidents(tmp_path / "flat")
    assert len(flat) == 1 and flat[0]["confirmed"] is True, flat
    incidents = settled_incidents(tmp_path / "hierarchical")
    assert len(incidents) == 1, incidents
    incident = incidents[0]
    assert incident["trigger"] == "window" and incident["stage"] == "data.next_wait"
    assert incident["leader_rank"] == 2
    assert (flat[0]["stage"], flat[0]["leader_rank"]) == ("data.next_wait", 2)
    reference = incident["reference_rank"]
    assert reference != 2
    assert any(f"reference rank {reference}: a typical time" in r for r in incident["reasons"])
    assert incident["ranks"] == sorted([2, reference])
    assert incident["captured"] and incident["confirmed"] is True, incident["reasons"]
    assert incident["live_shares"]["data.next_wait"] > 0  # from the rows the parts carried
    first, last = incident["steps"]
    assert last - first + 1 == 5
    top = incident["op_diff"][0]  # the user's function that sleeps, as flat
    assert "faults.py" in top["name"] and "delay" in top["name"] and "sleep" in top["name"], top
    assert top["suspect_ms_per_step"] > 100 > 1 > top["reference_ms_per_step"]
    assert flat[0]["op_diff"][0]["name"] == top["name"]
    # Rank 0 holds the captured steps' rows only: the capture's cost, no baseline beside it.
    assert incident["capture_step_ms"] > 0 and incident["baseline_step_ms"] is None
    folder = tmp_path / "hierarchical" / "incidents" / incident["id"]
    assert sorted(folder.glob("*.pt.trace.json*")) == sorted(
        folder / f"rank{r}.pt.trace.json.gz" for r in (2, reference)
    )


def test_the_collectives_read_from_node_summaries_as_from_every_ranks_waits(
    runs: tuple[Path, str],
) -> None:
    """Rank 0 reads each window's timed collectives from the node summaries as the flat reading
    of the very windows the node leaders kept: transfer, wait, spread and arrival exactly, the
    same late rank, the lateness within the stated bound. Rank 2's data stall holds rank 0 too
    (DDP's forward broadcasts rank 0's buffers, and rank 0 waits there for rank 2), so both reach
    backward's all-reduce about as late: no run names a rank there other than rank 2 (a late
    rank must be late alone)."""
    tmp_path = runs[0]
    for run in ("flat", "hierarchical"):
        named = [w["communication"]["late_rank"] for w in read_windows(tmp_path / run)]
        assert set(named) <= {2, None}, (run, named)
    check_communication_read_as_flat(tmp_path / "hierarchical", NODES * PER_NODE)
