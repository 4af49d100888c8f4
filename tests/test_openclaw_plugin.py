"""The OpenClaw memory plugin (`integrations/openclaw/`) in the real OpenClaw 2026.9.6, with the real daemon.

One world for the module (the gateway costs ~10-40 s to start, each agent's first turn ~15-30 s): the real
veritas-watch daemon, the real gateway with two agents and the mock model, the plugin installed the way the
README says (`openclaw plugins install <dir>` on the running gateway; memory-core disabled, conversation
hooks allowed) with no setting telling it where the daemon is: it finds the daemon's Unix socket in the
default data dir of the gateway's user (`~/.local/state/veritas-watch/api.sock`, zero config). That socket
is a recording proxy (real HTTP over Unix sockets both ways, requests passed on unchanged to the daemon's
own socket), so the tests can see which agent id every request carried.

The story: `main` tells a fact, then `/new`; in the new conversation `main` asks about it (auto-recall puts
it before the user's message, the model calls `memory_search` through Tool Search's `tool_call`, as
OpenClaw 2026.9's default tool surface has it) and reads it with `memory_get`; `ops` asks the same
question and must get nothing of `main`'s; then the daemon stops and `main` asks again: the turn completes
and the plugin logs one warning. Meanwhile, in a thread, the packed tarball (`npm pack`) is installed into a
state dir of its own and checked with `openclaw plugins inspect veritas-watch --runtime --json`.

Skipped, with the reason, only where the npm registry cannot be reached and `CI` is not set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socketserver
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, wait_for
from tests.mock_model import MockModel, Plan, last_user_turn
from tests.openclaw_harness import (
    OpenClawGateway,
    OpenClawInstall,
    TranscriptRow,
    free_port,
    install_or_skip,
    running_gateway,
)
from veritas_watch.client import UnixHTTPConnection

pytestmark = pytest.mark.long  # minutes: started first (tests/conftest.py)

PLUGIN = Path(__file__).resolve().parents[1] / "integrations" / "openclaw"
TOKEN = "vw-plugin-test-token-7d2c-0123456789abcdef"
FACT = "Remember this: my sister Ingrid's birthday is on 14 March and she loves orchids."
QUESTION = "When is Ingrid's birthday?"
MARKERS = ("14 March", "orchids")  # what only main's memory holds
RECALL_MAX_CHARS = 1200


@pytest.fixture(scope="module")
def openclaw() -> OpenClawInstall:
    return install_or_skip()


# -- between the plugin and the daemon ----------------------------------------------------------------

@dataclass(frozen=True)
class ProxiedCall:
    at: float  # time.time() when the plugin's request arrived
    path: str
    body: dict[str, Any]
    authorization: str | None
    status: int | None  # None: the daemon did not answer


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class RecordingProxy:
    """Listens on `<data_dir>/api.sock` where the plugin looks by default, passes its requests to the daemon's
    own socket unchanged and keeps a copy; real HTTP over Unix sockets on both sides."""

    def __init__(self, data_dir: Path, upstream: Callable[[], Path]) -> None:
        self.upstream = upstream
        self.path = data_dir / "api.sock"
        data_dir.mkdir(parents=True, mode=0o700)
        self.calls: list[ProxiedCall] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_POST(self) -> None:
                at = time.time()
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
                status: int | None
                conn = UnixHTTPConnection(proxy.upstream(), timeout=30)
                try:
                    conn.request("POST", self.path, body=raw, headers=headers)
                    response = conn.getresponse()
                    status, answer, kind = response.status, response.read(), response.headers.get("Content-Type")
                except OSError:
                    status = None
                finally:
                    conn.close()
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {"raw": raw.decode(errors="replace")}
                with proxy._lock:
                    proxy.calls.append(ProxiedCall(at, self.path, body, self.headers.get("Authorization"), status))
                if status is None:
                    self.close_connection = True  # the daemon is gone: so is the answer
                    return
                self.send_response(status)
                self.send_header("Content-Type", kind or "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self._server = _UnixHTTPServer(str(self.path), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="vw-proxy", daemon=True)

    def start(self) -> RecordingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        """The socket is gone, as when the daemon stops (it removes its socket)."""
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)


def daemon_post(daemon: DaemonProcess, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(daemon.base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


# -- the packed tarball ----------------------------------------------------------------------------------

@dataclass
class PackedInstall:
    """`npm pack`, then `openclaw plugins install npm-pack:<tgz>` into a state dir of its own and
    `openclaw plugins inspect veritas-watch --runtime --json` there, as the README says to verify.

    Two slow CLI runs that share nothing with the world: they run in a thread while the world's gateway
    starts and its turns run.
    """

    openclaw: OpenClawInstall
    root: Path
    names: set[str] = field(default_factory=set)  # the tarball's files
    inspected: subprocess.CompletedProcess[str] | None = None
    skipped: str = ""
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> PackedInstall:
        self.thread = threading.Thread(target=self._run, name="packed-install", daemon=True)
        self.thread.start()
        return self

    def wait(self, timeout: float = 600) -> PackedInstall:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the packed install did not finish within {timeout}s"
        return self

    def _run(self) -> None:
        try:
            self._install()
        except BaseException as exc:  # handed to the test that reads it
            self.error = exc

    def _install(self) -> None:
        npm = shutil.which("npm")
        if npm is None:
            self.skipped = "npm is not installed (needed to pack the plugin)"
            return
        self.root.mkdir(parents=True, exist_ok=True)
        packed = subprocess.run([npm, "pack", "--pack-destination", str(self.root), "--json"], cwd=PLUGIN,
                                capture_output=True, text=True, timeout=120, check=True)
        tarball = self.root / json.loads(packed.stdout)[0]["filename"]
        with tarfile.open(tarball) as archive:
            self.names = set(archive.getnames())
        model = MockModel().start()  # no turn runs here: only its address goes into the config
        try:
            settings = {"url": "http://127.0.0.1:9", "timeoutMs": 500}
            gw = OpenClawGateway(self.openclaw, self.root / "world", model, {"main": {"name": "Main"}}, extra_config={
                "plugins": {"entries": {"memory-core": {"enabled": False}, "veritas-watch": {
                    "hooks": {"allowConversationAccess": True}, "config": settings}}}})
            for path in (gw.state_dir, gw.home, gw.root / "tmp"):
                path.mkdir(parents=True, exist_ok=True)
            gw.port = free_port()
            (gw.state_dir / "openclaw.json").write_text(json.dumps(gw.config(), indent=2))
            gw.run("plugins", "install", f"npm-pack:{tarball}", "--force", "--accept-capabilities")
            self.inspected = gw.run("plugins", "inspect", "veritas-watch", "--runtime", "--json")
        finally:
            model.stop()


# -- the world ------------------------------------------------------------------------------------------

@dataclass
class World:
    gateway: OpenClawGateway
    daemon: DaemonProcess
    proxy: RecordingProxy
    requests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # step -> the model's requests
    packed: PackedInstall | None = None
    fact_id: str = ""
    log_before_outage: str = ""

    def turn(self, step: str, agent: str, text: str, plan: Plan | None = None) -> str:
        """One turn; the model requests it caused are kept under `step`."""
        if plan is not None:
            self.gateway.model.plan(text, plan)
        before = len(self.gateway.model.requests)
        reply = self.gateway.agent(agent, text).reply
        self.requests[step] = self.gateway.model.requests[before:]
        return reply


def tool_call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """The arguments of OpenClaw's Tool Search `tool_call` (the default surface hides plugin tools behind it)."""
    return {"id": tool, "args": args}


