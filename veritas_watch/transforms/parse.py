"""One transcript line (bytes) -> `ParsedLine` or `ParseError`. Never raises.

Handles the pi-mono/OpenClaw session format v3 (`type`, `id`, `parentId`, ISO `timestamp`) and the
older v1 (no `version`, no `id`/`parentId`): header lines (`type: "session"`), message lines
(`message.role`, `message.content` as a string or a list of blocks) and every other line type,
which is kept as `ParsedLine(line_type=<its type>)` for the denoiser to skip.

Policy on odd shapes: a field that decides what the line *is* (`type`, `message`, `message.role`,
`message.content`) with the wrong JSON type is a `ParseError("wrong_field_type", <field>)`;
optional metadata (provider, model, timestamps, provenance, ids) with the wrong type is dropped.

Block kinds produced: `text`, `thinking`, `toolCall` (name + arguments flattened to `key: value`
lines), `image` (no data kept), `toolResult` (text returned by a tool), `bashExecution`,
`summary` (compaction / branch summaries), `error` (assistant `errorMessage`), `details`
(tool-result `details` flattened) and, for anything unknown, the block's own `type` (or `other`)
with its `text` if it has one. Only `text` and `image` are conversation; the rest exist so that
credential detection can scan everything a line carries (`denoise.detection_text`).
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from typing import Final

from veritas_watch.model import Block, ParsedLine, ParseError

MAX_LINE_BYTES: Final = 4 * 1024 * 1024

# Stable reasons (snake_case): they go into metrics and logs.
EMPTY_LINE: Final = "empty_line"
LINE_TOO_LONG: Final = "line_too_long"
INVALID_UTF8: Final = "invalid_utf8"
INVALID_JSON: Final = "invalid_json"
TOO_DEEP: Final = "too_deep"
NOT_AN_OBJECT: Final = "not_an_object"
MISSING_TYPE: Final = "missing_type"
WRONG_FIELD_TYPE: Final = "wrong_field_type"
INTERNAL_ERROR: Final = "internal_error"  # a bug in this module; kept so that the caller never crashes
PARSE_ERROR_REASONS: Final = frozenset(
    {
        EMPTY_LINE,
        LINE_TOO_LONG,
        INVALID_UTF8,
        INVALID_JSON,
        TOO_DEEP,
        NOT_AN_OBJECT,
        MISSING_TYPE,
        WRONG_FIELD_TYPE,
        INTERNAL_ERROR,
    }
)

# Epoch values below this are seconds, at or above it milliseconds (1e11 s is the year 5138).
_EPOCH_MS_THRESHOLD: Final = 100_000_000_000
# Flattening tool arguments / details: bounded so a hostile line cannot make us do unbounded work.
_FLATTEN_MAX_NODES: Final = 10_000
_TOOL_CALL_KINDS: Final = frozenset({"toolCall", "tool_use", "toolUse", "function_call", "tool_call"})
_TOOL_RESULT_KINDS: Final = frozenset({"toolResult", "tool_result"})
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_line(data: bytes, *, max_bytes: int = MAX_LINE_BYTES) -> ParsedLine | ParseError:
    """Decode one JSONL line (or one SQLite `event_json`). Never raises."""
    try:
        return _parse(data, max_bytes)
    except RecursionError:
        return ParseError(TOO_DEEP)
    except Exception as exc:  # the contract is "never raises": a bug here must not stop the daemon
        return ParseError(INTERNAL_ERROR, type(exc).__name__)


def _parse(data: bytes, max_bytes: int) -> ParsedLine | ParseError:
    if len(data) > max_bytes:
        return ParseError(LINE_TOO_LONG, f"{len(data)} bytes > {max_bytes}")
    data = data.strip()  # trailing "\n" / "\r\n"; JSON allows surrounding whitespace anyway
    if not data:
        return ParseError(EMPTY_LINE)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ParseError(INVALID_UTF8, f"at byte {exc.start}")
    if text.startswith("\ufeff"):  # a BOM left by an editor on the first line
        text = text[1:]
    try:
        obj = json.loads(text)
    except RecursionError:
        return ParseError(TOO_DEEP)
    except ValueError as exc:
        return ParseError(INVALID_JSON, str(exc)[:200])
    if not isinstance(obj, dict):
        return ParseError(NOT_AN_OBJECT, type(obj).__name__)
    if "type" not in obj:
        return ParseError(MISSING_TYPE)
    line_type = obj["type"]
    if not isinstance(line_type, str):
        return ParseError(WRONG_FIELD_TYPE, "type")
    line_type = _clean(line_type)
    entry_id = _opt_str(obj.get("id"))
    timestamp = _iso(obj.get("timestamp"))

    if line_type == "session":
        return ParsedLine(line_type="session", entry_id=entry_id, timestamp=timestamp, session_id=entry_id)
    if line_type == "reset":  # 2026.9: `/new`, `/reset` and auto-resets append this to the same session
        return ParsedLine(line_type="reset", entry_id=entry_id, timestamp=timestamp,
                          reason=_opt_str(obj.get("reason")) or "reset")
    if line_type == "message":
        return _parse_message(obj, entry_id, timestamp)
    if line_type in ("compaction", "branch_summary"):
        summary = _opt_str(obj.get("summary"))
        summary_blocks = (Block("summary", summary),) if summary else ()
        return ParsedLine(line_type=line_type, entry_id=entry_id, timestamp=timestamp, blocks=summary_blocks)
    if line_type == "custom_message":
        # Extension-injected context: never conversation, but its text is scanned for credentials.
        content = obj.get("content")
        blocks = _blocks(content, role="custom") if isinstance(content, str | list) else ()
        return ParsedLine(
            line_type=line_type,
            entry_id=entry_id,
            timestamp=timestamp,
            blocks=blocks,
            display=obj.get("display") is not False,
        )
    return ParsedLine(line_type=line_type, entry_id=entry_id, timestamp=timestamp)


def _parse_message(obj: dict[str, object], entry_id: str | None, timestamp: str | None) -> ParsedLine | ParseError:
    message = obj.get("message")
    if not isinstance(message, dict):
        return ParseError(WRONG_FIELD_TYPE, "message")
    role = message.get("role")
    if not isinstance(role, str):
        return ParseError(WRONG_FIELD_TYPE, "message.role")
    role = _clean(role)
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        return ParseError(WRONG_FIELD_TYPE, "message.content")
    blocks: list[Block] = list(_blocks(content, role)) if content is not None else []

    if role == "bashExecution":
        command = _opt_str(message.get("command")) or ""
        output = _opt_str(message.get("output")) or ""
        if command or output:
            blocks.append(Block("bashExecution", f"{command}\n{output}".strip("\n")))
    elif role in ("branchSummary", "compactionSummary"):
        summary = _opt_str(message.get("summary"))
        if summary:
            blocks.append(Block("summary", summary))
    error_message = _opt_str(message.get("errorMessage"))
    if error_message:
        blocks.append(Block("error", error_message))
    if "details" in message and message["details"] is not None:
        details = _flatten(message["details"])
        if details:
            blocks.append(Block("details", details))

    provenance = message.get("provenance")
    if not isinstance(provenance, dict):
        provenance = obj.get("provenance")  # some writers put it on the entry
    provenance_kind = provenance_source = None
    if isinstance(provenance, dict):
        provenance_kind = _opt_str(provenance.get("kind"))
        provenance_source = _opt_str(provenance.get("sourceTool"))

    return ParsedLine(
        line_type="message",
        entry_id=entry_id,
        # The entry's ISO timestamp is when it was written; message.timestamp (epoch) is the fallback.
        timestamp=timestamp or _iso(message.get("timestamp")),
        role=role,
        blocks=tuple(blocks),
        provider=_opt_str(message.get("provider")),
        model=_opt_str(message.get("model")),
        stop_reason=_opt_str(message.get("stopReason")),
        provenance_kind=provenance_kind,
        provenance_source=provenance_source,
        display=message.get("display") is not False and obj.get("display") is not False,
    )


def _blocks(content: str | list[object], role: str) -> tuple[Block, ...]:
    # Text returned by a tool is kept apart from conversation text, whatever its block type says.
    text_kind = "toolResult" if role == "toolResult" else "text"
    if isinstance(content, str):
        return (Block(text_kind, _clean(content)),) if content else ()
    blocks: list[Block] = []
    for item in content:
        if isinstance(item, str):
            if item:
                blocks.append(Block(text_kind, _clean(item)))
            continue
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        kind = _clean(kind) if isinstance(kind, str) and kind else "other"
        if kind == "text":
            text = _opt_str(item.get("text"))
            if text:
                blocks.append(Block(text_kind, text))
        elif kind == "thinking":
            thinking = _opt_str(item.get("thinking")) or _opt_str(item.get("text"))
            blocks.append(Block("thinking", thinking or ""))
        elif kind in _TOOL_CALL_KINDS:
            name = _opt_str(item.get("name")) or ""
            arguments = item.get("arguments", item.get("input"))
            flat = _flatten(arguments) if arguments is not None else ""
            blocks.append(Block("toolCall", f"{name}\n{flat}".strip("\n")))
        elif kind == "image":
            blocks.append(Block("image"))  # base64 data is not memory and not worth scanning
        elif kind in _TOOL_RESULT_KINDS:
            inner = item.get("content", item.get("text"))
            blocks.append(Block("toolResult", _flatten(inner) if inner is not None else ""))
        else:
            blocks.append(Block(kind, _opt_str(item.get("text")) or ""))
    return tuple(blocks)


def _flatten(value: object) -> str:
    """All string leaves of a JSON value, one per line, dict leaves as `key: value`.

    Iterative and bounded (no recursion limit to hit, no unbounded work). `key: value` keeps the
    name next to the value, which is what credential rules key on (`api_key: ...`).
    """
    lines: list[str] = []
    stack: list[tuple[str | None, object]] = [(None, value)]
    nodes = 0
    while stack and nodes < _FLATTEN_MAX_NODES:
        key, node = stack.pop()
        nodes += 1
        if isinstance(node, str):
            if node:
                lines.append(f"{key}: {node}" if key else node)
        elif isinstance(node, bool) or node is None:
            continue
        elif isinstance(node, int | float):
            if key:
                lines.append(f"{key}: {node}")
        elif isinstance(node, dict):
            # reversed: the stack pops last-in first, and we want document order out
            stack.extend((str(k), v) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((key, v) for v in reversed(node))
    return _clean("\n".join(lines))


def _opt_str(value: object) -> str | None:
    return _clean(value) if isinstance(value, str) and value else None


def replace_surrogates(text: str) -> str:
    """Text decoded from JSON inside a message (which may hold `\\ud800` escapes), made safe to store."""
    return _clean(text)


def epoch_ms_to_iso(value: object) -> str | None:
    """Epoch milliseconds (a JSON number, e.g. `timestamp_ms`) -> `YYYY-MM-DDTHH:MM:SS.mmmZ`, else None.

    Always milliseconds, whatever the size (unlike `_iso`, which reads small values as seconds).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    try:
        return _format(datetime.fromtimestamp(value / 1000, tz=UTC))
    except (OverflowError, OSError, ValueError):
        return None


def _clean(text: str) -> str:
    """Replace lone surrogates (legal in JSON `\\ud800` escapes, illegal in UTF-8) with U+FFFD.

    Downstream (embedding, Qdrant payloads, logs) encodes to UTF-8 and would raise on them.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _iso(value: object) -> str | None:
    """ISO-8601 string or epoch number (ms, or s below 1e11) -> `YYYY-MM-DDTHH:MM:SS.mmmZ` UTC."""
    moment: datetime | None = None
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        seconds = value / 1000 if abs(value) >= _EPOCH_MS_THRESHOLD else value
        try:
            moment = datetime.fromtimestamp(seconds, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    elif isinstance(value, str) and 10 <= len(value) <= 64:
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)  # OpenClaw writes UTC; a naive stamp is UTC too
        try:
            moment = moment.astimezone(UTC)
        except (OverflowError, ValueError):
            return None
    if moment is None:
        return None
    return _format(moment)


def _format(moment: datetime) -> str:
    # Explicit fields: strftime("%Y") does not zero-pad years below 1000 on every platform.
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T{moment.hour:02d}:{moment.minute:02d}:"
        f"{moment.second:02d}.{moment.microsecond // 1000:03d}Z"
    )
