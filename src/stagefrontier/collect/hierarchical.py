"""Hierarchical collection: a rank's window stays on its node; only node parts cross the job.

Two roles, both ``StoreCollector``s on one background thread each, so every rule of the flat
collector (deadline, short grace for an absent peer, key lifetime, chunking, attempt prefixes,
downgrade on any store failure) holds at each level:

- a *member* (local rank > 0) sends its window to the node's store, which its leader serves on
  loopback (``collect.node_store``); its address is read once from the job's store;
- a *leader* (local rank 0) gathers its node's windows there and condenses them into one
  ``NodePart`` (``collect.node_payload``). If it heads groups of nodes in the tree
  (``collect.node_tree``: fan-in bounded, rank 0's node at the top), it reads its children's
  parts from the job's store and combines them, level by level; then it sends its part up,
  keyed per level and node, or, on rank 0, analyzes it.

What rank 0 cannot get is reported, never waited on forever: a rank missing inside a node is
named in its node's part (with the leader's reason); a group whose part does not reach its head
by the head's deadline (one collect timeout more per level) is reported missing with its nodes,
and a group that missed the previous window gets only a short grace. A dead leader is such a
group; its members' sends fail against the vanished node store, and each then keeps its own
windows (``collect.rank0_watch``). Rank 0 gone while the store stays up is judged by each other
node's leader from the done counter, as a flat sender judges it; that leader then keeps its
node's windows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ReportFormatError
from ..window.rank import PendingWindow, RankWindow
from .base import CollectorSettings, publish
from .launcher import warn_once
from .node import NodeIdentity, node_from_hosts, node_of
from .node_payload import (
    Group,
    Wanted,
    analyze_group,
    combine_groups,
    decode_group,
    node_group,
)
from .node_store import connect_node_store, loopback_store, publish_address
from .node_tree import DEFAULT_FAN_IN, Level, group_span, headed_levels, level_wait_s, top_level
from .node_wire import ROW_REQUESTS
from .rank0_watch import Rank0Watch, RecentWindows
from .store import (
    StoreCollector,
    attempt_store,
    claim_scope,
    open_connection,
    previous_attempt_store,
)
from .store_keys import ABSENT_GRACE_S, DONE_KEY, PeerWait, SentKeys, delete_payload, get_payload

logger = logging.getLogger("stagefrontier")


def part_key(window: int, level: int, node: int) -> str:
    """The job-store key of the level-``level`` part that ``node``'s leader sends up."""
    return f"w{window}/l{level}/n{node}"


