"""The demo as a job of several nodes on this one machine: one torchrun agent per node, joined
by a c10d rendezvous on loopback, exactly as a multi-node job is launched.

``launch_nodes`` writes the run's DemoConfig to ``out_dir/demo-config.json``, opens the
rendezvous store on a loopback port the kernel picks, and starts the agents (``python -m
torch.distributed.run --nnodes N --node-rank i --nproc-per-node P --rdzv-backend c10d
--rdzv-endpoint 127.0.0.1:PORT --rdzv-conf is_host=0 -m stagefrontier.demo.torchrun CONFIG``),
every one a client of that store, which the launcher holds until they end (a port picked free
and handed to an agent to bind later could be taken by another process in between). Each worker
runs ``main`` here, which reads the config and trains one rank of the demo, its rank and node
taken from torchrun's environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ..collect.node_store import LOOPBACK, loopback_store
from ..errors import DeadlineExceeded, DemoError
from ..sinks.output_folder import clear_run_files
from .faults import parse_fault
from .launch import read_windows
from .train import DemoConfig, run_rank

CONFIG_FILE = "demo-config.json"
AGENT_LOG = "agent-{node}.log"


def write_config(config: DemoConfig, path: Path) -> None:
    values = asdict(config)
    values["faults"] = [str(f) for f in config.faults]
    path.write_text(json.dumps(values))


def read_config(path: Path) -> DemoConfig:
    values: dict[str, Any] = json.loads(path.read_text())
    values["faults"] = [parse_fault(f) for f in values["faults"]]
    for f in fields(DemoConfig):
        if isinstance(values.get(f.name), list):
            values[f.name] = tuple(values[f.name])
    return DemoConfig(**values)


def main(argv: list[str] | None = None) -> None:
    """A torchrun worker: ``python -m stagefrontier.demo.torchrun CONFIG``."""
    args = sys.argv[1:] if argv is None else argv
    run_rank(int(os.environ["RANK"]), read_config(Path(args[0])), None)


def launch_nodes(
    config: DemoConfig, *, nodes: int, per_node: int, deadline_s: float = 600.0
) -> list[dict[str, Any]]:
    """Run ``config`` as ``nodes`` torchrun agents of ``per_node`` ranks each (``config.ranks``
    must be their product) and return rank 0's window records. Each agent's output goes to
    ``out_dir/agent-<i>.log``.

    Raises:
        DemoError: an agent failed (its log's last lines are in the message), or ranks do not
            match the layout.
        DeadlineExceeded: the run outlived ``deadline_s`` (every agent is killed first).
    """
    if config.ranks != nodes * per_node:
        raise DemoError(f"{config.ranks} ranks are not {nodes} nodes of {per_node}")
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clear_run_files(out)  # a new run, not a continuation of the last one
    config_path = out / CONFIG_FILE
    write_config(config, config_path)
    rendezvous = loopback_store()  # held until every agent has ended
    endpoint = f"{LOOPBACK}:{rendezvous.port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = []
    for node in range(nodes):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nodes}",
            f"--node-rank={node}",
            f"--nproc-per-node={per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            "--rdzv-conf=is_host=0",  # the store above is the host
            "--max-restarts=0",
            "-m",
            "stagefrontier.demo.torchrun",
            str(config_path),
        ]
        log = (out / AGENT_LOG.format(node=node)).open("w")
        agents.append(
            subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        )
        log.close()  # the agent holds its own copy
    _wait(agents, deadline_s, out)
    del rendezvous  # every agent has ended
    return read_windows(out)


def _wait(agents: list[subprocess.Popen[bytes]], deadline_s: float, out: Path) -> None:
    start = time.monotonic()
    try:
        while any(a.poll() is None for a in agents):
            if any(a.returncode not in (None, 0) for a in agents):
                break
            if time.monotonic() - start > deadline_s:
                raise DeadlineExceeded(f"torchrun job exceeded its {deadline_s:.0f} s deadline")
            time.sleep(0.2)
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGTERM)
        for agent in agents:
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    failed = {i: a.returncode for i, a in enumerate(agents) if a.returncode != 0}
    if failed:
        tails = []
        for node in failed:
            lines = (out / AGENT_LOG.format(node=node)).read_text(errors="replace").splitlines()
            tails += [f"  agent {node}: {line}" for line in lines[-5:]]
        raise DemoError(f"torchrun agent(s) failed with exit codes {failed}\n" + "\n".join(tails))


if __name__ == "__main__":
    main()
