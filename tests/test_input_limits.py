"""Inputs that used to exhaust memory: each is refused with one line, in a process whose address
space is capped well below what the old readers took, so a regression fails here instead of
taking the machine down."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import resource
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier.formats.limits import LIMITS, limit, read_capped
from stagefrontier.formats.packet import Packet, read_packet, write_packet
from stagefrontier.formats.records import read_records
from trace_support import load_events, write_events
from trace_support import trace as committed_trace

ADDRESS_SPACE = 3 << 30
"""The cap on the CLI process: numpy and the readers fit easily; the old readers took 4-22 GB
on these inputs."""
STAGES = sf.DEFAULT_STAGES


def cli_under_memory_cap(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the console entry point with a capped address space; returns (exit code, stderr)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    child_env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "stagefrontier.cli", *argv],
        capture_output=True,
        text=True,
        env=child_env,
        preexec_fn=cap,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stderr


def assert_refused(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("stagefrontier: error: "), err
    assert needle in err, err


@pytest.fixture(scope="module")
def trace() -> Path:
    return committed_trace("single-3-steps.json")


def packet_obj(tmp_path: Path) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    d = 0.01 + 0.001 * rng.random((6, 2, len(STAGES)))
    path = write_packet(tmp_path / "p.json", Packet.of_window(d, sf.analyze(d, STAGES)))
    obj: dict[str, Any] = json.loads(path.read_text())
    return obj


def test_trace_stating_a_billion_ranks_is_refused(trace: Path, tmp_path: Path) -> None:
    header, events = load_events(trace)
    header["distributedInfo"] = {"rank": 0, "world_size": 10**9}
    path = write_events(tmp_path / "huge_world.json", header, events)
    code, err = cli_under_memory_cap("analyze", str(path), "--allow-missing-ranks")
    assert_refused(code, err, "STAGEFRONTIER_MAX_WORLD_SIZE")


def test_missing_ranks_are_listed_up_to_the_bound(trace: Path) -> None:
    world = limit("world_size")
    reduced = sf.reducers.reduce_kineto(trace, world_size=world, missing_ranks="allow")
    assert reduced.missing_ranks == tuple(range(1, world))
    with pytest.raises(sf.TraceFormatError, match="STAGEFRONTIER_MAX_WORLD_SIZE"):
        sf.reducers.reduce_kineto(trace, world_size=world + 1, missing_ranks="allow")


def test_packet_declaring_a_huge_shape_is_refused_before_inflating(tmp_path: Path) -> None:
    obj = packet_obj(tmp_path)
    zeros = zlib.compress(bytes(2_700_000 * 1000 // 1032), 9)  # about 2.7 MB of zlib
    obj["d"]["shape"] = [44739242, 1, 6]
    obj["d"]["data"] = base64.b64encode(zeros).decode()
    path = tmp_path / "huge_shape.json"
    path.write_text(json.dumps(obj))
    code, err = cli_under_memory_cap("analyze", str(path))
    assert_refused(code, err, "STAGEFRONTIER_MAX_CELLS")
    assert "[44739242, 1, 6]" in err


def test_packet_over_the_size_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with path.open("wb") as handle:  # 300 MB, sparse: the size alone refuses it
        handle.write(b'{"format": "stagefrontier.formats.packet"')
        handle.truncate(300_000_000)
    code, err = cli_under_memory_cap("analyze", str(path), "--format", "packet")
    assert_refused(code, err, "STAGEFRONTIER_MAX_PACKET_BYTES")


def test_limits_are_overridable_by_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = packet_obj(tmp_path)
    path = tmp_path / "p.json"
    assert read_packet(path).d.shape == (6, 2, len(STAGES))
    monkeypatch.setenv(LIMITS["packet_bytes"].env, "1000")
    with pytest.raises(sf.ReportFormatError, match="over the limit of 1000 bytes for a packet"):
        read_packet(path)
    monkeypatch.setenv(LIMITS["cells"].env, "10")
    monkeypatch.setenv(LIMITS["packet_bytes"].env, str(1 << 20))
    with pytest.raises(sf.ReportFormatError, match="STAGEFRONTIER_MAX_CELLS"):
        read_packet(path)
    monkeypatch.setenv(LIMITS["cells"].env, "many")
    with pytest.raises(sf.ReportFormatError, match="expected a positive integer"):
        read_packet(path)
    assert obj["d"]["shape"] == [6, 2, len(STAGES)]


def test_dev_zero_as_a_packet_is_refused_before_reading() -> None:
    code, err = cli_under_memory_cap(
        "analyze", "/dev/zero", "--format", "packet", env={LIMITS["packet_bytes"].env: "1000000"}
    )
    assert_refused(code, err, "/dev/zero: the file is not a regular file")
    with pytest.raises(sf.ReportFormatError, match="not a regular file"):
        read_capped("/dev/zero", "packet_bytes")


def zeros_npz(path: Path, gib: int = 2) -> Path:
    """An .npz whose ``d`` holds ``gib`` GiB of float64 zeros in about a thousandth of that: one
    fully flushed deflate block of 64 MiB of zeros, repeated (a valid stream, built in a blink)."""
    buffer = io.BytesIO()
    shape = (gib << 27, 1, 1)
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    header = buffer.getvalue()
    zeros = bytes(64 << 20)
    repeats = gib * 16

    def flushed(data: bytes) -> bytes:
        deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
        return deflate.compress(data) + deflate.flush(zlib.Z_FULL_FLUSH)

    deflated = flushed(header) + flushed(zeros) * repeats + b"\x03\x00"  # + an empty last block
    crc = zlib.crc32(header)
    for _ in range(repeats):
        crc = zlib.crc32(zeros, crc)
    stages = _npy(np.array(list(STAGES)))
    members = [
        ("stages.npy", 0, stages, len(stages), zlib.crc32(stages)),
        ("d.npy", 8, deflated, len(header) + (gib << 30), crc),
    ]
    path.write_bytes(_zip(members))
    return path


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _zip(members: list[tuple[str, int, bytes, int, int]]) -> bytes:
    """A zip archive of (name, method, stored bytes, uncompressed size, crc) members."""
    local = b""
    central = b""
    for name, method, data, size, crc in members:
        encoded = name.encode()
        fields = (20, 0, method, 0, 0, crc, len(data), size, len(encoded), 0)
        central += struct.pack("<IH", 0x02014B50, 20) + struct.pack("<HHHHHIIIHH", *fields)
        central += struct.pack("<HHHII", 0, 0, 0, 0, len(local)) + encoded
        local += struct.pack("<I", 0x04034B50) + struct.pack("<HHHHHIIIHH", *fields)
        local += encoded + data
    n = len(members)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(central), len(local), 0)
    return local + central + end


def test_small_npz_holding_gibibytes_of_zeros_is_refused(tmp_path: Path) -> None:
    path = zeros_npz(tmp_path / "zeros.npz")
    assert path.stat().st_size < 4 << 20
    with zipfile.ZipFile(path) as archive:  # a valid archive: numpy would inflate all of it
        assert archive.getinfo("d.npy").file_size > 2 << 30
        with archive.open("d.npy") as member:
            assert np.lib.format.read_magic(member) == (1, 0)
    code, err = cli_under_memory_cap("analyze", str(path))
    assert_refused(code, err, "STAGEFRONTIER_MAX_CELLS")


def test_gzip_trace_of_whitespace_is_refused_while_inflating(tmp_path: Path) -> None:
    block = gzip.compress(b" " * (16 << 20), 9)
    path = tmp_path / "blank.json.gz"
    path.write_bytes(block * 256)  # gzip members concatenated: 4 GiB of spaces
    assert path.stat().st_size < 10 << 20
    code, err = cli_under_memory_cap("analyze", str(path))
    assert_refused(code, err, "STAGEFRONTIER_MAX_INFLATE_RATIO")


def test_windows_jsonl_over_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "windows.jsonl"
    path.write_bytes(b"\n" * 5000)
    assert read_records(path) == []
    monkeypatch.setenv(LIMITS["records_bytes"].env, "4000")
    with pytest.raises(sf.ReportFormatError, match="STAGEFRONTIER_MAX_RECORDS_BYTES"):
        read_records(path)


def test_a_record_line_over_the_line_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "windows.jsonl"
    with path.open("wb") as handle:  # one 20 MB line, never held whole
        handle.write(b'{"window": 0, "pad": "')
        handle.write(b"x" * (20 << 20))
        handle.write(b'"}\n')
    with pytest.raises(sf.ReportFormatError, match=r"windows.jsonl:1: a line over 16777216 bytes"):
        read_records(path)
