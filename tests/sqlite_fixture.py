"""OpenClaw agent databases for tests: the real DDL, and a writer that behaves like OpenClaw's.

`create_database(path, shape)` builds `openclaw-agent.sqlite` from the verbatim DDL captured in
`../shared/notes/openclaw-sqlite/` (embedded below, so tests do not need ../shared):

- "early": the pre-ship `sessions` / `session_entries` layout (b8a49978), user_version 1;
- "v19":   the `session_nodes` / `session_windows` STRICT layout (0b03f834), what 2026.8.1-9.4 ship;
- "v23":   v19 with schema 23's rebuilt `transcript_events` (event_zstd, event_utf8_bytes,
           navigation_json, the octet_length CHECK), `session_nodes.legacy_acp_migration_json`
           and `session_transcript_cold_archives` (2026.9.6);
- "v24":   v23 plus `session_nodes.snapshot_revision` (2026.9.7).

Not verbatim, and said where: a stand-in `conversations` table (its DDL is omitted from the
capture but `session_windows` references it, and SQLite refuses a write to a child whose parent
table is missing), and the schema 20-22/24 side tables whose DDL was not captured.

`OpenClawWriter` writes the way the notes say OpenClaw does: WAL, synchronous=NORMAL, one
`BEGIN IMMEDIATE` transaction per mutation, `seq = max + 1` from 0 (the header), `created_at` =
the event's own time in epoch ms, identity rows, a rewrite watermark materialised by the first
append and rotated by every destructive change (suffix rewrite, full replacement, UPDATE),
selective zstd compression on schema 23+, resets as new windows, deletion with an archive row.
It records how long it waited for its write lock, so tests can prove a reader never blocked it.
"""

# ruff: noqa: E501  (the DDL below is verbatim and keeps OpenClaw's long lines)
from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import random
import sqlite3
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import zstandard

from tests.fixture_paths import shared_dir

Shape = Literal["early", "v19", "v23", "v24"]
SHAPES: tuple[Shape, ...] = ("early", "v19", "v23", "v24")
# (user_version, app_version) per shape; 2026.8.1-9.4 = 19, 9.6 = 23, 9.7 = 24 (openclaw-transcripts.md)
SHAPE_VERSIONS: dict[Shape, tuple[int, str]] = {
    "early": (1, "2026.6.1"),
    "v19": (19, "2026.9.4"),
    "v23": (23, "2026.9.6"),
    "v24": (24, "2026.9.7"),
}
_SHARED = shared_dir()
FIXTURE_SESSIONS = (_SHARED / "fixtures" / "openclaw" / "zapabob-main" / "sessions" if _SHARED
                    else Path("/nonexistent/shared/fixtures"))

# Schema 23's compression rule (agent-schema-history.md): UTF-8 events from 1 KiB through 4 MiB,
# only when the frame plus its navigation metadata saves at least 64 bytes and 10 percent.
COMPRESS_MIN_BYTES = 1024
COMPRESS_MAX_BYTES = 4 * 1024 * 1024
SESSION_HEADER_VERSION = 3

EARLY_DDL = r"""
CREATE TABLE IF NOT EXISTS schema_meta (
  meta_key TEXT NOT NULL PRIMARY KEY,
  role TEXT NOT NULL,
  schema_version INTEGER NOT NULL,
  agent_id TEXT,
  app_version TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS sessions (
  session_id TEXT NOT NULL PRIMARY KEY,
  session_key TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  started_at INTEGER,
  ended_at INTEGER,
  status TEXT,
  chat_type TEXT,
  channel TEXT,
  model_provider TEXT,
  model TEXT,
  agent_harness_id TEXT,
  parent_session_key TEXT,
  spawned_by TEXT,
  display_name TEXT
);

CREATE INDEX IF NOT EXISTS idx_agent_sessions_updated_at
  ON sessions(updated_at DESC, session_id);

CREATE INDEX IF NOT EXISTS idx_agent_sessions_created_at
  ON sessions(created_at DESC, session_id);

CREATE INDEX IF NOT EXISTS idx_agent_sessions_session_key
  ON sessions(session_key);

CREATE TABLE IF NOT EXISTS session_entries (
  session_key TEXT NOT NULL PRIMARY KEY,
  session_id TEXT NOT NULL,
  entry_json TEXT NOT NULL,
  updated_at INTEGER NOT NULL,
  FOREIGN KEY (session_id) REFERENCES sessions(session_id) ON DELETE CASCADE
);

CREATE INDEX IF NOT EXISTS idx_agent_session_entries_updated_at
  ON session_entries(updated_at DESC, session_key);

CREATE INDEX IF NOT EXISTS idx_agent_session_entries_session_id
  ON session_entries(session_id);

CREATE TABLE IF NOT EXISTS transcript_events (
  session_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event_json TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (session_id, seq),
  FOREIGN KEY (session_id) REFERENCES sessions(session_id) ON DELETE CASCADE
);

CREATE INDEX IF NOT EXISTS idx_agent_transcript_events_updated
  ON transcript_events(session_id, created_at DESC, seq DESC);

CREATE TABLE IF NOT EXISTS transcript_event_identities (
  session_id TEXT NOT NULL,
  event_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event_type TEXT,
  has_parent INTEGER NOT NULL DEFAULT 0,
  parent_id TEXT,
  message_idempotency_key TEXT,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (session_id, event_id),
  FOREIGN KEY (session_id, seq) REFERENCES transcript_events(session_id, seq) ON DELETE CASCADE
);

CREATE UNIQUE INDEX IF NOT EXISTS idx_agent_transcript_message_idempotency
  ON transcript_event_identities(session_id, message_idempotency_key)
  WHERE message_idempotency_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS idx_agent_transcript_tail
  ON transcript_event_identities(session_id, seq DESC)
  WHERE has_parent = 1;

CREATE TABLE IF NOT EXISTS transcript_snapshots (
  session_id TEXT NOT NULL,
  snapshot_id TEXT NOT NULL,
  reason TEXT NOT NULL,
  event_count INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  metadata_json TEXT NOT NULL,
  PRIMARY KEY (session_id, snapshot_id),
  FOREIGN KEY (session_id) REFERENCES sessions(session_id) ON DELETE CASCADE
);


CREATE TABLE IF NOT EXISTS acp_parent_stream_events (
  run_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event_json TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, seq)
);

CREATE INDEX IF NOT EXISTS idx_agent_acp_parent_stream_events_created
  ON acp_parent_stream_events(created_at DESC, run_id, seq);

CREATE TABLE IF NOT EXISTS trajectory_runtime_events (
  event_id INTEGER NOT NULL PRIMARY KEY,
  session_id TEXT NOT NULL,
  run_id TEXT,
  seq INTEGER NOT NULL,
  event_json TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  FOREIGN KEY (session_id) REFERENCES sessions(session_id) ON DELETE CASCADE
);

CREATE INDEX IF NOT EXISTS idx_agent_trajectory_runtime_events_session
  ON trajectory_runtime_events(session_id, event_id);

CREATE INDEX IF NOT EXISTS idx_agent_trajectory_runtime_events_run
  ON trajectory_runtime_events(run_id, event_id)
  WHERE run_id IS NOT NULL;
"""

