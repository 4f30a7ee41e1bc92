"""Where a node's windows should travel: the job's c10d store (keyed per node) or a node-local
TCPStore that the node's leader serves.

One machine stands for one node of a large job. ``L`` sender connections (the node's ranks)
write one real wire-encoded window each per collection round and the leader's connection gathers
them with the collector's own code (``store_keys.PeerWait``, ``get_payload``, deletes), through
either store. Meanwhile ``--load`` processes play the rest of the job: each writes, reads and
deletes window-sized values on the job's store as fast as it can, as the other nodes' ranks would
under the first option (and the job's own rendezvous and barriers under either). Measured: the
leader's gather time per round on each transport (rounds alternate between the two, so both see
the same load), as a ratio within one run; and the bytes per window that reach the job's store
server under each option, counted from the payloads.

    python benchmarks/node_transport.py                 # L = 8, 2 load processes, 200 rounds
    python benchmarks/node_transport.py --rounds 50 --out node_transport-quick.md
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import numpy as np

from harness_common import environment, result_header, script_parser, table, write_result
from stagefrontier.analysis.schema import DEFAULT_STAGES
from stagefrontier.collect.node import NodeIdentity
from stagefrontier.collect.node_payload import combine_groups, node_group
from stagefrontier.collect.node_store import loopback_store
from stagefrontier.collect.store_keys import PeerWait, SentKeys, get_payload
from stagefrontier.collect.wire import encode_window
from stagefrontier.window.rank import RankWindow

COMMAND = "python benchmarks/node_transport.py"
STEPS = 20


def rank_window(rank: int, window: int, rng: np.random.Generator) -> RankWindow:
    """A realistic window: 20 steps of the default stages, as the recorder fills it."""
    stages = DEFAULT_STAGES
    durations = rng.integers(1_000_000, 50_000_000, size=(STEPS, len(stages)))
    return RankWindow(
        window=window,
        first_step=window * STEPS,
        last_step=window * STEPS + STEPS - 1,
        rank=rank,
        stages=stages,
        durations_ns=durations,
        wall_ns=durations.sum(axis=1),
        hostname="node-0",
        local_rank=rank,
        pid=1000 + rank,
    )


def client(port: int) -> Any:
    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False
    )


def load_loop(port: int, payload: int, stop: Any) -> None:
    """The rest of the job on the job's store: set, get, delete window-sized values."""
    conn = client(port)
    conn.add("load/ready", 1)
    data = b"x" * payload
    i = 0
    while not stop.is_set():
        key = f"load/{mp.current_process().pid}/{i}"
        conn.set(key, data)
        conn.get(key)
        conn.delete_key(key)
        i += 1


class Transport:
    """The node's ranks' connections and the leader's, on one store."""

    def __init__(self, port: int, ranks: int) -> None:
        self.senders = [client(port) for _ in range(ranks)]
        self.sent = [SentKeys(lambda w, r=r: f"w{w}/r{r}") for r in range(ranks)]
        self.leader = client(port)
        self.wait = PeerWait("rank", "window")
        self.rng = np.random.default_rng(0)

    def round(self, index: int) -> float:
        """Seconds for the leader to gather this round's windows, read, checked and deleted."""
        ranks = len(self.senders)
        for rank, (conn, keys) in enumerate(zip(self.senders, self.sent, strict=True)):
            keys.send(conn, index, encode_window(rank_window(rank, index, self.rng)))
        read: list[str] = []
        got: list[bytes] = []
        leader = self.leader
        start = time.perf_counter()
        self.wait.wait(
            leader,
            {r: f"w{index}/r{r}" for r in range(ranks)},
            deadline=time.monotonic() + 10.0,
            grace=time.monotonic(),
            take=lambda rank, key: got.append(get_payload(leader, key, read)),
            notes=[],
        )
        for key in read:
            leader.delete_key(key)
        leader.add("done", 1)
        elapsed = time.perf_counter() - start
        assert len(got) == ranks
        return elapsed


def part_sizes(ranks: int, groups: Sequence[int]) -> tuple[int, dict[int, int]]:
    """Bytes of one rank's window, and of a part covering each of ``groups`` nodes of ``ranks``
    ranks (a leader's own, then heads' combined parts), summaries built from real windows."""
    rng = np.random.default_rng(0)
    sizes = {}
    for count in groups:
        parts = []
        for index in range(count):
            node = NodeIdentity(node=index, first_rank=index * ranks, size=ranks, host="node")
            windows = [rank_window(r, 0, rng) for r in node.ranks]
            parts.append(node_group(node, windows[0], windows, [], [], None))
        top = parts[0]
        if count > 1:
            top = combine_groups(parts[0], count, dict(enumerate(parts[1:], 1)), {}, [], ranks)
        sizes[count] = len(top.encode())
    return len(encode_window(rank_window(0, 0, rng))), sizes


