"""Where OpenClaw keeps things, and its file naming rules (facts from OpenClaw's source).

Agent workspaces and openclaw.json follow OpenClaw 2026.9.6 (`OPENCLAW_VERSION`) exactly: each rule
names the OpenClaw function (in the npm package's `dist/*.mjs`) it was ported from.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import time
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import json5

from veritas_watch.log import echoed

# An agent's directory name as OpenClaw writes it: `normalizeAgentId`'s output for a valid id
# (`agents/<id>/`, `paths-*.mjs` `resolveAgentSessionsDir`): lower case, `[a-z0-9][a-z0-9_-]{0,63}`.
# An agent id as OpenClaw leaves it after `normalizeAgentId`: the names of its `agents/<id>/` dirs. Never a
# `.`, `/` or space: always one path component. (`_x` is one: OpenClaw keeps it, though `isValidAgentId`
# would refuse it as input.)
AGENT_ID = re.compile(r"(?!-)[a-z0-9_-]{1,64}(?<!-)", re.ASCII)
LEGACY_STATE_DIRS = (".clawdbot", ".moldbot", ".moltbot")
DEFAULT_AGENT = "main"
SQLITE_NAME = "openclaw-agent.sqlite"

# `<id>.jsonl`, `<id>-topic-<t>.jsonl`, and the history archives `.reset.<ts>` / `.deleted.<ts>`.
_LIVE = re.compile(r"^(?P<stem>[^/]+)\.jsonl$")
_ARCHIVE = re.compile(r"^(?P<stem>[^/]+)\.jsonl\.(?P<kind>reset|deleted)\.(?P<ts>[^/]+)$")
# Derived copies and runtime traces: indexing them would double-index or add non-conversation.
# Staging files (`<archive>.<digest>.<uuid>.jsonl-stage`, then `<archive>.zst.<uuid>.stage`, written while
# OpenClaw 2026.9 archives a deleted session) are unfinished copies; compressed archives (`.zst`) are not read
# by the tailer.
_DERIVED = re.compile(r"\.(bak\.|checkpoint\.)|\.trajectory|\.lock$|-tmp$|\.tmp$|\.zst$|\.zst\.|[.-]stage$|\.part$")

TranscriptKind = Literal["live", "reset", "deleted"]


@dataclass(frozen=True, slots=True)
class TranscriptName:
    session_stem: str  # the file's session id (may differ from the header id)
    kind: TranscriptKind
    archived_at: str | None  # the `<ts>` of an archive name


def classify_transcript(name: str) -> TranscriptName | None:
    """Name rules for files in `sessions/`: None means "not a transcript to index"."""
    if name.startswith(".") or _DERIVED.search(name):
        return None
    if m := _LIVE.match(name):
        stem = m["stem"]
        if ".checkpoint." in stem or stem.endswith(".trajectory"):
            return None
        return TranscriptName(stem, "live", None)
    if m := _ARCHIVE.match(name):
        kind: TranscriptKind = "reset" if m["kind"] == "reset" else "deleted"
        return TranscriptName(m["stem"], kind, m["ts"])
    return None


def resolve_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The state dir exactly as OpenClaw resolves it."""
    env = os.environ if environ is None else environ
    for var in ("OPENCLAW_STATE_DIR", "CLAWDBOT_STATE_DIR"):
        if value := env.get(var, "").strip():
            return Path(value).expanduser()
    home = Path(env["OPENCLAW_HOME"]).expanduser() if env.get("OPENCLAW_HOME") else Path.home()
    profile = env.get("OPENCLAW_PROFILE", "").strip()
    if profile and profile != "default":
        return home / f".openclaw-{profile}"
    primary = home / ".openclaw"
    if primary.exists():
        return primary
    for legacy in LEGACY_STATE_DIRS:
        if (home / legacy).is_dir():
            return home / legacy
    return primary


# ---------------------------------------------------------------------------------------------
# Workspaces and openclaw.json, as OpenClaw 2026.9.6 resolves them.
#
# Every rule below is ported from the compiled npm package (`dist/*.mjs`); the OpenClaw function
# each one follows is named in its docstring. Nothing here creates a directory or writes a file.

OPENCLAW_VERSION = "2026.9.6"  # the OpenClaw release these rules were read from and checked against
CONFIG_FILENAME = "openclaw.json"
_LEGACY_CONFIG_FILENAMES = ("clawdbot.json",)
_STATE_DIR_VAR = "OPENCLAW_STATE_DIR"

# JavaScript's String.prototype.trim() set (Python's str.strip() differs: it keeps U+FEFF, drops U+001C-1F).
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
_VALID_AGENT_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}", re.IGNORECASE | re.ASCII)
_INVALID_AGENT_ID_CHARS = re.compile(r"[^a-z0-9_-]+")
_PORTABLE_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_VAR_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_TERMUX_PREFIX = re.compile(r"(?:^|/)com\.termux/files/usr/?$")
# Config `env` entries OpenClaw refuses to apply (isBlockedConfigEnvVar). Its full host-env policy
# also refuses ~250 process-hijack names (NODE_OPTIONS, LD_*, ...); none of those enters a path.
_CONFIG_ENV_BLOCKED = frozenset({
    "OPENCLAW_ALLOW_OLDER_BINARY_DESTRUCTIVE_ACTIONS", "OPENCLAW_INCLUDE_ROOTS", "OPENCLAW_CONFIG_READONLY",
    "HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME",
})
_INCLUDE_KEY = "$include"
_MAX_INCLUDE_DEPTH = 10
_MAX_INCLUDE_BYTES = 2 * 1024 * 1024
_MAX_INCLUDE_PATH = 4096
_MAX_DOTENV_BYTES = 1024 * 1024
_BLOCKED_OBJECT_KEYS = frozenset({"__proto__", "prototype", "constructor"})
# npm `dotenv` 17's LINE pattern (OpenClaw parses `.env` files with it), `\w` spelled out as ASCII.
_DOTENV_LINE = re.compile(
    r"^\s*(?:export\s+)?([A-Za-z0-9_.-]+)(?:\s*=\s*?|:\s+?)"
    r"(\s*'(?:\\'|[^'])*'|\s*\"(?:\\\"|[^\"])*\"|\s*`(?:\\`|[^`])*`|[^#\r\n]+)?\s*(?:#.*)?$",
    re.MULTILINE,
)
_DOTENV_QUOTED = re.compile(r"^(['\"`])([\s\S]*)\1$", re.MULTILINE)


def _trim(value: object) -> str:
    return value.strip(_JS_SPACE) if isinstance(value, str) else ""


def normalize_agent_id(value: object) -> str:
    """OpenClaw's `normalizeAgentId`: lower-cased; other characters become `-`; empty means `main`.

    A valid id (`[a-z0-9][a-z0-9_-]{0,63}`, any case) is just lower-cased. Anything else is
    lower-cased, each run of characters outside `[a-z0-9_-]` becomes one `-`, leading and trailing
    dashes go and it is cut to 64 characters; `_x` stays `_x`, `My Agent!` becomes `my-agent`.
    """
    trimmed = _trim(value)
    lowered = trimmed.lower()
    if _VALID_AGENT_ID.fullmatch(trimmed):
        return lowered
    agent_id = _INVALID_AGENT_ID_CHARS.sub("-", lowered).lstrip("-").rstrip("-")[:64]
    return agent_id or DEFAULT_AGENT


class InvalidAgentId(ValueError):
    """An agent id that is not one by OpenClaw's rule (`isValidAgentId`): it never becomes a path."""


def is_valid_agent_id(value: object) -> bool:
    """OpenClaw's `isValidAgentId` (packages/normalization-core/src/agent-id.ts): after trimming,
    `^[a-z0-9][a-z0-9_-]{0,63}$`, any case. No `/`, `.`, `..`, spaces or absolute paths."""
    return isinstance(value, str) and _VALID_AGENT_ID.fullmatch(_trim(value)) is not None


def canonical_agent_id(value: object) -> str:
    """The id a valid agent id names (OpenClaw's gateway: `isValidAgentId`, then `normalizeAgentId`):
    trimmed and lower-cased; or an id already in OpenClaw's normal form (`AGENT_ID`: what it names an
    agent configured as `_x`). Anything else raises InvalidAgentId, never a guess at another agent."""
    if isinstance(value, str) and AGENT_ID.fullmatch(_trim(value)):
        return _trim(value)
    if not is_valid_agent_id(value):
        # Echoed only when short: a caller may have pasted a key where the id goes (answers and logs hold no secret).
        raise InvalidAgentId(f"not an OpenClaw agent id: {echoed(value)} (allowed: a letter or digit, then up to 63 "
                             "letters, digits, '_' or '-')")
    return _trim(value).lower()


