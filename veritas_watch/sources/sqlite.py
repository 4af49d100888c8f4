"""Read-only, incremental reader of OpenClaw's per-agent SQLite transcript store.

OpenClaw 2026.9+ writes live transcripts to `agents/<id>/agent/openclaw-agent.sqlite`, one row
per event in `transcript_events(session_id, seq, ...)`. This module turns that table into the
same `RawRecord`s the JSONL tailer produces, one short read transaction per `poll()`:

- the connection is `mode=ro` + `PRAGMA query_only=ON` with a short busy timeout, autocommit,
  and every statement is fully stepped, so no read transaction (and no WAL snapshot that would
  pin the writer's checkpoints) outlives a poll;
- the schema is probed by name (`PRAGMA table_info`), so schema 1 (`sessions`/`session_entries`)
  and schemas 19..24 (`session_windows`/`session_nodes`, `event_zstd` since 23) all read;
- a per-session `SessionCursor` says what was consumed; a rewrite underneath it (generation
  rotation, a different event at the cursor's last seq, rows that vanished, a vanished window)
  makes the session's next batch a *rewalk* from its first row, with the set of event ids that
  still exist so stale points can be removed. OpenClaw rotates the generation with every
  destructive change of its own; consumed rows that changed under an unchanged generation are the
  database gone back in time (a backup restored), a rewalk with reason `restored`;
- a session in cold storage (`session.maintenance.coldStorage`: its rows moved to a compressed
  archive, `<agent>/sessions/cold/<sha256>.jsonl.zst` or a blob) is read from that archive where
  its cursor has not read it yet, verified as OpenClaw verifies it (size and SHA-256).

It is synchronous by design: the daemon runs `poll()` in a worker thread. Calls are serialised
by a lock; a reader is cheap, keep one per database.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import threading
from collections.abc import Iterator, KeysView, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import structlog
import zstandard

from veritas_watch.admission import AdmissionPolicy, SessionMetadata, exclusion_reason, session_metadata
from veritas_watch.model import RawRecord, SourceRef
from veritas_watch.openclaw import normalize_agent_id, session_key_agent

log = structlog.get_logger()

DEFAULT_BUSY_TIMEOUT_S = 0.2
DEFAULT_MAX_ROWS = 1000
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
# Schema 23's CHECK bounds a compressed event at 4 MiB decoded. A database without that CHECK may
# claim more; past this guard the row is reported, never allocated.
MAX_DECODED_EVENT_BYTES = 64 * 1024 * 1024
_FETCH_CHUNK = 64
_SEQ_MIN = -(2**63)
_WATERMARK_TABLES = ("transcript_rewrite_watermarks", "session_transcript_generations")
# OpenClaw keeps a transcript over 64 MiB of JSONL hot (never archives it): what a cold archive may decode to.
MAX_COLD_ARCHIVE_BYTES = 80 * 1024 * 1024
_COLD_ARCHIVE_NAME = re.compile(r"[a-f0-9]{64}\.jsonl\.zst")  # resolveSessionColdArchivePath's rule

Layout = Literal["windows", "sessions", "none"]
# rows_changed / event_changed: where no generation tells a rewrite from a restore (older schemas).
RewalkReason = Literal["generation_changed", "rows_changed", "event_changed", "restored", "window_vanished"]


class SqliteSourceError(Exception):
    """The database could not be read this time; log `reason` and retry later.

    `reason` is one of: missing, cannot_open, locked, corrupt, io_error, readonly, schema_missing,
    sqlite_error.
    """

    def __init__(self, reason: str, detail: str = "", path: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.path = path


@dataclass(frozen=True, slots=True)
class SessionCursor:
    """How far one session has been consumed; commit it only after its records are stored.

    `row_count` counts the rows with `seq < next_seq` when the cursor was made; `last_event_id`
    is the `id` of the row at `next_seq - 1` (or a digest of its bytes when it has none).
    """

    session_id: str
    next_seq: int = 0
    generation: str | None = None
    last_event_id: str | None = None
    row_count: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "session_id": self.session_id,
            "next_seq": self.next_seq,
            "generation": self.generation,
            "last_event_id": self.last_event_id,
            "row_count": self.row_count,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> SessionCursor:
        """Inverse of `to_dict`; raises ValueError on a malformed value. Unknown keys are ignored: cursors
        written before `cursors.SqliteCursor` kept the source's session state beside these keys."""
        session_id = data.get("session_id")
        next_seq = data.get("next_seq", 0)
        generation = data.get("generation")
        last_event_id = data.get("last_event_id")
        row_count = data.get("row_count", 0)
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        if not isinstance(next_seq, int) or isinstance(next_seq, bool):
            raise ValueError("next_seq must be an integer")
        if not isinstance(row_count, int) or isinstance(row_count, bool) or row_count < 0:
            raise ValueError("row_count must be a non-negative integer")
        if generation is not None and not isinstance(generation, str):
            raise ValueError("generation must be a string or null")
        if last_event_id is not None and not isinstance(last_event_id, str):
            raise ValueError("last_event_id must be a string or null")
        return cls(session_id, next_seq, generation, last_event_id, row_count)


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """What the database says about itself, and which shape the reader found."""

    user_version: int
    schema_version: int  # schema_meta's primary row when present, else user_version
    app_version: str | None
    meta_agent_id: str | None
    layout: Layout  # windows: session_windows/session_nodes; sessions: sessions/session_entries
    payload_columns: tuple[str, ...]  # which of event_json / event_zstd exist
    watermark_table: str | None
    has_cold_archives: bool


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One transcript generation window (a session id), for listings and gap detection."""

    session_id: str
    session_key: str | None
    previous_session_id: str | None  # set on a reset / rollover / fork window
    started_at: int | None  # epoch ms (started_at, else created_at)
    # The key moved on to another window (an idle or daily reset of a message through `openclaw agent` on
    # 2026.9.6, or a reset in builds that opened a new window).
    # Not `ended_at`: OpenClaw 2026.9 sets it (and status 'done') after every finished run.
    ended: bool
    ended_at: int | None  # epoch ms, as OpenClaw recorded it: when the last run finished
    reason: str | None  # initial, reset, rollover, fork, rewind, switch, recovery, compaction
    cold_archived: bool  # its rows were moved to a cold archive file (schema 20+)
    last_seq: int | None  # highest seq, in its cold archive if there (None: no rows); lag = last_seq + 1 - next_seq
    last_created_at: int | None  # created_at (the event's own time, epoch ms) of the last row


@dataclass(frozen=True, slots=True)
class SqliteRowError:
    """A row whose payload could not be decoded. The cursor still moves past it."""

    session_id: str
    seq: int
    reason: str  # zstd_corrupt, zstd_length_mismatch, zstd_length_missing, zstd_too_large, payload_missing
    detail: str = ""


@dataclass(frozen=True, slots=True)
class SessionBatch:
    """New rows of one session, and the cursor to commit once they are stored.

    `point_session_id` is the session id for point ids: the `id` of the session's header event
    (seq 0, `type: "session"`) when it has one, else `session_id`. OpenClaw's JSONL import keeps
    the header verbatim but keys rows by the sessions.json `sessionId`, and the two differ in real
    data; the JSONL source keys points by the header id, so this keeps migrated sessions single.

    `rewalk` means the session was rewritten: `records` start again from its first row (and may
    continue in later batches, which are then ordinary). `present_event_ids` is set on a rewalk
    when it is safe to delete points of this session whose entry id is not in it; it is None when
    nothing may be deleted (session deleted or emptied: its history stays searchable).
    `cursor` None means "forget this session's cursor" (the window is gone).
    """

    session_id: str
    point_session_id: str
    records: tuple[RawRecord, ...]
    errors: tuple[SqliteRowError, ...]
    cursor: SessionCursor | None
    rewalk: bool = False
    rewalk_reason: RewalkReason | None = None
    present_event_ids: frozenset[str] | None = None
    has_more: bool = False  # rows beyond this batch exist (budget reached)
    last_created_at: int | None = None  # created_at of the last row in this batch


@dataclass(frozen=True, slots=True)
class SqlitePoll:
    """Everything one poll saw, from one consistent snapshot."""

    db_path: str
    agent_id: str
    schema: SchemaInfo
    sessions: tuple[SessionInfo, ...]
    batches: tuple[SessionBatch, ...]
    has_more: bool  # poll again now: the row or byte budget stopped this one early
    unchanged: bool = False  # nothing was committed since the previous poll: batches is empty
    # Sessions the person had OpenClaw forget (`openclaw memory forget`: a row in `memory_session_tombstones`)
    forgotten: frozenset[str] = frozenset()
    # Agents other than this reader's whose sessions the database holds (a shared `session.store`)
    other_agents: frozenset[str] = frozenset()
    key: str = ""  # the cursor store's name for this agent's sessions in it (`openclaw.TranscriptDb.key`)
    # Sessions the admission policy keeps out (session id -> reason, `admission.exclusion_reason`): not read,
    # their cursors left where they were, so removing the rule reads them from there
    excluded: Mapping[str, str] = field(default_factory=dict)
    # The event ids `poll(starts=...)` asked for (session id -> id of the row at the asked seq), read only where the
    # session's consumed rows are still the ones its cursor read
    start_ids: Mapping[str, str] = field(default_factory=dict)


def event_entry_id(data: bytes) -> str:
    """The entry id the pipeline gives an event: its `id`, else "h" + blake2b of its bytes.

    Mirrors `pipeline.transform_records` so `present_event_ids` compares with stored entry ids.
    """
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict):
        ident = obj.get("id")
        if isinstance(ident, str) and ident:
            return ident
    return "h" + hashlib.blake2b(data, digest_size=10).hexdigest()


# ---------------------------------------------------------------------------------------------
# schema probing


@dataclass(frozen=True, slots=True)
class _Shape:
    cookie: int
    events_cols: frozenset[str]
    layout: Layout
    window_cols: frozenset[str]
    node_cols: frozenset[str]
    watermark_table: str | None
    cold_table: bool
    meta_cols: frozenset[str]
    identities: bool  # transcript_event_identities(session_id, event_id): which session holds which event
    tombstones: bool  # memory_session_tombstones(session_id): sessions `openclaw memory forget` forgot


def _table_columns(conn: sqlite3.Connection, table: str) -> frozenset[str]:
    rows = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
    return frozenset(_text(row[1]) or "" for row in rows)


def _probe(conn: sqlite3.Connection, cookie: int) -> _Shape:
    tables = {_text(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
    if "transcript_events" not in tables:
        raise SqliteSourceError("schema_missing", "no transcript_events table")
    events_cols = _table_columns(conn, "transcript_events")
    if not {"session_id", "seq"} <= events_cols or not {"event_json", "event_zstd"} & events_cols:
        raise SqliteSourceError("schema_missing", f"transcript_events has columns {sorted(events_cols)}")
    layout: Layout = "none"
    window_cols: frozenset[str] = frozenset()
    node_cols: frozenset[str] = frozenset()
    if "session_windows" in tables:
        layout = "windows"
        window_cols = _table_columns(conn, "session_windows")
        if "session_nodes" in tables:
            node_cols = _table_columns(conn, "session_nodes")
    elif "sessions" in tables:
        layout = "sessions"
        window_cols = _table_columns(conn, "sessions")
        if "session_entries" in tables:
            node_cols = _table_columns(conn, "session_entries")
    if not {"session_id", "session_key"} <= window_cols:
        layout, window_cols, node_cols = "none", frozenset(), frozenset()
    watermark = next((t for t in _WATERMARK_TABLES if t in tables), None)
    if watermark is not None and not {"session_id", "generation"} <= _table_columns(conn, watermark):
        watermark = None
    cold = "session_transcript_cold_archives" in tables
    meta_cols = _table_columns(conn, "schema_meta") if "schema_meta" in tables else frozenset()
    identities = ("transcript_event_identities" in tables
                  and {"session_id", "event_id"} <= _table_columns(conn, "transcript_event_identities"))
    tombstones = ("memory_session_tombstones" in tables
                  and "session_id" in _table_columns(conn, "memory_session_tombstones"))
    return _Shape(cookie, events_cols, layout, window_cols, node_cols, watermark, cold, meta_cols, identities,
                  tombstones)


def _text(value: object) -> str | None:
    """TEXT columns arrive as bytes (text_factory=bytes, so bad UTF-8 never raises mid-query)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _col(cols: frozenset[str], name: str, prefix: str = "") -> str:
    return f"{prefix}{name}" if name in cols else "NULL"


