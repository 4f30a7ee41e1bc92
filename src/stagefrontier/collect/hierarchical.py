"""Hierarchical collection: a rank's window stays on its node; only node summaries cross the job.

Three roles, all ``StoreCollector``s on one background thread each, so every rule of the flat
collector (deadline, short grace for an absent peer, key lifetime, chunking, attempt prefixes,
downgrade on any store failure) holds at each level:

- a *member* (local rank > 0) sends its window to the node's store, which its leader serves on
  loopback (``collect.node_store``); its address is read once from the job's store;
- a *leader* (local rank 0) gathers its node's windows there, condenses them into one
  ``NodePart`` (``collect.node_payload``) and writes it to the job's store, keyed per node;
- the *root* (rank 0, leader of node 0) does what a leader does for its own node, then gathers
  the other nodes' parts from the job's store, combines them and analyzes the window.

What the root cannot get is reported, never waited on forever: a rank missing inside a node is
named in its node's part (with the leader's reason), a node whose part does not arrive by the
root's deadline is reported missing with all its ranks, and a node that missed the previous
window gets only a short grace. A dead leader is such a node; its members' sends fail against the
vanished node store and downgrade there.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..errors import ReportFormatError
from ..record.window import PendingWindow, RankWindow
from ..sinks import emit
from .base import analyze_received
from .launcher import warn_once
from .node import NodeIdentity, node_layout, node_of
from .node_payload import NodeContents, combine_parts, node_contents, node_record
from .node_store import connect_node_store, loopback_store, publish_address
from .node_wire import NodePart, decode_node_part, encode_node_part
from .store import StoreCollector, attempt_store, open_connection, previous_attempt_prefix
from .store_keys import ABSENT_GRACE_S, DONE_KEY, PeerWait, SentKeys, delete_payload, get_payload

logger = logging.getLogger("stagefrontier")

ROOT_WAIT_FACTOR = 2.0
"""The root waits this many collect timeouts for a node's part: a leader may itself wait one
timeout for a late rank of its node before it sends, and that node is then still reported with
its late rank missing, not as a missing node."""


def node_key(window: int, node: int) -> str:
    return f"w{window}/n{node}"


class NodeMember(StoreCollector):
    """A rank that is not its node's leader: its windows go to the node's store."""

    def __init__(self, *, node: NodeIdentity, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.node = node

    def _open_raw(self) -> Any:
        job = attempt_store(open_connection(self._base_store, self.timeout_s))
        return connect_node_store(job, self.node.node, self.timeout_s)


class NodeLeader(StoreCollector):
    """Local rank 0 of a node other than rank 0's: serves the node's store, gathers the node's
    windows there and sends one part per window up to the job's store."""

    def __init__(
        self,
        *,
        node: NodeIdentity,
        store: Any = None,
        keep_node_windows: bool = False,
        **kwargs: Any,
    ) -> None:
        self.node = node
        self._job_store = store
        self._job_conn: Any = None
        self._job_previous: Any = None
        self._keep = keep_node_windows
        self._out_dir = os.fspath(kwargs["out_dir"])
        self._up_failed: str | None = None
        server, problem = self._serve(kwargs.get("timeout_s", 10.0))
        self._server = server
        super().__init__(store=server, collects=True, **kwargs)
        self.peers = node.ranks[1:]
        if problem is not None:
            self._dead = problem
        self._sent_up = SentKeys(lambda index: node_key(index, node.node))

    def _serve(self, timeout_s: float) -> tuple[Any, str | None]:
        """Start the node's store and publish its address (on the training thread, once, like
        ``announce_silent``); a failure is the reason every member of the node is missing."""
        try:
            server = loopback_store(self.node.size, timeout_s)
            job = attempt_store(open_connection(self._job_store, timeout_s))
            publish_address(job, self.node.node, server.port)
        except Exception as exc:
            logger.warning(
                "stagefrontier: %s could not serve its node store: %s", self.node.label(), exc
            )
            return None, f"{self.node.label()} has no node store: {exc}"
        return server, None

    def _open_raw(self) -> Any:
        if self._server is None:
            raise RuntimeError("no node store")
        return super()._open_raw()

    def _job(self) -> Any:
        """This leader's own connection to the job's store, under the attempt prefix (and the
        previous attempt's prefix, for the root's cleanup)."""
        if self._job_conn is None:
            from torch.distributed import PrefixStore

            raw = open_connection(self._job_store, self.timeout_s)
            previous = previous_attempt_prefix()
            self._job_previous = None if previous is None else PrefixStore(previous, raw)
            self._job_conn = attempt_store(raw)
        return self._job_conn

    def _read_silent(self, conn: Any) -> None:
        """Disabled ranks announce themselves in the job's store, whatever the mode."""
        super()._read_silent(self._job())

    def _collect(self, item: tuple[PendingWindow, float]) -> None:
        own, windows, notes, read = self._gather_window(item)
        self._worker.activity = f"condensing window {own.window} of {self.node.label()}"
        contents = node_contents(self.node, windows)
        if self._keep:
            self._keep_windows(own.window, windows)
        part = self._part(own, contents, windows, notes)
        self._forward(part, item[1])
        self._release_window(own.window, read)

    def _part(
        self,
        own: RankWindow,
        contents: NodeContents,
        windows: list[RankWindow],
        notes: list[str],
    ) -> NodePart:
        present = sorted(w.rank for w in windows)
        missing = [r for r in self.node.ranks if r not in present]
        why = list(notes)
        late = [r for r in missing if r not in self._silent]
        if late and not self._dead:
            why.append(
                f"{self.node.label()}: rank(s) {late} sent no window to the node leader within "
                f"{self.timeout_s:g} s"
            )
        return NodePart(
            window=own.window,
            node=self.node.node,
            first_step=own.first_step,
            last_step=own.last_step,
            host=own.hostname,
            ranks_present=tuple(present),
            missing_ranks=tuple(missing),
            notes=tuple(why),
            body=contents.encode(),
        )

    def _forward(self, part: NodePart, ended: float) -> None:
        if self._up_failed:
            return
        self._worker.activity = f"sending window {part.window} of {self.node.label()} up"
        try:
            self._sent_up.send(self._job(), part.window, encode_node_part(part))
        except Exception as exc:
            self._up_failed = f"job store unavailable since a failed send: {exc}"
            logger.warning(
                "stagefrontier: %s cannot send to the job's store, its windows stop here: %s",
                self.node.label(),
                exc,
            )

    def _keep_windows(self, index: int, windows: list[RankWindow]) -> None:
        """The node's exact windows, for checking the combined result against the flat
        analysis of the same data (``CollectConfig.keep_node_windows``; off by default)."""
        from .wire import encode_window

        folder = Path(self._out_dir) / "node-windows" / f"node-{self.node.node}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for w in windows:
                (folder / f"window-{index:06d}-rank-{w.rank}.bin").write_bytes(encode_window(w))
        except OSError as exc:
            logger.warning("stagefrontier: could not keep the node's windows: %s", exc)

    def close(self) -> None:
        super().close()
        if not self._worker.alive:
            self._job_conn = None
            self._server = None  # the last reference: the node store shuts down