def measure(ranks: int, rounds: int, load: int) -> dict[str, list[float]]:
    job = loopback_store(1 + load + 2 * ranks)
    node = loopback_store(1 + 2 * ranks)
    payload = len(encode_window(rank_window(0, 0, np.random.default_rng(0))))
    stop = mp.get_context("spawn").Event()
    workers = [
        mp.get_context("spawn").Process(target=load_loop, args=(job.port, payload, stop))
        for _ in range(load)
    ]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + 120.0
        while job.add("load/ready", 0) < load:  # every load process connected and writing
            if time.monotonic() > deadline:
                raise TimeoutError("the load processes did not start")
            time.sleep(0.1)
        transports = {
            "job store": Transport(job.port, ranks),
            "node store": Transport(node.port, ranks),
        }
        out: dict[str, list[float]] = {name: [] for name in transports}
        for index in range(rounds):  # alternating, so both see the same load over time
            order = list(transports) if index % 2 else list(reversed(transports))
            for name in order:
                out[name].append(transports[name].round(index))
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)
    return out


GROUPS = (1, 8, 64)


def render(ranks: int, rounds: int, load: int, times: dict[str, list[float]]) -> list[str]:
    window_b, part_b = part_sizes(ranks, GROUPS)
    base = statistics.median(times["node store"])
    rows = []
    for name, values in times.items():
        ms = sorted(v * 1e3 for v in values)
        rows.append(
            [
                name,
                f"{statistics.median(ms):.2f}",
                f"{ms[int(0.9 * (len(ms) - 1))]:.2f}",
                f"{statistics.median(values) / base:.2f}",
            ]
        )
    level_rows = [
        ["a rank to its leader (node store)", f"{window_b}", "stays on the node"],
        *(
            [
                f"a part of {count} node(s) ({count * ranks} ranks) up the tree",
                f"{size}",
                "one per leader and window" if count == 1 else "one per head and window",
            ]
            for count, size in part_b.items()
        ),
        [
            "flat: every rank to rank 0 (job store)",
            f"{window_b} x R",
            f"{window_b * 100_000:,} at R = 100,000",
        ],
    ]
    return [
        f"L = {ranks} windows per node and round, {rounds} rounds per transport, {load} load "
        "process(es) on the job's store.",
        "",
        *table(["transport", "gather ms median", "gather ms p90", "ratio to node store"], rows),
        "",
        f"Bytes per window and level ({STEPS}-step windows of the default 6 stages; parts are "
        "the node_wire envelope around the summary codec's bytes):",
        "",
        *table(["what travels", "bytes", "note"], level_rows),
        "",
        "Reading: the gather time ratio, job store over node store, is "
        f"{statistics.median(times['job store']) / base:.2f} here (two load processes on two "
        "shared cores load a store server only lightly, so this is the small end of the "
        "difference). What decides is the job store's traffic: keyed per "
        f"node on the job's store, every window of every rank ({window_b} B, one set, one check, "
        "one get and one delete each) passes through the one server the job's rendezvous and "
        "barriers use; with a node-local store only one part per node does "
        f"({part_b[1]} B at {ranks} ranks per node: {ranks}x fewer operations and "
        f"{part_b[1] / (ranks * window_b):.0%} of the bytes), and rank 0 reads at most fan-in - 1 "
        "parts per tree level instead of R windows. Chosen: the node-local store.",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = script_parser("node_transport", __doc__)
    parser.add_argument("--ranks", type=int, default=8, help="ranks per node (L)")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--load", type=int, default=2, help="load processes on the job store")
    args = parser.parse_args(argv)
    if args.ranks < 1 or args.rounds < 1 or args.load < 0:
        parser.error("--ranks and --rounds must be >= 1, --load >= 0")
    times = measure(args.ranks, args.rounds, args.load)
    body = render(args.ranks, args.rounds, args.load, times)
    print("\n".join(body))
    settings = (
        ("--ranks", args.ranks, 8),
        ("--rounds", args.rounds, 200),
        ("--load", args.load, 2),
    )
    command = " ".join([COMMAND, *(f"{flag} {v}" for flag, v, default in settings if v != default)])
    lines = [*result_header("Node transport: job store or node-local store", command)]
    lines += [*environment(), "", *body, ""]
    write_result(args.out, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
