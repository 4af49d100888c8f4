"""The memory API over real HTTP, against `veritas-watch run` as a subprocess with a bearer token.

Isolation (1,000 random queries that name and quote other agents' memories: zero leaks), token
auth, 400s with a message for bad bodies, the loop guard, /memory/add and /memory/context,
context expansion across tool lines, role and time filters, and the relevance floor.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, header, line, message

TOKEN = "test-token-5b1f-0123456789abcdef-0123456789"
AGENTS = [f"agent{i}" for i in range(8)]
PER_AGENT = 10
NOUNS = ("heron", "mill", "ferry", "lantern", "orchard", "granite", "violet", "harbor", "meadow", "copper",
         "willow", "summit", "pepper", "canyon", "maple", "glacier", "saffron", "thistle", "quartz", "river")
VERBS = ("repaired", "painted", "sold", "photographed", "measured", "moved", "cleaned", "booked")
LOOPER = "looper"
HINT_AFTER, STOP_AFTER = 120, 150  # above the isolation test's 1,000 / 8 searches per agent
EXPAND_AGENT = "expander"


def memory_text(rng: random.Random, agent: str, n: int) -> str:
    a, b, c = rng.sample(NOUNS, 3)
    return f"{agent} note {n}: we {rng.choice(VERBS)} the {a} by the {b} near the {c} on day {rng.randrange(1, 29)}"


class TokenDaemon(DaemonProcess):
    """The harness daemon, spoken to with the bearer token (the harness's idle barrier needs /status)."""

    def call(self, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN,
             ) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.base + path, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw  # not one JSON document (the /export stream)

    def get(self, path: str) -> Any:
        status, answer = self.call("GET", path)
        assert status == 200, (path, status, answer)
        return answer

    def post(self, path: str, body: dict[str, Any]) -> Any:
        status, answer = self.call("POST", path, json.dumps(body).encode())
        assert status == 200, (path, status, answer)
        return answer

    def export_http(self, agent: str | None = None) -> list[dict[str, Any]]:
        status, raw = self.call("GET", "/export" + (f"?agent={agent}" if agent else ""))
        assert status == 200
        text = raw.decode() if isinstance(raw, bytes) else json.dumps(raw)  # a single point parses whole
        return [json.loads(r) for r in text.splitlines() if r.strip()]


def write_agents(state_dir: Path) -> dict[str, set[str]]:
    rng = random.Random(8)
    texts: dict[str, set[str]] = {}
    for agent in [*AGENTS, LOOPER]:
        sessions = state_dir / "agents" / agent / "sessions"
        sessions.mkdir(parents=True)
        lines = [header("s1")]
        texts[agent] = set()
        for n in range(PER_AGENT):
            text = memory_text(rng, agent, n)
            texts[agent].add(text)
            lines.append(message(f"m{n}", "user" if n % 2 == 0 else "assistant", text,
                                 ts=f"2026-03-{10 + n:02d}T09:00:00.000Z"))
        (sessions / "s1.jsonl").write_bytes(b"".join(lines))
    # A question and its answer with tool lines between them: neighbours are found by order, not line + 1.
    sessions = state_dir / "agents" / EXPAND_AGENT / "sessions"
    sessions.mkdir(parents=True)
    tool_call = line({"type": "message", "id": "tc", "parentId": None, "timestamp": "2026-03-20T10:00:02.000Z",
                      "message": {"role": "assistant", "stopReason": "toolUse", "content": [
                          {"type": "toolCall", "name": "timetable", "arguments": {"route": "rebun"}}]}})
    (sessions / "s2.jsonl").write_bytes(b"".join([
        header("s2"),
        message("q1", "user", "When does the first ferry to Rebun island leave tomorrow?",
                ts="2026-03-20T10:00:01.000Z"),
        tool_call,
        message("tr", "toolResult", "07:15 Wakkanai pier, 10:40, 14:25", ts="2026-03-20T10:00:03.000Z"),
        message("a1", "assistant", "It departs at 07:15 from the Wakkanai pier; buy tickets at the kiosk.",
                ts="2026-03-20T10:00:04.000Z"),
        message("q2", "user", "Thanks. Please also book a table for dinner in Sapporo on Friday.",
                ts="2026-03-21T18:00:00.000Z"),
    ]))
    return texts


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TokenDaemon, dict[str, set[str]]]]:
    root = tmp_path_factory.mktemp("memory-api")
    texts = write_agents(root / "state")
    config: dict[str, dict[str, object]] = {
        "http": {"token": TOKEN},
        "search": {"loop_window": 3600.0, "loop_hint_after": HINT_AFTER, "loop_stop_after": STOP_AFTER},
    }
    proc = TokenDaemon(root / "state", root / "data", config=config)
    proc.start()
    try:
        proc.wait_idle(timeout=180)
        yield proc, texts
    finally:
        proc.stop()


