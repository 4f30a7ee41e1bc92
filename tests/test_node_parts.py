"""Node parts without processes: the envelope's round trip and its rejections, a leader's part,
a head's combination (a child that cannot join is reported, not raised), and the node names the
hierarchical record uses."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from stagefrontier.collect.node import NodeIdentity
from stagefrontier.collect.node_payload import (
    Group,
    analyze_group,
    combine_groups,
    decode_group,
    node_group,
)
from stagefrontier.collect.node_wire import (
    MAX_NOTES,
    NodePart,
    capped_notes,
    decode_node_part,
    encode_node_part,
)
from stagefrontier.errors import ReportFormatError
from stagefrontier.formats.summary_codec import QUANTUM_FRACTION
from stagefrontier.window.merged import analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "step.other_cpu_wall")
MS = 1_000_000


def _window(rank: int, slow_ms: int = 0, stages: tuple[str, ...] = STAGES) -> RankWindow:
    rng = np.random.default_rng(rank)
    durations = rng.integers(9 * MS, 11 * MS, size=(10, len(stages)))
    durations[:, 0] += slow_ms * MS
    durations[:, -1] = 0
    return RankWindow(
        0,
        0,
        9,
        rank,
        stages,
        durations,
        durations.sum(axis=1),
        hostname="host-a" if rank < 4 else "host-b",
        local_rank=rank % 4,
    )


def _node(index: int) -> NodeIdentity:
    return NodeIdentity(node=index, first_rank=4 * index, size=4, host=f"host-{index}")


def _group(index: int, slow: dict[int, int]) -> Group:
    windows = [_window(r, slow.get(r, 0)) for r in _node(index).ranks]
    return node_group(_node(index), windows[0], windows, [], [], None)


def test_a_part_round_trips_and_a_damaged_one_is_refused() -> None:
    part = NodePart(
        window=3,
        first_step=60,
        last_step=79,
        first_node=4,
        node_count=4,
        missing_nodes={5: "node 5 sent no summary"},
        missing_ranks=(17,),
        notes=("a note",),
        hosts={4: "host-e"},
        contract_violations=2,
        overlap_ns=10,
        self_cost_max={"total_s": 0.002, "fraction": 0.01},
        body=b"xyz",
    )
    data = encode_node_part(part)
    assert decode_node_part(data) == part
    for bad, why in (
        (data[:10], "too short"),
        (b"XXXX" + data[4:], "magic"),
        (data + b"!", "header declares"),
        (encode_node_part(replace(part, first_node=-1)), "first_node"),
        (encode_node_part(replace(part, missing_nodes={9: "?"})), "outside the group"),
        (encode_node_part(replace(part, notes=("ok", 3))), "notes"),
    ):
        with pytest.raises(ReportFormatError, match=why):
            decode_node_part(bad)


def test_notes_are_capped_and_say_how_many_were_left_out() -> None:
    notes = capped_notes([f"note {i}" for i in range(100)])
    assert len(notes) == MAX_NOTES and notes[-1] == f"... and {100 - MAX_NOTES + 1} more note(s)"


def test_combined_node_groups_give_the_flat_analysis_of_the_same_windows() -> None:
    slow = {5: 30}
    groups = [_group(i, slow) for i in range(2)]
    top = combine_groups(groups[0], 2, {1: decode_group(groups[1].encode())}, {}, [], 4)
    analyzed = analyze_group(top, _window(0), 8, 4, None)
    assert analyzed is not None and analyzed.summary is not None
    flat = analyze_merged(merge_windows([_window(r, slow.get(r, 0)) for r in range(8)], 8)).report
    assert analyzed.report.top1 == flat.top1 == "data.next_wait"
    assert analyzed.report.leaders == flat.leaders
    rounding = analyzed.summary.rounding_s  # node 1's part came compact: on a grid
    shortest_step = float(analyzed.summary.top_prefix[:, -1, 0].min())
    assert 0 < rounding <= shortest_step * QUANTUM_FRACTION / 2
    for stage in STAGES:  # an advance sums one frontier difference per step
        assert abs(analyzed.report.advances[stage] - flat.advances[stage]) <= 2 * 10 * rounding
    record = analyzed.record
    assert record["nodes"]["rounding_s"] == rounding
    assert record["lead"] == {
        "stage": "data.next_wait",
        "ranks": [5],
        "hosts": ["node1@host-b"],
        "scope": "rank",
    }
    assert record["hosts"]["5"] == "host-b" and record["nodes"]["present"] == 2
    assert set(record["self_cost"]["fraction"]) == {"max"}  # maxima merge, medians do not
    assert record["paused_steps"] == 0 and record["step_wall_s"] == pytest.approx(
        sum(float(w.wall_ns.sum()) for w in (_window(r, slow.get(r, 0)) for r in range(8))) * 1e-9
    )
    assert analyzed.metrics.window == 0  # the metrics sinks read the same record


def test_a_node_part_is_under_a_quarter_of_its_ranks_flat_windows() -> None:
    """8 ranks, 20 steps of the 6 default stages with lognormal times: the part a leader sends
    up the job's store against the 8 windows the flat path sends there."""
    from stagefrontier import DEFAULT_STAGES
    from stagefrontier.collect.wire import encode_window

    rng = np.random.default_rng(25)
    medians = np.array([12, 45, 95, 10, 20, 10]) * MS
    node = NodeIdentity(node=1, first_rank=8, size=8, host="host-b")
    windows = []
    for rank in node.ranks:
        durations = np.rint(medians * rng.lognormal(0, 0.15, size=(20, 6))).astype(np.int64)
        windows.append(
            RankWindow(
                0,
                0,
                19,
                rank,
                tuple(DEFAULT_STAGES),
                durations,
                durations.sum(axis=1),
                hostname="host-b",
                local_rank=rank - 8,
            )
        )
    part = node_group(node, windows[0], windows, [], [], None).encode()
    flat = sum(len(encode_window(w)) for w in windows)
    assert len(part) <= 0.25 * flat, (len(part), flat)


