"""``incident.html``: one self-contained page (figures embedded as base64 PNG, no external
file), for a person who opens the incident folder in a browser."""

from __future__ import annotations

import base64
import html
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from ..render.incident import open_commands, reference_text, render_markdown, summary_line, verdict

logger = logging.getLogger("stagefrontier")


def write_html(
    folder: str | os.PathLike[str], incident: dict[str, Any], out_dir: str | os.PathLike[str]
) -> Path:
    figures = _figures(out_dir)
    esc = html.escape
    rows = "".join(
        f"<tr><td><code>{esc(r['name'])}</code></td><td>{r['suspect_ms_per_step']:.2f}</td>"
        f"<td>{r['reference_ms_per_step']:.2f}</td></tr>"
        for r in incident["op_diff"]
    )
    table = (
        "<h2>Op diff inside " + esc(str(incident["stage"])) + "</h2><table><tr><th>op / function"
        f"</th><th>rank {incident['leader_rank']} ms/step</th><th>"
        f"{esc(reference_text(incident))} ms/step</th></tr>{rows}</table>"
        if rows
        else ""
    )
    images = "".join(
        f'<h2>{esc(title)}</h2><img alt="{esc(title)}" src="data:image/png;base64,{data}">'
        for title, data in figures
    )
    commands = "\n".join(open_commands(incident))
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>StageFrontier incident "
        f"{esc(incident['id'])}</title><style>body{{font-family:sans-serif;max-width:60em;"
        "margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:"
        ".2em .5em}img{max-width:100%}</style></head><body>"
        f"<h1>Incident {esc(incident['id'])}: {esc(verdict(incident))}</h1>"
        f"<p>{esc(summary_line(incident))}</p>{table}{images}"
        + (f"<h2>Open the traces</h2><pre>{esc(commands)}</pre>" if commands else "")
        + f"<h2>Details</h2><pre>{esc(render_markdown(incident))}</pre></body></html>"
    )
    path = Path(folder) / "incident.html"
    path.write_text(page)
    return path


def _figures(out_dir: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The frontier figure of the worst step and the share timeline, as base64 PNG; none when
    matplotlib is missing or the run folder has no windows yet."""
    try:
        from ..formats.run_folder import load_run
        from ..render.plots import plot_shares_over_time, plot_worst_step

        run = load_run(Path(out_dir))
        out = []
        for title, plot in (
            ("Frontier of the worst step", plot_worst_step),
            ("Shares over time", plot_shares_over_time),
        ):
            with tempfile.TemporaryDirectory() as tmp:
                png = plot(run, Path(tmp) / "figure.png").read_bytes()
            out.append((title, base64.b64encode(png).decode()))
        return out
    except Exception as exc:
        logger.debug("stagefrontier: incident figures skipped: %s", exc)
        return []