def test_isolation_under_random_cross_agent_queries(daemon: tuple[TokenDaemon, dict[str, set[str]]]) -> None:
    client, texts = daemon
    rng = random.Random(1000)
    askers = AGENTS * (1000 // len(AGENTS))  # 125 each: under the loop guard's hint
    rng.shuffle(askers)
    answered = 0
    for asker in askers:
        victim = rng.choice([a for a in AGENTS if a != asker])
        words = rng.choice(sorted(texts[victim])).split()
        query = " ".join(rng.sample(words, min(len(words), rng.randrange(3, 9))))
        if rng.random() < 0.3:
            query = f"{victim} {query}"  # name the other agent outright
        endpoint = rng.choice(("/memory/search", "/memory/context", "/search"))
        body = {"agent_id": asker, "query": query, "limit": rng.randrange(1, 20), "floor": False,
                "mode": rng.choice(("hybrid", "hybrid", "dense", "sparse"))}
        answer = client.post(endpoint, body)
        results = answer if endpoint == "/search" else answer["results"]
        answered += bool(results)
        for r in results:
            assert r["agent_id"] == asker and not any(r["text"] in texts[a] for a in AGENTS if a != asker), (
                asker, query, r)
            assert r["text"] in texts[asker] or r["type"] == "knowledge"  # /memory/add's test adds some
        if endpoint == "/memory/context":
            for other in AGENTS:
                if other != asker:
                    assert not any(t in answer["context"] for t in texts[other])
    assert answered > 900  # the queries do find things: a leak would have had its chance


def test_a_search_without_agent_is_refused(daemon: tuple[TokenDaemon, dict[str, set[str]]]) -> None:
    client, _ = daemon
    for path in ("/memory/search", "/memory/context", "/search"):
        status, answer = client.call("POST", path, json.dumps({"query": "heron mill"}).encode())
        assert status == 400 and "agent_id" in answer["error"]


def test_token_auth(daemon: tuple[TokenDaemon, dict[str, set[str]]]) -> None:
    client, _ = daemon
    body = json.dumps({"agent_id": "agent0", "query": "heron"}).encode()
    for path in ("/memory/search", "/memory/context", "/memory/add", "/search"):
        assert client.call("POST", path, body, token=None)[0] == 401
        assert client.call("POST", path, body, token="wrong")[0] == 401
    assert client.call("GET", "/status", token=None)[0] == 401
    status, health = client.call("GET", "/health", token=None)
    assert status == 200 and health["status"] == "ok"
    assert client.call("POST", "/memory/search", body)[0] == 200


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/memory/search", b"{not json", "JSON object"),
    ("/memory/search", b"[1, 2]", "JSON object"),
    ("/memory/search", b'{"query": "x"}', "agent_id"),
    ("/memory/search", b'{"agent_id": "agent0"}', "missing field: query"),
    ("/memory/search", b'{"agent_id": "agent0", "query": "  "}', "query"),
    ("/memory/search", b'{"agent_id": "agent0", "query": "x", "limit": "ten"}', "limit"),
    ("/memory/search", b'{"agent_id": "agent0", "query": "x", "limit": 0}', "limit"),
    ("/memory/search", b'{"agent_id": "agent0", "query": "x", "mode": "fuzzy"}', "mode"),
    ("/memory/search", b'{"agent_id": "agent0", "query": "x", "roles": ["system"]}', "roles"),
    ("/memory/search", b'{"agent_id": "agent0", "query": "x", "since": "yesterday"}', "since"),
    ("/memory/context", b'{"agent_id": 7, "query": "x"}', "agent_id"),
    ("/memory/context", b'{"agent_id": "agent0", "query": "x", "exclude": "x"}', "exclude"),
    ("/memory/search", b'{"agent_id": "agent0", "query": "x", "exclude": [1]}', "exclude"),
    ("/memory/search", b'{"agent_id": "agent0", "query": "x", "exclude": ["a"' + b', "b"' * 200 + b']}',
     "exclude"),
    ("/memory/search", b'{"agent_id": "agent0", "query": "x", "conversation": 5}', "conversation"),
    ("/memory/context", b"", "JSON object"),
    ("/memory/add", b'{"agent_id": "agent0"}', "missing field: text"),
    ("/memory/add", b'{"text": "remember me"}', "missing field: agent_id"),
    ("/memory/add", b'{"agent_id": "agent0", "text": "x", "role": "system"}', "role"),
    ("/memory/add", b'{"agent_id": "agent0", "text": "x", "metadata": [1]}', "metadata"),
])
def test_bad_bodies_get_400_with_a_message(daemon: tuple[TokenDaemon, dict[str, set[str]]], path: str,
                                           body: bytes, message: str) -> None:
    client, _ = daemon
    status, answer = client.call("POST", path, body)
    assert status == 400, answer
    assert message in answer["error"]


