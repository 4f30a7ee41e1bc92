"""Per-role reports on hand-computed matrices: each role analyzed as its own window, leaders
named by their rank in the whole window, and the role-list problems as errors or downgrades."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier.analysis.across_roles import bounding_role
from stagefrontier.analysis.side import SideEvidence
from stagefrontier.errors import RolesError
from stagefrontier.record.mesh_roles import mesh_roles
from stagefrontier.render.text import window_details, window_report_text
from stagefrontier.render.verdict import verdict
from stagefrontier.window.merged import analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow

STAGES = ["data.next_wait", "pp.schedule", "dp.grad_sync", "step.other_cpu_wall"]


def two_roles() -> np.ndarray:
    """3 steps x 4 ranks. pp0 = ranks 0, 1; pp1 = ranks 2, 3 (seconds).

    pp0: rank 0 (1, 4, 0, 0), rank 1 (1, 2, 2, 0): prefixes (1, 5, 5, 5) and (1, 3, 5, 5), so
    the frontier is (1, 5, 5, 5) and the advances (1, 4, 0, 0): 5 s exposed per step.
    pp1: rank 2 (3, 2, 0, 0), rank 3 (1, 2, 2, 1): prefixes (3, 5, 5, 5) and (1, 3, 5, 6),
    frontier (3, 5, 5, 6), advances (3, 2, 0, 1): 6 s exposed per step.
    """
    step = np.array([[1, 4, 0, 0], [1, 2, 2, 0], [3, 2, 0, 0], [1, 2, 2, 1]], dtype=float)
    return np.repeat(step[None], 3, axis=0)


ROLES = ["pp0", "pp0", "pp1", "pp1"]


def test_role_advances_sum_to_each_roles_exposed_time() -> None:
    report = sf.analyze(two_roles(), STAGES, roles=ROLES)
    assert report.has("role_aware_needed") and report.top1 is None
    assert report.role_reports is not None and set(report.role_reports) == {"pp0", "pp1"}
    pp0, pp1 = report.role_reports["pp0"], report.role_reports["pp1"]
    assert [pp0.advances[s] for s in STAGES] == pytest.approx([3, 12, 0, 0])
    assert [pp1.advances[s] for s in STAGES] == pytest.approx([9, 6, 0, 3])
    assert pp0.exposed_s == pytest.approx(15) and pp1.exposed_s == pytest.approx(18)
    for rep in (pp0, pp1):
        assert sum(rep.advances.values()) == pytest.approx(rep.exposed_s)
        assert not rep.has("role_aware_needed") and rep.roles is None
    assert (pp0.top1, pp1.top1) == ("pp.schedule", "data.next_wait")
    # Leaders are ranks of the whole window, not positions inside the role.
    assert pp0.leaders["pp.schedule"] == 0
    assert pp1.leaders["data.next_wait"] == 2
    assert pp1.localization["data.next_wait"].leading_ranks == [2]
    assert pp1.semantic_localization["data.next_wait"].leader_rank == 2
    assert pp1.leaders["step.other_cpu_wall"] == 3
    assert report.role_shares == {
        role: rep.semantic_shares for role, rep in report.role_reports.items()
    }


def test_a_role_report_is_the_analysis_of_that_roles_ranks() -> None:
    d = two_roles()
    report = sf.analyze(d, STAGES, roles=ROLES)
    assert report.role_reports is not None
    alone = sf.analyze(d[:, 2:, :], STAGES)
    pp1 = report.role_reports["pp1"]
    assert pp1.shares == alone.shares and pp1.labels == alone.labels
    assert pp1.routing_set == alone.routing_set and pp1.direct_gain == alone.direct_gain
    assert pp1.leaders == {s: None if r is None else r + 2 for s, r in alone.leaders.items()}


def test_a_role_of_one_rank() -> None:
    report = sf.analyze(two_roles()[:, :3, :], STAGES, roles=["pp0", "pp0", "pp1"])
    assert report.role_reports is not None
    pp1 = report.role_reports["pp1"]
    assert pp1.n_ranks == 1 and pp1.exposed_s == pytest.approx(15)
    assert pp1.advances["data.next_wait"] == pytest.approx(9)
    assert pp1.leaders["data.next_wait"] == 2


def test_reports_round_trip_through_json() -> None:
    report = sf.analyze(two_roles(), STAGES, roles=ROLES)
    again = sf.WindowReport.from_json(report.to_json())
    assert again.role_reports is not None and report.role_reports is not None
    assert again.role_reports["pp1"].to_dict() == report.role_reports["pp1"].to_dict()
    assert again.to_dict() == report.to_dict()


def test_an_older_report_version_is_refused_clearly() -> None:
    data = sf.analyze(two_roles(), STAGES).to_dict()
    data["version"] = 2
    with pytest.raises(
        sf.ReportFormatError,
        match="unknown window report version 2: this stagefrontier reads version",
    ):
        sf.WindowReport.from_dict(data)


@pytest.mark.parametrize(
    ("roles", "match"),
    [
        (["pp0", "pp1"], "2 roles given for 4 ranks"),
        (["pp0"] * 5, "5 roles given for 4 ranks"),
        ("pp0pp", "not a single string"),
        ({"pp0", "pp1"}, "not an unordered set"),
    ],
)
def test_role_lists_of_the_wrong_shape(roles: Any, match: str) -> None:
    with pytest.raises(RolesError, match=match):
        sf.analyze(two_roles(), STAGES, roles=roles)


def test_a_role_outside_the_jobs_role_set_is_an_error() -> None:
    side = SideEvidence(expected_roles=("pp0", "pp1"))
    with pytest.raises(RolesError, match=r"role\(s\) \['pp7'\] are not among the job's roles"):
        sf.analyze(two_roles(), STAGES, roles=["pp0", "pp0", "pp7", "pp7"], side=side)


def test_ranks_of_unknown_role_are_left_out_with_a_reason() -> None:
    report = sf.analyze(two_roles(), STAGES, roles=["pp0", "pp0", None, ""])
    assert report.has("role_aware_needed") and report.top1 is None
    assert report.role_reports is not None and list(report.role_reports) == ["pp0"]
    assert any("ranks [2, 3] carry no role" in r for r in report.reasons["role_aware_needed"])


def test_a_role_with_no_ranks_in_the_window_is_named() -> None:
    side = SideEvidence(expected_roles=("pp0", "pp1"), missing_ranks=(2, 3), gather_ok=False)
    report = sf.analyze(two_roles()[:, :2, :], STAGES, roles=["pp0", "pp0"], side=side)
    assert report.has("telemetry_limited")
    assert any("pp1 of the job have no rank" in r for r in report.reasons["telemetry_limited"])
    # One role is left: its ranks are replicas, so the window is analyzed as one group.
    assert report.role_reports is None and report.top1 == "pp.schedule"


def test_log_line_report_and_verdict_name_each_roles_top_stage_and_leader() -> None:
    report = sf.analyze(two_roles(), STAGES, roles=ROLES)
    line = window_details(report)
    assert "per role: pp0 top pp.schedule 80% led by rank 0" in line
    assert "pp1 top data.next_wait 50% led by rank 2" in line
    text = window_report_text(report)
    assert "role pp1 (ranks 2,3), analyzed on its own:" in text
    # pp1 leads with its own data stage, pp0 with pipeline communication: pp1 bounds.
    bound = bounding_role(report)
    assert bound is not None and bound.role == "pp1"
    assert "pp1 bounds the step" in verdict(report)


def test_every_role_leading_in_pipeline_communication_leaves_the_bound_open() -> None:
    d = two_roles()
    d[:, 2:, 0] = 0.5  # pp1's data stage shrinks: its top stage is pp.schedule too
    bound = bounding_role(sf.analyze(d, STAGES, roles=ROLES))
    assert bound is not None and bound.role is None
    assert "cannot tell which role the others wait for" in bound.reason


def test_role_dims_must_name_mesh_dimensions() -> None:
    # A real mesh needs a process group: tests/test_pipeline.py reads roles from one.
    with pytest.raises(RolesError, match=r"role_dims \['pp'\] are not dimensions of the mesh"):
        mesh_roles(object(), ("pp",))
    with pytest.raises(RolesError, match="a role or a mesh to read it from, not both"):
        sf.StageTimer(
            config=sf.TimerConfig(
                stages=["a"],
                collection=sf.CollectConfig(mode="local", log=False),
                role="pp0",
                mesh=object(),
            )
        )


def rank_window(rank: int, role: str, role_set: tuple[str, ...] = ("pp0", "pp1")) -> RankWindow:
    """Rank ``rank``'s window of ``two_roles()`` as the recorder would hand it over."""
    durations = (two_roles()[:, rank, :] * 1e9).astype(np.int64)
    return RankWindow(
        window=0, first_step=0, last_step=2, rank=rank, stages=tuple(STAGES),
        durations_ns=durations, wall_ns=durations.sum(axis=1), role=role, role_set=role_set,
    )  # fmt: skip


