"""Durable cursors: where each source has been read up to, committed only after the store acked.

One SQLite file in the data dir (WAL, synchronous=FULL), so a commit is atomic and survives a
crash at any point: a torn last WAL frame is ignored by SQLite's checksums, a leftover WAL is
replayed. Policy for damage, logged as an error each time:
- a file SQLite cannot open or that fails `PRAGMA quick_check` (half-written, garbage): moved
  aside as `cursors.sqlite.corrupt-<ts>`, and every source is re-read from 0;
- a single row that does not decode into a valid cursor: that file is re-read from 0.
Re-reading is safe because point ids are deterministic (a replay overwrites the same points, and
the sink skips points already stored with the same payload).

Both sources' cursors hold one `model.SessionState` (what reading the session taught the transforms),
serialized with its version (`SessionState.to_dict`). Cursors written before that, with the session
facts as loose fields, are read as they were (`FileCursor.from_json`, `SqliteCursor.from_json`).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from veritas_watch.model import ConversationEnd, SessionState, restore_turn
from veritas_watch.safepath import make_dirs
from veritas_watch.sources.sqlite import SessionCursor

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
    ended: bool = False  # renamed to .reset/.deleted and drained
    tail_len: int = TAIL_BYTES  # bytes covered by tail_hash (the last line before `offset`)
    # What reading up to `offset` learned: the header's session id, cron or not, the last entry time (the
    # session's end for gap detection), the turn kind, the last stored turn (context for the next one).
    session: SessionState = field(default_factory=lambda: SessionState(None))

    def copy(self, path: str | None = None) -> FileCursor:
        """An independent copy (its own session state: the transforms advance one cursor's, never another's)."""
        return dataclasses.replace(self, path=self.path if path is None else path,
                                   session=dataclasses.replace(self.session))

    def to_json(self) -> str:
        data: dict[str, object] = {name: getattr(self, name) for name in _FIELD_TYPES}
        data["session"] = self.session.to_dict()
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> FileCursor:
        """Decode a stored cursor; ValueError unless every field is present-or-defaulted and well typed. A
        cursor written before the session state was one value has its fields flat (`_LEGACY_SESSION_TYPES`)."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"cursor is a {type(raw).__name__}, not an object")
        legacy = {} if "session" in raw else _LEGACY_SESSION_TYPES
        kinds = {**_FIELD_TYPES, **legacy}
        unknown = set(raw) - kinds.keys() - {"session"}
        if unknown:
            raise ValueError(f"unknown cursor fields: {sorted(unknown)}")
        for name, value in raw.items():
            if name != "session" and not _well_typed(value, kinds[name]):
                raise ValueError(f"cursor field {name} has a bad value: {value!r:.80}")
        if legacy:
            session = SessionState(raw.pop("session_id", None), raw.pop("session_kind", "unknown"),
                                   raw.pop("last_entry_ts", None), restore_turn(raw.pop("turn", "conversation")),
                                   raw.pop("previous_text", None))
        else:
            session = SessionState.from_dict(raw.pop("session"))
        try:
            cursor = cls(**raw, session=session)
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


_FIELD_TYPES: dict[str, str] = {f.name: str(f.type) for f in dataclasses.fields(FileCursor) if f.name != "session"}
# The session facts a cursor kept as loose fields before `session` (read as they were; never written).
_LEGACY_SESSION_TYPES: dict[str, str] = {"session_id": "str | None", "session_kind": "str",
                                         "last_entry_ts": "str | None", "turn": "str", "previous_text": "str | None"}


