"""The output folder's disk budget held over a long run with three regressions and a restart.

A real 2-rank Gloo job (store collection, four timed stages: sleeps and an all-reduce) runs
WINDOWS windows of 10 steps into a folder with a small disk budget, then runs again into the
same folder as a job resumed from a checkpoint would. The forward stage of two pairs of windows
of the first attempt and one pair of the second is 40 ms slower on every rank (three injected
regressions, each two windows long). The table says what the folder holds at the end against
its budget, what the compactions deleted, cut and kept, whether the three regressions and the
restart are in the records and their packets kept, and whether ``stagefrontier report --html``
shows the three regressions, the restart's attempts and the records cut.

Usage::

    python benchmarks/disk_budget.py                  # 2 x 1,000 windows, a 16 MiB budget
    python benchmarks/disk_budget.py --windows 200 --budget-mb 2    # a short run
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import harness_common as hc

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall")
WINDOW, STEP_S, SLOW_S = 10, 0.004, 0.04


@dataclass(frozen=True)
class Job:
    out_dir: str
    windows: int
    slow: tuple[int, ...]
    budget_mb: int


def run_rank(rank: int, job: Job, port: int) -> None:
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from stagefrontier import CollectConfig, StageTimer, TimerConfig
    from stagefrontier.demo.train import leave_process_group

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(60))
    collection = CollectConfig(
        mode="store",
        out_dir=job.out_dir,
        timeout_s=60.0,
        queue_size=256,
        log=False,
        disk_budget_mb=job.budget_mb,
    )
    timer = StageTimer(config=TimerConfig(STAGES, window=WINDOW, collection=collection))
    grad = torch.zeros(64)
    for step in range(job.windows * WINDOW):
        window = step // WINDOW
        slow = window in job.slow or window - 1 in job.slow
        with timer.step():
            with timer.stage(STAGES[0]):
                time.sleep(STEP_S)
            with timer.stage(STAGES[1]):
                time.sleep(STEP_S + (SLOW_S if slow else 0.0))
            with timer.stage(STAGES[2]):
                dist.all_reduce(grad)
    timer.close()
    leave_process_group()


def main() -> int:
    p = hc.script_parser("disk_budget", __doc__)
    p.add_argument("--windows", type=int, default=1000, help="windows per attempt")
    p.add_argument("--budget-mb", type=int, default=16, help="the folder's budget in MiB")
    args = p.parse_args()
    from markupsafe import escape

    from stagefrontier.demo.launch import run_ranks
    from stagefrontier.formats.compacted import listed_windows
    from stagefrontier.render.regression_text import regression_text
    from stagefrontier.sinks.disk_budget import folder_bytes

    n = args.windows
    slow = {0: (int(n * 0.3), int(n * 0.7)), 1: (int(n * 0.5),)}
    started, loads, env = time.monotonic(), [hc.load_1min()], hc.environment()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        for attempt in (0, 1):
            job = Job(str(out), n, slow[attempt], args.budget_mb)
            codes = run_ranks(run_rank, 2, job, deadline_s=3600.0, start_method="forkserver")
            assert all(code == 0 for code in codes.values()), codes
            loads.append(hc.load_1min())
        records = [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines()]
        compactions = [
            json.loads(line) for line in (out / "compacted.jsonl").read_text().splitlines()
        ]
        attempts = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
        packets = {p.name for p in (out / "packets").iterdir()}
        held = folder_bytes(out)
        sizes = {
            name: folder_bytes(out / name) if (out / name).is_dir() else (out / name).stat().st_size
            for name in ("windows.jsonl", "packets", "attempts.jsonl", "compacted.jsonl")
        }
        dropped = sum(
            len(listed_windows(c[key]))
            for c in compactions
            for key in ("windows", "flagged_windows")
        )
        flagged = sum(1 for r in records if r.get("regression"))
        cut = sum(1 for r in records if r.get("compacted"))
        flagged_cut = sum(1 for r in records if r.get("regression") and r.get("compacted"))
        listed_cut = sum(c.get("records_cut", 0) for c in compactions)
        injected = [(a, w) for a, ws in slow.items() for w in ws]
        by_window = {(r["attempt"], r["window"]): r for r in records}

        def packet(a: int, w: int) -> str:
            return f"window-{w:06d}" + (f".attempt-{a}" if a else "") + ".json"

        pairs = [[(a, w), (a, w + 1)] for a, w in injected]
        flagged_pairs = [[k for k in pair if by_window[k].get("regression")] for pair in pairs]
        caught = sum(1 for found in flagged_pairs if found)
        kept = sum(1 for found in flagged_pairs if any(packet(*k) in packets for k in found))
        page = _report_page(out)
        shown = sum(
            1
            for found in flagged_pairs
            if any(str(escape(regression_text(by_window[k]["regression"]))) in page for k in found)
        )
    budget = args.budget_mb << 20
    rows = [
        ("windows (records)", f"{len(records)} in {len({r['attempt'] for r in records})} attempts"),
        ("attempts.jsonl", "; ".join(_attempt_line(a) for a in attempts if a["event"] == "end")),
        (
            "folder at the end",
            f"{held / 2**20:.2f} MiB of {args.budget_mb} MiB ({held / budget:.0%})",
        ),
        ("windows.jsonl", f"{sizes['windows.jsonl'] / 2**20:.2f} MiB"),
        (
            "records cut down to their summary",
            f"{cut} of {len(records)} ({listed_cut} listed in compacted.jsonl); "
            f"flagged records cut: {flagged_cut}",
        ),
        ("packets/", f"{sizes['packets'] / 2**20:.2f} MiB, {len(packets)} packets"),
        ("compactions", f"{len(compactions)}, {dropped} packets deleted, each listed"),
        (
            "sample kept at the end",
            f"1 window in {compactions[-1]['sample_every'] if compactions else '-'}",
        ),
        ("flagged windows", f"{flagged} (3 injected regressions of 2 windows)"),
        ("injected regressions flagged", f"{caught}/3"),
        ("their packets kept", f"{kept}/3"),
        ("over budget at any compaction", str(any(c["over_budget"] for c in compactions))),
        ("`report --html`: injected regressions on the page", f"{shown}/3"),
        ("`report --html`: the restart's attempts on the page", str("restart attempts" in page)),
        ("`report --html`: the records cut, said on the page", str("cut the records of" in page)),
    ]
    lines = [
        *hc.result_header("The disk budget over a long run with a restart", hc.command_line()),
        f"- The measured wall time of the whole script: {time.monotonic() - started:.0f} s, "
        "2 launched 2-rank runs",
        *env,
        f"- Load average (1/5/15 min) when the script ended: {hc.load_text()}",
        *hc.quiet_check(loads),
        "",
        *hc.table(("what", "value"), rows),
        "",
    ]
    text = "\n".join(lines)
    hc.write_result(args.out, text)
    return 0


def _report_page(out: Path) -> str:
    """The run's page as ``stagefrontier report --html`` writes it."""
    from stagefrontier.cli.main import main as cli

    page = out / "report.html"
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli(["report", str(out), "--html", str(page)])
    assert code == 0, code
    return page.read_text(encoding="utf-8")


def _attempt_line(line: dict[str, object]) -> str:
    return f"attempt {line['attempt']}: steps {line['first_step']}-{line['last_step']}"


if __name__ == "__main__":
    raise SystemExit(main())
