"""Time zones: the host zone, instants as fixed-width UTC text (their order is time order)."""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


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


def parse_instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def to_millis(moment: datetime) -> datetime:
    moment = moment.astimezone(UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def require_aware(moment: datetime, what: str) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {moment.isoformat()}")
