"""Evidence packets: one window's matrix, context and report as small, versioned JSON.

A packet holds everything needed to re-run the analysis of a window offline and get the same
report back: the ``[N, R, K]`` float64 duration matrix (exact, compact), the stage names, the
optional roles and side evidence, the gates, a free-form ``meta`` dict from the caller (window
index, steps, world size, hosts, gather status, ...) and the report computed when it was written.

Layout (JSON object)::

    {"format": "stagefrontier.formats.packet", "version": 1,
     "d": {"dtype": "<f8", "shape": [N, R, K], "codec": "shuffle+zlib+base64", "data": "..."},
     "stages": [...], "roles": [...] | null, "side": {...} | null, "gates": {...},
     "meta": {...}, "report": {...}}

Arrays are little-endian bytes, byte-shuffled (byte ``i`` of every value stored together, which
lets zlib squeeze the near-constant exponent bytes of timing data), zlib-compressed and base64
encoded. Reading never unpickles anything, checks every declared size before allocating, bounds
decompression by the declared size, and reports any defect as a ReportFormatError naming it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import math
import os
import re
import secrets
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..analysis.accounting import FloatArray, as_window
from ..analysis.analyzer import analyze
from ..analysis.gates import Gates
from ..analysis.schema import check_stage_names
from ..analysis.side import SideEvidence
from ..analysis.values import check_document, is_int
from ..analysis.window_report import WindowReport
from ..errors import ReportFormatError, StageFrontierError
from .limits import check_limit, read_capped
from .stored_report import check_stored_report, check_window_meta

logger = logging.getLogger("stagefrontier")

PACKET_FORMAT = "stagefrontier.formats.packet"
PACKET_VERSION = 1
CODEC = "shuffle+zlib+base64"

_FIELDS = ("d", "stages", "roles", "side", "gates", "meta", "report")
_DTYPES: dict[str, np.dtype[Any]] = {"<f8": np.dtype("<f8"), "|i1": np.dtype("|i1")}
_SIDE_ARRAYS = {"event_ms": "<f8", "event_state": "|i1", "no_stall_reference_s": "<f8"}
_COLLECTIVE_ARRAYS = ("wait_ms", "reached_ms", "queued_ms")
"""The timed collectives' ``[steps, ranks, collectives]`` arrays, in the codec like the above
(``queued_ms`` only where the ranks read it)."""
_MAX_ZLIB_RATIO = 1100
"""Deflate cannot expand data by more than about 1032x; a declared size beyond this multiple of
the compressed bytes is a lie and is rejected before any allocation."""


@dataclass(frozen=True, eq=False)
class Packet:
    """A decoded evidence packet. ``reanalyze()`` reproduces ``report`` from the stored inputs."""

    d: FloatArray
    stages: tuple[str, ...]
    roles: tuple[str, ...] | None
    side: SideEvidence | None
    gates: Gates
    meta: dict[str, Any]
    report: WindowReport

    @classmethod
    def of_window(
        cls,
        d: Any,
        report: WindowReport,
        *,
        roles: Sequence[str] | None = None,
        side: SideEvidence | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Packet:
        """The packet of one analyzed window: its stages and gates are the report's.

        Raises:
            ReportFormatError: the report does not describe this matrix.
            DurationsError: ``d`` is not a valid ``[N, R, K]`` duration matrix.
        """
        stages = check_stage_names(report.stages)
        matrix = as_window(d, stages)
        _check_consistent(matrix, stages, report.gates, report)
        return cls(
            d=matrix,
            stages=stages,
            roles=None if roles is None else tuple(str(x) for x in roles),
            side=side,
            gates=report.gates,
            meta=dict(meta or {}),
            report=report,
        )

    @property
    def rank_ids(self) -> list[int]:
        """The rank number of each column of ``d``: the ``ranks_present`` the packet's metadata
        lists (a window some rank did not reach holds fewer columns than the job has ranks), or
        ``0 .. R-1`` when it lists none that fit."""
        present = self.meta.get("ranks_present")
        n_ranks = self.d.shape[1]
        if (
            isinstance(present, list)
            and len(present) == n_ranks
            and all(is_int(r) and 0 <= r < 1 << 31 for r in present)
            and len(set(present)) == n_ranks
        ):
            return [int(r) for r in present]
        return list(range(n_ranks))

    def reanalyze(self) -> WindowReport:
        """Run the analyzer again on the stored matrix with the stored stages, gates, roles,
        side evidence and rank numbers; equal to ``report`` for a packet written by this
        version."""
        return analyze(
            self.d,
            self.stages,
            gates=self.gates,
            roles=self.roles,
            side=self.side,
            rank_ids=self.rank_ids,
        )


# --- array codec ----------------------------------------------------------------------------------


def encode_array(values: Any, dtype: str) -> dict[str, Any]:
    """Encode an array exactly as little-endian, byte-shuffled, zlib-compressed base64."""
    arr = np.ascontiguousarray(values, dtype=_DTYPES[dtype])
    return {
        "dtype": dtype,
        "shape": list(arr.shape),
        "codec": CODEC,
        "data": base64.b64encode(zlib.compress(shuffle_bytes(arr), 9)).decode("ascii"),
    }


def shuffle_bytes(arr: Any) -> bytes:
    """The bytes of ``arr`` byte-shuffled: byte ``i`` of every value stored together."""
    raw = np.ascontiguousarray(arr).tobytes()
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, arr.itemsize).T.tobytes()


def unshuffle_bytes(raw: bytes, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
    """The array ``shuffle_bytes`` wrote; ``raw`` must hold exactly its bytes."""
    shuffled = np.frombuffer(raw, dtype=np.uint8).reshape(dtype.itemsize, -1)
    return np.frombuffer(shuffled.T.tobytes(), dtype=dtype).reshape(shape)


def decode_array(obj: Any, name: str, ndim: int | None = None) -> Any:
    """Decode an ``encode_array`` object; raises ReportFormatError naming ``name`` on any defect.

    The declared dtype and shape fix the byte count, which is checked against the compressed
    size before decompressing and against the decompressed size (bounded by the declaration)
    before the array is built.
    """
    if not isinstance(obj, dict):
        raise ReportFormatError(f"packet field {name!r} must be an encoded array object")
    missing = [k for k in ("dtype", "shape", "codec", "data") if k not in obj]
    if missing:
        raise ReportFormatError(f"packet field {name!r} is missing key(s) {missing}")
    dtype = _DTYPES.get(obj["dtype"]) if isinstance(obj["dtype"], str) else None
    if dtype is None:
        raise ReportFormatError(f"packet field {name!r} has unsupported dtype {obj['dtype']!r}")
    if obj["codec"] != CODEC:
        raise ReportFormatError(f"packet field {name!r} has unknown codec {obj['codec']!r}")
    shape = _checked_shape(obj["shape"], name, ndim)
    check_limit("cells", math.prod(shape), f"packet field {name!r} declares shape {list(shape)}")
    expected = math.prod(shape) * dtype.itemsize
    compressed = _b64decode(obj["data"], name)
    if expected > _MAX_ZLIB_RATIO * len(compressed) + 64:
        raise ReportFormatError(
            f"packet field {name!r}: shape/byte mismatch: declared shape {list(shape)} needs "
            f"{expected} bytes, more than {len(compressed)} compressed bytes can hold"
        )
    raw = inflate_exact(compressed, expected, f"packet field {name!r}")
    return unshuffle_bytes(raw, dtype, shape)


def _checked_shape(shape: Any, name: str, ndim: int | None) -> tuple[int, ...]:
    ok = isinstance(shape, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape
    )
    if not ok:
        raise ReportFormatError(
            f"packet field {name!r}: shape must be a list of non-negative ints, got {shape!r}"
        )
    if ndim is not None and len(shape) != ndim:
        raise ReportFormatError(f"packet field {name!r}: expected {ndim} axes, got shape {shape}")
    return tuple(shape)


def _b64decode(text: Any, name: str) -> bytes:
    if not isinstance(text, str):
        raise ReportFormatError(f"packet field {name!r}: data must be a base64 string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ReportFormatError(f"packet field {name!r}: data is not valid base64: {exc}") from None


def inflate_exact(compressed: bytes, expected: int, what: str) -> bytes:
    """Decompress at most ``expected + 1`` bytes; anything but exactly ``expected`` is an error
    (a ReportFormatError starting with ``what``)."""
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(compressed, expected + 1)
        complete = inflater.eof and not inflater.unconsumed_tail and not inflater.unused_data
    except zlib.error as exc:
        raise ReportFormatError(f"{what}: data is not valid zlib: {exc}") from None
    if len(raw) != expected or not complete:
        if len(raw) > expected:
            got = f"more than {expected}"
        elif len(raw) < expected:
            got = str(len(raw))
        else:
            got = f"{expected} in a truncated stream or one followed by trailing data"
        raise ReportFormatError(
            f"{what}: shape/byte mismatch: declared {expected} bytes, decoded {got}"
        )
    return raw


# --- writing --------------------------------------------------------------------------------------


def packet_dict(packet: Packet) -> dict[str, Any]:
    """The packet as a JSON-ready dict.

    Raises:
        ReportFormatError: the packet's report does not describe its matrix under its gates.
    """
    _check_consistent(packet.d, packet.stages, packet.gates, packet.report)
    return {
        "format": PACKET_FORMAT,
        "version": PACKET_VERSION,
        "d": encode_array(packet.d, "<f8"),
        "stages": list(packet.stages),
        "roles": None if packet.roles is None else list(packet.roles),
        "side": None if packet.side is None else _side_to_dict(packet.side),
        "gates": packet.gates.to_dict(),
        "meta": dict(packet.meta),
        "report": packet.report.to_dict(),
    }


def packet_bytes(packet: Packet) -> bytes:
    """The packet serialized as compact UTF-8 JSON (strict: no NaN or infinity)."""
    try:
        text = json.dumps(packet_dict(packet), allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ReportFormatError(f"packet is not JSON-serializable (check meta): {exc}") from None
    return text.encode("utf-8")


def packet_name(record: dict[str, Any]) -> str:
    """``window-000003.json``; a restarted job's attempt k writes ``window-000003.attempt-k.json``
    instead of overwriting the first attempt's packet of the same window index."""
    attempt = record.get("attempt", 0)
    suffix = f".attempt-{attempt}" if attempt else ""
    return f"window-{record['window']:06d}{suffix}.json"