SCHEMA_19_DDL = r"""
CREATE TABLE IF NOT EXISTS schema_meta (
  meta_key TEXT NOT NULL PRIMARY KEY,
  role TEXT NOT NULL,
  schema_version INTEGER NOT NULL,
  agent_id TEXT,
  app_version TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE IF NOT EXISTS session_nodes (
  session_key TEXT NOT NULL PRIMARY KEY,
  current_session_id TEXT NOT NULL,
  entry_json TEXT NOT NULL,
  entry_valid INTEGER NOT NULL DEFAULT 0 CHECK (entry_valid IN (-1, 0, 1)),
  updated_at INTEGER NOT NULL,
  status TEXT CHECK (status IS NULL OR status IN ('running', 'done', 'failed', 'killed', 'timeout')),
  created_at INTEGER,
  created_via TEXT CHECK (created_via IS NULL OR created_via IN ('operator', 'spawn', 'channel', 'cron', 'talk', 'run', 'plugin', 'internal')),
  created_actor_type TEXT CHECK (created_actor_type IS NULL OR created_actor_type IN ('human', 'agent', 'system')),
  created_actor_id TEXT,
  owner_actor_type TEXT,
  owner_actor_id TEXT,
  owner_assigned_by_type TEXT,
  owner_assigned_by_id TEXT,
  owner_assigned_at INTEGER,
  project_id TEXT,
  parent_session_key TEXT,
  spawned_by TEXT,
  fork_source_session_key TEXT,
  fork_source_session_id TEXT,
  fork_source_entry_id TEXT,
  label TEXT,
  display_name TEXT,
  category TEXT,
  icon TEXT,
  pinned_at INTEGER,
  archived_at INTEGER,
  last_read_at INTEGER,
  last_interaction_at INTEGER,
  last_activity_at INTEGER
) STRICT;

CREATE INDEX IF NOT EXISTS idx_agent_session_nodes_updated_at
  ON session_nodes(updated_at DESC, session_key);

CREATE INDEX IF NOT EXISTS idx_agent_session_nodes_last_interaction_at
  ON session_nodes(last_interaction_at DESC, session_key);

CREATE INDEX IF NOT EXISTS idx_agent_session_nodes_parent_session_key
  ON session_nodes(parent_session_key, session_key);

CREATE INDEX IF NOT EXISTS idx_agent_session_nodes_spawned_by
  ON session_nodes(spawned_by, session_key);

CREATE INDEX IF NOT EXISTS idx_agent_session_nodes_status
  ON session_nodes(status, session_key)
  WHERE status IS NOT NULL;

CREATE INDEX IF NOT EXISTS idx_agent_session_nodes_archived_at
  ON session_nodes(archived_at, session_key)
  WHERE archived_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS idx_agent_session_nodes_active
  ON session_nodes(session_key)
  WHERE archived_at IS NULL;

CREATE INDEX IF NOT EXISTS idx_agent_session_nodes_current_session_id
  ON session_nodes(current_session_id);

CREATE INDEX IF NOT EXISTS idx_agent_session_nodes_entry_valid_pending
  ON session_nodes(session_key)
  WHERE entry_valid = 0;

CREATE TRIGGER IF NOT EXISTS session_nodes_entry_valid_after_insert
AFTER INSERT ON session_nodes
BEGIN
  UPDATE session_nodes SET entry_valid = 0 WHERE session_key = NEW.session_key;
END;

CREATE TRIGGER IF NOT EXISTS session_nodes_entry_valid_after_entry_update
AFTER UPDATE OF entry_json ON session_nodes
BEGIN
  UPDATE session_nodes SET entry_valid = 0 WHERE session_key = NEW.session_key;
END;

CREATE TRIGGER IF NOT EXISTS session_nodes_entry_valid_after_identity_update
AFTER UPDATE OF current_session_id, updated_at ON session_nodes
BEGIN
  UPDATE session_nodes SET entry_valid = 0 WHERE session_key = NEW.session_key;
END;

CREATE TABLE IF NOT EXISTS session_windows (
  session_id TEXT NOT NULL PRIMARY KEY,
  session_key TEXT NOT NULL,
  previous_session_id TEXT,
  reason TEXT CHECK (reason IS NULL OR reason IN ('initial', 'reset', 'rollover', 'fork', 'rewind', 'switch', 'recovery', 'compaction')),
  session_scope TEXT NOT NULL DEFAULT 'conversation' CHECK (session_scope IN ('conversation', 'shared-main', 'group', 'channel')),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  transcript_updated_at INTEGER DEFAULT NULL,
  transcript_observed_at INTEGER DEFAULT NULL,
  session_entry_provenance INTEGER NOT NULL DEFAULT 0 CHECK (session_entry_provenance IN (0, 1)),
  acp_owned INTEGER NOT NULL DEFAULT 0 CHECK (acp_owned IN (0, 1)),
  plugin_owner_id TEXT,
  hook_external_content_source TEXT CHECK (hook_external_content_source IS NULL OR hook_external_content_source IN ('gmail', 'webhook')),
  started_at INTEGER,
  ended_at INTEGER,
  status TEXT CHECK (status IS NULL OR status IN ('running', 'done', 'failed', 'killed', 'timeout')),
  chat_type TEXT CHECK (chat_type IS NULL OR chat_type IN ('direct', 'group', 'channel')),
  channel TEXT,
  account_id TEXT,
  primary_conversation_id TEXT,
  model_provider TEXT,
  model TEXT,
  agent_harness_id TEXT,
  parent_session_key TEXT,
  spawned_by TEXT,
  display_name TEXT,
  FOREIGN KEY (session_key) REFERENCES session_nodes(session_key) ON DELETE CASCADE,
  FOREIGN KEY (primary_conversation_id) REFERENCES conversations(conversation_id) ON DELETE SET NULL
) STRICT;

CREATE INDEX IF NOT EXISTS idx_agent_session_windows_updated_at
  ON session_windows(updated_at DESC, session_id);

CREATE INDEX IF NOT EXISTS idx_agent_session_windows_session_key
  ON session_windows(session_key, updated_at DESC, session_id);

CREATE INDEX IF NOT EXISTS idx_agent_session_windows_created_at
  ON session_windows(created_at DESC, session_id);

CREATE INDEX IF NOT EXISTS idx_agent_session_windows_conversation
  ON session_windows(primary_conversation_id, updated_at DESC, session_id)
  WHERE primary_conversation_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS transcript_events (
  session_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event_json TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (session_id, seq),
  FOREIGN KEY (session_id) REFERENCES "session_windows"(session_id) ON DELETE CASCADE
) STRICT;

CREATE TABLE IF NOT EXISTS session_transcript_archives (
  session_id TEXT NOT NULL,
  generation TEXT NOT NULL,
  session_key TEXT NOT NULL,
  reason TEXT NOT NULL CHECK (reason IN ('deleted', 'reset')),
  encoding TEXT NOT NULL CHECK (encoding IN ('identity', 'zstd')),
  archive_blob BLOB NOT NULL,
  archive_sha256 TEXT NOT NULL CHECK (length(archive_sha256) = 64),
  archive_name TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL,
  published_at INTEGER,
  publish_attempts INTEGER NOT NULL DEFAULT 0 CHECK (publish_attempts >= 0),
  last_publish_attempt_at INTEGER,
  last_publish_error TEXT,
  PRIMARY KEY (session_id, generation),
  CHECK (archive_name NOT LIKE '%/%' AND archive_name NOT LIKE '%\%')
) STRICT;

CREATE INDEX IF NOT EXISTS idx_agent_session_transcript_archives_pending
  ON session_transcript_archives(created_at, session_id, generation)
  WHERE published_at IS NULL;

CREATE INDEX IF NOT EXISTS idx_agent_session_transcript_archives_retention
  ON session_transcript_archives(created_at, session_id, generation);

CREATE TABLE IF NOT EXISTS transcript_rewrite_watermarks (
  session_id TEXT NOT NULL PRIMARY KEY,
  generation TEXT NOT NULL,
  updated_at INTEGER NOT NULL,
  FOREIGN KEY (session_id) REFERENCES "session_windows"(session_id) ON DELETE CASCADE
) STRICT;

CREATE TABLE IF NOT EXISTS trajectory_runtime_events (
  session_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  run_id TEXT,
  event_json TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (session_id, seq),
  FOREIGN KEY (session_id) REFERENCES "session_windows"(session_id) ON DELETE CASCADE
) STRICT;

CREATE INDEX IF NOT EXISTS idx_agent_trajectory_runtime_run
  ON trajectory_runtime_events(session_id, run_id, seq)
  WHERE run_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS acp_parent_stream_events (
  session_id TEXT NOT NULL,
  run_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event_json TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (session_id, run_id, seq),
  FOREIGN KEY (session_id) REFERENCES "session_windows"(session_id) ON DELETE CASCADE
) STRICT;

CREATE INDEX IF NOT EXISTS idx_agent_acp_parent_stream_run
  ON acp_parent_stream_events(run_id, seq);

CREATE TABLE IF NOT EXISTS transcript_event_identities (
  session_id TEXT NOT NULL,
  event_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event_type TEXT,
  parent_id TEXT,
  message_idempotency_key TEXT,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (session_id, event_id),
  FOREIGN KEY (session_id, seq) REFERENCES transcript_events(session_id, seq) ON DELETE CASCADE
) STRICT;

CREATE UNIQUE INDEX IF NOT EXISTS idx_agent_transcript_message_idempotency
  ON transcript_event_identities(session_id, message_idempotency_key)
  WHERE message_idempotency_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS idx_agent_transcript_event_identity_sequence
  ON transcript_event_identities(session_id, seq);

CREATE INDEX IF NOT EXISTS idx_agent_transcript_event_parent
  ON transcript_event_identities(session_id, parent_id)
  WHERE parent_id IS NOT NULL;

CREATE INDEX IF NOT EXISTS idx_agent_transcript_event_sequence
  ON transcript_event_identities(session_id, event_type, seq DESC);


CREATE TABLE IF NOT EXISTS session_transcript_index_state (
  session_id TEXT NOT NULL PRIMARY KEY,
  indexed_seq INTEGER NOT NULL,
  leaf_event_id TEXT,
  needs_rebuild INTEGER NOT NULL DEFAULT 0,
  active_event_count INTEGER NOT NULL DEFAULT 0,
  active_message_count INTEGER NOT NULL DEFAULT 0,
  updated_at INTEGER NOT NULL,
  FOREIGN KEY (session_id) REFERENCES session_windows(session_id) ON DELETE CASCADE
) STRICT;

CREATE TABLE IF NOT EXISTS session_transcript_active_events (
  session_id TEXT NOT NULL,
  active_position INTEGER NOT NULL CHECK (active_position >= 0),
  event_seq INTEGER NOT NULL,
  message_position INTEGER CHECK (message_position IS NULL OR message_position >= 0),
  context_eligible INTEGER,
  PRIMARY KEY (session_id, active_position),
  FOREIGN KEY (session_id, event_seq) REFERENCES transcript_events(session_id, seq) ON DELETE CASCADE
) STRICT;

CREATE UNIQUE INDEX IF NOT EXISTS idx_agent_transcript_active_event_seq
  ON session_transcript_active_events(session_id, event_seq);

CREATE UNIQUE INDEX IF NOT EXISTS idx_agent_transcript_active_messages
  ON session_transcript_active_events(session_id, message_position)
  WHERE message_position IS NOT NULL;

CREATE INDEX IF NOT EXISTS idx_agent_transcript_context_pending
  ON session_transcript_active_events(session_id)
  WHERE context_eligible IS NULL;

CREATE VIRTUAL TABLE IF NOT EXISTS session_transcript_fts USING fts5(
  text,
  session_id UNINDEXED,
  message_id UNINDEXED,
  role UNINDEXED,
  timestamp UNINDEXED,
  tokenize = 'unicode61 remove_diacritics 2'
);


CREATE TABLE IF NOT EXISTS session_pending_inputs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  input_id TEXT NOT NULL UNIQUE,
  session_key TEXT NOT NULL,
  session_id TEXT NOT NULL,
  idempotency_key TEXT NOT NULL,
  run_id TEXT NOT NULL,
  request_hash TEXT NOT NULL,
  message_json TEXT NOT NULL,
  lifecycle_generation TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('queued', 'interrupted', 'cancelled')),
  accepted_at INTEGER NOT NULL,
  consumed_event_id TEXT,
  UNIQUE (session_id, idempotency_key),
  FOREIGN KEY (session_key) REFERENCES session_nodes(session_key) ON DELETE CASCADE,
  FOREIGN KEY (session_id) REFERENCES session_windows(session_id) ON DELETE CASCADE
) STRICT;

CREATE INDEX IF NOT EXISTS idx_agent_session_pending_inputs_session
  ON session_pending_inputs(session_key, session_id, seq DESC);
"""

