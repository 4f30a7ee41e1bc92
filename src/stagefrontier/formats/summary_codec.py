"""The binary form of a WindowSummary: a small header, a JSON block, one compressed array body.

Layout: a fixed header (magic, version, JSON length, body length), a UTF-8 JSON object (stage
names, settings, counts, scalars), then the arrays of ``_ARRAYS`` in that order, each
little-endian and byte-shuffled, compressed together with zlib. Sizes follow from the JSON
counts and are checked before anything is inflated; every decoded value is checked against what
a summary can hold, and any defect is one ReportFormatError naming it. The size is
``O(N * S * (top_k + max_buckets))`` plus the runs of consecutive rank numbers covered (one
per node for whole nodes), whatever the number of ranks.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..analysis.gates import GAIN_BASELINES
from ..analysis.prefix_sketch import PrefixSketch, check_settings
from ..analysis.schema import check_stage_names
from ..analysis.semantic import stage_groups, substage_groups
from ..analysis.summary import WindowSummary
from ..analysis.values import is_int, is_real
from ..errors import ReportFormatError, StageFrontierError
from .envelope import open_envelope
from .limits import check_limit
from .packet import inflate_exact, shuffle_bytes, unshuffle_bytes

MAGIC = b"SFS1"
SUMMARY_VERSION = 1
_HEADER = struct.Struct("<4sHII")
_MAX_META_BYTES = 1 << 20

# name, dtype, shape from the counts (n steps, s stages, k kept, m ranks, e buckets, g groups,
# u runs of consecutive ranks)
_ARRAYS: tuple[tuple[str, str, Callable[[dict[str, int]], tuple[int, ...]]], ...] = (
    ("rank_runs", "<i4", lambda c: (c["u"], 2)),
    ("top_prefix", "<f8", lambda c: (c["n"], c["s"], c["k"])),
    ("top_rank", "<i4", lambda c: (c["n"], c["s"], c["k"])),
    ("top_dominant", "<i4", lambda c: (c["n"], c["k"])),
    ("clipped", "<f8", lambda c: (c["n"], c["s"])),
    ("group_clipped", "<f8", lambda c: (c["n"], c["g"])),
    ("stage_max", "<f8", lambda c: (c["n"], c["s"])),
    ("stage_sum", "<f8", lambda c: (c["n"], c["s"])),
    ("slowest", "<f8", lambda c: (c["n"], c["s"])),
    ("lane_min", "<f8", lambda c: (c["n"], c["s"])),
    ("sizes", "<i4", lambda c: (c["n"] * c["s"],)),
    ("index", "<i4", lambda c: (c["e"],)),
    ("count", "<i4", lambda c: (c["e"],)),
    ("fold_low", "<i8", lambda c: (c["n"] * c["s"],)),
    ("fold_high", "<i8", lambda c: (c["n"] * c["s"],)),
)


def encode_summary(summary: WindowSummary) -> bytes:
    """The summary as bytes (see the module docstring)."""
    sketch = summary.sketch
    n, s, k = summary.top_prefix.shape
    values = _array_values(summary)
    meta = {
        "stages": list(summary.stages),
        "top_k": summary.top_k,
        "gain_baseline": summary.gain_baseline,
        "gain_exact": summary.gain_exact,
        "growth": sketch.growth,
        "max_buckets": sketch.max_buckets,
        "rank_total_sum_s": summary.rank_total_sum_s,
        "counts": {
            "n": n,
            "s": s,
            "k": k,
            "m": summary.n_ranks,
            "e": int(sketch.index.size),
            "g": int(summary.group_clipped.shape[1]),
            "u": int(values["rank_runs"].shape[0]),
        },
    }
    meta_bytes = json.dumps(meta, allow_nan=False).encode("utf-8")
    body = b"".join(
        shuffle_bytes(np.ascontiguousarray(values[name], dtype=dtype)) for name, dtype, _ in _ARRAYS
    )
    packed = zlib.compress(body, 6)
    return _HEADER.pack(MAGIC, SUMMARY_VERSION, len(meta_bytes), len(packed)) + meta_bytes + packed


def decode_summary(data: bytes) -> WindowSummary:
    """Parse and check summary bytes; any defect raises ReportFormatError with one line."""
    block, body = open_envelope(
        data, _HEADER, MAGIC, SUMMARY_VERSION, _MAX_META_BYTES, "summary payload"
    )
    meta = _meta(block)
    counts = meta["counts"]
    shapes = [(name, np.dtype(dtype), shape(counts)) for name, dtype, shape in _ARRAYS]
    cells = sum(math.prod(shape) for _, _, shape in shapes)
    check_limit("cells", cells, "summary declares its arrays' values")
    expected = sum(math.prod(shape) * dtype.itemsize for _, dtype, shape in shapes)
    raw = inflate_exact(body, expected, "summary body")
    arrays: dict[str, Any] = {}
    offset = 0
    for name, dtype, shape in shapes:
        size = math.prod(shape) * dtype.itemsize
        arrays[name] = unshuffle_bytes(raw[offset : offset + size], dtype, shape).astype(
            dtype.newbyteorder("=")
        )
        offset += size
    return _checked_summary(meta, arrays)


def _array_values(summary: WindowSummary) -> dict[str, Any]:
    sketch = summary.sketch
    values = {name: getattr(summary, name, None) for name, _, _ in _ARRAYS}
    for name in ("lane_min", "sizes", "index", "count", "fold_low", "fold_high"):
        values[name] = getattr(sketch, name)
    return values


_META_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "stages": (lambda v: isinstance(v, list), "a list of stage names"),
    "top_k": (is_int, "an integer"),
    "gain_baseline": (lambda v: v in GAIN_BASELINES, f"one of {', '.join(GAIN_BASELINES)}"),
    "gain_exact": (lambda v: isinstance(v, bool), "true or false"),
    "growth": (lambda v: isinstance(v, float), "a number"),
    "max_buckets": (is_int, "an integer"),
    "rank_total_sum_s": (lambda v: is_real(v) and math.isfinite(v) and v >= 0, "a number >= 0"),
    "counts": (
        lambda v: (
            isinstance(v, dict)
            and sorted(v) == ["e", "g", "k", "m", "n", "s", "u"]
            and all(is_int(x) and 0 <= x < 1 << 31 for x in v.values())
        ),
        "an object of seven counts",
    ),
}


def _meta(meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict) or sorted(meta) != sorted(_META_KINDS):
        raise ReportFormatError(f"summary metadata must hold exactly {sorted(_META_KINDS)}")
    for key, (check, kind) in _META_KINDS.items():
        if not check(meta[key]):
            raise ReportFormatError(f"summary metadata {key} must be {kind}, got {meta[key]!r}")
    try:
        meta["stages"] = check_stage_names(meta["stages"])
        check_settings(meta["growth"], meta["max_buckets"])
    except StageFrontierError as exc:
        raise ReportFormatError(f"summary metadata is invalid: {exc}") from None
    counts = meta["counts"]
    if counts["s"] != len(meta["stages"]) or min(counts["n"], counts["m"]) < 1:
        raise ReportFormatError(
            f"summary counts {counts} do not fit {len(meta['stages'])} stages, a step and a rank"
        )
    if meta["top_k"] < 2 or counts["k"] != min(meta["top_k"], counts["m"]):
        raise ReportFormatError(
            f"summary keeps {counts['k']} prefixes per lane; top_k={meta['top_k']} over "
            f"{counts['m']} ranks means {min(meta['top_k'], counts['m'])}"
        )
    return meta


def _checked_summary(meta: dict[str, Any], a: dict[str, Any]) -> WindowSummary:
    stages, counts = meta["stages"], meta["counts"]
    groups = substage_groups(stages)
    n_broad = len(stage_groups(stages)[0])
    runs, sizes = a["rank_runs"], a["sizes"]
    if (runs[:, 1] < 1).any() or runs[:, 1].sum() != counts["m"] or (runs[:, 0] < 0).any():
        raise ReportFormatError("summary is corrupt: its rank runs do not add up to its ranks")
    runs = runs.astype(np.int64)
    starts, ends = runs[:, 0], runs[:, 0] + runs[:, 1]
    owner = np.searchsorted(starts, a["top_rank"], side="right") - 1

    def lanes() -> Any:
        return np.repeat(np.arange(sizes.size), sizes)

    checks: tuple[tuple[Callable[[], Any], str], ...] = (
        (lambda: (starts[1:] <= ends[:-1]).any(),
         "its rank runs are not ascending, apart and >= 0"),
        (lambda: counts["g"] != (0 if groups is None else n_broad),
         "its group gains do not fit its stages"),
        (lambda: not _durations(a, "top_prefix", "stage_max", "stage_sum", "slowest", "lane_min"),
         "durations or prefixes are negative or not finite"),
        (lambda: not (np.isfinite(a["clipped"]).all() and np.isfinite(a["group_clipped"]).all()),
         "clipped step times are not finite"),
        (lambda: (np.diff(a["top_prefix"], axis=2) > 0).any(),
         "kept prefixes are not largest first"),
        (lambda: (owner < 0).any() or (a["top_rank"] >= ends[np.maximum(owner, 0)]).any()
         or (np.diff(np.sort(a["top_rank"], axis=2), axis=2) == 0).any(),
         "kept prefixes name ranks it does not cover, or a rank twice in a lane"),
        (lambda: (a["top_dominant"] < 0).any() or (a["top_dominant"] >= n_broad).any(),
         "a dominant stage is out of range"),
        (lambda: (sizes < 1).any() or (sizes > meta["max_buckets"]).any()
         or sizes.sum() != counts["e"],
         "sketch bucket counts per lane are out of range"),
        (lambda: (a["count"] < 1).any()
         or (np.bincount(lanes(), weights=a["count"], minlength=sizes.size) != counts["m"]).any(),
         "sketch lanes do not count every rank once"),
        (lambda: _unsorted_buckets(lanes(), a["index"]),
         "sketch buckets are not ascending within a lane"),
        (lambda: (a["fold_low"] > a["fold_high"]).any(), "sketch fold edges are crossed"),
    )  # fmt: skip
    for bad, what in checks:
        if bad():
            raise ReportFormatError(f"summary is corrupt: {what}")
    return WindowSummary(
        stages=stages,
        rank_runs=runs,
        top_k=meta["top_k"],
        top_prefix=a["top_prefix"],
        top_rank=a["top_rank"].astype(np.int64),
        top_dominant=a["top_dominant"].astype(np.int64),
        clipped=a["clipped"],
        group_clipped=a["group_clipped"],
        stage_max=a["stage_max"],
        stage_sum=a["stage_sum"],
        slowest=a["slowest"],
        rank_total_sum_s=float(meta["rank_total_sum_s"]),
        sketch=PrefixSketch(
            growth=meta["growth"],
            max_buckets=meta["max_buckets"],
            lane_min=a["lane_min"],
            sizes=sizes.astype(np.int64),
            index=a["index"].astype(np.int64),
            count=a["count"].astype(np.int64),
            fold_low=a["fold_low"],
            fold_high=a["fold_high"],
        ),
        gain_baseline=meta["gain_baseline"],
        gain_exact=meta["gain_exact"],
    )


def _durations(a: dict[str, Any], *names: str) -> bool:
    return all(np.isfinite(a[name]).all() and (a[name] >= 0).all() for name in names)


def _unsorted_buckets(lane_of: Any, index: Any) -> bool:
    same_lane = lane_of[1:] == lane_of[:-1]
    return bool((np.diff(index)[same_lane] <= 0).any())
