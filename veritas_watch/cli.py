"""`veritas-watch` command line: run / backfill / search / status / export."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from veritas_watch import client
from veritas_watch import log as logsetup
from veritas_watch.client import DaemonEndpoint, DaemonRefused
from veritas_watch.config import Config, ConfigError, load_config
from veritas_watch.owner import EXIT_DATA_DIR_OWNED
from veritas_watch.sinks.store import StoreError
from veritas_watch.terminal import indented, json_line, printable

EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veritas-watch", description=__doc__)
    parser.add_argument("--config", help="TOML config file (default: $VERITAS_WATCH_CONFIG, else built-in defaults)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the daemon in the foreground (what systemd starts)")
    sub.add_parser("backfill", help="one pass over all history, including archives, then exit")
    search = sub.add_parser("search", help="search an agent's memory")
    search.add_argument("query")
    search.add_argument("--agent", help="agent id (required unless search.allow_cross_agent is on)")
    search.add_argument("--limit", type=int, default=10)
    search.add_argument("--mode", choices=("hybrid", "dense", "sparse"), default="hybrid")
    search.add_argument("--role", action="append", choices=("user", "assistant"), help="only this role's turns")
    search.add_argument("--since", help="only turns at or after this time (ISO-8601)")
    search.add_argument("--until", help="only turns at or before this time (ISO-8601)")
    search.add_argument("--no-expand", action="store_true", help="hits only, without their neighbouring turns")
    search.add_argument("--no-floor", action="store_true", help="show results even below the relevance floor")
    search.add_argument("--full", action="store_true", help="each hit's whole text and where it was said")
    search.add_argument("--json", action="store_true", help="print a JSON list")
    status = sub.add_parser("status", help="what is watched, stored and still to read")
    status.add_argument("--json", action="store_true")
    export = sub.add_parser("export", help="every stored point as one JSON line (id and payload)")
    export.add_argument("--agent", help="only this agent's points")
    creds = sub.add_parser("creds", help="list captured credentials (never values), or find where a key is")
    creds.add_argument("--agent", help="only this agent")
    creds_sub = creds.add_subparsers(dest="creds_command")
    find = creds_sub.add_parser("find", help="look a service up: index, .env files, systemd units, "
                                             "/etc/environment, the environment")
    find.add_argument("service")
    find.add_argument("--reveal", action="store_true", help="print the value (only on a terminal)")
    find.add_argument("--json", action="store_true")
    doctor = sub.add_parser("doctor", help="check state dir, permissions, inotify, model, store, unit; say what to fix")
    doctor.add_argument("--json", action="store_true")
    doctor.add_argument("--unit", action="append", type=Path, help="check this unit file instead of the installed one")
    selftest = sub.add_parser("selftest", help="write a marked entry, find it through the running daemon, remove it")
    selftest.add_argument("--timeout", type=float, default=60.0, help="seconds to wait until it is searchable")
    forget = sub.add_parser("forget", help="erase one session everywhere veritas-watch wrote it (memories, "
                            "CREDENTIALS_INDEX.md rows, vault entries, gap records), for good")
    forget.add_argument("--agent", required=True)
    forget.add_argument("--session", required=True, help="a session id, or a session key for each of its windows "
                        "(exact, case-sensitive: as `openclaw memory forget --session` takes it)")
    forget.add_argument("--dry-run", action="store_true", help="only count what would go")
    forget.add_argument("--json", action="store_true")
    service = sub.add_parser("service", help="install or remove the systemd service for this installation")
    actions = service.add_subparsers(dest="service_command", required=True)
    for name, helptext in (("install", "write the unit (and a drop-in for local changes), enable and start it"),
                           ("uninstall", "stop, disable and remove the unit (the data dir is kept)")):
        action = actions.add_parser(name, help=helptext)
        action.add_argument("--user", action="store_true", help="a user service (systemctl --user) instead")
        if name == "install":
            action.add_argument("--print", action="store_true", help="print the unit, write nothing")
            action.add_argument("--state-dir", help="the OpenClaw state dir (default: as OpenClaw finds it)")
    return parser


# -- talking to a running daemon (veritas_watch/client.py) ---------------------------------------------

def _request(daemon: DaemonEndpoint, path: str, body: dict[str, Any] | None = None) -> Any:
    """A request to the running daemon; its refusal is a CliError (one line)."""
    try:
        return daemon.open(path, body)
    except DaemonRefused as exc:
        raise CliError(str(exc)) from None


class CliError(Exception):
    """A command that cannot do what was asked: one line on stderr, exit code 1."""


START_WAIT_S = 300.0  # how long search/export wait for a starting daemon (model load, store migration)
STATUS_WAIT_S = 30.0  # status answers sooner: "starting" is an answer too


class DaemonStarting(Exception):
    """A daemon holds the data dir but did not answer within the wait: say so, never open its store."""

    def __init__(self, pid: int | None, waited: float) -> None:
        super().__init__(f"the daemon{f' (pid {pid})' if pid else ''} is starting and did not answer within "
                         f"{waited:.0f} s (loading the model, opening the store); try again shortly")
        self.pid = pid


def daemon_or_store(config: Config, command: str, wait_s: float = START_WAIT_S) -> tuple[DaemonEndpoint | None, Any]:
    """Where a command reads memory: (the daemon, None) through a running daemon, or (None, lock) when no
    daemon runs or starts and this process now owns the data dir (release the lock when done). The
    embedded store is never opened while a daemon holds the data dir: a starting daemon is waited for
    (`daemon starting`) up to `wait_s` (then DaemonStarting), a command that opened the store offline too.
    A Qdrant server needs no owner."""
    from veritas_watch.owner import OwnerLock

    deadline = time.monotonic() + wait_s
    said = ""
    while True:
        daemon = client.find(config)
        if daemon is not None:
            return daemon, None
        if config.store.url:
            return None, None
        lock = OwnerLock(config.data_dir)
        if lock.try_acquire("cli", command):
            if client.find(config) is None:
                return None, lock
            lock.release()  # a daemon got ready meanwhile (it holds its own lock): go through it
            continue
        holder = lock.holder()
        if holder is not None and holder.role == "daemon" and holder.command == "backfill":
            # A backfill serves no HTTP and holds the store until its pass ends: waiting would hang the command.
            print(f"veritas-watch: the store is in use by `veritas-watch backfill` (pid {holder.pid}), which answers "
                  "no requests; run this again once it has finished", file=sys.stderr)
            raise SystemExit(EXIT_DATA_DIR_OWNED)
        starting = holder is None or holder.role == "daemon"
        waiting = (f"store in use by {holder.describe()}" if holder is not None and not starting
                   else "daemon starting" + (f" (pid {holder.pid})" if holder else ""))
        if waiting != said:
            print(f"veritas-watch: {waiting}; waiting for it", file=sys.stderr, flush=True)
            said = waiting
        if time.monotonic() > deadline:
            if starting:
                raise DaemonStarting(holder.pid if holder else None, wait_s)
            print(f"veritas-watch: gave up after {wait_s:.0f} s: {waiting}", file=sys.stderr)
            raise SystemExit(EXIT_DATA_DIR_OWNED)
        time.sleep(0.25)


# -- commands -------------------------------------------------------------------------------------

def cmd_run(config: Config, once: bool) -> int:
    from veritas_watch.owner import DataDirOwned, OwnerLock, StartupError

    # The data dir's lock before the daemon's modules load (a second under no load, 10 s and more under load):
    # a second daemon or backfill is refused at once, and a CLI command started meanwhile finds a daemon
    # starting, not a free store to open. Held by a CLI command: the daemon waits for it (`store_held`).
    owner = OwnerLock(config.data_dir)
    try:
        if not owner.try_acquire("daemon", "backfill" if once else "run"):
            holder = owner.holder()
            if holder is not None and holder.role == "daemon":
                print(f"veritas-watch: {DataDirOwned.by_daemon(holder.pid, config.data_dir)}", file=sys.stderr)
                return DataDirOwned.exit_code
    except OSError:
        pass  # an unusable data dir: the daemon's start-up says what is wrong with it
    from veritas_watch.daemon import Daemon
    from veritas_watch.embedding import EmbedderError

    try:
        return asyncio.run(Daemon(config, once=once, owner=owner, owns_process=True).run())
    except StartupError as exc:  # port taken, data dir owned: everything opened is closed again
        print(f"veritas-watch: {exc}", file=sys.stderr)
        return exc.exit_code
    except EmbedderError as exc:
        print(f"veritas-watch: embedding model error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StoreError as exc:
        print(f"veritas-watch: store error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. the HTTP port is taken, the data dir is not writable
        print(f"veritas-watch: {exc}", file=sys.stderr)
        return 1


def _open_offline(config: Config) -> tuple[Any, Any]:
    """Open the store and the model directly (no daemon holds them)."""
    from veritas_watch.pipeline import store_meta
    from veritas_watch.sinks.configured import configured_embedder, configured_store

    embedder = configured_embedder(config)
    return configured_store(config, store_meta(embedder), reembed=None), embedder  # only the daemon migrates


def cmd_search(config: Config, args: argparse.Namespace) -> int:
    from veritas_watch.model import iso_to_epoch

    if args.agent is None and not config.search.allow_cross_agent:
        print("veritas-watch: --agent is required (search.allow_cross_agent is off)", file=sys.stderr)
        return EXIT_CONFIG
    bounds: dict[str, float] = {}
    for name in ("since", "until"):
        if (value := getattr(args, name)) is not None:
            if (epoch := iso_to_epoch(value)) is None:
                print(f"veritas-watch: --{name}: not an ISO-8601 time: {value!r}", file=sys.stderr)
                return EXIT_CONFIG
            bounds[name] = epoch
    daemon, owned = daemon_or_store(config, "search")
    stored_for_agent: int | None = None  # offline: how many memories the agent has (an empty answer's reason)
    if daemon is not None:
        body: dict[str, Any] = {"agent_id": args.agent, "query": args.query, "limit": args.limit,
                                "mode": args.mode, "roles": args.role, **bounds}
        if args.no_expand:
            body["expand"] = False
        if args.no_floor:
            body["floor"] = False
        with _request(daemon, "/search", body) as response:
            results = json.loads(response.read())
    else:
        from veritas_watch.query import search_memory
        from veritas_watch.ranking import floor_for

        try:
            store, embedder = _open_offline(config)
        except BaseException:
            _release(owned)
            raise
        floor = None if args.no_floor else floor_for(embedder, config.search.relevance_floor)
        try:
            results = search_memory(
                store, embedder, args.agent, args.query, min(args.limit, config.search.max_limit), args.mode,
                roles=tuple(args.role or ()), since=bounds.get("since"), until=bounds.get("until"),
                expand=config.search.expand_context and not args.no_expand, floor=floor,
                allow_cross_agent=config.search.allow_cross_agent)
            if not results and args.agent is not None:
                stored_for_agent = store.count(args.agent)
        finally:
            store.close()
            _release(owned)
    if not results:
        return _nothing_found(config, args, daemon, stored_for_agent)
    if args.json:
        print(json_line(json.dumps(results, ensure_ascii=False)))
    else:
        width = shutil.get_terminal_size((100, 24)).columns
        for r in results:
            print(_hit_header(r))
            text = (r.get("entry_text") or r.get("text") or "") if args.full else r.get("text") or ""
            print("\n".join(indented(text, width=width, max_lines=None if args.full else HIT_LINES)))
            if args.full and r.get("source"):
                print(f"    ({printable(r['source'])})")
            print()
    return 0


HIT_LINES = 8  # of one hit's text in `search` (--full: all of it): a screen shows several hits


def _hit_header(r: dict[str, Any]) -> str:
    """One hit's first line: score, who said it (agent, session, role or speaker), when."""
    who = f"{r['role']} ({r['speaker']})" if r.get("speaker") else r.get("role")
    context = "  (context of the hit above)" if r.get("neighbour_of") else ""
    return printable(f"{r['score']:.3f}  {r.get('agent_id')} / {r.get('session_id')}  {r.get('timestamp')}  "
                     f"[{who}]{context}")


