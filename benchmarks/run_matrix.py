"""``stagefrontier run`` on unmodified training scripts: the whole must-show matrix.

Each cell is one real job, ``stagefrontier run --out DIR --window 10 --router --standalone
--nproc-per-node 4 SCRIPT ARGS`` (4 Gloo ranks on torchrun's launcher), of a script in
examples/unmodified that has no StageFrontier in it:

* ``train_ddp.py`` (a plain DDP loop over a DataLoader) with 0 and with 2 DataLoader workers,
  and with 2 micro-batches per optimizer step (``--accumulate 2``);
* ``lightning_fit.py`` (a Lightning ``Trainer.fit``) and ``hf_trainer.py`` (a Hugging Face
  ``Trainer.train``), whose Trainers get StageFrontier's callbacks attached; ``hf_trainer.py``
  also with ``--local-token-count`` (the Trainer's cross-rank sum of each batch's label tokens,
  after the fetches, turned off).

Each runs healthy, with a 120 ms data stall per step on rank 2 (``--stall data@2``, in the
script's own ``slow_sample``) and with a 120 ms forward stall per step on rank 1 (``--stall
forward@1``, in ``slow_forward``). For each job the table says: how many of rank 0's windows
put the stalled stage on top led by the stalled rank; the incidents opened (stage and leading
rank of the first); whether the traces confirmed it; whether the top row of its op diff (the
workers' op diff when the stall is in DataLoader workers) names the stalled function; and the
job's wall seconds. A cell is right when a healthy job opens no incident, and a stalled one is
routed to its stage and rank in most windows and its first incident is confirmed on that stage
and rank, naming the function.

Usage::

    python benchmarks/run_matrix.py                       # the 18 jobs
    python benchmarks/run_matrix.py --only lightning,hf   # some scripts' rows

Wall-clock seconds on a shared machine: read them with the load average recorded beside them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness_common as hc
from stagefrontier.analysis.schema import DATA_STAGE, FORWARD_STAGE
from stagefrontier.route import list_incidents

UNMODIFIED = hc.ROOT / "examples" / "unmodified"
RANKS = 4
WINDOW = 10
DEADLINE_S = 900.0
SETTLE_S = 120.0
"""How long to wait, after a job ends, for an incident still being confirmed by the after-run
process."""

SCRIPTS: dict[str, tuple[str, ...]] = {
    "ddp": ("train_ddp.py",),
    "ddp-workers": ("train_ddp.py", "--workers", "2"),
    "ddp-accumulate": ("train_ddp.py", "--accumulate", "2", "--steps", "40"),
    "lightning": ("lightning_fit.py", "--steps", "50"),
    "hf": ("hf_trainer.py", "--steps", "50"),
    "hf-local-token-count": ("hf_trainer.py", "--steps", "50", "--local-token-count"),
}
"""A row name -> the script of examples/unmodified and its arguments."""
CASES: dict[str, tuple[str, int, str] | None] = {
    "healthy": None,
    "data@2": (DATA_STAGE, 2, "slow_sample"),
    "forward@1": (FORWARD_STAGE, 1, "slow_forward"),
}
"""A case -> the stage, rank and function its stall must be routed to (None: healthy)."""
METHOD = (
    "Method: each cell is one real job of `stagefrontier run --out DIR --window 10 --router "
    "--standalone --nproc-per-node 4 SCRIPT ARGS [--stall CASE]` (4 Gloo ranks on torchrun's "
    "launcher) of a script of examples/unmodified that has no StageFrontier in it: "
    "`train_ddp.py` (a plain DDP loop over a DataLoader; 50 steps) with 0 and 2 DataLoader "
    "workers and with `--accumulate 2` (40 steps of 2 micro-batches), `lightning_fit.py` (a "
    "Lightning `Trainer.fit`, 50 steps) and `hf_trainer.py` (a Hugging Face `Trainer.train` "
    "of a two-layer GPT-2, 50 steps; also with `--local-token-count`: "
    "`average_tokens_across_devices=False`). A stall is 120 ms a step in the script's own "
    "`slow_sample` (data, rank 2) or `slow_forward` (forward, rank 1), from the first step; "
    "the model's own step is about 25 ms. Routed right: rank 0's windows whose top stage is "
    "the stalled one, led by the stalled rank. Incidents: how many the run opened, and the "
    "stage and leading rank of the first; confirmed: whether the traces confirmed that one; "
    "function named: the top row of its op diff (the workers' op diff when the stall runs in "
    "DataLoader workers). Right: a healthy job opens no incident; a stalled one is routed "
    "right in most windows and its first incident is confirmed on the stalled stage and rank "
    "with the function on top. Seconds: the job's wall time, from the command to the "
    "incidents settled."
)


@dataclass
class Cell:
    script: str
    case: str
    returncode: int
    seconds: float
    windows: int
    routed: int
    incidents: list[dict[str, Any]]
    said: str  # the job's last error line (its last line when none), for a failed job

    def expected(self) -> tuple[str, int, str] | None:
        return CASES[self.case]

    def first(self) -> dict[str, Any] | None:
        return min(self.incidents, key=lambda i: i.get("window") or 0) if self.incidents else None

    def named(self) -> str:
        """The name in the top row of the first incident's op diff (of the workers' op diff for
        a data stall in DataLoader workers)."""
        first = self.first()
        if first is None:
            return ""
        workers = first.get("stage") == DATA_STAGE and first.get("worker_op_diff")
        rows = workers or first.get("op_diff") or []
        return str(rows[0]["name"]) if rows else ""

    def right(self) -> bool:
        expected, first = self.expected(), self.first()
        if self.returncode != 0 or not self.windows:
            return False
        if expected is None:
            return first is None
        stage, rank, function = expected
        return (
            2 * self.routed > self.windows
            and first is not None
            and first.get("stage") == stage
            and first.get("leader_rank") == rank
            and first.get("confirmed") is True
            and function in self.named()
        )


def run_cell(work: Path, script: str, case: str) -> Cell:
    """One job of the matrix, its output in ``work/SCRIPT-CASE``."""
    out = work / f"{script}-{case.replace('@', '-at-')}"
    name, *args = SCRIPTS[script]
    stall = () if CASES[case] is None else ("--stall", case)
    command = [
        sys.executable,
        *("-m", "stagefrontier.cli", "run", "--out", str(out), "--window", str(WINDOW)),
        "--router",
        *("--standalone", "--nproc-per-node", str(RANKS), "--max-restarts=0"),
        str(UNMODIFIED / name),
        *args,
        *stall,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=DEADLINE_S, check=False
    )
    incidents = _settled(out)
    seconds = time.monotonic() - start
    records = _records(out)
    expected = CASES[case]
    routed = 0
    if expected is not None:
        stage, rank, _ = expected
        routed = sum(r["top1"] == stage and _leader(r) == rank for r in records)
    output = (done.stdout + done.stderr).splitlines()
    errors = [line for line in output if "Error" in line or "Traceback" in line]
    said = (errors or output or [""])[-1].strip()
    return Cell(script, case, done.returncode, seconds, len(records), routed, incidents, said)


def _leader(record: dict[str, Any]) -> int | None:
    """The rank leading the window's top stage (with accumulation the leaders are kept per
    microstep, and the window's lead ranks its ranks, the leader first)."""
    top = record["top1"]
    if top in record["leaders"]:
        leader: int | None = record["leaders"][top]
        return leader
    lead = record.get("lead") or {}
    ranks = lead.get("ranks") or [None]
    return ranks[0] if lead.get("stage") == top else None


