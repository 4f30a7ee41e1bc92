"""Cross-rank window collection through the job's c10d store, with no collective at all.

Every rank opens its own connection to the store on a background thread (a clone of the default
store, else a TCPStore client on MASTER_ADDR/MASTER_PORT), so the training thread's own store
traffic is never serialized behind ours. Ranks other than 0 write one key per window; rank 0's
collector polls for them until a deadline measured from its own window end, analyzes the ranks
that arrived and records the rest as missing. Any store failure downgrades, never raises.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ..errors import ReportFormatError
from ..sinks import Sink, default_sinks, emit
from ..window import RankWindow, analyze_merged, merge_windows
from .base import BackgroundWorker
from .wire import decode_window, encode_window

logger = logging.getLogger("stagefrontier")

CHUNK_BYTES = 4 << 20
"""Payloads above this size are split over several keys (the store server caps a value)."""
_CHUNKED = struct.Struct("<4sIQ")
_CHUNK_MAGIC = b"SFC1"
POLL_S = 0.005


def _attempt() -> tuple[str, int]:
    run = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("STAGEFRONTIER_RUN_ID") or "run"
    return run, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def store_prefix() -> str:
    """Keys are scoped by torchelastic run id and restart count, so a restarted attempt never
    reads the previous attempt's windows."""
    run, restart = _attempt()
    return f"stagefrontier/{run}/{restart}/"


def previous_attempt_prefix() -> str | None:
    """The key prefix of the attempt before a torchelastic restart, whose leftovers rank 0
    deletes window by window."""
    run, restart = _attempt()
    return f"stagefrontier/{run}/{restart - 1}/" if restart > 0 else None


def window_key(window: int, rank: int) -> str:
    return f"w{window}/r{rank}"


def open_connection(store: Any = None, timeout_s: float = 30.0) -> Any:
    """A private store connection: ``store.clone()`` of the given or default store, else a
    TCPStore client on MASTER_ADDR/MASTER_PORT. Raises if neither is reachable."""
    import torch.distributed as dist  # only the distributed collector touches torch

    base = store
    if base is None:
        from torch.distributed import distributed_c10d

        try:
            base = distributed_c10d._get_default_store()
        except Exception:
            base = None
    if base is not None:
        try:
            conn = base.clone()
        except Exception as exc:  # stores without clone support
            logger.debug("stagefrontier: store.clone() failed (%s); using a TCPStore client", exc)
        else:
            conn.set_timeout(timedelta(seconds=timeout_s))
            return conn
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return dist.TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


