"""Benchmark: what one rewrite of ``windows.jsonl`` under the disk budget costs rank 0's
analysis thread, for a file of 64 MiB to 1 GiB (the default budget).

Once deleting packets is not enough, the disk budget cuts old healthy windows' records down to
their summary (``sinks.record_compaction.compact_records``). The cut rewrites the whole file
through a temporary copy on the thread that analyzes the windows, so its cost grows with the
file, not with what it cuts; this script measures it. The records are those of a short real
run (the demo that ``long_run.py`` repeats: 2 Gloo ranks, 10-step windows, the profiler router
on), repeated with new window indices and steps into a file of each size, none cut yet. Two
rewrites are timed:

- ``first``: a file of the size, none of its records cut yet; every record but the newest 8 is
  decoded and cut (a folder whose packets are gone and whose records reach its budget, as at a
  run's first cut when records are most of its bytes);
- ``at the budget``: a file of the size whose records are cut but for its newest tenth (what the
  budget lets in between two compactions: ``LOW_WATER``), which this rewrite cuts while it
  copies the whole file again (the steady state of a long run once its cut records fill the
  budget; a smaller file copies less).

Each row gives the wall time and the CPU time of the rewrite (this process's: the rewrite runs
on one thread), and the file's size before and after. Nothing blocks training meanwhile: the
ranks' windows wait in the collector's bounded queue, and one that finds it full is dropped
and counted.

Usage::

    python benchmarks/records_rewrite.py                       # 64, 256 and 1024 MiB
    python benchmarks/records_rewrite.py --mib 16 --out /tmp/rewrite.md
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness_common import (
    command_line,
    environment,
    load_1min,
    load_text,
    quiet_check,
    result_header,
    script_parser,
    table,
)
from long_run import IDLE_ROUTER, source_run
from stagefrontier.environment import MiB
from stagefrontier.formats.records import WINDOWS_FILE, read_records
from stagefrontier.formats.window_rows import record_row, summary_record
from stagefrontier.sinks.disk_budget import LOW_WATER, RECENT
from stagefrontier.sinks.record_compaction import compact_records

SIZES_MIB = (64, 256, 1024)


class Records:
    """The source run's records, repeated with new window indices and steps, as lines."""

    def __init__(self, source: Path) -> None:
        healthy = {"regression": None, "self_cost": None}  # cut by the rewrite
        self.records = []
        for base in read_records(source / WINDOWS_FILE):
            healthy["self_cost"] = {**base["self_cost"], **IDLE_ROUTER}
            self.records.append({**base, **healthy})
        self.summaries = [summary_record(r, record_row(r)) for r in self.records]
        self.steps = self.records[-1]["last_step"] + 1
        self.count = 0

    def append(self, path: Path, until_bytes: int, cut: bool = False) -> None:
        """Append records to ``path`` until it holds ``until_bytes``; ``cut``: as the rewrite
        leaves them, cut down to their summary."""
        size = path.stat().st_size if path.exists() else 0
        with open(path, "ab") as handle:
            while size < until_bytes:
                lap, index = divmod(self.count, len(self.records))
                base = (self.summaries if cut else self.records)[index]
                record = {
                    **base,
                    "window": self.count,
                    "first_step": base["first_step"] + lap * self.steps,
                    "last_step": base["last_step"] + lap * self.steps,
                }
                line = (json.dumps(record) + "\n").encode("utf-8")
                handle.write(line)
                size += len(line)
                self.count += 1


def timed(rewrite: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of ``rewrite()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    rewrite()
    return time.perf_counter() - wall, time.process_time() - cpu


def cut_all_but_newest(path: Path, records: Records) -> tuple[float, float, int]:
    """One rewrite cutting every record of ``path`` but the newest ``RECENT``: its wall and
    CPU seconds and the records it cut."""
    newest = (0, records.count - RECENT)
    cut: list[tuple[int, int]] = []
    wall, cpu = timed(lambda: cut.extend(compact_records(path, set(), newest)[0]))
    return wall, cpu, len(cut)


def main() -> int:
    p = script_parser("records_rewrite", __doc__)
    p.add_argument("--mib", type=int, nargs="+", default=list(SIZES_MIB), help="file sizes")
    p.add_argument("--source", type=Path, help="a short run's folder to repeat (default: a demo)")
    args = p.parse_args()
    loads = [load_1min()]
    machine = environment()
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory(prefix="stagefrontier-rewrite-") as tmp:
        work = Path(tmp)
        records = Records(args.source or source_run(work))
        for mib in args.mib:
            path = work / f"{mib}" / WINDOWS_FILE
            path.parent.mkdir()
            for which in ("first", "at the budget"):
                path.unlink(missing_ok=True)
                records.count = 0
                if which == "at the budget":
                    records.append(path, int(mib * MiB * LOW_WATER), cut=True)
                records.append(path, mib * MiB)
                before = path.stat().st_size
                wall, cpu, cut = cut_all_but_newest(path, records)
                loads.append(load_1min())
                rows.append(
                    [
                        f"{mib}",
                        which,
                        f"{before / MiB:.0f}",
                        f"{path.stat().st_size / MiB:.0f}",
                        f"{cut:,}",
                        f"{wall:.1f}",
                        f"{cpu:.1f}",
                        f"{loads[-1]:.2f}" if loads[-1] is not None else "n/a",
                    ]
                )
                print("  " + " | ".join(str(c) for c in rows[-1]), flush=True)
            path.unlink()
    lines = result_header("One rewrite of windows.jsonl under the disk budget", command_line())
    lines += machine
    lines += quiet_check(loads)
    lines += [
        f"- Load average (1/5/15 min) at the end: {load_text()}",
        "",
        "Each rewrite runs on rank 0's analysis thread. `first`: a file of that size, none of "
        f"its records cut yet, every record but the newest {RECENT} cut; `at the budget`: a "
        f"file of that size whose records were cut but for its newest {1 - LOW_WATER:.0%} "
        "(what one compaction lets in before the next), those cut, the whole file copied. "
        "CPU s is this process's (the rewrite runs on one thread); wall s grows with the "
        "machine's other load.",
        "",
        *table(
            [
                "file MiB",
                "rewrite",
                "MiB before",
                "MiB after",
                "records cut",
                "wall s",
                "CPU s",
                "load (1 min)",
            ],
            rows,
        ),
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
