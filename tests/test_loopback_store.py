"""The demo's TCPStore server listens on loopback only: torch binds its server to every interface
whatever host it is given, so the demo hands it a socket bound to 127.0.0.1. Checked from inside a
rank the demo's launcher started, against the kernel's table of listening sockets."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")

from rank_support import START_METHOD
from stagefrontier.demo.launch import run_ranks

PROC_TABLES = {"/proc/net/tcp": socket.AF_INET, "/proc/net/tcp6": socket.AF_INET6}
LISTEN = "0A"
"""The kernel's code for a socket in the LISTEN state."""


def listening_addresses(port: int) -> list[str]:
    """The local addresses of every socket listening on ``port`` (what ``ss -ltn`` shows)."""
    found = []
    for table, family in PROC_TABLES.items():
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == LISTEN and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                # Each 32-bit word of the address is printed in host (little-endian) order.
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.append(socket.inet_ntop(family, words))
    return sorted(found)


def report_listeners(rank: int, out_dir: str, port: int) -> None:
    """A rank of the launcher: record where the store it was given listens."""
    Path(out_dir, "listeners.json").write_text(json.dumps(listening_addresses(port)))


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc/net/tcp")
def test_the_demo_store_listens_on_loopback_only(tmp_path: Path) -> None:
    codes = run_ranks(report_listeners, 1, str(tmp_path), deadline_s=120, start_method=START_METHOD)
    assert codes == {0: 0}
    # Before the fix this was ["::"]: the wildcard address, every interface, IPv4 included.
    assert json.loads((tmp_path / "listeners.json").read_text()) == ["127.0.0.1"]
