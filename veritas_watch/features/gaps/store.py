"""Gap records and their durable store (`<data_dir>/gaps.sqlite3`)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from veritas_watch.features.gaps.zones import format_instant, parse_instant
from veritas_watch.safepath import make_dirs


@dataclass(frozen=True, slots=True)
class GapKey:
    agent_id: str
    session_id: str
    ended_at: datetime  # UTC, millisecond precision: a reused session id ends at another time


@dataclass(frozen=True, slots=True)
class Gap:
    agent_id: str
    session_id: str
    transcript: str  # where the session can be read (a JSONL path or a SQLite source ref)
    ended_at: datetime  # the last conversational entry's time, UTC, millisecond precision
    state_time: datetime | None  # STATE.md's time when the gap was detected; None = missing
    workspace: Path
    detected_at: datetime
    hook_attempts: int = 0
    next_attempt_at: datetime | None = None  # None: no hook run due (none configured, or it succeeded)
    last_hook_status: str | None = None  # a HookStatus, or None if the hook never ran
    closed_at: datetime | None = None

    @property
    def key(self) -> GapKey:
        return GapKey(self.agent_id, self.session_id, self.ended_at)

    @property
    def is_open(self) -> bool:
        return self.closed_at is None


@dataclass(frozen=True, slots=True)
class EndedSession:
    agent_id: str
    session_id: str
    transcript: str
    ended_at: datetime
    workspace: Path


_SCHEMA = """
CREATE TABLE IF NOT EXISTS gaps (
    agent_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    ended_at TEXT NOT NULL,
    transcript TEXT NOT NULL,
    workspace TEXT NOT NULL,
    state_time TEXT,
    detected_at TEXT NOT NULL,
    hook_attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TEXT,
    last_hook_status TEXT,
    closed_at TEXT,
    PRIMARY KEY (agent_id, session_id, ended_at)
);
CREATE INDEX IF NOT EXISTS gaps_open ON gaps (ended_at) WHERE closed_at IS NULL;
"""
_COLUMNS = (
    "agent_id, session_id, ended_at, transcript, workspace, state_time, detected_at,"
    " hook_attempts, next_attempt_at, last_hook_status, closed_at"
)


def instant_or_none(moment: datetime | None) -> str | None:
    return None if moment is None else format_instant(moment)


def _moment(text: str | None) -> datetime | None:
    return None if text is None else parse_instant(text)


class GapStore:
    """Durable gap records: SQLite `<data_dir>/gaps.sqlite3`, WAL, synchronous=FULL.

    One row per (agent_id, session_id, ended_at), so a session is recorded, and its hook
    fired, at most once however often it is reported. Instants are stored as fixed-width
    UTC text, so text order is time order.
    """

    FILE_NAME = "gaps.sqlite3"

    def __init__(self, data_dir: Path) -> None:
        make_dirs(data_dir)
        self.path = data_dir / self.FILE_NAME
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._db.execute("PRAGMA user_version=1")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> GapStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _row_to_gap(row: tuple[Any, ...]) -> Gap:
        return Gap(
            agent_id=row[0],
            session_id=row[1],
            ended_at=parse_instant(row[2]),
            transcript=row[3],
            workspace=Path(row[4]),
            state_time=_moment(row[5]),
            detected_at=parse_instant(row[6]),
            hook_attempts=int(row[7]),
            next_attempt_at=_moment(row[8]),
            last_hook_status=row[9],
            closed_at=_moment(row[10]),
        )

    @staticmethod
    def _key_params(key: GapKey) -> tuple[str, str, str]:
        return key.agent_id, key.session_id, format_instant(key.ended_at)

    def insert(self, gap: Gap) -> bool:
        """Record a new gap; False (and nothing changed) if its key is already recorded."""
        cursor = self._db.execute(
            f"INSERT OR IGNORE INTO gaps ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                gap.agent_id, gap.session_id, format_instant(gap.ended_at), gap.transcript,
                str(gap.workspace), instant_or_none(gap.state_time), format_instant(gap.detected_at),
                gap.hook_attempts, instant_or_none(gap.next_attempt_at), gap.last_hook_status,
                instant_or_none(gap.closed_at),
            ),
        )  # fmt: skip
        return cursor.rowcount == 1

    def get(self, key: GapKey) -> Gap | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM gaps WHERE agent_id=? AND session_id=? AND ended_at=?",
            self._key_params(key),
        ).fetchone()
        return None if row is None else self._row_to_gap(row)

    def open_gaps(self) -> list[Gap]:
        """Open gaps, oldest session end first."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM gaps WHERE closed_at IS NULL ORDER BY ended_at, agent_id, session_id"
        ).fetchall()
        return [self._row_to_gap(row) for row in rows]

    def all_gaps(self) -> list[Gap]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM gaps ORDER BY ended_at, agent_id, session_id").fetchall()
        return [self._row_to_gap(row) for row in rows]

    def set_hook_state(
        self, key: GapKey, *, attempts: int, status: str | None, next_attempt_at: datetime | None
    ) -> None:
        self._db.execute(
            "UPDATE gaps SET hook_attempts=?, last_hook_status=?, next_attempt_at=?"
            " WHERE agent_id=? AND session_id=? AND ended_at=?",
            (attempts, status, instant_or_none(next_attempt_at), *self._key_params(key)),
        )

    def close_gap(self, key: GapKey, closed_at: datetime) -> None:
        self._db.execute(
            "UPDATE gaps SET closed_at=?, next_attempt_at=NULL"
            " WHERE agent_id=? AND session_id=? AND ended_at=? AND closed_at IS NULL",
            (format_instant(closed_at), *self._key_params(key)),
        )

    def forget_sessions(self, agent_id: str, session_ids: frozenset[str], *, dry_run: bool = False) -> int:
        """Remove every gap record of these sessions (a person had them forgotten); returns how many went (or
        would). A hook still running for one finds its gap gone and stops (`GapDetector._hook_task`)."""
        if not session_ids:
            return 0
        marks = ",".join("?" * len(session_ids))
        verb = "SELECT count(*) FROM" if dry_run else "DELETE FROM"
        cursor = self._db.execute(f"{verb} gaps WHERE agent_id=? AND session_id IN ({marks})",
                                  (agent_id, *sorted(session_ids)))
        return int(cursor.fetchone()[0]) if dry_run else cursor.rowcount
