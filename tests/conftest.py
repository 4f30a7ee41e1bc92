"""What several test files share, made once per session (per worker under pytest-xdist): the
committed real profiler traces (tests/data/traces, readable without torch).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trace_support import trace


@pytest.fixture(scope="session")
def gloo_dir() -> Path:
    """The committed traces of a real 2-rank Gloo DDP job (``trace_support``), one per rank."""
    return trace("gloo-2-ranks")


@pytest.fixture(scope="session")
def single() -> Path:
    """The committed trace of one profiled process, four steps (``trace_support``)."""
    return trace("single-4-steps.json")
