"""The reducers' shared options: the keyword and the ``TraceOptions`` call forms are one call, and
a misspelled or misplaced option is refused. Nsight exports built with the export's schema."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stagefrontier import TraceOptions, reduce_kineto, reduce_nsys
from stagefrontier.reducers import TraceFormatError
from test_reducers_nsys import two_ranks


def test_keywords_and_an_options_record_reduce_alike(tmp_path: Path) -> None:
    two_ranks(tmp_path)
    by_keywords = reduce_nsys(tmp_path, world_size=2, align="strict")
    by_record = reduce_nsys(tmp_path, options=TraceOptions(world_size=2, align="strict"))
    np.testing.assert_array_equal(by_keywords.d, by_record.d)
    assert by_keywords.world_size == by_record.world_size == 2
    # a keyword overrides the record's field
    assert (
        reduce_nsys(tmp_path, options=TraceOptions(world_size=2), world_size=None).world_size
        is None
    )


def test_unknown_and_misplaced_options_are_refused(tmp_path: Path) -> None:
    two_ranks(tmp_path)
    with pytest.raises(TypeError, match="unexpected keyword argument 'missing_rank'"):
        reduce_nsys(tmp_path, missing_rank="allow")
    with pytest.raises(TypeError, match="only reduce_hta"):
        reduce_nsys(tmp_path, ns_rounding=True)
    with pytest.raises(TypeError, match="only reduce_nsys"):
        reduce_kineto(tmp_path, process_ranks={1: 0})
    with pytest.raises(TraceFormatError, match="align must be one of intersect, strict"):
        TraceOptions(align="loose")