class StoreCollector:
    """Sender on every rank but 0, collector on rank 0; both run on one background thread."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        out_dir: str | os.PathLike[str],
        timeout_s: float = 10.0,
        queue_size: int = 4,
        store: Any = None,
        sinks: Sequence[Sink] | None = None,
        join_timeout_s: float | None = None,
        send_delay_s: float = 0.0,
    ) -> None:
        self.rank = rank
        self.send_delay_s = send_delay_s
        """Fault injection: a delay before each window is sent (a late rank)."""
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._base_store = store
        self._conn: Any = None
        self._previous: Any = None
        self._dead: str | None = None
        self._absent: set[int] = set()
        self.sinks = list(sinks) if sinks is not None else []
        if rank == 0 and sinks is None:
            self.sinks = default_sinks(out_dir, packets=True)
        handler = self._collect if rank == 0 else self._send
        self._worker = BackgroundWorker(
            f"stagefrontier-{'collector' if rank == 0 else 'sender'}",
            handler,
            queue_size,
            join_timeout_s if join_timeout_s is not None else timeout_s + 5.0,
        )

    # ------------------------------------------------------------------ training thread
    def submit(self, window: RankWindow) -> bool:
        return self._worker.offer((window, time.monotonic()))

    def close(self) -> None:
        self._worker.close()
        for sink in self.sinks:
            sink.close()
        conn, self._conn = self._conn, None
        del conn  # drops our private connection; the job's store and groups are untouched

    # ------------------------------------------------------------------ background thread
    def _connection(self) -> Any:
        if self._conn is None:
            from torch.distributed import PrefixStore

            raw = open_connection(self._base_store)
            self._conn = PrefixStore(store_prefix(), raw)
            previous = previous_attempt_prefix()
            self._previous = None if previous is None else PrefixStore(previous, raw)
        return self._conn

    def _fail(self, what: str, exc: BaseException) -> None:
        if self._dead is None:
            logger.warning("stagefrontier: store %s failed, collection disabled: %s", what, exc)
        self._dead = f"store unavailable since a failed {what}: {exc}"

    def _send(self, item: tuple[RankWindow, float]) -> None:
        window, _ = item
        if self._dead:
            return
        if self.send_delay_s:
            time.sleep(self.send_delay_s)
        try:
            conn = self._connection()
            key = window_key(window.window, window.rank)
            data = encode_window(window)
            if len(data) > CHUNK_BYTES:
                chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]
                for i, chunk in enumerate(chunks):
                    conn.set(f"{key}/c{i}", chunk)
                data = _CHUNKED.pack(_CHUNK_MAGIC, len(chunks), sum(map(len, chunks)))
            conn.set(key, data)  # set last: its presence means the window is complete
            if window.window >= 2:  # a window rank 0 gave up on; deleting twice is harmless
                conn.delete_key(window_key(window.window - 2, window.rank))
        except Exception as exc:
            self._fail("send", exc)

    def _collect(self, item: tuple[RankWindow, float]) -> None:
        own, ended = item
        windows = [own]
        notes: list[str] = []
        if self._dead:
            notes.append(self._dead)
        elif self.world_size > 1:
            try:
                windows += self._gather(own.window, deadline=ended + self.timeout_s, notes=notes)
            except Exception as exc:
                self._fail("read", exc)
                notes.append(f"store read failed: {exc}")
        merged = merge_windows(windows, self.world_size, notes)
        emit(self.sinks, analyze_merged(merged))

    def _gather(self, index: int, deadline: float, notes: list[str]) -> list[RankWindow]:
        conn = self._connection()
        pending = {r: window_key(index, r) for r in range(1, self.world_size)}
        arrived: list[RankWindow] = []
        while True:
            for rank, key in list(pending.items()):
                if conn.check([key]):
                    del pending[rank]
                    try:
                        arrived.append(self._read(conn, key, index, rank))
                    except ReportFormatError as exc:
                        notes.append(f"rank {rank} window rejected: {exc}")
            # Ranks that missed the previous window are checked, not waited for, so a dead rank
            # cannot make every later window wait out the whole deadline.
            if not pending or time.monotonic() >= deadline or pending.keys() <= self._absent:
                break
            time.sleep(POLL_S)
        for key in pending.values():
            conn.delete_key(key)  # a late sender's key would otherwise stay forever
        self._absent = set(pending)
        if self._previous is not None:
            for rank in range(self.world_size):
                self._previous.delete_key(window_key(index, rank))
        return arrived

    def _read(self, conn: Any, key: str, index: int, rank: int) -> RankWindow:
        data = bytes(conn.get(key))
        keys = [key]
        if data[:4] == _CHUNK_MAGIC:
            if len(data) != _CHUNKED.size:
                raise ReportFormatError("bad chunk index")
            _, count, total = _CHUNKED.unpack(data)
            keys += [f"{key}/c{i}" for i in range(count)]
            data = b"".join(bytes(conn.get(k)) for k in keys[1:])
            if len(data) != total:
                raise ReportFormatError(f"chunked window has {len(data)} bytes, expected {total}")
        for k in keys:
            conn.delete_key(k)
        window = decode_window(data)
        if window.window != index or window.rank != rank:
            raise ReportFormatError(
                f"key for window {index} rank {rank} held window {window.window} rank {window.rank}"
            )
        return window
