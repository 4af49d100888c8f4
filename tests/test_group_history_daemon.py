"""Group chat history through the real daemon: the fixture's 33 member messages, stored once each.

JSONL (a copy of the real sessions) and SQLite (the two group-chat sessions imported the way
`openclaw doctor --fix` does) must give the same memories under the same point ids.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import (
    FIXTURE_SESSIONS,
    copy_fixture_sessions,
    header,
    message,
    running_daemon,
    wait_for,
)
from tests.sqlite_fixture import OpenClawWriter, create_database, import_jsonl_file
from tests.test_group_history import OLD_LABEL, fenced, fixture_history_bodies, item
from veritas_watch.config import EmbeddingConfig
from veritas_watch.daemon import load_redact_key
from veritas_watch.model import RawRecord, SessionState, SourceRef
from veritas_watch.pipeline import transform_records

pytestmark = [pytest.mark.long,
              pytest.mark.skipif(not FIXTURE_SESSIONS.is_dir(), reason="../shared fixtures not present")]

GROUP_FILES = ("b7383b91-a40c-4397-87f0-9c8de05ac0d4.jsonl.reset.2026-03-15T09-33-45.423Z",
               "df18cf05-d86e-46b5-aa16-1c385f01dc8f.jsonl")
RESET_PROMPT = "A new session was started via /new or /reset"
EMBEDDING = EmbeddingConfig()  # the daemon runs with the defaults


def squash(text: object) -> str:
    return " ".join(str(text).split())


def assert_members_stored_once(points: list[dict[str, Any]], expected: dict[tuple[str, str, int], str]) -> None:
    texts = Counter(squash(p["payload"]["data"]) for p in points)
    for body in expected.values():
        assert texts[squash(body)] == 1, body
    quoted = {(p["payload"]["speaker"], p["payload"]["ts"]): p["payload"] for p in points if "speaker" in p["payload"]}
    assert len(quoted) == len(expected) == 33
    for (_, sender, ms), body in expected.items():
        payload = quoted[(sender, ms / 1000)]
        assert squash(payload["data"]) == squash(body)
        assert payload["role"] == "user" and payload["type"] == "conversation"


def greeting_entry_ids(sessions: Path) -> set[str]:
    """The assistant's final reply after each `/new` start-up prompt, found by structure alone."""
    ids = set()
    for path in sessions.iterdir():
        after_reset = False
        for raw in path.read_text(encoding="utf-8").splitlines():
            obj = json.loads(raw)
            message = obj.get("message") if obj.get("type") == "message" else None
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            text = content if isinstance(content, str) else " ".join(
                b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")
            if message.get("role") == "user":
                after_reset = text.startswith(RESET_PROMPT)
            elif (after_reset and message.get("role") == "assistant" and message.get("stopReason") == "stop"
                  and message.get("provider") != "openclaw" and text.strip()):
                ids.add(obj["id"])
                after_reset = False
    return ids


def live_members(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p["payload"] for p in points if p["payload"]["session_id"] == "live-group" and "speaker" in p["payload"]]


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_group_chat_members_are_memories_once(tmp_path: Path) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    copy_fixture_sessions(state)
    expected = fixture_history_bodies(FIXTURE_SESSIONS)
    greetings = greeting_entry_ids(FIXTURE_SESSIONS)
    assert len(greetings) == 10
    with running_daemon(state, data) as daemon:
        daemon.wait_idle()
        points = daemon.export()
        assert_members_stored_once(points, expected)
        ids = [p["id"] for p in points]
        assert len(ids) == len(set(ids))
        stored_entries = {p["payload"]["entry_id"] for p in points}
        assert not stored_entries & greetings  # the /new greetings are not memory
        assert "4e8f1e53" in stored_entries  # the answer given after a heartbeat poll mid-task
        hit = wait_for(lambda: [h for h in daemon.search("main", "ナチュラルキラー細胞")
                                if h["entry_id"] == "b678e183"], what="a member message found by search")
        assert "ナチュラルキラー細胞や" in {h["text"] for h in hit}

        # Live: a block quoted again by a later message (read in another batch) is not stored again.
        live = state / "agents" / "main" / "sessions" / "live-group.jsonl"
        first = [item("user:Ukai", 1773500000000, "the kayak club meets at the north slip"),
                 item("user:Urin", 1773500060000, "bring the blue paddles")]
        second = [*first, item("user:Ukai", 1773500120000, "and the spare ropes")]
        append(live, header("live-group") + message("g1", "user", fenced(OLD_LABEL, first) + "\n\n<media:image>"))
        wait_for(lambda: len(live_members(daemon.export("main"))) == 2, what="first block")
        append(live, message("g2", "user", fenced(OLD_LABEL, second) + "\n\nwhere do we meet?"))
        wait_for(lambda: len(live_members(daemon.export("main"))) == 3, what="second block")
        daemon.wait_idle()
        quoted = live_members(daemon.export("main"))
        assert sorted(p["data"] for p in quoted) == [
            "and the spare ropes", "bring the blue paddles", "the kayak club meets at the north slip"]
        assert {p["entry_id"] for p in quoted} == {"g2"}  # the repeat overwrote, under the same ids
        points = daemon.export()
    # A restart reads nothing again, and a block quoted twice was not stored twice meanwhile.
    with running_daemon(state, data) as daemon:
        daemon.wait_idle()
        assert sorted(json.dumps(p, sort_keys=True) for p in daemon.export()) == sorted(
            json.dumps(p, sort_keys=True) for p in points)
        assert daemon.get("/status")["entries"]["stored"] == 0


def test_group_chat_members_from_sqlite_are_the_same_points(tmp_path: Path) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    path = state / "agents" / "main" / "agent" / "openclaw-agent.sqlite"
    path.parent.mkdir(parents=True)
    create_database(path, "v24")
    with OpenClawWriter(path) as writer:
        for name in GROUP_FILES:
            import_jsonl_file(writer, FIXTURE_SESSIONS / name, session_key=f"agent:main:{name[:8]}")
    expected = {k: v for k, v in fixture_history_bodies(FIXTURE_SESSIONS).items() if k[0] in GROUP_FILES}
    with running_daemon(state, data) as daemon:
        wait_for(lambda: (s := daemon.get("/status")["sqlite"]) and s[0]["lag_rows"] == 0, what="sqlite caught up")
        daemon.wait_idle()
        points = daemon.export()
    assert_members_stored_once(points, expected)
    assert all(str(p["payload"]["source"]).startswith(str(path)) for p in points)
    # The JSONL path, through the same pure function with this install's key, gives the same ids.
    key = load_redact_key(data)
    jsonl_ids: set[str] = set()
    for name in GROUP_FILES:
        file = FIXTURE_SESSIONS / name
        records = [RawRecord("main", raw, SourceRef("jsonl", str(file), n))
                   for n, raw in enumerate(file.read_bytes().splitlines(), 1)]
        out = transform_records(records, SessionState(None), fallback_session=name.split(".jsonl")[0],
                                redact_key=key, max_line_bytes=4 << 20, chunk_chars=EMBEDDING.chunk_chars,
                                chunk_overlap=EMBEDDING.chunk_overlap)
        jsonl_ids |= {c.point_id for c in out.chunks if c.entry.speaker is not None}
    assert {p["id"] for p in points if "speaker" in p["payload"]} == jsonl_ids