class NodeRoot(NodeLeader):
    """Rank 0: leader of node 0, and the one that combines every node's part and analyzes."""

    def __init__(self, *, node: NodeIdentity, world_size: int, **kwargs: Any) -> None:
        super().__init__(node=node, world_size=world_size, **kwargs)
        self.layout = node_layout(world_size, node.size)
        self._node_wait = PeerWait("node", "summary")
        self._up_done = 0  # the value of the job store's done counter it last published

    def _forward(self, part: NodePart, ended: float) -> None:
        parts = {part.node: part}
        notes: list[str] = []
        read: list[str] = []
        others = [n for n in self.layout if n != self.node.node]
        if others:
            try:
                self._gather_nodes(part.window, ended, others, parts, notes, read)
            except Exception as exc:
                notes.append(f"job store read failed: {exc}")
        self._worker.activity = f"analyzing window {part.window}"
        combined = combine_parts(parts, self.layout, self.world_size, notes)
        analyzed = analyze_received(combined.merged, self.live.analyze)
        if analyzed is not None:
            analyzed = node_record(analyzed, combined)
            emit(self.sinks, analyzed)
        if others:
            self._release_nodes(part.window, read)

    def _gather_nodes(
        self,
        index: int,
        ended: float,
        others: list[int],
        parts: dict[int, NodePart],
        notes: list[str],
        read: list[str],
    ) -> None:
        conn = self._job()

        def take(node: int, key: str) -> None:
            part = decode_node_part(get_payload(conn, key, read))
            if part.window != index or part.node != node:
                raise ReportFormatError(
                    f"key for window {index} node {node} held window {part.window} node {part.node}"
                )
            parts[node] = part

        wait_s = self.timeout_s * ROOT_WAIT_FACTOR
        left = self._node_wait.wait(
            conn,
            {n: node_key(index, n) for n in others},
            deadline=ended + wait_s,
            grace=ended + min(wait_s, 2 * ABSENT_GRACE_S),
            take=take,
            notes=notes,
            give_up=lambda: self._worker.full,
            activity=lambda text: setattr(self._worker, "activity", f"window {index}: {text}"),
        )
        for node in sorted(left):
            notes.append(f"node {node} sent no summary within {wait_s:g} s of rank 0's window end")

    def _release_nodes(self, index: int, read: list[str]) -> None:
        """Delete the parts read, this window's parts of a previous attempt, then advance the
        job store's done counter (the leaders free what the root moved past)."""
        try:
            conn = self._job()
            for key in read:
                conn.delete_key(key)
            if self._job_previous is not None:
                for node in self.layout:
                    delete_payload(self._job_previous, node_key(index, node))
            if index + 1 > self._up_done:
                conn.add(DONE_KEY, index + 1 - self._up_done)
                self._up_done = index + 1
        except Exception as exc:
            logger.warning("stagefrontier: cleanup of node summaries failed: %s", exc)


def hierarchical_collector(
    settings: dict[str, Any], *, keep_node_windows: bool
) -> StoreCollector | None:
    """The member, leader or root collector of this rank, from the launcher's node layout;
    None (collect flat instead, said once in the log) when the environment does not say which
    ranks share a node."""
    rank, world_size = settings["rank"], settings["world_size"]
    try:
        node = node_of(rank, world_size)
    except ValueError as exc:
        warn_once(
            "hierarchical-fallback",
            "stagefrontier: hierarchical collection needs the node layout (%s): collecting "
            "flat through the job's store",
            exc,
        )
        return None
    if rank == 0:
        return NodeRoot(node=node, keep_node_windows=keep_node_windows, **settings)
    if rank == node.first_rank:
        return NodeLeader(node=node, keep_node_windows=keep_node_windows, **settings)
    return NodeMember(node=node, **settings)
