"""An ``.npz`` window: arrays ``d [steps, ranks, stages]`` (seconds) and ``stages``, optional
``roles``. Object arrays are refused, never unpickled."""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.analyzer import analyze
from ..analysis.window_report import WindowReport
from ..errors import ReportFormatError

_UNREADABLE = (zipfile.BadZipFile, zlib.error, ValueError, EOFError)


def load_npz(path: Path) -> WindowReport:
    """Analyze the window an ``.npz`` file holds.

    Raises:
        ReportFormatError: not a readable archive, an array missing, or names that are not a
            1-D array of strings; the analyzer's own errors for a bad matrix.
    """
    arrays = _npz_arrays(path, ("d", "stages", "roles"))
    for key in ("d", "stages"):
        if key not in arrays:
            raise ReportFormatError(f"{path}: the .npz file has no {key!r} array")
    stages = _names(arrays["stages"], path, "stages")
    roles = _names(arrays["roles"], path, "roles") if "roles" in arrays else None
    return analyze(arrays["d"], stages, roles=roles)


def _npz_arrays(path: Path, keys: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
    """The named arrays present in an .npz archive."""
    try:
        loaded = np.load(path, allow_pickle=False)
    except _UNREADABLE as exc:
        raise ReportFormatError(f"{path}: not a readable .npz window: {exc}") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ReportFormatError(f"{path}: a single .npy array, not an .npz window")
    try:
        with loaded as npz:
            return {key: npz[key] for key in keys if key in npz.files}
    except _UNREADABLE as exc:
        raise ReportFormatError(f"{path}: not a readable .npz window: {exc}") from None


def _names(arr: np.ndarray[Any, Any], path: Path, key: str) -> list[str]:
    if arr.ndim != 1 or arr.dtype.kind not in "US":
        raise ReportFormatError(f"{path}: {key!r} must be a 1-D array of strings")
    return [x.decode() if isinstance(x, bytes) else str(x) for x in arr.tolist()]