def _nothing_found(config: Config, args: argparse.Namespace, daemon: DaemonEndpoint | None,
                   stored_for_agent: int | None) -> int:
    """No result: an agent nobody knows is a mistake (2); a known one's memory simply has no match (1)."""
    if args.json:
        print("[]")
    if args.agent is not None and not _agent_known(config, args.agent, daemon, stored_for_agent):
        print(f"veritas-watch: no agent {printable(args.agent)!r}: none under {config.state_dir / 'agents'} and "
              f"nothing stored for it (`veritas-watch status` lists the agents)", file=sys.stderr)
        return EXIT_CONFIG
    floor = "" if args.no_floor else " above the relevance floor (--no-floor shows weaker matches)"
    whose = f"{printable(args.agent)}'s memory" if args.agent else "memory"
    print(f"veritas-watch: nothing in {whose} matches{floor}", file=sys.stderr)
    return 1


def _agent_known(config: Config, agent: str, daemon: DaemonEndpoint | None, stored: int | None) -> bool:
    """An agent OpenClaw has (its dir), or one with memories kept (deleted since, or only in the store)."""
    from veritas_watch.openclaw import iter_agents

    if stored or any(a.agent_id == agent for a in iter_agents(config.state_dir)):
        return True
    if daemon is None:
        return False
    with _request(daemon, "/status") as response:
        return agent in (json.loads(response.read()).get("agents") or {})