def is_agent_dir_name(name: str) -> bool:
    """Whether a directory under `agents/` is one OpenClaw could have made (`AGENT_ID`)."""
    return AGENT_ID.fullmatch(name) is not None


# Session ids and the transcript file names built from them (src/config/sessions/paths.ts and
# artifacts.ts, compiled into `dist/paths-*.mjs` and `dist/artifacts-*.mjs` of 2026.9.6).
_SESSION_ID_MAX_CHARS = 128  # SAFE_SESSION_ID_RE: one character, then {0,127} (code points: the `u` flag)
_CHECKPOINT_TRANSCRIPT = re.compile(  # COMPACTION_CHECKPOINT_TRANSCRIPT_RE
    r"(.+)\.checkpoint\.[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.jsonl",
    re.IGNORECASE | re.ASCII | re.DOTALL)
_ARCHIVE_STAMP = re.compile(  # ARCHIVE_SUFFIX_RE: formatSessionArchiveTimestamp, then an optional generation
    r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d{3})?Z(?:\.[0-9a-f]{32})?", re.ASCII)
_URI_COMPONENT = re.compile(r"[A-Za-z0-9\-_.!~*'()%]+", re.ASCII)  # what encodeURIComponent leaves
_TOPIC_MARK = "-topic-"
ZSTD_SUFFIX = ".zst"  # SESSION_ARCHIVE_ZSTD_SUFFIX


class InvalidSessionId(ValueError):
    """A session id that is not one by OpenClaw's rule (`validateSessionId`)."""


def validate_session_id(value: object) -> str:
    """OpenClaw's `validateSessionId` (dist/paths-*.mjs): the trimmed id, NFC-normalized already, matching
    `SAFE_SESSION_ID_RE = /^[\\p{L}\\p{N}][\\p{L}\\p{N}\\p{M}._-]{0,127}$/u`, with `<id>.jsonl` at most 255
    UTF-8 bytes and not a compaction checkpoint's name. So: one path component, never starting with `-` or `.`,
    no space, quote, `$`, `;`, `/` or control character. Unicode classes are this Python's `unicodedata`
    (a letter OpenClaw's newer tables know and Python does not is refused: stricter, never looser).
    Raises InvalidSessionId, echoing the value only as `log.echoed` shows one."""
    trimmed = _trim(value)
    ok = (isinstance(value, str) and 0 < len(trimmed) <= _SESSION_ID_MAX_CHARS
          and unicodedata.normalize("NFC", trimmed) == trimmed
          and unicodedata.category(trimmed[0])[0] in "LN"
          and all(ch in "._-" or unicodedata.category(ch)[0] in "LNM" for ch in trimmed[1:])
          and len(f"{trimmed}.jsonl".encode()) <= 255
          and not _CHECKPOINT_TRANSCRIPT.fullmatch(f"{trimmed}.jsonl"))
    if not ok:
        raise InvalidSessionId(f"not an OpenClaw session id: {echoed(value)}")
    return trimmed


def is_valid_session_id(value: object) -> bool:
    try:
        return validate_session_id(value) == value  # as OpenClaw names it: no surrounding space either
    except InvalidSessionId:
        return False


def session_transcript_name(name: str) -> str | None:
    """The session id of a transcript file named exactly as OpenClaw names one, else None:
    `resolveSessionTranscriptPathInDir`'s `<id>.jsonl` or `<id>-topic-<encodeURIComponent(topic)>.jsonl`
    (at most 255 bytes), as is or archived (`<name>.<reset|deleted>.<ARCHIVE_SUFFIX_RE>`, `hasArchiveSuffix`),
    plain or compressed (`.zst`); derived copies (`classify_transcript`) are none."""
    if name.endswith(ZSTD_SUFFIX):
        name = name[: -len(ZSTD_SUFFIX)]
    classified = classify_transcript(name)
    if classified is None or len(f"{classified.session_stem}.jsonl".encode()) > 255:
        return None
    if classified.archived_at is not None and not _ARCHIVE_STAMP.fullmatch(classified.archived_at):
        return None
    stem = classified.session_stem
    rebuilt = f"{stem}.jsonl" + (f".{classified.kind}.{classified.archived_at}" if classified.archived_at else "")
    if rebuilt != name:  # `$` also matches before a trailing newline: the name must be exactly the rule's
        return None
    if is_valid_session_id(stem):
        return stem
    at = stem.find(_TOPIC_MARK)
    while at != -1:  # the id itself may hold `-topic-`: try each split
        sid, topic = stem[:at], stem[at + len(_TOPIC_MARK):]
        if is_valid_session_id(sid) and _URI_COMPONENT.fullmatch(topic):
            return sid
        at = stem.find(_TOPIC_MARK, at + 1)
    return None


def session_artifact_dir(database: Path) -> Path:
    """Where OpenClaw writes a transcript database's archives (`resolveSessionArtifactDirectory`): the
    `sessions/` beside an `agent/` directory, else the database's own directory."""
    store_dir = database.parent
    return store_dir.parent / "sessions" if store_dir.name == "agent" else store_dir


def _js_resolve(raw: str, base: Path | str) -> Path:
    """Node's `path.resolve(base, raw)`: absolute, `.`/`..` folded, no trailing slash."""
    resolved = os.path.normpath(os.path.join(os.path.abspath(base), raw)).replace("\0", "")
    return Path("/" + resolved.lstrip("/")) if resolved.startswith("//") else Path(resolved)


def _home_value(value: str | None) -> str | None:
    """`normalizeHomeDirValue`: trimmed, and the strings "undefined"/"null" count as unset."""
    trimmed = _trim(value)
    return trimmed if trimmed and trimmed not in ("undefined", "null") else None


def _raw_os_home(env: Mapping[str, str]) -> str | None:
    """`resolveRawOsHomeDir`: HOME, USERPROFILE, Termux's home, then the password database."""
    if home := _home_value(env.get("HOME")) or _home_value(env.get("USERPROFILE")):
        return home
    prefix = _home_value(env.get("PREFIX"))
    if prefix and _home_value(env.get("ANDROID_DATA")) and _TERMUX_PREFIX.search(prefix.replace("\\", "/")):
        return str(_js_resolve(os.path.join(prefix, "..", "home"), os.getcwd()))
    try:
        import pwd

        return _home_value(pwd.getpwuid(os.getuid()).pw_dir)
    except (ImportError, KeyError):
        return None


def openclaw_home(environ: Mapping[str, str] | None = None) -> Path:
    """The home dir OpenClaw uses: `resolveRequiredHomeDir` (`resolveEffectiveHomeDir`).

    `$OPENCLAW_HOME` (a leading `~` in it means the OS home), else `$HOME`, `$USERPROFILE`, Termux's
    home, the password database; with none of them, the current directory.
    """
    env = os.environ if environ is None else environ
    explicit = _home_value(env.get("OPENCLAW_HOME"))
    if explicit is None:
        raw = _raw_os_home(env)
    elif explicit == "~" or explicit.startswith(("~/", "~\\")):
        os_home = _raw_os_home(env)
        raw = os_home + explicit[1:] if os_home else None
    else:
        raw = explicit
    return _js_resolve(raw, os.getcwd()) if raw else Path.cwd()


def _user_path(raw: str, home: Path, cwd: Path) -> Path:
    """`resolveUserPath`: trimmed; a leading `~` (alone, `~/`, `~\\`) is the home; then `path.resolve`.

    `~user/x` is not expanded: it is a relative path, like any other relative path resolved against
    OpenClaw's working directory (here `cwd`).
    """
    text = _trim(raw)
    if text == "~" or text.startswith(("~/", "~\\")):
        text = str(home) + text[1:]
    return _js_resolve(text, cwd)


@dataclass(frozen=True, slots=True)
class _Context:
    """What OpenClaw's path rules read besides openclaw.json: its env, home, state dir and cwd."""

    state_dir: Path
    env: Mapping[str, str]
    home: Path
    state_dir_overridden: bool  # OpenClaw was told its state dir (OPENCLAW_STATE_DIR, `--profile`)
    cwd: Path


