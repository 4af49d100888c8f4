"""Agent workspaces and openclaw.json, resolved exactly as OpenClaw 2026.9.6 resolves them.

The tables below were checked case by case against the real CLI (`openclaw agents list --json`);
`test_matches_the_real_openclaw_cli` re-runs that comparison when an OpenClaw install is at
the tests' install (tests/openclaw_harness.py: Node and OpenClaw from the npm registry, cached), and is
skipped, saying why, only where the registry cannot be reached and `CI` is not set.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.openclaw_harness import InstallError, install, install_prefix
from veritas_watch.openclaw import (
    OPENCLAW_VERSION,
    agent_removed,
    agent_workspace,
    load_openclaw_config,
    normalize_agent_id,
    openclaw_environment,
    openclaw_home,
    workspace_for,
)

pytestmark = pytest.mark.long  # minutes: started first (tests/conftest.py)

# ---------------------------------------------------------------------------------------------
# workspace_for: one row per config shape. Paths use {state}, {home} and {cwd} placeholders.

EXPLICIT_FLEET: dict[str, Any] = {"agents": {"ownership": "explicit", "entries": {"main": {}, "work": {}}}}
LEGACY_MARKED: dict[str, Any] = {"agents": {"defaults": {"workspace": "~/d"}, "list": [
    {"id": "a"}, {"id": "b", "default": True}, {"id": "c", "workspace": "~/cc"}]}}


@dataclass(frozen=True)
class Shape:
    name: str
    config: dict[str, Any] | None
    expected: dict[str, str]  # agent id as asked -> workspace
    env: dict[str, str] = field(default_factory=dict)
    with_home: bool = True  # pass home= (OpenClaw found its state dir from the home dir)


SHAPES = [
    Shape("no config: main is implicit", None,
          {"main": "{home}/.openclaw/workspace", "Main": "{home}/.openclaw/workspace", "ops": "{state}/workspace-ops"}),
    Shape("empty config", {}, {"main": "{home}/.openclaw/workspace"}),
    Shape("state dir set: default workspace under it", None,
          {"main": "{state}/workspace"}, env={"OPENCLAW_STATE_DIR": "{state}"}),
    Shape("legacy list, one agent", {"agents": {"list": [{"id": "main"}]}}, {"main": "{home}/.openclaw/workspace"}),
    Shape("legacy list, one agent that is not main", {"agents": {"list": [{"id": "ops"}]}},
          {"ops": "{home}/.openclaw/workspace", "main": "{state}/workspace-main"}),
    Shape("legacy list, default marker", {"agents": {"list": [{"id": "ops"}, {"id": "main", "default": True}]}},
          {"ops": "{state}/workspace-ops", "main": "{home}/.openclaw/workspace"}),
    Shape("legacy list, marker not first, defaults.workspace", LEGACY_MARKED,
          {"a": "{home}/d/a", "b": "{home}/d", "c": "{home}/cc"}),
    # OpenClaw rejects these two until `openclaw doctor` runs, and doctor writes exactly this layout:
    Shape("legacy list, several agents, no marker: the first keeps the default workspace",
          {"agents": {"list": [{"id": "ops"}, {"id": "main"}]}},
          {"ops": "{home}/.openclaw/workspace", "main": "{state}/workspace-main"}),
    Shape("legacy list, no marker, defaults.workspace",
          {"agents": {"defaults": {"workspace": "~/dd"}, "list": [{"id": "ops"}, {"id": "main"}]}},
          {"ops": "{home}/dd", "main": "{home}/dd/main"}),
    Shape("legacy list under explicit ownership", {"agents": {"ownership": "explicit", "list": [
        {"id": "ops"}, {"id": "main"}]}}, {"ops": "{state}/workspace-ops", "main": "{state}/workspace-main"}),
    Shape("legacy list that cannot convert (id not normalized) is read as written",
          {"agents": {"list": [{"id": "Ops"}, {"id": "main", "default": True}]}},
          {"ops": "{state}/workspace-ops", "main": "{home}/.openclaw/workspace"}),
    Shape("entries, one agent", {"agents": {"entries": {"ops": {}}}},
          {"ops": "{home}/.openclaw/workspace", "main": "{state}/workspace-main"}),
    Shape("entries, default marker", {"agents": {"entries": {"ops": {"default": True}, "main": {}}}},
          {"ops": "{home}/.openclaw/workspace", "main": "{state}/workspace-main"}),
    Shape("explicit ownership: no implicit default, main included", EXPLICIT_FLEET,
          {"main": "{state}/workspace-main", "work": "{state}/workspace-work", "other": "{state}/workspace-other"}),
    Shape("explicit ownership, sole agent still inherits the default workspace",
          {"agents": {"ownership": "explicit", "entries": {"work": {}}}},
          {"work": "{home}/.openclaw/workspace", "main": "{state}/workspace-main"}),
    Shape("explicit ownership, per-agent workspaces",
          {"agents": {"ownership": "explicit", "entries": {
              "main": {"workspace": "~/mw"}, "abs": {"workspace": "/srv/a/../ws"}, "rel": {"workspace": "relws"},
              "tilde": {"workspace": "~"}, "user": {"workspace": "~user/x"}, "spaced": {"workspace": "  ~/sp  "},
              "blank": {"workspace": "   "}, "dotted": {"workspace": "./dot/../d2"}}}},
          {"main": "{home}/mw", "abs": "/srv/ws", "rel": "{cwd}/relws", "tilde": "{home}", "user": "{cwd}/~user/x",
           "spaced": "{home}/sp", "blank": "{state}/workspace-blank", "dotted": "{cwd}/d2"}),
    Shape("explicit ownership, defaults.workspace is a root for every agent",
          {"agents": {"ownership": "explicit", "defaults": {"workspace": "~/fleet"},
                      "entries": {"main": {}, "Work": {}}}},
          {"main": "{home}/fleet/main", "work": "{home}/fleet/work", "WORK": "{home}/fleet/work"}),
    Shape("explicit ownership, blank workspaces are ignored",
          {"agents": {"ownership": "explicit", "defaults": {"workspace": "  "},
                      "entries": {"main": {"workspace": ""}, "b": {}}}},
          {"main": "{state}/workspace-main", "b": "{state}/workspace-b"}),
    Shape("one agent with defaults.workspace takes it as is",
          {"agents": {"defaults": {"workspace": "~/solo"}, "entries": {"main": {}}}}, {"main": "{home}/solo"}),
    Shape("both shapes: entries win, list ignored",
          {"agents": {"list": [{"id": "old", "workspace": "/old"}], "entries": {"new": {}}}},
          {"new": "{home}/.openclaw/workspace", "old": "{state}/workspace-old"}),
    Shape("agent ids are normalized", {"agents": {"ownership": "explicit", "entries": {"_x": {}, "UP": {}}}},
          {"_x": "{state}/workspace-_x", "up": "{state}/workspace-up", "My Agent!": "{state}/workspace-my-agent"}),
    Shape("OPENCLAW_WORKSPACE_DIR replaces the default workspace", None,
          {"main": "/srv/w", "ops": "{state}/workspace-ops"}, env={"OPENCLAW_WORKSPACE_DIR": "/srv/w"}),
    Shape("OPENCLAW_WORKSPACE_DIR is not ~-expanded", None,
          {"main": "{cwd}/~/w"}, env={"OPENCLAW_WORKSPACE_DIR": "~/w"}),
    Shape("OPENCLAW_WORKSPACE_DIR does not beat defaults.workspace",
          {"agents": {"defaults": {"workspace": "/srv/d"}, "entries": {"main": {}}}},
          {"main": "/srv/d"}, env={"OPENCLAW_WORKSPACE_DIR": "/srv/w"}),
    Shape("OPENCLAW_WORKSPACE_DIR is unused in an explicit fleet", EXPLICIT_FLEET,
          {"main": "{state}/workspace-main"}, env={"OPENCLAW_WORKSPACE_DIR": "/srv/w"}),
    Shape("profile: ~/.openclaw-<profile>/workspace", None,
          {"main": "{home}/.openclaw-desk/workspace"}, env={"OPENCLAW_PROFILE": "desk"}),
    Shape("profile named default", None, {"main": "{home}/.openclaw/workspace"}, env={"OPENCLAW_PROFILE": "Default"}),
    Shape("profile with the state dir set (what --profile does)", None,
          {"main": "{state}/workspace"}, env={"OPENCLAW_PROFILE": "desk", "OPENCLAW_STATE_DIR": "{state}"}),
    Shape("no home given: the state dir counts as set explicitly", None,
          {"main": "{state}/workspace", "ops": "{state}/workspace-ops"}, with_home=False),
]


def _fill(template: str, state: Path, home: Path, cwd: Path) -> str:
    return template.format(state=state, home=home, cwd=cwd)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_workspace_for_each_shape(shape: Shape, tmp_path: Path) -> None:
    home, state, cwd = tmp_path / "home", tmp_path / "home" / ".openclaw", tmp_path / "cwd"
    env = {key: _fill(value, state, home, cwd) for key, value in shape.env.items()}
    kwargs: dict[str, Any] = {"cwd": cwd}
    if shape.with_home:
        kwargs["home"] = home
    if env:
        kwargs["environ"] = env
    got = {agent: workspace_for(state, agent, shape.config, **kwargs) for agent in shape.expected}
    want = {agent: Path(_fill(path, state, home, cwd)) for agent, path in shape.expected.items()}
    assert got == want
    assert not (tmp_path / "home").exists() and not cwd.exists()  # resolving never creates a directory


def test_legacy_state_dir_keeps_the_default_workspace_under_dot_openclaw(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert workspace_for(home / ".clawdbot", "main", {}, home=home) == home / ".openclaw" / "workspace"
    assert workspace_for(home / ".clawdbot", "ops", {}, home=home) == home / ".clawdbot" / "workspace-ops"


def test_profile_argument_overrides_the_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"OPENCLAW_PROFILE": "desk"}
    assert workspace_for(home / ".openclaw", "main", None, home=home, environ=env, profile="lab") == (
        home / ".openclaw-lab" / "workspace")
    assert workspace_for(home / ".openclaw", "main", None, home=home, environ=env, profile="default") == (
        home / ".openclaw" / "workspace")


@pytest.mark.parametrize(("raw", "normalized"), [
    ("main", "main"), ("Main", "main"), (" ops ", "ops"), ("_x", "_x"), ("My Agent!", "my-agent"),
    ("--a..b--", "a-b"), ("", "main"), ("!!!", "main"), (None, "main"), (7, "main"), ("a" * 70, "a" * 64),
    ("\ufeffops", "ops"), ("ſ", "main"),
])
def test_normalize_agent_id(raw: object, normalized: str) -> None:
    assert normalize_agent_id(raw) == normalized


def test_openclaw_home(tmp_path: Path) -> None:
    assert openclaw_home({"OPENCLAW_HOME": str(tmp_path / "oc"), "HOME": "/h"}) == tmp_path / "oc"
    assert openclaw_home({"OPENCLAW_HOME": "~/oc", "HOME": str(tmp_path)}) == tmp_path / "oc"
    assert openclaw_home({"OPENCLAW_HOME": " undefined ", "HOME": str(tmp_path)}) == tmp_path
    assert openclaw_home({"USERPROFILE": str(tmp_path)}) == tmp_path
    assert openclaw_home({"HOME": str(tmp_path) + "/x/.."}) == tmp_path


# ---------------------------------------------------------------------------------------------
# Reading openclaw.json


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "OPENCLAW_STATE_DIR": str(tmp_path / "state"), **extra}


def test_json5_file(tmp_path: Path, state: Path) -> None:
    write(state / "openclaw.json", """// written by hand
    {
      agents: {
        ownership: 'explicit', /* two agents */
        entries: { main: {}, "side-car": { workspace: '~/sc', }, },
      },
    }
    """)
    env = env_for(tmp_path)
    assert load_openclaw_config(state, env) == {
        "agents": {"ownership": "explicit", "entries": {"main": {}, "side-car": {"workspace": "~/sc"}}}}
    assert agent_workspace(state, "side-car", env) == tmp_path / "home" / "sc"
    assert agent_workspace(state, "main", env) == state / "workspace-main"


@pytest.mark.parametrize("text", ["{agents: ", "[1, 2]", '"text"', ""])
def test_unreadable_config_is_empty(tmp_path: Path, state: Path, text: str) -> None:
    write(state / "openclaw.json", text)
    issues: list[str] = []
    assert load_openclaw_config(state, env_for(tmp_path), issues=issues) == {}
    assert agent_workspace(state, "main", env_for(tmp_path)) == state / "workspace"


def test_missing_config_is_empty_without_issues(tmp_path: Path, state: Path) -> None:
    issues: list[str] = []
    assert load_openclaw_config(state, env_for(tmp_path), issues=issues) == {}
    assert issues == []


def test_includes(tmp_path: Path, state: Path) -> None:
    write(state / "openclaw.json", """{
      $include: "./base.json5",
      agents: { entries: { main: { workspace: "/over" } } },
      tools: { $include: ["parts/a.json5", "parts/b.json5"] },
    }""")
    write(state / "base.json5", '{agents: {ownership: "explicit", entries: {main: {workspace: "/base"}, work: {}}}, '
                                'list: [1]}')
    write(state / "parts" / "a.json5", '{list: ["a"], x: {$include: "./nested.json5"}}')  # relative to parts/
    write(state / "parts" / "nested.json5", "{deep: true}")
    write(state / "parts" / "b.json5", '{list: ["b"], y: 2}')
    issues: list[str] = []
    config = load_openclaw_config(state, env_for(tmp_path), issues=issues)
    assert issues == []
    assert config == {
        "agents": {"ownership": "explicit", "entries": {"main": {"workspace": "/over"}, "work": {}}},
        "list": [1],
        "tools": {"list": ["a", "b"], "x": {"deep": True}, "y": 2},
    }
    assert agent_workspace(state, "main", env_for(tmp_path)) == Path("/over")
    assert agent_workspace(state, "work", env_for(tmp_path)) == state / "workspace-work"


def test_include_outside_the_config_dir(tmp_path: Path, state: Path) -> None:
    write(tmp_path / "outside.json5", '{entries: {out: {workspace: "/out"}}, ownership: "explicit"}')
    write(state / "openclaw.json", '{agents: {$include: "../outside.json5"}, gateway: {port: 1}}')
    issues: list[str] = []
    assert load_openclaw_config(state, env_for(tmp_path), issues=issues) == {"gateway": {"port": 1}}
    assert issues and "escapes" in issues[0]
    (state / "link.json5").symlink_to(tmp_path / "outside.json5")
    write(state / "openclaw.json", '{agents: {$include: "./link.json5"}}')
    issues.clear()
    assert load_openclaw_config(state, env_for(tmp_path), issues=issues) == {}
    assert issues and "outside" in issues[0]
    roots = env_for(tmp_path, OPENCLAW_INCLUDE_ROOTS=str(tmp_path))
    assert load_openclaw_config(state, roots)["agents"] == {"entries": {"out": {"workspace": "/out"}},
                                                           "ownership": "explicit"}
    assert agent_workspace(state, "out", roots) == Path("/out")


@pytest.mark.parametrize(("files", "problem"), [
    ({"openclaw.json": '{a: {$include: "self.json5"}}', "self.json5": '{$include: "self.json5"}'}, "circular"),
    ({"openclaw.json": '{a: {$include: "nope.json5"}}'}, "cannot read"),
    ({"openclaw.json": '{a: {$include: 3}}'}, "invalid $include"),
    ({"openclaw.json": '{a: {$include: "s.json5", b: 1}}', "s.json5": "[1]"}, "object"),
    ({"openclaw.json": '{a: {$include: "bad.json5"}}', "bad.json5": "{"}, "cannot read"),
])
def test_broken_includes_drop_only_their_key(tmp_path: Path, state: Path, files: dict[str, str], problem: str) -> None:
    for name, text in files.items():
        write(state / name, text)
    issues: list[str] = []
    assert load_openclaw_config(state, env_for(tmp_path), issues=issues) == {}
    assert len(issues) == 1 and problem in issues[0]


def test_include_depth_limit(tmp_path: Path, state: Path) -> None:
    for level in range(12):
        write(state / f"l{level}.json5", f'{{$include: "l{level + 1}.json5"}}' if level < 11 else "{end: 1}")
    write(state / "openclaw.json", '{a: {$include: "l2.json5"}, b: {$include: "l0.json5"}}')
    issues: list[str] = []
    assert load_openclaw_config(state, env_for(tmp_path), issues=issues) == {"a": {"end": 1}}
    assert len(issues) == 1 and "depth" in issues[0]


def test_env_substitution(tmp_path: Path, state: Path) -> None:
    write(state / "openclaw.json", r"""{
      agents: { entries: { main: { workspace: "${WS_ROOT}/main" } } },
      notes: ["$${WS_ROOT}", "${lower}", "${NOT_SET}/x", "${EMPTY}", "$5 ${WS_ROOT"],
    }""")
    issues: list[str] = []
    env = env_for(tmp_path, WS_ROOT="/srv/ws", lower="l", EMPTY="")
    config = load_openclaw_config(state, env, issues=issues)
    assert config["notes"] == ["${WS_ROOT}", "${lower}", "${NOT_SET}/x", "${EMPTY}", "$5 ${WS_ROOT"]
    assert sorted(issues) == sorted([f"{state / 'openclaw.json'}: ${{NOT_SET}} is not set",
                                     f"{state / 'openclaw.json'}: ${{EMPTY}} is not set"])
    assert agent_workspace(state, "main", env) == Path("/srv/ws/main")


def test_config_env_section(tmp_path: Path, state: Path) -> None:
    """`env.vars` fills in variables that are unset or blank, before `${VAR}` substitution."""
    write(state / "openclaw.json", """{
      env: { vars: { OPENCLAW_WORKSPACE_DIR: "/from-config", ROOT: "/r", HOME: "/blocked", REF: "${ROOT}" } },
      agents: { entries: { main: { }, }, defaults: { } },
      notes: "${ROOT} ${REF}",
    }""")
    env = env_for(tmp_path)
    assert load_openclaw_config(state, env)["notes"] == "/r ${REF}"
    assert agent_workspace(state, "main", env) == Path("/from-config")
    assert agent_workspace(state, "main", {**env, "OPENCLAW_WORKSPACE_DIR": "/real"}) == Path("/real")
    assert agent_workspace(state, "main", {**env, "OPENCLAW_WORKSPACE_DIR": " "}) == Path("/from-config")
    oc_env = openclaw_environment(state, env)
    assert oc_env["HOME"] == str(tmp_path / "home") and "REF" not in oc_env


def test_config_env_home_moves_tilde_paths(tmp_path: Path, state: Path) -> None:
    write(state / "openclaw.json", '{env: {vars: {OPENCLAW_HOME: "/cfg-home"}}, '
                                   'agents: {defaults: {workspace: "~/w"}, entries: {main: {}}}}')
    assert agent_workspace(state, "main", env_for(tmp_path)) == Path("/cfg-home/w")


def test_dotenv_files(tmp_path: Path, state: Path) -> None:
    home = tmp_path / "home"
    write(state / ".env", "# state .env\nexport OPENCLAW_WORKSPACE_DIR='/from-dotenv' # comment\nOTHER=1\n"
                          "OPENCLAW_WORKSPACE_DIR=/later-in-file\n")
    assert agent_workspace(state, "main", env_for(tmp_path)) == Path("/later-in-file")
    assert agent_workspace(state, "main", env_for(tmp_path, OPENCLAW_WORKSPACE_DIR="")) == state / "workspace"
    # gateway.env is read only for the default state dir
    write(home / ".config" / "openclaw" / "gateway.env", 'OPENCLAW_WORKSPACE_DIR="/from-gateway-env"\n')
    assert agent_workspace(state, "main", env_for(tmp_path)) == Path("/later-in-file")
    default_state = home / ".openclaw"
    default_state.mkdir(parents=True)
    assert agent_workspace(default_state, "main", {"HOME": str(home)}) == Path("/from-gateway-env")
    write(default_state / ".env", "OPENCLAW_WORKSPACE_DIR=/state-env-first\n")
    assert agent_workspace(default_state, "main", {"HOME": str(home)}) == Path("/state-env-first")


def test_state_dir_given_without_the_variable(tmp_path: Path) -> None:
    """A state dir OpenClaw would not find from the home dir must have been set: it holds the default."""
    home, state = tmp_path / "home", tmp_path / "elsewhere"
    write(state / "openclaw.json", '{agents: {entries: {ops: {}}}}')
    assert agent_workspace(state, "ops", {"HOME": str(home)}) == state / "workspace"
    assert agent_workspace(home / ".openclaw", "main", {"HOME": str(home)}) == home / ".openclaw" / "workspace"


def test_config_path_variable_and_legacy_name(tmp_path: Path, state: Path) -> None:
    write(tmp_path / "elsewhere.json", '{agents: {ownership: "explicit", entries: {main: {}, z: {}}}}')
    env = env_for(tmp_path, OPENCLAW_CONFIG_PATH=str(tmp_path / "elsewhere.json"))
    assert agent_workspace(state, "main", env) == state / "workspace-main"
    write(state / "clawdbot.json", '{agents: {entries: {cb: {}}}}')
    assert agent_workspace(state, "cb", env_for(tmp_path)) == state / "workspace"
    write(state / "openclaw.json", '{agents: {entries: {oc: {}}}}')
    assert agent_workspace(state, "cb", env_for(tmp_path)) == state / "workspace-cb"


def test_nothing_is_created(tmp_path: Path) -> None:
    home = tmp_path / "home"
    before = set(tmp_path.rglob("*"))
    env = {"HOME": str(home), "OPENCLAW_PROFILE": "desk"}
    assert agent_workspace(home / ".openclaw", "main", env) == home / ".openclaw-desk" / "workspace"
    assert load_openclaw_config(home / ".openclaw", env) == {}
    assert set(tmp_path.rglob("*")) == before


# ---------------------------------------------------------------------------------------------
# The real OpenClaw CLI, on scratch dirs: `openclaw agents list --json` prints every configured
# agent's workspace (resolveAgentWorkspaceDir) and agentDir (<state dir>/agents/<id>/agent).

def _find_openclaw() -> tuple[Path, Path] | str:
    """(node, openclaw.mjs) from the tests' OpenClaw install, or why the comparison cannot run."""
    try:
        found = install()
    except InstallError as exc:
        if exc.unreachable and not os.environ.get("CI"):
            return f"the npm registry cannot be reached to install OpenClaw: {str(exc)[:300]}"
        raise
    return found.node_bin / "node", found.package / "openclaw.mjs"


