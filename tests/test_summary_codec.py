"""The summary's binary form: an exact round trip, a size that does not grow with the ranks
beyond their list, and one ReportFormatError line for every kind of damage."""

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
    block = json.dumps(meta).encode()
    return HEADER.pack(b"SFS1", 1, len(block), len(body)) + block + body


def parts_of(data: bytes) -> tuple[dict[str, object], bytes]:
    _, _, meta_len, _ = HEADER.unpack_from(data)
    meta = json.loads(data[HEADER.size : HEADER.size + meta_len])
    return meta, zlib.decompress(data[HEADER.size + meta_len :])


def test_damage_is_one_clear_error() -> None:
    good = encode_summary(node_summaries(16)[0])
    meta, body = parts_of(good)
    counts = dict(meta["counts"])  # type: ignore[call-overload]
    damaged = {
        "too short for a header": good[:5],
        "bad magic": b"XXXX" + good[4:],
        "version 9": good[:4] + struct.pack("<H", 9) + good[6:],
        "header declares": good[:-1],
        "not valid zlib": good[: -len(zlib.compress(body, 6))] + b"x" * len(zlib.compress(body, 6)),
        "metadata is not JSON": packed({}, b"")[:-2] + b"{x",
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