def _release(lock: Any) -> None:
    if lock is not None:
        lock.release()


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    from veritas_watch.status import render_text

    status: dict[str, Any]
    try:
        daemon, owned = daemon_or_store(config, "status", wait_s=STATUS_WAIT_S)
    except DaemonStarting as exc:  # what the data dir says would be stale in a moment: say it starts
        status = {"running": False, "starting": True, "pid": exc.pid}
    else:
        if daemon is not None:
            with _request(daemon, "/status") as response:
                status = json.loads(response.read())
        else:
            status = _offline_status(config, owned)
    if args.json:
        print(json_line(json.dumps(status, ensure_ascii=False, indent=2)))
    else:
        print("\n".join(render_text(status)))
    return 0


def _offline_status(config: Config, owned: Any) -> dict[str, Any]:
    """`status` from the data dir of a daemon that is not running (this process holds its lock)."""
    from veritas_watch.openclaw import TranscriptDb
    from veritas_watch.sources.cursors import CursorStore
    from veritas_watch.sources.sqlite_feed import SqliteSource
    from veritas_watch.status import offline_status

    path = config.data_dir / "cursors.sqlite"
    cursors: list[Any] = []
    sqlite: list[SqliteSource] = []
    store = None
    try:
        if path.exists():
            saved = CursorStore(path)
            try:
                cursors = list(saved.load_files().values())
                sqlite = [SqliteSource(TranscriptDb.from_key(db).agent_id, saved.load_sqlite(db))
                          for db in saved.sqlite_dbs()]
            finally:
                saved.close()
        if (config.data_dir / "store").exists() or config.store.url:
            store, _ = _open_offline(config)
        return offline_status(cursors, store, sqlite, (config.state_dir, config.data_dir))
    finally:
        if store is not None:
            store.close()
        _release(owned)


