"""The library's own clients of a c10d store: torch's C++ log held back while they call it, and
a plain TCP probe before one connects.

When a store dies, torch's store client logs each failed call itself, from C++, on the calling
thread, before the library sees the exception and says it in one line of its own: a failed read
or write logs one WARNING (``[W... TCPStore.cpp] recvValue failed ...``) carrying about 17 lines
of C++ stack; a failed connection logs its retries at ERROR and WARNING, each with a stack. The
library's background threads met that on every poll. c10's log level is one process-wide
variable (``FLAGS_caffe2_log_level`` in libc10, read at each message, set from
``TORCH_CPP_LOG_LEVEL`` at import), so it is raised only as far as each call needs and only
while it runs: to ERROR around a read or write (``quiet_cpp_log()``: its warning held back, an
error still printed), to FATAL around a connection (``quiet_cpp_log(FATAL)``: a ``clone`` or a
new client). The level goes back when the last such call ends. A C++ message below that level
which the application's own threads log during the call (microseconds on a live store, up to
the store's timeout on a hung one) is held back too: a warning during a read, anything but a
fatal message during a connection. Where libc10 or the variable cannot be found, nothing is
changed.

A connection to a dead store's port is refused at once, while torch's client retries it for its
whole timeout (10 s and more, logging each try): ``probe`` tries a plain TCP connection first
(the router before it reconnects, a node store's client before it connects).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger("stagefrontier")

ERROR = 2
"""c10's level for ERROR (INFO 0, WARNING 1): a failed read's or write's warning is below it."""
FATAL = 3
"""c10's level for FATAL: a failed connection's errors and warnings are below it."""

_lock = threading.Lock()
_holds: dict[int, int] = {}  # level -> store calls running that need it, all threads together
_saved = 0  # the level before the first of them
_level: ctypes.c_int | None = None
_looked = False


def _find_level() -> ctypes.c_int | None:
    """libc10's ``FLAGS_caffe2_log_level``, found once (None where it is not there)."""
    global _level, _looked
    if not _looked:
        _looked = True
        try:
            import torch

            library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
            _level = ctypes.c_int.in_dll(library, "FLAGS_caffe2_log_level")
        except (ImportError, OSError, ValueError) as exc:
            logger.debug("stagefrontier: torch's C++ log level not found, left alone: %s", exc)
    return _level


@contextlib.contextmanager
def quiet_cpp_log(needed: int = ERROR) -> Iterator[None]:
    """torch's C++ log below ``needed`` held back while the block runs (see the module): ERROR
    for a store read or write, FATAL for a connection."""
    level = _find_level()
    if level is None:
        yield
        return
    with _lock:
        _hold(level, needed, +1)
    try:
        yield
    finally:
        with _lock:
            _hold(level, needed, -1)


def _hold(level: ctypes.c_int, needed: int, change: int) -> None:
    """Count one call needing ``needed`` in or out, and set the level the calls still running
    need (the saved one once none is). Called under ``_lock``."""
    global _saved
    if not _holds:
        _saved = level.value
    count = _holds.get(needed, 0) + change
    if count:
        _holds[needed] = count
    else:
        _holds.pop(needed, None)
    level.value = max(_saved, *_holds) if _holds else _saved


def _restore_in_child() -> None:
    """In a process forked while a store call held the level (a DataLoader worker), put the
    level back: the call that raised it runs on in the parent only, and would never lower it
    here (and the lock, which another thread may have held at the fork, is a new one)."""
    global _lock
    if _holds and _level is not None:
        _level.value = _saved
    _holds.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_restore_in_child)


class QuietStore:
    """A store whose every method call runs under ``quiet_cpp_log``: at ERROR, but a ``clone``
    (a new connection) at FATAL. Only the library's own connections are wrapped; torch never
    sees the wrapper (a ``PrefixStore`` is built on the store it wraps)."""

    __slots__ = ("_store",)

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        needed = FATAL if name == "clone" else ERROR

        def quietly(*args: Any, **kwargs: Any) -> Any:
            with quiet_cpp_log(needed):
                return attribute(*args, **kwargs)

        return quietly


def connect(make: Callable[[], Any]) -> Any:
    """``make()`` (a store client's construction or a ``clone``) under ``quiet_cpp_log(FATAL)``."""
    with quiet_cpp_log(FATAL):
        return make()


def probe(host: str, port: int, timeout_s: float, what: str = "the store", why: str = "") -> None:
    """A plain TCP connection to ``host:port``, closed at once; raises ``ConnectionError`` when
    it is refused or times out (a dead store's port refuses at once), naming ``what`` and the
    likely ``why`` (`` (its leader is gone?)``)."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(f"{what} at {host}:{port} cannot be reached{why}: {exc}") from exc
