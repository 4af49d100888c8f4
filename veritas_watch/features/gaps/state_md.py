"""STATE.md's time: the newest event stamp in the file (see the package docstring for the forms)."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from pathlib import Path

from veritas_watch.features.gaps.zones import require_aware

STATE_FILE = "STATE.md"
FUTURE_SLACK = timedelta(minutes=5)

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
        require_aware(written_at, "written_at")
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
