"""Where OpenClaw keeps things, and its file naming rules (facts from OpenClaw's source)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

AGENT_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$", re.IGNORECASE)
LEGACY_STATE_DIRS = (".clawdbot", ".moldbot", ".moltbot")
DEFAULT_AGENT = "main"
SQLITE_NAME = "openclaw-agent.sqlite"

# `<id>.jsonl`, `<id>-topic-<t>.jsonl`, and the history archives `.reset.<ts>` / `.deleted.<ts>`.
_LIVE = re.compile(r"^(?P<stem>[^/]+)\.jsonl$")
_ARCHIVE = re.compile(r"^(?P<stem>[^/]+)\.jsonl\.(?P<kind>reset|deleted)\.(?P<ts>[^/]+)$")
# Derived copies and runtime traces: indexing them would double-index or add non-conversation.
_DERIVED = re.compile(r"\.(bak\.|checkpoint\.)|\.trajectory|\.lock$|-tmp$|\.tmp$|\.zst$")

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


def load_openclaw_config(state_dir: Path, environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """`openclaw.json` (JSON5 in OpenClaw; plain JSON is what we can read without a parser)."""
    env = os.environ if environ is None else environ
    path = Path(env["OPENCLAW_CONFIG_PATH"]) if env.get("OPENCLAW_CONFIG_PATH") else state_dir / "openclaw.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _normalize_agent_id(value: object) -> str:
    text = value.strip().lower() if isinstance(value, str) else ""
    return text or DEFAULT_AGENT


def _user_path(raw: str, *, home: Path | None, base: Path) -> Path:
    text = raw.strip()
    home_dir = home if home is not None else Path.home()
    if text == "~":
        return home_dir
    if text.startswith("~/"):
        return home_dir / text[2:]
    path = Path(text)
    # OpenClaw resolves a relative path against its own cwd; a daemon has none that means
    # anything, so the state dir is the base.
    return path if path.is_absolute() else base / path


def workspace_for(
    state_dir: Path,
    agent_id: str,
    openclaw_config: Mapping[str, Any] | None = None,
    *,
    profile: str | None = None,
    home: Path | None = None,
) -> Path:
    """The agent's workspace dir, resolved as OpenClaw's resolveAgentWorkspaceDir does.

    Order: `agents.list[<id>].workspace`; for the default agent (the entry marked `default`, else
    the first listed, else `main`) `agents.defaults.workspace`, else `~/.openclaw/workspace`
    (`workspace-<profile>` with a profile); for other agents `<agents.defaults.workspace>/<id>`,
    else `<state_dir>/workspace-<id>`. OpenClaw puts the default workspace under the home dir
    whatever the state dir: pass `home` to get exactly that; without it the default agent's
    workspace is `<state_dir>/workspace`, which is the same place for a standard `~/.openclaw`.
    """
    agent = _normalize_agent_id(agent_id)
    agents = (openclaw_config or {}).get("agents")
    agents = agents if isinstance(agents, Mapping) else {}
    raw_list = agents.get("list")
    entries = [e for e in raw_list if isinstance(e, Mapping)] if isinstance(raw_list, list) else []
    for entry in entries:
        configured = entry.get("workspace")
        if _normalize_agent_id(entry.get("id")) == agent and isinstance(configured, str) and configured.strip():
            return _user_path(configured, home=home, base=state_dir)
    defaults = agents.get("defaults")
    fallback = defaults.get("workspace") if isinstance(defaults, Mapping) else None
    fallback = fallback.strip() if isinstance(fallback, str) and fallback.strip() else None
    marked = [e for e in entries if e.get("default")]
    default_id = _normalize_agent_id((marked or entries)[0].get("id")) if entries else DEFAULT_AGENT
    if agent == default_id:
        if fallback:
            return _user_path(fallback, home=home, base=state_dir)
        name = "workspace"
        if profile and profile.strip() and profile.strip().lower() != "default":
            name = f"workspace-{profile.strip()}"
        if home is not None:
            return home / ".openclaw" / name
        if name != "workspace" and state_dir.name.startswith(".openclaw"):
            return state_dir.parent / ".openclaw" / name  # ~/.openclaw-<profile> -> ~/.openclaw/workspace-<profile>
        return state_dir / name
    if fallback:
        return _user_path(fallback, home=home, base=state_dir) / agent
    return state_dir / f"workspace-{agent}"


def openclaw_home(environ: Mapping[str, str] | None = None) -> Path:
    """The home dir OpenClaw uses: `$OPENCLAW_HOME`, else the user's home."""
    env = os.environ if environ is None else environ
    return Path(env["OPENCLAW_HOME"]).expanduser() if env.get("OPENCLAW_HOME") else Path.home()


def agent_workspace(state_dir: Path, agent_id: str, environ: Mapping[str, str] | None = None) -> Path:
    """The agent's workspace as a running OpenClaw sees it: its openclaw.json, home and profile."""
    env = os.environ if environ is None else environ
    return workspace_for(state_dir, agent_id, load_openclaw_config(state_dir, env),
                         profile=env.get("OPENCLAW_PROFILE") or None, home=openclaw_home(env))


def session_stem(path: str | Path) -> str:
    """The session id a transcript's file name carries (`<id>.jsonl`, `<id>.jsonl.reset.<ts>`, ...)."""
    return Path(path).name.split(".jsonl", 1)[0]


@dataclass(frozen=True, slots=True)
class AgentDirs:
    agent_id: str
    sessions: Path  # may not exist yet
    sqlite: Path  # may not exist yet


def iter_agents(state_dir: Path) -> Iterator[AgentDirs]:
    """Every agent under the state dir, plus the very old layout (`sessions/` at the top = `main`)."""
    agents_dir = state_dir / "agents"
    try:
        names = sorted(p.name for p in agents_dir.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        names = []
    for name in names:
        if AGENT_ID.match(name):
            base = agents_dir / name
            yield AgentDirs(name, base / "sessions", base / "agent" / SQLITE_NAME)
    legacy = state_dir / "sessions"
    if DEFAULT_AGENT not in names and legacy.is_dir() and not legacy.is_symlink():
        yield AgentDirs(DEFAULT_AGENT, legacy, agents_dir / DEFAULT_AGENT / "agent" / SQLITE_NAME)