def _export_lines(config: Config, agent: str | None) -> Iterator[str]:
    daemon, owned = daemon_or_store(config, "export")
    if daemon is not None:
        query = f"?agent={urllib.parse.quote(agent)}" if agent else ""
        with _request(daemon, "/export" + query) as response:
            for raw in response:
                if raw.strip():
                    yield raw.decode().rstrip("\n")
        return
    try:
        store, _ = _open_offline(config)
        try:
            for point_id, payload, _ in store.scroll(agent_id=agent):
                yield json.dumps({"id": point_id, "payload": payload}, ensure_ascii=False)
        finally:
            store.close()
    finally:
        _release(owned)


def cmd_export(config: Config, args: argparse.Namespace) -> int:
    for line in _export_lines(config, args.agent):
        sys.stdout.write(json_line(line) + "\n")  # the daemon's lines too: the same JSON, escaped
    sys.stdout.flush()
    return 0


def cmd_doctor(config: Config, args: argparse.Namespace) -> int:
    from veritas_watch.doctor import exit_code, render_report, run_doctor

    checks = run_doctor(config, unit_paths=args.unit, config_error=args.config_error)
    print(json.dumps([c.to_dict() for c in checks], indent=2) if args.json else render_report(checks))
    return exit_code(checks)


def cmd_selftest(config: Config, args: argparse.Namespace) -> int:
    from veritas_watch.selftest import run_selftest

    return run_selftest(config, timeout=args.timeout)


