"""The library's own clients of a c10d store: torch's C++ log held back while they call it, and
a plain TCP probe before one connects.

When a store dies, torch's store client logs each failed call itself, from C++, on the calling
thread (``[W... TCPStore.cpp] recvValue failed ...`` and about 17 lines of C++ stack; a
reconnect logs two more at ERROR), before the library sees the exception and says it in one
line of its own. The library's background threads met that on every poll. c10's log level is
one process-wide variable (``FLAGS_caffe2_log_level`` in libc10, read at each message, set from
``TORCH_CPP_LOG_LEVEL`` at import): ``quiet_cpp_log`` raises it to FATAL for the time one of
the library's store calls runs, and puts it back when the last such call ends. A C++ warning
the application's own threads log during that call (microseconds on a live store, up to the
store's timeout on a hung one) is held back too. Where libc10 or the variable cannot be found,
nothing is changed.

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

FATAL = 3
"""c10's level for FATAL: nothing below it is printed (INFO 0, WARNING 1, ERROR 2)."""

_lock = threading.Lock()
_held = 0  # store calls running under the raised level, all threads together
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
def quiet_cpp_log() -> Iterator[None]:
    """torch's C++ log below FATAL held back while the block runs (see the module)."""
    global _held, _saved
    level = _find_level()
    if level is None:
        yield
        return
    with _lock:
        if _held == 0:
            _saved = level.value
            level.value = max(_saved, FATAL)
        _held += 1
    try:
        yield
    finally:
        with _lock:
            _held -= 1
            if _held == 0:
                level.value = _saved


def _restore_in_child() -> None:
    """In a process forked while a store call held the level (a DataLoader worker), put the
    level back: the call that raised it runs on in the parent only, and would never lower it
    here (and the lock, which another thread may have held at the fork, is a new one)."""
    global _held, _lock
    if _held and _level is not None:
        _level.value = _saved
    _held = 0
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_restore_in_child)


class QuietStore:
    """A store whose every method call runs under ``quiet_cpp_log``. Only the library's own
    connections are wrapped; torch never sees the wrapper (a ``PrefixStore`` is built on the
    store it wraps)."""

    __slots__ = ("_store",)

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        def quietly(*args: Any, **kwargs: Any) -> Any:
            with quiet_cpp_log():
                return attribute(*args, **kwargs)

        return quietly


def connect(make: Callable[[], Any]) -> Any:
    """``make()`` (a store client's construction or a ``clone``) under ``quiet_cpp_log``."""
    with quiet_cpp_log():
        return make()


def probe(host: str, port: int, timeout_s: float, what: str = "the store", why: str = "") -> None:
    """A plain TCP connection to ``host:port``, closed at once; raises ``ConnectionError`` when
    it is refused or times out (a dead store's port refuses at once), naming ``what`` and the
    likely ``why`` (`` (its leader is gone?)``)."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(f"{what} at {host}:{port} cannot be reached{why}: {exc}") from exc
