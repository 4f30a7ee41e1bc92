"""``python -m stagefrontier.run SCRIPT [ARGS...]``: the script with the automatic hooks
installed first (``launch.worker``; ``stagefrontier run`` starts it in each torchrun worker)."""

from __future__ import annotations

from .launch.worker import main

if __name__ == "__main__":
    main()