@dataclass(frozen=True)
class CliCase:
    name: str
    config: str | None = None  # openclaw.json text, written where `config_at` says
    config_at: str = "{state}/openclaw.json"
    files: dict[str, str] = field(default_factory=dict)  # more files: path template -> text
    env: dict[str, str] = field(default_factory=dict)  # on top of HOME (templates)
    args: tuple[str, ...] = ()
    agents: int = 1  # how many agents the CLI must list


S = {"OPENCLAW_STATE_DIR": "{state}"}
CLI_CASES = [
    CliCase("no config, state dir set", env=S),
    CliCase("no config, home only", config_at="{home}/.openclaw/openclaw.json"),
    CliCase("legacy list, marker", '{agents: {defaults: {workspace: "~/d"}, list: [{id: "a"}, '
            '{id: "b", default: true}, {id: "c", workspace: "~/cc"}]}}', env=S, agents=3),
    CliCase("entries, marker", '{agents: {entries: {ops: {default: true}, main: {}}}}', env=S, agents=2),
    CliCase("explicit fleet", """{agents: {ownership: "explicit", entries: {
              main: {}, Work: {}, abs: {workspace: "{root}/abs/../abs2"}, tilde: {workspace: "~"},
              rel: {workspace: "./x/../rel"}, user: {workspace: "~user/x"}, spaced: {workspace: "  ~/sp  "},
              _x: {}, blank: {workspace: "  "}}}}""", env=S, agents=9),
    CliCase("explicit, defaults root", '{agents: {ownership: "explicit", defaults: {workspace: "~/fleet"}, '
            'entries: {main: {}, b: {}}}}', env=S, agents=2),
    CliCase("explicit, sole agent", '{agents: {ownership: "explicit", entries: {work: {}}}}', env=S),
    CliCase("one agent, defaults", '{agents: {defaults: {workspace: "~/solo"}, entries: {main: {}}}}', env=S),
    CliCase("json5, include, env", """// comments, trailing commas, an include and ${VAR}s
            {
              env: {vars: {FROM_CONFIG: "{root}/cfgvar"}},
              agents: {$include: "./agents.json5", defaults: {workspace: '${FROM_ENV}/defaults',},},
            }""", files={"{state}/agents.json5": """{ownership: "explicit", entries: {
              main: {}, inc: {workspace: "${FROM_CONFIG}/inc"}, esc: {workspace: "/srv/$${X}"},
            },}"""}, env={**S, "FROM_ENV": "{root}/envvar"}, agents=3),
    CliCase("OPENCLAW_WORKSPACE_DIR with a tilde", env={**S, "OPENCLAW_WORKSPACE_DIR": "~/literal"}),
    CliCase("--profile", config_at="{home}/.openclaw-desk/openclaw.json", args=("--profile", "desk")),
    CliCase("OPENCLAW_PROFILE alone", config_at="{home}/.openclaw/openclaw.json", env={"OPENCLAW_PROFILE": "desk"}),
    CliCase("OPENCLAW_HOME with a tilde", config_at="{home}/och/.openclaw/openclaw.json",
            env={"OPENCLAW_HOME": "~/och"}),
    CliCase("state .env moves the home", '{agents: {defaults: {workspace: "~/w"}, entries: {main: {}}}}',
            files={"{state}/.env": "OPENCLAW_HOME={root}/dothome\n"}, env=S),
    CliCase("gateway.env", config_at="{home}/.openclaw/openclaw.json",
            files={"{home}/.config/openclaw/gateway.env": "OPENCLAW_WORKSPACE_DIR={root}/gwenv\n"}),
    CliCase("legacy ~/.clawdbot", '{agents: {ownership: "explicit", entries: {main: {}, b: {}}}}',
            config_at="{home}/.clawdbot/openclaw.json", agents=2),
    CliCase("OPENCLAW_CONFIG_PATH", '{agents: {ownership: "explicit", entries: {main: {}, z: {}}}}',
            config_at="{root}/elsewhere.json", env={**S, "OPENCLAW_CONFIG_PATH": "{root}/elsewhere.json"}, agents=2),
]


