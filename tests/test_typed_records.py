"""The typed records (``formats.typed``): files and store messages written by the release before
them still read, every value is checked by its declaration, a crafted input is refused in one
``ReportFormatError`` (never a ``RecursionError``), and the committed JSON Schemas are the ones
the declarations generate.

``tests/data/old_forms`` holds what the code before the typed records wrote: the 2-rank demo's
``windows.jsonl``, a packet and an incident (``stagefrontier demo --ranks 2 --steps 40 --window 10
--fault data@1:120ms --router``, the output folder's path written as ``stagefrontier-demo``), the
four store messages as that code encoded them, and an incident of the first form (before its
``regression``, ``reference_capture`` and ``router_cpu_s`` fields).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schema_support import SCHEMA_DIR, schema_texts
from stagefrontier.errors import ReportFormatError, StageFrontierError
from stagefrontier.formats.incident import check_incident, read_incident
from stagefrontier.formats.packet import read_packet
from stagefrontier.formats.records import read_records, record_meta, record_report
from stagefrontier.formats.stored_report import check_window_meta
from stagefrontier.formats.typed import MAX_DEPTH
from stagefrontier.render.incident import summary_line
from stagefrontier.route.requests import (
    CaptureRequest,
    CaptureStatus,
    ManualAnswer,
    ManualRequest,
)

OLD = Path(__file__).parent / "data" / "old_forms"
MESSAGES = {
    "capture_request": CaptureRequest,
    "capture_status": CaptureStatus,
    "manual_request": ManualRequest,
    "manual_answer": ManualAnswer,
}


def _old_messages() -> dict[str, Any]:
    return json.loads((OLD / "store_messages.json").read_text())


# --- the old forms still read ------------------------------------------------------------------


def test_the_old_incidents_read_with_their_fields_unchanged(tmp_path: Path) -> None:
    incident = read_incident(OLD / "incident.json")
    assert incident == json.loads((OLD / "incident.json").read_text())
    assert (incident["id"], incident["steps"], incident["leader_rank"]) == ("w00000", [15, 19], 1)
    assert incident["confirmed"] is True and incident["op_diff"]
    assert "data.next_wait on rank 1" in summary_line(incident)
    first = read_incident(OLD / "incident-first-fields.json")
    assert "regression" not in first and first["trigger"] == "manual"


def test_the_old_windows_jsonl_and_packet_read_with_their_reports() -> None:
    records = read_records(OLD / "windows.jsonl")
    assert [r["window"] for r in records] == [0, 1, 2, 3]
    for i, record in enumerate(records):
        report = record_report(record, f"record {i}")
        assert report.n_ranks == 2 and report.stages[0] == "data.next_wait"
        check_window_meta(record_meta(record))
    assert records[1]["lead"]["ranks"] == [1]
    packet = read_packet(OLD / "window-000001.json")
    assert packet.meta["window"] == 1 and packet.report.top1 == records[1]["top1"]


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_the_old_store_messages_decode_and_encode_as_before(name: str) -> None:
    old = _old_messages()[name]
    message = MESSAGES[name].decode(json.dumps(old).encode())
    assert json.loads(message.encode()) == old


# --- strict, with limits ------------------------------------------------------------------------


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def test_deeply_nested_inputs_are_one_format_error_not_a_recursion_error(tmp_path: Path) -> None:
    with pytest.raises(ReportFormatError, match=f"nested 5000 deep, deeper than {MAX_DEPTH}"):
        CaptureRequest.decode(_nested(5000).encode())  # within the message's size limit
    (tmp_path / "incident.json").write_text(_nested(100_000))
    with pytest.raises(ReportFormatError, match="nested 100000 deep") as caught:
        read_incident(tmp_path)
    assert isinstance(caught.value, StageFrontierError)
    # a string holding brackets is no nesting
    request = {"id": "w1", "ranks": [1], "first_step": 3, "steps": 2, "stage": "[" * 50}
    assert CaptureRequest.decode(json.dumps(request).encode()).stage == "[" * 50


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("id", "a/../b", "$.id"),
        ("id", "abc\n", "$.id"),
        ("ranks", [], "$.ranks"),
        ("ranks", [True], "$.ranks[0]"),
        ("ranks", [1 << 20], "rank numbers in 0.."),
        ("first_step", -1, "$.first_step"),
        ("steps", 0, "$.steps"),
        ("stage", "x" * 5000, "$.stage"),
    ],
)
def test_a_capture_request_is_checked_field_by_field(field: str, value: Any, said: str) -> None:
    request = {**_old_messages()["capture_request"], field: value}
    with pytest.raises(ReportFormatError, match=f"^capture request: .*{_re(said)}"):
        CaptureRequest.decode(json.dumps(request).encode())


def test_a_capture_status_names_its_field_and_ranks_are_kept_once() -> None:
    status = {**_old_messages()["capture_status"], "state": "exploded"}
    with pytest.raises(ReportFormatError, match=r"\$\.state"):
        CaptureStatus.decode(json.dumps(status).encode())
    request = {**_old_messages()["manual_request"], "ranks": [2, 0, 2]}
    assert ManualRequest.decode(json.dumps(request).encode()).ranks == (2, 0)
    del request["id"]  # a request from the store names where its answer goes
    with pytest.raises(ReportFormatError, match="manual capture request lacks 'id'"):
        ManualRequest.decode(json.dumps(request).encode())


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("steps", [19, 15], "steps must be"),
        ("steps", [0, 500], "spanning at most 100"),
        ("leader_rank", True, "$.leader_rank"),
        ("trace_files", {"²": "x"}, "$.trace_files"),
        ("trace_bytes", {"0": -1}, "$.trace_bytes"),
        ("max_share_diff", -0.5, "$.max_share_diff"),
        ("reduced", "later", "$.reduced"),
        ("reasons", ["r"] * 1001, "$.reasons"),
        ("op_diff", [{"name": "x"}], "$.op_diff[0]"),
    ],
)
def test_an_incident_is_checked_field_by_field(field: str, value: Any, said: str) -> None:
    incident = {**json.loads((OLD / "incident.json").read_text()), field: value}
    with pytest.raises(ReportFormatError, match=_re(said)):
        check_incident(incident)


def test_window_facts_are_checked_where_present() -> None:
    assert check_window_meta({"anything": [1, {"x": None}]})  # other keys are free-form
    for facts in ({"window": -1}, {"lead": {"scope": "node", "ranks": [1]}}, {"gather_ok": 1}):
        with pytest.raises(ReportFormatError, match=r"^window facts: "):
            check_window_meta(facts)


def _re(text: str) -> str:
    import re

    return re.escape(text)


# --- the schemas --------------------------------------------------------------------------------


def test_the_committed_json_schemas_are_the_generated_ones() -> None:
    generated = schema_texts()
    committed = {p.name: p.read_text(encoding="utf-8") for p in SCHEMA_DIR.glob("*.json")}
    assert sorted(committed) == sorted(generated), "run `make schemas`"
    stale = [name for name, text in generated.items() if committed[name] != text]
    assert not stale, f"stale schemas (run `make schemas`): {stale}"
    incident = json.loads(generated["incident.json"])["$defs"]["Incident"]
    assert {"id", "steps", "trace_files", "op_diff"} <= set(incident["required"])
