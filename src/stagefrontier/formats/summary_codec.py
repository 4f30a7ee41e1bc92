"""The binary form of a WindowSummary: a small header, a JSON block, one compressed array body.

Layout: a fixed header (magic, version, JSON length, body length), a UTF-8 JSON object (stage
names, settings, counts, scalars) compressed with zlib (plain in version 1), then the arrays of
``_ARRAYS`` in that order, each little-endian and byte-shuffled, compressed together with zlib.
Sizes follow from the JSON counts and are checked before anything is inflated; every decoded
value is checked against what a summary can hold, and any defect is one ReportFormatError naming
it. The size is ``O(N * S * (top_k + max_buckets))`` plus the runs of consecutive rank numbers
covered (one per node for whole nodes), whatever the number of ranks.

Two encodings. The exact one keeps every duration as its float64 (summary packets on disk).
The compact one (``compact=True``, what node parts carry up the tree) puts durations and
prefixes on a grid of ``q`` nanoseconds and codes them as integers: the frontier as its
advance per boundary, the other kept prefixes as their gap to the one above, the clipped step
times, the slowest rank's durations and the lanes' minima as their distance to the frontier
or the stage maximum, sketch buckets as steps within their lane (a lane's lowest against the
same boundary's in the step before). ``q`` is the largest power of
two at most ``QUANTUM_FRACTION`` of the summary's shortest step (and no coarser than the grid
of any part it combines, so a value is rounded once on its way up, never again): every value
is within ``q / 2`` of its own, ``rounding_s`` says how far at most, and the error is at most
``QUANTUM_FRACTION / 2`` of any step's exposed time, over a hundred times below the tie gates
(``leader_tie``, ``share_tie``, ``gain_tie``: 2-5% of it).
"""

from __future__ import annotations

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
from .envelope import open_envelope, seal_envelope
from .limits import check_limit
from .packet import inflate_exact, shuffle_bytes, unshuffle_bytes

MAGIC = b"SFS1"
SUMMARY_VERSION = 2
_READABLE = (1, 2)
"""Version 1 is version 2's exact encoding with plain JSON and no grid fields (rounding 0)."""
QUANTUM_FRACTION = 2.0**-12
"""A compact encoding's grid is at most this fraction of the summary's shortest step (with
exposed time): the rounding, half a grid step, stays under 1.3e-4 of any step."""
MAX_QUANTUM_NS = 1 << 30
_MAX_CODE = 1 << 40
"""A compact integer beyond this is corrupt (it would overflow as it is decoded)."""
_GRID_ARRAYS = frozenset(
    (
        "top_prefix",
        "clipped",
        "group_clipped",
        "stage_max",
        "stage_sum",
        "slowest",
        "lane_min",
        "mean_top",
        "mean_min",
    )
)
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
    ("mean_top", "<f8", lambda c: (c["s"], c["k"])),
    ("mean_top_rank", "<i4", lambda c: (c["s"], c["k"])),
    ("mean_min", "<f8", lambda c: (c["s"],)),
)
_SKETCH_ARRAYS = ("lane_min", "sizes", "index", "count", "fold_low", "fold_high")
"""The arrays of ``_ARRAYS`` that the summary's ``PrefixSketch`` holds."""
_V1_ARRAYS = _ARRAYS[:-3]
"""Version 1 summaries have no rank means (they decode with none kept)."""


