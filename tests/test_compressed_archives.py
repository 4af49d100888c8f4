"""Compressed transcript archives (`*.jsonl.deleted.<ts>.<digest>.zst`), the source on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from veritas_watch.openclaw import AgentDirs
from veritas_watch.sources import archives
from veritas_watch.sources.archives import CompressedArchives, classify_compressed
from veritas_watch.sources.cursors import CursorStore

SID = "364c5dbb-aea5-42f5-bb86-6f2fad80cf4e"
NAME = f"{SID}.jsonl.deleted.2026-12-01T17-10-54.628Z.2a274e2f9d4347fdb38607e9c8a620cd.zst"


def agent_dirs(tmp_path: Path) -> AgentDirs:
    sessions = tmp_path / "agents" / "ops" / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    return AgentDirs("ops", sessions, tmp_path / "agents" / "ops" / "agent" / "openclaw-agent.sqlite")


def lines(*events: dict[str, object]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def test_names() -> None:
    assert classify_compressed(NAME) is not None
    assert classify_compressed(f"{SID}.jsonl.reset.2026-12-01T17-10-54.628Z.zst") is not None
    for other in (NAME + ".0ba277d1-f99f-4091-b1dc-b518569f67c7.stage", NAME[:-4], f"{SID}.jsonl",
                  f"{SID}.jsonl.bak.2026-12-01T17-10-54.628Z.zst", f"{SID}.jsonl.deleted.yesterday.zst"):
        assert classify_compressed(other) is None, other


def test_read_once_then_done_and_forgotten_when_gone(tmp_path: Path) -> None:
    agent = agent_dirs(tmp_path)
    body = lines({"type": "session", "id": SID}, {"type": "message", "id": "m1", "message": {"role": "user",
                                                                                            "content": "hi"}})
    path = agent.sessions / NAME
    path.write_bytes(zstandard.ZstdCompressor().compress(body))
    checkpoints = CursorStore(tmp_path / "cursors.sqlite")
    source = CompressedArchives(checkpoints)
    (found,) = source.sweep([agent])
    unit = source.read(*found)
    assert unit is not None and unit.kind == "deleted" and [r.source.line for r in unit.records] == [1, 2]
    assert b"".join(r.data + b"\n" for r in unit.records) == body
    assert source.sweep([agent]) != [], "not done until committed"
    source.commit([unit])
    assert source.sweep([agent]) == []
    restarted = CompressedArchives(checkpoints)  # what was read is durable
    assert restarted.sweep([agent]) == []
    path.unlink()
    assert restarted.sweep([agent]) == []
    assert checkpoints.load_archives() == [], "a gone archive is forgotten, durably"


def test_a_corrupt_archive_or_a_bomb_is_refused_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = agent_dirs(tmp_path)
    (agent.sessions / NAME).write_bytes(b"not zstd at all")
    bomb = NAME.replace("deleted", "reset")
    (agent.sessions / bomb).write_bytes(zstandard.ZstdCompressor().compress(b"\n" * (2 * 1024 * 1024)))
    monkeypatch.setattr(archives, "MAX_DECOMPRESSED_BYTES", 1024 * 1024)
    source = CompressedArchives(CursorStore(tmp_path / "cursors.sqlite"))
    found = source.sweep([agent])
    assert len(found) == 2
    assert [source.read(*f) for f in found] == [None, None]
    assert source.sweep([agent]) == [], "a bad archive is not retried until it changes"


# -- through the daemon ----------------------------------------------------------------------------

def session_body(sid: str, *texts: str) -> bytes:
    events: list[dict[str, object]] = [{"type": "session", "version": 3, "id": sid,
                                        "timestamp": "2026-12-01T10:00:00.000Z"}]
    for i, text in enumerate(texts):
        events.append({"type": "message", "id": f"{sid[:8]}-{i}", "timestamp": f"2026-12-01T10:00:{i + 1:02d}.000Z",
                       "message": {"role": "user" if i % 2 == 0 else "assistant", "content": text}})
    return lines(*events)


def test_the_daemon_stores_archives_once_beside_what_it_read_live(tmp_path: Path) -> None:
    from tests.daemon_harness import DaemonProcess

    state = tmp_path / "state"
    sessions = state / "agents" / "ops" / "sessions"
    sessions.mkdir(parents=True)
    live, offline = SID, "9d1f7c1e-5a7b-4c0e-8f43-2b1e3c4d5e6f"
    live_body = session_body(live, "The staging database moves to rack 12 on Monday.", "Rack 12 on Monday, noted.")
    (sessions / f"{live}.jsonl").write_bytes(live_body)
    daemon = DaemonProcess(state, tmp_path / "data").start()
    try:
        daemon.wait_idle(60)
        assert len(daemon.export("ops")) == 2
        # OpenClaw deletes the live session (its archive replaces it), and an archive of a session never
        # seen live appears (created and deleted while nobody watched).
        (sessions / NAME.replace(SID, live)).write_bytes(zstandard.ZstdCompressor().compress(live_body))
        (sessions / f"{live}.jsonl").unlink()
        (sessions / NAME.replace(SID, offline)).write_bytes(zstandard.ZstdCompressor().compress(
            session_body(offline, "Kiosk printers need toner by Friday.", "Toner by Friday, noted.")))
        daemon.wait_idle(60)
        points = daemon.export("ops")
        assert sorted(p["payload"]["data"] for p in points) == sorted(
            ["The staging database moves to rack 12 on Monday.", "Rack 12 on Monday, noted.",
             "Kiosk printers need toner by Friday.", "Toner by Friday, noted."])
        ended = [e for e in daemon.events("conversation_ended") if e.get("session") == offline]
        assert [e["reason"] for e in ended] == ["deleted"]

        assert daemon.stop() == 0
        daemon.start()
        daemon.wait_idle(60)
        assert sorted(p["id"] for p in daemon.export("ops")) == sorted(p["id"] for p in points)
        assert len([e for e in daemon.events("conversation_ended") if e.get("session") == offline]) == 1, \
            "an archive is read once, also across restarts"
    finally:
        if daemon.running:
            daemon.stop()
