"""Optional packages: import one on demand, or fail with the extra that installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingExtraError


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` or raise MissingExtraError telling the user which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{what} needs the optional package {module.split('.')[0]!r}, which is not "
            f"importable ({exc}); install it with: pip install 'stagefrontier[{extra}]'"
        ) from exc
