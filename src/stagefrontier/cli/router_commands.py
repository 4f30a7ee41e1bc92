"""``incident`` and ``capture``: the profiler router's incidents, and a capture asked of a
running job."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import StageFrontierError
from ..render.escape import printable
from .common import EXIT_FAILED, EXIT_OK, Subparsers, warn


def add_incident(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "incident",
        help="print the profiler router's incidents (reducing traces not reduced live)",
        description="Print an incident folder (out_dir/incidents/<id>) or every incident of an "
        "output folder, and write its incident.html again. A captured incident whose traces "
        "were not reduced live (another host, or the run ended first) is reduced now against "
        "the run's packets, and its files rewritten.",
    )
    parser.add_argument("dir", type=Path, metavar="DIR")
    parser.set_defaults(handler=_run_incident)


def _run_incident(args: argparse.Namespace) -> int:
    from ..render.incident import render_markdown
    from ..route.html import write_html
    from ..route.offline import incident_folders, reduce_offline, run_folder

    folders, skipped = incident_folders(args.dir)
    for problem in skipped:
        warn(problem)
    if not folders:
        print(printable(f"no {'readable ' if skipped else ''}incidents in {args.dir}"))
    for folder in folders:
        incident, reduced = reduce_offline(folder)
        if reduced:
            print(printable(f"(reduced the traces of {incident['id']} now)"))
        else:  # the page again: its figures may be drawable now (matplotlib installed since)
            write_html(folder, incident, run_folder(folder))
        print(render_markdown(incident))
        print(printable(f"Files: {folder}/incident.json, incident.md, incident.html"))
    return EXIT_OK


def add_capture(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "capture",
        help="ask a running job's profiler router for a capture on some ranks",
        description="Write a capture request into a running job's c10d store; rank 0's router "
        "schedules it a few steps ahead on the named ranks and answers with the incident "
        "folder. Needs torch.",
    )
    parser.add_argument("--store", required=True, metavar="HOST:PORT")
    parser.add_argument("--ranks", required=True, metavar="R[,R]", help="e.g. 2,0")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--stage", default=None, help="the stage to diff (default: live top)")
    parser.add_argument("--run-id", default=None, help="the job's run id (TORCHELASTIC_RUN_ID)")
    parser.add_argument("--attempt", type=int, default=0, help="the job's restart count")
    parser.add_argument("--wait", type=float, default=120.0, metavar="SECONDS")
    parser.add_argument(
        "--router",
        type=int,
        default=0,
        metavar="K",
        help="which router of each process to ask: 0 the first opened (default), 1 the second "
        "(an evaluation timer's, say)",
    )
    parser.set_defaults(handler=_run_capture)


def _run_capture(args: argparse.Namespace) -> int:
    from ..route.manual import request_capture

    host, _, port = args.store.rpartition(":")
    words = args.ranks.split(",")
    if not host or not port.isdigit():
        raise StageFrontierError(f"--store {args.store!r}: expected HOST:PORT")
    if not all(w.strip().isdigit() for w in words):
        raise StageFrontierError(f"--ranks {args.ranks!r}: expected ranks such as 2,0")
    answer = request_capture(
        host,
        int(port),
        [int(w) for w in words],
        args.steps,
        args.stage,
        args.run_id,
        args.attempt,
        args.wait,
        args.router,
    )
    if answer is None:
        print(f"no answer within {args.wait:g} s (is the job running with a ProfilerRouter?)")
        return EXIT_FAILED
    if answer.state == "refused":
        print(printable(f"refused: {answer.text}"))
        return EXIT_FAILED
    print(printable(answer.text))
    return EXIT_OK
