"""Which node this rank runs on, and which ranks share it, as the launcher says.

torchrun starts one agent per node and gives each worker ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``
and ``GROUP_RANK`` (the agent's index). An agent's workers hold consecutive global ranks
(``RANK - LOCAL_RANK`` is the node's first rank, ``GROUP_RANK * LOCAL_WORLD_SIZE``), so every
rank knows its node's ranks without asking anyone, and rank 0 knows every node's. The node's
leader is its local rank 0. ``GROUP_RANK`` is checked when set (a launcher that numbers its nodes
otherwise cannot be followed); the host name labels the node in reports. Without
``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` the ranks' host names, gathered once through the job's store
(``node_from_hosts``), say it instead when they form whole nodes (``host_layout``); when
they do not, hierarchical collection falls back to flat collection.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .store import attempt_store, open_connection


@dataclass(frozen=True)
class NodeIdentity:
    """One rank's node: its index, its first rank (the leader) and its number of ranks."""

    node: int
    first_rank: int
    size: int
    host: str

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.size)

    def label(self) -> str:
        """``node 2 (ranks 8-11 on host-a)``: how reports name the node."""
        last = self.first_rank + self.size - 1
        span = f"rank {last}" if self.size == 1 else f"ranks {self.first_rank}-{last}"
        return f"node {self.node} ({span}{f' on {self.host}' if self.host else ''})"


def node_of(rank: int, world_size: int, env: Mapping[str, str] | None = None) -> NodeIdentity:
    """This rank's node, from the launcher's environment.

    Raises:
        ValueError: the environment does not say (no ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``), or
            what it says cannot hold (a local rank outside the node, nodes of unequal size).
    """
    env = os.environ if env is None else env
    try:
        local_rank = int(env["LOCAL_RANK"])
        size = int(env["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        raise ValueError(
            "LOCAL_RANK and LOCAL_WORLD_SIZE are not set (torchrun sets them)"
        ) from None
    if not 0 <= local_rank < size or local_rank > rank:
        raise ValueError(f"LOCAL_RANK={local_rank} does not fit LOCAL_WORLD_SIZE={size}")
    if world_size % size:
        raise ValueError(
            f"a world of {world_size} ranks is not whole nodes of LOCAL_WORLD_SIZE={size}"
        )
    first = rank - local_rank
    node = first // size
    group = env.get("GROUP_RANK", "")
    if group and group != str(node):
        raise ValueError(
            f"GROUP_RANK={group} but rank {rank} (local rank {local_rank}) is on node {node} of "
            f"{size} ranks each"
        )
    return NodeIdentity(node=node, first_rank=first, size=size, host=socket.gethostname())


def host_layout(hosts: Sequence[str]) -> int:
    """The ranks per node when ``hosts`` (each rank's host name, by rank) form nodes as a
    launcher lays them out: consecutive ranks, the same number on each host, no host twice.

    Raises:
        ValueError: they do not (named: which host breaks the layout).
    """
    if not hosts:
        raise ValueError("no host names")
    size = 1
    while size < len(hosts) and hosts[size] == hosts[0]:
        size += 1
    if len(hosts) % size:
        raise ValueError(f"{len(hosts)} ranks are not whole nodes of {size} (host {hosts[0]})")
    seen: set[str] = set()
    for first in range(0, len(hosts), size):
        block = set(hosts[first : first + size])
        host = hosts[first]
        if len(block) != 1 or host in seen:
            raise ValueError(
                f"ranks {first}-{first + size - 1} are not all on one host of their own "
                f"(hosts {sorted(block)})"
            )
        seen.add(host)
    return size


def node_layout(world_size: int, size: int) -> dict[int, range]:
    """Every node's ranks, by node index, in a job of whole nodes of ``size`` ranks."""
    return {node: range(node * size, (node + 1) * size) for node in range(world_size // size)}


HOSTS_KEY = "hosts"
"""Job-store keys of the host names (``hosts/<rank>``) and rank 0's verdict (``hosts``: the
ranks per node, or why the hosts do not form nodes)."""
_HOSTS_READ = 1024
"""Host names rank 0 reads per store call."""


def node_from_hosts(
    rank: int, world_size: int, timeout_s: float, store: Any = None
) -> NodeIdentity:
    """This rank's node from the ranks' host names, gathered once through the job's store: each
    rank writes its own, rank 0 reads them all and writes the verdict every rank reads (so all
    choose alike). Runs on the training thread when the timer is built.

    Raises:
        ValueError: the hosts do not form whole nodes (rank 0's reason), or the store failed.
    """
    host = socket.gethostname()
    try:
        conn = attempt_store(open_connection(store, timeout_s))
        conn.set(f"{HOSTS_KEY}/{rank}", host)
        if rank == 0:
            keys = [f"{HOSTS_KEY}/{r}" for r in range(world_size)]
            hosts: list[str] = []
            for start in range(0, world_size, _HOSTS_READ):
                chunk = conn.multi_get(keys[start : start + _HOSTS_READ])
                hosts.extend(bytes(h).decode("utf-8", "replace") for h in chunk)
            try:
                verdict = str(host_layout(hosts))
            except ValueError as exc:
                verdict = str(exc)
            conn.set(HOSTS_KEY, verdict)
        verdict = bytes(conn.get(HOSTS_KEY)).decode("utf-8", "replace")
    except Exception as exc:
        raise ValueError(
            f"the host names could not be gathered through the job's store: {exc}"
        ) from None
    if not verdict.isdigit():
        raise ValueError(f"the ranks' hosts do not form nodes: {verdict}")
    size = int(verdict)
    return NodeIdentity(node=rank // size, first_rank=rank - rank % size, size=size, host=host)
