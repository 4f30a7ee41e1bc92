"""The ``stagefrontier`` command line: ``main`` (the console script) and ``build_parser``; the
subcommands' parsers in ``parsers``, what they do in one module per family of subcommands
(``window_commands``, ``run_commands``, ``demo_command``, ``router_commands``), what those
share in ``common``."""

from .main import build_parser, main
from .parsers import DEMO_EXAMPLES

__all__ = ["DEMO_EXAMPLES", "build_parser", "main"]
