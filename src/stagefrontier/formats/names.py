"""Which names read from an input may become part of a path.

A capture request's id, an incident's id and a run id come from the job's store or from files
anyone can edit; each becomes a folder or file name (``out_dir/incidents/<id>``). Only a plain
name is taken: anything that could leave its folder (a separator, ``..``), hide (a leading dot),
read as an option (a leading dash) or carry a control character is refused.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import ReportFormatError

PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""Letters, digits, ``.``, ``_`` and ``-``, starting with a letter or a digit, at most 100."""


def is_plain_name(value: Any) -> bool:
    return isinstance(value, str) and PLAIN_NAME.fullmatch(value) is not None


def plain_name(value: Any, what: str) -> str:
    """``value`` when it is a plain name, else a ReportFormatError naming ``what``."""
    if not is_plain_name(value):
        raise ReportFormatError(
            f"{what} {str(value)[:40]!r} is not a plain name (letters, digits, '.', '_', '-'; "
            "at most 100, starting with a letter or digit)"
        )
    return str(value)
