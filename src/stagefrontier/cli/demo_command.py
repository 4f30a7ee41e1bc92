"""``demo``: the command line's options made a ``DemoConfig``, run by ``demo.command.run_demo``."""

from __future__ import annotations

import argparse

from ..errors import StageFrontierError
from .common import EXIT_OK


def handle_demo(args: argparse.Namespace) -> int:
    try:
        from ..demo.command import run_demo
        from ..demo.train import DemoConfig
    except ImportError as exc:
        raise StageFrontierError(
            f"the demo needs torch ({exc}); install it, e.g. pip install torch"
        ) from None
    settings = DemoConfig(
        ranks=args.ranks,
        steps=args.steps,
        window=args.window,
        seed=args.seed,
        out_dir=args.out,
        router=args.router,
    )
    run_demo(settings, args.fault)
    return EXIT_OK
