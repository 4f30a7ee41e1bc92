"""Cross-rank window collection through the job's c10d store, with no collective at all.

Every rank opens its own connection to the store on a background thread (a clone of the default
store, else a TCPStore client on MASTER_ADDR/MASTER_PORT), so the training thread's own store
traffic is never serialized behind ours. Ranks other than 0 write one key per window; rank 0's
collector polls for them until a deadline measured from its own window end, analyzes the ranks
that arrived and records the rest as missing. Any store failure downgrades, never raises.

Key lifetime: rank 0 deletes the keys it read, after the report is written, then advances a
``done`` counter (the next window it will collect). Each sender deletes its own keys of windows
below ``done`` that rank 0 never read (it gave up on a late rank, or dropped the window from a full
queue), so a key is never deleted before rank 0 has moved past its window, however far behind
rank 0's analysis runs, and no window's keys outlive the next send of their rank.

Key scopes: a process may run several timers that collect through the store (training and
evaluation). Each open store collector holds a scope, the lowest one free in its process
(``claim_scope``): scope 0 keeps the plain attempt prefix, scope k adds ``/t<k>``, so the k-th
timer open at once on every rank meets the same timer of the other ranks, and no other. Under
hierarchical collection every job-store key of the timer (its node stores' addresses, the node
parts, the done counter) sits under its scope; a profiler router holds a scope of its own kind
for its request keys (``route.requests.RequestChannel``). Two
jobs on one store share keys unless their run ids differ: rank 0 claims its keys with an owner
key, and a claim held by another collector (another job, or one that never closed) is a note
on every window.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ..environment import current_attempt
from ..errors import NoStoreError, ReportFormatError
from ..sinks import close_sinks, collector_sinks, start_sinks
from ..window.rank import PendingWindow, RankWindow
from .base import (
    BackgroundWorker,
    CollectorSettings,
    Consumers,
    analyze_received,
    merge_received,
    publish,
)
from .live import LiveAnalysis
from .rank0_watch import Rank0Watch
from .store_client import QuietStore, connect, probe
from .store_keys import ABSENT_GRACE_S, DONE_KEY, PeerWait, SentKeys, delete_payload, get_payload
from .wire import decode_window, encode_window

logger = logging.getLogger("stagefrontier")

SILENT_KEY = "silent"
"""A counter of the ranks that announced they send no windows; ``silent/<n>`` holds the n-th
one's rank."""
SENDER_CLOSE_S = 2.0
"""How long ``close`` waits for a sender's queued windows, whatever the collect timeout: a sender
only ever waits on the store, and a store that does not answer for this long (rank 0 hung, with
the store server in its process) is not worth holding the rank's exit for."""
ANALYSIS_CLOSE_S = 5.0
"""How long a collector's ``close`` allows for analyzing and writing the windows still queued,
beyond its store waits (``collector_close_s``)."""


def collector_close_s(timeout_s: float) -> float:
    """How long a collector's ``close`` waits for its queued windows: its connection, if it has
    none yet (torch's client retries a refused one for ``timeout_s``, and then once more: two
    timeouts), the wait of the last window for its peers (one more; every queued window ended
    already and waits until its end plus ``timeout_s``, so the waits do not add up), and
    ``ANALYSIS_CLOSE_S``. A dead store stops every store wait once its first call fails."""
    return 3 * timeout_s + ANALYSIS_CLOSE_S


OWNER_KEY = "owner"
"""Rank 0's claim on a scope's keys: its host, process id and collector."""

_scopes: dict[str, set[int]] = {}
_scopes_lock = threading.Lock()


def claim_scope(holder: str = "collector") -> int:
    """The lowest key scope that no open ``holder`` of this process holds (a store collector,
    or a profiler router, whose keys differ), now held."""
    with _scopes_lock:
        held = _scopes.setdefault(holder, set())
        scope = next(k for k in range(len(held) + 1) if k not in held)
        held.add(scope)
        return scope


def release_scope(scope: int, holder: str = "collector") -> None:
    with _scopes_lock:
        _scopes.get(holder, set()).discard(scope)


def store_prefix(scope: int = 0) -> str:
    """Keys are scoped by torchelastic run id and restart count, so a restarted attempt never
    reads the previous attempt's windows, and by the timer's scope (see the module doc).
    ``PrefixStore`` adds the ``/`` between this prefix and a key: window 3 of rank 1 is
    ``stagefrontier/<run>/<restart>/w3/r1`` in the job's store (``.../<restart>/t1/w3/r1`` for
    the second timer of a process)."""
    run, restart = current_attempt()
    return key_prefix(run, restart, scope)


def key_prefix(run: str, restart: int, scope: int = 0) -> str:
    """The keys' prefix of run ``run``, restart ``restart``, key scope ``scope``."""
    return f"stagefrontier/{run}/{restart}" + (f"/t{scope}" if scope else "")


