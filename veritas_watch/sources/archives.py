"""Compressed transcript archives: `<id>.jsonl.(reset|deleted).<ts>[.<digest>].zst`.

OpenClaw 2026.9 writes one when a session is deleted (`openclaw sessions delete`, through a
`.jsonl-stage` then a `.stage` file renamed into place, so a finished name is a finished file), and newer versions may
compress reset archives the same way. Such a file holds the session's transcript as JSONL. It is
history like an uncompressed `.reset`/`.deleted` archive, and sometimes the only copy: a session
created and deleted while veritas-watch was not running exists nowhere else.

An archive never changes once named, so it is read whole, once: decompressed with a bound
(`MAX_DECOMPRESSED_BYTES`, a zstd bomb is refused with one log line) and handed on as the records
of one unit; its identity (device, inode, size, mtime) is committed after the store acknowledged
them. Its lines carry the session's own ids, so an archive of a session already read live (from
SQLite, or from the JSONL file before it was archived) is the same points, stored once.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
import zstandard

from veritas_watch.model import RawRecord, SourceRef
from veritas_watch.openclaw import AgentDirs
from veritas_watch.sources.cursors import CursorStore

log = structlog.get_logger()

MAX_COMPRESSED_BYTES = 256 * 1024 * 1024
MAX_DECOMPRESSED_BYTES = 1024 * 1024 * 1024  # OpenClaw caps a live transcript far below this
_ARCHIVE = re.compile(
    r"^(?P<stem>[^/]+)\.jsonl\.(?P<kind>reset|deleted)\."
    r"(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?Z)(?:\.[0-9a-f]{8,64})?\.zst$"
)


@dataclass(frozen=True, slots=True)
class CompressedName:
    session_stem: str
    kind: str  # reset | deleted


def classify_compressed(name: str) -> CompressedName | None:
    """A compressed transcript archive's name, or None (staging files and anything else)."""
    m = _ARCHIVE.match(name)
    return CompressedName(m["stem"], m["kind"]) if m else None


@dataclass(frozen=True, slots=True)
class ArchiveUnit:
    """One archive read whole: its records, and the identity to commit once they are stored."""

    agent_id: str
    path: str
    key: str  # "<dev>:<ino>:<size>:<mtime_ns>"
    kind: str
    records: tuple[RawRecord, ...]


class CompressedArchives:
    """Finds archives not read yet; `read` decompresses one; `commit` remembers it was stored.

    What was read is kept in the cursor store's `archive_cursors` (loaded at start-up); `sweep`, `read`
    and `commit` run in worker threads, `commit` concurrently with the others, hence the lock.
    """

    def __init__(self, checkpoints: CursorStore) -> None:
        self._checkpoints = checkpoints
        self._done = set(checkpoints.load_archives())
        self._failed: dict[str, str] = {}  # key -> reason: logged once, not retried until the file changes
        self._lock = threading.Lock()

    def sweep(self, agents: Iterable[AgentDirs]) -> list[tuple[AgentDirs, Path, str, str]]:
        """(agent, path, key, kind) of every archive not read yet. Read archives that are gone from disk
        (OpenClaw's retention removed them) are forgotten, so the set stays bounded."""
        found = []
        seen: set[str] = set()
        for agent in agents:
            try:
                entries = list(os.scandir(agent.sessions))
            except OSError:
                continue  # no sessions dir (SQLite era) or unreadable: the JSONL tailer reports that
            for entry in entries:
                name = classify_compressed(entry.name)
                if name is None:
                    continue
                try:
                    if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
                seen.add(key)
                with self._lock:
                    if key in self._done or key in self._failed:
                        continue
                found.append((agent, Path(entry.path), key, name.kind))
        with self._lock:
            gone = sorted(self._done - seen)
            self._done -= set(gone)
            self._failed = {k: v for k, v in self._failed.items() if k in seen}
        if gone:
            self._checkpoints.commit_archives([], gone)
        return found

    def read(self, agent: AgentDirs, path: Path, key: str, kind: str) -> ArchiveUnit | None:
        """The archive's lines as records, or None (logged once) if it cannot be read."""
        try:
            data = _decompress(path)
        except (OSError, zstandard.ZstdError, ValueError) as exc:
            with self._lock:
                self._failed[key] = type(exc).__name__
            log.warning("archive_unreadable", agent=agent.agent_id, file=str(path),
                        error=f"{type(exc).__name__}: {exc}"[:300])
            return None
        records = []
        offset = 0
        for number, line in enumerate(data.split(b"\n"), start=1):
            if line.strip():
                records.append(RawRecord(agent.agent_id, line, SourceRef("jsonl", str(path), line=number,
                                                                         offset=offset)))
            offset += len(line) + 1
        return ArchiveUnit(agent.agent_id, str(path), key, kind, tuple(records))

    def commit(self, units: Sequence[ArchiveUnit]) -> None:
        """The store has every point of `units`: remembered as read, durably (Work.source)."""
        keys = [unit.key for unit in units]
        self._checkpoints.commit_archives(keys)
        with self._lock:
            self._done.update(keys)


def _decompress(path: Path) -> bytes:
    size = path.stat().st_size
    if size > MAX_COMPRESSED_BYTES:
        raise ValueError(f"{size} bytes compressed, over the {MAX_COMPRESSED_BYTES} limit")
    out = bytearray()
    with open(path, "rb") as handle, zstandard.ZstdDecompressor().stream_reader(
            handle, read_across_frames=True) as reader:
        while chunk := reader.read(1 << 20):
            out += chunk
            if len(out) > MAX_DECOMPRESSED_BYTES:  # a zstd bomb: refused, never held whole
                raise ValueError(f"decompresses past the {MAX_DECOMPRESSED_BYTES} byte limit")
    return bytes(out)
