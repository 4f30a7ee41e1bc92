"""What every HTML page stagefrontier writes is built with: Jinja2 templates (``templates/``)
rendered with autoescaping on, so every value a page shows (stage names, op and function names,
paths, notes, commands) is escaped by the template engine, never by the caller; and the figures,
drawn here, or a note saying why one is missing.

``route/html.py`` (an incident's page) and ``render/run_html.py`` (a whole run's report) pass
plain values to their templates, which share ``page.html.j2`` (the page and its style) and
``parts.html.j2`` (tables, facts, figures, the op diff), so both pages look and wrap alike.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .escape import printable
from .incident import reference_text

if TYPE_CHECKING:
    import jinja2

logger = logging.getLogger("stagefrontier")


@functools.cache
def templates() -> jinja2.Environment:
    """The pages' templates, escaping every value. Built at the first page (Jinja2 is not
    imported with the library: a job without pages never loads it), or by the profiler router
    as it starts (``route.profiler_session.warm_up``), before its thread writes a page."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("stagefrontier.render", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=shown,
    )


def shown(value: Any) -> Any:
    """What a page shows of a value: text with each control character, line separator and
    bidirectional control written as a backslash escape (``escape.printable``), as the text
    reports show it, so a name cannot hide or forge text on a page either; markup a page builds
    (``__html__``: a drawn figure) as it is. Autoescaping follows."""
    if isinstance(value, str) and not hasattr(value, "__html__"):
        return printable(value)
    return value


def render(template: str, **values: Any) -> str:
    """The page ``template`` (a file of ``templates/``) with ``values``, every one escaped."""
    return templates().get_template(template).render(**values)


@dataclass(frozen=True)
class Figure:
    """A figure embedded in a page (``png_base64``), or the note said in its place."""

    title: str
    png_base64: str = ""
    note: str = ""


MIN_SHOWN_DIFF_MS = 0.1
"""An op diff row whose two sides differ by less than this (ms per step or batch) is counted
under the table, not listed."""


@dataclass(frozen=True)
class OpDiff:
    """The op diff inside an incident's stage, as a table's rows: the op or function, its
    milliseconds per step on the suspect and on the reference, the rows whose sides differ by
    :data:`MIN_SHOWN_DIFF_MS` or more; ``more`` says how many rows are not listed."""

    stage: str
    suspect: str
    reference: str
    rows: list[tuple[str, str, str]]
    more: str = ""


@dataclass(frozen=True)
class WorkerDiff:
    """The suspect's DataLoader workers' functions against the reference's, per batch (as
    ``incident.md`` lists them), the rows that differ; ``more`` as for :class:`OpDiff`."""

    suspect: str
    reference: str
    rows: list[tuple[str, str, str, str]]
    more: str = ""


def op_diff(incident: dict[str, Any], limit: int | None = None) -> OpDiff:
    """The incident's op diff: the rows that differ (at most ``limit``), and how many more
    there are (none when it has no diff)."""
    rows = incident["op_diff"]
    shown = [r for r in rows if _differs(r, "step")][:limit]
    return OpDiff(
        stage=str(incident["stage"]),
        suspect=str(incident["leader_rank"]),
        reference=reference_text(incident),
        rows=[
            (
                str(r["name"]),
                f"{r['suspect_ms_per_step']:.2f}",
                f"{r['reference_ms_per_step']:.2f}",
            )
            for r in shown
        ],
        more=_more(rows, shown, "step"),
    )


def worker_op_diff(incident: dict[str, Any]) -> WorkerDiff:
    """The incident's DataLoader workers' op diff (no rows when the capture profiled none)."""
    rows = incident.get("worker_op_diff") or []
    shown = [r for r in rows if _differs(r, "batch")]
    return WorkerDiff(
        suspect=str(incident["leader_rank"]),
        reference=str(incident["reference_rank"]),
        rows=[
            (
                str(r["name"]),
                f"{r['suspect_ms_per_batch']:.2f}",
                f"{r['reference_ms_per_batch']:.2f}",
                f"{r['calls_per_batch']:g}",
            )
            for r in shown
        ],
        more=_more(rows, shown, "batch"),
    )


def _differs(row: dict[str, Any], unit: str) -> bool:
    suspect, reference = row[f"suspect_ms_per_{unit}"], row[f"reference_ms_per_{unit}"]
    return bool(abs(suspect - reference) >= MIN_SHOWN_DIFF_MS)


def _more(rows: list[dict[str, Any]], shown: list[dict[str, Any]], unit: str) -> str:
    """``17 more rows under 0.1 ms (incident.json lists them all).``, or without ``under 0.1
    ms`` when a limit cut rows that differ; empty when every row is shown."""
    hidden = [r for r in rows if r not in shown]
    if not hidden:
        return ""
    small = all(not _differs(r, unit) for r in hidden)
    under = f" under {MIN_SHOWN_DIFF_MS:g} ms" if small else ""
    plural = "s" if len(hidden) > 1 else ""
    return f"{len(hidden)} more row{plural}{under} (incident.json lists them all)."


def drawn_figures(plots: Sequence[tuple[str, Callable[[Path], Path]]], redraw: str) -> list[Figure]:
    """Each ``(title, plot)`` drawn to a temporary PNG. A figure that cannot be drawn is a
    visible note naming why and how to get it (``redraw``: the command that writes the page
    again), never a silent gap."""
    if importlib.util.find_spec("matplotlib") is None:
        titles = ", ".join(title for title, _ in plots)
        missing = (
            f"Figures not drawn ({titles}): matplotlib is not installed here. Install it with "
            f"pip install 'stagefrontier[plot]', then {redraw}."
        )
        return [Figure(titles, note=missing)]
    out = []
    for title, plot in plots:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                png = plot(Path(tmp) / "figure.png").read_bytes()
        except Exception as exc:  # a figure must never cost the page
            logger.debug("stagefrontier: figure %r skipped: %s", title, exc)
            out.append(Figure(title, note=f"{title}: not drawn ({exc})."))
            continue
        out.append(Figure(title, png_base64=base64.b64encode(png).decode("ascii")))
    return out
