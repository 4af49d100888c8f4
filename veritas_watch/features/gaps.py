"""Gap detection: notice when an agent's file memory (STATE.md) missed a finished session.

The Veritas Memory rule: conversation is ground truth, files are cache. When a session ends,
`<workspace>/STATE.md` must carry an event at or after that session's end; if its last event
is older, the end-of-session sync was missed. A *gap* is recorded durably, logged once
(`gap_detected`), and the optional `on_gap` hook (an argv template, never a shell) is run to
repair it. The gap *closes* (`gap_closed`) once STATE.md holds an event at or after the end.

STATE.md time
-------------
The newest timestamp anywhere in the file (every line is scanned: the protocol fixes no
section names), falling back to the file's mtime when it holds none. A missing or unreadable
STATE.md is a gap.

Accepted timestamp forms (a date, optionally a time, optionally a zone after the time):

- date: ``YYYY-MM-DD`` or ``YYYY/MM/DD`` (same separator twice; must be a real date).
- date and time joined by ``T``/``t`` or 1-8 spaces/tabs: ``HH:MM``, ``HH:MM:SS`` or
  ``HH:MM:SS.fff`` (``,`` also accepted before the fraction; the hour may have one digit).
- zone, right after the time: ``Z``; ``+09:00``, ``+0900``, ``+09`` attached; ``+09:00`` or
  ``+0900`` after one space; ``UTC``/``GMT`` alone or with an offset (``UTC+9``, ``GMT+9``,
  ``UTC+05:30``, ``GMT-0500``; ``GMT+9`` means UTC+09:00 as in OpenClaw's envelopes, not
  the inverted POSIX ``Etc/GMT+9``); and these unambiguous abbreviations, upper case, with
  or without a space: JST KST HKT SGT AWST ACST AEST AEDT NZST NZDT WET WEST CET CEST EET
  EEST MSK HST AKST AKDT PST PDT MST MDT CDT EST EDT. Others (CST, IST, BST, ...) are
  ambiguous and not recognised: such a time is read as naive.
- naive times are read in the configured host zone (``default_tz``; default: the local zone).
- in ``2026-03-17 10:00-11:00`` (space separator, no seconds) ``-11:00`` is a time range,
  not an offset; write ``2026-03-17T10:00-11:00`` or include seconds to mean an offset.

Ignored as not-an-event:

- anything that fails validation (``2026-02-30``, ``25:00``) and identifier forms such as the
  reset-archive suffix ``2026-03-17T19-10-15.753Z`` (a date followed by ``T`` and a non-time);
- timestamps later than the file's mtime plus `FUTURE_SLACK` (5 min): a line cannot record an
  event that had not happened when the file was written, so these are plans and deadlines
  ("next review 2026-04-01"). With a mis-set host zone whole timelines can fall in this class;
  STATE.md then degrades to its mtime.
- not supported: week/ordinal dates, compact ``20260317T1000``, kanji dates (``2026年3月17日``).

Date-only stamps mean "some time that day" (in the host zone). One counts as the START of
that day, except that when the file was last modified on that same day it counts as the
modification time: a sync that wrote "2026-03-17 fixed X" at 10:05 covers a session that
ended at 10:00, but a date written at 09:00 does not cover a session that ended at 15:00.
The other reading (end of day) would hide exactly the incident this module exists for.

Comparison: a session is in gap when ``state_time < ended_at - tolerance`` (default 2 min).
The tolerance absorbs the normal in-session sync: the agent writes STATE.md, then sends its
final reply a little later, and minute-precision stamps truncate up to 59 s. The gap closes
when the same comparison flips (checked on every `tick`).

The on_gap hook
---------------
An argv list, run without a shell, its own process group, stdin closed, the daemon's cwd and
environment. Placeholders, substituted inside each element (a value never becomes a second
argument and is never re-parsed): ``{agent}``, ``{session_id}``, ``{transcript}``,
``{ended_at}`` (ISO UTC, ms, ``Z``), ``{workspace}``, ``{state_time}`` (STATE.md's last event
when the gap was found, ISO UTC; empty when STATE.md is missing). ``{{``/``}}`` are literal
braces. The program (element 0) must be literal. Exit 0 is success; a non-zero exit, a
timeout (the group gets SIGTERM, then SIGKILL) or a failure to start is retried with capped
exponential backoff until the gap closes. A successful hook is not run again for that gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sqlite3
import stat
import string
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import structlog

STATE_FILE = "STATE.md"
FUTURE_SLACK = timedelta(minutes=5)
DEFAULT_TOLERANCE = timedelta(minutes=2)
OUTPUT_TAIL_CHARS = 500
KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL delay for a timed-out hook's process group
PIPE_DRAIN_S = 2.0  # how long to keep reading output after the hook exited (escaped children)

HOOK_PLACEHOLDERS = frozenset({"agent", "session_id", "transcript", "ended_at", "workspace", "state_time"})

HookStatus = Literal["running", "ok", "failed", "timeout", "spawn_error", "interrupted"]

# ---------------------------------------------------------------------------------------------
# Time zones


def local_zone() -> tzinfo:
    """The host's zone: `$TZ` if it names one, else /etc/localtime, else the current UTC offset."""
    tz_env = os.environ.get("TZ", "").lstrip(":")
    if tz_env:
        try:
            if tz_env.startswith("/"):
                with open(tz_env, "rb") as handle:
                    return ZoneInfo.from_file(handle, key=tz_env)
            return ZoneInfo(tz_env)
        except (OSError, ValueError, ZoneInfoNotFoundError):
            pass
    localtime = Path("/etc/localtime")
    try:
        target = str(localtime.resolve())
        if "/zoneinfo/" in target:
            with contextlib.suppress(ValueError, ZoneInfoNotFoundError):
                return ZoneInfo(target.split("/zoneinfo/", 1)[1])
        with localtime.open("rb") as handle:
            return ZoneInfo.from_file(handle, key="localtime")
    except (OSError, ValueError):
        pass
    return datetime.now().astimezone().tzinfo or UTC


