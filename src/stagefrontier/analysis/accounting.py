"""Max-prefix frontier accounting: prefixes, frontier, advances, shares, slack and bounds.

Arrays follow one convention: ``d[t, r, s]`` is the duration in seconds of ordered stage ``s`` on
rank ``r`` in step ``t`` (shape ``[N, R, S]``). Internally the prefixes are kept rank-last
(``[N, S, R]``) so that every reduction over ranks runs over contiguous memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import DurationsError, EmptyWindowError
from .schema import check_stage_names

FloatArray = npt.NDArray[np.float64]


def as_window(d: Any, stages: Iterable[str] | None = None) -> FloatArray:
    """Validate a duration window and return it as a float64 ``[N, R, S]`` array.

    Raises a DurationsError subclass naming the problem: a complex, text or other non-real
    array, wrong number of axes, an empty axis, NaN, infinite or negative values, or values
    whose sum overflows float64 (every prefix, frontier and share is a partial sum of them).
    With ``stages`` given, the names are checked against the stage axis as well. Every
    analysis entry point (the analyzer, the baselines) goes through here.
    """
    arr = _real_array(d)
    if arr.ndim != 3:
        raise DurationsError(
            f"durations must have 3 axes [steps, ranks, stages], got shape {arr.shape}"
        )
    n, r, s = arr.shape
    if n == 0 or r == 0 or s == 0:
        raise EmptyWindowError(
            f"empty window: shape {arr.shape} (steps={n}, ranks={r}, stages={s}); "
            "a window needs at least one step, one rank and one stage"
        )
    names = None if stages is None else check_stage_names(stages, expected=s)
    # Two reductions detect every bad value: NaN and -inf make the minimum NaN or negative, and
    # +inf, or finite values too large to add up, make the total infinite. Every sum the
    # analysis takes is bounded by that total, so none of them can overflow afterwards.
    with np.errstate(over="ignore"):
        total = arr.sum()
    if not arr.min() >= 0.0 or not np.isfinite(total):
        _raise_bad_value(arr, names)
    return np.ascontiguousarray(arr)


_REAL_KINDS = frozenset("biufO")
"""numpy dtype kinds read as durations: bool, integers, floats, and objects (Python numbers)."""


def _real_array(d: Any) -> FloatArray:
    """``d`` as float64; a complex or text array is refused rather than cast (numpy would drop
    the imaginary part with only a warning, or parse the text)."""
    try:
        raw = np.asarray(d)
        arr = raw.astype(np.float64, copy=False) if raw.dtype.kind in _REAL_KINDS else None
    except (TypeError, ValueError) as exc:
        raise DurationsError(f"durations are not a numeric array: {exc}") from None
    if arr is None:
        lost = " (casting would drop the imaginary part)" if raw.dtype.kind == "c" else ""
        raise DurationsError(
            f"durations must be a numeric array of real numbers, got dtype {raw.dtype}{lost}"
        )
    return arr


def _raise_bad_value(arr: FloatArray, stages: Sequence[str] | None) -> None:
    for test, what in ((np.isnan, "NaN"), (np.isinf, "infinite"), (lambda x: x < 0, "negative")):
        bad = np.argwhere(test(arr))
        if len(bad):
            t, r, s = (int(i) for i in bad[0])
            name = f" ({stages[s]!r})" if stages is not None else ""
            raise DurationsError(
                f"{len(bad)} {what} duration(s); first at step {t}, rank {r}, stage {s}{name}: "
                f"{arr[t, r, s]!r}. Durations must be finite and >= 0 seconds"
            )
    raise DurationsError(
        f"durations are finite but their sum overflows float64 (largest {float(arr.max())!r} s): "
        "step times cannot be added up, so no frontier can be computed"
    )


def rank_last_prefixes(d: FloatArray) -> FloatArray:
    """Prefix sums ``P[t, s, r] = sum_{j<=s} d[t, r, j]``, laid out ``[N, S, R]``."""
    prefix = d.transpose(0, 2, 1).copy()  # always a copy: it is summed in place
    for j in range(1, prefix.shape[1]):
        prefix[:, j, :] += prefix[:, j - 1, :]
    return prefix


def advances_from_frontier(front: FloatArray) -> FloatArray:
    """Frontier advances ``a[t, s] = F[t, s] - F[t, s-1]`` with ``F[t, 0] = 0``."""
    return np.diff(front, axis=1, prepend=0.0)


def prefixes(d: Any) -> FloatArray:
    """Rank-local prefixes ``P[t, r, s]`` in the public ``[N, R, S]`` layout."""
    return np.cumsum(as_window(d), axis=2)


def frontier(d: Any) -> FloatArray:
    """The max-prefix frontier ``F[t, s] = max_r P[t, r, s]``, shape ``[N, S]``."""
    front: FloatArray = rank_last_prefixes(as_window(d)).max(axis=2)
    return front


def advances(d: Any) -> FloatArray:
    """Per-step frontier advances ``a[t, s]``; they sum over ``s`` to ``F[t, S]`` exactly."""
    return advances_from_frontier(frontier(d))


def slack(d: Any) -> FloatArray:
    """Slack ``lambda[t, r, s] = F[t, s-1] - P[t, r, s-1]`` (zero at the first stage).

    Shape ``[N, R, S]``.

    It satisfies ``a[t, s] = max_r (d[t, r, s] - lambda[t, r, s])``: a rank that reached the
    previous boundary early has its next stage discounted by the time it owed the group.
    """
    arr = as_window(d)
    prefix = np.cumsum(arr, axis=2)
    front = prefix.max(axis=1, keepdims=True)
    lam = np.zeros_like(arr)
    lam[:, :, 1:] = front[:, :, :-1] - prefix[:, :, :-1]
    return lam


def window_shares(step_advances: FloatArray, floor_s: float) -> tuple[FloatArray, float, bool]:
    """Window shares ``A_s = sum_t a[t, s] / sum_t F[t, S]``.

    Returns (shares, exposed seconds, defined). Below ``floor_s`` exposed seconds the shares are
    not defined: zeros are returned with ``defined=False`` and callers report raw advances.
    """
    totals = step_advances.sum(axis=0)
    exposed = float(step_advances.sum())
    if exposed <= floor_s:
        return np.zeros_like(totals), exposed, False
    return totals / exposed, exposed, True


def stage_sum_bounds(d: Any) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per step: exposed time ``F[t,S]``, per-stage-max sum ``M_t``, per-stage-mean sum ``Mbar_t``.

    They satisfy ``F <= M <= min(R, S) F`` and ``F / R <= Mbar <= F``.
    """
    arr = as_window(d)
    exposed = arr.sum(axis=2).max(axis=1)
    return exposed, arr.max(axis=1).sum(axis=1), arr.mean(axis=1).sum(axis=1)
