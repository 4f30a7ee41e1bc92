"""Exception hierarchy: every error stagefrontier raises derives from one root, and every
exception class is defined here (the modules that raise them re-export them under their old
import paths)."""

from __future__ import annotations


class StageFrontierError(Exception):
    """Root of every error raised by stagefrontier."""


class DurationsError(StageFrontierError, ValueError):
    """The duration matrix has the wrong shape or holds NaN, infinite or negative values."""


class EmptyWindowError(DurationsError):
    """The window holds no steps, ranks or stages."""


class StageNamesError(StageFrontierError, ValueError):
    """The stage list does not match the matrix, is empty, or repeats a name."""


class RolesError(StageFrontierError, ValueError):
    """The roles are malformed: not one role per rank, a role outside the job's role set, or a
    device mesh that cannot give this rank a role."""


class SideEvidenceError(StageFrontierError, ValueError):
    """Side evidence (CUDA-event samples, accumulation info, telemetry errors) is malformed."""


class GatesError(StageFrontierError, ValueError):
    """A labeler gate of the wrong type or out of range, or an unknown gate name."""


class ReportFormatError(StageFrontierError, ValueError):
    """A serialized report, packet or input file is corrupt, truncated or of an unknown version."""


class NotJsonError(StageFrontierError, ValueError):
    """A line of a run's records that is not JSON at all (a record cut short, say), as opposed to
    JSON of the wrong shape (ReportFormatError). Deliberately not a ReportFormatError: the
    readers catch it first, to skip or recover a torn line."""


class SummaryError(StageFrontierError, ValueError):
    """A window summary that cannot be built, combined or analyzed as asked: summaries of
    different stages, step counts or settings, overlapping rank groups, or gates whose gain
    baseline the summary was not built for."""


class CompareError(StageFrontierError):
    """Two sides that cannot be compared (no windows, different schemas or world sizes)."""


class TraceFormatError(ReportFormatError):
    """A trace file is unreadable, of an unknown layout, or holds no usable step ranges."""


class MissingStagesError(TraceFormatError):
    """An ordered stage has no range at all on some rank: reducing would invent zeros."""


class MissingRanksError(TraceFormatError):
    """The job's world size names ranks that no trace file covers."""


class MisalignedStepsError(TraceFormatError):
    """The ranks' traces hold different step ids and strict alignment was asked for, or no step
    id is common to every rank."""


class AmbiguousStageOrderError(TraceFormatError):
    """No stage list was given and the trace's stage ranges run in different orders in different
    steps or ranks, so no one order can be inferred."""


class MissingDependencyError(StageFrontierError, ImportError):
    """An optional package a feature needs (a trace library, a sink's backend) is not installed."""


class MissingExtraError(MissingDependencyError):
    """An integration's optional package is missing; the message names the extra to install."""


class TimerSettingError(StageFrontierError, ValueError):
    """A StageTimer or CollectConfig argument of the wrong type or out of its range."""


class SinkSettingError(StageFrontierError, ValueError):
    """A sink's argument of the wrong type or out of its range."""


class ContractViolation(StageFrontierError):
    """A misuse of the timer's contexts (nesting, order, an unknown stage), raised instead of
    counted when the timer is strict."""


class NoStoreError(StageFrontierError):
    """A process with no store to reach: no process group, no store given, no
    MASTER_ADDR/MASTER_PORT (a single process). It has none for the rest of its run."""


class GlooProtocolError(StageFrontierError, RuntimeError):
    """A peer's header is not a stagefrontier header of this version: the group is out of step."""


class FaultSpecError(StageFrontierError, ValueError):
    """A --fault specification that does not parse."""


class DemoSettingsError(StageFrontierError, ValueError):
    """A demo setting it cannot run: ranks, steps or window below 1, more ranks than the demo
    spawns, an unknown sharding or an accumulation factor below 1."""


class DemoError(StageFrontierError, RuntimeError):
    """A demo rank failed or the run exceeded its deadline."""


class DeadlineExceeded(DemoError):
    """The run's ranks were still running at its deadline and were terminated."""
