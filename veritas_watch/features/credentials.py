"""Where credentials went: CREDENTIALS_INDEX.md, the optional age vault, and `creds find`.

- `workspace_for` resolves an agent's workspace the way OpenClaw does (the index lives there).
- `CredentialIndex.record` adds one table row per new credential (deduplicated by fingerprint)
  to `<workspace>/CREDENTIALS_INDEX.md`: atomic rewrite, mode 0600, every other line kept as the
  human left it. The index never holds a value, only where the value can be recovered.
- `Vault` appends each value encrypted to an age recipient. The daemon can write it but holds no
  identity, so it can never read a value back.
- `find_credential` is the protocol's lookup, in order: the index, `.env` files under project
  dirs, `systemctl cat` Environment= lines, /etc/environment, the process environment. Values
  are masked (length and keyed fingerprint only) unless the caller asks to reveal them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from veritas_watch.model import SecretFinding
from veritas_watch.openclaw import workspace_for
from veritas_watch.transforms.redact import fingerprint, is_secret_name

__all__ = [
    "HEADER",
    "INDEX_FILE",
    "CredentialIndex",
    "CredentialLocation",
    "IndexRow",
    "Vault",
    "VaultError",
    "find_credential",
    "mask",
    "read_index",
    "workspace_for",
]

log = structlog.get_logger()

INDEX_FILE = "CREDENTIALS_INDEX.md"
HEADER: tuple[str, ...] = ("Service", "Key Name", "Location", "Status", "First Seen", "Fingerprint")
_INDEX_INTRO = (
    "# Credentials Index\n\n"
    "Where each credential lives, one row per credential. veritas-watch adds a row when a new one\n"
    "appears in a conversation (matched by fingerprint, a keyed hash: the value itself is never\n"
    "written here). Edit freely: rows and text you change are kept as you left them.\n\n"
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


def _atomic_write(path: Path, data: str, mode: int = 0o600) -> None:
    """Write to a temp file beside `path`, fsync, rename over it, fsync the directory."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(data)
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
    """The rows of an index file; [] when it does not exist or holds no table."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return _rows_of(_find_table(text))


class CredentialIndex:
    """Maintains `<workspace>/CREDENTIALS_INDEX.md`. Safe across threads and processes."""

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
        """Add a row for each finding whose fingerprint the index lacks; returns rows added."""
        if not findings:
            return 0
        workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.path_for(workspace)
        where = f"{location}; {vault_ref}" if vault_ref else location
        with _locked_dir(workspace):
            # A human editor does not take our lock: if the file changes between our read and
            # our rename, read it again rather than overwrite their edit.
            for _attempt in range(10):
                before = _stat_key(path)
                text = path.read_text(encoding="utf-8") if before is not None else ""
                new_text, added = self._with_rows(text, findings, where, seen_at)
                if added == 0:
                    return 0
                if _stat_key(path) != before:
                    continue
                _atomic_write(path, new_text)
                log.info("credential_index_updated", path=str(path), rows_added=added)
                return added
            raise RuntimeError(f"{path} kept changing while being updated")

    def _with_rows(self, text: str, findings: Sequence[SecretFinding], where: str, seen_at: str) -> tuple[str, int]:
        table = _find_table(text)
        known = _fingerprints_of(table)
        fresh: list[SecretFinding] = []
        for finding in findings:
            if finding.fingerprint not in known:
                known.add(finding.fingerprint)
                fresh.append(finding)
        if not fresh:
            return text, 0
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
            rows = "".join(self._row(f, where, seen_at, list(HEADER)) for f in fresh)
            return prefix + head + rows, len(fresh)
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
        rows = "".join(self._row(f, where, seen_at, columns) for f in fresh)
        return "".join(before) + rows + "".join(after), len(fresh)

    def _row(self, finding: SecretFinding, where: str, seen_at: str, columns: list[str]) -> str:
        values = {
            "service": finding.service,
            "key name": finding.key_name,
            "location": where,
            "status": self.status,
            "first seen": seen_at,
            "fingerprint": finding.fingerprint,
        }
        return "| " + " | ".join(_cell(values.get(c.lower(), "")) for c in columns) + " |\n"


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
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
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


def find_credential(
    service: str,
    *,
    index_paths: Sequence[Path] = (),
    env_dirs: Sequence[Path] = (),
    units: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    etc_environment: Path = Path("/etc/environment"),
    fingerprint_key: bytes | None = None,
    reveal: bool = False,
    max_depth: int = 4,
) -> list[CredentialLocation]:
    """Every place a credential for `service` is found, in the protocol's order.

    1. CREDENTIALS_INDEX.md rows whose service or key name matches (no value: the row says where);
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

    for path in index_paths:
        for row in read_index(path):
            if _matches(query, row.service, row.key_name):
                fp = row.fingerprint.strip("`") or None
                results.append(
                    CredentialLocation("index", row.location, row.service, row.key_name, "(not stored)", fp, row.status)
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
