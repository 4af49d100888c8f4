"""`POST /memory/get`, the daemon route behind the OpenClaw plugin's `memory_get`, on the real daemon.

One memory by id with the turns around it in its session: in session order across tool lines, one point
per turn (a long turn stored in chunks shows as its first chunk), only the agent's own memories (another
agent's id gets the same 404 as an unknown one), bounded, and not counted by the search loop guard.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, expected_id, header, line, message

TURNS = [  # (entry id, role, text), in session order
    ("u1", "user", "We are planning the garden: tomatoes along the south fence this year."),
    ("a1", "assistant", "Tomatoes along the south fence, noted."),
    ("u2", "user", "The compost bin moves next to the shed, behind the rain barrel."),
    ("a2", "assistant", "Compost bin next to the shed, behind the rain barrel."),
    ("u3", "user", "Order forty metres of drip line before the end of April."),
    ("a3", "assistant", "Forty metres of drip line by the end of April. " + "Drip line details. " * 90),  # chunks
    ("u4", "user", "And the beans go where the potatoes were last year."),
]
TOOL_LINES = line({"type": "message", "id": "tc", "parentId": None, "timestamp": "2026-04-02T10:00:30.000Z",
                   "message": {"role": "assistant", "stopReason": "toolUse", "content": [
                       {"type": "toolCall", "name": "calendar", "arguments": {"month": "april"}}]}}) + message(
    "tr", "toolResult", "April: 30 days", ts="2026-04-02T10:00:31.000Z")


def call(daemon: DaemonProcess, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(daemon.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **daemon.auth}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("memory-get")
    state = root / "state"
    lines = [header("garden")]
    for n, (entry, role, text) in enumerate(TURNS):
        lines.append(message(entry, role, text, ts=f"2026-04-02T10:0{n}:00.000Z"))
        if entry == "u3":
            lines.append(TOOL_LINES)  # tool traffic between a question and its answer is not a turn
    for agent in ("gardener", "neighbour"):
        sessions = state / "agents" / agent / "sessions"
        sessions.mkdir(parents=True)
        (sessions / "garden.jsonl").write_bytes(b"".join(lines))
    config: dict[str, dict[str, object]] = {"search": {"loop_window": 3600.0, "loop_hint_after": 2,
                                                       "loop_stop_after": 3}}
    proc = DaemonProcess(state, root / "data", config=config).start()
    try:
        proc.wait_idle(timeout=180)
        yield proc
    finally:
        proc.stop()


def texts(results: list[dict[str, Any]]) -> list[str]:
    return [r["text"][:30] for r in results]


def test_a_memory_with_the_turns_around_it_in_session_order(daemon: DaemonProcess) -> None:
    status, answer = call(daemon, "/memory/get",
                          {"agent_id": "gardener", "id": expected_id("gardener", "garden", "u3")})
    assert status == 200, answer
    assert answer["memory"]["text"] == TURNS[4][2]
    assert answer["memory"]["session_id"] == "garden" and answer["memory"]["role"] == "user"
    assert texts(answer["before"]) == [TURNS[2][2][:30], TURNS[3][2][:30]]  # oldest first, nearest last
    assert texts(answer["after"]) == [TURNS[5][2][:30], TURNS[6][2][:30]]  # across the tool lines
    assert answer["after"][0]["id"] == expected_id("gardener", "garden", "a3", 0)  # a chunked turn: its first chunk
    assert all(r["agent_id"] == "gardener" for r in [*answer["before"], *answer["after"]])


def test_neighbours_bounds_and_the_session_edges(daemon: DaemonProcess) -> None:
    first = expected_id("gardener", "garden", "u1")
    status, answer = call(daemon, "/memory/get", {"agent_id": "gardener", "id": first, "neighbours": 0})
    assert status == 200 and answer["before"] == [] and answer["after"] == []
    status, answer = call(daemon, "/memory/get", {"agent_id": "gardener", "id": first, "neighbours": 10})
    assert status == 200 and answer["before"] == [] and len(answer["after"]) == len(TURNS) - 1
    for body in ({"agent_id": "gardener", "id": first, "neighbours": 11}, {"agent_id": "gardener", "id": "u1"},
                 {"agent_id": "gardener"}, {"id": first}, {"agent_id": "gardener", "id": first, "neighbours": "2"}):
        status, answer = call(daemon, "/memory/get", body)
        assert status == 400 and answer["error"], body


def test_another_agents_memory_is_not_there(daemon: DaemonProcess) -> None:
    theirs = expected_id("neighbour", "garden", "u3")
    assert call(daemon, "/memory/get", {"agent_id": "neighbour", "id": theirs})[0] == 200
    stolen = call(daemon, "/memory/get", {"agent_id": "gardener", "id": theirs})
    unknown = call(daemon, "/memory/get", {"agent_id": "gardener", "id": expected_id("gardener", "x", "y")})
    assert stolen == unknown == (404, {"error": "no memory with this id for this agent"})


def test_reads_by_id_are_not_searches_for_the_loop_guard(daemon: DaemonProcess) -> None:
    body = {"agent_id": "gardener", "id": expected_id("gardener", "garden", "u2")}
    for _ in range(6):
        assert call(daemon, "/memory/get", body)[0] == 200
    status, answer = call(daemon, "/memory/search", {"agent_id": "gardener", "query": "compost bin"})
    assert status == 200 and "hint" not in answer  # the guard (hint after 2) has counted this one search only
