"""Capture requests and their answers in the job's c10d store.

Keys sit under the same attempt prefix as the window keys (``stagefrontier/<run>/<restart>``, see
``collect.store.store_prefix``), so a restarted attempt never acts on the previous attempt's
request:

* ``route/request``: the one open request (JSON: id, ranks, first step, step count, stage);
* ``route/status/<id>/r<rank>``: a named rank's answer (captured, skipped or failed, with the
  trace path, its size and host);
* ``route/manual``: a request from outside the job (``stagefrontier capture``) for rank 0 to
  schedule; rank 0 answers it in ``route/manual/answer`` with the incident id.

Rank 0 deletes the request and the answers when the incident closes. Every value is small JSON,
validated on read; nothing is unpickled.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ReportFormatError

logger = logging.getLogger("stagefrontier")

REQUEST_KEY = "route/request"
MANUAL_KEY = "route/manual"
MANUAL_ANSWER_KEY = "route/manual/answer"
MAX_CAPTURE_STEPS = 100
"""The most steps one capture profiles: the profiler holds every event in memory until it stops.
A request for more is refused where a person makes it (``request_capture``, ``stagefrontier
capture``) and capped, with a reason, where it is read from the store."""
MAX_VALUE_BYTES = 64 << 10
"""A request or answer larger than this is rejected as corrupt before it is parsed."""


def status_key(request_id: str, rank: int) -> str:
    return f"route/status/{request_id}/r{rank}"


@dataclass(frozen=True)
class CaptureRequest:
    """Capture ``steps`` steps from global step ``first_step`` on every rank in ``ranks``."""

    id: str
    ranks: tuple[int, ...]
    first_step: int
    steps: int
    stage: str | None = None

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1

    def encode(self) -> bytes:
        return json.dumps({**asdict(self), "ranks": list(self.ranks)}).encode()

    @classmethod
    def decode(cls, data: bytes) -> CaptureRequest:
        obj = _load(data, "capture request")
        try:
            ranks = tuple(int(r) for r in obj["ranks"])
            request = cls(
                id=str(obj["id"]),
                ranks=ranks,
                first_step=int(obj["first_step"]),
                steps=int(obj["steps"]),
                stage=None if obj.get("stage") is None else str(obj["stage"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReportFormatError(f"malformed capture request: {exc}") from None
        if request.steps < 1 or request.first_step < 0 or not ranks or min(ranks) < 0:
            raise ReportFormatError(f"capture request out of range: {obj}")
        return request


@dataclass(frozen=True)
class CaptureStatus:
    """A named rank's answer: ``state`` is ``captured``, ``skipped`` or ``failed``."""

    id: str
    rank: int
    state: str
    reason: str = ""
    path: str = ""
    size: int = 0
    host: str = ""
    first_step: int = -1
    last_step: int = -1

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> CaptureStatus:
        obj = _load(data, "capture status")
        try:
            status = cls(**{k: obj[k] for k in obj if k in cls.__dataclass_fields__})
        except TypeError as exc:
            raise ReportFormatError(f"malformed capture status: {exc}") from None
        if status.state not in ("captured", "skipped", "failed"):
            raise ReportFormatError(f"unknown capture state {status.state!r}")
        return status


@dataclass(frozen=True)
class ManualRequest:
    """A request from outside the job: which ranks, how many steps, optionally the stage."""

    ranks: tuple[int, ...]
    steps: int
    stage: str | None = None

    def encode(self) -> bytes:
        obj = {"ranks": list(self.ranks), "steps": self.steps, "stage": self.stage}
        return json.dumps(obj).encode()

    @classmethod
    def decode(cls, data: bytes) -> ManualRequest:
        obj = _load(data, "manual capture request")
        try:
            request = cls(
                tuple(int(r) for r in obj["ranks"]),
                int(obj["steps"]),
                None if obj.get("stage") is None else str(obj["stage"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReportFormatError(f"malformed manual capture request: {exc}") from None
        if not request.ranks or request.steps < 1 or min(request.ranks) < 0:
            raise ReportFormatError(f"manual capture request out of range: {obj}")
        return request


def _load(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > MAX_VALUE_BYTES:
        raise ReportFormatError(f"{what} of {len(data)} bytes exceeds {MAX_VALUE_BYTES}")
    try:
        obj = json.loads(bytes(data).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportFormatError(f"{what} is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ReportFormatError(f"{what} must be a JSON object")
    return obj


class RequestChannel:
    """This rank's private store connection for requests (opened lazily on the router thread,
    never on the training thread). Every call may raise; callers downgrade."""

    def __init__(self, store: Any = None, prefix: str | None = None) -> None:
        self.base = store
        self._prefix = prefix
        self._conn: Any = None

    def conn(self) -> Any:
        if self._conn is None:
            from torch.distributed import PrefixStore

            from ..collect.store import open_connection, store_prefix

            self._conn = PrefixStore(self._prefix or store_prefix(), open_connection(self.base))
        return self._conn

    def read(self, key: str) -> bytes | None:
        conn = self.conn()
        if not conn.check([key]):
            return None
        return bytes(conn.get(key))

    def write(self, key: str, value: bytes) -> None:
        self.conn().set(key, value)

    def delete(self, *keys: str) -> None:
        conn = self.conn()
        for key in keys:
            conn.delete_key(key)

    def close(self) -> None:
        self._conn = None