def cmd_creds(config: Config, args: argparse.Namespace) -> int:
    from veritas_watch.daemon import load_redact_key
    from veritas_watch.features.credentials import INDEX_FILE, find_credential
    from veritas_watch.openclaw import agent_workspace, iter_agents

    state_dir = config.state_dir
    agents = [a.agent_id for a in iter_agents(state_dir) if not args.agent or a.agent_id == args.agent]
    if args.agent and args.agent not in agents:
        agents.append(args.agent)
    indexes = {a: agent_workspace(state_dir, a) / INDEX_FILE for a in agents}
    if args.creds_command != "find":
        _list_credentials(config, indexes)
        return 0
    key = load_redact_key(config.data_dir) if config.data_dir.is_dir() else None
    found = find_credential(args.service, index_paths=indexes,
                            env_dirs=[Path(d).expanduser() for d in config.credentials.env_dirs],
                            units=config.credentials.units, environ=os.environ, fingerprint_key=key,
                            reveal=args.reveal and sys.stdout.isatty())
    if args.json:
        rows = [{"source": f.source, "agent": f.agent, "where": f.where, "service": f.service, "key_name": f.key_name,
                 "masked": f.masked, "fingerprint": f.fingerprint, "status": f.status} for f in found]
        print(json_line(json.dumps(rows, ensure_ascii=False)))
    for f in found if not args.json else []:
        shown = f.value if f.value is not None else f.masked
        source = f"{f.source}:{f.agent}" if f.agent else f.source
        print(printable(f"{source}\t{f.service}\t{f.key_name}\t{f.where}\t{shown}"))
    return 0 if found else 1


def _list_credentials(config: Config, indexes: dict[str, Path]) -> None:
    """Each agent's index rows, then the rows still waiting in the data dir (`status` counts both), each
    agent's waiting rows followed by why they wait (on stderr: stdout stays one row a line)."""
    from veritas_watch.features.credentials import IndexStateStore, followed, read_index

    waiting: dict[str, list[Any]] = {}
    for queued in IndexStateStore(config.data_dir).load().pending:
        if queued.agent_id in indexes:
            waiting.setdefault(queued.agent_id, []).append(queued)
    shown = 0
    for agent_id, path in indexes.items():
        for row in read_index(path):
            shown += 1
            print(printable(f"{agent_id}\t{row.service}\t{row.key_name}\t{followed(row.location)}\t{row.status}\t"
                            f"{row.first_seen}\tfp={row.fingerprint}"))
        rows = waiting.get(agent_id, [])
        shown += len(rows)
        for pending in rows:
            entry = pending.entry
            print(printable(f"{agent_id}\t{entry.finding.service}\t{entry.finding.key_name}\t{entry.location}\t"
                            f"pending\t{entry.seen_at}\tfp={entry.finding.fingerprint}"))
        if rows:
            workspace = path.parent
            why = (f"its workspace {workspace} does not exist yet; they are written to its {path.name} when "
                   "OpenClaw creates it (the agent's first run)" if not workspace.is_dir() else
                   f"the running daemon writes them to {path} within a minute"
                   + (" (some wait for the value behind a mask)" if any(r.mask for r in rows) else ""))
            print(printable(f"veritas-watch: {agent_id}: {len(rows)} credential row(s) pending: {why}"),
                  file=sys.stderr)
    if not shown:
        print("veritas-watch: no credentials captured", file=sys.stderr)