@pytest.fixture(scope="module")
def world(openclaw: OpenClawInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("openclaw-plugin")
    packed = PackedInstall(openclaw, root / "packed").start()
    daemon = DaemonProcess(root / "state", root / "vw-data", {"HOME": str(root / "home")},
                           config={"http": {"token": TOKEN}})
    # Where the plugin looks with no setting: the gateway user's default data dir (its HOME is root/home).
    proxy = RecordingProxy(root / "home" / ".local" / "state" / "veritas-watch",
                           lambda: daemon.data_dir / "api.sock").start()
    settings = {"timeoutMs": 3000, "recallMaxChars": RECALL_MAX_CHARS}  # nothing about where the daemon is
    plugins = {"entries": {"memory-core": {"enabled": False},
                           "veritas-watch": {"hooks": {"allowConversationAccess": True}, "config": settings}}}
    agents = {"main": {"name": "Main"}, "ops": {"name": "Ops"}}
    try:
        with running_gateway(openclaw, root, agents, extra_config={"plugins": plugins}) as gw:
            daemon.start()
            installed = gw.install_plugin(PLUGIN)
            assert installed.get("slots", {}).get("memory") == "veritas-watch", installed
            w = World(gw, daemon, proxy)
            try:
                drive(w)
                w.packed = packed.wait()
                yield w
            finally:
                if daemon.running:
                    daemon.stop()
    finally:
        proxy.stop()


def drive(w: World) -> None:
    gw = w.gateway
    w.turn("tell", "main", FACT)
    found = wait_for(lambda: [r for r in daemon_post(w.daemon, "/memory/search", {
        "agent_id": "main", "query": "Ingrid birthday orchids"})["results"] if r["text"] == FACT],
        timeout=120, interval=0.3, what="veritas-watch stored the fact")
    w.fact_id = found[0]["id"]
    gw.agent("main", "/new")  # a new conversation: the fact is no longer in the model's context
    # `since` as a number (epoch seconds, 2001): OpenClaw checks the arguments against the tool's schema first
    search = tool_call("memory_search", {"query": "Ingrid birthday", "since": 1_000_000_000})
    w.turn("ask", "main", QUESTION, Plan(reply="Ingrid's birthday is on 14 March.", tool="tool_call", arguments=search))
    w.turn("get", "main", "Show me exactly what I said about it.",
           Plan(reply="That is what you said.", tool="tool_call",
                arguments=tool_call("memory_get", {"id": w.fact_id, "neighbours": 1})))
    w.turn("other_agent", "ops", QUESTION, Plan(reply="I have nothing on Ingrid.", tool="tool_call", arguments=search))
    w.log_before_outage = gw.log_text()
    w.daemon.stop()
    w.proxy.stop()
    w.turn("down", "main", QUESTION, Plan(reply="I cannot check my memory right now.", tool="tool_call",
                                          arguments=search))


# -- reading what OpenClaw did --------------------------------------------------------------------------

def text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def user_message_of(request: dict[str, Any]) -> str:
    """The user's message as this model request shows it (with whatever was put before it)."""
    text, _ = last_user_turn([m for m in request.get("messages", []) if isinstance(m, dict)])
    return text


def tool_results(rows: list[TranscriptRow], after_seq: int = -1) -> list[str]:
    """The text of each tool result OpenClaw wrote into the transcript (unwrapping Tool Search's tool_call)."""
    out = []
    for row in rows:
        if row.role != "toolResult" or row.seq <= after_seq:
            continue
        try:
            wrapped = json.loads(row.text)
            out.append(f"{wrapped['tool']['id']}\n{text_of(wrapped['result']['content'])}")
        except (ValueError, KeyError, TypeError):
            out.append(row.text)
    return out


def reset_seq(rows: list[TranscriptRow]) -> int:
    resets = [r.seq for r in rows if r.type == "reset"]
    assert resets, "no /new reset event in the transcript"
    return resets[-1]


def plugin_log_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "[plugins] veritas-watch:" in line]


