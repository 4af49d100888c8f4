"""Where credentials went: CREDENTIALS_INDEX.md, the optional age vault, and `creds find`.

- `workspace_for` resolves an agent's workspace the way OpenClaw does (the index lives there).
- `CredentialIndex.add` adds one table row per new credential to `<workspace>/CREDENTIALS_INDEX.md`
  (deduplicated by fingerprint, and by where it was given so that several data dirs, whose
  fingerprint keys differ, still write one row): atomic rewrite, mode 0600, every other line kept
  as the human left it. The index never holds a value, only where the value can be recovered. It
  never creates the workspace; `IndexStateStore` keeps rows waiting for one in the data dir.
- `TaskRunValues` finds the value behind an OpenClaw mask in OpenClaw's own `task_runs` table
  (read-only), for the vault only.
- `Vault` appends each value encrypted to an age recipient. The daemon can write it but holds no
  identity, so it can never read a value back.
- `find_credential` is the protocol's lookup, in order: the index, `.env` files under project
  dirs, `systemctl cat` Environment= lines, /etc/environment, the process environment. Values
  are masked (length and keyed fingerprint only) unless the caller asks to reveal them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import structlog

from veritas_watch.model import SecretFinding, SourceRef
from veritas_watch.openclaw import session_stem, workspace_for
from veritas_watch.safepath import inside, make_dirs
from veritas_watch.transforms.redact import (
    fingerprint,
    is_masked_rule,
    is_opaque_mask,
    is_secret_name,
    recover_unmasked,
    rule_key_name,
    split_mask,
    written_before,
)

__all__ = [
    "HEADER",
    "INDEX_FILE",
    "OPENCLAW_STATE_DB",
    "STATE_FILE",
    "CredentialIndex",
    "CredentialLocation",
    "IndexEntry",
    "IndexRow",
    "IndexState",
    "IndexStateStore",
    "IndexUpdate",
    "MaskProbe",
    "PendingRow",
    "Recovery",
    "TaskRunValues",
    "Vault",
    "VaultError",
    "WorkspaceMissing",
    "find_credential",
    "given_at",
    "given_at_of",
    "mask",
    "pending_counts",
    "read_index",
    "workspace_for",
]

log = structlog.get_logger()

INDEX_FILE = "CREDENTIALS_INDEX.md"
HEADER: tuple[str, ...] = ("Service", "Key Name", "Location", "Status", "First Seen", "Fingerprint")
_INDEX_INTRO = (
    "# Credentials Index\n\n"
    "Where each credential lives, one row per credential. veritas-watch adds a row when a new one\n"
    "appears in a conversation (matched by fingerprint, a keyed hash, and by where it was given:\n"
    "the value itself is never written here). Status `masked`: OpenClaw had already masked it in\n"
    "the transcript, so the transcript holds only the mask; the Location says where the value is,\n"
    "if anywhere. Edit freely: rows and text you change are kept as you left them.\n\n"
)


# ---------------------------------------------------------------------------------------------
# Workspace resolution




# ---------------------------------------------------------------------------------------------
# Files: atomic replace and cross-process locking


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    """Write to a temp file beside `path`, fsync, rename over it, fsync the directory. Bytes are written as they
    are (a file read with bytes that are not UTF-8 is written back with them)."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data if isinstance(data, bytes) else data.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _locked_dir(directory: Path) -> Iterator[None]:
    """Exclusive lock on a directory: a thread lock in this process, flock(2) across processes.

    The directory itself is locked, not a lock file, so nothing extra appears in the workspace.
    """
    key = str(directory.resolve())
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(key, threading.Lock())
    with thread_lock:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


_T = TypeVar("_T")


class IndexKeptChanging(RuntimeError):
    """The index changed between every read and rename tried: someone keeps saving it."""


def _rewrite_unless_edited(directory: Path, path: Path, change: Callable[[str], tuple[str, _T]]) -> _T:
    """Rewrite `path` as `change(text)` makes it, under the lock on `directory`. A human editor does not take
    our lock: if the file changes between our read and our rename, it is read again rather than their edit
    overwritten. Bytes that are not UTF-8 (a human's Latin-1 note) go through as they were. `change` returns
    the new text and what the caller wants back; the same text: nothing is written."""
    with _locked_dir(directory):
        for _attempt in range(10):
            before = _stat_key(path)
            text = path.read_bytes().decode("utf-8", "surrogateescape") if before is not None else ""
            new_text, result = change(text)
            if new_text == text:
                return result
            if _stat_key(path) != before:
                continue
            _atomic_write(path, new_text.encode("utf-8", "surrogateescape"))
            return result
        raise IndexKeptChanging(f"{path} kept changing while being updated")