@dataclass
class CliRun:
    case: CliCase
    root: Path
    env: dict[str, str]
    cwd: Path
    listed: list[dict[str, Any]]


def _run_case(node: Path, entry: Path, case: CliCase, root: Path) -> CliRun:
    def fill(text: str) -> str:
        return (text.replace("{root}", str(root)).replace("{home}", str(root / "home"))
                .replace("{state}", str(root / "state")))

    home, cwd = root / "home", root / "cwd"
    home.mkdir(parents=True)
    cwd.mkdir()
    if case.config is not None:
        write(Path(fill(case.config_at)), fill(case.config))
    else:
        Path(fill(case.config_at)).parent.mkdir(parents=True, exist_ok=True)  # so the state dir exists
    for path, text in case.files.items():
        write(Path(fill(path)), fill(text))
    env = {"HOME": str(home), **{key: fill(value) for key, value in case.env.items()}}
    run_env = {**env, "PATH": f"{node.parent}:/usr/bin:/bin", "NO_COLOR": "1"}
    done = subprocess.run([str(node), str(entry), *case.args, "agents", "list", "--json"], cwd=cwd, env=run_env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{case.name}: openclaw exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    listed = json.loads(done.stdout)
    assert isinstance(listed, list), f"{case.name}: {done.stdout}"
    if case.args == ("--profile", "desk"):  # what applyCliProfileEnv puts in OpenClaw's environment
        state = home / ".openclaw-desk"
        env.update(OPENCLAW_PROFILE="desk", OPENCLAW_STATE_DIR=str(state),
                   OPENCLAW_CONFIG_PATH=str(state / "openclaw.json"))
    return CliRun(case, root, env, cwd, listed)


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, CliRun]]:
    found = _find_openclaw()
    if isinstance(found, str):
        pytest.skip(found)
    node, entry = found
    base = tmp_path_factory.mktemp("openclaw-cli")
    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
        futures = {case.name: pool.submit(_run_case, node, entry, case, base / f"case{n}")
                   for n, case in enumerate(CLI_CASES)}
        yield {name: future.result() for name, future in futures.items()}


