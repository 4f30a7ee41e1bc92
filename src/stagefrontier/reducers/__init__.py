"""Reducers: profiler traces to the analyzer's ordered stage matrix ``d [N, R, S]``.

Each reducer reads one trace format, finds every rank's step ranges and the ranges named like the
ordered stages on the training thread, and applies the recorder's residual rule, so that a trace
and the always-on signal are scored by the same analyzer on the same terms:

* ``reduce_kineto``: PyTorch Profiler Chrome traces (``.json``/``.json.gz``, files or a folder);
* ``reduce_hta``: the same traces through Holistic Trace Analysis' dataframes (optional extra
  ``stagefrontier[hta]``);
* ``reduce_nsys``: Nsight Systems SQLite exports (``nsys export --type sqlite``), NVTX ranges.

All return a ``ReducedTrace``; ``ReducedTrace.analyze()`` runs the one analyzer. They share one
``TraceOptions`` record (pass it as ``options=``, or its fields as keywords). Without a stage list
they infer the stages from the ranges on the step thread (``infer.py``). Nothing here imports
torch; ``reduce_hta`` imports ``hta`` only when called.
"""

from ..analysis.schema import STEP_ANNOTATION
from . import errors
from .errors import *  # noqa: F403  (the trace errors, listed once in errors.__all__)
from .hta import reduce_hta
from .kineto import reduce_kineto
from .nsys import reduce_nsys
from .options import TraceOptions
from .result import ReducedTrace

__all__ = [
    "STEP_ANNOTATION",
    *errors.__all__,
    "ReducedTrace",
    "TraceOptions",
    "reduce_hta",
    "reduce_kineto",
    "reduce_nsys",
]
