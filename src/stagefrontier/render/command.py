"""The ``stagefrontier`` command as a printed suggestion must spell it so that it runs.

After ``make demo`` the console script lives in the project's ``.venv/bin``, which is not on the
PATH of a shell that did not activate it: a bare ``stagefrontier incident DIR`` would then fail
with "command not found". Suggestions printed by the demo, the run report and an incident name
the command through ``cli_command``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

SCRIPT = "stagefrontier"


def cli_command() -> str:
    """``stagefrontier`` when that name on the PATH is this installation's script; else the
    script's path beside this Python (an environment that is not activated); else
    ``python -m stagefrontier.cli`` with this Python's path."""
    beside = Path(sys.executable).parent / SCRIPT
    found = shutil.which(SCRIPT)
    if found and beside.is_file() and _same(Path(found), beside):
        return SCRIPT
    if beside.is_file() and os.access(beside, os.X_OK):
        return shlex.quote(str(beside))
    if found and not beside.exists():  # installed elsewhere (a user install, pipx): trust PATH
        return SCRIPT
    return f"{shlex.quote(sys.executable)} -m stagefrontier.cli"


def _same(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False
