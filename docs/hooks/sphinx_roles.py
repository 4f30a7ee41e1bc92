"""MkDocs hook: Sphinx roles in the docstrings (``:class:`~pkg.Name```) read as plain code.

The docstrings are written for ``help()`` and editors, where a role such as ``:class:`` is
common; the API reference renders them as code spans with the role's prefix left over. This hook
drops the prefix (and, as Sphinx does for ``~``, keeps only the last dotted part).
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>(~?)([^<]*)</code>")


def _plain(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, page: Any, **_: Any) -> str:
    return ROLE.sub(_plain, html)
