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

from ..environment import MiB
from ..formats.compacted import COMPACTED_FILE
from ..formats.packet import write_bytes_atomically
from ..render.command import cli_command
from ..render.html_page import Figure, drawn_figures, op_diff, render, worker_op_diff
from ..render.incident import detail_facts, open_commands, summary_line, verdict
from ..sinks.disk_budget import folder_bytes

logger = logging.getLogger("stagefrontier")

DRAW_LATER = (
    "import sys\n"
    "from stagefrontier.route.offline import draw_pages\n"
    "draw_pages(sys.argv[2:], int(sys.argv[1]))\n"
)
"""The program ``draw_later`` runs: ``route.offline.draw_pages`` on each folder with the run
folder's disk budget, which writes its page again with the figures (and reduces a capture the
run ended before reducing)."""


def write_html(
    folder: str | os.PathLike[str],
    incident: dict[str, Any],
    out_dir: str | os.PathLike[str],
    figures: bool = True,
    budget_bytes: int | None = None,
) -> Path:
    """Write ``folder/incident.html``: the verdict, the op diff, the run's figures, the commands
    that open the traces, and the incident's facts, shares and reasons. ``figures=False``
    leaves the figures out with a note: a live router has them drawn by a process of their
    own when the run ends (``draw_later``), since drawing takes seconds of CPU a running job
    should keep, and its ranks' exit should not wait for. With the run folder's disk budget
    (``budget_bytes``), the figures (hundreds of kB, written after the budget stopped
    measuring the folder) are left out with a note when the budget had to compact the folder,
    or when they would take it past the budget."""
    page = Path(folder) / "incident.html"
    budget = "" if budget_bytes is None else f"its disk budget of {budget_bytes / MiB:.3g} MiB"
    reason = ""
    if figures and budget and (Path(out_dir) / COMPACTED_FILE).exists():  # not drawn at all
        reason = f"the run folder reached {budget} ({COMPACTED_FILE}): its room is the windows'"
    shown = _figures(Path(folder), Path(out_dir), incident) if figures and not reason else None
    text = _page(incident, shown).encode()
    if (
        shown
        and budget_bytes is not None
        and _held_besides(page, Path(out_dir)) + len(text) > budget_bytes
    ):
        reason = f"they would take the run folder past {budget}"
    if reason:
        redraw = f"run `{cli_command()} incident {shlex.quote(str(folder))}` to draw them"
        note = f"Figures not drawn after the run: {reason}; {redraw}."
        text = _page(incident, [Figure("Figures", note=note)]).encode()
    return write_bytes_atomically(page, text)


def _page(incident: dict[str, Any], shown: list[Figure] | None) -> str:
    return render(
        "incident.html.j2",
        title=f"StageFrontier incident {incident['id']}",
        incident_id=incident["id"],
        verdict=verdict(incident),
        summary=summary_line(incident),
        diff=op_diff(incident),
        workers=worker_op_diff(incident),
        shown=shown,
        commands=open_commands(incident),
        details=detail_facts(incident),
        share_rows=[
            (stage, f"{share:.1%}", f"{incident['live_shares'].get(stage, float('nan')):.1%}")
            for stage, share in incident["trace_shares"].items()
        ],
        reasons=incident["reasons"],
    )


def _held_besides(page: Path, out_dir: Path) -> int:
    """The bytes of the run folder ``out_dir`` but for ``page`` (the page being replaced)."""
    try:
        replaced = page.stat().st_size
    except OSError:  # not written yet
        replaced = 0
    return folder_bytes(out_dir) - replaced


def _figures(folder: Path, out_dir: Path, incident: dict[str, Any]) -> list[Figure]:
    """The frontier figure of the captured steps (the run's worst step when the incident
    captured none) and the share timeline, or a note saying why they are missing."""
    from ..formats.run_folder import load_run
    from ..render.plots import plot_shares_over_time, plot_worst_step

    try:
        run = load_run(out_dir)
    except Exception as exc:  # the page must never fail for its figures
        missing = f"Figures not drawn: the run's windows cannot be read ({exc})."
        return [Figure("Figures", note=missing)]
    redraw = f"run `{cli_command()} incident {shlex.quote(str(folder))}` to write this page again"
    steps = tuple(incident["steps"]) if incident["captured"] and incident["steps"] else None
    return drawn_figures(
        [
            (
                f"Frontier of the captured steps {steps[0]}-{steps[1]}"
                if steps
                else "Frontier of the worst step",
                lambda path: plot_worst_step(run, path, steps),
            ),
            ("Shares over time", lambda path: plot_shares_over_time(run, path)),
        ],
        redraw,
    )


def draw_later(folders: Sequence[Path], budget_bytes: int) -> None:
    """Have the pages of ``folders`` written again with their figures by a process of their
    own, started here and not waited for: importing matplotlib, reading the run's windows and
    drawing take seconds, by which every rank's exit would otherwise be late (the job's last
    collective waits for rank 0). The figures keep to the run folder's disk budget,
    ``budget_bytes`` (see ``write_html``). A process that cannot start is said in one line;
    the pages then keep their note."""
    if not folders:
        return
    try:
        subprocess.Popen(
            [sys.executable, "-c", DRAW_LATER, str(budget_bytes), *map(str, folders)],
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
