"""An ``.npz`` window: arrays ``d [steps, ranks, stages]`` (seconds) and ``stages``, optional
``roles``. Object arrays are refused, never unpickled."""

from __future__ import annotations

import math
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.analyzer import analyze
from ..analysis.window_report import WindowReport
from ..errors import ReportFormatError
from .limits import check_limit

_UNREADABLE = (
    zipfile.BadZipFile,
    zlib.error,
    ValueError,
    EOFError,
    OSError,
    RuntimeError,
    NotImplementedError,
)
"""What zipfile and numpy raise on a corrupt, encrypted or oddly compressed archive."""
_NPY_MAGIC = b"\x93NUMPY"


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
    """The named arrays present in an .npz archive, each header checked before its array is read."""
    with path.open("rb") as handle:
        if handle.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
            raise ReportFormatError(f"{path}: a single .npy array, not an .npz window")
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            return {
                key: _member(archive, archive.getinfo(f"{key}.npy"), path)
                for key in keys
                if f"{key}.npy" in names
            }
    except ReportFormatError:
        raise
    except _UNREADABLE as exc:
        raise ReportFormatError(f"{path}: not a readable .npz window: {exc}") from None


def _member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> np.ndarray[Any, Any]:
    """One array of the archive, refused before reading when its header declares an object
    dtype, more cells than the limit, or more bytes than its compressed size can hold."""
    label = f"{path}: {info.filename}"
    with archive.open(info) as handle:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
        else:
            raise ReportFormatError(f"{label}: unsupported .npy version {version}")
    if dtype.hasobject:
        raise ReportFormatError(
            f"{label}: not a readable .npz window: an object array (never unpickled)"
        )
    cells = math.prod(shape)
    check_limit("cells", cells, f"{label} declares shape {list(shape)}")
    nbytes = cells * dtype.itemsize
    if info.compress_type != zipfile.ZIP_STORED:
        check_limit("inflate_ratio", nbytes // max(info.compress_size, 1), f"{label} inflates")
    if nbytes > info.file_size:
        raise ReportFormatError(
            f"{label}: declares shape {list(shape)} ({nbytes} bytes) but holds {info.file_size}"
        )
    with archive.open(info) as handle:
        array: np.ndarray[Any, Any] = np.lib.format.read_array(handle, allow_pickle=False)
    return array


def _names(arr: np.ndarray[Any, Any], path: Path, key: str) -> list[str]:
    if arr.ndim != 1 or arr.dtype.kind not in "US":
        raise ReportFormatError(f"{path}: {key!r} must be a 1-D array of strings")
    return [x.decode() if isinstance(x, bytes) else str(x) for x in arr.tolist()]