def test_parts_carry_a_typical_rank_per_stage_and_the_rows_a_request_named() -> None:
    """Node 0's data times are ranks 0-3 at +0, +10, +20, +30 ms, node 1's +40..+70 ms: each
    node's typical rank is its lower median (1, 5), rank 0's the weighted lower median of the
    two (1). Rows travel only for the ranks and steps a request named, exactly."""
    slow = {r: 10 * r for r in range(8)}
    wanted = [(frozenset({5}), 3, 6), (frozenset({2, 7}), 8, 12)]  # the second ends past 9
    groups = []
    for i in range(2):
        windows = [_window(r, slow[r]) for r in _node(i).ranks]
        groups.append(node_group(_node(i), windows[0], windows, [], [], None, wanted))
    assert [g.part.typical[0][0] for g in groups] == [1, 5]
    assert groups[1].part.typical[0][1] == round(_window(5, 50).durations_ns[:, 0].mean())
    assert set(groups[0].part.rows) == {2} and set(groups[1].part.rows) == {5, 7}
    top = combine_groups(groups[0], 2, {1: decode_group(groups[1].encode())}, {}, [], 4)
    analyzed = analyze_group(top, _window(0), 8, 4, None)
    assert analyzed is not None and analyzed.typical_ranks is not None
    assert analyzed.typical_ranks["data.next_wait"] == 1
    rows = analyzed.named_rows
    assert rows is not None and sorted(rows) == [2, 5, 7]
    first, block = rows[5]
    assert first == 3 and block.shape == (4, len(STAGES))
    assert np.array_equal(block, _window(5, 50).durations_ns[3:7] * 1e-9)
    assert rows[7][0] == 8 and rows[7][1].shape[0] == 2  # steps 8-9: the window ends at 9
    bad = replace(groups[1].part, rows={5: (3, ((1, 2),))})
    with pytest.raises(ReportFormatError, match="one value per stage"):
        decode_group(replace(groups[1], part=bad).encode())
    outside = replace(groups[1].part, rows={5: (9, ((1, 2, 3), (1, 2, 3)))})
    with pytest.raises(ReportFormatError, match="rows of the window's steps"):
        decode_node_part(encode_node_part(outside))


