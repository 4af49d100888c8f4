"""Where OpenClaw keeps things, and its file naming rules (facts from OpenClaw's source)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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


def workspace_for(state_dir: Path, agent_id: str, config: Mapping[str, object] | None = None,
                  profile: str | None = None) -> Path:
    """The agent's workspace: `agents.list[].workspace`, `agents.defaults.workspace`, or the defaults."""
    agents = (config or {}).get("agents")
    if isinstance(agents, dict):
        for item in agents.get("list") or []:
            if isinstance(item, dict) and item.get("id") == agent_id and isinstance(item.get("workspace"), str):
                return Path(item["workspace"]).expanduser()
        defaults = agents.get("defaults")
        if agent_id == DEFAULT_AGENT and isinstance(defaults, dict) and isinstance(defaults.get("workspace"), str):
            return Path(defaults["workspace"]).expanduser()
    if agent_id == DEFAULT_AGENT:
        return state_dir / (f"workspace-{profile}" if profile else "workspace")
    return state_dir / f"workspace-{agent_id}"


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