def resolve_zone(name: str | None) -> tzinfo:
    """Config value -> zone: None, "" or "local" is the host zone, else an IANA name."""
    if name is None or name.strip() in ("", "local"):
        return local_zone()
    if name.strip().upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"unknown time zone {name!r}: use an IANA name such as 'Asia/Tokyo', 'UTC' or 'local'"
        ) from exc


def format_instant(moment: datetime) -> str:
    """ISO-8601 UTC with milliseconds and `Z`: the one text form used in records, logs and hooks."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _parse_instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _to_millis(moment: datetime) -> datetime:
    moment = moment.astimezone(UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def _require_aware(moment: datetime, what: str) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {moment.isoformat()}")


# ---------------------------------------------------------------------------------------------
# STATE.md timestamps

_NAMED_ZONES: dict[str, float] = {
    "JST": 9, "KST": 9, "HKT": 8, "SGT": 8, "AWST": 8, "ACST": 9.5, "AEST": 10, "AEDT": 11,
    "NZST": 12, "NZDT": 13, "WET": 0, "WEST": 1, "CET": 1, "CEST": 2, "EET": 2, "EEST": 3,
    "MSK": 3, "HST": -10, "AKST": -9, "AKDT": -8, "PST": -8, "PDT": -7, "MST": -7, "MDT": -6,
    "CDT": -5, "EST": -5, "EDT": -4,
}  # fmt: skip

_NAMED_ZONE_ALTERNATION = "|".join(sorted(_NAMED_ZONES, key=len, reverse=True))

_STAMP_RE = re.compile(
    rf"""
    (?<![0-9])
    (?P<year>[0-9]{{4}})(?P<dsep>[-/])(?P<month>[0-9]{{2}})(?P=dsep)(?P<day>[0-9]{{2}})
    (?:
        (?P<tsep>[Tt]|[ \t]{{1,8}})
        (?P<hour>[0-9]{{1,2}}):(?P<minute>[0-9]{{2}})
        (?::(?P<second>[0-9]{{2}})(?:[.,](?P<fraction>[0-9]{{1,9}}))?)?
        (?:
            (?P<zulu>[Zz])(?![A-Za-z])
          | (?P<attached>[+-][0-9]{{2}}(?::?[0-9]{{2}})?)
          | [ ](?P<spaced>[+-][0-9]{{2}}:?[0-9]{{2}})
          | [ ]?(?P<utc>UTC|GMT)(?P<utcoff>[+-][0-9]{{1,2}}(?::?[0-9]{{2}})?)?(?![A-Za-z])
          | [ ]?(?P<named>{_NAMED_ZONE_ALTERNATION})(?![A-Za-z])
        )?
    )?
    (?![0-9])
    """,
    re.VERBOSE,
)
_IDENTIFIER_TAIL_RE = re.compile(r"[Tt][0-9]")
_OFFSET_RE = re.compile(r"([+-])([0-9]{1,2})(?::?([0-9]{2}))?")


@dataclass(frozen=True, slots=True)
class _Stamp:
    instant: datetime  # aware, UTC
    day: date  # the calendar day as written
    date_only: bool


def _offset(text: str) -> timezone | None:
    match = _OFFSET_RE.fullmatch(text)
    if match is None:
        return None
    hours, minutes = int(match.group(2)), int(match.group(3) or 0)
    if hours > 14 or minutes > 59:
        return None
    delta = timedelta(hours=hours, minutes=minutes)
    return timezone(-delta if match.group(1) == "-" else delta)


def _stamp_from_match(match: re.Match[str], text: str, default_tz: tzinfo) -> _Stamp | None:
    try:
        day = date(int(match["year"]), int(match["month"]), int(match["day"]))
    except ValueError:
        return None
    if match["hour"] is None:
        if _IDENTIFIER_TAIL_RE.match(text, match.end()):
            return None  # e.g. "2026-03-17T19-10-15.753Z": an archive name, not a time
        start = datetime(day.year, day.month, day.day, tzinfo=default_tz)
        return _Stamp(start.astimezone(UTC), day, date_only=True)
    hour, minute = int(match["hour"]), int(match["minute"])
    second = int(match["second"] or 0)
    if hour > 23 or minute > 59 or second > 60:
        return None
    second = min(second, 59)  # a leap second is not worth a special case
    micro = int((match["fraction"] or "0").ljust(6, "0")[:6])
    zone: tzinfo | None = default_tz
    if match["zulu"]:
        zone = UTC
    elif match["attached"]:
        is_range = match["attached"][0] == "-" and match["tsep"] not in ("T", "t") and match["second"] is None
        zone = default_tz if is_range else _offset(match["attached"])
    elif match["spaced"]:
        zone = _offset(match["spaced"])
    elif match["utc"]:
        zone = _offset(match["utcoff"]) if match["utcoff"] else UTC
    elif match["named"]:
        zone = timezone(timedelta(hours=_NAMED_ZONES[match["named"]]))
    if zone is None:
        return None  # an offset out of range: not a timestamp we can trust
    local = datetime(day.year, day.month, day.day, hour, minute, second, micro, tzinfo=zone)
    return _Stamp(local.astimezone(UTC), day, date_only=False)


def _iter_stamps(text: str, default_tz: tzinfo) -> Iterator[_Stamp]:
    for match in _STAMP_RE.finditer(text):
        stamp = _stamp_from_match(match, text, default_tz)
        if stamp is not None:
            yield stamp


def state_last_event(text: str, *, default_tz: tzinfo, written_at: datetime | None = None) -> datetime | None:
    """Newest event instant written in STATE.md text (aware, UTC), or None if it holds none.

    `written_at` is the file's modification time. When given, stamps later than it plus
    `FUTURE_SLACK` are ignored (plans, deadlines), and a date-only stamp of the same day
    counts as `written_at` instead of the start of the day (see the module docstring).
    """
    if written_at is not None:
        _require_aware(written_at, "written_at")
        written_at = written_at.astimezone(UTC)
    newest: datetime | None = None
    for stamp in _iter_stamps(text, default_tz):
        instant = stamp.instant
        if written_at is not None:
            if instant > written_at + FUTURE_SLACK:
                continue
            if stamp.date_only and written_at.astimezone(default_tz).date() == stamp.day:
                instant = max(instant, written_at)
        if newest is None or instant > newest:
            newest = instant
    return newest


def state_time(path: Path, default_tz: tzinfo) -> datetime | None:
    """STATE.md's last event time (aware, UTC): its newest timestamp, else its mtime.

    None when the file is missing or unreadable: the caller counts that as a gap.
    """
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None  # a directory or a FIFO (opening one would block) is no STATE.md
        with path.open("rb") as handle:
            mtime = datetime.fromtimestamp(os.fstat(handle.fileno()).st_mtime, tz=UTC)
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    newest = state_last_event(text, default_tz=default_tz, written_at=mtime)
    return newest if newest is not None else mtime


# ---------------------------------------------------------------------------------------------
# Hook templates and execution


def validate_hook_template(argv: object) -> None:
    """Raise ValueError (naming the element) unless `argv` is a usable `gaps.on_gap` template.

    Rules: a non-empty list of strings; placeholders are bare names from `HOOK_PLACEHOLDERS`
    (no attribute, index, conversion or format spec; `{{`/`}}` for literal braces); the program
    (element 0) is literal, so no value can choose what runs.
    """
    if not isinstance(argv, list | tuple) or not argv:
        raise ValueError("gaps.on_gap must be a non-empty list of strings (an argv, run without a shell)")
    formatter = string.Formatter()
    allowed = ", ".join("{" + name + "}" for name in sorted(HOOK_PLACEHOLDERS))
    for index, element in enumerate(argv):
        where = f"gaps.on_gap[{index}]"
        if not isinstance(element, str):
            raise ValueError(f"{where} must be a string, got {type(element).__name__}")
        try:
            pieces = list(formatter.parse(element))
        except ValueError as exc:
            raise ValueError(f"{where} = {element!r}: {exc} (write {{{{ and }}}} for literal braces)") from exc
        for _literal, field, spec, conversion in pieces:
            if field is None:
                continue
            if field not in HOOK_PLACEHOLDERS:
                raise ValueError(f"{where} = {element!r}: unknown placeholder {{{field}}}; allowed: {allowed}")
            if spec or conversion:
                raise ValueError(f"{where} = {element!r}: placeholders take no format spec or conversion")
            if index == 0:
                raise ValueError(f"{where} = {element!r}: the program must be literal, not a placeholder")
    if not argv[0]:
        raise ValueError("gaps.on_gap[0] (the program) is empty")


def render_hook_argv(argv: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Substitute placeholders per element. Values are inserted verbatim and never re-parsed,
    so a value containing spaces, quotes, `;`, `$(...)` or `{agent}` stays one literal argument."""
    formatter = string.Formatter()
    rendered: list[str] = []
    for element in argv:
        parts: list[str] = []
        for literal, field, _spec, _conversion in formatter.parse(element):
            parts.append(literal)
            if field is not None:
                parts.append(values[field])
        rendered.append("".join(parts))
    return rendered