# -- the tests ------------------------------------------------------------------------------------------

def test_the_packed_tarball_installs_and_loads(world: World) -> None:
    packed = world.packed
    assert packed is not None
    if packed.skipped:
        if os.environ.get("CI"):
            raise AssertionError(packed.skipped)
        pytest.skip(packed.skipped)
    if packed.error is not None:
        raise packed.error
    assert {"package/index.js", "package/openclaw.plugin.json", "package/src/plugin.js"} <= packed.names
    assert not any(name.startswith("package/test/") for name in packed.names)
    inspected = packed.inspected
    assert inspected is not None
    report = json.loads(inspected.stdout[inspected.stdout.index("{"):])
    plugin = report["plugin"]
    assert plugin["status"] == "loaded" and plugin["activated"] is True
    assert plugin["kind"] == "memory" and plugin["memorySlotSelected"] is True
    assert sorted(plugin["toolNames"]) == ["memory_get", "memory_search"]
    assert [h.get("name") for h in report["typedHooks"]] == ["before_prompt_build"], report["typedHooks"]
    assert report["diagnostics"] == [], report["diagnostics"]
    assert report["install"]["source"] == "npm"
    # the plugin said nothing about its setup (it would: "veritas-watch: memory-core is enabled ...")
    assert not re.search(r"(?m)(^|\s)veritas-watch: ", inspected.stderr + inspected.stdout)


