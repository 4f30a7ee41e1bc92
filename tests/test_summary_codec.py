"""The summary's binary form: an exact round trip, a compact one within its stated rounding, a
size that does not grow with the ranks beyond their list, and one ReportFormatError line for
every kind of damage."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from stagefrontier import (
    ReportFormatError,
    analyze_summary,
    combine,
    decode_summary,
    encode_summary,
    summarize,
)
from stagefrontier.analysis.summary import WindowSummary
from stagefrontier.formats.summary_codec import QUANTUM_FRACTION
from window_support import random_window

STAGES = ["data", "fwd[0]", "bwd[0]", "fwd[1]", "bwd[1]", "opt"]
HEADER = struct.Struct("<4sHII")


def node_summaries(ranks: int, per_node: int = 8, seed: int = 4) -> list[WindowSummary]:
    d = random_window(seed, (10, ranks, len(STAGES)))
    return [
        summarize(d[:, i : i + per_node], range(i, i + per_node), STAGES)
        for i in range(0, ranks, per_node)
    ]


def test_round_trip_is_exact() -> None:
    merged = combine(node_summaries(64))
    back = decode_summary(encode_summary(merged))
    for name in ("rank_runs", "top_prefix", "top_rank", "top_dominant", "clipped", "group_clipped",
                 "stage_max", "stage_sum", "slowest"):  # fmt: skip
        np.testing.assert_array_equal(getattr(back, name), getattr(merged, name), err_msg=name)
    for name in ("lane_min", "sizes", "index", "count", "fold_low", "fold_high"):
        np.testing.assert_array_equal(getattr(back.sketch, name), getattr(merged.sketch, name))
    assert (back.stages, back.top_k, back.gain_baseline, back.gain_exact) == (
        merged.stages,
        merged.top_k,
        merged.gain_baseline,
        merged.gain_exact,
    )
    assert back.rank_total_sum_s == merged.rank_total_sum_s
    assert analyze_summary(back) == analyze_summary(merged)


def test_size_does_not_grow_with_the_ranks() -> None:
    small, large = combine(node_summaries(64)), combine(node_summaries(4096))
    # Consecutive ranks are stored as runs; the sketch fills up to its fixed bucket count.
    sketch_cap = 10 * len(STAGES) * small.sketch.max_buckets * 8
    assert len(encode_summary(large)) <= len(encode_summary(small)) + sketch_cap
    gappy = combine(node_summaries(64)[::2])
    assert decode_summary(encode_summary(gappy)).ranks.tolist() == gappy.ranks.tolist()


def packed(meta: dict[str, object], body: bytes) -> bytes:
    block = zlib.compress(json.dumps(meta).encode())
    return HEADER.pack(b"SFS1", 2, len(block), len(body)) + block + body


def parts_of(data: bytes) -> tuple[dict[str, object], bytes]:
    _, _, meta_len, _ = HEADER.unpack_from(data)
    meta = json.loads(zlib.decompress(data[HEADER.size : HEADER.size + meta_len]))
    return meta, zlib.decompress(data[HEADER.size + meta_len :])


def test_a_version_1_payload_still_reads_exactly() -> None:
    summary = node_summaries(16)[0]
    meta, body = parts_of(encode_summary(summary))
    for key in ("compact", "quantum_ns", "rounding_s"):
        del meta[key]
    stages, kept = len(STAGES), summary.mean_top.shape[1]
    body = body[: -(stages * kept * 12 + stages * 8)]  # version 1 kept no rank means
    block, packed_body = json.dumps(meta).encode(), zlib.compress(body)
    old = HEADER.pack(b"SFS1", 1, len(block), len(packed_body)) + block + packed_body
    back = decode_summary(old)
    np.testing.assert_array_equal(back.top_prefix, summary.top_prefix)
    assert (back.quantum_ns, back.rounding_s) == (0, 0.0)
    assert back.mean_top.shape == (len(STAGES), 0)


def test_compact_values_are_within_half_a_grid_step_rounded_once() -> None:
    nodes = node_summaries(64)
    exact = combine(nodes)
    up = [decode_summary(encode_summary(s, compact=True)) for s in nodes]
    top = decode_summary(encode_summary(combine(up), compact=True))
    grids = [s.quantum_ns for s in up]
    assert all(g >= 1 and g & (g - 1) == 0 for g in grids) and top.quantum_ns == min(grids)
    shortest = exact.top_prefix[:, -1, 0].min()  # no node's grid passes the fraction of it
    assert max(grids) * 1e-9 <= shortest * QUANTUM_FRACTION
    assert top.rounding_s == max(grids) * 1e-9 / 2
    for name in ("top_prefix", "clipped", "stage_max", "slowest"):
        err = np.abs(getattr(top, name) - getattr(exact, name)).max()
        assert err <= top.rounding_s * (1 + 1e-9), name
    # stage_sum sums one rounded value per node
    assert np.abs(top.stage_sum - exact.stage_sum).max() <= len(nodes) * top.rounding_s
    np.testing.assert_array_equal(top.top_rank, exact.top_rank)
    np.testing.assert_array_equal(top.sketch.index, exact.sketch.index)
    np.testing.assert_array_equal(top.sketch.count, exact.sketch.count)
    # a head re-encoding its decoded children on their grid changes nothing
    again = decode_summary(encode_summary(top, compact=True))
    np.testing.assert_array_equal(again.top_prefix, top.top_prefix)
    np.testing.assert_array_equal(again.sketch.lane_min, top.sketch.lane_min)
    flat, compact = analyze_summary(exact), analyze_summary(top)
    assert (compact.top1, compact.leaders) == (flat.top1, flat.leaders)
    n_steps = exact.n_steps
    for stage in STAGES:  # an advance sums one frontier difference per step
        assert abs(compact.advances[stage] - flat.advances[stage]) <= 2 * n_steps * top.rounding_s


def test_damage_is_one_clear_error() -> None:
    good = encode_summary(node_summaries(16)[0])
    meta, body = parts_of(good)
    counts = dict(meta["counts"])  # type: ignore[call-overload]
    not_json = zlib.compress(b"{x")
    damaged = {
        "too short for a header": good[:5],
        "bad magic": b"XXXX" + good[4:],
        "version 9": good[:4] + struct.pack("<H", 9) + good[6:],
        "header declares": good[:-1],
        "body: data is not valid zlib": good[: -len(zlib.compress(body, 6))]
        + b"x" * len(zlib.compress(body, 6)),
        "metadata is not valid zlib": HEADER.pack(b"SFS1", 2, 3, 0) + b"abc",
        "metadata is not JSON": HEADER.pack(b"SFS1", 2, len(not_json), 0) + not_json,
        "must hold exactly": packed({"stages": []}, zlib.compress(body)),
        "gain_baseline must be": packed({**meta, "gain_baseline": "mean"}, zlib.compress(body)),
        "keeps 4 prefixes": packed({**meta, "top_k": 9}, zlib.compress(body)),
        "shape/byte mismatch": packed(
            {**meta, "counts": {**counts, "e": counts["e"] + 1}}, zlib.compress(body)
        ),
        "metadata is invalid": packed({**meta, "growth": 3.0}, zlib.compress(body)),
    }
    for expected, data in damaged.items():
        with pytest.raises(ReportFormatError, match=expected):
            decode_summary(data)


def test_corrupt_values_are_named() -> None:
    summary = node_summaries(16)[0]

    def with_field(**changes: object) -> bytes:
        values = {f: getattr(summary, f) for f in WindowSummary.__dataclass_fields__}
        values.update(changes)
        return encode_summary(WindowSummary(**values))  # type: ignore[arg-type]

    bad_prefix = summary.top_prefix.copy()
    bad_prefix[0, 0, 0] = -1.0
    rank_twice = summary.top_rank.copy()
    rank_twice[0, 0, 1] = rank_twice[0, 0, 0]
    unordered = summary.top_prefix.copy()
    unordered[1, 2] = unordered[1, 2][::-1]
    dominant = summary.top_dominant.copy()
    dominant[0, 0] = 99
    cases = {
        "negative or not finite": with_field(top_prefix=bad_prefix),
        "a rank twice": with_field(top_rank=rank_twice),
        "not largest first": with_field(top_prefix=unordered),
        "dominant stage": with_field(top_dominant=dominant),
        "not ascending, apart": with_field(rank_runs=np.array([[8, 4], [0, 4]])),
        "not finite": with_field(clipped=np.full(summary.clipped.shape, np.inf)),
    }
    for expected, data in cases.items():
        with pytest.raises(ReportFormatError, match=f"summary is corrupt: .*{expected}"):
            decode_summary(data)