# ---------------------------------------------------------------------------------------------
# The index table


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One row of CREDENTIALS_INDEX.md, as text (a human may have written any of it)."""

    service: str
    key_name: str
    location: str
    status: str
    first_seen: str
    fingerprint: str


def _split_row(line: str) -> list[str]:
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", body)]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") or "-"


def _is_separator(line: str) -> bool:
    cells = _split_row(line)
    return bool(cells) and all(re.fullmatch(r":?-{1,}:?", c) for c in cells if c) and any(cells)


_FP_RE = re.compile(r"\b[0-9a-f]{8}\b")


@dataclass(slots=True)
class _Table:
    """Where the index table sits in the file, and what its columns are."""

    lines: list[str]
    header_at: int  # line index of the header row, -1 when the file has no table
    end: int  # one past the last row of the table
    columns: list[str]

    def column(self, name: str) -> int | None:
        lowered = [c.lower() for c in self.columns]
        return lowered.index(name.lower()) if name.lower() in lowered else None


def _find_table(text: str) -> _Table:
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        cells = [c.lower() for c in _split_row(line)] if line.lstrip().startswith("|") else []
        if "service" in cells and "key name" in cells and i + 1 < len(lines) and _is_separator(lines[i + 1]):
            end = i + 2
            while end < len(lines) and lines[end].lstrip().startswith("|"):
                end += 1
            return _Table(lines, i, end, _split_row(line))
    return _Table(lines, -1, len(lines), list(HEADER))


def _rows_of(table: _Table) -> list[IndexRow]:
    if table.header_at < 0:
        return []
    index = {name: table.column(name) for name in HEADER}
    rows = []
    for line in table.lines[table.header_at + 2 : table.end]:
        cells = _split_row(line)

        def get(name: str, cells: list[str] = cells) -> str:
            at = index[name]
            return cells[at] if at is not None and at < len(cells) else ""

        rows.append(IndexRow(*(get(name) for name in HEADER)))
    return rows


def _fingerprints_of(table: _Table) -> set[str]:
    found: set[str] = set()
    for row in _rows_of(table):
        found.update(_FP_RE.findall(row.fingerprint.strip("`")))
    return found


def read_index(path: Path) -> list[IndexRow]:
    """The rows of an index file; [] when it does not exist or holds no table. A byte that is not UTF-8 (a
    human's Latin-1 note) reads as U+FFFD: the rows are read all the same."""
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        return []
    return _rows_of(_find_table(text))


class WorkspaceMissing(FileNotFoundError):
    """The agent's workspace does not exist (yet): the index is never what creates it."""


# Where a credential was given, independent of the data dir that saw it: the session and the line
# (JSONL) or seq (SQLite). A transcript renamed by a reset (`<id>.jsonl.reset.<ts>`) keeps its key.
_GIVEN_AT_SQLITE_RE = re.compile(r"#(?P<session>[^\s#;()|]+):(?P<seq>-?\d+)(?=$|[\s;(),])")
_GIVEN_AT_JSONL_RE = re.compile(r"^\s*`?(?P<path>.*\.jsonl[^\s;(]*?):(?P<line>\d+)`?(?=$|[\s;(),])")


def given_at(location: str) -> str | None:
    """`jsonl:<session>:<line>` or `sqlite:<session>:<seq>` from an index Location; None for anything else."""
    if m := _GIVEN_AT_SQLITE_RE.search(location):
        return f"sqlite:{m.group('session')}:{m.group('seq')}"
    if m := _GIVEN_AT_JSONL_RE.match(location):
        return f"jsonl:{session_stem(m.group('path'))}:{m.group('line')}"
    return None


def given_at_of(ref: SourceRef) -> str | None:
    """The same key straight from a transcript position (what `given_at(ref.render())` parses)."""
    if ref.kind == "jsonl" and ref.line is not None:
        return f"jsonl:{session_stem(ref.path)}:{ref.line}"
    if ref.kind == "sqlite" and ref.session_id is not None and ref.seq is not None:
        return f"sqlite:{ref.session_id}:{ref.seq}"
    return None


def _norm_key(key_name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", key_name.lower())


def _at_identity(at: str, key_name: str) -> str:
    return f"at:{at}|{_norm_key(key_name)}"


def _moment_identity(at: str, seen_at: str, key_name: str) -> str:
    session = at.split(":", 2)[1] if at.count(":") >= 2 else at
    return f"moment:{session}@{seen_at.strip()}|{_norm_key(key_name)}"


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One credential to index: what was found, where it was given, and where its value is now.

    `note` qualifies the location ("transcript holds only a mask"); `extra_fingerprints` are other
    keyed hashes of the same credential (the value behind a mask, once recovered). For an opaque
    mask (`***`) the fingerprint says nothing about the value, so `fingerprint_identifies` is False
    and only where and when it was given identify it. `occurrence` numbers the distinct credentials
    with the same key name given at one place (1 for the first): see `number_occurrences`.
    """

    finding: SecretFinding
    location: str
    seen_at: str
    vault_ref: str | None = None
    status: str | None = None
    note: str | None = None
    extra_fingerprints: tuple[str, ...] = ()
    fingerprint_identifies: bool = True
    occurrence: int = 1
    given_at: str | None = None  # default: parsed from `location`
    moment_occurrence: int = 1  # opaque masks: among those with this key name in one message (time)

    def where(self) -> str:
        where = f"{self.location} ({self.note})" if self.note else self.location
        return f"{where}; {self.vault_ref}" if self.vault_ref else where

    def place(self) -> str | None:
        return self.given_at or given_at(self.location)

    def identities(self) -> list[tuple[str, int]]:
        """(identity, occurrence): the index has this credential once it has `occurrence` rows with
        that identity. Where it was given (session and line) and the key name; for an opaque mask
        also the session, the message's own time and the key name, which stays the same when a
        group chat quotes the message again in a later line."""
        at = self.place()
        if at is None:
            return []
        found = [(_at_identity(at, self.finding.key_name), self.occurrence)]
        if not self.fingerprint_identifies and self.seen_at.strip():
            found.append((_moment_identity(at, self.seen_at, self.finding.key_name), self.moment_occurrence))
        return found

    def fingerprints(self) -> tuple[str, ...]:
        own = (self.finding.fingerprint,) if self.fingerprint_identifies else ()
        return own + tuple(fp for fp in self.extra_fingerprints if fp not in own)


def number_occurrences(entries: Sequence[IndexEntry]) -> list[IndexEntry]:
    """Number the entries of one batch: the k-th distinct credential with a key name at one place
    gets occurrence k (a repeat of the same value keeps its number; each opaque mask counts)."""
    by_place: dict[tuple[str, str], list[str]] = {}
    by_moment: Counter[tuple[str, str, str]] = Counter()
    out: list[IndexEntry] = []
    for n, entry in enumerate(entries):
        place = (entry.place() or entry.location, _norm_key(entry.finding.key_name))
        seen = by_place.setdefault(place, [])
        token = entry.finding.fingerprint if entry.fingerprint_identifies else f"#{n}"
        if token not in seen:
            seen.append(token)
        moment = (place[0], entry.seen_at, place[1])
        by_moment[moment] += 1
        out.append(dataclasses.replace(entry, occurrence=seen.index(token) + 1, moment_occurrence=by_moment[moment]))
    return out


@dataclass(frozen=True, slots=True)
class IndexUpdate:
    """What `CredentialIndex.add` did: rows added, and the entries it skipped because a row given at
    the same place already exists (fingerprint -> that row's identity), so a caller can remember
    its own fingerprint as an alias of that row."""

    added: int
    matched: dict[str, str] = field(default_factory=dict)


def _row_identities(row: IndexRow) -> list[str]:
    at = given_at(row.location)
    if at is None:
        return []
    return [_at_identity(at, row.key_name), _moment_identity(at, row.first_seen, row.key_name)]


class CredentialIndex:
    """Maintains `<workspace>/CREDENTIALS_INDEX.md`. Safe across threads and processes.

    One row per credential, whoever writes it: a finding is skipped when a row already has its
    fingerprint (the same value again, same fingerprint key), or a row was given at the same place
    with the same key name (the same message read by another data dir, whose fingerprint key
    differs), or its fingerprint is an alias the caller learnt for such a row. The workspace is
    never created here: a missing one raises `WorkspaceMissing`.
    """

    def __init__(self, *, status: str = "captured", file_name: str = INDEX_FILE) -> None:
        self.status = status
        self.file_name = file_name

    def path_for(self, workspace: Path) -> Path:
        return workspace / self.file_name

    def record(
        self,
        workspace: Path,
        findings: Sequence[SecretFinding],
        location: str,
        seen_at: str,
        vault_ref: str | None,
    ) -> int:
        """Add a row for each finding the index lacks; returns rows added."""
        entries = number_occurrences([IndexEntry(f, location, seen_at, vault_ref) for f in findings])
        return self.add(workspace, entries).added

    def add(
        self,
        workspace: Path,
        entries: Sequence[IndexEntry],
        *,
        aliases: Mapping[str, str] | None = None,
    ) -> IndexUpdate:
        """Add the entries the index lacks (see the class doc); `aliases`: fingerprint -> row identity."""
        if not entries:
            return IndexUpdate(0)
        if not workspace.is_dir():
            raise WorkspaceMissing(2, "agent workspace does not exist", str(workspace))
        try:
            return self._add_locked(workspace, entries, aliases or {})
        except FileNotFoundError as exc:
            if workspace.is_dir():
                raise
            # removed between the check and the lock or the write
            raise WorkspaceMissing(2, "agent workspace does not exist", str(workspace)) from exc

    def _add_locked(self, workspace: Path, entries: Sequence[IndexEntry], aliases: Mapping[str, str]) -> IndexUpdate:
        path = inside(workspace, self.path_for(workspace))  # a symlinked index never leads the write elsewhere
        update = _rewrite_unless_edited(workspace, path, lambda text: self._with_rows(text, entries, aliases, None))
        if update.added:
            log.info("credential_index_updated", path=str(path), rows_added=update.added)
        return update

    def _with_rows(
        self, text: str, entries: Sequence[IndexEntry], aliases: Mapping[str, str], _hook_arity: object = None
    ) -> tuple[str, IndexUpdate]:
        """`text` with rows for the entries it lacks (and our rows' labels rechecked: `_rechecked`). Called
        inside the lock, once per attempt: the hook a test overrides to race a human edit (it passes four
        positional arguments through)."""
        table = _find_table(text)
        if (rechecked := _rechecked(table)) is not None:
            text = rechecked
            table = _find_table(text)
        known_fps: set[str] = set()
        rows_with: Counter[str] = Counter()
        for row in _rows_of(table):
            known_fps.update(_FP_RE.findall(row.fingerprint.strip("`")))
            rows_with.update(_row_identities(row))
        fresh: list[IndexEntry] = []
        matched: dict[str, str] = {}

        def has_row(key: str) -> bool:
            identity, _, occurrence = key.rpartition("#")
            return occurrence.isdigit() and rows_with[identity] >= int(occurrence)

        for entry in entries:
            identities = entry.identities()
            same_place = next((f"{i}#{n}" for i, n in identities if rows_with[i] >= n), None)
            if same_place is not None:
                if entry.fingerprint_identifies:
                    matched[entry.finding.fingerprint] = same_place
                continue
            fps = entry.fingerprints()
            if any(fp in known_fps for fp in fps):
                continue
            if any(fp in aliases and has_row(aliases[fp]) for fp in fps):
                continue
            fresh.append(entry)
            known_fps.update(fps)
            # the row about to be written: both of its identities, as _row_identities will read them
            at = entry.place()
            if at is not None:
                rows_with[_at_identity(at, entry.finding.key_name)] += 1
                rows_with[_moment_identity(at, entry.seen_at, entry.finding.key_name)] += 1
        update = IndexUpdate(len(fresh), matched)
        if not fresh:
            return text, update
        lines = table.lines
        if table.header_at < 0:
            prefix = "".join(lines)
            if prefix and not prefix.endswith("\n"):
                prefix += "\n"
            if prefix.strip():
                prefix += "\n"
            else:
                prefix = _INDEX_INTRO
            head = "| " + " | ".join(HEADER) + " |\n" + "|" + "---|" * len(HEADER) + "\n"
            rows = "".join(self._row(e, list(HEADER)) for e in fresh)
            return prefix + head + rows, update
        columns = list(table.columns)
        missing = [name for name in HEADER if table.column(name) is None]
        if missing:
            # a hand-made protocol table (| Service | Key Name | Location | Status |): extend the
            # header and separator only; the human's rows stay byte for byte as they were
            columns += missing
            lines = list(lines)
            newline = "\r\n" if lines[table.header_at].endswith("\r\n") else "\n"
            lines[table.header_at] = "| " + " | ".join(columns) + " |" + newline
            lines[table.header_at + 1] = "|" + "---|" * len(columns) + newline
        before, after = lines[: table.end], lines[table.end :]
        if before and not before[-1].endswith("\n"):
            before[-1] += "\n"
        rows = "".join(self._row(e, columns) for e in fresh)
        return "".join(before) + rows + "".join(after), update

    @staticmethod
    def _row_line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(_cell(c) for c in cells) + " |"

    def _row(self, entry: IndexEntry, columns: list[str]) -> str:
        finding = entry.finding
        values = {
            "service": finding.service,
            "key name": finding.key_name,
            "location": entry.where(),
            "status": entry.status or self.status,
            "first seen": entry.seen_at,
            "fingerprint": " ".join((finding.fingerprint, *entry.extra_fingerprints)),
        }
        return self._row_line([values.get(c.lower(), "") for c in columns]) + "\n"


def _rechecked(table: _Table) -> str | None:
    """The file with the Service and Key Name of our own rows (those with a fingerprint) rechecked, as a
    version before issue 37 may have written a password there (`written_before`); None when nothing changes."""
    service_at, key_at, fp_at = table.column("service"), table.column("key name"), table.column("fingerprint")
    if table.header_at < 0 or service_at is None or key_at is None or fp_at is None:
        return None
    lines = list(table.lines)
    changed = False
    for n in range(table.header_at + 2, table.end):
        cells = _split_row(lines[n])
        if max(service_at, key_at, fp_at) >= len(cells) or not _FP_RE.search(cells[fp_at]):
            continue
        labels = written_before(cells[service_at], cells[key_at])
        if labels != (cells[service_at], cells[key_at]):
            cells[service_at], cells[key_at] = labels
            newline = "\r\n" if lines[n].endswith("\r\n") else "\n" if lines[n].endswith("\n") else ""
            lines[n] = CredentialIndex._row_line(cells) + newline
            changed = True
    return "".join(lines) if changed else None


# ---------------------------------------------------------------------------------------------
# Index bookkeeping in the data dir: rows waiting for a workspace, masks waiting for their value,
# fingerprints known to stand for a row another data dir wrote.

STATE_FILE = "credentials-index.json"
_STATE_VERSION = 1
MAX_PENDING_ROWS = 10_000


@dataclass(frozen=True, slots=True)
class PendingRow:
    """An index row not written yet. `mask` is set while its value is still to be recovered (the
    mask is what OpenClaw already shows in the transcript, never more of the value)."""

    agent_id: str
    entry: IndexEntry
    mask: str | None = field(default=None, repr=False)
    attempts: int = 0
    since: float = 0.0  # epoch seconds it was queued

    def to_json(self) -> dict[str, Any]:
        f, e = self.entry.finding, self.entry
        return {
            "agent": self.agent_id, "rule": f.rule, "service": f.service, "key_name": f.key_name,
            "fingerprint": f.fingerprint, "location": e.location, "seen_at": e.seen_at, "vault_ref": e.vault_ref,
            "status": e.status, "note": e.note, "extra_fingerprints": list(e.extra_fingerprints),
            "fingerprint_identifies": e.fingerprint_identifies, "occurrence": e.occurrence, "given_at": e.given_at,
            "moment_occurrence": e.moment_occurrence, "mask": self.mask, "attempts": self.attempts,
            "since": self.since,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PendingRow | None:
        try:
            # (a row an older version queued: its labels rechecked before they are written anywhere)
            service, key_name = written_before(str(raw["service"]), str(raw["key_name"]),
                                               rule_key_name=rule_key_name(str(raw["rule"])))
            finding = SecretFinding(str(raw["rule"]), service, key_name, str(raw["fingerprint"]), 0, 0)
            entry = IndexEntry(
                finding, str(raw["location"]), str(raw["seen_at"]), raw.get("vault_ref") or None,
                raw.get("status") or None, raw.get("note") or None,
                tuple(str(fp) for fp in raw.get("extra_fingerprints") or ()),
                bool(raw.get("fingerprint_identifies", True)), int(raw.get("occurrence") or 1),
                raw.get("given_at") or None, int(raw.get("moment_occurrence") or 1),
            )
            return cls(str(raw["agent"]), entry, raw.get("mask") or None, int(raw.get("attempts") or 0),
                       float(raw.get("since") or 0.0))
        except (KeyError, TypeError, ValueError):
            return None

    def repeats(self, other: PendingRow) -> bool:
        """The same value (fingerprint) for the same agent, already waiting: the index would skip it."""
        a, b = self.entry, other.entry
        return (self.agent_id == other.agent_id and self.mask is None and other.mask is None
                and a.fingerprint_identifies and b.fingerprint_identifies
                and a.finding.fingerprint == b.finding.fingerprint)

    def same_as(self, other: PendingRow) -> bool:
        a, b = self.entry, other.entry
        return (self.agent_id == other.agent_id and a.finding.fingerprint == b.finding.fingerprint
                and a.identities() == b.identities() and a.location == b.location)


@dataclass(slots=True)
class IndexState:
    """The contents of `<data_dir>/credentials-index.json`."""

    pending: list[PendingRow] = field(default_factory=list)
    aliases: dict[str, dict[str, str]] = field(default_factory=dict)  # workspace -> fingerprint -> row identity


class IndexStateStore:
    """`<data_dir>/credentials-index.json`: mode 0600, atomic rewrite, locked like the index.

    It never holds a value: pending rows are index rows (service, key name, where, fingerprint)
    plus, for a mask whose value is still being recovered, the mask OpenClaw left in the transcript.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / STATE_FILE

    def load(self) -> IndexState:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return IndexState()
        except (OSError, ValueError) as exc:
            log.error("credential_index_state_unreadable", path=str(self.path), error=f"{type(exc).__name__}")
            return IndexState()
        if not isinstance(raw, dict):
            return IndexState()
        rows = [PendingRow.from_json(r) for r in raw.get("pending") or () if isinstance(r, dict)]
        raw_aliases = raw.get("aliases")
        aliases: dict[Any, Any] = raw_aliases if isinstance(raw_aliases, dict) else {}
        return IndexState(
            [r for r in rows if r is not None],
            {str(ws): {str(k): str(v) for k, v in m.items()} for ws, m in aliases.items() if isinstance(m, dict)},
        )

    @contextlib.contextmanager
    def update(self) -> Iterator[IndexState]:
        """Load, let the caller change the state, write it back (only if it changed)."""
        make_dirs(self.data_dir)
        with _locked_dir(self.data_dir):
            state = self.load()
            before = self._dump(state)
            yield state
            if len(state.pending) > MAX_PENDING_ROWS:
                log.error("credential_index_pending_dropped", dropped=len(state.pending) - MAX_PENDING_ROWS)
                del state.pending[: len(state.pending) - MAX_PENDING_ROWS]
            after = self._dump(state)
            if after != before:
                _atomic_write(self.path, after)

    @staticmethod
    def _dump(state: IndexState) -> str:
        return json.dumps({"version": _STATE_VERSION, "pending": [r.to_json() for r in state.pending],
                           "aliases": state.aliases}, ensure_ascii=False, sort_keys=True, indent=1) + "\n"


def pending_counts(data_dir: Path) -> dict[str, int]:
    """Index rows per agent still waiting (for the agent's workspace, or for a masked value): for
    `status`/`doctor` in any process; reads `<data_dir>/credentials-index.json`, never writes."""
    counts: Counter[str] = Counter(row.agent_id for row in IndexStateStore(data_dir).load().pending)
    return dict(counts)


# ---------------------------------------------------------------------------------------------
# The unmasked text OpenClaw keeps: task_runs.task in <state>/state/openclaw.sqlite


OPENCLAW_STATE_DB = Path("state") / "openclaw.sqlite"
TASK_RUNS_RETENTION_S = 7 * 24 * 3600  # OpenClaw prunes a finished task 7 days after it ended
_HINTED_WINDOW_S = TASK_RUNS_RETENTION_S + 24 * 3600
_OPAQUE_WINDOW_S = 2 * 3600  # `***` matches by key name only: keep it near in time
_CLOCK_SLACK_S = 10 * 60
_MAX_TASK_CHARS = 1 << 20
RecoveryStatus = Literal["found", "not_found", "ambiguous", "unavailable"]


@dataclass(frozen=True, slots=True)
class MaskProbe:
    """A masked finding to find the value of: which agent, what mask, which key, when it was seen."""

    agent_id: str
    rule: str
    key_name: str
    mask: str = field(repr=False)
    seen_at: str | None = None


@dataclass(frozen=True, slots=True)
class Recovery:
    """What a lookup found. `value` is a secret: vault it, drop it, never log it."""

    status: RecoveryStatus
    value: str | None = field(default=None, repr=False)
    task_id: str | None = None
    detail: str = ""


def _epoch_ms(timestamp: str | None) -> int | None:
    if not timestamp:
        return None
    try:
        moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


class TaskRunValues:
    """Finds the unmasked text of a masked credential in OpenClaw's `task_runs` table.

    OpenClaw writes the raw message of every Gateway `agent` run (`openclaw agent`, subagent and
    ACP spawns, automation runs) to `task_runs.task` of `<state>/state/openclaw.sqlite`, unmasked,
    and deletes the row 7 days after the run ended (24 hours for `lost` runs). Chat arriving over a
    channel or the Control UI creates no task: for it the mask is all there is.

    Read-only like the transcript reader: `mode=ro`, `PRAGMA query_only=ON`, a short busy timeout,
    one short connection per lookup (nothing pins OpenClaw's WAL). Rows are those of the agent
    near the time the mask was seen; a `head…tail` mask must be reproduced exactly by OpenClaw's
    masking of the candidate, a `***` needs its key name and shape and one single value nearby.
    """

    def __init__(self, db_path: Path, *, busy_timeout_s: float = 0.2, max_rows: int = 500) -> None:
        self.db_path = db_path
        self._busy_timeout_s = busy_timeout_s
        self._max_rows = max_rows

    def recover(self, probe: MaskProbe) -> Recovery:
        if not is_masked_rule(probe.rule):
            return Recovery("not_found", detail="not a masked finding")
        opaque = is_opaque_mask(probe.mask)
        if not opaque and split_mask(probe.mask) is None:
            return Recovery("not_found", detail="not a mask OpenClaw makes")
        seen = _epoch_ms(probe.seen_at)
        if opaque and seen is None:
            return Recovery("not_found", detail="a *** mask needs the time it was seen")
        if not self.db_path.exists():
            return Recovery("not_found", detail="no OpenClaw state database")
        try:
            rows = self._rows(probe.agent_id, seen, _OPAQUE_WINDOW_S if opaque else _HINTED_WINDOW_S)
        except sqlite3.Error as exc:
            message = str(exc).lower()
            if "no such table" in message or "no such column" in message:
                return Recovery("not_found", detail="no task_runs table")
            return Recovery("unavailable", detail=f"{type(exc).__name__}: {exc}"[:200])
        hits: dict[str, str] = {}  # value -> task id of the nearest row holding it
        for task_id, task in rows:
            for value in recover_unmasked(task, rule=probe.rule, key_name=probe.key_name, mask=probe.mask):
                hits.setdefault(value, task_id)
        if not hits:
            return Recovery("not_found", detail="no unmasked copy in task_runs")
        if len(hits) > 1:
            return Recovery("ambiguous", detail=f"{len(hits)} different values match")
        ((value, task_id),) = hits.items()
        return Recovery("found", value, task_id)

    def _rows(self, agent_id: str, seen_ms: int | None, window_s: int) -> list[tuple[str, str]]:
        uri = self.db_path.resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=self._busy_timeout_s, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("PRAGMA query_only=ON").fetchall()
            columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(task_runs)").fetchall()}
            if not {"task_id", "task"} <= columns:
                raise sqlite3.OperationalError("no such table: task_runs")
            where: list[str] = []
            params: list[object] = []
            agent_terms: list[str] = []
            for column in ("agent_id", "requester_agent_id"):
                if column in columns:
                    agent_terms.append(f"{column} = ?")
                    params.append(agent_id)
            prefix = "agent:" + agent_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ":%"
            for column in ("child_session_key", "owner_key", "requester_session_key"):
                if column in columns:
                    agent_terms.append(f"{column} LIKE ? ESCAPE '\\'")
                    params.append(prefix)
            if agent_terms:
                where.append("(" + " OR ".join(agent_terms) + ")")
            order = "rowid DESC"
            if "created_at" in columns and seen_ms is not None:
                where.append("created_at BETWEEN ? AND ?")
                params += [seen_ms - window_s * 1000, seen_ms + _CLOCK_SLACK_S * 1000]
                order = "ABS(created_at - ?)"
                order_params: list[object] = [seen_ms]
            else:
                order_params = []
            sql = (f"SELECT task_id, substr(task, 1, {_MAX_TASK_CHARS}) FROM task_runs"
                   + (" WHERE " + " AND ".join(where) if where else "") + f" ORDER BY {order} LIMIT ?")
            result = conn.execute(sql, [*params, *order_params, self._max_rows]).fetchall()
            return [(str(task_id), str(task)) for task_id, task in result if isinstance(task, str)]
        finally:
            conn.close()


# ---------------------------------------------------------------------------------------------
# The vault


class VaultError(Exception):
    """The vault recipient is not a valid age or SSH public key, or the vault cannot be written."""


class Vault:
    """Append-only file of values encrypted to one age (or SSH) public key.

    One JSON line per credential: clear metadata (fingerprint, rule, service, key name, where
    and when) and `age`, the ASCII-armored ciphertext of the value. The daemon holds no identity:
    what it writes it cannot read back. Only the clear metadata is ever read, to skip values
    already stored and to number entries.
    """

    def __init__(self, recipient: str, path: Path) -> None:
        import pyrage  # imported here: only operators who configure a vault need it

        self._pyrage = pyrage
        text = recipient.strip()
        try:
            if text.startswith("age1"):
                self._recipient: Any = pyrage.x25519.Recipient.from_str(text)
            else:
                self._recipient = pyrage.ssh.Recipient.from_str(text)
        except Exception as exc:
            raise VaultError(f"vault recipient is not an age1... or ssh public key: {exc}") from exc
        self.path = path

    def ref(self, number: int) -> str:
        return f"vault:{self.path}#{number}"

    def append(
        self,
        value: str,
        *,
        fingerprint: str,
        rule: str = "",
        service: str = "",
        key_name: str = "",
        location: str = "",
        seen_at: str = "",
    ) -> str:
        """Encrypt `value`, append it, return its ref (`vault:<path>#<n>`); a stored value keeps its ref."""
        make_dirs(self.path.parent)
        with _locked_dir(self.path.parent):
            existing = self._metadata()
            for number, meta in enumerate(existing, 1):
                if meta.get("fingerprint") == fingerprint:
                    return self.ref(number)
            payload = json.dumps({"value": value, "rule": rule, "service": service, "key_name": key_name})
            try:
                cipher = self._pyrage.encrypt(payload.encode("utf-8"), [self._recipient], armored=True)
            except Exception as exc:
                raise VaultError(f"could not encrypt to the vault recipient: {exc}") from exc
            line = json.dumps(
                {
                    "n": len(existing) + 1,
                    "fingerprint": fingerprint,
                    "rule": rule,
                    "service": service,
                    "key_name": key_name,
                    "location": location,
                    "seen_at": seen_at,
                    "age": cipher.decode("ascii"),
                }
            )
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, (line + "\n").encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(self.path.parent)
        ref = self.ref(len(existing) + 1)
        log.info("vault_appended", ref=ref, fingerprint=fingerprint, rule=rule)
        return ref

    def _metadata(self) -> list[dict[str, Any]]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        entries: list[dict[str, Any]] = []
        for line in raw.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                entry = {}  # a torn last line still takes its number
            entries.append(entry if isinstance(entry, dict) else {})
        return entries


# ---------------------------------------------------------------------------------------------
# Multi-source lookup


Source = Literal["index", "env_file", "systemd", "etc_environment", "process_env"]


@dataclass(frozen=True, slots=True)
class CredentialLocation:
    """Where a credential for a service is. `value` is set only when revealing was asked for."""

    source: Source
    where: str  # file:line, systemd unit, "environ", or the index row's own Location
    service: str
    key_name: str
    masked: str
    fingerprint: str | None = None
    status: str | None = None
    value: str | None = field(default=None, repr=False)
    agent: str | None = None  # an index row: the agent whose workspace holds the index


def mask(value: str, key: bytes | None = None) -> str:
    """`****(51 chars)`, plus the keyed fingerprint when a key is given. Never any character of the value."""
    if key is None:
        return f"****({len(value)} chars)"
    return f"****({len(value)} chars, fp {fingerprint(value, key)})"


def _norm(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


_ENV_LINE_RE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*?)\s*$")
_SKIP_DIRS = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__", ".tox", ".mypy_cache", "dist", "build"})
_EXAMPLE_ENV_RE = re.compile(r"(?i)\.(?:example|sample|template|dist|defaults?)$")


def _env_value(raw: str) -> str:
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        return raw[1:-1]
    return re.split(r"\s+#", raw, maxsplit=1)[0].strip()


def _parse_env_text(text: str) -> Iterator[tuple[int, str, str]]:
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        m = _ENV_LINE_RE.match(line)
        if m:
            yield number, m.group(1), _env_value(m.group(2))


def _env_files(root: Path, max_depth: int) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    base_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).parts) - base_depth
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and depth < max_depth)
        for name in sorted(filenames):
            is_env = name == ".env" or name.startswith(".env.") or name.endswith(".env")
            if is_env and not _EXAMPLE_ENV_RE.search(name):
                yield Path(dirpath) / name


def _matches(query: str, *names: str) -> bool:
    return bool(query) and any(query in _norm(n) for n in names if n)


_JSONL_LOCATION = re.compile(r"^(?P<path>/.+?\.jsonl):(?P<line>\d+)(?P<rest>.*)$", re.S)


def followed(location: str) -> str:
    """An index Location whose JSONL transcript OpenClaw has archived since (`/new` renames it to
    `.reset.<ts>`, a deletion to `.deleted.<ts>`): where that line is now, said so. Else as written."""
    match = _JSONL_LOCATION.match(location)
    if match is None or Path(match["path"]).exists():
        return location
    path = Path(match["path"])
    try:
        archived = sorted(p for p in path.parent.iterdir()
                          if p.name.startswith((f"{path.name}.reset.", f"{path.name}.deleted.")))
    except OSError:
        return location
    if not archived:
        return location
    return f"{archived[0]}:{match['line']}{match['rest']} (archived since)"


_VAULT_REF_RE = re.compile(r"\bvault:\S+#\d+")


def _index_items(index_paths: Sequence[Path] | Mapping[str, Path]) -> list[tuple[str | None, Path]]:
    if isinstance(index_paths, Mapping):
        return list(index_paths.items())
    return [(None, path) for path in index_paths]


def find_credential(
    service: str,
    *,
    index_paths: Sequence[Path] | Mapping[str, Path] = (),
    env_dirs: Sequence[Path] = (),
    units: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    etc_environment: Path = Path("/etc/environment"),
    fingerprint_key: bytes | None = None,
    reveal: bool = False,
    max_depth: int = 4,
) -> list[CredentialLocation]:
    """Every place a credential for `service` is found, in the protocol's order.

    1. CREDENTIALS_INDEX.md rows whose service or key name matches (no value: the row says where; given
       as {agent: path}, each result names its agent);
    2. `.env` files under `env_dirs` (depth-limited; .git, node_modules, venvs and *.example skipped);
    3. `Environment=` / `EnvironmentFile=` of each systemd unit (`systemctl cat`; skipped when
       systemctl is missing);
    4. `etc_environment`; 5. `environ` (the process environment).
    Sources 2-5 report only variables with a credential-like name (DEEPSEEK_API_KEY, not
    DEEPSEEK_BASE_URL) that contain the service. Values are masked; `reveal=True` also fills
    `value` (callers must only ask for that on an interactive TTY).
    """
    query = _norm(service)
    results: list[CredentialLocation] = []

    def from_value(source: Source, where: str, name: str, value: str) -> None:
        if not value or not is_secret_name(name) or not _matches(query, name):
            return
        results.append(
            CredentialLocation(
                source,
                where,
                service,
                name,
                mask(value, fingerprint_key),
                fingerprint(value, fingerprint_key) if fingerprint_key else None,
                None,
                value if reveal else None,
            )
        )

    for agent, path in _index_items(index_paths):
        for row in read_index(path):
            if _matches(query, row.service, row.key_name):
                fp = row.fingerprint.strip("`") or None
                # the index holds no value; a row whose Location names a vault entry has it encrypted there
                held = "(in the vault)" if _VAULT_REF_RE.search(row.location) else "(not stored)"
                results.append(
                    CredentialLocation("index", followed(row.location), row.service, row.key_name, held, fp,
                                       row.status, agent=agent)
                )

    for root in env_dirs:
        for env_file in _env_files(root, max_depth):
            try:
                text = env_file.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for number, name, value in _parse_env_text(text):
                from_value("env_file", f"{env_file}:{number}", name, value)

    systemctl = shutil.which("systemctl")
    for unit in units if systemctl else ():
        for where, name, value in _unit_environment(systemctl or "systemctl", unit):
            from_value("systemd", where, name, value)

    with contextlib.suppress(OSError):
        for number, name, value in _parse_env_text(etc_environment.read_text(encoding="utf-8", errors="replace")):
            from_value("etc_environment", f"{etc_environment}:{number}", name, value)

    for name, value in sorted((environ if environ is not None else os.environ).items()):
        from_value("process_env", "environ", name, value)
    return results


def _unit_environment(systemctl: str, unit: str) -> Iterator[tuple[str, str, str]]:
    """(where, name, value) for each Environment= assignment of a unit, system or user."""
    text = ""
    for scope in ([], ["--user"]):
        try:
            done = subprocess.run(
                [systemctl, *scope, "cat", "--", unit], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0 and done.stdout.strip():
            text = done.stdout
            break
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Environment="):
            try:
                words = shlex.split(stripped[len("Environment=") :])
            except ValueError:
                continue
            for word in words:
                name, sep, value = word.partition("=")
                if sep:
                    yield f"systemd:{unit} Environment=", name, value
        elif stripped.startswith("EnvironmentFile="):
            env_path = Path(stripped[len("EnvironmentFile=") :].lstrip("-").strip())
            with contextlib.suppress(OSError):
                content = env_path.read_text(encoding="utf-8", errors="replace")
                for number, name, value in _parse_env_text(content):
                    yield f"systemd:{unit} EnvironmentFile={env_path}:{number}", name, value


# ---------------------------------------------------------------------------------------------
# Forgetting a session: every row and vault entry given in it (`veritas_watch.forget`)


def given_in(location: str) -> str | None:
    """The session a Location names (its `given_at` session: a SQLite session id or a JSONL stem), or None."""
    at = given_at(location)
    return at.split(":", 2)[1] if at is not None else None


def forget_index_rows(workspace: Path, sessions: frozenset[str], *, dry_run: bool = False) -> int:
    """Remove the rows of `<workspace>/CREDENTIALS_INDEX.md` given in `sessions`; the rest of the file stays byte
    for byte (a human's rows and text included). Returns how many rows went (or would go)."""
    path = workspace / INDEX_FILE
    if not path.is_file():
        return 0
    inside(workspace, path)  # a symlinked index never leads the rewrite elsewhere
    rewrite = _without_rows_given_in(sessions)
    if dry_run:
        with _locked_dir(workspace):
            return rewrite(path.read_bytes().decode("utf-8", "surrogateescape"))[1]
    return _rewrite_unless_edited(workspace, path, rewrite)


def _without_rows_given_in(sessions: frozenset[str]) -> Callable[[str], tuple[str, int]]:
    """An index text -> (the text without the rows given in `sessions`, how many went)."""

    def rewrite(text: str) -> tuple[str, int]:
        table = _find_table(text)
        if table.header_at < 0:
            return text, 0
        body = table.lines[table.header_at + 2 : table.end]
        keep = [line for line, row in zip(body, _rows_of(table), strict=True)
                if given_in(row.location) not in sessions]
        if len(keep) == len(body):
            return text, 0
        return "".join(table.lines[: table.header_at + 2] + keep + table.lines[table.end :]), len(body) - len(keep)

    return rewrite


def forget_vault_entries(vault: Path, sessions: frozenset[str], *, dry_run: bool = False) -> int:
    """Erase the vault entries given in `sessions`: each line becomes `{"n": <n>, "forgotten": true}`, so the
    other entries keep their numbers (their refs in the index stay right). Returns how many went (or would)."""
    if not vault.is_file():
        return 0
    with _locked_dir(vault.parent):
        lines = vault.read_bytes().splitlines()
        erased = 0
        unreadable = []
        for number, line in enumerate(lines, 1):
            location = _vault_location(line)
            if location is None:
                if line.strip():
                    unreadable.append(number)
                continue
            if given_in(location) in sessions:
                lines[number - 1] = json.dumps({"n": number, "forgotten": True}).encode()
                erased += 1
        if unreadable:  # kept as they are (their numbers too); said once, the other entries forgotten all the same
            log.warning("vault_lines_unreadable", path=str(vault), lines=unreadable[:20], count=len(unreadable),
                        hint="not JSON with a location: left in place, not erased")
        if erased and not dry_run:
            _atomic_write(vault, b"".join(line + b"\n" for line in lines))  # other lines byte for byte
    return erased


_VAULT_LOCATION_RE = re.compile(r'"location"\s*:\s*("(?:[^"\\]|\\.)*")')


def _vault_location(line: bytes) -> str | None:
    """The `location` of a vault line; None if it names none. Bytes that are not UTF-8 elsewhere in the line do
    not hide it, nor does a line cut short after it (a torn write)."""
    text = line.decode("utf-8", "replace")
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError):
        found = _VAULT_LOCATION_RE.search(text)
        try:
            return str(json.loads(found.group(1))) if found else None
        except ValueError:
            return None
    if not isinstance(meta, dict):
        return None
    return str(meta.get("location") or "")


def forget_pending_rows(data_dir: Path, agent_id: str, sessions: frozenset[str], *, dry_run: bool = False) -> int:
    """Drop the agent's index rows still waiting (`credentials-index.json`) that were given in `sessions`."""
    store = IndexStateStore(data_dir)
    if not store.path.is_file():
        return 0
    with store.update() as state:
        gone = [r for r in state.pending if r.agent_id == agent_id and given_in(r.entry.location) in sessions]
        if not dry_run:
            state.pending = [r for r in state.pending if r not in gone]
    return len(gone)
