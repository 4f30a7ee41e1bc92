"""Capture requests and their answers in the job's c10d store.

Keys sit under the same attempt prefix as the window keys (``stagefrontier/<run>/<restart>``, see
``collect.store.store_prefix``), so a restarted attempt never acts on the previous attempt's
request:

* ``route/request``: the one open request (JSON: id, ranks, first step, step count, stage);
* ``route/status/<id>/r<rank>``: a named rank's answer (captured, skipped or failed, with the
  trace path, its size and host);
* ``route/manual``: the slot for a request from outside the job (``stagefrontier capture``):
  a client fills it only while it is empty (compare-and-set), rank 0 empties it when it reads
  the request, and answers in ``route/manual/answer/<request id>`` (the incident folder, or why
  the request was refused), so two clients never read each other's answer.

Rank 0 deletes the request and the answers when the incident closes. Every value is small JSON,
validated field by field on read (types, ranges, ids as plain names); nothing is unpickled.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, TypeVar

from ..analysis.values import is_int, is_real
from ..errors import ReportFormatError
from ..formats.limits import MAX_CAPTURE_STEPS as MAX_CAPTURE_STEPS  # defined there, used here
from ..formats.limits import MAX_NAMED_RANKS, MAX_STEP, MAX_TEXT, limit
from ..formats.names import plain_name

REQUEST_KEY = "route/request"
MANUAL_KEY = "route/manual"
MANUAL_ANSWER_PREFIX = "route/manual/answer/"
MAX_VALUE_BYTES = 64 << 10
"""A request or answer larger than this is rejected as corrupt before it is parsed."""


def status_key(request_id: str, rank: int) -> str:
    return f"route/status/{request_id}/r{rank}"


def manual_answer_key(request_id: str) -> str:
    return MANUAL_ANSWER_PREFIX + request_id


M = TypeVar("M", bound="StoreMessage")


@dataclass(frozen=True)
class StoreMessage:
    """A small JSON value in the job's store: ``encode`` writes its fields (tuples as lists),
    ``decode`` reads one back through the subclass's ``_read``, which checks every field;
    ``WHAT`` names the value in the errors."""

    WHAT: ClassVar[str]

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls: type[M], data: bytes) -> M:
        return cls._read(_load(data, cls.WHAT), cls.WHAT)

    @classmethod
    def _read(cls: type[M], obj: dict[str, Any], what: str) -> M:
        raise NotImplementedError


@dataclass(frozen=True)
class CaptureRequest(StoreMessage):
    """Capture ``steps`` steps from global step ``first_step`` on every rank in ``ranks``."""

    WHAT = "capture request"

    id: str
    ranks: tuple[int, ...]
    first_step: int
    steps: int
    stage: str | None = None

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1

    @classmethod
    def _read(cls, obj: dict[str, Any], what: str) -> CaptureRequest:
        return cls(
            id=plain_name(_field(obj, "id", what), f"{what} id"),
            ranks=ranks_field(_field(obj, "ranks", what), f"{what} ranks"),
            first_step=_int(obj, "first_step", what, 0, MAX_STEP),
            steps=_int(obj, "steps", what, 1, MAX_STEP),  # capped where it is captured
            stage=_text(obj, "stage", what, optional=True),
        )


@dataclass(frozen=True)
class CaptureStatus(StoreMessage):
    """A named rank's answer: ``state`` is ``captured``, ``skipped`` or ``failed``."""

    WHAT = "capture status"

    id: str
    rank: int
    state: str
    reason: str = ""
    path: str = ""
    size: int = 0
    host: str = ""
    first_step: int = -1
    last_step: int = -1
    export_cpu_s: float = 0.0
    """CPU seconds the rank's router thread spent writing the trace."""
    training_s: float = 0.0
    """Seconds the capture took on the rank's training thread (starting, stopping and
    restarting the profiler, its ranges): what the window's self-cost calls the profiler
    capture."""

    @classmethod
    def _read(cls, obj: dict[str, Any], what: str) -> CaptureStatus:
        return cls(
            id=plain_name(_field(obj, "id", what), f"{what} id"),
            rank=_int(obj, "rank", what, 0, limit("world_size") - 1),
            state=_state(obj, what, ("captured", "skipped", "failed")),
            reason=_text(obj, "reason", what, default=""),
            path=_text(obj, "path", what, default=""),
            size=_int(obj, "size", what, 0, 2**62, default=0),
            host=_text(obj, "host", what, default=""),
            first_step=_int(obj, "first_step", what, -1, MAX_STEP, default=-1),
            last_step=_int(obj, "last_step", what, -1, MAX_STEP, default=-1),
            export_cpu_s=_seconds(obj, "export_cpu_s", what),
            training_s=_seconds(obj, "training_s", what),
        )


@dataclass(frozen=True)
class ManualRequest(StoreMessage):
    """A request from outside the job: which ranks, how many steps, optionally the stage.
    ``id`` (a plain name the client chose) keys the answer; a request made in rank 0's own
    process (``ProfilerRouter.request_capture``) has none and gets no answer."""

    WHAT = "manual capture request"

    ranks: tuple[int, ...]
    steps: int
    stage: str | None = None
    id: str | None = None

    @classmethod
    def _read(cls, obj: dict[str, Any], what: str) -> ManualRequest:
        return cls(
            ranks=ranks_field(_field(obj, "ranks", what), f"{what} ranks"),
            steps=_int(obj, "steps", what, 1, MAX_STEP),  # capped where it is scheduled
            stage=_text(obj, "stage", what, optional=True),
            id=plain_name(_field(obj, "id", what), f"{what} id"),
        )


