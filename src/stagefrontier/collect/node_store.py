"""The node-local store: a c10d TCPStore that a node's leader serves on loopback, so its ranks'
windows never leave the node. Its address travels through the job's store under one key per
node (``node/<i>/store``, under the attempt prefix); the ranks of the node read it there once.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import Any

from .store_client import connect, probe
from .store_keys import POLL_S

LOOPBACK = "127.0.0.1"
CONNECT_S = 10.0
"""The least time a member's client of its node's store has to connect and validate. The
collect timeout (1.5 s in a test, a window's wait) is no bound for it: on a loaded machine the
client's connect and its validation round trip with the leader's store thread took longer, and
the member lost its first windows. A dead leader's port refuses the plain probe at once, so
this bounds only a leader that dies between the probe and the client's connect."""


def loopback_store(world_size: int = 1, timeout_s: float = 60.0) -> Any:
    """A TCPStore server on an ephemeral port that only this machine can reach.

    Whatever host it is given, torch's store server binds the wildcard address, every interface
    of the machine (both the libuv and the older backend, in torch 2.13): the host only tells
    clients where to connect. So the listening socket is made here, bound to loopback, and
    handed to the store with ``master_listen_fd``; the store owns it from then on and closes it
    when it shuts down.
    """
    import torch.distributed as dist

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen(socket.SOMAXCONN)
        store = dist.TCPStore(
            LOOPBACK,
            sock.getsockname()[1],
            world_size,
            is_master=True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
        sock.detach()  # the store closes it; the ``with`` must not
    return store


def address_key(node: int) -> str:
    return f"node/{node}/store"


def publish_address(job_conn: Any, node: int, port: int) -> None:
    """Tell the node's ranks where its store listens (``job_conn``: the attempt's view of the
    job's store)."""
    job_conn.set(address_key(node), f"{LOOPBACK}:{port}")


def connect_node_store(job_conn: Any, node: int, timeout_s: float) -> Any:
    """A client of the node's store, once its leader published the address (waited for at most
    ``timeout_s``: polled, never a blocking ``get``). Raises TimeoutError when it is not
    published by then, and whatever the connection raises."""
    import torch.distributed as dist

    key = address_key(node)
    deadline = time.monotonic() + timeout_s
    while not job_conn.check([key]):
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"node {node}'s leader published no node store address within {timeout_s:g} s"
            )
        time.sleep(POLL_S * 10)
    host, _, port = bytes(job_conn.get(key)).decode("ascii", "replace").rpartition(":")
    if not port.isdigit():
        raise ValueError(f"node {node}'s store address {host}:{port} is not host:port")
    connect_s = max(timeout_s, CONNECT_S)
    # A dead leader's port refuses at once, where the store's client would retry the connection
    # for the whole timeout (a member then spent tens of seconds there, twice over).
    probe(host, int(port), connect_s, f"node {node}'s store", " (its leader is gone?)")
    # The client connects within ``connect_s`` (torch retries a reset validation inside it);
    # its reads and writes then wait ``timeout_s``, as every other connection of the collector.
    client = connect(
        lambda: dist.TCPStore(
            host,
            int(port),
            is_master=False,
            timeout=timedelta(seconds=connect_s),
            wait_for_workers=False,
        )
    )
    client.set_timeout(timedelta(seconds=timeout_s))
    return client
