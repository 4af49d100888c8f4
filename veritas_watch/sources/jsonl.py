"""The JSONL transcript source: file identity, read-ahead, truncation/rewrite detection.

Everything here is synchronous and runs in worker threads; the daemon decides when to call it.
`sweep` and `read` run one at a time (the sweep task awaits each); `mark_committed` runs in the
sink's commit thread concurrently with them, so the few fields both touch are guarded by a lock.

Identity: a file is its (device, inode) plus a fingerprint of its first bytes (so a reused inode
with other content is a new file). A hash of the last line before the saved offset tells an
append from a rewrite. Any doubt means "re-read from 0", which is safe: point ids are
deterministic and the sink skips points already stored with the same text.

Reads stop at the last complete newline: a half-written line waits for its end. A line longer
than the limit is skipped (reported in `ReadUnit.too_long`) once its end is known.

A file that left the listing (deleted, or renamed out of the tree / to a name that is not a
transcript) is drained through the handle still open on it before it is dropped. A deleted file
(no links left) is dropped once drained; a renamed-away one only after a second sweep also
misses it, so a rename racing one sweep's directory listing never costs a re-read.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import stat
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from veritas_watch.model import ConversationEnd, RawRecord, SourceRef
from veritas_watch.openclaw import AgentDirs, TranscriptKind, classify_transcript, session_stem
from veritas_watch.problems import ProblemLog, check_sessions_dir, check_transcript
from veritas_watch.sources.cursors import TAIL_BYTES, CursorStore, FileCursor

log = structlog.get_logger()

HEAD_BYTES = 1024  # fingerprint length once the file is that long (growing fingerprint before)
TAIL_MAX_BYTES = 64 * 1024  # the tail check covers the whole last line, up to this much
# An unchanged stat still gets a full content check this often. The stat signature holds ctime, which no write
# leaves as it was: a content change under an unchanged signature is a filesystem whose stat lags (NFS attribute
# caching, 60 s at most by default), so this is a backstop. Each check opens the file: at 30 s, a thousand idle
# transcripts cost an idle daemon 0.3 % of a core (issue 38).
VERIFY_EVERY_S = 300.0
SCAN_BUDGET_CHUNKS = 64  # chunks scanned per read looking for the end of an over-long line
MISSING_SWEEPS_TO_DROP = 2  # a renamed-away file is dropped after this many sweeps without it
DEFAULT_MAX_OPEN_FILES = 400  # idle, fully read files beyond this many have their handle closed


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


StatSignature = tuple[int, int, int]  # size, mtime_ns, ctime_ns


def _signature(st: os.stat_result) -> StatSignature:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclass
class TrackedFile:
    """One transcript file being followed. `read` runs ahead of `committed` by the units in flight."""

    committed: FileCursor
    read: FileCursor
    kind: TranscriptKind
    generation: int = 0  # changed on every re-read from 0, so stale units do not commit
    fd: int | None = None
    size: int = 0
    gone: bool = False  # deleted or moved out of the watched tree: drain, then drop
    missing_sweeps: int = 0  # consecutive sweeps that did not list it
    partial_size: int = -1  # the size at which only an unfinished line was left after `read`
    checked_sig: StatSignature | None = None  # stat signature of the last passed content check
    checked_at: float = 0.0  # monotonic time of that check
    changed_at: float = 0.0  # monotonic time the file last grew or changed (handle closing order)
    scan_start: int = -1  # start of an over-long line whose end is being looked for ...
    scan_pos: int = 0  # ... and how far it is known to have no newline

    @property
    def key(self) -> str:
        return self.committed.key

    @property
    def backlog(self) -> int:
        """Bytes not yet stored, not counting an unfinished last line (it cannot be read yet)."""
        if self.read.offset == self.committed.offset and self.size == self.partial_size:
            return 0
        return max(0, self.size - self.committed.offset)

    @property
    def held_back(self) -> int:
        """Bytes of an unfinished last line waiting for its newline."""
        return max(0, self.size - self.read.offset) if self.size == self.partial_size else 0


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
    dropped: list[str] = field(default_factory=list)  # cursor keys to delete from the cursor store


class JsonlTailer:
    def __init__(self, state_dir: Path, cursors: dict[str, FileCursor], *,
                 max_line_bytes: int, read_chunk_bytes: int,
                 max_open_files: int = DEFAULT_MAX_OPEN_FILES, problems: ProblemLog | None = None,
                 checkpoints: CursorStore | None = None) -> None:
        self.state_dir = state_dir
        self._checkpoints = checkpoints  # where `commit` persists cursors (None: in memory only, tests)
        self.files: dict[str, TrackedFile] = {}
        self._saved = cursors  # cursors from the last run, adopted when their inode shows up
        self.max_line_bytes = max_line_bytes
        self.read_chunk_bytes = max(read_chunk_bytes, 4096)
        self.max_open_files = max(1, max_open_files)
        self._generations = itertools.count(1)  # one sequence for all files: a re-adopted key never collides
        self._lock = threading.Lock()
        self.problems = problems if problems is not None else ProblemLog(state_dir)
        self._unlisted: set[str] = set()  # sessions dirs the current sweep could not list

    # -- discovery and identity ------------------------------------------------------------------

    def sweep(self, agents: Iterable[AgentDirs]) -> SweepResult:
        """Stat every transcript; the source of truth, whatever inotify said or missed."""
        result = SweepResult()
        seen: set[str] = set()
        others: set[str] = set()  # files listed that are another agent's in the same directory: not orphans
        listed_dirs: set[str] = set()
        root = self._state_root()
        now = time.monotonic()
        self._unlisted = set()
        for agent in agents:
            listing = self._list(agent.sessions, root, agent.agent_id, agent.sessions_of)
            if listing is None:
                continue
            if agent.sessions_of is None:  # a shared directory is only partly listed: its other cursors are not stale
                listed_dirs.add(str(agent.sessions))
            for path, kind, st in listing:
                key = f"{st.st_dev}:{st.st_ino}"
                if key in seen:
                    continue  # a hard link or an inside symlink to a transcript listed already
                if self._another_agents_here(key, path, agent.agent_id):
                    others.add(key)
                    continue
                seen.add(key)
                try:
                    self._sweep_file(key, path, agent.agent_id, kind, st, now, result)
                except OSError as exc:  # an I/O error on one file: that file waits, the others go on
                    self.problems.report(path, "transcript_unreadable", f"{type(exc).__name__}: {exc.strerror or exc}",
                                         agent.agent_id)
        self._missing(seen, result)
        self._forget_orphans(listed_dirs, others, result)
        self._close_idle()
        return result

    def _sweep_file(self, key: str, path: Path, agent_id: str, kind: TranscriptKind, st: os.stat_result,
                    now: float, result: SweepResult) -> None:
        tracked = self.files.get(key)
        if tracked is not None and tracked.committed.agent_id != agent_id:
            # Moved to another agent's sessions: its entries belong to that agent now.
            log.info("transcript_moved_agent", old_agent=tracked.committed.agent_id,
                     agent=agent_id, path=str(path))
            self._drop(key, tracked)
            result.dropped.append(key)
            tracked = None
        if tracked is None:
            tracked = self._adopt(key, path, agent_id, kind, st)
            if tracked is None:
                return
            result.new_files += 1
        else:
            if tracked.gone:
                log.info("transcript_back", path=str(path))
            tracked.gone = False
            tracked.missing_sweeps = 0
            if tracked.read.path != str(path):
                log.info("transcript_renamed", agent=agent_id, old=tracked.read.path, new=str(path),
                         kind=kind)
                with self._lock:
                    tracked.read.path = str(path)
                    tracked.committed.path = str(path)
                tracked.kind = kind
        sig = _signature(st)
        if sig != tracked.checked_sig or now - tracked.checked_at >= VERIFY_EVERY_S:
            if tracked.fd is None and not self._reopen(tracked, path):
                return
            if self._check(tracked, st.st_size):
                result.rewritten += 1
            tracked.checked_sig, tracked.checked_at = sig, now
        if st.st_size != tracked.size:
            tracked.changed_at = now
        tracked.size = st.st_size
        if tracked.size > tracked.read.offset and tracked.size != tracked.partial_size:
            if tracked.fd is None and not self._reopen(tracked, path):
                return
            result.changed.append(tracked)

    def _another_agents_here(self, key: str, path: Path, agent_id: str) -> bool:
        """Whether the file is another agent's in this same directory (tracked, or its cursor saved, so): a directory
        several agents share (a JSONL-era `session.store`) is listed once per agent, and a transcript no key names
        any more (archived in place, its key moved on) stays whose it was. Moved from another directory, it is the
        new one's (`_sweep_file`)."""
        tracked = self.files.get(key)
        cursor = tracked.committed if tracked is not None else self._saved.get(key)
        return cursor is not None and cursor.agent_id != agent_id and Path(cursor.path).parent == path.parent

    def _missing(self, seen: set[str], result: SweepResult) -> None:
        """Files tracked but not listed: drain what their handle still holds, then drop them."""
        for key, tracked in list(self.files.items()):
            if key in seen or str(Path(tracked.read.path).parent) in self._unlisted:
                continue
            tracked.missing_sweeps += 1
            links = -1  # unknown without a handle (an idle file whose handle was closed)
            if tracked.fd is not None:
                with contextlib.suppress(OSError):
                    st = os.fstat(tracked.fd)
                    links = st.st_nlink
                    tracked.size = st.st_size
            if not tracked.gone:
                tracked.gone = True
                log.info("transcript_gone", path=tracked.read.path, deleted=links == 0,
                         unread=max(0, tracked.size - tracked.read.offset))
            if tracked.fd is not None and tracked.size > tracked.read.offset and tracked.size != tracked.partial_size:
                result.changed.append(tracked)  # drain through the open handle first
                continue
            if tracked.read.offset != tracked.committed.offset:
                continue  # units still in flight: drop once they are committed
            if links == 0 or tracked.missing_sweeps >= MISSING_SWEEPS_TO_DROP:
                if tracked.held_back:
                    log.warning("transcript_dropped_unfinished_line", path=tracked.read.path,
                                bytes=tracked.held_back)
                self._drop(key, tracked)
                result.dropped.append(key)

    def _forget_orphans(self, listed_dirs: set[str], others: set[str], result: SweepResult) -> None:
        """Saved cursors of files no longer in a directory we listed: stale, delete them (not those of files listed
        as another agent's, `others`: there, and still whose they were)."""
        for key, cursor in list(self._saved.items()):
            if key not in others and str(Path(cursor.path).parent) in listed_dirs:
                del self._saved[key]
                result.dropped.append(key)
                log.info("cursor_orphaned", path=cursor.path, offset=cursor.offset)

    def _state_root(self) -> Path:
        try:
            return self.state_dir.resolve()
        except OSError:
            return self.state_dir

    def _list(self, sessions: Path, root: Path, agent_id: str,
              sessions_of: frozenset[str] | None = None) -> list[tuple[Path, TranscriptKind, os.stat_result]] | None:
        """The transcripts in one sessions dir (only those of `sessions_of` when given), or None if it cannot (or
        must not) be listed.

        Whatever cannot be followed (a loop, an unreadable dir, a symlink out of the state dir, a FIFO
        or socket named like a transcript) is skipped and told to `problems`: one bad path never
        stops the others."""
        real_root = str(root)
        try:
            is_link = stat.S_ISLNK(os.lstat(sessions).st_mode)  # EACCES here: the agent dir is unreadable
            if is_link and not self._inside(sessions, root):
                check_sessions_dir(sessions, real_root, self.problems, agent_id)
                return None
            entries = list(os.scandir(sessions))
        except FileNotFoundError:
            return None
        except OSError:
            check_sessions_dir(sessions, real_root, self.problems, agent_id)
            self._unlisted.add(str(sessions))  # its files are not gone, only out of sight: keep them
            return None
        listing = []
        for entry in entries:
            name = classify_transcript(entry.name)
            if name is None or (sessions_of is not None and name.session_stem not in sessions_of):
                continue
            path = Path(entry.path)
            try:
                if entry.is_symlink() and not self._inside(path, root):
                    check_transcript(path, real_root, self.problems, agent_id)
                    continue
                st = os.stat(path)
            except OSError:
                check_transcript(path, real_root, self.problems, agent_id)
                continue  # vanished between listing and stat (a rename): the next sweep finds it
            if stat.S_ISREG(st.st_mode):
                listing.append((path, name.kind, st))
            else:
                check_transcript(path, real_root, self.problems, agent_id)  # a FIFO, a socket, a dir: never opened
        return listing

    @staticmethod
    def _inside(path: Path, root: Path) -> bool:
        try:
            return path.resolve().is_relative_to(root)
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
            return False

    def _adopt(self, key: str, path: Path, agent_id: str, kind: TranscriptKind,
               st: os.stat_result) -> TrackedFile | None:
        saved = self._saved.get(key)
        cursor = (saved.copy(path=str(path)) if saved is not None and saved.agent_id == agent_id
                  else FileCursor(key, str(path), agent_id))
        tracked = TrackedFile(cursor, cursor.copy(), kind, generation=next(self._generations),
                              size=st.st_size, changed_at=time.monotonic())
        if not self._reopen(tracked, path):
            return None
        self._saved.pop(key, None)
        self.files[key] = tracked
        return tracked

    def _reopen(self, tracked: TrackedFile, path: Path) -> bool:
        """Open the file's handle, making sure the path still names the same inode."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO swapped in never blocks us
        except OSError as exc:
            self.problems.report(path, "transcript_unreadable", f"{type(exc).__name__}: {exc.strerror or exc}",
                                 tracked.committed.agent_id)
            return False
        st = os.fstat(fd)
        if f"{st.st_dev}:{st.st_ino}" != tracked.key:
            os.close(fd)  # replaced since the listing: the next sweep sees the new inode
            return False
        tracked.fd = fd
        return True

    def _check(self, tracked: TrackedFile, size: int) -> bool:
        """Re-read from 0 when the file shrank, or the bytes we already read changed."""
        cursor = tracked.read
        if cursor.offset == 0 or tracked.fd is None:
            return False
        reason = self._changed(tracked.fd, cursor, size)
        if reason is None:
            return False
        self._restart(tracked, reason, size)
        return True

    @staticmethod
    def _changed(fd: int, cursor: FileCursor, size: int) -> str | None:
        if size < cursor.offset:
            return "truncated"
        if cursor.head_len and _digest(_pread_exact(fd, cursor.head_len, 0)) != cursor.head_hash:
            return "head_changed"
        start = max(0, cursor.offset - cursor.tail_len)
        if _digest(_pread_exact(fd, cursor.offset - start, start)) != cursor.tail_hash:
            return "content_changed"
        return None

    def _restart(self, tracked: TrackedFile, reason: str, size: int) -> None:
        cursor = tracked.read
        log.info("transcript_reread", path=cursor.path, reason=reason, old_offset=cursor.offset, size=size)
        with self._lock:
            tracked.generation = next(self._generations)
            tracked.read = FileCursor(cursor.key, cursor.path, cursor.agent_id)
            # Nothing of the new content is stored yet, whatever was committed for the old one: if
            # the new content has no complete line, no unit will ever come to move `committed`.
            tracked.committed = tracked.read.copy()
            tracked.partial_size = -1
            tracked.scan_start = -1

    # -- reading -------------------------------------------------------------------------------

    def read(self, tracked: TrackedFile, max_bytes: int | None = None) -> ReadUnit | None:
        """The next complete lines after `tracked.read` (up to `max_bytes`, at most `read_chunk_bytes`, at least
        one line), advancing the read-ahead cursor."""
        fd = tracked.fd
        if fd is None:
            return None
        start = tracked.read.offset
        size = self.read_chunk_bytes if max_bytes is None else max(4096, min(max_bytes, self.read_chunk_bytes))
        data = os.pread(fd, size, start)
        if not data:
            return None
        if start > 0 and (reason := self._changed(fd, tracked.read, start)) is not None:
            # Rewritten between the sweep's check and this read: these bytes do not follow ours.
            self._restart(tracked, reason, start + len(data))
            return self.read(tracked, max_bytes)
        too_long: list[SourceRef] = []
        cursor = tracked.read.copy()
        end = data.rfind(b"\n")
        if end < 0:
            # No newline in this chunk: a line longer than a chunk, or an unfinished one.
            line_end = self._find_line_end(tracked, start, len(data))
            if line_end is None:
                return None
            if line_end - start > self.max_line_bytes:
                cursor.line += 1
                too_long.append(SourceRef("jsonl", cursor.path, cursor.line, start))
                return self._unit(tracked, cursor, [], too_long, line_end + 1)
            data = _pread_exact(fd, line_end + 1 - start, start)
            end = len(data) - 1
            if not data.endswith(b"\n"):
                return None  # shrank under us: the next sweep's check sorts it out
        records: list[RawRecord] = []
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
        return self._unit(tracked, cursor, records, too_long, start + consumed)

    def _unit(self, tracked: TrackedFile, cursor: FileCursor, records: list[RawRecord],
              too_long: list[SourceRef], offset: int) -> ReadUnit:
        fd = tracked.fd
        assert fd is not None
        cursor.offset = offset
        self._fingerprint(fd, cursor)
        tracked.read = cursor
        tracked.scan_start = -1
        size = tracked.size
        with contextlib.suppress(OSError):
            size = os.fstat(fd).st_size
        return ReadUnit(tracked.key, tracked.generation, tuple(records), tuple(too_long), cursor,
                        at_eof=cursor.offset >= size)

    def _find_line_end(self, tracked: TrackedFile, start: int, known_clean: int) -> int | None:
        """Offset of the newline ending the line at `start`, or None if it has none yet.

        The search resumes where the last one stopped, and scans a bounded amount per call, so
        a runaway line neither holds memory nor stalls the thread (it just takes a few sweeps).
        """
        pos = tracked.scan_pos if tracked.scan_start == start else start + known_clean
        tracked.scan_start = start
        assert tracked.fd is not None
        for _ in range(SCAN_BUDGET_CHUNKS):
            block = os.pread(tracked.fd, self.read_chunk_bytes, pos)
            if not block:
                tracked.scan_pos = pos
                tracked.partial_size = pos  # everything up to EOF scanned: wait for the writer
                return None
            nl = block.find(b"\n")
            if nl >= 0:
                tracked.scan_start = -1
                return pos + nl
            pos += len(block)
        tracked.scan_pos = pos
        return None

    @staticmethod
    def _fingerprint(fd: int, cursor: FileCursor) -> None:
        if cursor.head_len < HEAD_BYTES:
            head = _pread_exact(fd, min(HEAD_BYTES, cursor.offset), 0)
            cursor.head_len, cursor.head_hash = len(head), _digest(head)
        # The tail check covers the whole last line: 32 bytes alone are often the same JSON suffix.
        window = min(cursor.offset, TAIL_MAX_BYTES)
        tail = _pread_exact(fd, window, cursor.offset - window)
        cut = tail.rfind(b"\n", 0, max(0, len(tail) - TAIL_BYTES))
        if cut >= 0:
            tail = tail[cut + 1:]
        cursor.tail_len, cursor.tail_hash = len(tail), _digest(tail)

    # -- bookkeeping ---------------------------------------------------------------------------

    def reset_read(self, key: str) -> None:
        """Forget the read-ahead (after a failed batch): the next read starts at the committed cursor."""
        tracked = self.files.get(key)
        if tracked is not None:
            with self._lock:
                tracked.generation = next(self._generations)
                tracked.read = tracked.committed.copy()
                tracked.partial_size = -1

    def ended_sessions(self) -> tuple[list[tuple[str, ConversationEnd]], list[FileCursor]]:
        """Archives (`.reset.<ts>` / `.deleted.<ts>`) read to their end with nothing in flight and not handed
        on yet: their session ended. Returns the ends (agent, end) and the cursors now marked ended, which the
        caller commits before handing the ends on (so each end is handed on once, across restarts too)."""
        ends: list[tuple[str, ConversationEnd]] = []
        marked: list[FileCursor] = []
        for tracked in list(self.files.values()):
            done = tracked.committed
            if (tracked.kind in ("reset", "deleted") and not done.ended and done.offset >= tracked.size
                    and tracked.read.offset == done.offset):
                done.ended = tracked.read.ended = True
                marked.append(done)
                name = classify_transcript(Path(done.path).name)
                facts = done.session
                end = ConversationEnd(facts.session_id or session_stem(done.path), facts.last_entry_ts,
                                      facts.session_kind, name.kind if name else "archived", done.path)
                ends.append((done.agent_id, end))
        return ends, marked

    def commit(self, units: Sequence[ReadUnit]) -> None:
        """The store has every point of `units`: their cursors move, in one transaction (Work.source)."""
        cursors = [cursor for unit in units if (cursor := self.mark_committed(unit)) is not None]
        if cursors and self._checkpoints is not None:
            self._checkpoints.commit_files(cursors)

    def mark_committed(self, unit: ReadUnit) -> FileCursor | None:
        """Record a stored unit; returns the cursor to persist, or None if the unit is stale."""
        with self._lock:
            tracked = self.files.get(unit.key)
            if tracked is None or tracked.generation != unit.generation:
                return None
            tracked.committed = unit.cursor_after.copy(path=tracked.read.path)
            return tracked.committed

    def _drop(self, key: str, tracked: TrackedFile) -> None:
        with self._lock:
            self._close(tracked)
            if self.files.get(key) is tracked:
                del self.files[key]

    def _close_idle(self) -> None:
        """Keep open handles under the budget: close the longest-idle files that are fully read.

        A closed file is reopened (and its identity re-checked) when its stat changes; only a file
        that is deleted while unread needs its handle, and idle files have nothing unread.
        """
        open_files = [t for t in self.files.values() if t.fd is not None]
        excess = len(open_files) - self.max_open_files
        if excess <= 0:
            return
        idle = sorted((t for t in open_files if not t.gone and t.read.offset == t.committed.offset
                       and t.size - t.read.offset == t.held_back), key=lambda t: t.changed_at)
        for tracked in idle[:excess]:
            self._close(tracked)

    @staticmethod
    def _close(tracked: TrackedFile) -> None:
        if tracked.fd is not None:
            os.close(tracked.fd)
            tracked.fd = None

    def close(self) -> None:
        for tracked in self.files.values():
            self._close(tracked)
