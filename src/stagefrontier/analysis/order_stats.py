"""Order statistics along the last axis of a scratch buffer, without a full sort.

The analyzer needs two order statistics of a step's prefixes over thousands of ranks (and, for
the cohort-median gain, of its stage times): the median and the second largest. One partition
around the middle puts the upper median in place and the lower half below it; the lower median
is then the largest of the lower half, and the two largest values lie in the upper half. The
values are the ones a full sort would put at those positions, so every result equals the
sorted one exactly, ties included. (A rank's stage times over a window's steps are few: there
numpy's sort is faster and stays.)
"""

from __future__ import annotations

import numpy as np

from .accounting import FloatArray


def partitioned_median(lanes: FloatArray) -> FloatArray:
    """The median of each lane of ``lanes [..., K]``, partitioning ``lanes`` in place.

    Afterwards position ``K // 2`` of every lane holds its sorted value, smaller or equal values
    sit before it and larger or equal ones after it (``second_largest`` relies on this).
    """
    k = lanes.shape[-1]
    half = k // 2
    lanes.partition(half, axis=-1)
    upper = lanes[..., half]
    if k % 2:
        return upper.copy()
    lower = lanes[..., :half].max(axis=-1)
    return np.asarray(0.5 * (lower + upper))


def second_largest(partitioned: FloatArray) -> FloatArray:
    """The second largest value of each lane (``K >= 2``) of a buffer that
    ``partitioned_median`` has partitioned; one value of each lane is overwritten."""
    half = partitioned.shape[-1] // 2
    upper = partitioned[..., half:]
    if upper.shape[-1] == 1:  # K == 2: the other value is the only one below the middle
        return partitioned[..., 0].copy()
    # One largest value is set aside and the rest of the upper half searched again. The argmax
    # runs over whole lanes: on the upper halves (a strided view) numpy would copy them first.
    # A largest value it finds below the middle equals the one at the middle, which stays.
    first = partitioned.argmax(axis=-1)[..., None]
    np.put_along_axis(partitioned, first, -np.inf, axis=-1)
    return np.asarray(upper.max(axis=-1))
