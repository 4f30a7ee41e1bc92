"""The ``stagefrontier`` command line: ``main`` (the console script) and ``build_parser``; one
module per family of subcommands (``window_commands``, ``run_commands``, ``demo_command``,
``router_commands``), what they share in ``common``."""

from .demo_command import DEMO_EXAMPLES
from .main import build_parser, main

__all__ = ["DEMO_EXAMPLES", "build_parser", "main"]