def previous_attempt_prefix(scope: int = 0) -> str | None:
    """The key prefix of the attempt before a torchelastic restart, whose leftovers rank 0
    deletes window by window."""
    run, restart = current_attempt()
    if restart <= 0:
        return None
    return key_prefix(run, restart - 1, scope)


def window_key(window: int, rank: int) -> str:
    return f"w{window}/r{rank}"


def open_connection(store: Any = None, timeout_s: float = 30.0) -> Any:
    """A private store connection: to the given store, else to the job's root store, else a
    TCPStore client on MASTER_ADDR/MASTER_PORT. Raises if none is reachable.

    A connection to a TCP store is bounded by ``timeout_s``, whatever the store's own timeout:
    its address is probed with a plain connection first (a dead store refuses it at once, where
    torch's client retries for its whole timeout: ``store_client.probe``), then a client is
    built with ``timeout_s`` (one that dies between the two is retried for that long, about
    twice over, not for the job store's timeout: a ``clone`` keeps the store's, 60 s and more).
    Other stores are cloned (a ``clone`` that is not supported falls back to MASTER_ADDR).

    The default group's store is torch's ``PrefixStore`` over the job's store (``0/``, and an
    attempt prefix under torchelastic); it is unwrapped so that keys sit at the documented
    ``stagefrontier/<run>/<restart>/...`` whatever the launcher, and a restarted attempt can
    find and delete the keys of the attempt before it."""
    import torch.distributed as dist  # only the distributed collector touches torch

    base = store
    if base is None:
        from torch.distributed import distributed_c10d

        try:
            base = distributed_c10d._get_default_store()
        except Exception:
            base = None
        while isinstance(base, dist.PrefixStore):
            base = base.underlying_store
    if isinstance(base, dist.TCPStore):
        return tcp_client(base.host, base.port, timeout_s, base.libuvBackend)
    if base is not None:
        try:
            conn = connect(base.clone)
        except Exception as exc:  # stores without clone support
            logger.debug("stagefrontier: store.clone() failed (%s); using a TCPStore client", exc)
        else:
            conn.set_timeout(timedelta(seconds=timeout_s))
            return conn
    try:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        raise NoStoreError(
            "no store to use: no process group, no store given, and MASTER_ADDR/MASTER_PORT "
            "not set (a single process has no store unless one is given)"
        ) from None
    return tcp_client(host, port, timeout_s)


def tcp_client(host: str, port: int, timeout_s: float, use_libuv: bool = True) -> Any:
    """A TCPStore client of ``host:port`` whose connection and calls wait at most
    ``timeout_s``; the address is probed first (see ``open_connection``)."""
    import torch.distributed as dist

    probe(host, port, timeout_s)
    return connect(
        lambda: dist.TCPStore(
            host,
            port,
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            use_libuv=use_libuv,
        )
    )


def announce_silent(rank: int, timeout_s: float, scope: int = 0) -> None:
    """Tell rank 0, through the job's store, that this rank sends no windows (its timer is
    disabled), so rank 0 never waits for them. Runs once, on the training thread, when the
    timer is built; a failure is logged and rank 0 then treats the rank as absent."""
    try:
        conn = attempt_store(open_connection(timeout_s=timeout_s), scope)
        number = int(conn.add(SILENT_KEY, 1))
        conn.set(f"{SILENT_KEY}/{number}", str(rank))
    except Exception as exc:
        logger.warning(
            "stagefrontier: rank %d could not announce its disabled timer: %s", rank, exc
        )


def attempt_store(raw: Any, scope: int = 0) -> Any:
    """``raw`` seen through this attempt's key prefix (see ``store_prefix``), each call under
    ``store_client.quiet_cpp_log``."""
    from torch.distributed import PrefixStore

    return QuietStore(PrefixStore(store_prefix(scope), raw))


def previous_attempt_store(raw: Any, scope: int = 0) -> Any:
    """``raw`` seen through the previous attempt's key prefix, as ``attempt_store``; None on a
    first attempt."""
    from torch.distributed import PrefixStore

    previous = previous_attempt_prefix(scope)
    return None if previous is None else QuietStore(PrefixStore(previous, raw))