TRANSCRIPT_EVENTS_23_DDL = r"""
CREATE TABLE "transcript_events" (
  session_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event_json TEXT,
  created_at INTEGER NOT NULL,
  event_zstd BLOB,
  event_utf8_bytes INTEGER CHECK (event_utf8_bytes IS NULL OR event_utf8_bytes >= 0),
  navigation_json TEXT,
  PRIMARY KEY (session_id, seq),
  FOREIGN KEY (session_id) REFERENCES "session_windows"(session_id) ON DELETE CASCADE,
  CHECK (
    (event_json IS NOT NULL AND event_zstd IS NULL)
    OR (
      event_json IS NULL AND event_zstd IS NOT NULL
      AND event_utf8_bytes IS NOT NULL
      AND event_utf8_bytes BETWEEN 1 AND 4194304
      AND length(event_zstd) BETWEEN 1 AND 4194304
      AND navigation_json IS NOT NULL
    )
  ),
  CHECK (
    navigation_json IS NULL OR CASE WHEN json_valid(navigation_json) THEN coalesce(
      octet_length(navigation_json) <= 16384
      AND json_type(navigation_json, '$.version') = 'integer'
      AND json_extract(navigation_json, '$.version') = 1
      AND json_type(navigation_json, '$.report') = 'object'
      AND json_extract(navigation_json, '$.report.kind') IN ('canonical', 'leaf', 'link', 'ignored')
      AND json_type(navigation_json, '$.navigation') = 'object'
      AND json_type(navigation_json, '$.reset') = 'object'
      AND json_type(navigation_json, '$.model') = 'object'
      AND json_type(navigation_json, '$.modelBytes') = 'integer'
      AND json_extract(navigation_json, '$.modelBytes') BETWEEN 0 AND 4194304
      AND json_type(navigation_json, '$.modelWithoutCheckpointBytes') = 'integer'
      AND json_extract(navigation_json, '$.modelWithoutCheckpointBytes') BETWEEN 0 AND 4194304
      AND json_type(navigation_json, '$.withoutCustomDataBytes') = 'integer'
      AND json_extract(navigation_json, '$.withoutCustomDataBytes') BETWEEN 0 AND 4194304,
      0) ELSE 0 END
  )
) STRICT;
"""

