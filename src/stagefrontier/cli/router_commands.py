"""``incident`` and ``capture``: the profiler router's incidents, and a capture asked of a
running job."""

from __future__ import annotations

import argparse

from ..errors import StageFrontierError
from ..render.escape import printable
from .common import EXIT_FAILED, EXIT_OK, warn


def handle_incident(args: argparse.Namespace) -> int:
    from ..render.incident import render_markdown
    from ..route.offline import incident_folders, redraw

    folders, skipped = incident_folders(args.dir)
    for problem in skipped:
        warn(problem)
    if not folders:
        print(printable(f"no {'readable ' if skipped else ''}incidents in {args.dir}"))
    for folder in folders:
        incident, reduced = redraw(folder)
        if reduced:
            print(printable(f"(reduced the traces of {incident['id']} now)"))
        print(render_markdown(incident))
        print(printable(f"Files: {folder}/incident.json, incident.md, incident.html"))
    return EXIT_OK


def handle_capture(args: argparse.Namespace) -> int:
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
