"""The store plumbing every store-based collection level shares: payloads split over keys,
the senders' key lifetime, and the collecting side's wait for one key per peer.

A peer is a rank (flat collection, or a rank inside its node) or a node (its leader's summary
going up to rank 0); the rules are the same at every level:

- a payload above ``CHUNK_BYTES`` is split over ``key/c<i>`` keys, and the key itself is written
  last, so its presence means the payload is complete;
- a sender deletes its own keys of windows below the collector's ``done`` counter (the collector
  moved past them without reading them), and never keeps more than ``MAX_UNCOLLECTED``;
- the collector waits for a peer until a deadline, but a peer that missed the previous window
  only until a short grace, so a dead peer does not stall every window; a full hand-off queue
  cuts the wait short only for such a peer: the collector's own slowness (its queue filled while
  it analyzed) never makes a peer whose part is on its way missing.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from ..errors import ReportFormatError

CHUNK_BYTES = 4 << 20
"""Payloads above this size are split over several keys (the store server caps a value)."""
_CHUNKED = struct.Struct("<4sIQ")
CHUNK_MAGIC = b"SFC1"
MAX_CHUNKS = 1024
"""A chunk index naming more chunks than this (4 GiB) is rejected as corrupt."""
POLL_S = 0.005
ABSENT_GRACE_S = 0.25
"""How long after its window end a collector waits for a peer that missed the previous window
(instead of the full deadline), so a dead peer does not stall every window and a peer that was
late once is not reported missing for good."""
DONE_KEY = "done"
"""The collector's counter: every window below it has been collected or given up on."""
MAX_UNCOLLECTED = 64
"""A sender deletes its keys older than this many windows even if the collector never moved past
them (stuck or gone), so the store never holds more than this per sender."""


def put_payload(conn: Any, key: str, data: bytes) -> int:
    """Write ``data`` under ``key`` (chunked when large); returns the number of chunks (0: one
    plain key)."""
    if len(data) <= CHUNK_BYTES:
        conn.set(key, data)
        return 0
    parts = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]
    for i, part in enumerate(parts):
        conn.set(f"{key}/c{i}", part)
    conn.set(key, _CHUNKED.pack(CHUNK_MAGIC, len(parts), len(data)))  # last: complete
    return len(parts)


def get_payload(conn: Any, key: str, read: list[str]) -> bytes:
    """The payload under ``key``, reassembled; every key read is appended to ``read`` (for the
    collector to delete). Raises ReportFormatError for a broken chunk index or missing chunks."""
    data = bytes(conn.get(key))
    read.append(key)
    if data[:4] != CHUNK_MAGIC:
        return data
    count, total = chunk_index(data)
    keys = [f"{key}/c{i}" for i in range(count)]
    read.extend(keys)
    if not conn.check(keys):  # never block in get() on a key that is not there
        raise ReportFormatError(f"chunks of {key} are missing")
    data = b"".join(bytes(conn.get(k)) for k in keys)
    if len(data) != total:
        raise ReportFormatError(f"chunked payload has {len(data)} bytes, expected {total}")
    return data


def chunk_index(data: bytes) -> tuple[int, int]:
    """(chunk count, total bytes) of a chunk index, validated before anything is fetched."""
    if len(data) != _CHUNKED.size:
        raise ReportFormatError("bad chunk index")
    _, count, total = _CHUNKED.unpack(data)
    if not 1 < count <= MAX_CHUNKS or count != -(-total // CHUNK_BYTES):
        raise ReportFormatError(f"chunk index names {count} chunks for {total} bytes")
    return count, total


def delete_payload(store: Any, key: str, chunks: int | None = None) -> None:
    """Delete a payload key and its chunks; ``chunks=None``: read the count from the key."""
    if chunks is None:
        if not store.check([key]):
            return
        data = bytes(store.get(key))
        chunks = 0
        if data[:4] == CHUNK_MAGIC:
            try:
                chunks = chunk_index(data)[0]
            except ReportFormatError:
                chunks = 0
    for i in range(chunks):
        store.delete_key(f"{key}/c{i}")
    store.delete_key(key)


class SentKeys:
    """A sender's payloads not yet freed: ``key_of(window)`` names the key of a window."""

    def __init__(self, key_of: Callable[[int], str]) -> None:
        self.key_of = key_of
        self._written: deque[tuple[int, int]] = deque()

    def send(self, conn: Any, window: int, data: bytes) -> int:
        """Write this window's payload, then free what the collector moved past; returns the
        collector's done counter (the windows it has finished)."""
        self._written.append((window, put_payload(conn, self.key_of(window), data)))
        done = int(conn.add(DONE_KEY, 0))
        written = self._written
        while written and (written[0][0] < done or len(written) > MAX_UNCOLLECTED):
            index, chunks = written.popleft()
            delete_payload(conn, self.key_of(index), chunks)
        return done

    def take_back(self, conn: Any, since: int) -> list[bytes]:
        """The payloads of this sender's windows from ``since`` on still in the store, in
        order; every key it wrote is deleted (the collector is gone)."""
        payloads = []
        while self._written:
            index, chunks = self._written.popleft()
            key = self.key_of(index)
            if index >= since and conn.check([key]):
                with suppress(ReportFormatError):  # its chunks were half read and deleted
                    payloads.append(get_payload(conn, key, []))
            delete_payload(conn, key, chunks)
        return payloads


class PeerWait:
    """The collecting side's wait for one key per peer, remembering who was absent last time."""

    def __init__(self, what: str, payload: str) -> None:
        self.what = what
        """``rank`` or ``node``: how notes name a peer."""
        self.payload = payload
        """``window`` or ``summary``: how notes name what it sends."""
        self.absent: set[int] = set()

    def wait(
        self,
        conn: Any,
        pending: dict[int, str],
        *,
        deadline: float,
        grace: float,
        take: Callable[[int, str], None],
        notes: list[str],
        give_up: Callable[[], bool] = lambda: False,
        activity: Callable[[str], None] = lambda text: None,
    ) -> dict[int, str]:
        """Call ``take(peer, key)`` for every key of ``pending`` that appears by the deadline
        (a ReportFormatError from it becomes a note: that peer's payload is rejected); returns
        the peers still pending. Peers absent last time get only until ``grace``, and
        ``give_up`` (the hand-off queue filled up) ends the wait early for them, with a note; a
        peer that sent the previous window is waited for until the deadline, full queue or not
        (the queue fills with the collector's own backlog, however early the peer's part is)."""
        pending = dict(pending)
        try:
            while pending:
                activity(f"waiting for {self.what}(s) {sorted(pending)}")
                keys = list(pending.values())
                if conn.check(keys):  # all there: one round trip
                    ready = list(pending)
                elif len(keys) == 1:
                    ready = []
                else:
                    ready = [peer for peer, key in pending.items() if conn.check([key])]
                for peer in ready:
                    key = pending.pop(peer)
                    try:
                        take(peer, key)
                    except ReportFormatError as exc:
                        notes.append(f"{self.what} {peer} {self.payload} rejected: {exc}")
                now = time.monotonic()
                only_absent = pending.keys() <= self.absent
                if not pending or now >= deadline or (only_absent and now >= grace):
                    break
                if only_absent and give_up():
                    notes.append(
                        f"stopped waiting for {self.what}(s) {sorted(pending)}: the hand-off "
                        "queue filled up"
                    )
                    break
                time.sleep(POLL_S)
        finally:
            self.absent = set(pending)
        return pending