class NodeMember(StoreCollector):
    """A rank that is not its node's leader: its windows go to the node's store. When a send
    fails there (the leader is gone: rank 0 itself on node 0, or a killed leader), it says so
    once and keeps its own windows from the oldest its leader had not finished."""

    def __init__(
        self,
        settings: CollectorSettings,
        *,
        node: NodeIdentity,
        store: Any = None,
        fan_in: int = DEFAULT_FAN_IN,
    ) -> None:
        # its leader waits for the tree levels it heads before it finishes a window
        levels = top_level(node.node, settings.world_size // node.size, fan_in)
        super().__init__(settings, store=store, watch_levels=levels)
        self.node = node
        self._recent = RecentWindows()

    def _sending(self, window: RankWindow) -> None:
        if self._watch is not None:
            self._recent.passed(self._watch.done)
        self._recent.add([window])

    def _fail(self, what: str, exc: BaseException) -> None:
        watch = self._watch
        if what != "send" or watch is None:
            super()._fail(what, exc)
            return
        why = (
            f"the store of {self.node.label()} failed ({exc}): its leader, rank "
            f"{self.node.ranks[0]}, may have died"
        )
        watch.take_over(self._recent.held(), why=why)

    def _open_raw(self) -> Any:
        job = attempt_store(open_connection(self._base_store, self.timeout_s), self.scope)
        return connect_node_store(job, self.node.node, self.timeout_s)


class NodeLeader(StoreCollector):
    """Local rank 0 of a node: serves the node's store, gathers the node's windows there, heads
    the tree levels ``node_tree`` gives it, and sends its part up; on node 0 (rank 0) it
    analyzes the top part instead."""

    def __init__(
        self,
        settings: CollectorSettings,
        *,
        node: NodeIdentity,
        store: Any = None,
        keep_node_windows: bool = False,
        fan_in: int = DEFAULT_FAN_IN,
    ) -> None:
        self.node = node
        self._job_store = store
        self._job_conn: Any = None
        self._job_previous: Any = None
        self._keep = keep_node_windows
        self._out_dir = os.fspath(settings.out_dir)
        self._up_failed: str | None = None
        self.nodes = settings.world_size // node.size
        self.fan_in = fan_in
        self.levels = headed_levels(node.node, self.nodes, fan_in)
        self._waits = {level.level: PeerWait("node", "summary") for level in self.levels}
        top = top_level(node.node, self.nodes, fan_in)
        self._sent_up = SentKeys(lambda index: part_key(index, top, node.node))
        self._done_up = 0  # rank 0: the job store's done counter it last published
        self._wanted: tuple[Wanted, ...] = ()  # replaced whole by the router thread
        scope = claim_scope()  # the node store's address is published under it
        server, problem = self._serve(settings.timeout_s, scope)
        self._server = server
        super().__init__(settings, store=server, collects=True, scope=scope)
        if self.rank != 0:  # it watches rank 0's done counter as a flat sender does
            levels = top_level(0, self.nodes, fan_in)  # rank 0 waits for each
            self._watch = Rank0Watch(self.rank, settings.out_dir, settings.timeout_s, levels)
        self._recent = RecentWindows()  # the node's windows rank 0 has not finished
        self.peers = node.ranks[1:]
        if problem is not None:
            self._dead = problem

    def _serve(self, timeout_s: float, scope: int) -> tuple[Any, str | None]:
        """Start the node's store and publish its address (on the training thread, once, like
        ``announce_silent``); a failure is the reason every member of the node is missing."""
        try:
            server = loopback_store(self.node.size, timeout_s)
            job = attempt_store(open_connection(self._job_store, timeout_s), scope)
            publish_address(job, self.node.node, server.port)
        except Exception as exc:
            logger.warning(
                "stagefrontier: %s could not serve its node store: %s", self.node.label(), exc
            )
            return None, f"{self.node.label()} has no node store: {exc}"
        return server, None

    def want_rows(self, ranks: Sequence[int], first_step: int, last_step: int) -> None:
        """A capture request names ``ranks`` for these steps (called by this rank's profiler
        router when it reads the request): the node's part carries their rows of those steps,
        what the router's confirmation compares the traces with."""
        mine = frozenset(r for r in ranks if r in self.node.ranks)
        if mine:
            self._wanted = (*self._wanted, (mine, first_step, last_step))[-ROW_REQUESTS:]

    def _open_raw(self) -> Any:
        if self._server is None:
            raise RuntimeError("no node store")
        return super()._open_raw()

    def _job(self) -> Any:
        """This leader's own connection to the job's store, under the attempt prefix (and the
        previous attempt's, whose leftovers of its children it deletes)."""
        if self._job_conn is None:
            raw = open_connection(self._job_store, self.timeout_s)
            self._job_previous = previous_attempt_store(raw, self.scope)
            self._job_conn = attempt_store(raw, self.scope)
        return self._job_conn

    def _read_silent(self, conn: Any) -> None:
        """Disabled ranks announce themselves in the job's store, whatever the mode."""
        super()._read_silent(self._job())

    def _collect(self, item: tuple[PendingWindow, float]) -> None:
        own, windows, notes, read = self._gather_window(item)
        if self._watch is not None and self._watch.gone:  # rank 0 is gone: kept on this node
            self._worker.activity = f"keeping window {own.window} of {self.node.label()}"
            for window in windows:
                self._watch.keep(window)
            self._release_window(own.window, read)
            return
        if self._watch is not None:  # rank 0 has no collector above it to outlive
            self._recent.add(windows)
        ended = item[1]
        self._worker.activity = f"condensing window {own.window} of {self.node.label()}"
        if self._keep:
            self._keep_windows(own.window, windows)
        present = {w.rank for w in windows}
        late = [] if self._dead else [r for r in self.peers if r not in present | self._silent]
        group = self._node_group(own, windows, notes, late)
        self._release_window(own.window, read)
        if group is None:
            return
        read_up: list[str] = []
        for level in self.levels:
            group = self._combine_level(level, group, ended, read_up)
        if self.rank == 0:
            self._worker.activity = f"analyzing window {own.window}"
            analyzed = analyze_group(group, own, self.world_size, self.node.size, self.gates)
            if analyzed is not None:
                publish(self.sinks, self.consumers, self.live.check_summary(analyzed))
        else:
            self._send_up(group)
        if self.levels:
            self._release_parts(own.window, read_up)

    def _node_group(
        self, own: RankWindow, windows: list[RankWindow], notes: list[str], late: list[int]
    ) -> Group | None:
        """The node's part; if the node's windows cannot be summarized together, the leader's
        own alone (the others reported missing, with the error); None when not even that can
        (logged: the node is then missing at rank 0 for this window)."""
        try:
            return node_group(self.node, own, windows, notes, late, self.gates, self._wanted)
        except Exception as exc:
            why = f"{self.node.label()}: its windows could not be summarized together: {exc}"
        try:
            return node_group(self.node, own, [own], [*notes, why], late, self.gates, self._wanted)
        except Exception as exc:
            logger.error(
                "stagefrontier: %s sends no part for window %d: %s",
                self.node.label(),
                own.window,
                exc,
            )
            return None

    def _combine_level(self, level: Level, own: Group, ended: float, read: list[str]) -> Group:
        """Read this level's children's parts (until ``ended`` plus one collect timeout per
        level: each level below may have waited its own) and combine them with ``own``."""
        index = own.part.window
        parts: dict[int, Group] = {}
        notes: list[str] = []
        keys = {
            c: part_key(index, top_level(c, self.nodes, self.fan_in), c) for c in level.children
        }
        wait_s = level_wait_s(level.level, self.timeout_s)
        left = self._read_parts(
            self._waits[level.level],
            keys,
            (index, parts, read, notes),
            "job store read failed",
            deadline=ended + wait_s,
            grace=ended + min(wait_s, ABSENT_GRACE_S * (level.level + 1)),
            give_up=lambda: self._worker.full,
            activity=lambda text: setattr(self._worker, "activity", f"window {index}: {text}"),
        )
        rejected = {c for c in level.children if c not in parts} - left
        missing: dict[range, str] = {}
        for child in level.children:
            if child in rejected:
                missing[self._span(child, level)] = self._why(child, level, wait_s, True)
            elif child not in parts:
                found = (parts, missing, read, notes)
                self._adopt(child, level.level - 1, index, ended + wait_s, found, wait_s)
        return combine_groups(own, level.node_count, parts, missing, notes, self.node.size)

    def _read_parts(
        self,
        wait: PeerWait,
        keys: dict[int, str],
        into: tuple[int, dict[int, Group], list[str], list[str]],
        failed: str,
        **until: Any,
    ) -> set[int]:
        """Wait for the part of window ``index`` under each node's key in ``keys`` and put every
        one that comes into ``parts``; ``until`` holds the wait's deadline, grace and hooks.
        Returns the nodes still pending (all of them when the job's store could not be read,
        said in a note starting with ``failed``). ``into`` is (index, parts, store keys read,
        notes)."""
        index, parts, read, notes = into
        try:
            conn = self._job()

            def take(node: int, key: str) -> None:
                parts[node] = self._take(conn, key, index, node, read)

            return set(wait.wait(conn, keys, take=take, notes=notes, **until))
        except Exception as exc:
            notes.append(f"{failed}: {exc}")
            return set(keys)

    def _take(self, conn: Any, key: str, index: int, first: int, read: list[str]) -> Group:
        group = decode_group(get_payload(conn, key, read))
        if group.part.window != index or group.part.first_node != first:
            raise ReportFormatError(
                f"key for window {index} node {first} held window {group.part.window} "
                f"node {group.part.first_node}"
            )
        return group

    def _adopt(
        self,
        child: int,
        level: int,
        index: int,
        deadline: float,
        found: tuple[dict[int, Group], dict[range, str], list[str], list[str]],
        wait_s: float,
    ) -> None:
        """A child whose level-``level`` part did not come: its node is missing, and if it
        heads groups of nodes, their parts (sent to it) are read here instead, until
        ``deadline``, level by level down its subtree: its members re-parent to this head.
        ``found`` is (parts, missing spans with reasons, store keys read, notes)."""
        parts, missing, read, notes = found
        below = [lv for lv in headed_levels(child, self.nodes, self.fan_in) if lv.level <= level]
        span = group_span(child, level, self.nodes, self.fan_in)
        if not below:
            who = f"node {child}" if len(span) == 1 else f"nodes {span[0]}-{span[-1]}"
            missing[span] = f"{who} sent no summary within {wait_s:g} s of the window end"
            return
        members = f"node {span[-1]}" if len(span) == 2 else f"nodes {span[1]}-{span[-1]}"
        missing[range(child, child + 1)] = (
            f"node {child} sent no summary within {wait_s:g} s of the window end; {members} "
            f"of its group re-parented to node {self.node.node}"
        )
        levels = {g: lv.level - 1 for lv in below for g in lv.children}
        keys = {g: self._child_key(index, g) for g in levels}
        left = self._read_parts(
            PeerWait("node", "summary"),
            keys,
            (index, parts, read, notes),
            f"job store read failed while reading node {child}'s group",
            deadline=deadline,
            grace=deadline,
        )
        for grandchild in sorted(g for g in levels if g not in parts):
            if grandchild in left:
                self._adopt(grandchild, levels[grandchild], index, deadline, found, wait_s)
            else:
                gone = group_span(grandchild, levels[grandchild], self.nodes, self.fan_in)
                missing[gone] = f"nodes {gone[0]}-{gone[-1]}: summary rejected (see the notes)"

    def _child_key(self, index: int, child: int) -> str:
        return part_key(index, top_level(child, self.nodes, self.fan_in), child)

    def _span(self, child: int, level: Level) -> range:
        return group_span(child, level.level - 1, self.nodes, self.fan_in)

    def _why(self, child: int, level: Level, wait_s: float, rejected: bool) -> str:
        span = self._span(child, level)
        who = f"node {child}" if len(span) == 1 else f"nodes {span[0]}-{span[-1]}"
        if rejected:
            return f"{who}: summary rejected (see the notes)"
        return f"{who} sent no summary within {wait_s:g} s of the window end"

    def _send_up(self, group: Group) -> None:
        if self._up_failed:
            return
        index = group.part.window
        self._worker.activity = f"sending window {index} of {self.node.label()} up"
        watch = self._watch
        try:
            done = self._sent_up.send(self._job(), index, group.encode())
        except Exception as exc:
            self._up_failed = f"job store unavailable since a failed send: {exc}"
            logger.warning(
                "stagefrontier: %s cannot send to the job's store, its windows stop here: %s",
                self.node.label(),
                exc,
            )
            return
        if watch is None:
            return
        watch.collecting = watch.collecting or done > 0  # rank 0 finished a window
        self._recent.passed(done)
        if watch.silent(index, done):
            try:  # its parts: nobody reads them
                self._sent_up.take_back(self._job(), done)
            except Exception as exc:  # they stay in the store; the node's windows are kept
                logger.warning(
                    "stagefrontier: %s could not delete its parts rank 0 never read from the "
                    "job's store: %s",
                    self.node.label(),
                    exc,
                )
            watch.take_over(self._recent.held(), whose="its node's")

    def _release_parts(self, index: int, read: list[str]) -> None:
        """Delete the children's parts read and this window's parts of a previous attempt;
        rank 0 then advances the job store's done counter (senders free what it moved past)."""
        try:
            conn = self._job()
            for key in read:
                conn.delete_key(key)
            if self._job_previous is not None:
                for level in self.levels:
                    for child in level.children:
                        delete_payload(self._job_previous, self._child_key(index, child))
            if self.rank == 0 and index + 1 > self._done_up:
                conn.add(DONE_KEY, index + 1 - self._done_up)
                self._done_up = index + 1
        except Exception as exc:
            logger.warning("stagefrontier: cleanup of node summaries failed: %s", exc)

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


def node_store_client(collector: NodeMember | NodeLeader) -> Any:
    """A new client of the store ``collector``'s node shares, for another thread of the rank
    (the profiler router's). Raises when it cannot be reached: the leader serves none, its
    address never came, or the connection failed."""
    return collector._open_raw()


def hierarchical_collector(
    settings: CollectorSettings, *, keep_node_windows: bool, fan_in: int, store: Any = None
) -> StoreCollector | None:
    """The member, leader or root collector of this rank, from the launcher's node layout or,
    without one, from the ranks' host names; None (collect flat instead, said once in the log)
    when neither says which ranks share a node. ``store``: the job's store to clone (the
    process group's by default)."""
    rank, world_size = settings.rank, settings.world_size
    try:
        node = node_of(rank, world_size)
    except ValueError as launcher:
        try:
            node = node_from_hosts(rank, world_size, settings.timeout_s, store)
        except ValueError as exc:
            warn_once(
                "hierarchical-fallback",
                "stagefrontier: hierarchical collection needs the node layout (%s; %s): "
                "collecting flat through the job's store",
                launcher,
                exc,
            )
            return None
        warn_once(
            "hierarchical-hosts",
            "stagefrontier: the launcher does not say which ranks share a node (%s): nodes "
            "are the ranks' hosts, %d ranks each",
            launcher,
            node.size,
        )
    if rank == node.first_rank:
        return NodeLeader(
            settings, node=node, store=store, keep_node_windows=keep_node_windows, fan_in=fan_in
        )
    return NodeMember(settings, node=node, store=store, fan_in=fan_in)