@dataclass
class SqliteCursor:
    """One SQLite session's committed state: where its rows were read up to, what reading them learned, and
    the conversation ends not handed on yet (sources/sqlite_feed.py)."""

    # Where the session's rows were read up to. None: a deleted session's tombstone, or a stored position
    # that did not decode (the session is read again from its first row).
    position: SessionCursor | None
    session: SessionState  # its session_id is the one the session's points carry
    vanished: bool = False  # deleted: nothing to read; its memories (and their time) stay
    ended_reported: bool = False  # the session's window ended and that end was handed on
    ends_through_seq: int | None = None  # reset events up to this seq were handed on (a rewalk reads them again)
    pending_ends: list[ConversationEnd] = field(default_factory=list)  # ended, stored, not handed on yet
    # The event id of the reset its current conversation began at (`session.conversation_start`): a restored backup
    # that no longer holds it removed the conversation (`sqlite_feed.lost_conversation`). None: the session's start.
    conversation_start_id: str | None = None

    @property
    def next_seq(self) -> int:
        return self.position.next_seq if self.position is not None else 0

    def tombstone(self) -> SqliteCursor:
        """What a deleted session leaves once its end was handed on: its point session id and last entry time."""
        return SqliteCursor(None, SessionState(self.session.session_id, last_entry_ts=self.session.last_entry_ts),
                            vanished=True)

    def to_json(self) -> str:
        return json.dumps({"position": self.position.to_dict() if self.position is not None else None,
                           "session": self.session.to_dict(), "vanished": self.vanished,
                           "ended_reported": self.ended_reported, "ends_through_seq": self.ends_through_seq,
                           "pending_ends": [dataclasses.asdict(e) for e in self.pending_ends],
                           "conversation_start_id": self.conversation_start_id})

    @classmethod
    def from_json(cls, text: str, *, db: str = "", session_id: str = "") -> SqliteCursor:
        """Decode a stored session cursor; ValueError if it is no cursor at all. A position that does not
        decode is logged and dropped (the session is read again). A cursor written before the session state was
        one value (its facts as loose keys beside the position's) is read as it was."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"cursor is a {type(raw).__name__}, not an object")
        if "session" not in raw:
            return cls._from_loose(raw, db, session_id)
        unknown = set(raw) - {"position", "session", "vanished", "ended_reported", "ends_through_seq", "pending_ends",
                              "conversation_start_id"}
        if unknown:
            raise ValueError(f"unknown cursor fields: {sorted(unknown)}")
        vanished, reported = raw.get("vanished", False), raw.get("ended_reported", False)
        through, start_id = raw.get("ends_through_seq"), raw.get("conversation_start_id")
        if not isinstance(vanished, bool) or not isinstance(reported, bool):
            raise ValueError("cursor fields vanished and ended_reported must be true or false")
        if through is not None and _int(through) is None:
            raise ValueError(f"cursor field ends_through_seq has a bad value: {through!r:.80}")
        if start_id is not None and not isinstance(start_id, str):
            raise ValueError(f"cursor field conversation_start_id has a bad value: {start_id!r:.80}")
        position = raw.get("position")
        return cls(None if position is None else _position(position, db, session_id, quiet=False),
                   SessionState.from_dict(raw["session"]), vanished, reported, through, _pending(raw), start_id)

    @classmethod
    def _from_loose(cls, raw: dict[str, object], db: str, session_id: str) -> SqliteCursor:
        """The format before `session`: the reader's `SessionCursor` fields and the facts side by side, a
        deleted session's tombstone only `vanished`, `point_session_id`, `last_entry_ts`."""
        vanished = bool(raw.get("vanished"))
        session = SessionState(_str(raw.get("point_session_id")), _str(raw.get("session_kind")) or "unknown",
                               _str(raw.get("last_entry_ts")), restore_turn(raw.get("turn")),
                               _str(raw.get("previous_text")), _int(raw.get("conversation_entries")) or 0)
        # A deleted session was never read again, so its position was never checked; a tombstone has none.
        position = _position(raw, db, session_id, quiet=vanished) if "next_seq" in raw or not vanished else None
        return cls(position, session, vanished, bool(raw.get("ended_reported")), _int(raw.get("ends_through_seq")),
                   _pending(raw))


def _position(data: object, db: str, session_id: str, *, quiet: bool) -> SessionCursor | None:
    try:
        if not isinstance(data, dict):
            raise ValueError(f"position is a {type(data).__name__}, not an object")
        return SessionCursor.from_dict(data)
    except ValueError as exc:
        if not quiet:
            log.error("cursor_corrupt", db=db, session_id=session_id, error=str(exc), policy="re-read this session")
        return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _pending(state: Mapping[str, object]) -> list[ConversationEnd]:
    """The ends a session's cursor holds, not yet handed on (malformed entries are dropped)."""
    raw = state.get("pending_ends")
    ends = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        session_id, transcript = _str(item.get("session_id")), _str(item.get("transcript"))
        if session_id and transcript:
            ends.append(ConversationEnd(session_id, _str(item.get("ended_at")),
                                        _str(item.get("session_kind")) or "unknown",
                                        _str(item.get("reason")) or "reset", transcript, _int(item.get("seq"))))
    return ends


class CursorStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        # One connection, committed to from several threads (the sink's commits, a poll's, the sweep's): a
        # transaction begun while another thread's is open fails ("cannot start a transaction within a transaction").
        self._lock = threading.Lock()
        make_dirs(path.parent)
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

    def load_sqlite(self, db: str) -> dict[str, SqliteCursor]:
        rows = self._db.execute("SELECT session_id, state FROM db_cursors WHERE db = ?", (db,))
        result: dict[str, SqliteCursor] = {}
        for session_id, state in rows:
            try:
                result[session_id] = SqliteCursor.from_json(state, db=db, session_id=session_id)
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

    def commit_sqlite(self, db: str, states: Mapping[str, SqliteCursor], removed: Iterable[str] = ()) -> None:
        with self._transaction():
            self._db.executemany(
                "INSERT INTO db_cursors (db, session_id, state) VALUES (?, ?, ?) "
                "ON CONFLICT(db, session_id) DO UPDATE SET state = excluded.state",
                [(db, sid, state.to_json()) for sid, state in states.items()],
            )
            self._db.executemany("DELETE FROM db_cursors WHERE db = ? AND session_id = ?",
                                 [(db, sid) for sid in removed])

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db, self._lock)

    def close(self) -> None:
        self._db.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self._db = db
        self._lock = lock

    def __enter__(self) -> None:
        self._lock.acquire()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self._db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self._lock.release()
