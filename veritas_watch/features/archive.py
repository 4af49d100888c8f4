"""Daily-log archiving (opt-in, periodic): keep an agent's `memory/` small.

Rule (Veritas Memory protocol): when `<workspace>/memory/` holds MORE than `threshold`
(default 30) daily logs named `YYYY-MM-DD.md` (a real calendar date), every daily log MORE
than `keep_days` (default 14) days older than `today` is moved to `memory/archive/` under the
same name. A log dated exactly `today - keep_days` stays. Only regular files directly in
`memory/` count; symlinks, other names and invalid dates (`2026-02-30.md`) are left alone.

Never overwrites: when `memory/archive/<name>` already exists the log stays where it is and
`archive_skipped_exists` is logged. The move is a hard link followed by an unlink, so even a
file created concurrently at the target is not replaced (filesystems without hard links fall
back to an existence check and a rename).

`today` is the caller's local date in the OpenClaw host zone. Blocking I/O: call it from a
thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from datetime import date
from pathlib import Path
from typing import Any

import structlog

from veritas_watch.safepath import PRIVATE_DIR, make_dirs

MEMORY_DIR = "memory"
ARCHIVE_DIR = "archive"
# The archive holds the agent's own daily logs (what was said, day by day): its owner's alone, as the data dir,
# whatever the umask (under umask 000 it was made 0777). The agent's OpenClaw runs as that owner and still reads it.
ARCHIVE_MODE = PRIVATE_DIR
DAILY_LOG_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})\.md")

# errnos meaning "this filesystem cannot hard-link here", as opposed to "target exists"
_NO_LINK_ERRNOS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS})


def daily_log_date(name: str) -> date | None:
    """The date a daily-log file name stands for, or None if it is not `YYYY-MM-DD.md`."""
    match = DAILY_LOG_RE.fullmatch(name)
    if match is None:
        return None
    try:
        return date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        return None


def _fsync_dir(path: Path) -> None:
    # The rename is only durable once the directory entry is on disk.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _move_no_replace(source: Path, target: Path) -> bool:
    """Move `source` to `target` unless `target` exists; False if it exists."""
    try:
        os.link(source, target, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_LINK_ERRNOS:
            raise
        if os.path.lexists(target):
            return False
        os.rename(source, target)
        return True
    os.unlink(source)
    return True


def archive_daily_logs(
    workspace: Path,
    today: date,
    keep_days: int = 14,
    threshold: int = 30,
    *,
    log: Any = None,
) -> list[tuple[Path, Path]]:
    """Archive old daily logs of one workspace; return the (source, target) pairs moved."""
    logger: Any = log if log is not None else structlog.get_logger()
    memory = workspace / MEMORY_DIR
    try:
        entries = list(os.scandir(memory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    daily: list[tuple[date, Path]] = []
    for entry in entries:
        day = daily_log_date(entry.name)
        if day is not None and entry.is_file(follow_symlinks=False):
            daily.append((day, Path(entry.path)))
    if len(daily) <= threshold:
        return []
    old = sorted((day, path) for day, path in daily if (today - day).days > keep_days)
    if not old:
        return []
    archive = memory / ARCHIVE_DIR
    with contextlib.suppress(FileExistsError):  # a file in the way is reported just below
        make_dirs(archive, ARCHIVE_MODE)
    if archive.is_symlink() or not archive.is_dir():
        logger.warning("archive_dir_unusable", workspace=str(workspace), archive=str(archive))
        return []
    moved: list[tuple[Path, Path]] = []
    for _day, source in old:
        target = archive / source.name
        try:
            done = _move_no_replace(source, target)
        except OSError as exc:
            logger.warning("archive_move_failed", source=str(source), target=str(target), error=str(exc))
            continue
        if not done:
            logger.warning("archive_skipped_exists", source=str(source), target=str(target))
            continue
        moved.append((source, target))
        logger.info("daily_log_archived", workspace=str(workspace), source=str(source), target=str(target))
    if moved:
        _fsync_dir(archive)
        _fsync_dir(memory)
    return moved


__all__ = ["ARCHIVE_DIR", "DAILY_LOG_RE", "MEMORY_DIR", "archive_daily_logs", "daily_log_date"]