COLD_ARCHIVES_23_DDL = r"""
CREATE TABLE session_transcript_cold_archives (
  session_id TEXT NOT NULL PRIMARY KEY,
  generation TEXT NOT NULL,
  archive_name TEXT NOT NULL UNIQUE,
  archive_sha256 TEXT NOT NULL CHECK (length(archive_sha256) = 64),
  event_count INTEGER NOT NULL CHECK (event_count >= 1),
  raw_bytes INTEGER NOT NULL CHECK (raw_bytes >= 0),
  archive_bytes INTEGER NOT NULL CHECK (archive_bytes >= 0),
  last_seq INTEGER NOT NULL,
  archived_at INTEGER NOT NULL,
  storage TEXT NOT NULL CHECK (storage IN ('file', 'sqlite')),
  archive_blob BLOB,
  FOREIGN KEY (session_id) REFERENCES "session_windows"(session_id) ON DELETE CASCADE,
  CHECK (length(archive_name) > 0 AND archive_name NOT IN ('.', '..') AND archive_name NOT LIKE '%/%' AND archive_name NOT LIKE '%\%'),
  CHECK ((storage = 'file' AND archive_blob IS NULL) OR (storage = 'sqlite' AND archive_blob IS NOT NULL))
) STRICT;
"""

# Not OpenClaw's DDL: the capture omits `conversations`, but session_windows has a foreign key to it.
CONVERSATIONS_STAND_IN_DDL = """
CREATE TABLE IF NOT EXISTS conversations (
  conversation_id TEXT NOT NULL PRIMARY KEY
) STRICT;
"""

_V19_TRANSCRIPT_EVENTS = SCHEMA_19_DDL[
    SCHEMA_19_DDL.index("CREATE TABLE IF NOT EXISTS transcript_events (") :
    SCHEMA_19_DDL.index(") STRICT;", SCHEMA_19_DDL.index("CREATE TABLE IF NOT EXISTS transcript_events (")) + 9
]


def ddl_for(shape: Shape) -> str:
    """The CREATE script of one shape, from the verbatim captures above."""
    if shape == "early":
        return EARLY_DDL
    ddl = SCHEMA_19_DDL
    if shape in ("v23", "v24"):
        ddl = ddl.replace(_V19_TRANSCRIPT_EVENTS, TRANSCRIPT_EVENTS_23_DDL)
        extra = "  snapshot_revision INTEGER NOT NULL DEFAULT 0,\n" if shape == "v24" else ""
        ddl = ddl.replace("  entry_json TEXT NOT NULL,\n",
                          "  entry_json TEXT NOT NULL,\n" + extra + "  legacy_acp_migration_json TEXT,\n", 1)
        ddl += "\n\n" + COLD_ARCHIVES_23_DDL
    return CONVERSATIONS_STAND_IN_DDL + ddl


def needs_octet_length_shim() -> bool:
    return sqlite3.sqlite_version_info < (3, 43, 0)


def _octet_length(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return len(value)
    return len(str(value).encode())


def register_octet_length(conn: sqlite3.Connection) -> None:
    """Schema 23's CHECK calls octet_length(), native only from SQLite 3.43 (Python 3.11 ships 3.40)."""
    if needs_octet_length_shim():
        conn.create_function("octet_length", 1, _octet_length, deterministic=True)


def create_database(path: Path, shape: Shape = "v23", *, agent_id: str = "main",
                    journal_mode: Literal["wal", "delete"] = "wal") -> Path:
    """A fresh, empty agent database of `shape` at `path` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    user_version, app_version = SHAPE_VERSIONS[shape]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        register_octet_length(conn)
        conn.execute(f"PRAGMA journal_mode={journal_mode}").fetchall()
        conn.executescript("BEGIN;\n" + ddl_for(shape) + "\nCOMMIT;")  # one transaction: one fsync, not dozens
        now = _now_ms()
        conn.execute("INSERT INTO schema_meta (meta_key, role, schema_version, agent_id, app_version, created_at,"
                     " updated_at) VALUES ('primary', 'agent', ?, ?, ?, ?, ?)",
                     (user_version, agent_id, app_version, now, now))
        conn.execute(f"PRAGMA user_version={user_version}")
    finally:
        conn.close()
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------------------------------------
# events


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def js_stringify(event: Mapping[str, Any]) -> str:
    """JSON.stringify's output for plain JSON values: compact, non-ASCII kept as is."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"))


def event_time_ms(event: Mapping[str, Any]) -> int | None:
    """readEventTimestamp: the event's ISO `timestamp`, else its message's epoch-ms timestamp."""
    stamp = event.get("timestamp")
    if isinstance(stamp, str):
        with contextlib.suppress(ValueError):
            return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)
    message = event.get("message")
    if isinstance(message, dict) and isinstance(message.get("timestamp"), int):
        value: int = message["timestamp"]
        return value * 1000 if value < 10**11 else value
    return None


