"""OpenClaw 2026.9+ SQLite transcript stores, followed live by the real daemon."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.daemon_harness import FIXTURE_SESSIONS, DaemonProcess, copy_fixture_sessions, running_daemon, wait_for
from tests.sqlite_fixture import (
    OpenClawWriter,
    create_database,
    import_jsonl_file,
    long_text,
    message_event,
    zstd_frame,
)


def db_path(state: Path, agent: str = "main") -> Path:
    path = state / "agents" / agent / "agent" / "openclaw-agent.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def sqlite_points(points: list[dict], session: str) -> dict[str, str]:
    return {p["payload"]["entry_id"]: p["payload"]["data"] for p in points if p["payload"]["session_id"] == session}


@pytest.mark.parametrize("shape", ["v19", "v24"])
def test_live_appends_zstd_rewrites_and_reset(tmp_path: Path, shape: str) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    path = db_path(state)
    create_database(path, shape)  # type: ignore[arg-type]
    with OpenClawWriter(path) as writer, running_daemon(state, data) as daemon:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, message_event("Where did we park the kayak?", event_id="q1"),
                      message_event("Behind the boathouse on pier three.", "assistant", event_id="a1"))
        wait_for(lambda: sqlite_points(daemon.export("main"), sid).keys() == {"q1", "a1"}, what="live appends")
        big = "Lighthouse log. " + long_text(3000)
        writer.append(sid, message_event(big, "assistant", event_id="big"))
        wait_for(lambda: "big" in sqlite_points(daemon.export("main"), sid), what="compressed row")
        status = daemon.get("/status")["sqlite"]
        assert status and status[0]["schema_version"] in (19, 24) and status[0]["sessions"] >= 1

        # Suffix rewrite (rewind): the answer is replaced; the old one must go.
        seq_a1 = 2
        writer.rewrite_suffix(sid, seq_a1, [message_event("Actually it is at the north slip.", "assistant",
                                                          event_id="a1b")])
        wait_for(lambda: sqlite_points(daemon.export("main"), sid) == {
            "q1": "Where did we park the kayak?", "a1b": "Actually it is at the north slip."}, what="suffix rewrite")
        # Full replacement.
        writer.replace_session(sid, [message_event("Summary: kayak at north slip.", "assistant", event_id="s1")])
        wait_for(lambda: sqlite_points(daemon.export("main"), sid) == {"s1": "Summary: kayak at north slip."},
                 what="full replacement")
        # A reset opens a new window; the new session's entries arrive too.
        _, new_sid = writer.reset("agent:main:main")
        writer.append(new_sid, message_event("New topic: the ferry timetable.", event_id="n1"))
        wait_for(lambda: "n1" in sqlite_points(daemon.export("main"), new_sid), what="after reset")
        ids = [p["id"] for p in daemon.export()]
        assert len(ids) == len(set(ids))


def test_history_trimmed_from_the_front_stays_in_memory(tmp_path: Path) -> None:
    """`openclaw sessions compact --max-lines N` (2026.9.6, seen on the real one): the session becomes its header
    and its last N lines, renumbered, and nothing is archived. The memories before them are then held nowhere
    else: they stay. A withdrawn answer at the tail still goes."""
    state, data = tmp_path / "state", tmp_path / "data"
    path = db_path(state)
    create_database(path, "v24")
    t0 = 1_790_000_000_000
    with OpenClawWriter(path) as writer, running_daemon(state, data) as daemon:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, *(message_event(f"Turn {i}: the harbour log entry number {i}.",
                                           "user" if i % 2 == 0 else "assistant", event_id=f"e{i}",
                                           at_ms=t0 + i * 1000) for i in range(6)))
        first = {f"e{i}" for i in range(6)}
        wait_for(lambda: sqlite_points(daemon.export("main"), sid).keys() == first, what="six turns")
        header, *_, fifth, sixth = writer.events(sid)
        writer.replace_session(sid, [e.decode() for e in (header, fifth, sixth)])
        writer.append(sid, message_event("After the trim: the ferry leaves at nine.", event_id="after",
                                         at_ms=t0 + 10_000))
        wait_for(lambda: "after" in sqlite_points(daemon.export("main"), sid), what="the turn after the trim")
        daemon.wait_idle()
        assert sqlite_points(daemon.export("main"), sid).keys() == first | {"after"}
        assert daemon.events("trimmed_points_kept"), "the kept history is said once"
        assert not daemon.events("stale_points_removed")

        writer.rewrite_suffix(sid, 3, [message_event("Correction: the ferry leaves at ten.", "assistant",
                                                     event_id="fix", at_ms=t0 + 11_000)])
        wait_for(lambda: sqlite_points(daemon.export("main"), sid).keys() == first | {"fix"},
                 what="the withdrawn answer removed, the trimmed history kept")
        ids = [p["id"] for p in daemon.export()]
        assert len(ids) == len(set(ids))


def test_a_rewind_and_a_fork_store_each_turn_once_and_end_no_conversation(tmp_path: Path) -> None:
    """OpenClaw 2026.9.6 (seen on the real one): a rewind is a new session of the key holding a copy of the
    old one and then the new turns; a fork is a session of its own that starts with a copy of the parent's
    rows. Each turn is one memory, and the key moving on to a rewound copy does not end the conversation."""
    state, data = tmp_path / "state", tmp_path / "data"
    path = db_path(state)
    create_database(path, "v24")
    with OpenClawWriter(path) as writer, running_daemon(state, data) as daemon:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, message_event("The kayak is behind the boathouse.", event_id="q1"),
                      message_event("Behind the boathouse, noted.", "assistant", event_id="a1"),
                      message_event("The paddles are in the red locker.", event_id="q2"),
                      message_event("Red locker, noted.", "assistant", event_id="a2"))
        wait_for(lambda: len(sqlite_points(daemon.export("main"), sid)) == 4, what="four turns")
        _, fork = writer.fork("agent:main:main", through_seq=2)
        writer.append(fork, message_event("In the fork: the kayak is blue.", event_id="f1"))
        old, new = writer.rewind("agent:main:main", "a1")
        writer.append(new, message_event("Rewound: the paddles are in the shed.", event_id="r1"),
                      message_event("The shed, noted.", "assistant", event_id="r2"))
        wait_for(lambda: {"f1", "r1"} <= {p["payload"]["entry_id"] for p in daemon.export("main")},
                 what="the turns after the fork and the rewind")
        daemon.wait_idle()
        time.sleep(1.5)  # a sweep after the key moved on: its end (none) is decided by then
        points = daemon.export("main")
        entries = Counter(p["payload"]["entry_id"] for p in points)
        assert entries == Counter({e: 1 for e in ("q1", "a1", "q2", "a2", "f1", "r1", "r2")}), entries
        assert {p["payload"]["session_id"] for p in points if p["payload"]["entry_id"] == "q1"} == {old}
        assert not daemon.events("conversation_ended"), "a rewind is no end of the conversation"


@pytest.mark.skipif(not FIXTURE_SESSIONS.is_dir(), reason="../shared fixtures not present")
def test_session_migrated_from_jsonl_is_stored_once(tmp_path: Path) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    sessions = copy_fixture_sessions(state)
    with running_daemon(state, data) as daemon:
        daemon.wait_idle()
        before = sorted(p["id"] for p in daemon.export())
        path = db_path(state)
        create_database(path, "v24")
        archive = state / "agents" / "main" / "session-sqlite-import-archive"
        archive.mkdir()
        with OpenClawWriter(path) as writer:
            for live in sorted(sessions.glob("*.jsonl")):
                import_jsonl_file(writer, live, session_key=f"agent:main:{live.stem}")
                shutil.move(str(live), archive / live.name)  # what `openclaw doctor --fix` does
        wait_for(lambda: (s := daemon.get("/status")["sqlite"]) and s[0]["lag_rows"] == 0, what="sqlite caught up")
        daemon.wait_idle()
        after = sorted(p["id"] for p in daemon.export())
        assert after == before


def test_corrupt_database_is_logged_and_retried(tmp_path: Path) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    path = db_path(state)
    path.write_bytes(b"this is not a database" * 100)
    with running_daemon(state, data) as daemon:
        wait_for(lambda: [e for e in daemon.log_events() if e.get("event") == "sqlite_source_error"], what="error log")
        path.unlink()
        create_database(path, "v23")
        with OpenClawWriter(path) as writer:
            sid = writer.create_session("agent:main:main")
            writer.append(sid, message_event("Recovered: the cellar key is under the mat.", event_id="k1"))
        wait_for(lambda: "k1" in sqlite_points(daemon.export("main"), sid), timeout=120, what="after recovery")
        assert daemon.proc is not None and daemon.proc.poll() is None
        errors = [e for e in daemon.log_events() if e.get("event") == "sqlite_source_error"]
        assert len(errors) == 1  # logged once, not once per retry


def test_a_session_forgotten_in_openclaw_leaves_memory_for_good(tmp_path: Path) -> None:
    """`openclaw memory forget --session X` (a tombstone in the agent's database; its rows stay): the
    session's memories are removed, and neither what is appended to it, nor its deletion archive, nor a
    restart brings any of it back. The other sessions are untouched."""
    state, data = tmp_path / "state", tmp_path / "data"
    path = db_path(state)
    create_database(path, "v24")
    sessions = state / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)

    def texts(daemon: DaemonProcess) -> set[str]:
        return {p["payload"]["data"] for p in daemon.export("main")}

    with OpenClawWriter(path) as writer:
        keep = writer.create_session("agent:main:main")
        private = writer.create_session("agent:main:private")
        with running_daemon(state, data) as daemon:
            writer.append(keep, message_event("The boat is at berth 7.", event_id="k1"))
            writer.append(private, message_event("My therapist is Dr. Lee.", event_id="p1"),
                          message_event("Noted, Dr. Lee.", "assistant", event_id="p2"))
            wait_for(lambda: texts(daemon) == {"The boat is at berth 7.", "My therapist is Dr. Lee.",
                                               "Noted, Dr. Lee."}, what="all stored")
            writer.forget(private)
            wait_for(lambda: texts(daemon) == {"The boat is at berth 7."}, what="the session forgotten")
            [event] = daemon.events("session_forgotten")
            assert event["session_id"] == private and event["points"] == 2
            writer.append(private, message_event("And my pharmacist is Ms. Park.", event_id="p3"))
            archive = sessions / f"{private}.jsonl.deleted.2026-12-04T02-00-00.000Z.zst"
            archive.write_bytes(zstd_frame(b"".join(e + b"\n" for e in writer.events(private))))
            writer.append(keep, message_event("The regatta is on Sunday.", event_id="k2"))
            wait_for(lambda: "The regatta is on Sunday." in texts(daemon), what="the other session goes on")
            daemon.wait_idle()
            assert texts(daemon) == {"The boat is at berth 7.", "The regatta is on Sunday."}
            assert daemon.get("/status")["sqlite"][0]["lag_rows"] == 0
            assert not daemon.events("gap_detected")
        with running_daemon(state, data) as again:
            again.wait_idle()
            assert texts(again) == {"The boat is at berth 7.", "The regatta is on Sunday."}