def _records(out: Path) -> list[dict[str, Any]]:
    path = out / "windows.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _settled(out: Path) -> list[dict[str, Any]]:
    """The run's incidents once the after-run process has confirmed every pending one."""
    end = time.monotonic() + SETTLE_S
    while True:
        incidents = list_incidents(out)
        if all(i.get("reduced") != "pending" for i in incidents) or time.monotonic() > end:
            return incidents
        time.sleep(0.5)


def row(cell: Cell) -> list[object]:
    if cell.returncode != 0:
        return [
            cell.script,
            cell.case,
            f"failed (exit {cell.returncode}): {cell.said}",
            "",
            "",
            "",
            f"{cell.seconds:.0f}",
            "no",
        ]
    first = cell.first()
    routed = "-" if cell.expected() is None else f"{cell.routed}/{cell.windows}"
    if first is None:
        opened, confirmed, named = "none", "-", "-"
    else:
        opened = f"{len(cell.incidents)}: {first.get('stage')} @ rank {first.get('leader_rank')}"
        confirmed = "yes" if first.get("confirmed") is True else f"no ({first.get('reasons')})"
        named = f"`{cell.named()}`" if cell.named() else "none"
    return [
        cell.script,
        cell.case,
        routed,
        opened,
        confirmed,
        named,
        f"{cell.seconds:.0f}",
        "yes" if cell.right() else "NO",
    ]


def main() -> None:
    p = hc.script_parser("run_matrix", __doc__)
    p.add_argument(
        "--only", default="", help=f"comma-separated rows of {', '.join(SCRIPTS)} (default: all)"
    )
    p.add_argument("--work", type=Path, default=None, help="keep the jobs' folders here")
    args = p.parse_args()
    scripts = [s for s in args.only.split(",") if s] or list(SCRIPTS)
    unknown = sorted(set(scripts) - set(SCRIPTS))
    if unknown:
        p.error(f"unknown rows: {', '.join(unknown)}")
    environment = hc.environment()  # the load when the script started among them
    cells = []
    with hc.work_dir(args.work) as work:
        for script in scripts:
            for case in CASES:
                cell = run_cell(work, script, case)
                print(" | ".join(str(c) for c in row(cell)), file=sys.stderr, flush=True)
                cells.append(cell)
    lines = [
        *hc.result_header(
            "`stagefrontier run` on unmodified scripts: the matrix", hc.command_line()
        ),
        *environment,
        f"- Load average (1/5/15 min) at the end: {hc.load_text()}",
        "",
        METHOD,
        "",
        *hc.table(
            [
                "script",
                "case",
                "windows routed right",
                "incidents: first",
                "confirmed",
                "function named",
                "seconds",
                "right",
            ],
            [row(c) for c in cells],
        ),
        "",
        f"- {sum(c.right() for c in cells)} of {len(cells)} cells right.",
    ]
    hc.write_result(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
