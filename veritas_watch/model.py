"""The values that flow through veritas-watch: plain, typed, immutable.

Sources produce `RawRecord`s, transforms turn them into `Entry`s (or a `Skip`), the chunker
splits entries into `Chunk`s, and sinks store chunks as points keyed by `point_id`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

# One fixed namespace: point ids must be identical across processes, hosts and versions,
# so that a replay of any entry is an overwrite of the same point, never a new one.
POINT_NAMESPACE = uuid.UUID("6f1c1c8e-4f0e-5a57-9b6e-7665726974a5")

SourceKind = Literal["jsonl", "sqlite", "api"]
Role = Literal["user", "assistant"]


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


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of an entry small enough for the embedding model."""

    entry: Entry
    index: int
    text: str
    # The session's previous turn, prepended for the dense vector only (not stored, not in `data`):
    # an answer is found by its question. Measured on LoCoMo: R@10 .547 -> .617 dense-only.
    context: str = ""

    @property
    def embed_text(self) -> str:
        return f"{self.context}\n{self.text}" if self.context else self.text

    @property
    def point_id(self) -> str:
        return point_id(self.entry.agent_id, self.entry.session_id, self.entry.entry_id, self.index)

    def payload(self) -> dict[str, object]:
        entry = self.entry
        return {
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


@dataclass
class SessionState:
    """What a source learned about a session while reading it (kept in its cursor)."""

    session_id: str | None
    session_kind: str = "unknown"  # unknown | conversation | cron
    last_entry_ts: str | None = None
    turn: Literal["conversation", "background"] = "conversation"  # denoise.TurnKind
    previous_text: str | None = None  # the last stored turn (redacted, clipped): context for the next one


@dataclass(frozen=True, slots=True)
class SecretFinding:
    """A credential found in a message. Holds no part of the secret, only where and what."""

    rule: str  # e.g. "openai_api_key"
    service: str  # e.g. "OpenAI"
    key_name: str  # e.g. "OPENAI_API_KEY" or the rule's default name
    fingerprint: str  # short keyed hash, never a prefix of the value
    start: int  # span in the original text
    end: int


@dataclass(frozen=True, slots=True)
class Redacted:
    """Text with every secret span replaced by a marker, and what was found."""

    text: str
    findings: tuple[SecretFinding, ...] = field(default_factory=tuple)
