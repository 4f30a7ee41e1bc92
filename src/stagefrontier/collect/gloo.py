"""Opt-in cross-rank collection over a dedicated Gloo group (``collect="gloo"``), for sites where
the job's c10d store cannot be reached from a thread.

The group is created when the timer is built, on every rank at the same point (``new_group`` is
collective), and used by one background thread per rank and nothing else: the training process
groups are never touched. Per window, in window order, the thread does two operations on it:

1. an ``all_gather`` of a fixed-size int64 header ``[magic, version, window, payload bytes]``, so
   every rank learns the padded size and whether all ranks offer the same window;
2. a ``gather`` to rank 0 of each rank's ``wire.encode_window`` bytes as a uint8 tensor padded to
   the largest size. Rank 0 cuts each payload to its declared length and validates it with
   ``wire.decode_window`` (nothing is ever unpickled).

A rank whose hand-off queue dropped a window offers a later index than the others. Every rank sees
the same header table, so they all agree without another round: ranks behind the largest index
give up their window (rank 0 reports its own alone, with the reason) and ranks at it offer the
same window again, until all offer one index.

A Gloo timeout poisons the group for good, so the first failure or timeout of an operation marks
the group dead on that rank: its later windows are not exchanged, and rank 0 analyzes its own
window alone, marked ``telemetry_limited`` with the reason. Training never waits on any of this.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import numpy as np

from ..errors import GlooProtocolError as GlooProtocolError  # defined there, importable here
from ..errors import ReportFormatError
from ..sinks import close_sinks, collector_sinks, start_sinks
from ..window.rank import PendingWindow, RankWindow
from . import base
from .base import BackgroundWorker, CollectorSettings, analyze_received, merge_received
from .live import LiveAnalysis
from .wire import WIRE_VERSION, decode_window, encode_window

logger = logging.getLogger("stagefrontier")

HEADER_MAGIC = 0x53464731  # "SFG1"
HEADER_WORDS = 4
MAX_PAYLOAD_BYTES = 256 << 20
"""A header declaring a larger payload is treated as a protocol failure (the group is dead)."""


class GlooCollector:
    """One thread per rank exchanging each window over a dedicated Gloo group; rank 0 analyzes.

    ``settings.timeout_s`` is the group's timeout: how long one operation may wait for the other
    ranks. ``group``: an existing group to use instead of creating one (all ranks, Gloo).
    """

    def __init__(self, settings: CollectorSettings, *, group: Any = None) -> None:
        rank, world_size, timeout_s = settings.rank, settings.world_size, settings.timeout_s
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.gates = settings.gates
        self.live = LiveAnalysis(settings.gates, settings.regression)
        self._dead: str | None = None
        self._group = group
        if group is None and world_size > 1:
            try:  # on the training thread: new_group is collective over the job's store
                import torch.distributed as dist

                self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
            except Exception as exc:  # a rank that never built its timer, a store problem
                self._mark_dead(f"creating the gloo collection group failed: {_describe(exc)}")
        self.sinks = collector_sinks(rank, settings.out_dir, distributed=True, sinks=settings.sinks)
        start_sinks(self.sinks)
        self.consumers = base.Consumers()
        join_timeout_s = settings.join_timeout_s
        self._worker = BackgroundWorker(
            "stagefrontier-gloo",
            self._process,
            settings.queue_size,
            join_timeout_s if join_timeout_s is not None else timeout_s + 5.0,
            after_last=lambda: close_sinks(self.sinks),
        )

    @property
    def dead(self) -> str | None:
        """Why the group is no longer used, or None while it is."""
        return self._dead

    # ------------------------------------------------------------------ training thread
    def submit(self, window: PendingWindow) -> bool:
        return self._worker.offer(window)

    def close(self) -> None:
        """Let queued windows finish (bounded), then close the sinks. The group is left as it
        is: destroying it is collective, and ``destroy_process_group()`` of the job removes it
        with the others."""
        self._worker.close()

    # ------------------------------------------------------------------ background thread
    def _mark_dead(self, reason: str) -> None:
        if self._dead is None:
            logger.warning("stagefrontier: gloo collection disabled: %s", reason)
            self._dead = f"gloo collection group dead: {reason}"

    def _process(self, pending: PendingWindow) -> None:
        window = pending.build()
        windows = [window]
        notes: list[str] = []
        if self._dead:
            notes.append(self._dead)
        elif self.world_size > 1:
            self._worker.activity = f"exchanging window {window.window} over the gloo group"
            try:
                self._exchange(window, windows, notes)
            except Exception as exc:
                self._mark_dead(f"window {window.window} exchange failed: {_describe(exc)}")
                notes.append(self._dead or "")
        if self.rank == 0:
            self._worker.activity = f"analyzing window {window.window}"
            merged = merge_received(windows, self.world_size, notes)
            analyzed = analyze_received(merged, self.live.analyze)
            if analyzed is not None:
                base.publish(self.sinks, self.consumers, analyzed)

    def _exchange(self, window: RankWindow, arrived: list[RankWindow], notes: list[str]) -> None:
        """The two operations of one window (more while ranks disagree on the window index)."""
        import torch
        import torch.distributed as dist

        payload = encode_window(window)
        size = len(payload)
        header = torch.tensor([HEADER_MAGIC, WIRE_VERSION, window.window, size], dtype=torch.int64)
        while True:
            table = [torch.empty(HEADER_WORDS, dtype=torch.int64) for _ in range(self.world_size)]
            dist.all_gather(table, header, group=self._group)
            headers = [tuple(int(v) for v in t.tolist()) for t in table]
            _check_headers(headers)
            indices = [h[2] for h in headers]
            target = max(indices)
            if min(indices) == target:
                break
            if window.window < target:  # this rank is behind: its window cannot be matched
                behind = [r for r, i in enumerate(indices) if i == target]
                notes.append(
                    f"rank(s) {behind} offered window {target} for window {window.window} "
                    "(a hand-off queue dropped a window): analyzed without them"
                )
                return
            # At the largest index: offer the same window again while the others catch up.
        sizes = [h[3] for h in headers]
        padded = torch.zeros(max(sizes), dtype=torch.uint8)
        padded[:size] = torch.from_numpy(np.frombuffer(payload, dtype=np.uint8).copy())
        gathered = None
        if self.rank == 0:
            gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.gather(padded, gather_list=gathered, dst=0, group=self._group)
        if gathered is None:
            return
        for rank in range(1, self.world_size):
            data = gathered[rank][: sizes[rank]].numpy().tobytes()
            try:
                received = decode_window(data)
                if received.window != window.window or received.rank != rank:
                    raise ReportFormatError(
                        f"payload for window {window.window} rank {rank} held window "
                        f"{received.window} rank {received.rank}"
                    )
            except ReportFormatError as exc:
                notes.append(f"rank {rank} window rejected: {exc}")
            else:
                arrived.append(received)


def _describe(exc: BaseException) -> str:
    """The exception's message without Gloo's ``[source/file.cc:123]`` prefix."""
    text = str(exc).strip()
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return f"{type(exc).__name__}: {text}"


def _check_headers(headers: Sequence[tuple[int, ...]]) -> None:
    for rank, (magic, version, index, size) in enumerate(headers):
        if magic != HEADER_MAGIC or version != WIRE_VERSION:
            raise GlooProtocolError(
                f"rank {rank} sent header {list(headers[rank])}: not a stagefrontier gloo header "
                f"of wire version {WIRE_VERSION}"
            )
        if index < 0 or not 0 < size <= MAX_PAYLOAD_BYTES:
            raise GlooProtocolError(f"rank {rank} declared window {index} of {size} bytes")
