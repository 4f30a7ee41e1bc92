"""How tests run the installed ``stagefrontier`` command."""

from __future__ import annotations

import sys
from pathlib import Path


def console_script() -> list[str]:
    """The console script next to this interpreter, or ``python -m stagefrontier.cli``."""
    script = Path(sys.executable).with_name("stagefrontier")
    return [str(script)] if script.exists() else [sys.executable, "-m", "stagefrontier.cli"]
