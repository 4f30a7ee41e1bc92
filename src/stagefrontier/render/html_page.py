"""The pieces every HTML page stagefrontier writes is built from: one self-contained page (its
style inline, figures embedded), escaped text, tables, figures, wrapped code.

``route/html.py`` (an incident's page) and ``render/run_html.py`` (a whole run's report) share
them, so both pages look and wrap alike. Every text that comes from a run (stage names, notes,
commands, op names) goes through ``esc``; a figure that could not be drawn is said on the page,
never silently left out.
"""

from __future__ import annotations

import base64
import html
import importlib.util
import logging
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .escape import printable
from .incident import reference_text

logger = logging.getLogger("stagefrontier")

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:72em;margin:1.5em auto;
padding:0 1em;color:#1a1a1a;line-height:1.45}
h1{font-size:1.45em;overflow-wrap:anywhere}h2{font-size:1.15em;margin-top:1.8em;
border-bottom:1px solid #ddd}
pre,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.88em}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f6f6;padding:.6em .8em;
border-radius:4px}
code{overflow-wrap:break-word}
.wide{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.4em 0}
td,th{border:1px solid #ccc;padding:.2em .5em;vertical-align:top;text-align:left}
th{background:#f0f0f0}td.num{text-align:right;white-space:nowrap}
img,svg{max-width:100%;height:auto}
.note{background:#fff6d6;border-left:4px solid #e0b000;padding:.4em .8em}
.muted{color:#666}
.key span{display:inline-block;width:.9em;height:.9em;margin:0 .3em 0 .9em;
vertical-align:-.1em;border:1px solid #0003}
ul.facts{padding-left:1.2em}
"""
"""Long lines (commands, paths) wrap instead of widening the page; a name in a table wraps at its
spaces, and a table wider than the window scrolls inside its own box."""


def esc(value: Any) -> str:
    """``value`` as HTML text, each control character, line separator or bidirectional control
    written as a backslash escape first (``escape.printable``): a name cannot hide or forge text
    on the page, as on the terminal."""
    return html.escape(printable(str(value)))


def page(title: str, body: str) -> str:
    """A complete page: ``title`` escaped here, ``body`` already HTML."""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>{body}</body></html>"
    )


def table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A table of HTML cells (escape text cells with ``esc`` first); the columns whose index is
    in ``numeric`` are right-aligned. It scrolls inside its own box when wider than the page."""
    head = "".join(f"<th>{cell}</th>" for cell in header)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='num'>{cell}</td>" if i in numeric else f"<td>{cell}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<div class='wide'><table><tr>{head}</tr>{body}</table></div>"


def facts(items: Sequence[tuple[str, str]]) -> str:
    """A list of ``name: value`` lines (both escaped here)."""
    return (
        "<ul class='facts'>"
        + "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in items)
        + "</ul>"
    )


def pre(text: str) -> str:
    """Preformatted text that wraps at the window's edge (commands, paths)."""
    return "<pre>" + "\n".join(esc(line) for line in text.split("\n")) + "</pre>"


def note(text: str) -> str:
    return f"<p class='note'>{esc(text)}</p>"


def png_figure(title: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f"<h2>{esc(title)}</h2><img alt='{esc(title)}' src='data:image/png;base64,{data}'>"


def drawn_figures(
    plots: Sequence[tuple[str, Callable[[Path], Path]]], redraw: str
) -> tuple[str, list[str]]:
    """Each ``(title, plot)`` drawn to a temporary PNG and embedded; returns the HTML and the
    titles drawn. A figure that cannot be drawn is a visible note naming why and how to get it
    (``redraw``: the command that writes the page again), never a silent gap."""
    if importlib.util.find_spec("matplotlib") is None:
        titles = ", ".join(title for title, _ in plots)
        return note(
            f"Figures not drawn ({titles}): matplotlib is not installed here. Install it with "
            f"pip install 'stagefrontier[plot]', then {redraw}."
        ), []
    out, drawn = [], []
    for title, plot in plots:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                png = plot(Path(tmp) / "figure.png").read_bytes()
        except Exception as exc:  # a figure must never cost the page
            logger.debug("stagefrontier: figure %r skipped: %s", title, exc)
            out.append(note(f"{title}: not drawn ({exc})."))
            continue
        out.append(png_figure(title, png))
        drawn.append(title)
    return "".join(out), drawn


def swatch_key(colors: Sequence[tuple[str, str]]) -> str:
    """A colour key: ``(name, colour)`` pairs as small squares with their names."""
    return (
        "<p class='key'>"
        + "".join(
            f"<span style='background:{esc(color)}'></span>{esc(name)}" for name, color in colors
        )
        + "</p>"
    )


def op_diff_table(incident: dict[str, Any], limit: int | None = None) -> str:
    """The op diff inside the incident's stage as a table (its first ``limit`` rows); empty
    without one."""
    rows = incident["op_diff"][:limit]
    if not rows:
        return ""
    cells = [
        [
            f"<code>{esc(r['name'])}</code>",
            f"{r['suspect_ms_per_step']:.2f}",
            f"{r['reference_ms_per_step']:.2f}",
        ]
        for r in rows
    ]
    header = [
        "op / function",
        f"rank {esc(incident['leader_rank'])} ms/step",
        f"{esc(reference_text(incident))} ms/step",
    ]
    return f"<h2>Op diff inside {esc(incident['stage'])}</h2>" + table(
        header, cells, numeric=(1, 2)
    )
