"""``python -m stagefrontier.cli``: the ``stagefrontier`` command."""

import sys

from .main import main

sys.exit(main())
