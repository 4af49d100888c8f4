"""The JSONL transcript source: file identity, read-ahead, truncation/rewrite detection.

Everything here is synchronous and runs in a worker thread; the daemon decides when to call it.

Identity: a file is its (device, inode) plus a fingerprint of its first bytes (so a reused inode
with other content is a new file). A hash of the bytes just before the saved offset tells an
append from a rewrite. Any doubt means "re-read from 0", which is safe: point ids are
deterministic and the sink skips points already stored with the same text.

Reads stop at the last complete newline: a half-written line waits for its end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from veritas_watch.model import RawRecord, SourceRef
from veritas_watch.openclaw import AgentDirs, TranscriptKind, classify_transcript
from veritas_watch.sources.cursors import FileCursor

log = structlog.get_logger()

HEAD_BYTES = 1024  # fingerprint length once the file is that long (growing fingerprint before)
TAIL_BYTES = 32  # bytes before the offset that must be unchanged for an append


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    while length > 0:
        data = os.pread(fd, length, offset)
        if not data:
            break
        chunks.append(data)
        length -= len(data)
        offset += len(data)
    return b"".join(chunks)


@dataclass
class TrackedFile:
    """One transcript file being followed. `read` runs ahead of `committed` by the units in flight."""

    committed: FileCursor
    read: FileCursor
    kind: TranscriptKind
    generation: int = 0  # bumped on every re-read from 0, so stale units do not commit
    fd: int | None = None
    size: int = 0
    gone: bool = False  # deleted or moved out of the watched tree: drain, then drop

    @property
    def key(self) -> str:
        return self.committed.key

    @property
    def backlog(self) -> int:
        return max(0, self.size - self.committed.offset)


@dataclass(frozen=True)
class ReadUnit:
    """Complete lines read from one file, and the cursor to commit once they are stored."""

    key: str
    generation: int
    records: tuple[RawRecord, ...]
    too_long: tuple[SourceRef, ...]  # lines over the limit, skipped unread
    cursor_after: FileCursor
    at_eof: bool


@dataclass
class SweepResult:
    changed: list[TrackedFile] = field(default_factory=list)
    new_files: int = 0
    rewritten: int = 0
    dropped: list[str] = field(default_factory=list)


class JsonlTailer:
    def __init__(self, state_dir: Path, cursors: dict[str, FileCursor], *,
                 max_line_bytes: int, read_chunk_bytes: int) -> None:
        self.state_dir = state_dir.resolve() if state_dir.exists() else state_dir
        self.files: dict[str, TrackedFile] = {}
        self._saved = cursors  # cursors from the last run, adopted when their inode shows up
        self.max_line_bytes = max_line_bytes
        self.read_chunk_bytes = max(read_chunk_bytes, 4096)

    # -- discovery and identity ------------------------------------------------------------------

    def sweep(self, agents: Iterable[AgentDirs]) -> SweepResult:
        """Stat every transcript; the source of truth, whatever inotify said or missed."""
        result = SweepResult()
        seen: set[str] = set()
        for agent in agents:
            for path, kind, st in self._list(agent.sessions):
                key = f"{st.st_dev}:{st.st_ino}"
                seen.add(key)
                tracked = self.files.get(key)
                if tracked is None:
                    tracked = self._adopt(key, path, agent.agent_id, kind, st)
                    if tracked is None:
                        continue
                    result.new_files += 1
                elif tracked.read.path != str(path):
                    log.info("transcript_renamed", agent=agent.agent_id, old=tracked.read.path, new=str(path),
                             kind=kind)
                    tracked.read.path = str(path)
                    tracked.committed.path = str(path)
                    tracked.kind = kind
                if self._check(tracked, st.st_size):
                    result.rewritten += 1
                tracked.size = st.st_size
                if tracked.size > tracked.read.offset:
                    result.changed.append(tracked)
        for key, tracked in list(self.files.items()):
            if key not in seen and not tracked.gone:
                tracked.gone = True
                log.info("transcript_gone", path=tracked.read.path, unread=self._unread_on_fd(tracked))
            if tracked.gone:
                if tracked.fd is not None and self._unread_on_fd(tracked) > 0:
                    result.changed.append(tracked)  # drain through the open handle first
                elif tracked.read.offset == tracked.committed.offset:
                    self._close(tracked)
                    del self.files[key]
                    result.dropped.append(key)
        return result

    def _list(self, sessions: Path) -> Iterable[tuple[Path, TranscriptKind, os.stat_result]]:
        try:
            entries = list(os.scandir(sessions))
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("sessions_dir_unreadable", path=str(sessions), error=str(exc))
            return
        for entry in entries:
            name = classify_transcript(entry.name)
            if name is None:
                continue
            path = Path(entry.path)
            try:
                if entry.is_symlink() and not self._inside_state_dir(path):
                    log.warning("symlink_outside_state_dir_ignored", path=str(path))
                    continue
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield path, name.kind, st

    def _inside_state_dir(self, path: Path) -> bool:
        try:
            return path.resolve().is_relative_to(self.state_dir)
        except OSError:
            return False

    def _adopt(self, key: str, path: Path, agent_id: str, kind: TranscriptKind,
               st: os.stat_result) -> TrackedFile | None:
        saved = self._saved.pop(key, None)
        cursor = saved if saved is not None and saved.agent_id == agent_id else FileCursor(key, str(path), agent_id)
        cursor.path = str(path)
        tracked = TrackedFile(cursor, dataclasses.replace(cursor), kind, size=st.st_size)
        try:
            tracked.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("transcript_unreadable", path=str(path), error=str(exc))
            return None
        self.files[key] = tracked
        return tracked

    def _check(self, tracked: TrackedFile, size: int) -> bool:
        """Re-read from 0 when the file shrank, or the bytes we already read changed."""
        cursor = tracked.read
        if cursor.offset == 0 or tracked.fd is None:
            return False
        reason = None
        if size < cursor.offset:
            reason = "truncated"
        elif cursor.head_len and _digest(_pread_exact(tracked.fd, cursor.head_len, 0)) != cursor.head_hash:
            reason = "head_changed"
        else:
            start = max(0, cursor.offset - TAIL_BYTES)
            if _digest(_pread_exact(tracked.fd, cursor.offset - start, start)) != cursor.tail_hash:
                reason = "content_changed"
        if reason is None:
            return False
        log.info("transcript_reread", path=cursor.path, reason=reason, old_offset=cursor.offset, size=size)
        tracked.generation += 1
        tracked.read = FileCursor(cursor.key, cursor.path, cursor.agent_id)
        return True

    # -- reading -------------------------------------------------------------------------------

    def read(self, tracked: TrackedFile) -> ReadUnit | None:
        """The next complete lines after `tracked.read`, advancing the read-ahead cursor."""
        fd = tracked.fd
        if fd is None:
            return None
        start = tracked.read.offset
        data = os.pread(fd, self.read_chunk_bytes, start)
        if not data:
            return None
        records: list[RawRecord] = []
        too_long: list[SourceRef] = []
        cursor = dataclasses.replace(tracked.read)
        end = data.rfind(b"\n")
        if end < 0:
            # No newline in this chunk: either a half-written line (wait) or one too long to keep.
            skipped = self._skip_long_line(fd, start)
            if skipped is None:
                return None
            cursor.line += 1
            too_long.append(SourceRef("jsonl", cursor.path, cursor.line, start))
            consumed = skipped
        else:
            consumed = end + 1
            pos = 0
            while pos < consumed:
                nl = data.index(b"\n", pos)
                line = data[pos:nl]
                cursor.line += 1
                if len(line) > self.max_line_bytes:
                    too_long.append(SourceRef("jsonl", cursor.path, cursor.line, start + pos))
                else:
                    records.append(RawRecord(cursor.agent_id, line, SourceRef("jsonl", cursor.path, cursor.line,
                                                                               start + pos)))
                pos = nl + 1
        cursor.offset = start + consumed
        self._fingerprint(fd, cursor)
        tracked.read = cursor
        size = tracked.size
        with contextlib.suppress(OSError):
            size = os.fstat(fd).st_size
        return ReadUnit(tracked.key, tracked.generation, tuple(records), tuple(too_long), cursor,
                        at_eof=cursor.offset >= size)

    def _skip_long_line(self, fd: int, start: int) -> int | None:
        """Length up to and including the next newline if the line exceeds the limit, else None."""
        pos = start
        while True:
            block = os.pread(fd, self.read_chunk_bytes, pos)
            if not block:
                return None  # unterminated: wait for the writer (even if it is already long)
            nl = block.find(b"\n")
            if nl >= 0:
                length = pos + nl + 1 - start
                return length if length - 1 > self.max_line_bytes else None
            pos += len(block)
            if pos - start > self.max_line_bytes + self.read_chunk_bytes * 64:
                # A runaway line with no end in sight: keep scanning later, but do not hold memory.
                return None

    @staticmethod
    def _fingerprint(fd: int, cursor: FileCursor) -> None:
        if cursor.head_len < HEAD_BYTES:
            head = _pread_exact(fd, min(HEAD_BYTES, cursor.offset), 0)
            cursor.head_len, cursor.head_hash = len(head), _digest(head)
        start = max(0, cursor.offset - TAIL_BYTES)
        cursor.tail_hash = _digest(_pread_exact(fd, cursor.offset - start, start))

    def _unread_on_fd(self, tracked: TrackedFile) -> int:
        if tracked.fd is None:
            return 0
        try:
            return max(0, os.fstat(tracked.fd).st_size - tracked.read.offset)
        except OSError:
            return 0

    # -- bookkeeping ---------------------------------------------------------------------------

    def reset_read(self, key: str) -> None:
        """Forget the read-ahead (after a failed batch): the next read starts at the committed cursor."""
        tracked = self.files.get(key)
        if tracked is not None:
            tracked.generation += 1
            tracked.read = dataclasses.replace(tracked.committed)

    def mark_committed(self, unit: ReadUnit) -> FileCursor | None:
        """Record a stored unit; returns the cursor to persist, or None if the unit is stale."""
        tracked = self.files.get(unit.key)
        if tracked is None or tracked.generation != unit.generation:
            return None
        tracked.committed = dataclasses.replace(unit.cursor_after, path=tracked.read.path)
        return tracked.committed

    def _close(self, tracked: TrackedFile) -> None:
        if tracked.fd is not None:
            os.close(tracked.fd)
            tracked.fd = None

    def close(self) -> None:
        for tracked in self.files.values():
            self._close(tracked)