@dataclass(frozen=True, slots=True)
class HookResult:
    status: Literal["ok", "failed", "timeout", "spawn_error"]
    exit_status: int | None  # the return code; negative = killed by that signal
    output_tail: str  # last OUTPUT_TAIL_CHARS characters of stdout+stderr
    duration_s: float


class _Tail:
    """Keeps only the last bytes of a stream, so a chatty hook cannot grow memory."""

    def __init__(self, chars: int) -> None:
        self._chars = chars
        self._limit = chars * 4 + 4  # UTF-8: at most 4 bytes a character
        self._buffer = bytearray()

    def add(self, data: bytes) -> None:
        self._buffer.extend(data)
        if len(self._buffer) > self._limit:
            del self._buffer[: len(self._buffer) - self._limit]

    def text(self) -> str:
        return self._buffer.decode("utf-8", errors="replace")[-self._chars :].strip()


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def run_hook(argv: Sequence[str], timeout: float, *, tail_chars: int = OUTPUT_TAIL_CHARS) -> HookResult:
    """Run `argv` (no shell) in its own process group with stdin closed; never raises on failure.

    On timeout the whole group gets SIGTERM, then SIGKILL after `KILL_GRACE_S`. On
    cancellation the group is killed and CancelledError propagates.
    """
    started = time.monotonic()
    tail = _Tail(tail_chars)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # own process group: a timeout kills the hook's children too
        )
    except (OSError, ValueError) as exc:  # not found, not executable, NUL byte in an argument
        return HookResult("spawn_error", None, f"{type(exc).__name__}: {exc}"[-tail_chars:], time.monotonic() - started)

    async def pump() -> None:
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            tail.add(chunk)

    reader = asyncio.create_task(pump())
    timed_out = False
    try:
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            timed_out = True
            _kill_group(process.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), KILL_GRACE_S)
            _kill_group(process.pid, signal.SIGKILL)  # also stragglers that ignored SIGTERM
            await process.wait()
        # A child that left the group may still hold the pipe open: stop reading after a bound.
        with contextlib.suppress(TimeoutError, OSError):
            await asyncio.wait_for(asyncio.shield(reader), PIPE_DRAIN_S)
    except asyncio.CancelledError:
        _kill_group(process.pid, signal.SIGKILL)
        raise
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
    duration = time.monotonic() - started
    code = process.returncode
    if timed_out:
        return HookResult("timeout", code, tail.text(), duration)
    return HookResult("ok" if code == 0 else "failed", code, tail.text(), duration)