def test_a_merged_window_missing_a_whole_role_names_it() -> None:
    analyzed = analyze_merged(merge_windows([rank_window(0, "pp0"), rank_window(1, "pp0")], 4))
    report = analyzed.report
    assert analyzed.side.expected_roles == ("pp0", "pp1")
    assert any("pp1 of the job have no rank" in r for r in report.reasons["telemetry_limited"])
    full = analyze_merged(merge_windows([rank_window(r, ROLES[r]) for r in range(4)], 4)).report
    assert full.role_reports is not None and list(full.role_reports) == ["pp0", "pp1"]
    assert (
        full.role_reports["pp1"].advances
        == sf.analyze(two_roles(), STAGES, roles=ROLES).role_reports["pp1"].advances
    )


def test_a_packet_keeps_the_roles_and_the_role_set() -> None:
    from stagefrontier.formats.packet import Packet, packet_bytes, packet_from_bytes

    d = two_roles()
    side = SideEvidence(expected_roles=("pp0", "pp1"))
    report = sf.analyze(d, STAGES, roles=ROLES, side=side)
    packet = packet_from_bytes(packet_bytes(Packet.of_window(d, report, roles=ROLES, side=side)))
    assert packet.roles == tuple(ROLES) and packet.side.expected_roles == ("pp0", "pp1")
    assert packet.report.to_dict() == report.to_dict()
    assert packet.reanalyze().to_dict() == report.to_dict()


