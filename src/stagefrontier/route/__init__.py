"""The profiler router: an actionable window captures a trace on the suspect rank, by itself.

Rank 0 decides after analyzing a window (``decide``: a window with a confident leader, or one
the live regression check flagged), writes one capture request to the job's store
(``requests``); the named ranks profile the agreed steps (``capture``); rank 0 confirms the
traces against the live signal (``confirm``), ranks the operators inside the routed stage
(``opdiff``; both run from ``reduction``, live or offline) and writes the incident
(``incident``, ``html``). ``coordinator`` runs rank 0's side, a consumer of the analysis
thread: ``policy`` decides (and keeps the cooldown and the budget), ``capture_session`` does
the store's reads and writes and settles the answers, ``incident_writer`` reduces and writes.
``router`` holds the public configuration and each rank's thread.
"""

from ..formats.incident import list_incidents, read_incident
from ..render.incident import summary_line
from .router import ProfilerRouter, RouterRuntime

__all__ = ["ProfilerRouter", "RouterRuntime", "list_incidents", "read_incident", "summary_line"]