def encode_summary(summary: WindowSummary, *, compact: bool = False) -> bytes:
    """The summary as bytes (see the module docstring): exact, or on a nanosecond grid."""
    sketch = summary.sketch
    n, s, k = summary.top_prefix.shape
    values = _array_values(summary)
    quantum, rounding = summary.quantum_ns, summary.rounding_s
    if compact:
        quantum = grid_ns(summary)
        rounding = max(rounding, quantum * 1e-9 / 2)
        values = _to_grid(values, quantum)
    meta = {
        "stages": list(summary.stages),
        "top_k": summary.top_k,
        "gain_baseline": summary.gain_baseline,
        "gain_exact": summary.gain_exact,
        "growth": sketch.growth,
        "max_buckets": sketch.max_buckets,
        "rank_total_sum_s": summary.rank_total_sum_s,
        "compact": compact,
        "quantum_ns": quantum,
        "rounding_s": rounding,
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
    body = b"".join(
        shuffle_bytes(np.ascontiguousarray(values[name], dtype=dtype))
        for name, dtype, _ in _layout(compact)
    )
    packed = zlib.compress(body, 9 if compact else 6)
    return seal_envelope(_HEADER, MAGIC, SUMMARY_VERSION, meta, packed, packed=True)


def decode_summary(data: bytes) -> WindowSummary:
    """Parse and check summary bytes; any defect raises ReportFormatError with one line."""
    version = _HEADER.unpack_from(data)[1] if len(data) >= _HEADER.size else SUMMARY_VERSION
    block, body = open_envelope(
        data,
        _HEADER,
        MAGIC,
        version if version in _READABLE else SUMMARY_VERSION,
        _MAX_META_BYTES,
        "summary payload",
        packed=version > 1,
    )
    meta = _meta(block, version)
    counts = meta["counts"]
    layout = _layout(meta["compact"]) if version > 1 else _V1_ARRAYS
    shapes = [(name, np.dtype(dtype), shape(counts)) for name, dtype, shape in layout]
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
    if meta["compact"]:
        arrays = _from_grid(arrays, meta["quantum_ns"], counts["e"])
    if version == 1:
        width = counts["s"]
        arrays.update(
            mean_top=np.zeros((width, 0)),
            mean_top_rank=np.zeros((width, 0), np.int64),
            mean_min=np.zeros(width),
        )
    return _checked_summary(meta, arrays)


def grid_ns(summary: WindowSummary) -> int:
    """The grid a compact encoding puts ``summary`` on (see the module docstring)."""
    steps = summary.top_prefix[:, -1, 0]
    shortest = float(steps[steps > 0].min()) if (steps > 0).any() else 0.0
    room = max(1, min(MAX_QUANTUM_NS, int(shortest * 1e9 * QUANTUM_FRACTION)))
    grid = 1 << (room.bit_length() - 1)
    return min(grid, summary.quantum_ns) if summary.quantum_ns else grid


def _layout(
    compact: bool,
) -> tuple[tuple[str, str, Callable[[dict[str, int]], tuple[int, ...]]], ...]:
    if not compact:
        return _ARRAYS
    return tuple(
        (name, "<i8" if name in _GRID_ARRAYS else dtype, shape) for name, dtype, shape in _ARRAYS
    )


def _to_grid(values: dict[str, Any], quantum: int) -> dict[str, Any]:
    """The compact integers of ``values`` (see the module docstring)."""

    def grid(name: str) -> Any:
        return np.rint(np.asarray(values[name], dtype=np.float64) * (1e9 / quantum)).astype(
            np.int64
        )

    top = grid("top_prefix")
    front = top[:, :, 0]
    coded = np.empty_like(top)
    coded[:, :, 1:] = top[:, :, :-1] - top[:, :, 1:]
    coded[:, 0, 0] = front[:, 0]
    coded[:, 1:, 0] = np.diff(front, axis=1)
    step = front[:, -1:]
    stage_max = grid("stage_max")
    index, sizes = values["index"], values["sizes"]
    steps = np.diff(index, prepend=0)
    firsts = np.cumsum(sizes) - sizes
    lowest = index[firsts].reshape(top.shape[:2])  # each lane's lowest bucket, [N, S]
    steps[firsts] = np.diff(lowest, axis=0, prepend=0).ravel()  # against the step before
    return {
        **values,
        "top_prefix": coded,
        "clipped": step - grid("clipped"),
        "group_clipped": step - grid("group_clipped"),
        "stage_max": stage_max,
        "stage_sum": grid("stage_sum"),
        "slowest": stage_max - grid("slowest"),
        "lane_min": front - grid("lane_min"),
        "mean_top": grid("mean_top"),
        "mean_min": grid("mean_min"),
        "index": steps,
    }


def _from_grid(a: dict[str, Any], quantum: int, buckets: int) -> dict[str, Any]:
    """Undo ``_to_grid``; a value that cannot be a compact code raises ReportFormatError."""
    sizes = a["sizes"]
    if (sizes < 1).any() or sizes.sum() != buckets:
        raise ReportFormatError(
            "summary is corrupt: sketch bucket counts per lane are out of range"
        )
    if any((np.abs(a[name]) > _MAX_CODE).any() for name in (*_GRID_ARRAYS, "index")):
        raise ReportFormatError("summary is corrupt: a compact value is out of range")
    coded = a["top_prefix"]
    front = np.cumsum(coded[:, :, 0], axis=1)
    top = front[:, :, None] - np.concatenate(
        [np.zeros_like(coded[:, :, :1]), np.cumsum(coded[:, :, 1:], axis=2)], axis=2
    )
    step = front[:, -1:]
    stage_max = a["stage_max"]
    firsts = np.cumsum(sizes) - sizes
    steps = a["index"].copy()
    steps[firsts] = np.cumsum(steps[firsts].reshape(coded.shape[:2]), axis=0).ravel()
    totals = np.cumsum(steps)
    index = totals - np.repeat(totals[firsts] - steps[firsts], sizes)
    scale = quantum * 1e-9

    def seconds(x: Any) -> Any:
        return x.astype(np.float64) * scale

    return {
        **a,
        "top_prefix": seconds(top),
        "clipped": seconds(step - a["clipped"]),
        "group_clipped": seconds(step - a["group_clipped"]),
        "stage_max": seconds(stage_max),
        "stage_sum": seconds(a["stage_sum"]),
        "slowest": seconds(stage_max - a["slowest"]),
        "lane_min": seconds(front - a["lane_min"]),
        "mean_top": seconds(a["mean_top"]),
        "mean_min": seconds(a["mean_min"]),
        "index": index,
    }


def _array_values(summary: WindowSummary) -> dict[str, Any]:
    sketch = summary.sketch
    values = {name: getattr(summary, name, None) for name, _, _ in _ARRAYS}
    for name in _SKETCH_ARRAYS:
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
_GRID_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "compact": (lambda v: isinstance(v, bool), "true or false"),
    "quantum_ns": (
        lambda v: is_int(v) and 0 <= v <= MAX_QUANTUM_NS and v & (v - 1) == 0,
        f"0 or a power of two up to {MAX_QUANTUM_NS}",
    ),
    "rounding_s": (lambda v: is_real(v) and math.isfinite(v) and v >= 0, "a number >= 0"),
}


