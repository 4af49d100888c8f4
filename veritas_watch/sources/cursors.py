"""Durable cursors: where each source has been read up to, committed only after the store acked.

One SQLite file in the data dir (WAL, synchronous=FULL), so a commit is atomic and survives a
crash at any point: a torn last WAL frame is ignored by SQLite's checksums, a leftover WAL is
replayed. Policy for damage, logged as an error each time:
- a file SQLite cannot open or that fails `PRAGMA quick_check` (half-written, garbage): moved
  aside as `cursors.sqlite.corrupt-<ts>`, and every source is re-read from 0;
- a single row that does not decode into a valid cursor: that file is re-read from 0.
Re-reading is safe because point ids are deterministic (a replay overwrites the same points, and
the sink skips points already stored with the same payload).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

log = structlog.get_logger()

TAIL_BYTES = 32  # the smallest tail check (and the only one cursors written before `tail_len` used)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS file_cursors (key TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS archive_cursors (key TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS db_cursors (db TEXT NOT NULL, session_id TEXT NOT NULL, state TEXT NOT NULL,
                                           PRIMARY KEY (db, session_id));
"""


@dataclass
class FileCursor:
    """A JSONL transcript's committed position and what we learned reading up to it."""

    key: str  # "<dev>:<inode>"
    path: str
    agent_id: str
    offset: int = 0  # bytes consumed (always at a line boundary)
    line: int = 0  # lines consumed
    head_len: int = 0  # bytes covered by head_hash
    head_hash: str = ""  # fingerprint of the first bytes: tells a reused inode from the same file
    tail_hash: str = ""  # hash of the bytes just before `offset`: tells a rewrite from an append
    session_id: str | None = None  # from the header line
    session_kind: str = "unknown"  # unknown | conversation | cron
    last_entry_ts: str | None = None  # newest conversational entry (session end for gap detection)
    turn: str = "conversation"  # the denoiser's turn kind: a heartbeat turn's reply is not memory
    previous_text: str | None = None  # the last stored turn: dense-vector context for the next one
    ended: bool = False  # renamed to .reset/.deleted and drained
    tail_len: int = TAIL_BYTES  # bytes covered by tail_hash (the last line before `offset`)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> FileCursor:
        """Decode a stored cursor; ValueError unless every field is present-or-defaulted and well typed."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"cursor is a {type(raw).__name__}, not an object")
        unknown = set(raw) - _FIELD_TYPES.keys()
        if unknown:
            raise ValueError(f"unknown cursor fields: {sorted(unknown)}")
        for name, value in raw.items():
            if not _well_typed(value, _FIELD_TYPES[name]):
                raise ValueError(f"cursor field {name} has a bad value: {value!r:.80}")
        try:
            cursor = cls(**raw)
        except TypeError as exc:  # a required field missing
            raise ValueError(str(exc)) from None
        if cursor.head_len > cursor.offset:
            raise ValueError("cursor head fingerprint covers more than its offset")
        return cursor


def _well_typed(value: object, kind: str) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    return value is None or isinstance(value, str)  # "str | None"


_FIELD_TYPES: dict[str, str] = {f.name: str(f.type) for f in dataclasses.fields(FileCursor)}


class CursorStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = self._open(path)
        except sqlite3.DatabaseError as exc:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                src = Path(str(path) + suffix)
                if src.exists():
                    src.rename(Path(str(aside) + suffix))
            log.error("cursor_store_corrupt", path=str(path), moved_to=str(aside), error=str(exc),
                      policy="re-read every source from 0; point ids are deterministic so nothing duplicates")
            self._db = self._open(path)

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            # Surfaces a damaged file now, not at the first commit (which would stop the pipeline).
            problems = [row[0] for row in db.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError(f"quick_check: {'; '.join(map(str, problems))[:300]}")
            db.executescript(_SCHEMA)
        except BaseException:
            db.close()
            raise
        return db

    def load_files(self) -> dict[str, FileCursor]:
        cursors: dict[str, FileCursor] = {}
        for key, state in self._db.execute("SELECT key, state FROM file_cursors"):
            try:
                cursor = FileCursor.from_json(state)
                if cursor.key != key:
                    raise ValueError(f"row key {key!r} holds the cursor of {cursor.key!r}")
            except (ValueError, TypeError) as exc:
                log.error("cursor_corrupt", key=key, error=str(exc)[:300], policy="re-read this file from 0")
                continue
            cursors[key] = cursor
        return cursors

    def commit_files(self, cursors: Iterable[FileCursor], removed: Iterable[str] = ()) -> None:
        """One transaction: all of these cursors move together, or none does."""
        with self._transaction():
            self._db.executemany(
                "INSERT INTO file_cursors (key, state) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET state = excluded.state",
                [(c.key, c.to_json()) for c in cursors],
            )
            self._db.executemany("DELETE FROM file_cursors WHERE key = ?", [(k,) for k in removed])

    def load_sqlite(self, db: str) -> dict[str, dict[str, object]]:
        rows = self._db.execute("SELECT session_id, state FROM db_cursors WHERE db = ?", (db,))
        result: dict[str, dict[str, object]] = {}
        for session_id, state in rows:
            try:
                result[session_id] = json.loads(state)
            except ValueError as exc:
                log.error("cursor_corrupt", db=db, session_id=session_id, error=str(exc))
        return result

    def load_archives(self) -> list[str]:
        """Compressed archives already stored (sources/archives.py): their identity keys."""
        return [row[0] for row in self._db.execute("SELECT key FROM archive_cursors")]

    def commit_archives(self, keys: Iterable[str], removed: Iterable[str] = ()) -> None:
        with self._transaction():
            self._db.executemany("INSERT OR IGNORE INTO archive_cursors (key) VALUES (?)", [(k,) for k in keys])
            self._db.executemany("DELETE FROM archive_cursors WHERE key = ?", [(k,) for k in removed])

    def sqlite_dbs(self) -> list[str]:
        """Every database with a committed session cursor (offline `status`)."""
        return [row[0] for row in self._db.execute("SELECT DISTINCT db FROM db_cursors ORDER BY db")]

    def commit_sqlite(self, db: str, states: dict[str, dict[str, object]], removed: Iterable[str] = ()) -> None:
        with self._transaction():
            self._db.executemany(
                "INSERT INTO db_cursors (db, session_id, state) VALUES (?, ?, ?) "
                "ON CONFLICT(db, session_id) DO UPDATE SET state = excluded.state",
                [(db, sid, json.dumps(state)) for sid, state in states.items()],
            )
            self._db.executemany("DELETE FROM db_cursors WHERE db = ? AND session_id = ?",
                                 [(db, sid) for sid in removed])

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    def close(self) -> None:
        self._db.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