def test_loop_guard_hints_then_stops(daemon: tuple[TokenDaemon, dict[str, set[str]]]) -> None:
    client, texts = daemon
    query = json.dumps({"agent_id": LOOPER, "query": next(iter(texts[LOOPER])), "mode": "sparse"}).encode()
    for _ in range(STOP_AFTER + 1):  # auto-recall's context block, once per user turn: not the model's loop
        status, answer = client.call("POST", "/memory/context", query)
        assert status == 200 and "hint" not in answer and answer["count"] > 0
    for n in range(1, STOP_AFTER + 1):
        status, answer = client.call("POST", "/memory/search", query)
        assert status == 200
        assert ("hint" in answer) == (n > HINT_AFTER), n
    assert "stop searching" in answer["hint"].lower()
    status, answer = client.call("POST", "/memory/search", query)
    assert status == 429 and "stop searching" in answer["error"] and answer["retry_after"] > 0
    # another conversation of the same agent is not this loop; every one of them is counted on its own
    elsewhere = json.dumps({"agent_id": LOOPER, "query": "heron", "conversation": "agent:looper:other"}).encode()
    status, answer = client.call("POST", "/memory/search", elsewhere)
    assert status == 200 and "hint" not in answer
    # other agents search on; the operator's /search is not an agent's loop
    other = json.dumps({"agent_id": "agent1", "query": "heron"}).encode()
    assert client.call("POST", "/memory/search", other)[0] == 200
    assert client.call("POST", "/search", query)[0] == 200


def test_add_is_redacted_idempotent_and_searchable(daemon: tuple[TokenDaemon, dict[str, set[str]]]) -> None:
    client, _ = daemon
    secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    text = f"Remember: the deploy bot's GitHub token is {secret} and deploys run from the saffron branch."
    first = client.post("/memory/add", {"agent_id": "agent2", "text": text})
    again = client.post("/memory/add", {"agent_id": "agent2", "text": text})
    assert first["ids"] == again["ids"] and first["type"] == "knowledge" and first["redactions"] >= 1
    stored = [p for p in client.export_http("agent2") if p["payload"]["type"] == "knowledge"]
    assert [p["id"] for p in stored] == first["ids"]
    assert secret not in stored[0]["payload"]["data"] and "saffron branch" in stored[0]["payload"]["data"]
    assert stored[0]["payload"]["session_id"] == "knowledge"
    results = client.post("/memory/search", {"agent_id": "agent2", "query": "which branch do deploys run from"})
    assert results["results"][0]["id"] == first["ids"][0] and results["results"][0]["type"] == "knowledge"
    assert not any(r["type"] == "knowledge" for r in client.post(
        "/memory/search", {"agent_id": "agent3", "query": "which branch do deploys run from", "floor": False}
    )["results"])