_PACKET_NAME = re.compile(r"^window-(?P<window>\d+)(?:\.attempt-(?P<attempt>\d+))?\.json$")


def packet_key(name: str) -> tuple[int, int] | None:
    """The (attempt, window) a per-rank packet's file name says (``packet_name``), None for
    another name."""
    match = _PACKET_NAME.match(name)
    return None if match is None else (int(match["attempt"] or 0), int(match["window"]))


def write_packet(path: str | os.PathLike[str], packet: Packet) -> Path:
    """Write a packet atomically (temporary file in the same folder, then ``os.replace``), so a
    reader never sees a partial packet. The file gets the mode any new file of this process gets
    (``0o666`` less the umask), like ``windows.jsonl`` beside it. Returns the path written."""
    return write_bytes_atomically(path, packet_bytes(packet))


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A new binary file that replaces ``path`` once the block ends: written through a
    temporary file in the same folder, flushed, synced and renamed into place, so a reader
    never sees a partial file. On an error the temporary file is removed and ``path`` is left
    as it was."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "xb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomically(path: str | os.PathLike[str], payload: bytes) -> Path:
    """Write ``payload`` to ``path`` through ``atomic_file``. Returns the path written."""
    with atomic_file(path) as handle:
        handle.write(payload)
    logger.debug("wrote %s (%d bytes)", path, len(payload))
    return Path(path)