def test_role_groups_that_span_nodes_combine_into_the_flat_role_reports() -> None:
    """Ranks 0, 1, 4, 5 play pp0 and 2, 3, 6, 7 pp1: each node holds both roles and each role
    spans both nodes. Rank 6 stalls in data. The role reports from the node parts are those of
    the flat analysis of the same windows; a node whose ranks all play one role sends its
    summary once."""
    roles = {r: "pp0" if r % 4 < 2 else "pp1" for r in range(8)}
    windows = [replace(_window(r, 30 if r == 6 else 0), role=roles[r]) for r in range(8)]
    parts = [
        node_group(_node(i), windows[4 * i], windows[4 * i : 4 * i + 4], [], [], None)
        for i in range(2)
    ]
    assert set(parts[0].roles) == {"pp0", "pp1"} and parts[0].roles["pp0"].n_ranks == 2
    top = combine_groups(parts[0], 2, {1: decode_group(parts[1].encode())}, {}, [], 4)
    analyzed = analyze_group(top, windows[0], 8, 4, None)
    assert analyzed is not None
    flat = analyze_merged(merge_windows(windows, 8)).report
    hier = analyzed.report
    assert flat.has("role_aware_needed") and hier.has("role_aware_needed")
    assert flat.top1 is None and hier.top1 is None and hier.roles is None
    assert flat.role_reports is not None and hier.role_reports is not None
    assert set(hier.role_reports) == set(flat.role_reports) == {"pp0", "pp1"}
    for role, mine in hier.role_reports.items():
        theirs = flat.role_reports[role]
        assert (mine.top1, mine.leaders, mine.n_ranks) == (theirs.top1, theirs.leaders, 4)
        for stage, share in theirs.semantic_shares.items():
            assert abs(mine.semantic_shares[stage] - share) < 1e-3
    assert hier.role_reports["pp1"].leaders["data.next_wait"] == 6
    # One role per node: the part says so in a few bytes instead of a second summary.
    aligned = [replace(w, role="pp0" if w.rank < 4 else "pp1") for w in windows]
    one = node_group(_node(1), aligned[4], aligned[4:], [], [], None)
    again = decode_group(one.encode())
    assert again.roles["pp1"] is again.summary
    assert len(one.encode()) < len(parts[1].encode())


def test_a_child_that_cannot_join_is_reported_mismatched_with_its_ranks() -> None:
    own = _group(0, {})
    windows = [_window(r, stages=(*STAGES[:-1], "extra", STAGES[-1])) for r in range(4, 8)]
    other = node_group(_node(1), windows[0], windows, [], [], None)
    top = combine_groups(own, 2, {1: other}, {}, [], 4)
    assert top.part.mismatched_ranks == (4, 5, 6, 7) and top.summary.n_ranks == 4
    assert any(n.startswith("nodes 1 not combined") for n in top.part.notes)


def test_missing_children_and_ranks_reach_the_report_with_their_reasons() -> None:
    own = _group(0, {})
    top = combine_groups(
        replace(own, part=replace(own.part, missing_ranks=(3,))),
        3,
        {},
        {range(1, 3): "nodes 1-2 sent no summary within 4 s of the window end"},
        [],
        4,
    )
    analyzed = analyze_group(top, _window(0), 12, 4, None)
    assert analyzed is not None
    record = analyzed.record
    assert record["missing_ranks"] == [3, *range(4, 12)] and not record["gather_ok"]
    assert record["nodes"]["missing"] == {
        "1": "nodes 1-2 sent no summary within 4 s of the window end",
        "2": "nodes 1-2 sent no summary within 4 s of the window end",
    }
    assert record["nodes"]["partial"] == {"0": [3]}
    assert "telemetry_limited" in record["labels"]