# ---------------------------------------------------------------------------------------------
# Records


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


def _text(moment: datetime | None) -> str | None:
    return None if moment is None else format_instant(moment)


def _moment(text: str | None) -> datetime | None:
    return None if text is None else _parse_instant(text)


class GapStore:
    """Durable gap records: SQLite `<data_dir>/gaps.sqlite3`, WAL, synchronous=FULL.

    One row per (agent_id, session_id, ended_at), so a session is recorded, and its hook
    fired, at most once however often it is reported. Instants are stored as fixed-width
    UTC text, so text order is time order.
    """

    FILE_NAME = "gaps.sqlite3"

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
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
            ended_at=_parse_instant(row[2]),
            transcript=row[3],
            workspace=Path(row[4]),
            state_time=_moment(row[5]),
            detected_at=_parse_instant(row[6]),
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
                str(gap.workspace), _text(gap.state_time), format_instant(gap.detected_at),
                gap.hook_attempts, _text(gap.next_attempt_at), gap.last_hook_status,
                _text(gap.closed_at),
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
            (attempts, status, _text(next_attempt_at), *self._key_params(key)),
        )

    def close_gap(self, key: GapKey, closed_at: datetime) -> None:
        self._db.execute(
            "UPDATE gaps SET closed_at=?, next_attempt_at=NULL"
            " WHERE agent_id=? AND session_id=? AND ended_at=? AND closed_at IS NULL",
            (format_instant(closed_at), *self._key_params(key)),
        )


