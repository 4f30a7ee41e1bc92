"""The one escaping rule of every text stagefrontier prints.

Stage names, host names, roles and notes come from packets, ``windows.jsonl`` records, traces and
other ranks, and may hold control characters that a terminal acts on: an ESC sequence recolors,
moves the cursor or clears the screen, a newline or carriage return starts what looks like one of
the report's own lines, a bidirectional override reorders what follows. Every text output passes
through ``printable`` (one line) or ``printable_lines`` (a report), which show each such character
as a visible backslash escape instead.
"""

from __future__ import annotations

from collections.abc import Iterable

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SEPARATORS = (0x2028, 0x2029)
"""Unicode line and paragraph separators."""
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
"""Bidirectional marks, embeddings, overrides and isolates."""


def _escape(code: int) -> str:
    char = chr(code)
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


_TABLE = {
    code: _escape(code)
    for code in (*range(0x20), *range(0x7F, 0xA0), *_SEPARATORS, *_BIDI)  # C0, DEL and C1
}


def printable(text: str) -> str:
    """``text`` with every control character (C0, DEL, C1), line or paragraph separator and
    bidirectional control written as a backslash escape (``\\x1b``, ``\\n``, ``\\u202e``): it
    stays on its line and cannot restyle the terminal. Escaping twice changes nothing more."""
    return text.translate(_TABLE)


def printable_lines(lines: Iterable[str]) -> str:
    """A report: each line escaped, then joined, so the only newlines are the report's own."""
    return "\n".join(printable(line) for line in lines)


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (c10d's errors append a C++ stack), or its
    type's name when it has no message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