def session_header(session_id: str, *, cwd: str = "/home/user/.openclaw/workspace",
                   at_ms: int | None = None) -> dict[str, Any]:
    """createSessionTranscriptHeader: the seq-0 event of every session."""
    return {"type": "session", "version": SESSION_HEADER_VERSION, "id": session_id,
            "timestamp": _iso(at_ms or _now_ms()), "cwd": cwd}


def message_event(text: str, role: str = "user", *, event_id: str | None = None, parent_id: str | None = None,
                  at_ms: int | None = None) -> dict[str, Any]:
    """A format-v3 message entry, as pi-mono's SessionManager writes it."""
    at = at_ms or _now_ms()
    message: dict[str, Any] = {"role": role, "content": [{"type": "text", "text": text}], "timestamp": at}
    if role == "assistant":
        message.update({"provider": "anthropic", "model": "claude-sonnet-4", "stopReason": "stop"})
    return {"type": "message", "id": event_id or uuid.uuid4().hex[:8], "parentId": parent_id,
            "timestamp": _iso(at), "message": message}


def long_text(n_chars: int, seed: int = 0) -> str:
    """Natural-ish text that zstd compresses well (as real transcripts do), `n_chars` long."""
    rng = random.Random(seed)
    words = ["deploy", "the", "server", "config", "memory", "session", "agent", "review", "budget", "plan",
             "日本語", "データベース", "备份", "每天", "rollback", "tomorrow", "meeting", "notes"]
    out: list[str] = []
    size = 0
    while size < n_chars:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n_chars]


def navigation_json(n_bytes: int) -> str:
    """A navigation projection that satisfies schema 23's CHECK (the fields it checks, made up)."""
    size = min(n_bytes, COMPRESS_MAX_BYTES)
    return js_stringify({"version": 1, "report": {"kind": "canonical"}, "navigation": {}, "reset": {},
                         "model": {}, "modelBytes": size, "modelWithoutCheckpointBytes": size,
                         "withoutCustomDataBytes": size})


def zstd_frame(data: bytes, *, content_size: bool = True) -> bytes:
    """One zstd frame, level 1, checksum on, no dictionary (OpenClaw's event_zstd)."""
    return zstandard.ZstdCompressor(level=1, write_checksum=True, write_content_size=content_size).compress(data)


def decode_event_row(event_json: str | None, event_zstd: bytes | None) -> bytes:
    """What a row holds, independently of the reader under test (used to state the truth)."""
    if event_json is not None:
        return event_json.encode("utf-8")
    assert event_zstd is not None
    return zstandard.ZstdDecompressor().decompressobj().decompress(event_zstd)  # with or without content size


def event_id_of(data: bytes) -> str | None:
    obj = json.loads(data)
    ident = obj.get("id") if isinstance(obj, dict) else None
    return ident if isinstance(ident, str) and ident else None


# ---------------------------------------------------------------------------------------------
# the writer


@dataclass
class WriterStats:
    transactions: int = 0
    busy_errors: int = 0
    lock_waits_s: list[float] = field(default_factory=list)  # BEGIN IMMEDIATE until the lock is held
    commit_s: list[float] = field(default_factory=list)  # COMMIT (waits for readers in rollback mode)

    @property
    def max_lock_wait_s(self) -> float:
        return max(self.lock_waits_s, default=0.0)

    @property
    def max_commit_s(self) -> float:
        return max(self.commit_s, default=0.0)