# ---------------------------------------------------------------------------------------------
# Detector


def _utc_now() -> datetime:
    return datetime.now(UTC)


class GapDetector:
    """Compares ended sessions with STATE.md, records gaps, runs and retries the hook.

    Hooks run in background tasks (a sync can take minutes; callers never wait for one), one
    at a time per agent, oldest session first, at most `hook_concurrency` at once. Before a
    hook runs STATE.md is checked again: a gap closed in the meantime (for example by the
    sync of an earlier session of the same agent) is not fired. A closed gap never fires.
    """

    def __init__(
        self,
        store: GapStore,
        hook: list[str] | None,
        hook_timeout: float,
        default_tz: tzinfo,
        log: Any = None,
        *,
        tolerance: timedelta = DEFAULT_TOLERANCE,
        backoff_initial: float = 30.0,
        backoff_max: float = 3600.0,
        hook_concurrency: int = 2,
        output_filter: Callable[[str], str] | None = None,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if hook is not None:
            validate_hook_template(hook)
        if hook_timeout <= 0 or backoff_initial <= 0 or backoff_max < backoff_initial or hook_concurrency < 1:
            raise ValueError("hook_timeout and backoff_initial must be > 0, backoff_max >= backoff_initial")
        self._store = store
        self._hook = list(hook) if hook else None
        self._hook_timeout = hook_timeout
        self._default_tz = default_tz
        self._log: Any = log if log is not None else structlog.get_logger()
        self._tolerance = tolerance
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._hook_slots = asyncio.Semaphore(hook_concurrency)
        self._agent_locks: dict[str, asyncio.Lock] = {}
        self._output_filter = output_filter
        self._clock = clock
        self._tasks: dict[GapKey, asyncio.Task[None]] = {}
        self._recover_interrupted()

    # -- public API

    async def session_ended(
        self, agent_id: str, session_id: str, transcript: str, ended_at: datetime, workspace: Path
    ) -> Gap | None:
        """Check one ended session; return the Gap if this call found a NEW one, else None.

        A session already recorded (open or closed) is neither logged nor fired again.
        """
        _require_aware(ended_at, "ended_at")
        key = GapKey(agent_id, session_id, _to_millis(ended_at))
        if self._store.get(key) is not None:
            return None
        state = await self._state_time(workspace)
        if self._covers(state, key.ended_at):
            return None
        now = _to_millis(self._clock())  # the store keeps milliseconds: return what it holds
        gap = Gap(
            agent_id=agent_id,
            session_id=session_id,
            transcript=transcript,
            ended_at=key.ended_at,
            state_time=None if state is None else _to_millis(state),
            workspace=workspace,
            detected_at=now,
            next_attempt_at=now if self._hook else None,
        )
        if not self._store.insert(gap):
            return None  # reported twice concurrently: the other call owns it
        self._log.warning(
            "gap_detected",
            agent=agent_id,
            session=session_id,
            transcript=transcript,
            session_end=format_instant(gap.ended_at),
            state_time=_text(state),
            state_missing=state is None,
            workspace=str(workspace),
        )
        if self._hook:
            self._schedule(key, due_by=now)
        return gap

    async def startup_scan(self, sessions: Iterable[EndedSession], *, newest_only: bool = True) -> list[Gap]:
        """Check sessions that ended while the daemon was down; return the new gaps.

        With `newest_only` (default) only each agent's newest ended session is checked: the
        protocol's rule is about the last session, and checking every archive would fire one
        sync per historical session on a first run (or always, for an agent without STATE.md).
        Known gaps are never fired again.
        """
        chosen = list(sessions)
        if newest_only:
            newest: dict[str, EndedSession] = {}
            for session in chosen:
                current = newest.get(session.agent_id)
                if current is None or session.ended_at > current.ended_at:
                    newest[session.agent_id] = session
            chosen = list(newest.values())
        found: list[Gap] = []
        for session in sorted(chosen, key=lambda s: s.ended_at):
            gap = await self.session_ended(
                session.agent_id, session.session_id, session.transcript, session.ended_at, session.workspace
            )
            if gap is not None:
                found.append(gap)
        return found

    async def tick(self, now: datetime) -> None:
        """Close gaps whose STATE.md caught up; start hook retries that are due. Never raises."""
        _require_aware(now, "now")
        cache: dict[Path, datetime | None] = {}
        for gap in self._store.open_gaps():
            try:
                if await self._close_if_covered(gap, now, cache):
                    continue
                due = gap.next_attempt_at is not None and gap.next_attempt_at <= now
                if self._hook and due and gap.key not in self._tasks:
                    self._schedule(gap.key, due_by=now)
            except Exception:
                self._log.exception("gap_tick_error", agent=gap.agent_id, session=gap.session_id)

    def open_gaps(self) -> list[Gap]:
        return self._store.open_gaps()

    async def wait_hooks(self) -> None:
        """Wait until no hook run is pending or running (tests; graceful shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def shutdown(self, grace: float = 5.0) -> None:
        """Give running hooks `grace` seconds, then kill them (recorded `interrupted`, retried
        at the next start)."""
        tasks = list(self._tasks.values())
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # -- internals

    def _covers(self, state: datetime | None, ended_at: datetime) -> bool:
        return state is not None and state >= ended_at - self._tolerance

    async def _state_time(self, workspace: Path) -> datetime | None:
        # A thread: STATE.md may sit on a slow or hung network filesystem.
        return await asyncio.to_thread(state_time, workspace / STATE_FILE, self._default_tz)

    async def _close_if_covered(
        self, gap: Gap, now: datetime, cache: dict[Path, datetime | None] | None = None
    ) -> bool:
        if cache is not None and gap.workspace in cache:
            state = cache[gap.workspace]
        else:
            state = await self._state_time(gap.workspace)
            if cache is not None:
                cache[gap.workspace] = state
        if not self._covers(state, gap.ended_at):
            return False
        self._store.close_gap(gap.key, now)
        self._log.info(
            "gap_closed",
            agent=gap.agent_id,
            session=gap.session_id,
            session_end=format_instant(gap.ended_at),
            state_time=_text(state),
            delay_s=round((now - gap.ended_at).total_seconds(), 3),
            hook_attempts=gap.hook_attempts,
        )
        return True

    def _backoff(self, attempt: int) -> timedelta:
        return timedelta(seconds=min(self._backoff_max, self._backoff_initial * 2 ** max(0, attempt - 1)))

    def _recover_interrupted(self) -> None:
        # A hook still "running" in the store was cut off by a crash. Its next_attempt_at was
        # set when it started to start + timeout + backoff, so the retry cannot overlap it.
        for gap in self._store.open_gaps():
            if gap.last_hook_status == "running":
                self._store.set_hook_state(
                    gap.key, attempts=gap.hook_attempts, status="interrupted", next_attempt_at=gap.next_attempt_at
                )
                self._log.warning(
                    "gap_hook_interrupted",
                    agent=gap.agent_id,
                    session=gap.session_id,
                    retry_at=_text(gap.next_attempt_at),
                )

    def _schedule(self, key: GapKey, *, due_by: datetime) -> None:
        task = asyncio.create_task(self._hook_task(key, due_by), name=f"gap-hook:{key.agent_id}:{key.session_id}")
        self._tasks[key] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._tasks.get(key) is finished:
                del self._tasks[key]
            if not finished.cancelled() and finished.exception() is not None:
                self._log.error(
                    "gap_hook_error", agent=key.agent_id, session=key.session_id, error=repr(finished.exception())
                )

        task.add_done_callback(done)

    def _hook_values(self, gap: Gap) -> dict[str, str]:
        return {
            "agent": gap.agent_id,
            "session_id": gap.session_id,
            "transcript": gap.transcript,
            "ended_at": format_instant(gap.ended_at),
            "workspace": str(gap.workspace),
            "state_time": _text(gap.state_time) or "",
        }

    async def _hook_task(self, key: GapKey, due_by: datetime) -> None:
        assert self._hook is not None
        lock = self._agent_locks.setdefault(key.agent_id, asyncio.Lock())
        async with lock, self._hook_slots:
            # Re-read under the lock: while this task waited, another run may have finished.
            gap = self._store.get(key)
            if gap is None or not gap.is_open or gap.next_attempt_at is None or gap.next_attempt_at > due_by:
                return
            if await self._close_if_covered(gap, self._clock()):
                return
            attempt = gap.hook_attempts + 1
            started = self._clock()
            self._store.set_hook_state(
                key,
                attempts=attempt,
                status="running",
                next_attempt_at=started + timedelta(seconds=self._hook_timeout + KILL_GRACE_S) + self._backoff(attempt),
            )
            argv = render_hook_argv(self._hook, self._hook_values(gap))
            try:
                result = await run_hook(argv, self._hook_timeout)
            except asyncio.CancelledError:
                self._store.set_hook_state(key, attempts=attempt, status="interrupted", next_attempt_at=self._clock())
                self._log.warning("gap_hook_interrupted", agent=key.agent_id, session=key.session_id)
                raise
            finished = self._clock()
            tail = self._output_filter(result.output_tail) if self._output_filter else result.output_tail
            current = self._store.get(key)
            still_open = current is not None and current.is_open
            fields = {
                "agent": key.agent_id,
                "session": key.session_id,
                "attempt": attempt,
                "exit_status": result.exit_status,
                "output_tail": tail,
                "duration_s": round(result.duration_s, 3),
            }
            if result.status == "ok":
                self._store.set_hook_state(key, attempts=attempt, status="ok", next_attempt_at=None)
                self._log.info("gap_hook_finished", **fields)
                return
            retry_at = finished + self._backoff(attempt) if still_open else None
            self._store.set_hook_state(key, attempts=attempt, status=result.status, next_attempt_at=retry_at)
            self._log.warning(
                "gap_hook_failed",
                reason=result.status,
                retry_at=_text(retry_at),
                retry_in_s=self._backoff(attempt).total_seconds() if retry_at else None,
                **fields,
            )


__all__ = [
    "DEFAULT_TOLERANCE",
    "FUTURE_SLACK",
    "HOOK_PLACEHOLDERS",
    "STATE_FILE",
    "EndedSession",
    "Gap",
    "GapDetector",
    "GapKey",
    "GapStore",
    "HookResult",
    "format_instant",
    "local_zone",
    "render_hook_argv",
    "resolve_zone",
    "run_hook",
    "state_last_event",
    "state_time",
    "validate_hook_template",
]
