"""Hierarchical collection with real spawned ranks, a real job TCPStore and real node stores:
every failure of the flat collector, at each level (a rank inside a node, a whole node, a late
node, a killed node leader), downgrades to a report that says what is missing and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from node_support import NodeJob, launch, limited
from stagefrontier.collect.node import node_layout, node_of
from stagefrontier.collect.node_tree import headed_levels, top_level
from stagefrontier.deadline import CLOSE_DEADLINE_S
from stagefrontier.formats.summary_codec import QUANTUM_FRACTION
from stagefrontier.formats.summary_packet import read_summary_packet


def test_a_healthy_job_is_complete_and_names_its_nodes(tmp_path: Path) -> None:
    # Rank 3's data stage outlasts every other rank's by 0.1 s in every step, by construction
    # (the others tell it how long theirs took), so it alone leads every step however late a
    # loaded machine wakes a rank; the ranks meet at each window's end, so its lag stays within
    # a window (about 0.5 s), far inside the collect timeout.
    job = NodeJob(
        out_dir=str(tmp_path),
        steps=20,
        window=5,
        leads_by=(3, 0.1),
        window_barrier=True,
        timeout_s=30.0,
    )
    windows = launch(job)
    assert [w["window"] for w in windows] == [0, 1, 2, 3]
    for w in windows:
        assert w["n_ranks_present"] == 4 and w["gather_ok"], limited(w)
        assert w["missing_ranks"] == [] and "ranks_present" not in w  # no per-rank tables
        hosts = w["nodes"].pop("hosts")  # of the nodes the summary's top prefixes name
        assert "1" in hosts and set(hosts) <= {"0", "1"}
        # node 1's part came compact: on a grid of at most QUANTUM_FRACTION of its shortest step
        rounding_bound = QUANTUM_FRACTION / 2 * w["exposed_s"] / w["n_steps"]
        assert 0 < w["nodes"].pop("rounding_s") <= rounding_bound
        assert w["nodes"] == {
            "node_size": 2,
            "nodes": 2,
            "present": 2,
            "missing": {},
            "partial": {},
        }
        assert "telemetry_limited" not in w["labels"]
        assert w["top1"] == "data.next_wait" and w["lead"]["ranks"] == [3]
        # When it ran: rank 0 saw its own rank's window only, and its times are those.
        assert w["wall_clock"]["start"] < w["wall_clock"]["end"]
    assert [w["wall_clock"]["end"] for w in windows[:-1]] == [
        w["wall_clock"]["start"] for w in windows[1:]
    ]
    assert not (tmp_path / "node-windows").exists()  # kept only when asked
    # The packets hold the combined summary, not rank columns, and read back to the report.
    packets = sorted((tmp_path / "packets").glob("*.json"))
    assert [p.name for p in packets] == [f"summary-00000{i}.json" for i in range(4)]
    for path, record in zip(packets, windows, strict=True):
        packet = read_summary_packet(path)
        assert packet.summary.n_ranks == 4 and packet.report.top1 == record["top1"]
        assert packet.meta["nodes"]["present"] == 2
        assert packet.meta["wall_clock"] == record["wall_clock"]
        # rank 0's host over the window, for compare's gate
        assert packet.meta["host_signals"] == record["host_signals"]
        assert record["host_signals"]["cpu_per_wall"] >= 0


def test_a_rank_missing_inside_a_node_is_named_by_its_node(tmp_path: Path) -> None:
    windows = launch(NodeJob(out_dir=str(tmp_path), die_at_step={3: 15}))
    assert [w["window"] for w in windows] == [0, 1, 2, 3]
    assert windows[0]["gather_ok"] and not limited(windows[0])
    for w in windows[1:]:
        assert w["missing_ranks"] == [3] and w["n_ranks_present"] == 3
        assert w["nodes"]["partial"] == {"1": [3]} and w["nodes"]["missing"] == {}
        why = limited(w)
        assert any("missing ranks [3]" in r for r in why), why
        assert any("node 1" in r and "rank(s) [3] sent no window" in r for r in why), why


def test_a_killed_node_leader_costs_its_node_and_the_other_nodes_keep_arriving(
    tmp_path: Path,
) -> None:
    windows = launch(NodeJob(out_dir=str(tmp_path), nodes=3, die_at_step={2: 15}))
    assert [w["window"] for w in windows] == [0, 1, 2, 3]
    assert windows[0]["gather_ok"] and windows[0]["nodes"]["present"] == 3
    for w in windows[1:]:
        assert w["n_ranks_present"] == 4 and w["missing_ranks"] == [2, 3]
        assert w["nodes"]["present"] == 2
        assert list(w["nodes"]["missing"]) == ["1"]
        assert "node 1 sent no summary within 4 s" in w["nodes"]["missing"]["1"]
        assert "telemetry_limited" in w["labels"]
        assert any("node 1 sent no summary" in r for r in limited(w)), limited(w)
    # Rank 3, the dead leader's member, lost its node store: it downgraded and exited cleanly
    # (launch asserts every surviving rank's exit code).
    assert (tmp_path / "done-rank3").exists()


def test_rank_0_killed_while_node_leaders_relay_the_survivors_say_it_once_and_keep_windows(
    tmp_path: Path,
) -> None:
    """Issue 37, item 4, under hierarchical collection: rank 0 (node 0's leader) dies by SIGKILL
    while the job's store stays up. Before: its node's member said only "store send failed,
    collection disabled" and dropped its windows; node 1's leader relayed parts nobody read,
    saying nothing. Now rank 1 says its leader is gone and keeps its own windows, rank 2 judges
    rank 0 gone from its done counter and keeps its node's windows (its own and rank 3's), each
    from the oldest window rank 0 never finished; every close within its deadline. Node 2's
    leader, rank 4, then fails to take its parts back from the store: it says so in one line
    and keeps its node's windows all the same (before, it stopped there and kept none)."""
    job = NodeJob(
        out_dir=str(tmp_path),
        nodes=3,
        steps=40,
        window=5,
        timeout_s=1.0,
        die_at_step={0: 20},
        take_back_fails=(4,),
        until_said={
            1: "its leader, rank 0, may have died",
            2: "rank 0 has collected no window",
            4: "rank 0 has collected no window",
        },
    )
    finished = len(launch(job))  # the windows rank 0 wrote before it died
    said = {r: json.loads((tmp_path / f"said-rank{r}.json").read_text()) for r in range(1, 6)}
    lines = {r: [w for w in said[r]["said"] if "this rank stops sending" in w] for r in said}
    assert len(lines[1]) == 1 and "keeps its own windows" in lines[1][0], said[1]
    assert "the store of node 0 (ranks 0-1" in lines[1][0] and "failed" in lines[1][0]
    for leader in (2, 4):
        assert len(lines[leader]) == 1 and "keeps its node's windows" in lines[leader][0], said
    assert lines[3] == [] and lines[5] == [], said  # their leaders live and keep their windows
    refused = [w for w in said[4]["said"] if "could not delete its parts" in w]
    assert len(refused) == 1 and "the store refused to give the parts back" in refused[0], said[4]
    assert not any("could not delete" in w for w in said[2]["said"]), said[2]
    for rank in (1, 2, 3, 4, 5):
        kept = [
            json.loads(line)["window"]
            for line in (tmp_path / f"rank-{rank}" / "windows.jsonl").read_text().splitlines()
        ]
        assert kept == list(range(kept[0], kept[-1] + 1)) and kept[0] <= finished, (rank, kept)
        assert said[rank]["close_s"] < CLOSE_DEADLINE_S