def test_answers_are_utf8_as_written(daemon: tuple[TokenDaemon, dict[str, set[str]]]) -> None:
    client, _ = daemon
    text = "下周三我们在杭州开会，会议室是三楼的西湖厅。"
    client.post("/memory/add", {"agent_id": "agent4", "text": text})
    body = json.dumps({"agent_id": "agent4", "query": "会议在哪个会议室", "floor": False}).encode()
    request = urllib.request.Request(client.base + "/memory/search", data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read()
        assert response.headers.get_content_charset() == "utf-8"
    assert "西湖厅".encode() in raw and b"\\u" not in raw


def test_a_hit_brings_its_answer_across_tool_lines(daemon: tuple[TokenDaemon, dict[str, set[str]]]) -> None:
    client, _ = daemon
    body = {"agent_id": EXPAND_AGENT, "query": "first ferry to Rebun island", "limit": 3}
    results = client.post("/memory/search", body)["results"]
    by_entry = {r["entry_id"]: r for r in results}
    assert results[0]["entry_id"] == "q1"
    # The answer, four lines further on, comes with its question: as its neighbour, or lifted by it onto its own
    # rank (the neighbour support of ranking.py, measured on LoCoMo's dev set).
    assert "a1" in by_entry and by_entry["a1"]["neighbour_of"] in (None, results[0]["id"])
    assert "tr" not in by_entry and "tc" not in by_entry
    plain = client.post("/memory/search", {**body, "expand": False})["results"]
    assert all(r["neighbour_of"] is None for r in plain)
    context = client.post("/memory/context", {"agent_id": EXPAND_AGENT, "query": "first ferry to Rebun island"})
    block = context["context"]
    assert block.index("first ferry to Rebun") < block.index("07:15 from the Wakkanai pier")  # said in that order
    answer_line = next(line for line in block.splitlines() if "07:15 from the Wakkanai pier" in line)
    assert answer_line.startswith("  ["), block  # it continues its question's item: one exchange


def test_role_and_time_filters(daemon: tuple[TokenDaemon, dict[str, set[str]]]) -> None:
    client, _ = daemon
    body = {"agent_id": EXPAND_AGENT, "query": "ferry to Rebun", "floor": False}
    answers = client.post("/memory/search", {**body, "roles": ["assistant"]})["results"]
    assert answers and {r["role"] for r in answers} == {"assistant"}
    later = client.post("/memory/search", {**body, "since": "2026-03-21T00:00:00Z"})["results"]
    assert [r["entry_id"] for r in later] == ["q2"]
    before = datetime(2026, 3, 20, tzinfo=UTC).timestamp()
    assert client.post("/memory/search", {**body, "until": before})["results"] == []
    first_day = client.post("/memory/search", {**body, "since": before, "until": before + 86400})["results"]
    assert {r["entry_id"] for r in first_day} == {"q1", "a1"}


def test_an_unrelated_query_returns_nothing(daemon: tuple[TokenDaemon, dict[str, set[str]]]) -> None:
    client, _ = daemon
    for query in ("What is the boiling point of liquid nitrogen?", "How do I compute a 3x3 determinant?"):
        body = {"agent_id": EXPAND_AGENT, "query": query}
        assert client.post("/memory/search", body)["results"] == []
        assert client.post("/memory/context", body)["context"] == ""
        assert client.post("/memory/search", {**body, "floor": False})["results"]  # noise, without the floor


def test_what_the_caller_holds_is_left_out_before_the_floor(
        daemon: tuple[TokenDaemon, dict[str, set[str]]]) -> None:
    """A plugin's own turn is stored by the time it searches: left out of the results, it must not pass the
    floor for the rest either (a trial: a trivia question got seven unrelated "memories")."""
    client, _ = daemon
    agent = "holder"
    question = "How long should I boil an egg for a soft yolk?"
    secret = "Zk8mQ2vLx7#p"
    told = f"The wifi password is {secret} and the router sits in the hall cupboard."
    for text in (question, "The moving truck arrives on Tuesday at 8 in the morning.", told):
        client.post("/memory/add", {"agent_id": agent, "text": text})
    body = {"agent_id": agent, "query": question}
    assert client.post("/memory/search", body)["results"][0]["text"] == question  # the question finds itself
    held = {**body, "exclude": [question]}
    assert client.post("/memory/search", held)["results"] == []
    assert client.post("/memory/context", held)["context"] == ""
    # held texts are compared as stored: the conversation's raw text holds the secret, the memory its marker
    ask = {"agent_id": agent, "query": "where is the wifi router?"}
    assert any("hall cupboard" in r["text"] for r in client.post("/memory/search", ask)["results"])
    rest = client.post("/memory/search", {**ask, "exclude": [f"  {told}\n"], "floor": False})["results"]
    assert rest and not any("hall cupboard" in r["text"] for r in rest)


def test_cli_search_through_the_daemon_then_offline(tmp_path: Path) -> None:
    """`veritas-watch search` asks the running daemon, and opens the store itself once it stopped."""
    state = tmp_path / "state"
    for agent, topic in (("alpha", "harbor lantern"), ("beta", "harbor lantern")):
        sessions = state / "agents" / agent / "sessions"
        sessions.mkdir(parents=True)
        (sessions / "s.jsonl").write_bytes(header("s") + b"".join(
            message(f"m{n}", "user", f"{agent} fixed the {topic} number {n}") for n in range(3)))
    proc = TokenDaemon(state, tmp_path / "data", config={"http": {"token": TOKEN}})
    proc.start()
    try:
        proc.wait_idle(timeout=120)
        online = json.loads(proc.cli("search", "--agent", "alpha", "--json", "harbor lantern").stdout)
        assert (proc.data_dir / "daemon.json").exists()
    finally:
        proc.stop()
    offline = json.loads(proc.cli("search", "--agent", "alpha", "--json", "harbor lantern").stdout)
    assert online and [r["id"] for r in online] == [r["id"] for r in offline]
    assert {r["agent_id"] for r in online} == {"alpha"}
    refused = subprocess.run([sys.executable, "-m", "veritas_watch.cli", "search", "harbor"], env=proc.env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--agent is required" in refused.stderr
