"""Text from data made safe to print on a terminal.

What ``cutfs stats`` prints comes from a mount whose serving processes run as the source's
owner: a name or a value holding an escape sequence would reach the terminal of whoever
reads it (often root), so every character that is not printable is shown escaped.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with every character that is not printable (control characters, escape
    sequences, line breaks) shown as ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``."""
    if text.isprintable():
        return text
    return "".join(
        character if character.isprintable() else _escaped(character) for character in text
    )


def _escaped(character: str) -> str:
    code = ord(character)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