def test_hierarchical_collection_is_chosen_by_name_or_above_the_auto_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stagefrontier.collect import collects_hierarchically
    from stagefrontier.collect.config import AUTO_HIERARCHICAL_ABOVE, CollectConfig

    layout = {"RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    for name, value in {**layout, "WORLD_SIZE": "8"}.items():
        monkeypatch.setenv(name, value)
    assert collects_hierarchically(CollectConfig(mode="hierarchical"))
    assert not collects_hierarchically(CollectConfig(mode="auto"))
    assert not collects_hierarchically(CollectConfig(mode="store"))
    monkeypatch.setenv("WORLD_SIZE", str(4 * (AUTO_HIERARCHICAL_ABOVE // 4 + 1)))
    assert collects_hierarchically(CollectConfig(mode="auto"))
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # a launcher that does not say: the hosts will
    assert collects_hierarchically(CollectConfig(mode="auto"))
    assert collects_hierarchically(CollectConfig(mode="hierarchical"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not collects_hierarchically(CollectConfig(mode="hierarchical"))


def test_host_names_form_nodes_only_as_a_launcher_lays_them_out() -> None:
    from stagefrontier.collect.node import host_layout

    assert host_layout(["a", "a", "b", "b", "c", "c"]) == 2
    assert host_layout(["a"] * 4) == 4
    for hosts, why in (
        (["a", "a", "b"], "not whole nodes of 2"),
        (["a", "b", "a", "b"], "not all on one host of their own"),
        (["a", "a", "b", "c"], "not all on one host"),
        ([], "no host names"),
    ):
        with pytest.raises(ValueError, match=why):
            host_layout(hosts)


def test_a_corrupt_part_in_a_real_store_is_rejected_with_a_note_and_the_wait_goes_on() -> None:
    import time

    pytest.importorskip("torch")
    from stagefrontier.collect.node_store import loopback_store
    from stagefrontier.collect.store_keys import PeerWait, get_payload

    store = loopback_store()
    good = _group(1, {})
    store.set("w0/l0/n1", good.encode())
    store.set("w0/l0/n2", b"not a node part at all")
    read: list[str] = []
    parts = {}
    notes: list[str] = []

    def take(node: int, key: str) -> None:
        parts[node] = decode_group(get_payload(store, key, read))

    wait = PeerWait("node", "summary")
    left = wait.wait(
        store,
        {1: "w0/l0/n1", 2: "w0/l0/n2", 3: "w0/l0/n3"},
        deadline=time.monotonic() + 0.2,
        grace=time.monotonic(),
        take=take,
        notes=notes,
    )
    assert list(parts) == [1] and parts[1].summary.n_ranks == 4
    assert left == {3: "w0/l0/n3"} and wait.absent == {3}
    assert len(notes) == 1 and notes[0].startswith(
        "node 2 summary rejected: node payload: bad magic"
    )
    assert sorted(read) == ["w0/l0/n1", "w0/l0/n2"]  # both read, so both deleted after


def test_cuda_event_samples_travel_as_node_totals_and_label_as_flat() -> None:
    from stagefrontier.analysis.side import EVENT_NOT_SAMPLED, EVENT_READY

    def sampled(rank: int) -> RankWindow:
        w = _window(rank)
        state = np.full(10, EVENT_NOT_SAMPLED, dtype=np.int8)
        state[::2] = EVENT_READY
        ms = np.where(state == EVENT_READY, 9.0 + rank, np.nan)
        return replace(w, event_ms=ms, event_state=state, forward_stage=STAGES[1])

    groups = [
        node_group(_node(i), sampled(4 * i), [sampled(r) for r in _node(i).ranks], [], [], None)
        for i in range(2)
    ]
    assert groups[1].part.events[:2] == (20.0, 20.0)  # 4 ranks x 5 sampled steps, all ready
    top = combine_groups(groups[0], 2, {1: decode_group(groups[1].encode())}, {}, [], 4)
    analyzed = analyze_group(top, sampled(0), 8, 4, None)
    assert analyzed is not None
    flat = analyze_merged(merge_windows([sampled(r) for r in range(8)], 8)).report
    hier = analyzed.report
    assert flat.forward_event is not None and hier.forward_event is not None
    assert hier.forward_event == pytest.approx(flat.forward_event, rel=1e-12)
    events = {"forward_device_supported", "forward_host_overhead_suspected",
              "forward_spillover_suspected", "forward_event_scope_limited"}  # fmt: skip
    assert set(hier.labels) & events == set(flat.labels) & events
    assert set(flat.labels) & events, flat.labels  # the samples decide a label here
