"""The values that flow through veritas-watch: plain, typed, immutable.

Sources produce `RawRecord`s, transforms turn them into `Entry`s (or a `Skip`), the chunker
splits entries into `Chunk`s, and sinks store chunks as points keyed by `point_id`.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, get_args

# One fixed namespace: point ids must be identical across processes, hosts and versions,
# so that a replay of any entry is an overwrite of the same point, never a new one.
POINT_NAMESPACE = uuid.UUID("6f1c1c8e-4f0e-5a57-9b6e-7665726974a5")

SourceKind = Literal["jsonl", "sqlite", "api"]
MaskKind = Literal["", "hinted", "opaque"]
Role = Literal["user", "assistant"]
# Who the current turn of a session belongs to (denoise.next_turn): a person's (`conversation`, and
# `working` while tools run for it), a heartbeat/cron poll's (`background`), or the `/new` greeting's.
TurnKind = Literal["conversation", "working", "background", "greeting"]
_TURN_KINDS = frozenset(get_args(TurnKind))
# What a session is (denoise.session_kind, from its first user message): a person's conversation, or a run
# OpenClaw does for itself, a cron job's or a sub-agent's, whose session is no memory and whose end needs no sync.
SessionKind = Literal["unknown", "conversation", "cron", "subagent"]
RUNTIME_SESSIONS: frozenset[str] = frozenset({"cron", "subagent"})


def restore_turn(value: object) -> TurnKind:
    """A turn kind read back from a cursor: kept as saved (a turn split across reads when tailing live is
    judged as if read at once); anything unknown is `conversation`."""
    return value if isinstance(value, str) and value in _TURN_KINDS else "conversation"  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where an entry can be found again: a transcript file and line, or a SQLite session and seq."""

    kind: SourceKind
    path: str
    line: int | None = None  # 1-based line number in a JSONL file
    offset: int | None = None  # byte offset of the line's first byte
    session_id: str | None = None  # SQLite: the transcript_events.session_id
    seq: int | None = None  # SQLite: the transcript_events.seq

    @property
    def position(self) -> int | None:
        """Order within the session: line number (JSONL) or seq (SQLite)."""
        return self.line if self.kind == "jsonl" else self.seq

    def render(self) -> str:
        if self.kind == "jsonl":
            return f"{self.path}:{self.line}"
        if self.kind == "sqlite":
            return f"{self.path}#{self.session_id}:{self.seq}"
        return self.path


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One transcript line (JSONL) or event row (SQLite), still undecoded."""

    agent_id: str
    data: bytes
    source: SourceRef


@dataclass(frozen=True, slots=True)
class Block:
    """One content block of a message: `text`, `thinking`, `toolCall`, `image`, or other."""

    kind: str
    text: str = ""


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """A transcript line decoded into the fields the denoiser needs; everything else dropped."""

    line_type: str  # "session" (header), "message", "compaction", ... or "unknown"
    entry_id: str | None = None
    timestamp: str | None = None  # ISO-8601 UTC, normalised with a trailing Z
    session_id: str | None = None  # header lines only
    role: str | None = None
    blocks: tuple[Block, ...] = ()
    provider: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    provenance_kind: str | None = None
    provenance_source: str | None = None
    display: bool = True
    reason: str | None = None  # a `reset` event's reason: new, reset, idle, daily, cron-stale, ...


@dataclass(frozen=True, slots=True)
class ParseError:
    """A line that could not be decoded; `reason` is a stable snake_case identifier."""

    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Skip:
    """A decoded line that is not memory; `reason` is a stable snake_case identifier."""

    reason: str


@dataclass(frozen=True, slots=True)
class Entry:
    """One conversational message, cleaned: what becomes memory."""

    agent_id: str
    session_id: str
    entry_id: str
    role: Role
    text: str
    timestamp: str | None
    source: SourceRef
    kind: str = "conversation"  # the OPC memory schema's `type`
    speaker: str | None = None  # who said it, when the transcript names them (a group member: `user:<id>`, a name)
    # The point identity when it is not the transcript entry: a group member's message quoted in
    # several user lines is one memory, keyed by what it is (session, sender, time, body), while
    # `entry_id` and `source` name the line it was read from.
    point_key: str | None = None
    # Where its conversation began in the session: the position of the `reset` event before it (OpenClaw
    # 2026.9 keeps one session across `/new`); None for the session's first conversation. Neighbour lookups
    # stay inside one conversation.
    conversation_start: int | None = None


def with_context(text: str, context: str) -> str:
    """What the dense model reads for a chunk: its session's previous turn, then the chunk."""
    return f"{context}\n{text}" if context else text


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of an entry small enough for the embedding model."""

    entry: Entry
    index: int
    text: str
    # The session's previous turn, for the vectors only (not stored, not in `data`): an answer is found
    # by its question. The dense vector reads it before the text (LoCoMo dense-only R@10 .547 -> .617),
    # the sparse one counts its words at a third (tokenize.CONTEXT_WEIGHT).
    context: str = ""

    @property
    def point_id(self) -> str:
        entry = self.entry
        return point_id(entry.agent_id, entry.session_id, entry.point_key or entry.entry_id, self.index)

    def payload(self) -> dict[str, object]:
        entry = self.entry
        payload: dict[str, object] = {
            "agent_id": entry.agent_id,
            "type": entry.kind,
            "data": self.text,
            "timestamp": entry.timestamp,
            "session_id": entry.session_id,
            "entry_id": entry.entry_id,
            "role": entry.role,
            "source": entry.source.render(),
            "chunk": self.index,
            # Filterable twins of `timestamp` and `source`: time-range search and neighbour lookup.
            "ts": iso_to_epoch(entry.timestamp),
            "position": entry.source.position,
        }
        order = session_order(entry.agent_id, entry.session_id, entry.source.position)
        if order is not None:
            payload["session_order"] = order
        if entry.speaker is not None:  # only then: every other stored payload stays as it was
            payload["speaker"] = entry.speaker
        if entry.conversation_start is not None:  # likewise: only after a reset
            payload["conversation_start"] = entry.conversation_start
        return payload


def iso_to_epoch(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def point_id(agent_id: str, session_id: str, entry_id: str, chunk: int) -> str:
    """Deterministic point id: uuid5 over agent, session, entry and chunk index."""
    return str(uuid.uuid5(POINT_NAMESPACE, f"{agent_id}\x1f{session_id}\x1f{entry_id}\x1f{chunk}"))


# `session_order`: a point's position with its session's hash above it, so that the turns of one session
# are one contiguous range of one index. A neighbour lookup then reads the turns near a position in its own
# session only; by `position`, it read that position range in every session of the agent (one agent of
# 100k memories in 21 sessions: 40 lookups 7-10 ms against 13-16 ms; more sessions, more gap). 21 + 31 bits:
# exact as a float (range filters are).
# Two sessions that share a hash share a range: the session filter still tells them apart.
SESSION_ORDER_POSITION_BITS = 31
_SESSION_HASH_BITS = 21
_POSITION_MASK = (1 << SESSION_ORDER_POSITION_BITS) - 1


def session_order(agent_id: str, session_id: str, position: int | None) -> int | None:
    """The point's place in one index shared by all sessions; None for a position beyond the bits it has."""
    if position is None or not 0 <= position <= _POSITION_MASK:
        return None
    digest = hashlib.blake2b(f"{agent_id}\x1f{session_id}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> (64 - _SESSION_HASH_BITS)) << SESSION_ORDER_POSITION_BITS | position


def session_order_range(order: int) -> tuple[int, int]:
    """The first and last `session_order` value of the session `order` belongs to."""
    first = order & ~_POSITION_MASK
    return first, first | _POSITION_MASK


@dataclass
class SessionState:
    """What a source learned about a session while reading it (kept in its cursor)."""

    session_id: str | None
    session_kind: str = "unknown"  # a SessionKind (str: read back from cursors as written)
    last_entry_ts: str | None = None
    turn: TurnKind = "conversation"
    previous_text: str | None = None  # the last stored turn (redacted, clipped): context for the next one
    conversation_entries: int = 0  # entries stored since the conversation began (the session, or its last reset)
    conversation_start: int | None = None  # the position of the reset that began it (None: the session's start)

    def next_conversation(self, start: int | None = None) -> None:
        """A reset (at position `start`): what follows is another conversation (kind, turn and context start
        over)."""
        self.session_kind = "unknown"
        self.turn = "conversation"
        self.previous_text = None
        self.conversation_entries = 0
        self.conversation_start = start

    def to_dict(self) -> dict[str, object]:
        """What a cursor stores of it (`SESSION_STATE_VERSION`: `from_dict` reads it back)."""
        return {"version": SESSION_STATE_VERSION, "session_id": self.session_id, "session_kind": self.session_kind,
                "last_entry_ts": self.last_entry_ts, "turn": self.turn, "previous_text": self.previous_text,
                "conversation_entries": self.conversation_entries, "conversation_start": self.conversation_start}

    @classmethod
    def from_dict(cls, data: object) -> SessionState:
        """Inverse of `to_dict`; ValueError for another version, an unknown field or a badly typed one."""
        if not isinstance(data, dict):
            raise ValueError(f"session state is a {type(data).__name__}, not an object")
        if data.get("version") != SESSION_STATE_VERSION:
            raise ValueError(f"session state version {data.get('version')!r:.20} (expected {SESSION_STATE_VERSION})")
        unknown = set(data) - {"version", *_SESSION_STATE_TYPES}
        if unknown:
            raise ValueError(f"unknown session state fields: {sorted(unknown)}")
        for name, kind in _SESSION_STATE_TYPES.items():
            value = data.get(name)
            if name in data and not (isinstance(value, kind) and not isinstance(value, bool)):
                raise ValueError(f"session state field {name} has a bad value: {value!r:.80}")
        entries = data.get("conversation_entries", 0)
        if not isinstance(entries, int) or entries < 0:
            raise ValueError(f"session state field conversation_entries has a bad value: {entries!r:.80}")
        start = data.get("conversation_start")  # absent in states written before it existed
        if start is not None and (not isinstance(start, int) or isinstance(start, bool) or start < 0):
            raise ValueError(f"session state field conversation_start has a bad value: {start!r:.80}")
        return cls(_opt_str(data.get("session_id")), _opt_str(data.get("session_kind")) or "unknown",
                   _opt_str(data.get("last_entry_ts")), restore_turn(data.get("turn")),
                   _opt_str(data.get("previous_text")), entries, start)


SESSION_STATE_VERSION = 1  # the serialized form's version (`SessionState.to_dict`), inside both sources' cursors
_SESSION_STATE_TYPES: dict[str, type | tuple[type, ...]] = {
    "session_id": (str, type(None)), "session_kind": str, "last_entry_ts": (str, type(None)), "turn": str,
    "previous_text": (str, type(None)), "conversation_entries": int, "conversation_start": (int, type(None))}


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class ConversationEnd:
    """A conversation that ended inside a transcript: what gap detection needs to check it.

    OpenClaw 2026.9 keeps one session across `/new` and `/reset` and appends a `reset` event, so a
    session holds several conversations; deleting a session ends its last one.
    """

    session_id: str  # the point session id
    ended_at: str | None  # the conversation's last entry time (ISO, UTC)
    session_kind: str  # a SessionKind
    # the reset's reason (new, reset, idle, daily, ...); else deleted, moved_on or restored (sqlite_feed.open_end)
    reason: str
    transcript: str  # where it ended: the reset event (`db#session:seq`) or the session
    seq: int | None = None  # the reset event's seq, when there is one


@dataclass(frozen=True, slots=True)
class SecretFinding:
    """A credential found in a message. Holds no part of the secret, only where and what."""

    rule: str  # e.g. "openai_api_key"
    service: str  # e.g. "OpenAI"
    key_name: str  # e.g. "OPENAI_API_KEY" or the rule's default name
    fingerprint: str  # short keyed hash, never a prefix of the value
    start: int  # span in the original text
    end: int
    # An OpenClaw mask rather than a value: "hinted" (`sk-pro…HNzL`, the mask identifies the
    # credential) or "opaque" (`***`, it does not). Empty for a value found in the text.
    masked: MaskKind = ""


@dataclass(frozen=True, slots=True)
class Redacted:
    """Text with every secret span replaced by a marker, and what was found."""

    text: str
    findings: tuple[SecretFinding, ...] = field(default_factory=tuple)
