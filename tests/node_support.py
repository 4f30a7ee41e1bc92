"""Spawned ranks laid out in nodes as torchrun lays them out (``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` set per rank), timed by a StageTimer that collects
hierarchically, around an ephemeral-port TCPStore of the parent.

The ranks join a Gloo process group but run no collective in their loop (each step sleeps in the
data stage), so a rank killed mid-run leaves the others training, as the failure tests need; a
healthy job may meet at each window's end (``window_barrier``).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from rank_support import START_METHOD, join_gloo
from stagefrontier.demo.launch import run_ranks

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "optim.step_cpu_wall")


@dataclass(frozen=True)
class NodeJob:
    """One job's layout, pace and faults (each rank gets a copy); rank 0 writes to ``out_dir``."""

    out_dir: str
    nodes: int = 2
    per_node: int = 2
    steps: int = 40
    window: int = 10
    step_s: float = 0.03
    timeout_s: float = 2.0
    mode: str = "hierarchical"
    keep_node_windows: bool = False
    fan_in: int = 64
    layout_env: bool = True
    """Set the launcher's node variables (False: a launcher that does not say)."""
    hosts: tuple[str, ...] = ()
    """The host name each rank reports, by rank (empty: the machine's own)."""
    leads_by: tuple[int, float] | None = None
    """``(rank, seconds)``: that rank's data stage outlasts every other rank's of the same step
    by at least that much, however late a loaded machine wakes any of them (``_data_stage``)."""
    die_at_step: dict[int, int] = field(default_factory=dict)
    """These ranks SIGKILL themselves at the start of that step."""
    late_part_s: dict[int, dict[int, float]] = field(default_factory=dict)
    """Per node, ``{window: seconds}``: its leader sleeps that long before sending that
    window's part up (a late node)."""
    silent_ranks: tuple[int, ...] = ()
    """Ranks whose timer is disabled."""
    take_back_fails: tuple[int, ...] = ()
    """Leaders whose taking back of the parts they sent up fails (the job's store refuses it),
    once they judge rank 0 gone."""
    until_said: dict[int, str] = field(default_factory=dict)
    """These ranks train past ``steps`` until the library has logged a WARNING holding this text
    (within ``SAY_DEADLINE_S``); with any, every rank writes its WARNING lines and its close's
    seconds to ``said-rank<r>.json``."""
    window_barrier: bool = False
    """The ranks meet (Gloo barriers, untimed) before the first step and, all but those in
    ``die_at_step``, after each window's last step, so a slow rank never falls more than a window
    behind the others."""

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node


def _late_parts(delays: dict[int, float]) -> None:
    from stagefrontier.collect.hierarchical import NodeLeader

    send = NodeLeader._send_up

    def late(self: Any, group: Any) -> None:
        time.sleep(delays.get(group.part.window, 0.0))
        send(self, group)

    NodeLeader._send_up = late  # type: ignore[method-assign]


def _failing_take_back() -> None:
    from stagefrontier.collect.store_keys import SentKeys

    def refused(self: Any, conn: Any, since: int) -> list[bytes]:
        raise RuntimeError("the store refused to give the parts back")

    SentKeys.take_back = refused  # type: ignore[method-assign]