def _installed_version() -> str:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return str(json.loads((install_prefix() / "openclaw" / "node_modules" / "openclaw" / "package.json")
                              .read_text())["version"])
    return "?"


@pytest.mark.parametrize("name", [case.name for case in CLI_CASES])
def test_matches_the_real_openclaw_cli(cli_runs: Mapping[str, CliRun], name: str) -> None:
    run = cli_runs[name]
    assert len(run.listed) == run.case.agents, run.listed
    for agent in run.listed:
        # agentDir is <state dir>/agents/<id>/agent: the state dir this OpenClaw actually used
        state_dir = Path(agent["agentDir"]).parents[2]
        ours = agent_workspace(state_dir, agent["id"], run.env, cwd=run.cwd)
        assert ours == Path(agent["workspace"]), (
            f"{name}: agent {agent['id']}: OpenClaw {_installed_version()} says {agent['workspace']}, we say {ours}"
            f" (rules from {OPENCLAW_VERSION})")


@pytest.mark.parametrize(("config", "removed"), [
    ({"agents": {"ownership": "explicit", "entries": {"main": {}}}}, True),  # what `agents delete ops` leaves
    ({"agents": {"ownership": "explicit", "entries": {"main": {}, "ops": {}}}}, False),
    ({"agents": {"list": [{"id": "main"}, {"id": "Ops"}]}}, False),
    ({"agents": {"list": [{"id": "main"}]}}, True),
    ({"agents": {"defaults": {}}}, False),  # no roster: nothing says which agents there are
    (None, False),  # no openclaw.json
])
def test_an_agent_removed_from_the_roster(tmp_path: Path, config: dict[str, Any] | None, removed: bool) -> None:
    state = tmp_path / "state"
    state.mkdir()
    if config is not None:
        (state / "openclaw.json").write_text(json.dumps(config))
    assert agent_removed(state, "ops", state / "workspace-ops", {"HOME": str(tmp_path)}) is removed
    (state / "workspace-ops").mkdir()
    assert not agent_removed(state, "ops", state / "workspace-ops", {"HOME": str(tmp_path)})  # still there