def test_memory_search_finds_a_fact_of_an_earlier_conversation(world: World) -> None:
    rows = world.gateway.transcript_rows("main")
    told = next(r for r in rows if r.role == "user" and FACT in r.text)
    results = tool_results(rows, after_seq=reset_seq(rows))
    assert results, "no tool result after /new"
    first = results[0]
    assert first.startswith("openclaw:veritas-watch:memory_search"), first[:200]
    assert FACT in first, first
    # cited with session, time and role
    line = next(line for line in first.splitlines() if "· user ·" in line and f"id {world.fact_id}" in line)
    assert f"session {told.session_id}" in line
    assert re.search(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", line)


def test_auto_recall_puts_the_fact_before_the_users_message(world: World) -> None:
    requests = world.requests["ask"]
    assert requests, "the model got no request for the question"
    first = requests[0]
    message = user_message_of(first)
    assert QUESTION in message
    block = re.search(r"<veritas-watch-memory>\n.*?\n</veritas-watch-memory>", message, re.S)
    assert block, f"no recall block before the user's message: {message[:600]!r}"
    assert FACT in block.group(0)
    assert len(block.group(0)) <= RECALL_MAX_CHARS
    assert message.index(block.group(0)) < message.index(QUESTION)
    # it came from memory, not from the conversation: after /new nothing else in the request holds it
    rest = json.dumps(first["messages"]).replace(json.dumps(block.group(0))[1:-1], "")
    assert not any(marker in rest for marker in MARKERS)
    # and the recall never reaches OpenClaw's transcript, so veritas-watch never stores it as a new memory
    rows = world.gateway.transcript_rows("main")
    asked = [r for r in rows if r.role == "user" and QUESTION in r.text]
    assert asked and all("veritas-watch-memory" not in r.text for r in asked)
    # the first turn, before anything was stored, had no block
    assert all("<veritas-watch-memory>" not in user_message_of(r) for r in world.requests["tell"])
    # what the plugin asked: the user's own words, without OpenClaw's envelope, runtime line or history
    ask = next(t for t in world.gateway.turns if t.agent == "main" and t.message == QUESTION)
    asked = [c.body for c in world.proxy.calls if c.path == "/memory/context" and ask.started <= c.at <= ask.finished]
    # recallLimit (6), and the texts the model already holds (here the question itself) for the daemon to leave
    # out before its relevance floor
    assert asked == [{"query": QUESTION, "limit": 6, "exclude": [QUESTION], "agent_id": "main"}], asked


def test_memory_get_reads_the_fact_with_the_turn_after_it(world: World) -> None:
    rows = world.gateway.transcript_rows("main")
    got = [r for r in tool_results(rows) if r.startswith("openclaw:veritas-watch:memory_get")]
    assert got, "no memory_get result in the transcript"
    lines = got[0].splitlines()
    marked = [i for i, line in enumerate(lines) if line.startswith(">")]
    assert len(marked) == 1 and FACT in lines[marked[0]], got[0]
    assert re.search(r"· assistant: Understood, noted", lines[marked[0] + 1]), got[0]  # the turn after it


def test_another_agent_never_receives_main_s_memory(world: World) -> None:
    requests = world.requests["other_agent"]
    assert len(requests) >= 2, "ops's turn did not call the tool"
    for request in requests:
        text = json.dumps(request)
        assert not any(marker in text for marker in MARKERS), "main's memory reached ops's model"
    rows = world.gateway.transcript_rows("ops")
    results = tool_results(rows)
    assert results and results[0].startswith("openclaw:veritas-watch:memory_search")
    assert not any(marker in results[0] for marker in MARKERS)
    # every request the plugin made carried the agent of the turn that made it; over the socket, no token
    calls = [c for c in world.proxy.calls if c.path.startswith("/memory/")]
    assert {c.path for c in calls} >= {"/memory/context", "/memory/search", "/memory/get"}
    for turn in world.gateway.turns:
        during = [c for c in calls if turn.started <= c.at <= turn.finished]
        assert all(c.body.get("agent_id") == turn.agent for c in during), (turn.agent, [c.body for c in during])
    assert {c.body.get("agent_id") for c in calls} == {"main", "ops"}
    assert all(c.authorization is None for c in calls)
    assert all(c.status == 200 for c in calls)


def test_with_the_daemon_stopped_the_turn_completes_and_one_warning_is_logged(world: World) -> None:
    down = next(t for t in reversed(world.gateway.turns) if t.message == QUESTION and t.agent == "main")
    assert down.reply == "I cannot check my memory right now."
    requests = world.requests["down"]
    assert requests and all("<veritas-watch-memory>" not in user_message_of(r) for r in requests)
    rows = world.gateway.transcript_rows("main")
    last = tool_results(rows)[-1]
    assert "Memory is unavailable right now" in last, last
    assert plugin_log_lines(world.log_before_outage) == [], "the plugin warned before the outage"
    lines = plugin_log_lines(world.gateway.log_text())
    assert len(lines) == 1, lines  # two failed calls in this turn (recall, then the tool): one line
    assert re.search(r"veritas-watch: auto-recall failed: no veritas-watch socket in .*/home/\.local/state/"
                     r"veritas-watch, .* \(is the daemon running\?\)", lines[0]), lines[0]
    assert TOKEN not in world.gateway.log_text()
    assert "Ingrid" not in lines[0]


def test_a_port_squatter_gets_nothing_from_the_plugin_in_the_real_gateway(openclaw: OpenClawInstall,
                                                                          tmp_path: Path) -> None:
    """Issue 37 finding 5, end to end: the plugin set to a daemon's TCP port (url, token) where another process
    listens first. A turn's auto-recall asks it to prove it holds the token, gets no proof, and sends nothing
    more: no Authorization, none of the person's words; nothing of its answer reaches the model; one warning."""
    from tests.test_local_access import Squatter

    squatter = Squatter()
    words = "What did I decide about the heron-shaped weathervane?"
    settings = {"url": f"http://127.0.0.1:{squatter.port}", "token": TOKEN, "timeoutMs": 3000}
    plugins = {"entries": {"memory-core": {"enabled": False},
                           "veritas-watch": {"hooks": {"allowConversationAccess": True}, "config": settings}}}
    try:
        with running_gateway(openclaw, tmp_path, {"main": {"name": "Main"}}, extra_config={"plugins": plugins}) as gw:
            gw.install_plugin(PLUGIN)
            gw.model.plan(words, Plan(reply="I do not know."))
            before = len(gw.model.requests)
            gw.agent("main", words)
            requests = gw.model.requests[before:]
            log = gw.log_text()
    finally:
        squatter.close()
    assert requests and all("evil.example" not in json.dumps(r) and "<veritas-watch-memory>" not in
                            user_message_of(r) for r in requests)
    assert squatter.seen, "the plugin never asked (auto-recall did not run)"
    assert all(s["method"] == "GET" and s["path"] == "/health" for s in squatter.seen), squatter.seen
    for seen in squatter.seen:
        assert "authorization" not in {k.lower() for k in seen["headers"]}
        assert TOKEN not in json.dumps(seen) and "weathervane" not in json.dumps(seen)
    lines = plugin_log_lines(log)
    assert len(lines) == 1 and "did not prove it holds the token; another process may be listening there" in lines[0]
    assert TOKEN not in log