def run_rank(rank: int, job: NodeJob, port: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    if job.layout_env:
        os.environ.update(
            LOCAL_RANK=str(rank % job.per_node),
            LOCAL_WORLD_SIZE=str(job.per_node),
            GROUP_RANK=str(rank // job.per_node),
        )
    if job.hosts:
        import socket

        socket.gethostname = lambda: job.hosts[rank]  # one machine, several named hosts
    import torch
    import torch.distributed as dist

    from stagefrontier import CollectConfig, StageTimer, TimerConfig

    store = join_gloo(rank, job.ranks, port)
    survivors = [r for r in range(job.ranks) if r not in job.die_at_step]
    meet = dist.new_group(survivors) if job.window_barrier else None  # every rank creates it
    node = rank // job.per_node
    if rank % job.per_node == 0 and node in job.late_part_s:
        _late_parts(job.late_part_s[node])
    if rank in job.take_back_fails:
        _failing_take_back()
    config = TimerConfig(
        stages=tuple(STAGES),
        window=job.window,
        enabled=rank not in job.silent_ranks,
        collection=CollectConfig(
            mode=job.mode,
            out_dir=job.out_dir,
            timeout_s=job.timeout_s,
            keep_node_windows=job.keep_node_windows,
            fan_in=job.fan_in,
            regression=None,
        ),
    )
    said = _said() if job.until_said else []
    timer = StageTimer(config=config)
    x = torch.randn(64, 64)
    if meet is not None:
        dist.barrier()  # every rank has built its timer: window 0 starts together
    waits_for = job.until_said.get(rank)
    first = rank % job.per_node == 0
    members = [r for r in range(rank + 1, rank + job.per_node) if first]
    members = [r for r in members if r not in job.die_at_step]  # a killed member never closes
    leader = rank - rank % job.per_node
    # a member of a leader that trains on trains on with it to the same step, and the leader
    # closes after its members: a job's ranks stop together
    with_leader = rank != leader and leader in job.until_said and leader not in job.die_at_step
    say_by = time.monotonic() + SAY_DEADLINE_S
    for step in itertools.count():
        if with_leader and step >= job.steps:
            if time.monotonic() > say_by:
                break
            if store.check([f"stop/{leader}"]) and step >= int(store.get(f"stop/{leader}")):
                break
        elif step >= job.steps and (
            waits_for is None or any(waits_for in w for w in said) or time.monotonic() > say_by
        ):
            break
        if job.die_at_step.get(rank) == step:
            _await_reported(job, step // job.window)
            os.kill(os.getpid(), signal.SIGKILL)
        with timer.step():
            _data_stage(timer, job, rank, step, store)
            with timer.stage(STAGES[1]):
                (x @ x).sum().item()
            with timer.stage(STAGES[2]):
                pass
        if meet is not None and rank in survivors and (step + 1) % job.window == 0:
            dist.barrier(group=meet)
    if waits_for is not None and rank == leader:
        store.set(f"stop/{rank}", str(step))
        store.wait([f"closed/{r}" for r in members], timedelta(seconds=SAY_DEADLINE_S))
    started = time.monotonic()
    timer.close()
    if with_leader:
        store.set(f"closed/{rank}", "1")
    if job.until_said:
        kept = {"said": said, "close_s": time.monotonic() - started}
        Path(job.out_dir, f"said-rank{rank}.json").write_text(json.dumps(kept))
    Path(job.out_dir, f"done-rank{rank}").write_text("ok")


SAY_DEADLINE_S = 120.0


def _said() -> list[str]:
    """The library's WARNING lines this process logs from now on."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logging.getLogger("stagefrontier").addHandler(Keep(logging.WARNING))
    return said


def _data_stage(timer: Any, job: NodeJob, rank: int, step: int, store: Any) -> None:
    """One step's data stage: a sleep of ``step_s``. Under ``leads_by`` every other rank then
    posts its stage's duration, timed around the timer's own stage (so at least what the timer
    measured), into the job's store, and the leading rank, inside its stage, reads them and
    sleeps until its own stage is longer than the longest by the lead: its lead holds by
    construction, not by the odds of a late wake-up. No rank waits for the leader."""
    leader, lead_s = job.leads_by or (None, 0.0)
    if rank != leader:
        start = time.perf_counter()
        with timer.stage(STAGES[0]):
            time.sleep(job.step_s)
        if leader is not None:
            store.set(f"lead/{step}/{rank}", str(time.perf_counter() - start))
        return
    with timer.stage(STAGES[0]):
        start = time.perf_counter()
        time.sleep(job.step_s)
        others = [r for r in range(job.ranks) if r != leader]
        longest = max(float(store.get(f"lead/{step}/{r}")) for r in others)
        time.sleep(max(0.0, start + longest + lead_s - time.perf_counter()))


def _await_reported(job: NodeJob, windows: int, deadline_s: float = 60.0) -> None:
    """A rank about to die waits until rank 0 reported the windows it lived through, so its
    death costs the windows after it only: its node's part of an earlier window goes up from a
    background thread, which a loaded machine ran after the death's step (window 0 was then
    missing the dying leader's node, though it had lived through it)."""
    records = Path(job.out_dir, "windows.jsonl")
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if records.exists() and len(records.read_text().splitlines()) >= windows:
            return
        time.sleep(0.01)


def launch(job: NodeJob, deadline_s: float = 180.0) -> list[dict[str, Any]]:
    """Run the job; every rank not meant to die must exit cleanly. Rank 0's records, in order."""
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    codes = run_ranks(
        run_rank,
        job.ranks,
        job,
        deadline_s=deadline_s,
        may_die=job.die_at_step,
        start_method=START_METHOD,
    )
    bad = {r: c for r, c in codes.items() if c != 0 and r not in job.die_at_step}
    assert not bad, f"rank exit codes {codes}"
    records = out / "windows.jsonl"
    return [json.loads(line) for line in records.read_text().splitlines() if line.strip()]


def limited(record: dict[str, Any]) -> list[str]:
    """The telemetry_limited reasons of one window record (empty: not limited)."""
    return list(record.get("reasons", {}).get("telemetry_limited", []))


def check_communication_read_as_flat(out_dir: Path, world_size: int) -> None:
    """Every window rank 0 read from node summaries (``out_dir``'s hierarchical run, the node
    leaders' windows kept) against the flat reading of those very windows: transfer, wait,
    spread, arrival and steps exactly, the same late rank, the lateness within the record's
    ``bound_ms``; and the noise the lateness is judged against (the record does not hold it),
    read again from the node leaders' summaries of those windows, within their bound of the flat
    one (the record's is the larger of it and the bound of the summary of the waits with the
    run-queue waits added back). Raises AssertionError."""
    import numpy as np
    import pytest

    from stagefrontier.analysis.collective_summary import (
        CollectiveSummary,
        combine_collectives,
        summary_facts,
    )
    from stagefrontier.analysis.step_facts import StepFacts
    from stagefrontier.collect.base import merge_received
    from stagefrontier.collect.node_payload import node_collectives
    from stagefrontier.demo.launch import read_windows
    from stagefrontier.demo.scale_check import node_windows
    from stagefrontier.window.merged import analyze_merged

    kept = node_windows(out_dir)
    per_node = world_size // len(list(Path(out_dir, "node-windows").glob("node-*")))
    for record in read_windows(out_dir):
        comm = record["communication"]
        windows = sorted(kept[int(record["window"])], key=lambda w: w.rank)
        analyzed = analyze_merged(merge_received(windows, world_size))
        exact, times = analyzed.communication, analyzed.side.collectives
        assert exact is not None and len(exact.collectives) == len(comm["collectives"]) > 0
        for want, got in zip(exact.collectives, comm["collectives"], strict=True):
            for name in ("transfer_ms", "wait_ms", "spread_ms", "reached_ms", "steps"):
                assert got[name] == pytest.approx(getattr(want, name), abs=1e-3), name
            assert got["late_rank"] == want.late_rank, (got, want)
            assert abs(got["lateness_ms"] - want.lateness_ms) <= got["bound_ms"] + 1e-3
        assert comm["bound_ms"] == max(c["bound_ms"] for c in comm["collectives"])
        assert times is not None
        nodes = [windows[first : first + per_node] for first in range(0, world_size, per_node)]
        sent = [node_collectives(node) for node in nodes]  # through the wire's JSON form
        summary = combine_collectives(
            [CollectiveSummary.from_dict(json.loads(json.dumps(p.to_dict()))) for p in sent if p]
        )
        bounds = {
            (c["family"], c["bucket"], c["stage"], c["call"]): c["bound_ms"]
            for c in comm["collectives"]
        }
        read = summary_facts(summary, world_size)
        assert len(read) == len(comm["collectives"]), (read, comm)
        own = {}  # the waits with the run-queue waits added back: the record's bound is the larger
        if summary.own is not None:
            own = {
                summary.own.keys[c]: f.bound_ms for c, f in summary_facts(summary.own, world_size)
            }
        for c, facts in read:
            column = times.keys.index(summary.keys[c])
            flat = StepFacts.of_waits(
                times.wait_ms[:, :, column],
                np.array([w.rank for w in windows]),
                times.reached_ms[:, :, column],
            )
            bound = max(facts.bound_ms, own.get(summary.keys[c], 0.0))
            assert bound == pytest.approx(bounds[summary.keys[c]], abs=1e-3)
            assert abs(facts.noise - flat.noise) <= facts.bound_ms + 1e-3, (facts, flat)