@dataclass(frozen=True)
class ManualAnswer(StoreMessage):
    """Rank 0's answer to one manual request: ``opened`` (``text`` is the incident folder) or
    ``refused`` (``text`` says why)."""

    WHAT = "manual capture answer"

    id: str
    state: str
    text: str

    @classmethod
    def _read(cls, obj: dict[str, Any], what: str) -> ManualAnswer:
        return cls(
            id=plain_name(_field(obj, "id", what), f"{what} id"),
            state=_state(obj, what, ("opened", "refused")),
            text=_text(obj, "text", what, default=""),
        )


def ranks_field(value: Any, what: str) -> tuple[int, ...]:
    """A non-empty list of at most ``MAX_NAMED_RANKS`` rank numbers within the world size
    limit, duplicates dropped (first kept)."""
    top = limit("world_size") - 1
    if (
        not isinstance(value, list)
        or not 0 < len(value) <= MAX_NAMED_RANKS
        or not all(is_int(r) and 0 <= r <= top for r in value)
    ):
        raise ReportFormatError(
            f"{what} must be a list of 1 to {MAX_NAMED_RANKS} ranks in 0..{top}: {str(value)[:60]}"
        )
    return tuple(dict.fromkeys(int(r) for r in value))


ABSENT = "\x00stagefrontier: no such key"
"""What ``read_key`` asks ``compare_set`` to expect: no JSON value (nor any value this package
writes) starts with a NUL byte, so a store never holds it."""


def read_key(store: Any, key: str) -> bytes | None:
    """The value of ``key`` in ``store``, or None when it has none, in one request that never
    waits. A ``check`` then a ``get`` is two requests: a key deleted between them (rank 0
    closing an incident) leaves the ``get`` waiting for the store's whole timeout.
    ``compare_set(key, ABSENT, ABSENT)`` answers the value held without changing it, and
    ``ABSENT`` itself when there is none (c10d's TCP, file and hash stores alike)."""
    value = bytes(store.compare_set(key, ABSENT, ABSENT))
    return None if value == ABSENT.encode() else value


def _load(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > MAX_VALUE_BYTES:
        raise ReportFormatError(f"{what} of {len(data)} bytes exceeds {MAX_VALUE_BYTES}")
    try:
        obj = json.loads(bytes(data).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportFormatError(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise ReportFormatError(f"{what} is nested too deeply to be a request") from None
    if not isinstance(obj, dict):
        raise ReportFormatError(f"{what} must be a JSON object")
    return obj


_MISSING = object()


def _field(obj: dict[str, Any], key: str, what: str, default: Any = _MISSING) -> Any:
    if key in obj:
        return obj[key]
    if default is _MISSING:
        raise ReportFormatError(f"{what} lacks {key!r}")
    return default


def _int(
    obj: dict[str, Any], key: str, what: str, low: int, high: int, default: Any = _MISSING
) -> int:
    value = _field(obj, key, what, default)
    if not is_int(value) or not low <= value <= high:
        raise ReportFormatError(f"{what} {key!r} must be an integer in {low}..{high}")
    return int(value)


def _state(obj: dict[str, Any], what: str, states: tuple[str, ...]) -> str:
    """The ``state`` field: one of ``states``."""
    value = _field(obj, "state", what)
    if value not in states:
        raise ReportFormatError(f"unknown {what} state {str(value)[:40]!r}")
    return str(value)


MAX_SECONDS = 86400.0


def _seconds(obj: dict[str, Any], key: str, what: str) -> float:
    """A duration in seconds, 0 when absent (answers written before the field)."""
    value = _field(obj, key, what, 0.0)
    if not is_real(value) or not 0 <= value <= MAX_SECONDS:
        raise ReportFormatError(f"{what} {key!r} must be a number of seconds in 0..{MAX_SECONDS}")
    return float(value)


def _text(
    obj: dict[str, Any],
    key: str,
    what: str,
    *,
    optional: bool = False,
    default: Any = _MISSING,
) -> Any:
    value = _field(obj, key, what, None if optional else default)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ReportFormatError(f"{what} {key!r} must be text of at most {MAX_TEXT} characters")
    return value


class RequestChannel:
    """This rank's private store connection for requests (opened lazily on the router thread,
    never on the training thread). Every call may raise; callers downgrade."""

    def __init__(
        self,
        store: Any = None,
        prefix: str | None = None,
        scope: int = 0,
        open_raw: Callable[[], Any] | None = None,
    ) -> None:
        """``prefix``: the keys' prefix; by default this attempt's, with the router's key
        ``scope`` (``collect.store.store_prefix``: the k-th router open in a process meets the
        k-th of every other rank, so a training and an evaluation timer's routers never read
        each other's requests). ``open_raw``: opens the store the keys live in (a node's store,
        see ``route.relay``); by default a clone of ``store``, the job's."""
        self.base = store
        self._prefix = prefix
        self.scope = scope
        self._open_raw = open_raw
        self._conn: Any = None

    def conn(self) -> Any:
        if self._conn is None:
            from torch.distributed import PrefixStore

            from ..collect.store import open_connection, store_prefix

            prefix = self._prefix or store_prefix(self.scope)
            raw = self._open_raw() if self._open_raw else open_connection(self.base)
            self._conn = PrefixStore(prefix, raw)
        return self._conn

    def read(self, key: str) -> bytes | None:
        """``key``'s value, None when it has none (``read_key``: atomic, never waits)."""
        return read_key(self.conn(), key)

    def write(self, key: str, value: bytes) -> None:
        self.conn().set(key, value)

    def delete(self, *keys: str) -> None:
        conn = self.conn()
        for key in keys:
            conn.delete_key(key)

    def close(self) -> None:
        self._conn = None
