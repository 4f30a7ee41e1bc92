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

Rank 0 deletes the request and the answers when the incident closes. Every value is small JSON
read strictly into its typed record (``formats.typed``: types, ranges, ids as plain names, a
size and a nesting limit); nothing is unpickled. The records' JSON Schemas are in
``docs/schemas``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec

from ..errors import NoStoreError, ReportFormatError
from ..formats.limits import MAX_CAPTURE_STEPS as MAX_CAPTURE_STEPS  # defined there, used here
from ..formats.limits import MAX_NAMED_RANKS, MAX_STEP
from ..formats.typed import Count, PlainName, Rank, Step, Text, check_ranks, decode, encode

REQUEST_KEY = "route/request"
MANUAL_KEY = "route/manual"
MANUAL_ANSWER_PREFIX = "route/manual/answer/"
MAX_VALUE_BYTES = 64 << 10
"""A request or answer larger than this is rejected as corrupt before it is parsed."""
MAX_SECONDS = 86400.0

Ranks = Annotated[tuple[Rank, ...], msgspec.Meta(min_length=1, max_length=MAX_NAMED_RANKS)]
"""1 to ``MAX_NAMED_RANKS`` rank numbers (within the world size limit; duplicates dropped)."""
StepCount = Annotated[int, msgspec.Meta(ge=1, le=MAX_STEP)]
"""Steps to capture; capped at ``MAX_CAPTURE_STEPS`` where they are captured or scheduled."""
StepOrNone = Annotated[int, msgspec.Meta(ge=-1, le=MAX_STEP)]
"""A step number, or -1 for none."""
Seconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
CaptureState = Literal["captured", "skipped", "failed"]


def status_key(request_id: str, rank: int) -> str:
    return f"route/status/{request_id}/r{rank}"


def manual_answer_key(request_id: str) -> str:
    return MANUAL_ANSWER_PREFIX + request_id


M = TypeVar("M", bound="StoreMessage")


class StoreMessage(msgspec.Struct, frozen=True):
    """A small JSON value in the job's store: ``encode`` writes its fields (tuples as lists),
    ``decode`` reads one back strictly as its declared types; ``WHAT`` names the value in the
    errors."""

    WHAT: ClassVar[str]

    def encode(self) -> bytes:
        return encode(self)

    @classmethod
    def decode(cls: type[M], data: bytes) -> M:
        """Raises ReportFormatError naming the field that is wrong."""
        return decode(data, cls, cls.WHAT, MAX_VALUE_BYTES)


def _unique_ranks(message: CaptureRequest | ManualRequest) -> None:
    check_ranks(message.ranks, "ranks")
    msgspec.structs.force_setattr(message, "ranks", tuple(dict.fromkeys(message.ranks)))


class CaptureRequest(StoreMessage, frozen=True):
    """Capture ``steps`` steps from global step ``first_step`` on every rank in ``ranks``."""

    WHAT: ClassVar[str] = "capture request"

    id: PlainName
    ranks: Ranks
    first_step: Step
    steps: StepCount
    stage: Text | None = None

    def __post_init__(self) -> None:
        _unique_ranks(self)

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1


class CaptureStatus(StoreMessage, frozen=True):
    """A named rank's answer: ``state`` is ``captured``, ``skipped`` or ``failed``."""

    WHAT: ClassVar[str] = "capture status"

    id: PlainName
    rank: Rank
    state: CaptureState
    reason: Text = ""
    path: Text = ""
    size: Count = 0
    host: Text = ""
    first_step: StepOrNone = -1
    last_step: StepOrNone = -1
    export_cpu_s: Seconds = 0.0
    """CPU seconds the rank's router thread spent writing the trace."""
    training_s: Seconds = 0.0
    """Seconds the capture took on the rank's training thread (starting, stopping and
    restarting the profiler, its ranges): what the window's self-cost calls the profiler
    capture."""

    def __post_init__(self) -> None:
        check_ranks((self.rank,), "rank")


class ManualRequest(StoreMessage, frozen=True):
    """A request from outside the job: which ranks, how many steps, optionally the stage.
    ``id`` (a plain name the client chose) keys the answer; a request made in rank 0's own
    process (``ProfilerRouter.request_capture``) has none and gets no answer."""

    WHAT: ClassVar[str] = "manual capture request"

    ranks: Ranks
    steps: StepCount
    stage: Text | None = None
    id: PlainName | None = None

    def __post_init__(self) -> None:
        _unique_ranks(self)

    @classmethod
    def decode(cls, data: bytes) -> ManualRequest:
        """A request read from the store names the id its answer goes to."""
        request = super().decode(data)
        if request.id is None:
            raise ReportFormatError(f"{cls.WHAT} lacks 'id'")
        return request


class ManualAnswer(StoreMessage, frozen=True):
    """Rank 0's answer to one manual request: ``opened`` (``text`` is the incident folder) or
    ``refused`` (``text`` says why)."""

    WHAT: ClassVar[str] = "manual capture answer"

    id: PlainName
    state: Literal["opened", "refused"]
    text: Text = ""


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
        self._no_store: str | None = None  # why the process has no store (it never gets one)

    def conn(self) -> Any:
        if self._no_store is not None:
            raise NoStoreError(self._no_store)
        if self._conn is None:
            from torch.distributed import PrefixStore

            from ..collect.store import store_prefix
            from ..collect.store_client import QuietStore

            prefix = self._prefix or store_prefix(self.scope)
            try:
                raw = self._open_raw() if self._open_raw else self._open_job()
            except NoStoreError as exc:
                self._no_store = str(exc)
                raise
            self._conn = QuietStore(PrefixStore(prefix, raw))
        return self._conn

    def _open_job(self) -> Any:
        """A connection to the job's store (a dead one's is refused at once: ``open_connection``
        probes its address first)."""
        from ..collect.store import open_connection

        return open_connection(self.base)

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
