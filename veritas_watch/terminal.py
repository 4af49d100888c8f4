"""Text made safe to print on a terminal (a leaf): what an agent's transcript holds is anyone's text.

An escape sequence in a stored message (`ESC ] 0 ; title BEL`, `ESC [ 2 J`, a bare CR that lets the next
text overwrite the line, bidi overrides that reorder what is shown) would otherwise act on the operator's
terminal when `search`, `status` or `creds` prints it. Each such character is shown as a visible escape
(`\\x1b`, `\\r`, `\\u202e`) instead; newlines and tabs stay (the text keeps its shape), and so does everything
printable in any script. JSON output needs none of this: `json.dumps` escapes every control character
(bidi and other format characters are printable JSON but inert there, inside quotes).
"""

from __future__ import annotations

import re
import textwrap

# DEL, C1 controls; the bidi marks, embeddings, overrides and isolates; line and paragraph separators (some
# terminals break lines on them); lone surrogates (a broken transcript's).
_INVISIBLE = "\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f{_INVISIBLE}]")  # and C0 controls but \t and \n


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\r":
        return "\\r"
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: object) -> str:
    """`text` as a string whose every character prints as itself: control and bidi characters escaped."""
    return _UNSAFE.sub(_shown, str(text))


def indented(text: object, *, indent: str = "    ", width: int = 100, max_lines: int | None = None) -> list[str]:
    """`text` made printable, wrapped to `width` and indented, every line (a continuation too) starting with
    `indent`; over `max_lines`, the first ones and a last line saying how many more there are."""
    room = max(20, width - len(indent))
    lines: list[str] = []
    for paragraph in printable(text).split("\n"):
        lines.extend(textwrap.wrap(paragraph, room, break_on_hyphens=False, replace_whitespace=True) or [""])
    while lines and not lines[-1].strip():
        lines.pop()
    if max_lines is not None and len(lines) > max_lines:
        hidden = len(lines) - max_lines
        lines = [*lines[:max_lines], f"... {hidden} more line{'s' if hidden != 1 else ''}"]
    return [indent + line if line else "" for line in lines]


# What `json.dumps(ensure_ascii=False)` leaves raw although a terminal may act on it: C1 controls (8-bit CSI),
# bidi controls, line separators, lone surrogates (they cannot even be encoded). These can only stand inside a
# JSON string, where `\uXXXX` means the same character.
_JSON_UNSAFE = re.compile(f"[{_INVISIBLE}]")


def json_line(text: str) -> str:
    """JSON text (`json.dumps(..., ensure_ascii=False)`, or a line the daemon sent) safe to print: the same
    JSON value, the characters above written as escapes."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
