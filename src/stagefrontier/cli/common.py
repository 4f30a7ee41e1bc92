"""What the subcommands share: the handler's type, the exit statuses, the warning line and the
parsers of option values several subcommands take."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TypeAlias

from ..errors import StageFrontierError
from ..render.escape import printable

Handler = Callable[[argparse.Namespace], int]
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ERROR = 2


def warn(message: str) -> None:
    """One warning line on stderr."""
    print(f"stagefrontier: warning: {printable(message)}", file=sys.stderr)


def int_pair(text: str, sep: str, option: str, form: str) -> tuple[int, int]:
    """``A<sep>B`` as two ints."""
    first, found, last = text.partition(sep)
    if not found or not first.isdigit() or not last.isdigit():
        raise StageFrontierError(f"bad {option} {text!r}: expected {form}")
    return int(first), int(last)


def window_option(text: str | None) -> tuple[int | None, int | None]:
    """``--window``: (window, attempt); the attempt only when written ``ATTEMPT/N``."""
    if text is None:
        return None, None
    if "/" in text:
        attempt, window = int_pair(text, "/", "--window", "N or ATTEMPT/N")
        return window, attempt
    if not text.isdigit():
        raise StageFrontierError(f"bad --window {text!r}: expected N or ATTEMPT/N")
    return int(text), None


def stage_list(text: str | None) -> list[str] | None:
    """``--stages A,B,...``: the names, or None when the option is not given; a list that names
    no stage (``,,``) is refused."""
    if text is None:
        return None
    stages = [s.strip() for s in text.split(",") if s.strip()]
    if not stages:
        raise StageFrontierError(f"--stages {text!r} names no stage: expected A,B,...")
    return stages