def remove_temporaries(folder: str | os.PathLike[str], pattern: str) -> list[str]:
    """Delete the regular files named like ``pattern`` directly in ``folder``: the temporary
    files of atomic writes that a killed process or a power loss interrupted (a finished or
    failed write removes its own). Called where no write of this run can be under way yet.
    Says what it removed in one log line, and returns the names; never raises."""
    removed: list[str] = []
    try:
        for path in Path(folder).glob(pattern):
            if path.is_file() and not path.is_symlink():
                path.unlink(missing_ok=True)
                removed.append(path.name)
    except OSError as exc:
        logger.debug("removing temporary files in %s failed: %s", folder, exc)
    if removed:
        logger.info(
            "stagefrontier: removed %d temporary file(s) an interrupted write left in %s",
            len(removed),
            folder,
        )
    return removed


def _side_to_dict(side: SideEvidence) -> dict[str, Any]:
    """Side evidence with its arrays in the binary codec: exact, compact, and NaN-safe (event
    times hold NaN where nothing was sampled, which strict JSON cannot carry)."""
    out = side.to_dict()
    for key, dtype in _SIDE_ARRAYS.items():
        value = getattr(side, key)
        out[key] = None if value is None else encode_array(value, dtype)
    if side.collectives is not None:  # the ranks' timed collectives, exact
        for key in _COLLECTIVE_ARRAYS:
            if getattr(side.collectives, key) is not None:
                out["collectives"][key] = encode_array(getattr(side.collectives, key), "<f8")
    return out


# --- reading --------------------------------------------------------------------------------------


