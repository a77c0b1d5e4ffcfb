"""Text for a terminal. A model's answer, a file name or a recipe key may hold any character; written raw, a form
feed clears the screen and an escape sequence recolours or moves the cursor. Shown here, they are escapes."""

from __future__ import annotations

import sys
import unicodedata

# bidirectional overrides and isolates: they reorder what a reader sees without being visible themselves
BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: str, keep: str = "\n\t") -> str:
    """`text` with every control character except those in `keep` written as an escape (`\\x0c`, `\\x1b`)."""
    return "".join(c if c in keep or not _control(c) else _escape(c) for c in text)


def one_line(text: str) -> str:
    """`printable` with line breaks and tabs escaped too: one line, always."""
    return printable(text, keep="")


def show(text: str, file=None) -> None:
    """Print for a person: a line of text with its control characters escaped."""
    print(printable(text), file=file or sys.stdout)


def _control(c: str) -> bool:
    return unicodedata.category(c) in ("Cc", "Cs") or c in BIDI


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
