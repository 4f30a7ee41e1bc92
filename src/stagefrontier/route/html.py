"""``incident.html``: one self-contained page (figures embedded as base64 PNG, no external
file), for a person who opens the incident folder in a browser: the template
``render/templates/incident.html.j2``, rendered with autoescaping by ``render/html_page.py``; a
figure that cannot be drawn is said on the page."""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..formats.packet import write_bytes_atomically
from ..render.command import cli_command
from ..render.html_page import Figure, drawn_figures, op_diff, render
from ..render.incident import detail_facts, open_commands, summary_line, verdict

logger = logging.getLogger("stagefrontier")

DRAW_LATER = (
    "import sys\n"
    "from stagefrontier.cli import main\n"
    "for folder in sys.argv[1:]:\n"
    "    main(['incident', folder])\n"
)
"""The program ``draw_later`` runs: ``stagefrontier incident`` on each folder, which writes
its page again with the figures (and reduces a capture the run ended before reducing)."""


def write_html(
    folder: str | os.PathLike[str],
    incident: dict[str, Any],
    out_dir: str | os.PathLike[str],
    figures: bool = True,
) -> Path:
    """Write ``folder/incident.html``: the verdict, the op diff, the run's figures, the commands
    that open the traces, and the incident's facts, shares and reasons. ``figures=False``
    leaves the figures out with a note: a live router has them drawn by a process of their
    own when the run ends (``draw_later``), since drawing takes seconds of CPU a running job
    should keep, and its ranks' exit should not wait for."""
    text = render(
        "incident.html.j2",
        title=f"StageFrontier incident {incident['id']}",
        incident_id=incident["id"],
        verdict=verdict(incident),
        summary=summary_line(incident),
        diff=op_diff(incident),
        shown=_figures(Path(folder), Path(out_dir)) if figures else None,
        commands=open_commands(incident),
        details=detail_facts(incident),
        share_rows=[
            (stage, f"{share:.1%}", f"{incident['live_shares'].get(stage, float('nan')):.1%}")
            for stage, share in incident["trace_shares"].items()
        ],
        reasons=incident["reasons"],
    )
    return write_bytes_atomically(Path(folder) / "incident.html", text.encode())


def _figures(folder: Path, out_dir: Path) -> list[Figure]:
    """The frontier figure of the worst step and the share timeline, or a note saying why
    they are missing."""
    from ..formats.run_folder import load_run
    from ..render.plots import plot_shares_over_time, plot_worst_step

    try:
        run = load_run(out_dir)
    except Exception as exc:  # the page must never fail for its figures
        missing = f"Figures not drawn: the run's windows cannot be read ({exc})."
        return [Figure("Figures", note=missing)]
    redraw = f"run `{cli_command()} incident {shlex.quote(str(folder))}` to write this page again"
    return drawn_figures(
        [
            ("Frontier of the worst step", lambda path: plot_worst_step(run, path)),
            ("Shares over time", lambda path: plot_shares_over_time(run, path)),
        ],
        redraw,
    )


def draw_later(folders: Sequence[Path]) -> None:
    """Have the pages of ``folders`` written again with their figures by a process of their
    own, started here and not waited for: importing matplotlib, reading the run's windows and
    drawing take seconds, by which every rank's exit would otherwise be late (the job's last
    collective waits for rank 0). A process that cannot start is said in one line; the pages
    then keep their note."""
    if not folders:
        return
    try:
        subprocess.Popen(
            [sys.executable, "-c", DRAW_LATER, *(str(folder) for folder in folders)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the job's process group leaves it drawing
        )
    except OSError as exc:
        logger.warning(
            "stagefrontier: the incident pages keep no figures and a reduction left pending "
            "stays so (run `stagefrontier incident` on their folders): the process to draw "
            "them did not start: %s",
            exc,
        )