def cmd_service(config: Config, args: argparse.Namespace) -> int:
    from veritas_watch.service import cmd_service  # only here: the other commands never need it

    return cmd_service(config, args)


def cmd_forget(config: Config, args: argparse.Namespace) -> int:
    from veritas_watch.features.credentials import IndexKeptChanging
    from veritas_watch.forget import DaemonTooOld, forget_command, render

    daemon, owned = daemon_or_store(config, "forget")
    try:
        erased = forget_command(config, args.agent, args.session, dry_run=args.dry_run, daemon=daemon,
                                open_store=lambda: _open_offline(config)[0])
    except (TimeoutError, DaemonTooOld, IndexKeptChanging) as exc:
        raise CliError(str(exc)) from None
    finally:
        _release(owned)
    if args.json:
        print(json.dumps({"agent": args.agent, "session": args.session, "dry_run": args.dry_run, **erased.to_dict()}))
    else:
        print("\n".join(printable(line) for line in render(args.agent, args.session, erased, dry_run=args.dry_run)))
    return 0


def _fallback_config() -> Config:
    """What `doctor` checks when the config file cannot be used: the environment's settings without the file,
    else the built-in defaults (the state dir from $OPENCLAW_STATE_DIR still)."""
    environ = {k: v for k, v in os.environ.items() if k != "VERITAS_WATCH_CONFIG"}
    try:
        return load_config(None, environ)
    except ConfigError:  # an environment override is the bad part
        keep = ("OPENCLAW_STATE_DIR", "OPENCLAW_HOME", "HOME")
        return load_config(None, {k: v for k, v in environ.items() if k in keep})


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config_error: str | None = None
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        if args.command != "doctor":
            print(f"veritas-watch: config error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        config_error, config = f"config error: {exc}", _fallback_config()  # doctor reports it with the rest
    args.config_error = config_error
    if getattr(args, "agent", None) is not None:  # an agent id is never more than one (OpenClaw's rule)
        from veritas_watch.openclaw import InvalidAgentId, canonical_agent_id

        try:
            args.agent = canonical_agent_id(args.agent)
        except InvalidAgentId as exc:
            print(f"veritas-watch: --agent: {exc}", file=sys.stderr)
            return EXIT_CONFIG
    # Commands other than the daemon keep stdout for their output: logs go to stderr, warnings only.
    daemon_like = args.command in ("run", "backfill")
    logsetup.configure_logging(config.log.level if daemon_like else "warning", config.log.format,
                               stream=sys.stdout if daemon_like else sys.stderr)
    try:
        if args.command in ("run", "backfill"):
            return cmd_run(config, once=args.command == "backfill")
        handlers = {"search": cmd_search, "status": cmd_status, "export": cmd_export, "doctor": cmd_doctor,
                    "selftest": cmd_selftest, "creds": cmd_creds, "service": cmd_service,
                    "forget": cmd_forget}
        return handlers[args.command](config, args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except DaemonStarting as exc:
        print(f"veritas-watch: {exc}", file=sys.stderr)
        return EXIT_DATA_DIR_OWNED
    except (CliError, StoreError) as exc:  # StoreError: the store cannot be opened (disk full, damaged)
        print(f"veritas-watch: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # an unusable data dir, a file that cannot be read: one line, not a traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"veritas-watch: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
