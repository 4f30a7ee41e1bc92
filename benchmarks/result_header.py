"""The opening lines every ``benchmarks/results/*.md`` file shares: title, command, date."""

from __future__ import annotations

import datetime as dt


def result_header(title: str, command: str) -> list[str]:
    """Markdown lines from the title down to the "Environment:" heading."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [
        f"# {title}",
        "",
        "Produced by:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Date: {now}",
        "",
        "Environment:",
        "",
    ]