def test_a_live_rank_outside_the_role_set_is_a_reasoned_downgrade() -> None:
    windows = [rank_window(r, role) for r, role in enumerate(["pp0", "pp0", "pp1"])]
    windows.append(rank_window(3, "pp9", role_set=()))  # a rank built with another mesh
    report = analyze_merged(merge_windows(windows, world_size=4)).report
    reasons = report.reasons["telemetry_limited"]
    assert any("rank 3's role pp9 is outside the job's role set" in r for r in reasons)
    assert report.role_reports is not None and set(report.role_reports) == {"pp0", "pp1", "pp9"}


def test_a_stored_report_checks_each_roles_report() -> None:
    from stagefrontier.formats.stored_report import check_stored_report, check_window_meta

    data = sf.analyze(two_roles(), STAGES, roles=ROLES).to_dict()
    assert check_stored_report(sf.WindowReport.from_dict(data)).role_reports is not None
    data["role_reports"]["pp1"]["leaders"]["pp.schedule"] = "rank 3"
    with pytest.raises(
        sf.ReportFormatError,
        match=r"malformed report: .*got `str` - at `\$\.role_reports\[\.\.\.\]\.leaders",
    ):
        check_stored_report(sf.WindowReport.from_dict(data))
    assert check_window_meta({"lead": None}) == {"lead": None}  # a window with no top stage