def _default_agent_workspace(ctx: _Context) -> Path:
    """`resolveDefaultAgentWorkspaceDir` (dist/workspace-default-*.mjs).

    `$OPENCLAW_WORKSPACE_DIR` (only `path.resolve`d: a `~` in it is NOT expanded); else, when the
    state dir was set (`OPENCLAW_STATE_DIR`, which `--profile <p>` sets), `<state dir>/workspace`;
    else with `$OPENCLAW_PROFILE` (not "default") `<home>/.openclaw-<profile>/workspace`; else
    `<home>/.openclaw/workspace`, even when the state dir is a legacy `~/.clawdbot`.
    """
    if workspace := _trim(ctx.env.get("OPENCLAW_WORKSPACE_DIR")):
        return _js_resolve(workspace, ctx.cwd)
    if ctx.state_dir_overridden:
        return ctx.state_dir / "workspace"
    profile = _trim(ctx.env.get("OPENCLAW_PROFILE"))
    if profile and profile.lower() != "default":
        return ctx.home / f".openclaw-{profile}" / "workspace"
    return ctx.home / ".openclaw" / "workspace"


# -- the agent roster (dist/agent-scope-config-*.mjs, src/agents/agent-roster.ts) -------------


def _agents_section(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    agents = config.get("agents")
    return agents if isinstance(agents, Mapping) else None


def _roster(config: Mapping[str, Any]) -> tuple[Literal["entries", "list"], Any] | None:
    """`readAgentRosterProperty`: `agents.entries` when present (even null), else `agents.list`.

    With both present, `entries` wins and `list` is ignored (OpenClaw then rejects the config:
    "Unrecognized key: list").
    """
    agents = _agents_section(config)
    if agents is None:
        return None
    if "entries" in agents:
        return "entries", agents["entries"]
    if "list" in agents:
        return "list", agents["list"]
    return None


def _list_entries(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """`listAgentEntries` (`collectAgentEntries`): keyed entries get their key as `id`."""
    roster = _roster(config)
    if roster is None:
        return []
    kind, value = roster
    if kind == "entries":
        if not isinstance(value, Mapping):
            return []
        return [{**entry, "id": key} for key, entry in value.items() if isinstance(entry, Mapping)]
    if not isinstance(value, list):
        return []
    # Any non-null object counts in a list, arrays too (an array has no id: it normalizes to `main`).
    return [entry if isinstance(entry, Mapping) else {} for entry in value if isinstance(entry, Mapping | list)]


def _list_agent_ids(config: Mapping[str, Any]) -> list[str]:
    """`listAgentIds`: configured ids, normalized, first wins; no roster at all means `[main]`."""
    entries = _list_entries(config)
    if not entries and _roster(config) is None:
        return [DEFAULT_AGENT]
    return list(dict.fromkeys(normalize_agent_id(entry.get("id")) for entry in entries))


def _sole_agent_id(config: Mapping[str, Any]) -> str | None:
    """`tryResolveSoleAgentId`: the one configured agent (ownership does not matter); `main` if no roster."""
    entries = _list_entries(config)
    if not entries:
        return DEFAULT_AGENT if _roster(config) is None else None
    return normalize_agent_id(entries[0].get("id")) if len(entries) == 1 else None


def _raw_legacy_default_id(config: Mapping[str, Any]) -> str | None:
    """`tryResolveRawLegacyDefaultAgentId`: exactly one `default: true` entry, unless ownership is explicit."""
    agents = _agents_section(config)
    if agents is not None and agents.get("ownership") == "explicit":
        return None
    marked = [entry for entry in _list_entries(config) if entry.get("default") is True]
    return normalize_agent_id(marked[0].get("id")) if len(marked) == 1 else None


def _legacy_data_owner(config: Mapping[str, Any], retained: str | None) -> str | None:
    """`tryResolveLegacyDataOwner`: the agent that inherits the default workspace, if any.

    The legacy default OpenClaw retained while migrating the roster (when it is still configured),
    else `tryResolveDefaultAgentId`: the raw `default: true` marker, else the sole agent.
    """
    if retained and retained in _list_agent_ids(config):
        return retained
    return _raw_legacy_default_id(config) or _sole_agent_id(config)


def _agent_entry(config: Mapping[str, Any], agent_id: str) -> Mapping[str, Any] | None:
    """`resolveAgentEntry`: the first entry whose id normalizes to `agent_id`."""
    roster = _roster(config)
    if roster is None:
        return None
    kind, value = roster
    if kind == "entries":
        if isinstance(value, Mapping):
            for key, entry in value.items():
                if isinstance(entry, Mapping) and normalize_agent_id(key) == agent_id:
                    return {**entry, "id": key}
        return None
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, Mapping | list):
                found = entry if isinstance(entry, Mapping) else {}
                if normalize_agent_id(found.get("id")) == agent_id:
                    return found
    return None


def _parse_legacy_list(value: object) -> dict[str, dict[str, Any]] | None:
    """`parseLegacyAgentRoster`: `agents.list` as keyed entries, or None when it cannot convert.

    Every item must be an object whose `id` is a string that is already trimmed, already
    normalized (so `Ops` or `my.agent` fail) and unique.
    """
    if not isinstance(value, list):
        return None
    entries: dict[str, dict[str, Any]] = {}
    for entry in value:
        if not isinstance(entry, Mapping):
            return None
        agent_id = entry.get("id")
        if not isinstance(agent_id, str) or not agent_id or _trim(agent_id) != agent_id:
            return None
        if normalize_agent_id(agent_id) != agent_id or agent_id in entries:
            return None
        entries[agent_id] = {key: item for key, item in entry.items() if key != "id"}
    return entries


def _first_legacy_agent_pin(agents: Mapping[str, Any], entries: list[Mapping[str, Any]],
                            ctx: _Context) -> str | None:
    """`resolveLegacyFirstAgentWorkspacePin`: where the first of several legacy agents keeps working.

    Only with no `ownership` key, more than one entry and no `default` marker anywhere (absent or
    false): the first entry, if it has no workspace of its own, is pinned to
    `agents.defaults.workspace`, else to the default workspace (`resolveLegacyAgentWorkspacePin`).
    """
    if "ownership" in agents or len(entries) < 2:
        return None
    if any("default" in entry and entry["default"] is not False for entry in entries):
        return None
    first = entries[0]
    own = first.get("workspace")
    if "workspace" in first and not (isinstance(own, str) and not _trim(own)):
        return None
    defaults = agents.get("defaults")
    fallback = _trim(defaults.get("workspace")) if isinstance(defaults, Mapping) else ""
    return fallback or str(_default_agent_workspace(ctx))


def _migrate_roster(config: Mapping[str, Any], ctx: _Context) -> tuple[Mapping[str, Any], str | None]:
    """`migratePersistedImplicitMainRoster` (dist/legacy.roster-*.mjs), run on every config read.

    Returns the config OpenClaw resolves against and the legacy default it retains:
    - a convertible `agents.list` becomes keyed `agents.entries` (an inconvertible one stays a list,
      and OpenClaw then rejects the config; resolution still reads the list as it is);
    - no roster (or an empty one) without `ownership: "explicit"` means `entries: {main: {}}`;
    - a converted list of several agents without any `default` marker pins the first agent's
      workspace (see `_first_legacy_agent_pin`): the old "first listed is the default" layout;
    - with several agents and exactly one `default: true` (ownership not explicit) that agent is
      retained as the legacy default and the markers are dropped.
    """
    if "agents" in config and not isinstance(config.get("agents"), Mapping):
        return config, None
    agents: Mapping[str, Any] = _agents_section(config) or {}
    legacy_order: list[str] | None = None
    roster = _roster({"agents": agents})
    if roster is not None and roster[0] == "list":
        converted = _parse_legacy_list(roster[1])
        if converted is None:
            return config, None
        legacy_order = list(converted)
        agents = {**{key: value for key, value in agents.items() if key != "list"}, "entries": converted}
        roster = ("entries", converted)
    entries = roster[1] if roster is not None else None
    if roster is None or (isinstance(entries, Mapping) and not entries):
        if agents.get("ownership") == "explicit":
            return ({**config, "agents": agents} if legacy_order is not None else config), None
        return {**config, "agents": {**agents, "entries": {DEFAULT_AGENT: {}}}}, None
    if not isinstance(entries, Mapping):
        return config, None
    valid_ids = legacy_order if legacy_order is not None else [
        key for key, entry in entries.items() if isinstance(entry, Mapping)]
    if not valid_ids:
        return config, None
    if any("default" in entries[key] and not isinstance(entries[key]["default"], bool) for key in valid_ids):
        return config, None
    marked = [key for key in valid_ids if entries[key].get("default") is True]
    has_marker = agents.get("ownership") != "explicit" and len(marked) == 1
    legacy_default = marked[0] if len(valid_ids) > 1 and has_marker else None
    new_entries: dict[str, Any] = dict(entries)
    if legacy_order is not None and legacy_default is None:
        pin = _first_legacy_agent_pin(agents, [entries[key] for key in legacy_order], ctx)
        if pin is not None:
            new_entries[legacy_order[0]] = {**entries[legacy_order[0]], "workspace": pin}
    if has_marker:
        new_entries = {key: ({k: v for k, v in entry.items() if k != "default"} if isinstance(entry, Mapping)
                             else entry) for key, entry in new_entries.items()}
    retained = normalize_agent_id(legacy_default) if legacy_default else None
    return {**config, "agents": {**agents, "entries": new_entries}}, retained


def _resolve_agent_workspace(config: Mapping[str, Any], agent_id: str, retained: str | None,
                             ctx: _Context) -> Path:
    """`resolveAgentWorkspaceDir` (dist/agent-scope-config-*.mjs)."""
    agent = normalize_agent_id(agent_id)
    entry = _agent_entry(config, agent)
    if entry is None and _roster(config) is None and agent == DEFAULT_AGENT:
        entry = {"id": agent}  # `resolveAgentConfig`: the implicit `main`
    configured = entry.get("workspace") if entry is not None else None
    if configured := _trim(configured):
        return _user_path(configured, ctx.home, ctx.cwd)
    agents = _agents_section(config)
    defaults = agents.get("defaults") if agents is not None else None
    fallback = _trim(defaults.get("workspace")) if isinstance(defaults, Mapping) else ""
    if agent == _legacy_data_owner(config, retained):
        return _user_path(fallback, ctx.home, ctx.cwd) if fallback else _default_agent_workspace(ctx)
    if fallback:
        return _user_path(fallback, ctx.home, ctx.cwd) / agent
    return ctx.state_dir / f"workspace-{agent}"


def workspace_for(
    state_dir: Path,
    agent_id: str,
    openclaw_config: Mapping[str, Any] | None = None,
    *,
    profile: str | None = None,
    home: Path | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Path:
    """The agent's workspace dir exactly as OpenClaw 2026.9.6's `resolveAgentWorkspaceDir` gives it.

    `openclaw_config` is openclaw.json as read (either roster shape; `load_openclaw_config`); it
    first goes through OpenClaw's roster migration (`_migrate_roster`). Then, in order:

    1. the agent's own `workspace` (`agents.entries.<id>` or `agents.list[]`, matched by
       normalized id), `~`-expanded and resolved;
    2. the agent that inherits the default workspace (`tryResolveLegacyDataOwner`: the legacy
       `default: true` agent when ownership is not explicit, else the sole configured agent, else
       none; `main` when there is no roster) gets `agents.defaults.workspace` itself, else the
       default workspace (`resolveDefaultAgentWorkspaceDir`). With `ownership: "explicit"` and
       several agents nobody inherits it, `main` included;
    3. any other agent: `<agents.defaults.workspace>/<id>`, else `<state_dir>/workspace-<id>`.

    The context: `environ` is OpenClaw's environment (OPENCLAW_WORKSPACE_DIR, OPENCLAW_STATE_DIR,
    OPENCLAW_PROFILE, OPENCLAW_HOME, HOME); `profile` overrides its OPENCLAW_PROFILE; `home` is its
    home (default: from `environ`). With `home` or `environ` given and no OPENCLAW_STATE_DIR in
    `environ`, OpenClaw found its state dir from the home, and its default workspace is
    `<home>/.openclaw[-<profile>]/workspace`; with neither, `state_dir` counts as set explicitly
    and the default workspace is `<state_dir>/workspace`. Relative paths resolve against `cwd`:
    OpenClaw uses its process cwd (the shell's for the CLI, the user's home for the Linux systemd
    user service, the state dir for the macOS LaunchAgent); the default here is `state_dir`.
    """
    env: dict[str, str] = dict(environ) if environ is not None else {}
    if profile is not None:
        env["OPENCLAW_PROFILE"] = profile
    explicit_state = (environ is None and home is None) or bool(_trim(env.get(_STATE_DIR_VAR)))
    home_dir = home if home is not None else openclaw_home(env if environ is not None else None)
    ctx = _Context(Path(state_dir), env, Path(home_dir), explicit_state, Path(cwd) if cwd else Path(state_dir))
    config, retained = _migrate_roster(openclaw_config or {}, ctx)
    return _resolve_agent_workspace(config, agent_id, retained, ctx)


# -- reading openclaw.json (dist/io.read-helpers-*.mjs, includes-*.mjs, redact-*.mjs) ----------


class _IncludeError(Exception):
    """A `$include` OpenClaw would reject (which makes it reject the whole config)."""


def _parse_json5(text: str) -> Any:
    """`parseJsonWithJson5Fallback`: strict JSON first, else JSON5 (comments, trailing commas, ...)."""
    try:
        return json.loads(text)
    except ValueError:
        return json5.loads(text)


def _sanitize(value: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _sanitize(item) if isinstance(item, Mapping) else item
            for key, item in value.items() if key not in _BLOCKED_OBJECT_KEYS}


def _deep_merge(base: Any, override: Any) -> Any:
    """`mergeDeep(..., {arrays: "concat"})` as `$include` uses it: objects merge, arrays concatenate,
    anything else is replaced by the override; `__proto__`/`prototype`/`constructor` keys are dropped."""
    if isinstance(base, list) and isinstance(override, list):
        return [*base, *override]
    if not isinstance(base, Mapping) or not isinstance(override, Mapping):
        return override
    merged = _sanitize(base)
    for key, value in override.items():
        if key in _BLOCKED_OBJECT_KEYS:
            continue
        current = merged.get(key)
        if isinstance(value, Mapping):
            merged[key] = _deep_merge(current, value) if isinstance(current, Mapping) else _sanitize(value)
        elif isinstance(value, list) and isinstance(current, list):
            merged[key] = [*current, *value]
        else:
            merged[key] = value
    return merged


def _inside(root: str, candidate: str) -> bool:
    return candidate == root or candidate.startswith(root.rstrip("/") + "/")


class _Includes:
    """`resolveConfigIncludes` (`IncludeProcessor`): `{"$include": "a.json5"}` or a list of paths.

    A path is relative to the file that names it and must stay (also through symlinks) inside the
    directory of openclaw.json or one of `$OPENCLAW_INCLUDE_ROOTS`; at most 10 levels deep, no
    cycles, files up to 2 MiB, JSON5. Several files merge in order; sibling keys of `$include`
    are merged over the included object (`deepMerge`).
    """

    def __init__(self, config_path: Path, roots: list[str]) -> None:
        config_dir = os.path.normpath(os.path.abspath(config_path.parent))
        self.roots = [(config_dir, os.path.realpath(config_dir))]
        self.roots += [(os.path.normpath(r), os.path.realpath(r)) for r in roots]
        self.looked_at: list[str] = []  # the files an include named, read or not (`_ReadConfig.files`)

    def process(self, value: Any, base: str, visited: frozenset[str], depth: int) -> Any:
        if isinstance(value, list):
            return [self.process(item, base, visited, depth) for item in value]
        if not isinstance(value, Mapping):
            return value
        if _INCLUDE_KEY not in value:
            return {key: self.process(item, base, visited, depth) for key, item in value.items()}
        spec = value[_INCLUDE_KEY]
        if isinstance(spec, str):
            included = self.load(spec, base, visited, depth)
        elif isinstance(spec, list):
            included = {}
            for item in spec:
                if not isinstance(item, str):
                    raise _IncludeError(f"invalid $include array item: {item!r}")
                included = _deep_merge(included, self.load(item, base, visited, depth))
        else:
            raise _IncludeError(f"invalid $include value: {spec!r}")
        rest = {key: item for key, item in value.items() if key != _INCLUDE_KEY}
        if not rest:
            return included
        if not isinstance(included, Mapping):
            raise _IncludeError("sibling keys of $include need the included content to be an object")
        return _deep_merge(included, {key: self.process(item, base, visited, depth) for key, item in rest.items()})

    def load(self, include: str, base: str, visited: frozenset[str], depth: int) -> Any:
        if "\0" in include or len(include) >= _MAX_INCLUDE_PATH:
            raise _IncludeError(f"bad include path: {include!r}")
        resolved = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(base)), include))
        lexical = next((r for r in self.roots if _inside(r[0], resolved)), None)
        if lexical is None:
            raise _IncludeError(f"include path escapes the config directory: {include}")
        real = os.path.realpath(resolved)
        if os.path.lexists(resolved) and not any(_inside(r[1], real) for r in self.roots):
            raise _IncludeError(f"include path resolves outside the config directory: {include}")
        if resolved in visited:
            raise _IncludeError(f"circular include: {include}")
        if depth >= _MAX_INCLUDE_DEPTH:
            raise _IncludeError(f"include depth over {_MAX_INCLUDE_DEPTH}: {include}")
        self.looked_at.append(real)
        try:
            stat = os.stat(real)
            if not os.path.isfile(real) or stat.st_size > _MAX_INCLUDE_BYTES or stat.st_nlink > 1:
                raise _IncludeError(f"include is not a regular file of at most 2 MiB without hardlinks: {include}")
            parsed = json5.loads(Path(real).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise _IncludeError(f"cannot read include {include}: {exc}") from exc
        return self.process(parsed, resolved, visited | {resolved}, depth + 1)


def _env_token(text: str, index: int) -> tuple[str, str, int] | None:
    """`parseEnvTokenAt`: `$${NAME}` (an escape) or `${NAME}` at `index`; NAME is upper-case only."""
    for kind, opener in (("escaped", "$${"), ("substitution", "${")):
        if text.startswith(opener, index):
            start = index + len(opener)
            end = text.find("}", start)
            if end != -1 and _ENV_VAR_NAME.fullmatch(text[start:end]):
                return kind, text[start:end], end
    return None


def _substitute(text: str, env: Mapping[str, str], missing: list[str]) -> str:
    """`substituteString`: `${VAR}` is replaced (a missing or empty one stays as written, with a
    warning), `$${VAR}` is the literal `${VAR}`."""
    if "$" not in text:
        return text
    out: list[str] = []
    index = 0
    while index < len(text):
        token = _env_token(text, index) if text[index] == "$" else None
        if token is None:
            out.append(text[index])
            index += 1
            continue
        kind, name, end = token
        if kind == "substitution" and env.get(name):
            out.append(env[name])
        else:
            out.append("${" + name + "}")
            if kind == "substitution":
                missing.append(name)
        index = end + 1
    return "".join(out)


def _substitute_all(value: Any, env: Mapping[str, str], missing: list[str]) -> Any:
    if isinstance(value, str):
        return _substitute(value, env, missing)
    if isinstance(value, list):
        return [_substitute_all(item, env, missing) for item in value]
    if isinstance(value, Mapping):
        return {key: _substitute_all(item, env, missing) for key, item in value.items()}
    return value


def _has_env_reference(text: str) -> bool:
    """`containsEnvVarReference`: an unescaped `${VAR}`."""
    index = 0
    while index < len(text):
        token = _env_token(text, index) if text[index] == "$" else None
        if token is not None and token[0] == "substitution":
            return True
        index = token[2] + 1 if token is not None else index + 1
    return False


def _config_env_vars(config: Mapping[str, Any]) -> dict[str, str]:
    """`collectConfigRuntimeEnvVars`: openclaw.json's `env.vars.*` then `env.<NAME>` strings."""
    section = config.get("env")
    if not isinstance(section, Mapping):
        return {}
    found: dict[str, str] = {}
    named = section.get("vars")
    inline = {key: value for key, value in section.items() if key not in ("shellEnv", "vars")}
    sources: list[Mapping[str, Any]] = [named if isinstance(named, Mapping) else {}, inline]
    for source in sources:
        for raw_key, value in source.items():
            key = _trim(raw_key)
            if not isinstance(value, str) or not _trim(value) or not _PORTABLE_ENV_KEY.fullmatch(key):
                continue
            if key.upper() in _CONFIG_ENV_BLOCKED or _has_env_reference(value):
                continue
            found[key] = value
    return found


def _read_dotenv(path: Path) -> dict[str, str]:
    """`readDotEnvFileCore` + npm dotenv's `parse`: regular file up to 1 MiB, portable names only."""
    try:
        real = Path(os.path.realpath(path))
        if not real.is_file() or real.stat().st_size > _MAX_DOTENV_BYTES:
            return {}
        text = real.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    pairs: dict[str, str] = {}  # within one file the last assignment wins
    for match in _DOTENV_LINE.finditer(re.sub(r"\r\n?", "\n", text)):
        value = _trim(match.group(2) or "")
        quote = value[:1]
        value = _DOTENV_QUOTED.sub(r"\2", value)
        if quote == '"':
            value = value.replace("\\n", "\n").replace("\\r", "\r")
        key = _trim(match.group(1))
        if _PORTABLE_ENV_KEY.fullmatch(key):
            pairs[key] = value
    return pairs


def _load_global_dotenv(env: dict[str, str], home: Path) -> list[Path]:
    """`loadGlobalRuntimeDotEnvFiles`: `<config dir>/.env`, then `~/.config/openclaw/gateway.env`.

    The config dir is `resolveConfigDir`: `$OPENCLAW_STATE_DIR`, else the dir of
    `$OPENCLAW_CONFIG_PATH`, else `<home>/.openclaw`; gateway.env is read only when the state dir
    is not overridden to somewhere else. A variable already in the environment (even empty) wins,
    and the first file that sets one wins. (OpenClaw also reads `.env` in its cwd, but refuses
    every OPENCLAW_* name from it, so it cannot move a workspace except through `${VAR}`.)
    """
    state_override = env.get(_STATE_DIR_VAR)
    if _trim(state_override):
        config_dir = _user_path(str(state_override), home, Path.cwd())
    elif _trim(env.get("OPENCLAW_CONFIG_PATH")):
        config_dir = _user_path(env["OPENCLAW_CONFIG_PATH"], home, Path.cwd()).parent
    else:
        config_dir = home / ".openclaw"
    files = [config_dir / ".env"]
    if state_override is None or config_dir == home / ".openclaw":
        files.append(home / ".config" / "openclaw" / "gateway.env")
    present = set(env)
    for file in files:
        for key, value in _read_dotenv(file).items():
            if key not in present and key not in env:
                env[key] = value
    return files  # the files looked at (a `ConfigWatch` stamps them: one created later changes the environment)


def _state_dir_from_home(home: Path) -> Path:
    """`resolveStateDirFromHome`: `~/.openclaw` if it exists, else an existing `~/.clawdbot`, else `~/.openclaw`."""
    primary = home / ".openclaw"
    if primary.exists() or not (home / ".clawdbot").exists():
        return primary
    return home / ".clawdbot"


def _config_path(state_dir: Path, env: Mapping[str, str], home: Path) -> Path:
    """`resolveConfigPath`: `$OPENCLAW_CONFIG_PATH`, else the first existing of `openclaw.json` /
    `clawdbot.json` in the state dir (the default state dir also looks in `~/.clawdbot`)."""
    if _trim(env.get("OPENCLAW_CONFIG_PATH")):
        return _user_path(env["OPENCLAW_CONFIG_PATH"], home, Path.cwd())
    dirs = [state_dir]
    if not _trim(env.get(_STATE_DIR_VAR)) and state_dir == home / ".openclaw":
        dirs.append(home / ".clawdbot")
    for folder in dirs:
        for name in (CONFIG_FILENAME, *_LEGACY_CONFIG_FILENAMES):
            if (folder / name).exists():
                return folder / name
    return state_dir / CONFIG_FILENAME


def _include_roots(env: Mapping[str, str], home: Path) -> list[str]:
    """`resolveIncludeRoots`: `$OPENCLAW_INCLUDE_ROOTS`, `:`-separated, `~`-expanded, absolute."""
    roots: list[str] = []
    for entry in (env.get("OPENCLAW_INCLUDE_ROOTS") or "").split(os.pathsep):
        if _trim(entry):
            root = str(_user_path(entry, home, Path.cwd()))
            if root not in roots:
                roots.append(root)
    return roots


@dataclass(frozen=True, slots=True)
class _ReadConfig:
    config: dict[str, object]
    env: dict[str, str]
    files: tuple[str, ...] = ()  # every file the read looked at: openclaw.json, its includes, the .env files


def _openclaw_env_files(state_dir: Path, environ: Mapping[str, str]) -> tuple[dict[str, str], Path, list[Path]]:
    """`_openclaw_env`, and the .env files it looked at."""
    env = dict(environ)
    home = openclaw_home(env)
    if not _trim(env.get(_STATE_DIR_VAR)) and os.path.abspath(state_dir) != os.path.abspath(
            _state_dir_from_home(home)):
        env[_STATE_DIR_VAR] = str(state_dir)
    files = _load_global_dotenv(env, home)
    return env, openclaw_home(env), files


def _openclaw_env(state_dir: Path, environ: Mapping[str, str]) -> tuple[dict[str, str], Path]:
    """The environment OpenClaw reads its config with (`environ`, OPENCLAW_STATE_DIR when it must have been
    told, the global `.env` files) and its home dir."""
    env, home, _ = _openclaw_env_files(state_dir, environ)
    return env, home


def config_file(state_dir: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The openclaw.json OpenClaw reads for `state_dir` (`resolveConfigPath`, with the environment it reads
    it with)."""
    state_dir = Path(state_dir)
    return _config_path(state_dir, *_openclaw_env(state_dir, os.environ if environ is None else environ))


def _read_openclaw(state_dir: Path, environ: Mapping[str, str], issues: list[str] | None) -> _ReadConfig:
    """openclaw.json and the environment OpenClaw ends up with, as `readConfigFileSnapshot` reads them.

    The environment: `environ`, plus OPENCLAW_STATE_DIR=`state_dir` when that is not where
    OpenClaw would look from the home dir (so it must have been told), plus the global `.env`
    files, plus openclaw.json's `env` section for names still unset or blank (`applyConfigEnvVars`).
    The config: JSON5, `$include`s resolved, then `${VAR}` substituted from that environment.
    Best effort where OpenClaw would refuse the file: unreadable or unparsable means `{}`, a broken
    `$include` contributes nothing; each such problem is appended to `issues`.
    """
    state_dir = Path(state_dir)
    env, home, dotenv = _openclaw_env_files(state_dir, environ)
    path = _config_path(state_dir, env, home)
    notes: list[str] = [] if issues is None else issues
    try:
        parsed = _parse_json5(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        parsed = {}
    except (OSError, ValueError, RecursionError) as exc:
        notes.append(f"{path}{UNREADABLE}{exc}")
        parsed = {}
    if not isinstance(parsed, Mapping):
        parsed = {}
    includes = _Includes(path, _include_roots(env, home))
    root = frozenset({os.path.normpath(os.path.abspath(path))})
    try:
        resolved: dict[str, Any] = includes.process(parsed, str(path), root, 0)
    except _IncludeError as exc:  # OpenClaw rejects the file; keep what does not depend on the bad include
        notes.append(f"{path}: {exc}")
        resolved = {}
        for key, value in parsed.items():
            if key == _INCLUDE_KEY:
                continue
            with contextlib.suppress(_IncludeError):
                resolved[key] = includes.process(value, str(path), root, 0)
    for key, value in _config_env_vars(resolved).items():
        if not _trim(env.get(key)):
            env[key] = value
    missing: list[str] = []
    config = _substitute_all(resolved, env, missing)
    notes.extend(f"{path}: ${{{name}}} is not set" for name in dict.fromkeys(missing))
    return _ReadConfig(config if isinstance(config, dict) else {}, env,
                       tuple(dict.fromkeys([str(path), *includes.looked_at, *map(str, dotenv)])))


UNREADABLE = ": cannot read: "  # in an issue `_read_openclaw` notes: openclaw.json itself could not be read or parsed


def load_openclaw_config(state_dir: Path, environ: Mapping[str, str] | None = None, *,
                         issues: list[str] | None = None) -> dict[str, object]:
    """openclaw.json as OpenClaw reads it (`readConfigFileSnapshot`): see `_read_openclaw`.

    The file is `$OPENCLAW_CONFIG_PATH`, else `<state_dir>/openclaw.json` (or a legacy
    `clawdbot.json`). JSON5 (comments, trailing commas, unquoted keys, single quotes), `$include`
    resolved, `${VAR}` substituted. The roster is left as written: `workspace_for` migrates it.
    """
    return _read_openclaw(state_dir, os.environ if environ is None else environ, issues).config


def openclaw_environment(state_dir: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment OpenClaw resolves paths with: see `_read_openclaw`."""
    return _read_openclaw(state_dir, os.environ if environ is None else environ, None).env


def agent_workspace(state_dir: Path, agent_id: str, environ: Mapping[str, str] | None = None, *,
                    cwd: Path | None = None) -> Path:
    """The agent's workspace as a running OpenClaw sees it: its openclaw.json, `.env` files and env.

    `environ` is OpenClaw's environment (default: ours); `cwd` is where relative paths resolve
    (default `state_dir`, see `workspace_for`).

    Raises InvalidAgentId for anything but an agent id (OpenClaw would map `x/../y` to the agent
    `x-y`, someone else's workspace). The workspace itself may be anywhere (an absolute
    `workspace` is OpenClaw's design); the id can only ever name one directory inside it.
    """
    agent_id = canonical_agent_id(agent_id)
    read = _read_openclaw(state_dir, os.environ if environ is None else environ, None)
    return workspace_for(state_dir, agent_id, read.config, environ=read.env, cwd=cwd)


def agent_removed(state_dir: Path, agent_id: str, workspace: Path,
                  environ: Mapping[str, str] | None = None) -> bool:
    """Whether `openclaw agents delete` took the agent away: its workspace (`workspace`) is gone (to the
    Trash) and openclaw.json has a roster (`agents.entries` or `agents.list`) that no longer names it.
    Without a roster, or without a readable openclaw.json, nothing says so: False. The workspace is looked
    at first: a stat, where the roster costs a read of the config."""
    if workspace.exists():
        return False
    config = load_openclaw_config(state_dir, environ)
    return _roster(config) is not None and canonical_agent_id(agent_id) not in _list_agent_ids(config)


def session_stem(path: str | Path) -> str:
    """The session id a transcript's file name carries (`<id>.jsonl`, `<id>.jsonl.reset.<ts>`, ...)."""
    return Path(path).name.split(".jsonl", 1)[0]


@dataclass(frozen=True, slots=True)
class AgentDirs:
    agent_id: str
    sessions: Path  # may not exist yet
    sqlite: Path  # may not exist yet
    # In a directory several agents share (a JSONL-era `session.store` without `{agentId}`): the session ids
    # whose transcripts are this agent's. None: every transcript in `sessions` is.
    sessions_of: frozenset[str] | None = None


class ProblemSink(Protocol):
    """Where a directory that cannot be followed is reported (`problems.ProblemLog`)."""

    def report(self, path: Path, problem: str, detail: str = "", agent: str | None = None) -> None: ...


def iter_agents(state_dir: Path, problems: ProblemSink | None = None) -> Iterator[AgentDirs]:
    """Every agent under the state dir, plus the very old layout (`sessions/` at the top = `main`).

    Only directories named as OpenClaw names agents (`AGENT_ID`) are agents; anything else under
    `agents/` (a symlink, a name such as `..x` or `My Agent`, a loop, an unreadable entry) is
    skipped, and told to `problems` when given.
    """
    agents_dir = state_dir / "agents"
    names: list[str] = []
    try:
        entries = sorted(os.scandir(agents_dir), key=lambda e: e.name)
    except FileNotFoundError:
        entries = []
    except OSError as exc:
        entries = []
        if problems is not None:
            problems.report(agents_dir, "unreadable", f"{type(exc).__name__}: {exc.strerror or exc}")
    for entry in entries:
        try:
            is_link = entry.is_symlink()
            is_dir = not is_link and entry.is_dir(follow_symlinks=False)
        except OSError as exc:
            if problems is not None:
                problems.report(Path(entry.path), "unreadable", f"{type(exc).__name__}: {exc.strerror or exc}")
            continue
        if is_link:
            if problems is not None:
                problems.report(Path(entry.path), "symlink_ignored", "an agent dir that is a symlink is not followed")
            continue
        if not is_dir:
            continue
        if not is_agent_dir_name(entry.name):
            if problems is not None:
                problems.report(Path(entry.path), "agent_dir_ignored",
                                "not an OpenClaw agent id ([a-z0-9][a-z0-9_-]{0,63})")
            continue
        names.append(entry.name)
    for name in names:
        base = agents_dir / name
        yield AgentDirs(name, base / "sessions", base / "agent" / SQLITE_NAME)
    legacy = state_dir / "sessions"
    if DEFAULT_AGENT not in names and legacy.is_dir() and not legacy.is_symlink():
        yield AgentDirs(DEFAULT_AGENT, legacy, agents_dir / DEFAULT_AGENT / "agent" / SQLITE_NAME)


# ---------------------------------------------------------------------------------------------
# A JSONL-era `session.store` (OpenClaw before 2026.8; read in 2026.7.35's `dist/*.js` and run offline).
# `resolveStorePath(store, {agentId})` (paths-*.js) makes the setting one agent's `sessions.json` path. A transcript
# goes where its entry's `sessionFile` says, resolved within that file's directory (`resolveSessionFilePath` with
# `resolveSessionFilePathOptions({agentId, storePath})`), and an entry without one is `<id>.jsonl` in that directory
# (session-accessor-*.js: `persistExpectedSessionTranscriptTurn`, `resolveSessionTranscriptReadTarget`); archives
# are renamed in place (`archiveFileOnDisk`: `<file>.reset.<ts>`, `<file>.deleted.<ts>`). `openclaw agent` turns
# still name `agents/<id>/sessions/<id>.jsonl` (`resolveSessionTranscriptPath`; the run showed it): both are followed.

_HOME_PREFIX = re.compile(r"^~(?=$|[\\/])")


def session_store_path(store: str, agent_id: str, env: Mapping[str, str], cwd: Path) -> Path:
    """`resolveStorePath(store, {agentId})` for a configured `session.store`: `{agentId}` replaced by the
    normalized id, a leading `~` (alone or before a separator: `expandHomePrefix`) by OpenClaw's home, then
    `path.resolve` from OpenClaw's working directory `cwd`."""
    expanded = store.replace("{agentId}", normalize_agent_id(agent_id))
    if expanded.startswith("~"):
        home = str(openclaw_home(env))
        expanded = _HOME_PREFIX.sub(lambda _: home, expanded)
    return _js_resolve(expanded, cwd)


class ConfigWatch:
    """Whether OpenClaw's config may have changed: the file OpenClaw reads (`config_file`, found again only while it
    is missing) and every file the last `read` looked at (its `$include`s, the global .env files), by `file_stamp`.
    The first read learns those files: the stamp taken before it lacks them, so the next one differs (read once
    more)."""

    def __init__(self, state_dir: Path, environ: Mapping[str, str] | None = None) -> None:
        self._state_dir = state_dir
        self._environ = environ
        self.path: Path | None = None
        self._files: tuple[str, ...] = ()

    def stamp(self) -> tuple[str, tuple[str, ...], Stamp]:
        if self.path is None or not self.path.exists():
            self.path = config_file(self._state_dir, self._environ)
        return str(self.path), self._files, file_stamp(self.path, *map(Path, self._files))

    def read(self, issues: list[str] | None = None) -> _ReadConfig:
        """openclaw.json as `_read_openclaw` reads it; the files it looked at are stamped from now on."""
        read = _read_openclaw(self._state_dir, os.environ if self._environ is None else self._environ, issues)
        self._files = read.files
        return read

    @staticmethod
    def kept(stamp: tuple[str, tuple[str, ...], Stamp]) -> tuple[str, tuple[str, ...], Stamp] | None:
        """`stamp` to compare the next one with, or None (read again next time) while it is too recent (`settled`)."""
        return stamp if settled(stamp[2]) else None


class JsonlSessionStores:
    """The directories a JSONL-era `session.store` puts transcripts in, for each sweep: every agent's
    `dirname(resolveStorePath(store, agent))` that is not its own `agents/<id>/sessions/` (followed anyway).
    The agents are those with a directory and those openclaw.json lists. A relative store path is resolved from
    the state dir (OpenClaw resolves it from its working directory, which veritas-watch cannot know).

    A directory one agent's store names is that agent's. One several agents' stores name (a store without
    `{agentId}`) holds their transcripts side by side: a transcript there is an agent's when the directory's
    `sessions.json` lists its session under a key naming that agent (`agent:<id>:...`, `session_key_agent`), or
    when this process saw it so before (a reset or deletion renames it in place and its key moves on). A transcript
    no key names, as far as this process saw, could be any agent's: it is not read (`AgentDirs.sessions_of`).
    openclaw.json (with the files it includes) and each sessions.json are parsed again only when their stat
    changed."""

    def __init__(self, state_dir: Path, environ: Mapping[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self._config = ConfigWatch(state_dir, environ)
        self._config_seen: object = None
        self._store: str | None = None
        self._env: dict[str, str] = {}
        self._listed: list[str] = []  # the agents openclaw.json lists
        self._keys: dict[Path, tuple[object, dict[str, str]]] = {}  # sessions.json -> (stamp, session -> agent)
        self._owners: dict[Path, dict[str, str]] = {}  # shared directory -> session -> agent, first seen wins

    def _read_config(self) -> str | None:
        """`session.store`; openclaw.json caught half-written (or with a typo) keeps the last one read, as
        `admission.PolicyReader` does: dropping it would drop the directories and the cursors of their files."""
        stamp = self._config.stamp()
        if stamp != self._config_seen:
            issues: list[str] = []
            read = self._config.read(issues)
            if any(UNREADABLE in issue for issue in issues):
                return self._store  # read again at the next sweep
            session = read.config.get("session")
            store = session.get("store") if isinstance(session, Mapping) else None
            self._store = store if isinstance(store, str) and store else None  # `if (!store)`: the default
            self._env = read.env
            self._listed = _list_agent_ids(read.config) if _roster(read.config) is not None else []
            self._config_seen = self._config.kept(stamp)
        return self._store

    def dirs(self, agents: Iterable[AgentDirs]) -> list[AgentDirs]:
        """The store directories to follow besides `agents` (what `iter_agents` found), one AgentDirs per agent,
        to be listed BEFORE `agents`: in a store shared in an agent's own `agents/<id>/sessions/`, the transcripts
        keys give the other agents are theirs, and that agent's listing (every file) then skips them as seen."""
        store = self._read_config()
        if store is None:
            return []
        agents = list(agents)
        own = {a.agent_id: a for a in agents}
        ids = list(dict.fromkeys([*own, *self._listed]))
        # the directories an agent's own listing reads whole (`iter_agents`), once it has one
        home = {os.path.normpath(self.state_dir / "agents" / a / "sessions"): a for a in ids}
        home.update((os.path.normpath(a.sessions), a.agent_id) for a in agents)
        by_dir: dict[Path, dict[str, Path]] = {}  # directory -> agent -> its sessions.json
        for agent_id in ids:
            path = session_store_path(store, agent_id, self._env, self.state_dir)
            by_dir.setdefault(path.parent, {})[agent_id] = path
        found = []
        for directory, stores in sorted(by_dir.items()):
            owner = home.get(os.path.normpath(directory))
            if owner is not None and set(stores) <= {owner}:
                continue  # the agent's own directory (the default store)
            if len(stores) == 1 and owner is None:
                ((agent_id, _),) = stores.items()
                found.append(self._agent_dirs(agent_id, directory, own, None))
                continue
            owners = self._owners.setdefault(directory, {})
            for path in dict.fromkeys(stores.values()):
                for session_id, agent_id in self._sessions_json(path).items():
                    owners.setdefault(session_id, agent_id)
            for agent_id in stores:
                if agent_id != owner:  # the owner's listing has every file the others' leave
                    found.append(self._agent_dirs(agent_id, directory, own,
                                                  frozenset(s for s, a in owners.items() if a == agent_id)))
        return found

    def _agent_dirs(self, agent_id: str, directory: Path, own: Mapping[str, AgentDirs],
                    sessions_of: frozenset[str] | None) -> AgentDirs:
        base = self.state_dir / "agents" / agent_id
        sqlite = own[agent_id].sqlite if agent_id in own else base / "agent" / SQLITE_NAME
        return AgentDirs(agent_id, directory, sqlite, sessions_of)

    def _sessions_json(self, path: Path) -> dict[str, str]:
        """session -> agent, from a sessions.json (`{<session key>: {sessionId, sessionFile?, ...}}`): the session id
        and the name its `sessionFile` carries (`<id>-topic-<t>` for a topic's), under the agent the key names.
        Unreadable or half-written: the last read (the next change reads it again)."""
        stamp = file_stamp(path)
        kept = self._keys.get(path)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            return kept[1] if kept is not None else {}
        found: dict[str, str] = {}
        for key, entry in data.items() if isinstance(data, dict) else ():
            agent_id = session_key_agent(key) if isinstance(key, str) else None
            if agent_id is None or not isinstance(entry, dict):
                continue
            session_id, session_file = entry.get("sessionId"), entry.get("sessionFile")
            if isinstance(session_id, str) and session_id.strip():
                found.setdefault(session_id.strip(), agent_id)
            if isinstance(session_file, str) and session_file.strip():
                found.setdefault(session_stem(session_file.strip()), agent_id)
        self._keys[path] = (stamp if settled(stamp) else None, found)
        return found


# ---------------------------------------------------------------------------------------------
# Transcript databases. An agent's sessions are in `agents/<id>/agent/openclaw-agent.sqlite` unless
# `session.store` names another place: OpenClaw 2026.9.6 then writes them to the SQLite databases that
# path resolves to (`resolveSqliteTargetFromSessionStorePath`): a `sessions.json`-style path gives each
# agent its own file in that directory (`openclaw-agent.sqlite` for the default agent,
# `openclaw-agent.<id>.sqlite` for the others), a path ending in `.sqlite` is one database shared by
# every agent. Each database it opens is recorded in the state database's `agent_databases` registry.

REGISTRY_DB = Path("state") / "openclaw.sqlite"  # under the state dir
_AGENT_KEY_MARK = "#agent="


@dataclass(frozen=True, slots=True)
class TranscriptDb:
    """One agent's sessions in one SQLite database: those whose session key names the agent
    (`agent:<id>:...`), and, if the database is the agent's own (its `schema_meta` says so), those
    whose key names none. A database shared by several agents is one TranscriptDb per agent."""

    path: Path
    agent_id: str

    @property
    def key(self) -> str:
        """The cursor store's name for it: the path of an agent's own canonical database (what cursors
        were always keyed by), else the path and the agent."""
        return str(self.path) if self.canonical else f"{self.path}{_AGENT_KEY_MARK}{self.agent_id}"

    @property
    def canonical(self) -> bool:
        p = self.path
        return (p.name == SQLITE_NAME and p.parent.name == "agent" and p.parent.parent.name == self.agent_id
                and p.parent.parent.parent.name == "agents")

    @classmethod
    def from_key(cls, key: str) -> TranscriptDb:
        path, mark, agent = key.rpartition(_AGENT_KEY_MARK)
        if mark:
            return cls(Path(path), agent)
        return cls(Path(key), Path(key).parent.parent.name)


def session_key_agent(session_key: str | None) -> str | None:
    """The agent a session key names (OpenClaw's `parseAgentSessionKeyParts` + `normalizeAgentId`):
    `agent:<id>:<rest>` -> `<id>`; None for a key that names none (`global`, a legacy alias)."""
    if not session_key or session_key[:6].lower() != "agent:":
        return None
    end = session_key.find(":", 6)
    if end == -1:
        return None
    agent, rest = _trim(session_key[6:end]), session_key[end + 1:]
    return normalize_agent_id(agent) if agent and rest and not rest.startswith(":") else None


def registered_databases(state_dir: Path) -> list[tuple[str, Path]]:
    """(agent id, database path) of every agent database OpenClaw recorded in its registry
    (`state/openclaw.sqlite`, table `agent_databases`; paths relative to the state dir or absolute).
    Rows whose id is no agent id or whose path names no `.sqlite` file are left out; no registry
    (older OpenClaw, none yet, unreadable) is an empty list: the canonical paths still apply."""
    return _read_registry(state_dir) or []


def _read_registry(state_dir: Path) -> list[tuple[str, Path]] | None:
    """`registered_databases`, None when the registry is there but could not be read (locked, damaged)."""
    path = state_dir / REGISTRY_DB
    if not path.is_file():
        return []
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=0.5)
    except sqlite3.Error:
        return None
    try:
        rows = conn.execute("SELECT agent_id, path FROM agent_databases ORDER BY agent_id, path").fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    found = []
    for agent, raw in rows:
        if not (isinstance(agent, str) and AGENT_ID.fullmatch(agent) and isinstance(raw, str)
                and raw.endswith(".sqlite") and "\0" not in raw):
            continue
        found.append((agent, Path(os.path.normpath(state_dir / raw))))  # an absolute `raw` stays itself
    return found


# A stamp whose newest time is this close to when it was taken is not trusted: a write in the same timestamp tick
# (coarse on some filesystems) can leave size and mtime as they were (the "racy git" case).
_RACY_NS = 2_000_000_000


class Registry:
    """OpenClaw's registry (`registered_databases`) for a daemon that asks at every sweep: read again only when it
    can have changed. The stamp is the stat (device, inode, size, mtime) of `openclaw.sqlite` and of its `-wal`
    (where a WAL writer's commits land until a checkpoint): a new row, a checkpoint, the file replaced or removed
    all change it. Not the ctime: a read-only open touches the `-wal`'s, so it would change at every read.
    Stat only, no connection kept between sweeps (whose `PRAGMA data_version` would be exact): an open connection
    holds a shared lock on the WAL index that OpenClaw's own maintenance may need to be alone for (its "database
    is locked" at start, tests/openclaw_harness.py). A stamp too recent to trust (`file_stamp`) or a read that
    failed is not kept: the next sweep reads again."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._path = state_dir / REGISTRY_DB
        self._stamp: Stamp | None = None
        self._found: list[tuple[str, Path]] = []
        self.reads = 0  # times the registry was opened and queried (what the tests of the cache count)

    def databases(self) -> list[tuple[str, Path]]:
        """`registered_databases(state_dir)`, from the last read while the registry's files are unchanged."""
        stamp = file_stamp(self._path, self._path.with_name(self._path.name + "-wal"))
        if stamp == self._stamp:
            return list(self._found)
        found = _read_registry(self.state_dir)
        self.reads += 1
        if found is not None:  # locked or damaged for a moment: the databases last read stay followed
            self._found = found
        self._stamp = stamp if found is not None and settled(stamp) else None
        return list(self._found)


Stamp = tuple[tuple[int, ...] | None, ...]


def file_stamp(*paths: Path) -> Stamp:
    """What changes when any of `paths` is written, replaced, created or removed: each one's (device, inode, size,
    mtime), None for one not there."""
    stats: list[tuple[int, ...] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stats.append(None)
            continue
        stats.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stats)


def settled(stamp: Stamp) -> bool:
    """Whether a `file_stamp` can be trusted to change with the next write: not while its newest mtime is within
    `_RACY_NS` of now (a write in the same timestamp tick can leave size and mtime as they were: "racy git")."""
    return time.time_ns() - max((s[3] for s in stamp if s is not None), default=0) >= _RACY_NS


def transcript_dbs(state_dir: Path, agents: Iterable[AgentDirs],
                   registry: Registry | None = None) -> list[TranscriptDb]:
    """Every database to read, once per agent: each agent's canonical one, then those the registry
    lists (a configured `session.store`, and the places earlier values of it left behind: OpenClaw
    does not move conversations when it changes). `registry`: a kept `Registry` of `state_dir` (the daemon's,
    read only when it changed); without one it is read now."""
    registered = registry.databases() if registry is not None else registered_databases(state_dir)
    found: dict[tuple[str, str], TranscriptDb] = {}
    for db in [TranscriptDb(a.sqlite, a.agent_id) for a in agents] + [
            TranscriptDb(path, agent) for agent, path in registered]:
        found.setdefault((os.path.normpath(db.path), db.agent_id), db)
    return list(found.values())