def test_a_late_node_is_missing_from_that_window_only_until_it_catches_up(
    tmp_path: Path,
) -> None:
    # Windows of 0.5 s; node 1's leader holds window 1's part 3 s, three times the root's 1 s
    # wait (windows it cannot queue meanwhile are dropped there and said so), then catches up.
    job = NodeJob(
        out_dir=str(tmp_path), steps=160, step_s=0.05, timeout_s=0.5, late_part_s={1: {1: 3.0}}
    )
    windows = launch(job)
    assert [w["window"] for w in windows] == list(range(16))
    late = windows[1]
    assert late["missing_ranks"] == [2, 3] and list(late["nodes"]["missing"]) == ["1"]
    assert "node 1 sent no summary within 1 s" in late["nodes"]["missing"]["1"]
    assert windows[-1]["gather_ok"], [limited(w) for w in windows]


def test_a_dead_head_of_a_group_costs_only_its_node_its_members_re_parent(
    tmp_path: Path,
) -> None:
    # 4 nodes of 2 ranks, fan-in 2: node 2's leader (rank 4) heads nodes 2-3, node 0 the rest.
    # It dies in window 1; node 3 keeps sending its part, which node 0 then reads itself. The
    # ranks start together and the living ones meet at each window's end, so no rank of 8 on a
    # loaded machine lags past the 1.5 s wait (window 0 once missed one so).
    job = NodeJob(
        out_dir=str(tmp_path),
        nodes=4,
        fan_in=2,
        die_at_step={4: 15},
        timeout_s=1.5,
        window_barrier=True,
    )
    windows = launch(job)
    assert [w["window"] for w in windows] == [0, 1, 2, 3]
    assert windows[0]["gather_ok"] and windows[0]["n_ranks_present"] == 8, limited(windows[0])
    assert {4, 5} <= set(windows[1]["missing_ranks"])
    for w in windows[2:]:  # within two windows of the death, its group is back
        assert w["n_ranks_present"] == 6 and w["missing_ranks"] == [4, 5], limited(w)
        missing = w["nodes"]["missing"]
        assert list(missing) == ["2"], missing
        assert "node 3 of its group re-parented to node 0" in missing["2"]
        assert w["nodes"]["present"] == 3