def read_packet(path: str | os.PathLike[str]) -> Packet:
    """Read and validate a packet file; raises ReportFormatError for any corrupt content or a
    file over the packet size limit (``formats.limits``)."""
    return packet_from_bytes(read_capped(path, "packet_bytes"))


def packet_from_bytes(data: bytes) -> Packet:
    """Decode packet bytes; every defect raises ReportFormatError with a specific message."""
    return packet_from_dict(packet_json(data))


def packet_json(data: bytes) -> Any:
    """Packet bytes parsed as strict JSON; raises ReportFormatError when they are not."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        raise ReportFormatError(f"packet is not JSON: {exc}") from None


def _reject_constant(name: str) -> Any:
    """Strict JSON: NaN and infinities are not numbers a packet may hold."""
    raise ValueError(f"non-finite number {name} is not allowed")


def packet_from_dict(obj: Any) -> Packet:
    """Validate a parsed packet object and decode it."""
    obj = check_document(obj, PACKET_FORMAT, PACKET_VERSION, "packet", _FIELDS)
    d = _decode_matrix(obj["d"])
    if not isinstance(obj["stages"], list):
        raise ReportFormatError("packet field 'stages' must be a list of stage names")
    stages = run_field("stages", check_stage_names, obj["stages"], d.shape[2])
    roles = _decode_roles(obj["roles"], d.shape[1])
    side = None if obj["side"] is None else run_field("side", _side_from_dict, obj["side"], d.shape)
    gates = run_field("gates", Gates.from_dict, object_field(obj["gates"], "gates"))
    meta = run_field("meta", check_window_meta, object_field(obj["meta"], "meta"))
    report = run_field("report", WindowReport.from_dict, object_field(obj["report"], "report"))
    check_stored_report(report)
    _check_consistent(d, stages, gates, report)
    return Packet(d=d, stages=stages, roles=roles, side=side, gates=gates, meta=meta, report=report)


def _decode_matrix(obj: Any) -> FloatArray:
    arr = decode_array(obj, "d", ndim=3)
    if arr.dtype != np.dtype("<f8"):
        raise ReportFormatError(f"packet field 'd' must be float64 ('<f8'), got {arr.dtype.str}")
    matrix: FloatArray = run_field("d", as_window, arr.astype(np.float64))
    return matrix


def _decode_roles(roles: Any, n_ranks: int) -> tuple[str, ...] | None:
    if roles is None:
        return None
    if not isinstance(roles, list) or not all(isinstance(x, str) for x in roles):
        raise ReportFormatError("packet field 'roles' must be null or a list of strings")
    if len(roles) != n_ranks:
        raise ReportFormatError(f"packet field 'roles' has {len(roles)} roles for {n_ranks} ranks")
    return tuple(roles)


def _side_from_dict(data: dict[str, Any], shape: tuple[int, int, int]) -> SideEvidence:
    """Side evidence decoded and checked against the matrix's shape (as the analyzer will)."""
    values = dict(object_field(data, "side"))
    for key in _SIDE_ARRAYS:
        if values.get(key) is not None:
            values[key] = decode_array(values[key], f"side.{key}")
    if values.get("collectives") is not None:
        collectives = dict(object_field(values["collectives"], "side.collectives"))
        for key in _COLLECTIVE_ARRAYS:
            if key != "queued_ms" or collectives.get(key) is not None:
                collectives[key] = decode_array(collectives.get(key), f"side.collectives.{key}")
        values["collectives"] = collectives
    return SideEvidence.from_dict(values).checked(*shape)


def object_field(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ReportFormatError(f"packet field {name!r} must be a JSON object")
    return value


def run_field(name: str, decode: Any, *args: Any) -> Any:
    """Run a field decoder, turning its validation errors into ReportFormatError."""
    try:
        return decode(*args)
    except ReportFormatError:
        raise
    except (StageFrontierError, TypeError, ValueError) as exc:
        raise ReportFormatError(f"packet field {name!r} is invalid: {exc}") from None


def _check_consistent(
    d: FloatArray, stages: tuple[str, ...], gates: Gates, report: WindowReport
) -> None:
    """The stored report must describe the stored matrix under the stored gates."""
    n, r, _ = d.shape
    if tuple(report.stages) != stages or (report.n_steps, report.n_ranks) != (n, r):
        raise ReportFormatError(
            f"packet report describes {report.n_steps} steps x {report.n_ranks} ranks of "
            f"{report.stages}, but the matrix is {list(d.shape)} of {list(stages)}"
        )
    if report.gates != gates:
        raise ReportFormatError("packet report was computed with other gates than the packet's")