class OpenClawWriter:
    """Mutates an agent database the way OpenClaw's session writer does (see module doc)."""

    def __init__(self, path: Path, *, busy_timeout_ms: int = 5000, compress: bool = True,
                 zstd_content_size: bool = True) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.compress = compress
        self.zstd_content_size = zstd_content_size
        self.stats = WriterStats()
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_ms / 1000,
                                    check_same_thread=False)
        register_octet_length(self.conn)
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        self.layout: Literal["windows", "sessions"] = "windows" if "session_windows" in tables else "sessions"
        self.event_cols = {r[1] for r in self.conn.execute('PRAGMA table_info("transcript_events")')}
        self.identity_cols = {r[1] for r in self.conn.execute("PRAGMA table_info(transcript_event_identities)")}
        self.watermarks = "transcript_rewrite_watermarks" in tables
        self.has_archives = "session_transcript_archives" in tables
        self.has_cold = "session_transcript_cold_archives" in tables

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> OpenClawWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, timing the lock wait and the commit."""
        started = time.perf_counter()
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                self.stats.busy_errors += 1
            raise
        self.stats.lock_waits_s.append(time.perf_counter() - started)
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        started = time.perf_counter()
        try:
            self.conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                self.stats.busy_errors += 1
            self.conn.execute("ROLLBACK")
            raise
        self.stats.commit_s.append(time.perf_counter() - started)
        self.stats.transactions += 1

    # -- sessions

    def create_session(self, session_key: str, *, session_id: str | None = None, header: bool = True,
                       cwd: str = "/home/user/.openclaw/workspace") -> str:
        """A new logical session (node + initial window), with its header at seq 0."""
        sid = session_id or str(uuid.uuid4())
        with self.transaction():
            self._open_window(session_key, sid, previous=None, reason="initial")
            if header:
                self._insert_event(sid, 0, session_header(sid, cwd=cwd))
                self._ensure_generation(sid)
        return sid

    def reset(self, session_key: str, *, new_session_id: str | None = None) -> tuple[str, str]:
        """/new or /reset: a new window with previous_session_id; the key moves to it. -> (old, new)."""
        sid = new_session_id or str(uuid.uuid4())
        with self.transaction():
            old = self.current_session_id(session_key)
            assert old is not None, f"no session for {session_key}"
            self._open_window(session_key, sid, previous=old, reason="reset")
            self._insert_event(sid, 0, session_header(sid))
            self._ensure_generation(sid)
        return old, sid

    def rewind(self, session_key: str, to_event_id: str, *, new_session_id: str | None = None) -> tuple[str, str]:
        """A Control UI rewind as OpenClaw 2026.9.6 writes it: a new window of the same key (previous_session_id
        set, no reason) holding its own header, a copy of every other row of the old session (the same event
        ids) and a `leaf` row pointing at `to_event_id`; the key moves to it, the old session stays. -> (old, new)"""
        sid = new_session_id or str(uuid.uuid4())
        with self.transaction():
            old = self.current_session_id(session_key)
            assert old is not None, f"no session for {session_key}"
            self._open_window(session_key, sid, previous=old, reason=None)
            self._insert_event(sid, 0, session_header(sid))
            rows = self._rows(old)
            for seq, data in rows[1:]:
                self._insert_event(sid, seq, data.decode())
            leaf = {"type": "leaf", "id": uuid.uuid4().hex[:8], "parentId": None, "timestamp": _iso(_now_ms()),
                    "targetId": to_event_id}
            self._insert_event(sid, rows[-1][0] + 1, leaf)
            self._ensure_generation(sid)
        return old, sid

    def fork(self, parent_key: str, through_seq: int, *, session_key: str | None = None) -> tuple[str, str]:
        """`sessions.fork` as OpenClaw 2026.9.6 writes it: a session of its own key (parent_session_key set)
        holding its header and a copy of the parent's rows up to `through_seq`. -> (key, session id)"""
        key = session_key or f"{parent_key}:fork:{uuid.uuid4().hex[:8]}"
        sid = str(uuid.uuid4())
        with self.transaction():
            parent = self.current_session_id(parent_key)
            assert parent is not None, f"no session for {parent_key}"
            self._open_window(key, sid, previous=None, reason=None)
            self.conn.execute("UPDATE session_windows SET parent_session_key = ? WHERE session_id = ?",
                              (parent_key, sid))
            self._insert_event(sid, 0, session_header(sid))
            for seq, data in self._rows(parent)[1:]:
                if seq <= through_seq:
                    self._insert_event(sid, seq, data.decode())
            self._ensure_generation(sid)
        return key, sid

    def current_session_id(self, session_key: str) -> str | None:
        table, column = (("session_nodes", "current_session_id") if self.layout == "windows"
                         else ("session_entries", "session_id"))
        row = self.conn.execute(f"SELECT {column} FROM {table} WHERE session_key = ?", (session_key,)).fetchone()
        return None if row is None else str(row[0])

    def _open_window(self, session_key: str, sid: str, *, previous: str | None, reason: str | None) -> None:
        now = _now_ms()
        entry = js_stringify({"sessionId": sid, "updatedAt": now})
        if self.layout == "windows":
            self.conn.execute(
                "INSERT INTO session_nodes (session_key, current_session_id, entry_json, updated_at, created_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT(session_key) DO UPDATE SET"
                " current_session_id = excluded.current_session_id, entry_json = excluded.entry_json,"
                " updated_at = excluded.updated_at", (session_key, sid, entry, now, now))
            self.conn.execute(
                "INSERT INTO session_windows (session_id, session_key, previous_session_id, reason, created_at,"
                " updated_at, started_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sid, session_key, previous, reason, now, now, now))
        else:
            self.conn.execute(
                "INSERT INTO sessions (session_id, session_key, created_at, updated_at, started_at)"
                " VALUES (?, ?, ?, ?, ?)", (sid, session_key, now, now, now))
            self.conn.execute(
                "INSERT INTO session_entries (session_key, session_id, entry_json, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(session_key) DO UPDATE SET session_id = excluded.session_id,"
                " entry_json = excluded.entry_json, updated_at = excluded.updated_at",
                (session_key, sid, entry, now))

    def delete_session(self, sid: str) -> None:
        """Explicit deletion: store a zstd JSONL archive row, then remove the window (rows cascade)."""
        with self.transaction():
            key_row = self.conn.execute(
                f"SELECT session_key FROM {'session_windows' if self.layout == 'windows' else 'sessions'}"
                " WHERE session_id = ?", (sid,)).fetchone()
            assert key_row is not None, f"no window {sid}"
            if self.has_archives:
                jsonl = b"".join(data + b"\n" for _, data in self._rows(sid))
                blob = zstd_frame(jsonl)
                stamp = _iso(_now_ms()).replace(":", "-")
                self.conn.execute(
                    "INSERT INTO session_transcript_archives (session_id, generation, session_key, reason, encoding,"
                    " archive_blob, archive_sha256, archive_name, created_at) VALUES (?, ?, ?, 'deleted', 'zstd',"
                    " ?, ?, ?, ?)",
                    (sid, self.generation(sid) or "0", key_row[0], blob, hashlib.sha256(blob).hexdigest(),
                     f"{sid}.jsonl.deleted.{stamp}.zst", _now_ms()))
            if self.layout == "windows":
                self.conn.execute("DELETE FROM session_windows WHERE session_id = ?", (sid,))
                self.conn.execute("DELETE FROM session_nodes WHERE current_session_id = ?", (sid,))
            else:
                self.conn.execute("DELETE FROM session_entries WHERE session_id = ?", (sid,))
                self.conn.execute("DELETE FROM sessions WHERE session_id = ?", (sid,))

    def set_metadata(self, sid: str, *, channel: str | None = None, chat_type: str | None = None,
                     hook_source: str | None = None) -> None:
        """What OpenClaw 2026.9.6 records of a session for its admission policy: `channel` and `chat_type` on its
        window; a hook's external-content source on the key's entry (`hookExternalContentSource`, exact: `gmail`,
        `email`, `webhook`) and, with `session_entry_provenance` 1, on the window as `gmail` or a coarse `webhook`
        (`bindSessionEntryProvenance`: `email` is kept as `webhook`)."""
        with self.transaction():
            column = "webhook" if hook_source == "email" else hook_source
            self.conn.execute(
                "UPDATE session_windows SET channel = ?, chat_type = ?, hook_external_content_source = ?,"
                " session_entry_provenance = 1 WHERE session_id = ?", (channel, chat_type, column, sid))
            if hook_source is not None:
                row = self.conn.execute("SELECT session_key, entry_json FROM session_nodes WHERE current_session_id = ?",
                                        (sid,)).fetchone()
                entry = json.loads(row[1])
                entry["hookExternalContentSource"] = hook_source
                self.conn.execute("UPDATE session_nodes SET entry_json = ? WHERE session_key = ?",
                                  (js_stringify(entry), row[0]))

    def forget(self, sid: str, agent_id: str = "main") -> None:
        """What `openclaw memory forget --session` records (2026.9.6, DDL as the real one reported it): a
        tombstone row; the session's transcript rows stay."""
        with self.transaction():
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS memory_session_tombstones (\n  session_id TEXT NOT NULL PRIMARY KEY,\n"
                "  agent_id TEXT NOT NULL,\n  reason TEXT NOT NULL,\n  created_at INTEGER NOT NULL\n) STRICT")
            self.conn.execute("INSERT INTO memory_session_tombstones VALUES (?, ?, 'forgotten', ?)",
                              (sid, agent_id, _now_ms()))

    def cold_archive(self, sid: str, storage: Literal["file", "sqlite"] = "file") -> Path | None:
        """Cold storage (schema 20+), as 2026.9.6's worker does it: the session's rows written as a zstd JSONL
        of records (a `header`, then one `event` per row: seq, event_json, created_at; the identity, index and
        search records it also keeps are left out here), to `<agent>/sessions/cold/<sha256>.jsonl.zst` or as
        a blob in the table; then the rows removed. -> the archive file, if one was written."""
        assert self.has_cold, "cold archives need schema 20+"
        with self.transaction():
            rows = self.conn.execute("SELECT seq, event_json, event_zstd, created_at FROM transcript_events"
                                     " WHERE session_id = ? ORDER BY seq", (sid,)).fetchall()
            assert rows, f"session {sid} has no rows to archive"
            records = [{"kind": "header", "version": 1, "sessionId": sid, "generation": self.generation(sid) or "0"}]
            for seq, event_json, event_zstd, created_at in rows:
                data = event_json if event_json is not None else zstandard.ZstdDecompressor().decompress(event_zstd)
                text = data.decode() if isinstance(data, bytes) else data
                records.append({"kind": "event", "row": {"seq": seq, "event_json": text, "created_at": created_at}})
            jsonl = "".join(json.dumps(r) + "\n" for r in records).encode()
            blob = zstd_frame(jsonl)
            sha = hashlib.sha256(blob).hexdigest()
            path = None
            if storage == "file":
                path = self.path.parent.parent / "sessions" / "cold" / f"{sha}.jsonl.zst"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(blob)
            self.conn.execute(
                "INSERT INTO session_transcript_cold_archives (session_id, generation, archive_name, archive_sha256,"
                " event_count, raw_bytes, archive_bytes, last_seq, archived_at, storage, archive_blob)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (sid, self.generation(sid) or "0", f"{sha}.jsonl.zst", sha, len(rows), len(jsonl), len(blob),
                 rows[-1][0], _now_ms(), storage, blob if storage == "sqlite" else None))
            self.conn.execute("DELETE FROM transcript_events WHERE session_id = ?", (sid,))
        return path

    # -- transcript mutations

    def append(self, sid: str, *events: Mapping[str, Any] | str) -> list[int]:
        """One turn: the events appended in one transaction; seq = max + 1. -> their seqs.

        An event whose id the session already holds is skipped, as OpenClaw's append does.
        """
        seqs: list[int] = []
        with self.transaction():
            for event in events:
                text = event if isinstance(event, str) else js_stringify(event)
                ident = event_id_of(text.encode())
                if ident is not None and self.conn.execute(
                        "SELECT 1 FROM transcript_event_identities WHERE session_id = ? AND event_id = ?",
                        (sid, ident)).fetchone():
                    continue
                seq = self._next_seq(sid)
                self._insert_event(sid, seq, text)
                self._ensure_generation(sid)
                seqs.append(seq)
            self._touch(sid)
        return seqs

    def rewrite_suffix(self, sid: str, from_seq: int, events: Sequence[Mapping[str, Any] | str], *,
                       rotate_generation: bool = True) -> None:
        """DELETE seq >= from_seq, re-insert `events` at from_seq, from_seq + 1, ... (rewind, pruning)."""
        with self.transaction():
            self.conn.execute("DELETE FROM transcript_events WHERE session_id = ? AND seq >= ?", (sid, from_seq))
            for offset, event in enumerate(events):
                self._insert_event(sid, from_seq + offset, event)
            if rotate_generation:
                self._rotate_generation(sid)
            self._touch(sid)

    def replace_session(self, sid: str, events: Sequence[Mapping[str, Any] | str], *,
                        rotate_generation: bool = True) -> None:
        """Full replacement: delete every row, re-insert from seq 0 (compaction, format migration)."""
        self.rewrite_suffix(sid, 0, events, rotate_generation=rotate_generation)

    def update_event(self, sid: str, seq: int, event: Mapping[str, Any] | str, *,
                     rotate_generation: bool = True) -> None:
        """A plain UPDATE of one row's payload in place."""
        with self.transaction():
            self.conn.execute("DELETE FROM transcript_event_identities WHERE session_id = ? AND seq = ?", (sid, seq))
            text = event if isinstance(event, str) else js_stringify(event)
            payload = self._payload(text)
            sets = ", ".join(f"{c} = ?" for c in payload)
            self.conn.execute(f"UPDATE transcript_events SET {sets} WHERE session_id = ? AND seq = ?",
                              (*payload.values(), sid, seq))
            self._insert_identity(sid, seq, text)
            if rotate_generation:
                self._rotate_generation(sid)

    def delete_rows(self, sid: str, seqs: Sequence[int], *, rotate_generation: bool = True) -> None:
        """Remove single rows (e.g. heartbeat pruning) without re-inserting anything."""
        with self.transaction():
            for seq in seqs:
                self.conn.execute("DELETE FROM transcript_events WHERE session_id = ? AND seq = ?", (sid, seq))
            if rotate_generation:
                self._rotate_generation(sid)

    def import_session(self, session_key: str, sid: str, events: Sequence[Mapping[str, Any]]) -> int:
        """`openclaw doctor --fix`'s import of one legacy transcript: rows keyed by the sessions.json
        sessionId, every parsed line re-serialised (JSON.stringify) in file order, the header included,
        events whose id the session already holds skipped. -> rows written."""
        written = 0
        with self.transaction():
            self._open_window(session_key, sid, previous=None, reason="initial")
            for event in events:
                text = js_stringify(event)
                ident = event_id_of(text.encode())
                if ident is not None and self.conn.execute(
                        "SELECT 1 FROM transcript_event_identities WHERE session_id = ? AND event_id = ?",
                        (sid, ident)).fetchone():
                    continue
                self._insert_event(sid, self._next_seq(sid), text)
                self._ensure_generation(sid)
                written += 1
        return written

    # -- truth, read straight from the database (not through the reader under test)

    def _rows(self, sid: str) -> list[tuple[int, bytes]]:
        json_col = "event_json"
        zstd_col = "event_zstd" if "event_zstd" in self.event_cols else "NULL"
        rows = self.conn.execute(f"SELECT seq, {json_col}, {zstd_col} FROM transcript_events WHERE session_id = ?"
                                 " ORDER BY seq", (sid,)).fetchall()
        return [(int(seq), decode_event_row(j, z)) for seq, j, z in rows]

    def events(self, sid: str) -> list[bytes]:
        return [data for _, data in self._rows(sid)]

    def session_ids(self) -> list[str]:
        return [str(r[0]) for r in self.conn.execute("SELECT DISTINCT session_id FROM transcript_events")]

    def generation(self, sid: str) -> str | None:
        if not self.watermarks:
            return None
        row = self.conn.execute("SELECT generation FROM transcript_rewrite_watermarks WHERE session_id = ?",
                                (sid,)).fetchone()
        return None if row is None else str(row[0])

    def stored_compressed(self, sid: str, seq: int) -> bool:
        if "event_zstd" not in self.event_cols:
            return False
        row = self.conn.execute("SELECT event_zstd IS NOT NULL FROM transcript_events WHERE session_id = ? AND"
                                " seq = ?", (sid, seq)).fetchone()
        return bool(row and row[0])

    # -- internals

    def _next_seq(self, sid: str) -> int:
        row = self.conn.execute("SELECT coalesce(max(seq), -1) + 1 FROM transcript_events WHERE session_id = ?",
                                (sid,)).fetchone()
        return int(row[0])

    def _payload(self, text: str) -> dict[str, object]:
        raw = text.encode("utf-8")
        if self.compress and "event_zstd" in self.event_cols and COMPRESS_MIN_BYTES <= len(raw) <= COMPRESS_MAX_BYTES:
            frame = zstd_frame(raw, content_size=self.zstd_content_size)
            nav = navigation_json(len(raw))
            saved = len(raw) - (len(frame) + len(nav.encode()))
            if saved >= 64 and saved >= len(raw) / 10:
                return {"event_json": None, "event_zstd": frame, "event_utf8_bytes": len(raw), "navigation_json": nav}
        payload: dict[str, object] = {"event_json": text}
        if "event_zstd" in self.event_cols:
            payload.update({"event_zstd": None, "event_utf8_bytes": None, "navigation_json": None})
        return payload

    def _insert_event(self, sid: str, seq: int, event: Mapping[str, Any] | str) -> None:
        text = event if isinstance(event, str) else js_stringify(event)
        created_at = event_time_ms(json.loads(text)) or _now_ms()
        payload = self._payload(text)
        cols = ["session_id", "seq", "created_at", *payload]
        self.conn.execute(f"INSERT INTO transcript_events ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                          (sid, seq, created_at, *payload.values()))
        self._insert_identity(sid, seq, text)

    def _insert_identity(self, sid: str, seq: int, text: str) -> None:
        obj = json.loads(text)
        ident = obj.get("id") if isinstance(obj, dict) else None
        if not isinstance(ident, str) or not ident:
            return
        parent = obj.get("parentId") if isinstance(obj.get("parentId"), str) else None
        values: dict[str, object] = {"session_id": sid, "event_id": ident, "seq": seq, "event_type": obj.get("type"),
                                     "parent_id": parent, "created_at": event_time_ms(obj) or _now_ms()}
        if "has_parent" in self.identity_cols:
            values["has_parent"] = int(parent is not None)
        self.conn.execute(f"INSERT OR REPLACE INTO transcript_event_identities ({', '.join(values)}) VALUES"
                          f" ({', '.join('?' * len(values))})", tuple(values.values()))

    def _ensure_generation(self, sid: str) -> None:
        """Materialise a generation once; pure appends preserve it (ensureTranscriptGeneration)."""
        if self.watermarks:
            self.conn.execute("INSERT INTO transcript_rewrite_watermarks (session_id, generation, updated_at)"
                              " VALUES (?, ?, ?) ON CONFLICT(session_id) DO NOTHING",
                              (sid, str(uuid.uuid4()), _now_ms()))

    def _rotate_generation(self, sid: str) -> None:
        """Same transaction as the destructive change (rotateTranscriptGenerationInTransaction)."""
        if self.watermarks:
            generation = str(uuid.uuid4())
            self.conn.execute("INSERT INTO transcript_rewrite_watermarks (session_id, generation, updated_at)"
                              " VALUES (?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET"
                              " generation = excluded.generation, updated_at = excluded.updated_at",
                              (sid, generation, _now_ms()))

    def _touch(self, sid: str) -> None:
        now = _now_ms()
        if self.layout == "windows":
            self.conn.execute("UPDATE session_windows SET updated_at = ?, transcript_updated_at = ? WHERE"
                              " session_id = ?", (now, now, sid))
        else:
            self.conn.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (now, sid))