def _meta(meta: Any, version: int) -> dict[str, Any]:
    kinds = _META_KINDS if version == 1 else {**_META_KINDS, **_GRID_KINDS}
    if not isinstance(meta, dict) or sorted(meta) != sorted(kinds):
        raise ReportFormatError(f"summary metadata must hold exactly {sorted(kinds)}")
    if version == 1:
        meta.update(compact=False, quantum_ns=0, rounding_s=0.0)
    for key, (check, kind) in kinds.items():
        if not check(meta[key]):
            raise ReportFormatError(f"summary metadata {key} must be {kind}, got {meta[key]!r}")
    if meta["compact"] and not meta["quantum_ns"]:
        raise ReportFormatError("summary metadata: a compact summary needs its quantum_ns")
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
        (lambda: not _durations(a, "top_prefix", "stage_max", "stage_sum", "slowest", "lane_min",
                                "mean_top", "mean_min"),
         "durations or prefixes are negative or not finite"),
        (lambda: not (np.isfinite(a["clipped"]).all() and np.isfinite(a["group_clipped"]).all()),
         "clipped step times are not finite"),
        (lambda: (np.diff(a["top_prefix"], axis=2) > 0).any(),
         "kept prefixes are not largest first"),
        (lambda: (owner < 0).any() or (a["top_rank"] >= ends[np.maximum(owner, 0)]).any()
         or (np.diff(np.sort(a["top_rank"], axis=2), axis=2) == 0).any(),
         "kept prefixes name ranks it does not cover, or a rank twice in a lane"),
        (lambda: (np.diff(a["mean_top"], axis=1) > 0).any()
         or not _covered(a["mean_top_rank"], starts, ends),
         "rank means are not largest first or name ranks it does not cover"),
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
    # The body's int32 arrays widened, as the summary holds them.
    values = {
        name: a[name].astype(np.int64) if dtype == "<i4" else a[name] for name, dtype, _ in _ARRAYS
    }
    sketch = PrefixSketch(
        growth=meta["growth"],
        max_buckets=meta["max_buckets"],
        **{name: values.pop(name) for name in _SKETCH_ARRAYS},
    )
    return WindowSummary(
        stages=stages,
        top_k=meta["top_k"],
        rank_total_sum_s=float(meta["rank_total_sum_s"]),
        sketch=sketch,
        gain_baseline=meta["gain_baseline"],
        gain_exact=meta["gain_exact"],
        quantum_ns=meta["quantum_ns"],
        rounding_s=float(meta["rounding_s"]),
        **values,
    )


def _covered(ranks: Any, starts: Any, ends: Any) -> bool:
    """Whether every rank in ``ranks`` lies in one of the runs ``[starts, ends)``."""
    owner = np.searchsorted(starts, ranks, side="right") - 1
    return not ((owner < 0).any() or (ranks >= ends[np.maximum(owner, 0)]).any())


def _durations(a: dict[str, Any], *names: str) -> bool:
    return all(np.isfinite(a[name]).all() and (a[name] >= 0).all() for name in names)


def _unsorted_buckets(lane_of: Any, index: Any) -> bool:
    same_lane = lane_of[1:] == lane_of[:-1]
    return bool((np.diff(index)[same_lane] <= 0).any())