class StoreCollector:
    """Sender on every rank but 0, collector on rank 0; both run on one background thread."""

    def __init__(
        self,
        settings: CollectorSettings,
        *,
        store: Any = None,
        collects: bool | None = None,
        scope: int | None = None,
        watch_levels: int = 0,
    ) -> None:
        """``store``: the store to clone for the collector's connection (the job's by default);
        ``collects``: whether this rank reads the others' windows (None: rank 0 does);
        ``scope``: the key scope, already claimed (None: claimed here); ``watch_levels``: the
        node tree levels the collector this sender watches heads (``Rank0Watch``)."""
        rank, world_size, timeout_s = settings.rank, settings.world_size, settings.timeout_s
        collects = rank == 0 if collects is None else collects
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.gates = settings.gates
        self.live = LiveAnalysis(settings.gates, settings.regression)
        self._base_store = store
        self._conn: Any = None
        self._previous: Any = None
        self._dead: str | None = None
        self._closed = False
        self._wait = PeerWait("rank", "window")
        self.scope = claim_scope() if scope is None else scope
        self._collects = collects
        self._shared: str | None = None  # rank 0: why its keys are not its own, "" when they are
        self.peers: Sequence[int] = range(1, world_size)
        """The ranks whose windows this collector reads (rank 0's: every other rank)."""
        self._silent: set[int] = set()  # rank 0: ranks that announced they send no windows
        self._silent_read = 0  # rank 0: announcements read so far
        self._done = 0  # rank 0: the value of the done counter it last published
        self._sent = SentKeys(lambda index: window_key(index, rank))  # sender's keys
        self._watch = (
            None if collects else Rank0Watch(rank, settings.out_dir, timeout_s, watch_levels)
        )
        self.sinks = collector_sinks(rank, settings.out_dir, distributed=True, sinks=settings.sinks)
        start_sinks(self.sinks)
        self.consumers = Consumers()
        handler = self._collect if collects else self._send
        join_timeout_s = settings.join_timeout_s
        if join_timeout_s is None:
            join_timeout_s = collector_close_s(timeout_s) if collects else SENDER_CLOSE_S
        self._worker = BackgroundWorker(
            f"stagefrontier-{'collector' if collects else 'sender'}",
            handler,
            settings.queue_size,
            join_timeout_s,
            after_last=lambda: close_sinks(self.sinks),
        )

    # ------------------------------------------------------------------ training thread
    def submit(self, window: PendingWindow) -> bool:
        return self._worker.offer((window, time.monotonic()))

    def close(self) -> None:
        """Let queued windows finish (bounded), close the sinks, then drop the private
        connection. The job's store and process groups are untouched; safe twice and with the
        store already gone."""
        self._worker.close()
        if self._watch is not None:
            self._watch.close()
        if not self._closed:
            release_scope(self.scope)
        self._closed = True
        if self._worker.alive:  # still inside a store call: leave it its connection
            return
        conn, self._conn = self._conn, None
        if conn is not None and self._shared == "":
            try:  # the claim on the keys ends with this collector
                conn.delete_key(OWNER_KEY)
            except Exception as exc:
                logger.debug("stagefrontier: releasing the store keys failed: %s", exc)
        del conn

    # ------------------------------------------------------------------ background thread
    def _connection(self) -> Any:
        if self._conn is None:
            if self._closed:
                raise RuntimeError("the collector is closed")
            self._worker.activity = "connecting to the store"
            raw = self._open_raw()
            self._conn = attempt_store(raw, self.scope)
            self._previous = previous_attempt_store(raw, self.scope)
            if self._previous is not None and self.rank == 0:
                self._previous.delete_key(DONE_KEY)
        return self._conn

    def _open_raw(self) -> Any:
        """The store this collector's keys live in (the job's, unless a subclass says)."""
        return open_connection(self._base_store, self.timeout_s)

    def _fail(self, what: str, exc: BaseException) -> None:
        if self._dead is None:
            logger.warning("stagefrontier: store %s failed, collection disabled: %s", what, exc)
            self._dead = f"store unavailable since a failed {what}: {exc}"

    def _send(self, item: tuple[PendingWindow, float]) -> None:
        window = item[0].build()
        if self._watch is not None and self._watch.gone:
            self._worker.activity = f"keeping window {window.window} on local disk"
            self._watch.keep(window)
            return
        if self._dead:
            return
        self._worker.activity = f"sending window {window.window} to the store"
        self._sending(window)
        watch = self._watch
        try:
            conn = self._connection()
            done = self._sent.send(conn, window.window, encode_window(window))
            if watch is not None and not watch.collecting:  # rank 0 claims the keys as it
                watch.collecting = bool(conn.check([OWNER_KEY]))  # gathers its first window
        except Exception as exc:
            self._fail("send", exc)
            return
        if watch is not None and watch.silent(window.window, done):
            self._take_over(watch, done)

    def _sending(self, window: RankWindow) -> None:
        """``window`` is about to be sent (a node member holds it until its leader is done)."""

    def _take_over(self, watch: Rank0Watch, done: int) -> None:
        """Rank 0 is gone: this rank keeps its own windows."""
        kept: list[RankWindow] = []
        try:
            for payload in self._sent.take_back(self._connection(), done):
                kept.append(decode_window(payload))
        except Exception as exc:  # the store failed too: keep what was read
            logger.debug("stagefrontier: taking windows back from the store failed: %s", exc)
        watch.take_over(kept)

    def _collect(self, item: tuple[PendingWindow, float]) -> None:
        own, windows, notes, read = self._gather_window(item)
        self._worker.activity = f"analyzing window {own.window}"
        merged = merge_received(windows, self.world_size, notes)
        analyzed = analyze_received(merged, self.live.analyze)
        if analyzed is not None:
            publish(self.sinks, self.consumers, analyzed)
        self._release_window(own.window, read)

    def _gather_window(
        self, item: tuple[PendingWindow, float]
    ) -> tuple[RankWindow, list[RankWindow], list[str], list[str]]:
        """This collector's own window, the peers' windows of the same index that arrived by
        the deadline (kept even if the store fails midway), the notes, and the keys read."""
        own, ended = item[0].build(), item[1]
        windows = [own]
        notes: list[str] = []
        read: list[str] = []
        if self._shared is None and not self._dead and self.rank == 0:
            self._shared = self._claim_keys()
        if self._shared:
            notes.append(self._shared)
        if self._dead:
            notes.append(self._dead)
        elif self.peers:
            grace = ended + min(self.timeout_s, ABSENT_GRACE_S)
            try:
                self._gather(own.window, ended + self.timeout_s, grace, windows, notes, read)
            except Exception as exc:
                self._fail("read", exc)
                notes.append(f"store read failed: {exc}")
        return own, windows, notes, read

    def _claim_keys(self) -> str:
        """Rank 0 claims its scope's keys (once): "" when they are its own, else why not."""
        token = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        try:
            held = bytes(self._connection().compare_set(OWNER_KEY, "", token)).decode(
                errors="replace"
            )
        except Exception as exc:
            self._fail("claim", exc)
            return ""
        if held == token:
            return ""
        why = (
            f"another collector holds these store keys ({store_prefix(self.scope)}, claimed by "
            f"{held[:80]}): a second job on this store without a run id of its own, or one "
            "that never closed; ranks' windows may mix between them (give each job its own "
            "TORCHELASTIC_RUN_ID or STAGEFRONTIER_RUN_ID)"
        )
        logger.warning("stagefrontier: %s", why)
        return why

    def _release_window(self, index: int, read: list[str]) -> None:
        """After the report (cleanup is off the latency path): delete what was read."""
        if self._dead is None and self.peers:
            self._worker.activity = f"deleting the store keys of window {index}"
            try:
                self._release(index, read)
            except Exception as exc:
                self._fail("cleanup", exc)

    def _gather(
        self,
        index: int,
        deadline: float,
        grace: float,
        arrived: list[RankWindow],
        notes: list[str],
        read: list[str],
    ) -> None:
        """Append the windows of ``index`` that arrive by the deadline to ``arrived`` and the
        keys read to ``read``. The wait ends early when the hand-off queue is full and only
        ranks that missed the previous window are pending (waiting longer would drop a later
        window), and never includes the ranks that announced they send nothing."""
        conn = self._connection()
        self._read_silent(conn)
        silent = sorted(self._silent.intersection(self.peers))
        if silent:
            notes.append(f"rank(s) {silent} send no windows: their timers are disabled")

        def take(rank: int, key: str) -> None:
            window = decode_window(get_payload(conn, key, read))
            if window.window != index or window.rank != rank:
                raise ReportFormatError(
                    f"key for window {index} rank {rank} held window {window.window} "
                    f"rank {window.rank}"
                )
            arrived.append(window)

        self._wait.wait(
            conn,
            {r: window_key(index, r) for r in self.peers if r not in self._silent},
            deadline=deadline,
            grace=grace,
            take=take,
            notes=notes,
            give_up=lambda: self._worker.full,
            activity=lambda text: setattr(self._worker, "activity", f"window {index}: {text}"),
        )

    def _read_silent(self, conn: Any) -> None:
        """Learn the ranks announced (by ``announce_silent``) since the last window."""
        announced = int(conn.add(SILENT_KEY, 0))
        while self._silent_read < announced:
            key = f"{SILENT_KEY}/{self._silent_read + 1}"
            if not conn.check([key]):  # counted but not written yet: read it next window
                return
            self._silent_read += 1
            value = bytes(conn.get(key))
            if value.isdigit():
                self._silent.add(int(value))

    def _release(self, index: int, read: list[str]) -> None:
        """Delete what was read, and this window's keys of the previous restart attempt, then
        tell the senders that every window up to ``index`` is done."""
        conn = self._connection()
        for key in read:
            conn.delete_key(key)
        if self._previous is not None:
            for rank in self.peers:
                delete_payload(self._previous, window_key(index, rank))
        if index + 1 > self._done:
            conn.add(DONE_KEY, index + 1 - self._done)
            self._done = index + 1
