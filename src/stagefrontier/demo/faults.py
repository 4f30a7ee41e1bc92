"""Host-side fault injection for the demo and the evaluation harness.

Spec grammar: ``KIND@RANK:DELAYms[,every=K][,from=S,to=E]``, e.g. ``data@2:120ms``,
``callback_sync@0:120ms,every=10``, ``comm@1:180ms,from=40,to=80``. RANK may be ``all``: the
delay then hits every rank, e.g. ``data@all:30ms,from=60`` (a slower mount from step 60 on); or
``node<i>``: every rank of node ``i`` in a job launched as nodes (torchrun's ``GROUP_RANK``),
e.g. ``data@node1:120ms`` (a whole node's slower storage).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FaultSpecError as FaultSpecError  # defined there, importable here

FAULT_KINDS = (
    "data",
    "forward",
    "backward",
    "backward_compute",
    "comm",
    "callback_sync",
    "callback_host",
    "forward_device",
)
"""Where the delay goes: the data stage, forward, backward (before ``loss.backward()``), inside
backward's computation (a gradient hook on the model's first parameter, which autograd reaches
last, so the last gradient bucket waits for it), inside a DDP communication hook, a
callback followed by a barrier on every rank, a callback without a barrier, or a device-side
forward delay (parsed, but refused by the CPU demo, whose forward has no device work)."""

HOST_KINDS = tuple(k for k in FAULT_KINDS if k != "forward_device")
"""The kinds the CPU demo runs (the ones a user is offered)."""

_SPEC = re.compile(
    r"^(?P<kind>[a-z_]+)@(?P<rank>\d+|all|node\d+):(?P<ms>\d+(?:\.\d+)?)ms(?P<opts>(?:,.*)?)$"
)


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None
    """The rank it hits; None for every rank (of ``node`` when it is set)."""
    delay_s: float
    every: int = 1
    start: int = 0
    stop: int | None = None
    node: int | None = None
    """The node whose every rank it hits; None: not a node fault."""

    def active(self, rank: int, step: int, node: int | None = None) -> bool:
        """Whether this fault fires on ``rank`` (on ``node``) at ``step``."""
        return (
            (self.rank is None or rank == self.rank)
            and (self.node is None or node == self.node)
            and step >= self.start
            and (self.stop is None or step < self.stop)
            and (step - self.start) % self.every == 0
        )

    def __str__(self) -> str:
        where = "all" if self.rank is None else self.rank
        if self.node is not None:
            where = f"node{self.node}"
        text = f"{self.kind}@{where}:{self.delay_s * 1e3:g}ms"
        if self.every != 1:
            text += f",every={self.every}"
        if self.start or self.stop is not None:
            text += f",from={self.start}" + (f",to={self.stop}" if self.stop is not None else "")
        return text


def parse_fault(spec: str) -> Fault:
    """Parse one ``--fault`` value; raises FaultSpecError naming what is wrong."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise FaultSpecError(
            f"bad fault {spec!r}: expected KIND@RANK:DELAYms[,every=K][,from=S,to=E] "
            "(RANK a number, all or node<i>), e.g. data@2:120ms"
        )
    kind = match["kind"]
    if kind not in FAULT_KINDS:
        raise FaultSpecError(f"unknown fault kind {kind!r}; choose one of {', '.join(HOST_KINDS)}")
    options: dict[str, int] = {}
    for item in filter(None, match["opts"].split(",")):
        key, _, value = item.partition("=")
        if key not in ("every", "from", "to") or not value.isdigit():
            raise FaultSpecError(
                f"bad fault option {item!r} in {spec!r}: use every=K, from=S, to=E"
            )
        options[key] = int(value)
    if options.get("every", 1) < 1:
        raise FaultSpecError(f"every must be >= 1 in {spec!r}")
    if "to" in options and options["to"] <= options.get("from", 0):
        raise FaultSpecError(
            f"fault {spec!r} never fires: to={options['to']} must be after "
            f"from={options.get('from', 0)} (the steps from S up to, not including, E)"
        )
    target = match["rank"]
    return Fault(
        kind=kind,
        rank=int(target) if target.isdigit() else None,
        node=int(target[4:]) if target.startswith("node") else None,
        delay_s=float(match["ms"]) / 1e3,
        every=options.get("every", 1),
        start=options.get("from", 0),
        stop=options.get("to"),
    )


def check_faults(
    faults: tuple[Fault, ...],
    ranks: int,
    cuda: bool,
    steps: int | None = None,
    nodes: int | None = None,
) -> None:
    """Reject faults that cannot run in this configuration (a rank or node the job lacks, a
    node in a job not launched as nodes, a start after its last step, device work the demo has
    none of), with the reason."""
    for fault in faults:
        if fault.node is not None and (nodes is None or fault.node >= nodes):
            raise FaultSpecError(
                f"fault {fault} targets node {fault.node} but the job "
                + ("is not launched as nodes" if nodes is None else f"has {nodes} node(s)")
            )
        if fault.rank is not None and fault.rank >= ranks:
            raise FaultSpecError(f"fault {fault} targets rank {fault.rank} but --ranks is {ranks}")
        if steps is not None and fault.start >= steps:
            raise FaultSpecError(
                f"fault {fault} never fires: it starts at step {fault.start} but the run's "
                f"--steps {steps} are steps 0-{steps - 1}"
            )
        if fault.kind == "forward_device":
            # The demo model trains on the CPU: accepting it would inject nothing.
            raise FaultSpecError(
                "forward_device delays device work inside the forward, and the demo trains on "
                "the CPU over Gloo, so it has none to delay"
                + ("" if cuda else " (and this machine has no CUDA GPU)")
                + ". Use forward@RANK:DELAYms for a host-side forward delay"
            )


class FaultInjector:
    """Sleeps where a fault says, on the rank and steps it names; set ``step`` before each step.

    Training code calls ``delay(kind)`` at each injection point, ``barrier_now()`` in the
    callbacks stage, and registers ``comm_hook`` as a DDP communication hook for comm faults.
    """

    def __init__(
        self,
        faults: tuple[Fault, ...],
        rank: int,
        node: int | None = None,
        entered: Path | None = None,
    ) -> None:
        """``entered``: a file touched as this rank's first delay begins (a launcher then knows
        the rank is inside its fault)."""
        self.faults = faults
        self.rank = rank
        self.node = node
        self.step = 0
        self.entered = entered

    def delay(self, kind: str) -> None:
        delay_s = self.delay_s(kind, self.step)
        if delay_s:
            if self.entered is not None:
                self.entered.parent.mkdir(parents=True, exist_ok=True)
                self.entered.touch()
                self.entered = None
            time.sleep(delay_s)

    def delay_s(self, kind: str, step: int) -> float:
        """The seconds the faults of ``kind`` add at ``step`` on this rank."""
        return sum(
            f.delay_s
            for f in self.faults
            if f.kind == kind and f.active(self.rank, step, self.node)
        )

    def barrier_now(self) -> bool:
        """callback_sync faults put a barrier on every rank at the faulty rank's steps."""
        return any(
            f.kind == "callback_sync"
            and f.active(self.rank if f.rank is None else f.rank, self.step, f.node)
            for f in self.faults
        )

    def comm_hook(self, process_group: Any, bucket: Any) -> Any:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        if bucket.index() == 0:
            self.delay("comm")
        return allreduce_hook(process_group, bucket)