# ---------------------------------------------------------------------------------------------
# payload decoding


@dataclass(frozen=True, slots=True)
class _Row:
    seq: int
    data: bytes | None  # the event's exact UTF-8 JSON; None when it could not be decoded
    raw: bytes  # what is stored (JSON bytes or the zstd frame): the fallback identity of a bad row
    created_at: int | None
    error: tuple[str, str] | None = None  # (reason, detail)

    @property
    def key(self) -> str:
        """What the cursor remembers of this row: its entry id, or a digest of a bad row."""
        if self.data is not None:
            return event_entry_id(self.data)
        return "x" + hashlib.blake2b(self.raw, digest_size=10).hexdigest()


def _decode_row(
    dctx: zstandard.ZstdDecompressor, seq: int, event_json: object, event_zstd: object, utf8_bytes: object,
    created_at: object,
) -> _Row:
    created = _int(created_at)
    if isinstance(event_json, bytes):
        return _Row(seq, event_json, event_json, created)
    if isinstance(event_json, str):  # only if a column was declared with a non-TEXT affinity
        raw = event_json.encode("utf-8", "surrogatepass")
        return _Row(seq, raw, raw, created)
    if not isinstance(event_zstd, bytes):
        return _Row(seq, None, b"", created, ("payload_missing", "event_json and event_zstd are both NULL"))
    expected = _int(utf8_bytes)
    if expected is None or expected < 0:
        return _Row(seq, None, event_zstd, created, ("zstd_length_missing", "event_utf8_bytes is NULL"))
    if expected > MAX_DECODED_EVENT_BYTES:
        return _Row(seq, None, event_zstd, created, ("zstd_too_large", f"event_utf8_bytes {expected}"))
    try:
        declared = zstandard.frame_content_size(event_zstd)
        if declared >= 0 and declared != expected:
            return _Row(seq, None, event_zstd, created,
                        ("zstd_length_mismatch", f"frame declares {declared} bytes, event_utf8_bytes {expected}"))
        # A frame without a content size is bounded by what a valid event can be, not trusted.
        limit = 0 if declared >= 0 else expected + 1
        data = dctx.decompress(event_zstd, max_output_size=limit, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        return _Row(seq, None, event_zstd, created, ("zstd_corrupt", str(exc)[:200]))
    if len(data) != expected:
        return _Row(seq, None, event_zstd, created,
                    ("zstd_length_mismatch", f"decoded {len(data)} bytes, event_utf8_bytes {expected}"))
    return _Row(seq, data, event_zstd, created)


# ---------------------------------------------------------------------------------------------
# the reader


@dataclass
class _Settled:
    """State after a complete poll: if neither the db nor the cursors changed, skip the next."""

    data_version: int
    cursors: dict[str, SessionCursor]
    schema: SchemaInfo
    sessions: tuple[SessionInfo, ...]
    forgotten: frozenset[str]
    other_agents: frozenset[str]
    policy: tuple[AdmissionPolicy, frozenset[str]]  # what the poll was asked to keep out
    excluded: dict[str, str]


@dataclass
class _Budget:
    rows: int
    bytes: int
    used_rows: int = 0
    used_bytes: int = 0

    @property
    def exhausted(self) -> bool:
        return self.used_rows >= self.rows or self.used_bytes >= self.bytes


@dataclass
class _Snapshot:
    shape: _Shape
    schema: SchemaInfo
    windows: dict[str, SessionInfo] = field(default_factory=dict)
    stats: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # max seq, its created_at
    generations: dict[str, str] = field(default_factory=dict)
    cold_last_seq: dict[str, int | None] = field(default_factory=dict)  # the last seq each cold archive holds
    forgotten: frozenset[str] = frozenset()
    other_agents: frozenset[str] = frozenset()  # agents whose sessions the database holds besides ours
    metadata: dict[str, SessionMetadata] = field(default_factory=dict)  # what admission matches on
    excluded: dict[str, str] = field(default_factory=dict)  # session id -> why the admission policy keeps it out
    starts: Mapping[str, int] = field(default_factory=dict)  # what `poll(starts=...)` asked for
    start_ids: dict[str, str] = field(default_factory=dict)  # what it found

    @property
    def cold(self) -> KeysView[str]:
        """The sessions whose rows are in a cold archive."""
        return self.cold_last_seq.keys()


class SqliteTranscriptReader:
    """Incremental, read-only reader of one agent's sessions in one `openclaw-agent.sqlite`.

    It reads the sessions whose key names `agent_id` and, when the database is that agent's own (its
    `schema_meta` names it, or names no one), those whose key names no agent; a database shared by several
    agents (a `session.store` ending in `.sqlite`) gets one reader per agent. `key` names it in polls
    (`SqlitePoll.key`)."""

    def __init__(self, path: Path, agent_id: str, *, key: str | None = None,
                 busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        self.path = path
        self.agent_id = agent_id
        self.key = key if key is not None else str(path)
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._file_id: tuple[int, int] | None = None
        self._shape: _Shape | None = None
        self._settled: _Settled | None = None
        self._headers: dict[tuple[str, str | None], str] = {}  # (session, generation) -> point session id
        self._resume_after: str | None = None  # round-robin start, so one backlog cannot starve others
        self._dctx = zstandard.ZstdDecompressor()
        self._cold: tuple[str, list[tuple[object, ...]]] | None = None  # the last cold archive read (sha, rows)
        self._cold_failed: set[str] = set()  # archives told unreadable (one line each; bounded by the archives)

    # -- lifecycle

    def close(self) -> None:
        with self._lock:
            self._drop_connection()

    def __enter__(self) -> SqliteTranscriptReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with suppress(sqlite3.Error):
                self._conn.close()
        self._conn = None
        self._file_id = None
        self._shape = None
        self._settled = None
        self._headers.clear()

    def _connection(self) -> sqlite3.Connection:
        try:
            st = os.stat(self.path)
        except FileNotFoundError as exc:
            self._drop_connection()
            raise SqliteSourceError("missing", "database file does not exist", str(self.path)) from exc
        except OSError as exc:
            self._drop_connection()
            raise SqliteSourceError("io_error", str(exc), str(self.path)) from exc
        file_id = (st.st_dev, st.st_ino)
        if self._conn is not None and file_id != self._file_id:
            log.info("sqlite_source_replaced", path=str(self.path))  # restored backup, new inode
            self._drop_connection()
        if self._conn is None:
            uri = self.path.resolve().as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, timeout=self._busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
            conn.text_factory = bytes
            try:
                conn.execute("PRAGMA query_only=ON").fetchall()
            except sqlite3.Error:
                conn.close()
                raise
            self._conn = conn
            self._file_id = file_id
        return self._conn

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """One read under the lock: a sqlite3 error drops the connection (the next read opens it again) and
        is raised as a SqliteSourceError, never raw."""
        with self._lock:
            try:
                yield
            except sqlite3.Error as exc:
                self._drop_connection()
                raise _classify(exc, self.path) from exc

    # -- polling

    def poll(self, cursors: Mapping[str, SessionCursor], max_rows: int = DEFAULT_MAX_ROWS,
             max_bytes: int = DEFAULT_MAX_BYTES, *, policy: AdmissionPolicy | None = None,
             forgotten: AbstractSet[str] = frozenset(), starts: Mapping[str, int] | None = None) -> SqlitePoll:
        """Read what is new since `cursors` (keyed by session id) in one short read transaction.

        Sessions `policy` excludes (by the metadata OpenClaw recorded) and those in `forgotten` (besides the ones
        OpenClaw's tombstones name) are not read. `starts` (session id -> a seq its cursor consumed) asks for the
        event id of those rows, answered in `SqlitePoll.start_ids` where the poll finds the session's consumed rows
        unchanged (not where a restored backup or a rewrite changed them). Raises SqliteSourceError (never a raw
        sqlite3 error) when the database cannot be read.
        """
        if max_rows < 1 or max_bytes < 1:
            raise ValueError("max_rows and max_bytes must be positive")
        asked = (policy or AdmissionPolicy(), frozenset(forgotten))
        with self._reading():
            return self._poll(dict(cursors), _Budget(max_rows, max_bytes), asked, starts or {})

    def _poll(self, cursors: dict[str, SessionCursor], budget: _Budget,
              asked: tuple[AdmissionPolicy, frozenset[str]], starts: Mapping[str, int]) -> SqlitePoll:
        conn = self._connection()
        data_version = int(conn.execute("PRAGMA data_version").fetchall()[0][0])
        settled = self._settled
        if (settled is not None and settled.data_version == data_version and settled.cursors == cursors
                and settled.policy == asked):
            return SqlitePoll(str(self.path), self.agent_id, settled.schema, settled.sessions, (), False, True,
                              settled.forgotten, settled.other_agents, self.key, settled.excluded)
        conn.execute("BEGIN")  # one snapshot for every statement below
        try:
            snap = self._snapshot(conn)
            snap.starts = starts
            self._admit(snap, *asked)
            batches, more = self._read_sessions(conn, snap, cursors, budget)
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
        sessions = tuple(sorted(snap.windows.values(), key=lambda s: (s.started_at or 0, s.session_id)))
        if more:
            self._settled = None
        else:
            committed = dict(cursors)
            for batch in batches:
                if batch.cursor is None:
                    committed.pop(batch.session_id, None)
                else:
                    committed[batch.session_id] = batch.cursor
            self._settled = _Settled(data_version, committed, snap.schema, sessions, snap.forgotten,
                                     snap.other_agents, asked, snap.excluded)
        return SqlitePoll(str(self.path), self.agent_id, snap.schema, sessions, tuple(batches), more,
                          forgotten=snap.forgotten, other_agents=snap.other_agents, key=self.key,
                          excluded=snap.excluded, start_ids=snap.start_ids)

    @staticmethod
    def _admit(snap: _Snapshot, policy: AdmissionPolicy, forgotten: frozenset[str]) -> None:
        """What the person keeps out: the sessions forgotten here too, and those the policy excludes (a
        forgotten one counts as forgotten only, as OpenClaw checks the tombstones first)."""
        snap.forgotten |= forgotten & (snap.windows.keys() | snap.stats.keys() | snap.cold)
        if policy:
            snap.excluded = {sid: reason for sid, meta in snap.metadata.items()
                             if sid not in snap.forgotten and (reason := exclusion_reason(meta, policy))}

    def _snapshot(self, conn: sqlite3.Connection) -> _Snapshot:
        cookie = int(conn.execute("PRAGMA schema_version").fetchall()[0][0])
        if self._shape is None or self._shape.cookie != cookie:
            self._shape = _probe(conn, cookie)
            log.debug("sqlite_schema_probed", path=str(self.path), layout=self._shape.layout,
                      columns=sorted(self._shape.events_cols))
        shape = self._shape
        snap = _Snapshot(shape, self._schema_info(conn, shape))
        # A loose index scan: O(sessions * log rows) on the (session_id, seq) primary key, where a
        # GROUP BY would visit every row of the table on every poll.
        created = _col(shape.events_cols, "created_at", "e.")
        for sid, max_seq, last_created in conn.execute(
            "WITH RECURSIVE ids(sid) AS ("
            " SELECT (SELECT min(session_id) FROM transcript_events)"
            " UNION ALL SELECT (SELECT min(session_id) FROM transcript_events WHERE session_id > ids.sid)"
            " FROM ids WHERE ids.sid IS NOT NULL),"
            " tops(sid, max_seq) AS (SELECT sid, (SELECT max(seq) FROM transcript_events WHERE session_id = ids.sid)"
            " FROM ids WHERE sid IS NOT NULL)"
            " SELECT tops.sid, tops.max_seq, " + created + " FROM tops"
            " JOIN transcript_events e ON e.session_id = tops.sid AND e.seq = tops.max_seq"
        ).fetchall():
            snap.stats[_text(sid) or ""] = (int(max_seq), _int(last_created))
        if shape.watermark_table is not None:
            for sid, generation in conn.execute(
                f'SELECT session_id, generation FROM "{shape.watermark_table}"'
            ).fetchall():
                snap.generations[_text(sid) or ""] = _text(generation) or ""
        if shape.cold_table:
            snap.cold_last_seq = {
                _text(sid) or "": _int(last) for sid, last in conn.execute(
                    "SELECT session_id, last_seq FROM session_transcript_cold_archives").fetchall()
            }
        if shape.tombstones:
            snap.forgotten = frozenset(
                _text(r[0]) or "" for r in conn.execute("SELECT session_id FROM memory_session_tombstones").fetchall()
            )
        snap.windows = self._windows(conn, snap)
        self._keep_own(snap)
        return snap

    def _keep_own(self, snap: _Snapshot) -> None:
        """Leave out the sessions of other agents (a shared database): their memories are theirs."""
        meta = snap.schema.meta_agent_id
        owner = normalize_agent_id(meta) if meta is not None else self.agent_id
        others: set[str] = set()
        theirs: set[str] = set()
        for sid, info in snap.windows.items():  # a session without a window is the owner's
            agent = session_key_agent(info.session_key) or owner
            if agent != self.agent_id:
                theirs.add(sid)
                others.add(agent)
        if owner != self.agent_id:
            theirs |= snap.cold - snap.windows.keys()
        snap.other_agents = frozenset(others)
        if not theirs:
            return
        snap.windows = {sid: info for sid, info in snap.windows.items() if sid not in theirs}
        snap.stats = {sid: v for sid, v in snap.stats.items() if sid not in theirs}
        snap.generations = {sid: v for sid, v in snap.generations.items() if sid not in theirs}
        snap.cold_last_seq = {sid: v for sid, v in snap.cold_last_seq.items() if sid not in theirs}
        snap.metadata = {sid: v for sid, v in snap.metadata.items() if sid not in theirs}
        snap.forgotten = snap.forgotten - theirs

    def _schema_info(self, conn: sqlite3.Connection, shape: _Shape) -> SchemaInfo:
        user_version = int(conn.execute("PRAGMA user_version").fetchall()[0][0])
        schema_version, app_version, meta_agent = user_version, None, None
        if {"meta_key", "schema_version"} <= shape.meta_cols:
            rows = conn.execute(
                "SELECT schema_version, " + _col(shape.meta_cols, "app_version") + ", "
                + _col(shape.meta_cols, "agent_id") + " FROM schema_meta WHERE meta_key = 'primary'"
            ).fetchall()
            if rows and _int(rows[0][0]) is not None:
                schema_version = int(rows[0][0])
                app_version, meta_agent = _text(rows[0][1]), _text(rows[0][2])
        payload = tuple(c for c in ("event_json", "event_zstd") if c in shape.events_cols)
        return SchemaInfo(user_version, schema_version, app_version, meta_agent, shape.layout, payload,
                          shape.watermark_table, shape.cold_table)

    def _windows(self, conn: sqlite3.Connection, snap: _Snapshot) -> dict[str, SessionInfo]:
        shape = snap.shape
        found: dict[str, SessionInfo] = {}
        if shape.layout != "none":
            w, n = shape.window_cols, shape.node_cols
            table, node_table, current = (
                ("session_windows", "session_nodes", "current_session_id") if shape.layout == "windows"
                else ("sessions", "session_entries", "session_id")
            )
            joined = {"session_key", current} <= n
            # the exact hook source: the key's current entry's, while that entry is this session
            entry_hook = ("CASE WHEN json_valid(n.entry_json) AND json_extract(n.entry_json, '$.sessionId')"
                          " = w.session_id THEN json_extract(n.entry_json, '$.hookExternalContentSource') END"
                          if joined and "entry_json" in n else "NULL")
            sql = (
                "SELECT w.session_id, w.session_key, " + _col(w, "previous_session_id", "w.") + ", "
                + _col(w, "started_at", "w.") + ", " + _col(w, "created_at", "w.") + ", "
                + _col(w, "ended_at", "w.") + ", " + _col(w, "reason", "w.") + ", "
                + (f"n.{current}" if joined else "NULL") + ", "
                + ", ".join(_col(w, c, "w.") for c in ("channel", "chat_type", "hook_external_content_source",
                                                        "session_entry_provenance"))
                + ", " + entry_hook + f" FROM {table} w"
                + (f" LEFT JOIN {node_table} n ON n.session_key = w.session_key" if joined else "")
            )
            for (sid_b, key, prev, started, created, ended_at, reason, current_sid, channel, chat_type, hook,
                 provenance, entry_hook_source) in conn.execute(sql).fetchall():
                sid = _text(sid_b) or ""
                cur = _text(current_sid)
                snap.metadata[sid] = session_metadata(
                    channel=_text(channel), chat_type=_text(chat_type), hook_column=_text(hook),
                    provenance=_int(provenance), entry_hook_source=_text(entry_hook_source))
                # a session in cold storage: the last seq its archive holds (what is unread there is lag too)
                last_seq, last_created = snap.stats.get(sid, (snap.cold_last_seq.get(sid), None))
                found[sid] = SessionInfo(
                    session_id=sid,
                    session_key=_text(key),
                    previous_session_id=_text(prev),
                    started_at=_int(started) if _int(started) is not None else _int(created),
                    ended=cur is not None and cur != sid,
                    ended_at=_int(ended_at),
                    reason=_text(reason),
                    cold_archived=sid in snap.cold,
                    last_seq=last_seq,
                    last_created_at=last_created,
                )
        for sid, (last_seq, last_created) in snap.stats.items():
            if sid not in found:  # rows without a window: foreign keys off, or an unknown layout
                found[sid] = SessionInfo(sid, None, None, None, False, None, None, sid in snap.cold, last_seq,
                                         last_created)
        return found

    def _read_sessions(self, conn: sqlite3.Connection, snap: _Snapshot, cursors: dict[str, SessionCursor],
                       budget: _Budget) -> tuple[list[SessionBatch], bool]:
        # A forgotten session is read no more, whatever it still holds (its rows stay in OpenClaw's store); an
        # excluded one is not read while the policy excludes it (its cursor stays where it was).
        order = sorted((set(cursors) | set(snap.stats) | snap.cold) - snap.forgotten - snap.excluded.keys())
        if self._resume_after is not None:
            split = next((i for i, sid in enumerate(order) if sid > self._resume_after), 0)
            order = order[split:] + order[:split]
        self._resume_after = None
        batches: list[SessionBatch] = []
        for sid in order:
            if budget.exhausted:
                self._resume_after = batches[-1].session_id if batches else None
                return batches, True
            batch, more = self._read_session(conn, snap, sid, cursors.get(sid), budget)
            if batch is not None:
                batches.append(batch)
            if more:
                self._resume_after = sid  # the next poll starts with the sessions after this one
                return batches, True
        return batches, False

    def _read_session(self, conn: sqlite3.Connection, snap: _Snapshot, sid: str, cursor: SessionCursor | None,
                      budget: _Budget) -> tuple[SessionBatch | None, bool]:
        stats = snap.stats.get(sid)
        generation = snap.generations.get(sid)
        if cursor is None:
            if stats is None:
                return self._cold_batch(conn, snap, sid, None, budget) if sid in snap.cold else (None, False)
            return self._batch(conn, snap, sid, _SEQ_MIN, 0, generation, budget, rewalk=None)
        if stats is None:  # no rows at all
            if sid in snap.cold:  # moved to a cold archive: history, not a rewrite; what is unread is read there
                return self._cold_batch(conn, snap, sid, cursor, budget)
            self._forget(sid)
            if sid not in snap.windows:
                return SessionBatch(sid, sid, (), (), None, True, "window_vanished"), False
            if cursor.row_count == 0:
                return None, False
            # Emptied in place: restart the cursor, but never wipe a session's memory for it.
            restart = SessionCursor(sid, 0, generation, None, 0)
            return SessionBatch(sid, sid, (), (), restart, True, "rows_changed"), False
        reason = self._rewrite_reason(conn, snap, sid, cursor, generation)
        if reason == "cold":
            return None, False
        if reason is not None:
            self._forget(sid)
            return self._batch(conn, snap, sid, _SEQ_MIN, 0, generation, budget, rewalk=reason)
        asked = snap.starts.get(sid)
        if asked is not None and asked < cursor.next_seq and (row := self._row_at(conn, snap.shape, sid, asked)):
            snap.start_ids[sid] = row.key  # a row the cursor consumed, still the same (just checked)
        if stats[0] < cursor.next_seq:
            return None, False
        return self._batch(conn, snap, sid, cursor.next_seq, cursor.row_count, generation or cursor.generation,
                           budget, rewalk=None)

    def _rewrite_reason(self, conn: sqlite3.Connection, snap: _Snapshot, sid: str, cursor: SessionCursor,
                        generation: str | None) -> RewalkReason | Literal["cold"] | None:
        """Why the rows the cursor covers are no longer the rows it consumed, if they are not."""
        max_seq, _ = snap.stats[sid]
        if cursor.generation is not None and generation is not None and generation != cursor.generation:
            return "generation_changed"  # OpenClaw rotates it with every destructive change
        # "Rotate the watermark in the same transaction as destructive transcript replacement" (2026.9.6):
        # consumed rows changed under the generation they were read with are not OpenClaw's rewrite.
        unrotated = generation is not None and generation == cursor.generation
        # Counting costs O(rows of the session), so it is skipped when an unchanged watermark vouches
        # for the rows and nothing was appended: rows deleted without a rotation (OpenClaw never does
        # that; a restored older copy of the database can) are then found at the session's next append.
        if not unrotated or max_seq >= cursor.next_seq:
            below = int(conn.execute(
                "SELECT count(*) FROM transcript_events WHERE session_id = ? AND seq < ?",
                (sid, cursor.next_seq)).fetchall()[0][0])
            if below != cursor.row_count:
                if sid in snap.cold and below < cursor.row_count:
                    return "cold"  # partly moved to a cold archive: keep what we have
                return "restored" if unrotated else "rows_changed"
        if cursor.row_count == 0:
            return None
        # The last consumed row must still be the same event: another one there is a rewrite where no
        # generation can say so (a schema without one), else the database went back in time.
        if not self._same_event_at(conn, snap.shape, sid, cursor.next_seq - 1, cursor.last_event_id):
            return "restored" if unrotated else "event_changed"
        return None

    def _same_event_at(self, conn: sqlite3.Connection, shape: _Shape, sid: str, seq: int,
                       expected: str | None) -> bool:
        """Whether the row at `seq` is the event `expected` names. Cheap first: SQLite extracts the
        `id` of a plain row without shipping its body; only a miss is confirmed by a full decode (so
        a quirk of SQLite's JSON can cost a decode, never a spurious rewalk)."""
        if "event_json" in shape.events_cols:
            rows = conn.execute(
                "SELECT CASE WHEN event_json IS NOT NULL AND json_valid(event_json)"
                " AND json_type(event_json, '$.id') = 'text' THEN json_extract(event_json, '$.id') END"
                " FROM transcript_events WHERE session_id = ? AND seq = ?", (sid, seq)).fetchall()
            if not rows:
                return False
            if expected is not None and _text(rows[0][0]) == expected:
                return True
        row = self._row_at(conn, shape, sid, seq)
        return row is not None and row.key == expected

    def _forget(self, sid: str) -> None:
        for key in [k for k in self._headers if k[0] == sid]:
            del self._headers[key]

    def _select_payload(self, shape: _Shape) -> str:
        cols = shape.events_cols
        return ", ".join(_col(cols, c) for c in ("event_json", "event_zstd", "event_utf8_bytes", "created_at"))

    def _row_at(self, conn: sqlite3.Connection, shape: _Shape, sid: str, seq: int) -> _Row | None:
        rows = conn.execute(
            "SELECT seq, " + self._select_payload(shape) + " FROM transcript_events WHERE session_id = ? AND seq = ?",
            (sid, seq)).fetchall()
        return self._decode(rows[0]) if rows else None

    @contextmanager
    def _raw_rows(self, conn: sqlite3.Connection, shape: _Shape, sid: str, start: int,
                  limit: int | None = None) -> Iterator[Iterator[tuple[object, ...]]]:
        """Rows from `start` in seq order, undecoded; the statement is reset on exit, so a
        half-read SELECT never outlives the poll (it would hold the read transaction open)."""
        sql = ("SELECT seq, " + self._select_payload(shape)
               + " FROM transcript_events WHERE session_id = ? AND seq >= ? ORDER BY seq")
        params: tuple[object, ...] = (sid, start)
        if limit is not None:
            sql += " LIMIT ?"
            params = (sid, start, limit)
        cur = conn.execute(sql, params)

        def rows() -> Iterator[tuple[object, ...]]:
            while chunk := cur.fetchmany(_FETCH_CHUNK):
                yield from chunk

        try:
            yield rows()
        finally:
            cur.close()

    def _decode(self, raw: tuple[object, ...]) -> _Row:
        seq, event_json, event_zstd, utf8_bytes, created_at = raw
        if not isinstance(seq, int):  # INTEGER PRIMARY KEY part: only a damaged row holds anything else
            raise SqliteSourceError("corrupt", f"non-integer seq {seq!r}", str(self.path))
        return _decode_row(self._dctx, seq, event_json, event_zstd, utf8_bytes, created_at)

    def _point_session_id(self, conn: sqlite3.Connection, shape: _Shape, sid: str, generation: str | None,
                          cold: Sequence[tuple[object, ...]] | None = None) -> str:
        cached = self._headers.get((sid, generation))
        if cached is not None:
            return cached
        head = nullcontext(iter(cold)) if cold is not None else self._raw_rows(conn, shape, sid, _SEQ_MIN, limit=1)
        with head as rows:
            first = next((self._decode(raw) for raw in rows), None)
        point_sid = sid
        if first is not None and first.data is not None:
            try:
                obj = json.loads(first.data)
            except (ValueError, RecursionError):
                obj = None
            if isinstance(obj, dict) and obj.get("type") == "session":
                ident = obj.get("id")
                if isinstance(ident, str) and ident:
                    point_sid = ident
        self._headers[(sid, generation)] = point_sid
        return point_sid

    def _cold_batch(self, conn: sqlite3.Connection, snap: _Snapshot, sid: str, cursor: SessionCursor | None,
                    budget: _Budget) -> tuple[SessionBatch | None, bool]:
        """What the cursor has not read of a session whose rows are in a cold archive, read from the archive
        (opened only when its recorded last seq says the cursor has not read it all)."""
        start = cursor.next_seq if cursor is not None else _SEQ_MIN
        last_seq = snap.cold_last_seq.get(sid)
        if last_seq is not None and last_seq < start:
            return None, False
        rows = self._cold_rows(conn, sid)
        if rows is None or not any(isinstance(raw[0], int) and raw[0] >= start for raw in rows):
            return None, False
        generation = snap.generations.get(sid) or (cursor.generation if cursor is not None else None)
        return self._batch(conn, snap, sid, start, cursor.row_count if cursor is not None else 0, generation,
                           budget, rewalk=None, cold=rows)

    def _cold_rows(self, conn: sqlite3.Connection, sid: str) -> list[tuple[object, ...]] | None:
        """The event rows of `sid`'s cold archive as `_raw_rows` yields them; None if it cannot be read (told
        once: OpenClaw cannot read it either until the file is restored from a backup)."""
        found = conn.execute("SELECT archive_name, archive_sha256, archive_bytes, storage, archive_blob"
                             " FROM session_transcript_cold_archives WHERE session_id = ?", (sid,)).fetchall()
        if not found:
            return None
        name, sha, size, storage, blob = (_text(found[0][0]) or "", _text(found[0][1]) or "", _int(found[0][2]),
                                          _text(found[0][3]), found[0][4])
        if self._cold is not None and self._cold[0] == sha:
            return self._cold[1]
        where = f"{self.path}#{sid}" if storage == "sqlite" else str(_artifact_dir(self.path) / "cold" / name)
        try:
            rows = self._read_cold(name, sha, size, storage, blob)
        except (OSError, ValueError, zstandard.ZstdError) as exc:
            if sha not in self._cold_failed:
                self._cold_failed.add(sha)
                log.warning("cold_archive_unreadable", agent=self.agent_id, session_id=sid, path=where,
                            detail=f"{type(exc).__name__}: {exc}"[:300])
            return None
        self._cold = (sha, rows)
        return rows

    def _read_cold(self, name: str, sha: str, size: int | None, storage: str | None,
                   blob: object) -> list[tuple[object, ...]]:
        if storage == "sqlite":
            if not isinstance(blob, bytes):
                raise ValueError("no archive_blob")
            data = blob
        else:
            if not _COLD_ARCHIVE_NAME.fullmatch(name):
                raise ValueError(f"not an archive name OpenClaw writes: {name[:80]!r}")
            path = _artifact_dir(self.path) / "cold" / name
            if size is None or size > MAX_COLD_ARCHIVE_BYTES or path.stat().st_size != size:
                raise ValueError(f"size is not the recorded {size}")
            data = path.read_bytes()
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            raise ValueError("size or SHA-256 is not what OpenClaw recorded")
        with self._dctx.stream_reader(data) as reader:
            jsonl = reader.read(MAX_COLD_ARCHIVE_BYTES + 1)
        if len(jsonl) > MAX_COLD_ARCHIVE_BYTES:
            raise ValueError(f"decodes to more than {MAX_COLD_ARCHIVE_BYTES} bytes")
        events: list[tuple[int, bytes, object]] = []  # the archive's `event` records: seq, event JSON, created_at
        for line in jsonl.splitlines():
            record = json.loads(line) if line.strip() else None
            row = record.get("row") if isinstance(record, dict) and record.get("kind") == "event" else None
            if isinstance(row, dict) and isinstance(row.get("seq"), int) and isinstance(row.get("event_json"), str):
                events.append((row["seq"], row["event_json"].encode("utf-8", "surrogatepass"), row.get("created_at")))
        return [(seq, data, None, None, created) for seq, data, created in sorted(events, key=lambda e: e[0])]

    def _batch(self, conn: sqlite3.Connection, snap: _Snapshot, sid: str, start: int, row_count: int,
               generation: str | None, budget: _Budget, *, rewalk: RewalkReason | None,
               cold: Sequence[tuple[object, ...]] | None = None) -> tuple[SessionBatch | None, bool]:
        """Rows of `sid` from `start` within the budget (from its cold archive's `cold` rows when given);
        (batch, budget-stopped-it)."""
        shape = snap.shape
        point_sid = self._point_session_id(conn, shape, sid, generation, cold)
        source_path = str(self.path)
        keyed: list[tuple[str, RawRecord]] = []
        opened = snap.windows[sid].started_at if sid in snap.windows else None
        older: list[str] = []  # rows whose event is older than the session: only those can be copies
        errors: list[SqliteRowError] = []
        last: _Row | None = None
        more = False
        unread = nullcontext(iter([raw for raw in cold if isinstance(raw[0], int) and raw[0] >= start])) \
            if cold is not None else self._raw_rows(conn, shape, sid, start)
        with unread as rows:
            for raw in rows:
                if budget.exhausted:
                    more = True
                    break
                row = self._decode(raw)
                budget.used_rows += 1
                budget.used_bytes += len(row.raw) if row.data is None else len(row.data)
                last = row
                if row.data is None:
                    reason, detail = row.error or ("payload_missing", "")
                    errors.append(SqliteRowError(sid, row.seq, reason, detail))
                else:
                    keyed.append((row.key, RawRecord(self.agent_id, row.data, SourceRef(
                        kind="sqlite", path=source_path, session_id=sid, seq=row.seq))))
                    if opened is None or row.created_at is None or row.created_at < opened:
                        older.append(row.key)
        if last is None:
            # Nothing fit (or nothing left): a rewalk is re-detected by the next poll, unchanged.
            return None, more
        copied = self._copied(conn, snap, sid, older)
        records = [record for key, record in keyed if key not in copied]
        present = self._present_ids(conn, shape, sid) if rewalk is not None else None
        cursor = SessionCursor(sid, last.seq + 1, generation, last.key, row_count + len(keyed) + len(errors))
        batch = SessionBatch(sid, point_sid, tuple(records), tuple(errors), cursor, rewalk is not None, rewalk,
                             present, more, last.created_at)
        return batch, more

    def _copied(self, conn: sqlite3.Connection, snap: _Snapshot, sid: str, keys: Sequence[str]) -> frozenset[str]:
        """Which of `keys` (event ids of `sid`) are copies of events another session holds: OpenClaw 2026.9.6
        makes a rewind a new session of the same key holding a copy of the old one (then a `leaf` row and the
        new turns), and a fork a session of its own whose first rows are the parent's. Each event is one
        memory, stored from the session that wrote it first. A copy keeps its event's time, older than the
        session it is copied into, so rows written since (every live append) cost no lookup. An origin in cold
        storage has its identities in its archive (they cascade away with its rows): its events are read there."""
        shape = snap.shape
        if not keys or not shape.identities or shape.layout != "windows":
            return frozenset()
        origins = _origin_sessions(conn, shape, sid)
        found: set[str] = set()
        for origin in origins:
            if origin in snap.cold and not snap.stats.get(origin):
                archived = {_Row(raw[0], raw[1], raw[1], None).key for raw in self._cold_rows(conn, origin) or ()
                            if isinstance(raw[0], int) and isinstance(raw[1], bytes)}
                found.update(k for k in keys if k in archived)
                continue
            for start in range(0, len(keys), _IN_CHUNK):
                part = keys[start:start + _IN_CHUNK]
                rows = conn.execute(
                    "SELECT event_id FROM transcript_event_identities WHERE session_id = ? AND event_id IN ("
                    + ",".join("?" * len(part)) + ")", (origin, *part)).fetchall()
                found.update(_text(row[0]) or "" for row in rows)
        return frozenset(found)

    def continued(self, session_id: str) -> bool:
        """Whether a later window of `session_id` holds a copy of it (a rewind: the conversation goes on in
        the new session, so the key moving on is no end). Asked once per session, when its end is due."""
        with self._reading():
            shape = self._shape
            if (shape is None or not shape.identities or shape.layout != "windows"
                    or "previous_session_id" not in shape.window_cols):
                return False
            rows = self._connection().execute(
                "SELECT 1 FROM session_windows c"
                " JOIN transcript_event_identities a ON a.session_id = c.session_id"
                " JOIN transcript_event_identities b ON b.session_id = ? AND b.event_id = a.event_id"
                " WHERE c.previous_session_id = ? LIMIT 1", (session_id, session_id)).fetchall()
            return bool(rows)

    def _present_ids(self, conn: sqlite3.Connection, shape: _Shape, sid: str) -> frozenset[str] | None:
        with self._raw_rows(conn, shape, sid, _SEQ_MIN) as rows:
            ids = frozenset(row.key for row in map(self._decode, rows) if row.data is not None)
        return ids or None


_IN_CHUNK = 500  # event ids per IN (...) list: under SQLite's bound-parameter limit on every build


def _artifact_dir(db: Path) -> Path:
    """OpenClaw's session artifact directory of a database (resolveSessionArtifactDirectory): `sessions/`
    beside its `agent/` directory, else the database's own directory."""
    return db.parent.parent / "sessions" if db.parent.name == "agent" else db.parent


def _origin_sessions(conn: sqlite3.Connection, shape: _Shape, sid: str) -> list[str]:
    """The sessions `sid` may hold copies of: its previous window (a rewind) and the windows of its parent
    key (a fork). Other windows of the key are a new conversation's, which copies nothing."""
    cols = shape.window_cols
    prev = "previous_session_id" if "previous_session_id" in cols else "NULL"
    parent = "parent_session_key" if "parent_session_key" in cols else "NULL"
    row = conn.execute(f"SELECT {prev}, {parent} FROM session_windows WHERE session_id = ?", (sid,)).fetchone()
    if row is None:
        return []
    origins = [p] if (p := _text(row[0])) and p != sid else []
    if key := _text(row[1]):
        origins += [o for (o_b,) in conn.execute(
            "SELECT session_id FROM session_windows WHERE session_key = ? AND session_id != ?", (key, sid)).fetchall()
            if (o := _text(o_b)) and o not in origins]
    return origins


def _classify(exc: sqlite3.Error, path: Path) -> SqliteSourceError:
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    reason = {
        5: "locked",  # SQLITE_BUSY
        6: "locked",  # SQLITE_LOCKED
        8: "readonly",  # SQLITE_READONLY (e.g. a WAL that needs recovery by a writer)
        10: "io_error",  # SQLITE_IOERR
        11: "corrupt",  # SQLITE_CORRUPT
        14: "cannot_open",  # SQLITE_CANTOPEN
        26: "corrupt",  # SQLITE_NOTADB
    }.get(primary if primary is not None else -1, "sqlite_error")
    return SqliteSourceError(reason, f"{type(exc).__name__}: {exc}"[:300], str(path))