def import_jsonl_file(writer: OpenClawWriter, jsonl_path: Path, *, session_key: str,
                      session_id: str | None = None) -> str:
    """Import a legacy transcript like `openclaw doctor --fix`: rows are keyed by the sessions.json
    entry's sessionId (the file name's id, unless given), which need not be the header's id."""
    sid = session_id or jsonl_path.name.split(".jsonl")[0]
    events = [json.loads(line) for line in jsonl_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    writer.import_session(session_key, sid, events)
    return sid


# ---------------------------------------------------------------------------------------------
# a writer in another process


@dataclass
class WorkloadResult:
    """What a writer process did: the transcripts it left (its own model) and its lock timings."""

    transcripts: dict[str, list[bytes]]  # session id -> event JSON bytes, in seq order
    headers: dict[str, str]  # session id -> the id its header carries
    transactions: int
    busy_errors: int
    max_lock_wait_s: float
    max_commit_s: float
    errors: list[str]


def live_workload(path: str, *, seed: int, turns: int, busy_timeout_ms: int, pause_s: float,
                  rewrites: bool, result: Any) -> None:
    """Run in a child process: turns of appends (some large enough for zstd), and when `rewrites`,
    a suffix rewrite, a full replacement and a reset along the way. Puts a WorkloadResult."""
    rng = random.Random(seed)
    errors: list[str] = []
    writer = OpenClawWriter(Path(path), busy_timeout_ms=busy_timeout_ms)
    try:
        keys = ["agent:main:main", "agent:main:telegram:42"]
        sids = {key: writer.create_session(key) for key in keys}
        for turn in range(turns):
            key = keys[turn % len(keys)]
            sid = sids[key]
            try:
                size = rng.choice([40, 200, 3000]) if turn % 5 else 6000
                writer.append(sid, message_event(f"turn {turn} user " + long_text(size, seed + turn)),
                              message_event(f"turn {turn} reply", role="assistant"))
                if rewrites and turn == turns // 3:
                    n = len(writer.events(sid))
                    writer.rewrite_suffix(sid, max(1, n - 3), [message_event(f"rewound at {turn}", "assistant")])
                if rewrites and turn == turns // 2:
                    kept = writer.events(sid)[:3]
                    writer.replace_session(sid, [*(k.decode() for k in kept),
                                                 message_event(f"compacted at {turn}", "assistant")])
                if rewrites and turn == (2 * turns) // 3:
                    _, sids[key] = writer.reset(key)
            except sqlite3.Error as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(pause_s)
        transcripts = {sid: writer.events(sid) for sid in writer.session_ids()}
        headers = {sid: event_id_of(events[0]) or sid for sid, events in transcripts.items()}
        stats = writer.stats
        result.put(WorkloadResult(transcripts, headers, stats.transactions, stats.busy_errors,
                                  stats.max_lock_wait_s, stats.max_commit_s, errors))
    finally:
        writer.close()


def start_workload(path: Path, **kwargs: Any) -> tuple[Any, Any]:
    """Start `live_workload` in a spawned process. -> (process, result queue)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=live_workload, args=(str(path),), kwargs={**kwargs, "result": queue}, daemon=True)
    process.start()
    return process, queue