def test_a_disabled_rank_inside_a_node_is_missing_with_that_reason(tmp_path: Path) -> None:
    windows = launch(NodeJob(out_dir=str(tmp_path), silent_ranks=(3,)))
    assert [w["window"] for w in windows] == [0, 1, 2, 3]
    for w in windows:
        assert w["missing_ranks"] == [3]
        assert any("[3] send no windows: their timers are disabled" in r for r in limited(w))
        assert not any("sent no window to the node leader" in r for r in limited(w))


def test_without_the_node_layout_the_hosts_make_the_nodes(tmp_path: Path) -> None:
    hosts = ("host-a", "host-a", "host-b", "host-b")
    windows = launch(NodeJob(out_dir=str(tmp_path / "hosts"), layout_env=False, hosts=hosts))
    assert [w["window"] for w in windows] == [0, 1, 2, 3]
    for w in windows:
        assert w["gather_ok"] and "ranks_present" not in w, limited(w)  # node summaries
        assert (w["nodes"]["nodes"], w["nodes"]["node_size"], w["nodes"]["present"]) == (2, 2, 2)
    # Hosts that are not whole nodes of consecutive ranks: every rank collects flat.
    mixed = ("host-a", "host-b", "host-a", "host-b")
    windows = launch(NodeJob(out_dir=str(tmp_path / "mixed"), layout_env=False, hosts=mixed))
    assert [w["window"] for w in windows] == [0, 1, 2, 3]
    for w in windows:
        assert w["gather_ok"] and w["ranks_present"] == [0, 1, 2, 3]  # a flat record
        assert "nodes" not in w


def test_node_identity_follows_torchrun_and_rejects_what_cannot_hold() -> None:
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "2"}
    node = node_of(9, 16, env)
    assert (node.node, node.first_rank, list(node.ranks)) == (2, 8, [8, 9, 10, 11])
    assert node.label().startswith("node 2 (ranks 8-11")
    assert node_layout(8, 4) == {0: range(0, 4), 1: range(4, 8)}
    with pytest.raises(ValueError, match="LOCAL_RANK and LOCAL_WORLD_SIZE are not set"):
        node_of(1, 4, {})
    with pytest.raises(ValueError, match="not whole nodes"):
        node_of(1, 6, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="GROUP_RANK=1 but rank 9"):
        node_of(9, 16, {**env, "GROUP_RANK": "1"})
    with pytest.raises(ValueError, match="does not fit"):
        node_of(9, 16, {**env, "LOCAL_RANK": "4"})


def test_the_tree_bounds_every_leaders_reads_by_the_fan_in() -> None:
    assert headed_levels(1, 1, 4) == [] and top_level(0, 1, 4) == 0
    levels = headed_levels(0, 10, 3)  # levels of 1, 3 and 9 nodes below node 0
    assert [(lv.level, lv.children, lv.node_count) for lv in levels] == [
        (1, (1, 2), 3),
        (2, (3, 6), 9),
        (3, (9,), 10),
    ]
    assert [lv.children for lv in headed_levels(3, 10, 3)] == [(4, 5)]
    assert top_level(3, 10, 3) == 1 and top_level(9, 10, 3) == 0  # node 9 heads no one
    nodes, fan_in = 12_500, 64  # 100,000 ranks of 8
    reads = [sum(len(lv.children) for lv in headed_levels(n, nodes, fan_in)) for n in range(nodes)]
    assert max(reads) <= 3 * (fan_in - 1) and sum(reads) == nodes - 1
    with pytest.raises(ValueError, match="fan-in"):
        headed_levels(0, 4, 1)
