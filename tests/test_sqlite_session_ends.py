"""Session ends as OpenClaw 2026.9 writes them in its SQLite store, through the real daemon.

A `reset` event (appended to the same session by `/new`, `/reset`, idle and daily resets) ends the
conversation before it; a finished run (`session_windows.ended_at`, status 'done') does not; a deleted
session ends its last conversation. The real OpenClaw drives the same cases in test_openclaw_real.py;
here the writer is the fixture, so each case is cheap and exact.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProcess, running_daemon, wait_for
from tests.sqlite_fixture import OpenClawWriter, create_database, message_event
from veritas_watch.model import RawRecord, SessionState, SourceRef
from veritas_watch.pipeline import transform_records

AGENT = "ops"  # not the default agent: its workspace is `<state>/workspace-ops` in every OpenClaw version
STALE = "# STATE\n- 2020-01-01 00:00 UTC last sync\n"
FRESH = "# STATE\n- 2099-01-01 00:00 UTC planned\n- {now} UTC synced\n"


def msg(text: str, role: str = "user", *, event_id: str, ts: str) -> dict[str, object]:
    at_ms = int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)
    return message_event(text, role, event_id=event_id, at_ms=at_ms)


def reset_event(reason: str, ts: str = "2026-11-30T10:00:00.000Z") -> dict[str, object]:
    return {"type": "reset", "id": uuid.uuid4().hex[:8], "parentId": None, "timestamp": ts, "reason": reason}


def setup(tmp_path: Path) -> tuple[Path, Path, Path, dict[str, str]]:
    state, data = tmp_path / "state", tmp_path / "data"
    db = state / "agents" / AGENT / "agent" / "openclaw-agent.sqlite"
    db.parent.mkdir(parents=True)
    create_database(db, "v23", agent_id=AGENT)
    (state / f"workspace-{AGENT}").mkdir()
    config = tmp_path / "veritas.toml"
    config.write_text("[gaps]\ntolerance = 0\n[watch]\nsweep_interval = 0.5\n")
    return state, data, db, {"VERITAS_WATCH_CONFIG": str(config)}


def state_md(state: Path, text: str) -> None:
    (state / f"workspace-{AGENT}" / "STATE.md").write_text(text)


def finish_run(db: Path, sid: str) -> None:
    """What OpenClaw 2026.9 does after every completed gateway run."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE session_windows SET ended_at = 1796000000000, status = 'done' WHERE session_id = ?",
                     (sid,))
    conn.close()


def gap_events(daemon: DaemonProcess) -> list[dict[str, object]]:
    return daemon.events("gap_detected")


def test_each_reset_ends_the_conversation_before_it(tmp_path: Path) -> None:
    state, data, db, env = setup(tmp_path)
    state_md(state, STALE)
    with OpenClawWriter(db) as writer, running_daemon(state, data, extra_env=env) as daemon:
        sid = writer.create_session(f"agent:{AGENT}:main")
        writer.append(sid, msg("Rotate the VPN keys on Monday.", event_id="u1", ts="2026-11-30T09:00:00Z"),
                      msg("Scheduled the VPN key rotation.", "assistant", event_id="a1",
                                    ts="2026-11-30T09:00:05Z"))
        finish_run(db, sid)
        daemon.wait_idle()
        assert gap_events(daemon) == [], "a finished run is not a session end"
        (seq,) = writer.append(sid, reset_event("new"))
        wait_for(lambda: gap_events(daemon), what="gap for /new")
        (gap,) = gap_events(daemon)
        assert gap["agent"] == AGENT and gap["session"] == sid
        assert gap["transcript"] == f"{db}#{sid}:{seq}"
        assert str(gap["session_end"]).startswith("2026-11-30T09:00:05")
        # The next conversation follows in the same session; a reset with nothing said since is no end.
        writer.append(sid, reset_event("reset"))
        writer.append(sid, msg("Order two more rack PDUs.", event_id="u2", ts="2026-11-30T11:00:00Z"))
        state_md(state, FRESH.format(now="2026-11-30 12:00"))
        writer.append(sid, reset_event("reset"))
        daemon.wait_idle()
        assert len(gap_events(daemon)) == 1, gap_events(daemon)
        ended = daemon.events("conversation_ended")
        assert [e["reason"] for e in ended] == ["new", "reset"], ended
        stored = {p["payload"]["entry_id"] for p in daemon.export(AGENT)}
        assert stored == {"u1", "a1", "u2"}


def test_a_restart_reports_no_live_session_and_no_end_twice(tmp_path: Path) -> None:
    state, data, db, env = setup(tmp_path)
    state_md(state, STALE)
    with OpenClawWriter(db) as writer:
        ended = writer.create_session(f"agent:{AGENT}:main")
        writer.append(ended, msg("First topic.", event_id="u1", ts="2026-11-29T09:00:00Z"),
                      reset_event("daily"),
                      msg("Second topic, still open.", event_id="u2", ts="2026-11-30T09:00:00Z"))
        live = writer.create_session(f"agent:{AGENT}:side")
        writer.append(live, msg("A side question.", event_id="u3", ts="2026-11-30T09:30:00Z"))
        for sid in (ended, live):
            finish_run(db, sid)
    with running_daemon(state, data, extra_env=env) as daemon:  # start-up: only the ended conversation
        # (the start-up scan runs after the first sweep that reads nothing while the sink is idle: it may
        # follow the last probe of wait_idle by a sweep)
        wait_for(lambda: gap_events(daemon), what="the start-up gap")
        daemon.wait_idle()
        (gap,) = gap_events(daemon)
        assert gap["session"] == ended and str(gap["session_end"]).startswith("2026-11-29T09:00:00")
    with running_daemon(state, data, extra_env=env) as daemon:  # the log file is shared by both runs
        daemon.wait_idle()
        assert len(gap_events(daemon)) == 1


def test_a_deleted_session_ends_its_last_conversation_once(tmp_path: Path) -> None:
    state, data, db, env = setup(tmp_path)
    state_md(state, STALE)
    with OpenClawWriter(db) as writer, running_daemon(state, data, extra_env=env) as daemon:
        sid = writer.create_session(f"agent:{AGENT}:scratch")
        writer.append(sid, msg("Scratch: vendor call Thursday.", event_id="u1", ts="2026-11-30T08:00:00Z"))
        daemon.wait_idle()
        writer.delete_session(sid)
        wait_for(lambda: gap_events(daemon), what="gap for the deleted session")
        daemon.wait_idle()
        assert [e["reason"] for e in daemon.events("conversation_ended")] == ["deleted"]
        # where it ended, as every SQLite location is written (a bare `db#<uuid>` read as a key to the log)
        (ended,) = daemon.events("conversation_ended")
        assert ended["transcript"] == f"{db}#{sid}:1", ended
        assert len(gap_events(daemon)) == 1
        agent = daemon.status()["agents"][AGENT]
        assert agent["sessions"] == 0 and agent["last_entry_at"] == "2026-11-30T08:00:00.000Z", agent
        assert {p["payload"]["entry_id"] for p in daemon.export(AGENT)} == {"u1"}, "deleted history stays"


def test_a_session_deleted_while_stopped_is_ended_once_by_its_archive_and_its_store(tmp_path: Path) -> None:
    """Seen live, then deleted while the daemon was stopped: OpenClaw leaves a `.jsonl.deleted.*.zst` archive
    and the store no longer has the session. Both end it at the next start; a lossless trial saw
    `conversation_ended` logged twice. Told once, one gap."""
    import zstandard

    state, data, db, env = setup(tmp_path)
    state_md(state, STALE)
    sessions = state / "agents" / AGENT / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    with OpenClawWriter(db) as writer:
        sid = writer.create_session(f"agent:{AGENT}:scratch")
        with running_daemon(state, data, extra_env=env) as daemon:
            writer.append(sid, msg("Scratch: the kiln fires at 6.", event_id="u1", ts="2026-11-30T08:00:00Z"))
            daemon.wait_idle()
        writer.delete_session(sid)
    archive = [{"type": "session", "version": 3, "id": sid, "timestamp": "2026-11-30T07:59:00.000Z"},
               msg("Scratch: the kiln fires at 6.", event_id="u1", ts="2026-11-30T08:00:00Z")]
    body = b"".join(json.dumps(event).encode() + b"\n" for event in archive)
    name = f"{sid}.jsonl.deleted.2026-11-30T09-00-00.000Z.2a274e2f9d4347fdb38607e9c8a620cd.zst"
    (sessions / name).write_bytes(zstandard.ZstdCompressor().compress(body))
    with running_daemon(state, data, extra_env=env) as daemon:
        wait_for(lambda: gap_events(daemon), what="the gap of the deleted session")
        daemon.wait_idle()
        time.sleep(1.0)  # both sources have had their turn
        ends = [e for e in daemon.events("conversation_ended") if e.get("session") == sid]
        assert len(ends) == 1, ends
        assert len(gap_events(daemon)) == 1


def test_a_rewritten_session_does_not_hand_its_resets_on_again(tmp_path: Path) -> None:
    state, data, db, env = setup(tmp_path)
    state_md(state, STALE)
    with OpenClawWriter(db) as writer, running_daemon(state, data, extra_env=env) as daemon:
        sid = writer.create_session(f"agent:{AGENT}:main")
        writer.append(sid, msg("Topic one.", event_id="u1", ts="2026-11-30T08:00:00Z"),
                      reset_event("new"),
                      msg("Topic two.", event_id="u2", ts="2026-11-30T09:00:00Z"))
        wait_for(lambda: daemon.events("conversation_ended"), what="the reset")
        writer.update_event(sid, 3, msg("Topic two, edited.", event_id="u2b", ts="2026-11-30T09:00:00Z"))
        wait_for(lambda: "u2b" in {p["payload"]["entry_id"] for p in daemon.export(AGENT)}, what="the rewrite")
        daemon.wait_idle()
        assert len(daemon.events("conversation_ended")) == 1



def restore_to(writer: OpenClawWriter, sid: str, seq: int) -> None:
    """A backup put in place: the session as it was before `seq`, under the same rewrite generation."""
    writer.rewrite_suffix(sid, seq, [], rotate_generation=False)


def new_then_two_turns(writer: OpenClawWriter, key: str, prefix: str) -> tuple[str, int]:
    """A session: a turn (08:00), a `/new`, then a conversation of two turns, its last at 09:00:05 (event ids
    `<prefix>1..3`). -> the session id and the `/new`'s seq."""
    sid = writer.create_session(key)
    writer.append(sid, msg("Book the venue.", event_id=f"{prefix}1", ts="2026-11-30T08:00:00Z"))
    (reset_seq,) = writer.append(sid, reset_event("new"))
    writer.append(sid, msg("Order the banners.", event_id=f"{prefix}2", ts="2026-11-30T09:00:00Z"),
                  msg("Banners ordered.", "assistant", event_id=f"{prefix}3", ts="2026-11-30T09:00:05Z"))
    return sid, reset_seq


def test_a_restore_ends_the_conversation_it_removed_once_and_no_other(tmp_path: Path) -> None:
    state, data, db, env = setup(tmp_path)
    state_md(state, STALE)
    with OpenClawWriter(db) as writer:
        with running_daemon(state, data, extra_env=env) as daemon:
            # lost: a whole conversation, begun at a `/new` said after the backup
            lost, lost_reset = new_then_two_turns(writer, f"agent:{AGENT}:main", "l")
            # cut: a conversation whose beginning the backup holds, its last turn said after it
            cut = writer.create_session(f"agent:{AGENT}:side")
            writer.append(cut, msg("Side: plan the offsite.", event_id="c1", ts="2026-11-30T08:10:00Z"))
            (cut_turn,) = writer.append(cut, msg("Offsite planned.", "assistant", event_id="c2",
                                                 ts="2026-11-30T08:10:05Z"))
            # ended: a conversation ended by a reset said after the backup, nothing said since
            ended = writer.create_session(f"agent:{AGENT}:ops")
            writer.append(ended, msg("Ops: renew the certs.", event_id="e1", ts="2026-11-30T08:20:00Z"))
            (ended_reset,) = writer.append(ended, reset_event("new"))
            wait_for(lambda: len(gap_events(daemon)) == 2, what="the two /new")
            daemon.wait_idle()
            for sid, seq in ((lost, lost_reset), (cut, cut_turn), (ended, ended_reset)):
                restore_to(writer, sid, seq)
            wait_for(lambda: len(daemon.events("restored_points_kept")) == 3, what="the three restores")
            wait_for(lambda: len(gap_events(daemon)) == 3, what="the removed conversation's end")
            daemon.wait_idle()
            restored = [e for e in daemon.events("conversation_ended") if e["reason"] == "restored"]
            assert [(e["session"], e["ended_at"], e["transcript"]) for e in restored] \
                == [(lost, "2026-11-30T09:00:05.000Z", f"{db}#{lost}")], restored
            assert str(gap_events(daemon)[-1]["session_end"]).startswith("2026-11-30T09:00:05")
            # what was said since the backup stays memory
            assert {"l2", "l3", "c2"} <= {p["payload"]["entry_id"] for p in daemon.export(AGENT)}
        with running_daemon(state, data, extra_env=env) as daemon:  # the log file is shared by both runs
            daemon.wait_idle()
            assert len(gap_events(daemon)) == 3, "not again after a restart"
            # the conversation the restore cut goes on in the restored database and ends as any other
            writer.append(cut, msg("Side: the offsite moved to Friday.", event_id="c3", ts="2026-11-30T10:00:00Z"),
                          reset_event("new"))
            wait_for(lambda: len(gap_events(daemon)) == 4, what="the cut conversation's /new")
            daemon.wait_idle()
            assert str(gap_events(daemon)[-1]["session_end"]).startswith("2026-11-30T10:00:00")
            assert len(gap_events(daemon)) == 4


def test_a_restore_found_at_start_up_tells_the_lost_reset_from_a_new_one_at_its_seq(tmp_path: Path) -> None:
    """OpenClaw writes the turns after a restore at the seqs the lost ones had: with the daemon stopped meanwhile,
    another `/new` can sit where the lost one did. The lost conversation is told by its reset's event id."""
    state, data, db, env = setup(tmp_path)
    state_md(state, STALE)
    with OpenClawWriter(db) as writer:
        with running_daemon(state, data, extra_env=env) as daemon:
            sid, reset_seq = new_then_two_turns(writer, f"agent:{AGENT}:main", "u")
            wait_for(lambda: gap_events(daemon), what="the /new")
            daemon.wait_idle()
        restore_to(writer, sid, reset_seq)
        assert writer.append(sid, reset_event("new")) == [reset_seq]  # another /new, at the lost one's seq
        writer.append(sid, msg("Print the programme.", event_id="p1", ts="2026-11-30T10:00:00Z"))
        with running_daemon(state, data, extra_env=env) as daemon:
            wait_for(lambda: daemon.events("restored_points_kept"), what="the restore")
            daemon.wait_idle()
            restored = [e for e in daemon.events("conversation_ended") if e["reason"] == "restored"]
            assert [e["ended_at"] for e in restored] == ["2026-11-30T09:00:05.000Z"], restored
            assert [str(g["session_end"])[:19] for g in gap_events(daemon)] \
                == ["2026-11-30T08:00:00", "2026-11-30T09:00:05"], gap_events(daemon)

@pytest.mark.parametrize("backup", ["after_the_move", "before_the_move"])
def test_a_restore_after_the_key_moved_on_hands_no_conversation_on_again(tmp_path: Path, backup: str) -> None:
    """The key moved on to another window: the session's last conversation was handed on (`moved_on`). A backup
    restored later that no longer holds that conversation's beginning must not end it again (`restored`), nor, its
    window still ended, end the conversation the restored rows hold last (closed by the `/new` handed on before).
    A restart forgets which ends were told, so each would be a second `conversation_ended` line. A backup from
    before the move puts the key back on the session: what is said there ends when the key moves on again."""
    state, data, db, env = setup(tmp_path)
    state_md(state, STALE)
    key = f"agent:{AGENT}:main"
    with OpenClawWriter(db) as writer:
        with running_daemon(state, data, extra_env=env) as daemon:
            sid, reset_seq = new_then_two_turns(writer, key, "m")
            wait_for(lambda: gap_events(daemon), what="the /new")
            writer.reset(key)  # a new window: the key moves on
            wait_for(lambda: len(daemon.events("conversation_ended")) == 2, what="the key moving on")
            daemon.wait_idle()
        restore_to(writer, sid, reset_seq)
        if backup == "before_the_move":
            with writer.transaction() as conn:
                conn.execute("UPDATE session_nodes SET current_session_id = ? WHERE session_key = ?", (sid, key))
        with running_daemon(state, data, extra_env=env) as daemon:  # the log file is shared by both runs
            wait_for(lambda: daemon.events("restored_points_kept"), what="the restore")
            daemon.wait_idle()
            told = [("new", "2026-11-30T08:00:00.000Z"), ("moved_on", "2026-11-30T09:00:05.000Z")]
            ends = [(e["reason"], e["ended_at"]) for e in daemon.events("conversation_ended") if e["session"] == sid]
            assert ends == told, ends
            assert len(gap_events(daemon)) == 2
            if backup == "before_the_move":
                writer.append(sid, msg("Hang the banners.", event_id="m4", ts="2026-11-30T10:00:00Z"))
                writer.reset(key)
                wait_for(lambda: len(gap_events(daemon)) == 3, what="the key moving on again")
                daemon.wait_idle()
                ends = [(e["reason"], e["ended_at"]) for e in daemon.events("conversation_ended")
                        if e["session"] == sid]
                assert ends == [*told, ("moved_on", "2026-11-30T10:00:00.000Z")], ends


@pytest.mark.parametrize("reason", ["new", "reset", "idle", "daily"])
def test_the_transform_ends_a_conversation_at_each_reset_reason(reason: str) -> None:
    def record(seq: int, event: dict[str, object]) -> RawRecord:
        return RawRecord(AGENT, json.dumps(event).encode(), SourceRef("sqlite", "db", session_id="s", seq=seq))

    state = SessionState("s")
    out = transform_records(
        [record(1, msg("Hello there.", event_id="u1", ts="2026-11-30T08:00:00Z")),
         record(2, reset_event(reason)),
         record(3, msg("Next topic.", event_id="u2", ts="2026-11-30T09:00:00Z"))],
        state, fallback_session="s", redact_key=b"k" * 32, max_line_bytes=1 << 20, chunk_chars=2000,
        chunk_overlap=0)
    (end,) = out.ends
    assert (end.reason, end.ended_at, end.seq, end.transcript) == (reason, "2026-11-30T08:00:00.000Z", 2, "db#s:2")
    assert [c.entry.entry_id for c in out.chunks] == ["u1", "u2"]
    assert out.chunks[1].context == "", "the previous conversation is not the next one's context"
    assert state.conversation_entries == 1
    # each memory says where its conversation began, so neighbour lookups stay inside it
    assert "conversation_start" not in out.chunks[0].payload() and out.chunks[1].payload()["conversation_start"] == 2
    assert SessionState.from_dict(state.to_dict()) == state and state.conversation_start == 2


def test_a_session_state_written_before_conversation_start_existed_still_reads() -> None:
    old = SessionState("s", conversation_entries=2).to_dict()
    del old["conversation_start"]
    assert SessionState.from_dict(old).conversation_start is None
    for bad in (-1, "3", True):
        with pytest.raises(ValueError, match="conversation_start"):
            SessionState.from_dict({**old, "conversation_start": bad})


def test_neighbours_stay_inside_one_conversation_of_a_session(tmp_path: Path) -> None:
    """`/new` keeps the session in OpenClaw 2026.9: memory_get and the recall block's exchanges must not read
    the last turn before it and the first after it as one conversation (a trial saw memory_get do so)."""
    import urllib.request

    state, data, db, env = setup(tmp_path)
    with OpenClawWriter(db) as writer, running_daemon(state, data, extra_env=env) as daemon:
        sid = writer.create_session(f"agent:{AGENT}:main")
        writer.append(sid, msg("Which platform does the night train to Vienna leave from?", event_id="u1",
                               ts="2026-11-30T08:00:00Z"),
                      msg("Platform 9, at 22:40.", "assistant", event_id="a1", ts="2026-11-30T08:00:05Z"),
                      reset_event("new"),
                      msg("Good morning! Let's plan the garden.", event_id="u2", ts="2026-11-30T09:00:00Z"),
                      msg("Happy to help with the garden.", "assistant", event_id="a2", ts="2026-11-30T09:00:05Z"))
        wait_for(lambda: len(daemon.export(AGENT)) == 4, what="four memories")
        ids = {p["payload"]["entry_id"]: p["id"] for p in daemon.export(AGENT)}

        def post(path: str, body: dict[str, object]) -> dict[str, object]:
            request = urllib.request.Request(daemon.base + path, data=json.dumps({"agent_id": AGENT, **body}).encode(),
                                             headers={"Content-Type": "application/json", **daemon.auth},
                                             method="POST")
            with urllib.request.urlopen(request, timeout=60) as response:
                answer: dict[str, object] = json.loads(response.read())
                return answer

        after_answer = post("/memory/get", {"id": ids["a1"], "neighbours": 3})
        assert [r["entry_id"] for r in after_answer["before"]] == ["u1"]  # type: ignore[index]
        assert after_answer["after"] == []  # the next conversation is not what came after it
        greeting = post("/memory/get", {"id": ids["u2"], "neighbours": 3})
        assert greeting["before"] == [] and [r["entry_id"] for r in greeting["after"]] == ["a2"]  # type: ignore[index]
        block = str(post("/memory/context", {"query": "night train to Vienna platform", "floor": False})["context"])
        lines = block.splitlines()
        for line in lines:
            if "Good morning" in line:
                assert line.startswith("- "), block  # never the continuation of the last conversation


def test_a_cron_prompt_in_a_persons_session_keeps_what_the_person_says_after_it() -> None:
    """The gap hook's `openclaw agent --message "[cron:veritas-sync] ..."` lands in the agent's main session
    right after the reset (seen on the real OpenClaw 2026.9.6): the prompt and its reply are not memory, the
    person's next messages are, and that conversation's end is reported. A cron run alone stays skipped."""
    def record(seq: int, event: dict[str, object]) -> RawRecord:
        return RawRecord(AGENT, json.dumps(event).encode(), SourceRef("sqlite", "db", session_id="s", seq=seq))

    hook = "[cron:veritas-sync] Session s ended at 2026-11-30T08:00:00Z but STATE.md is behind. Update it."
    state = SessionState("s")
    out = transform_records(
        [record(1, msg("The offsite is in Lisbon.", event_id="u1", ts="2026-11-30T08:00:00Z")),
         record(2, reset_event("new")),
         record(3, msg(hook, event_id="c1", ts="2026-11-30T08:01:00Z")),
         record(4, msg("STATE.md is up to date.", "assistant", event_id="c2", ts="2026-11-30T08:01:30Z")),
         record(5, msg("My dentist is Dr. Okafor on Baker Street.", event_id="u2", ts="2026-11-30T09:00:00Z")),
         record(6, msg("Noted: Dr. Okafor, Baker Street.", "assistant", event_id="a2", ts="2026-11-30T09:00:05Z")),
         record(7, reset_event("new", "2026-11-30T10:00:00.000Z"))],
        state, fallback_session="s", redact_key=b"k" * 32, max_line_bytes=1 << 20, chunk_chars=2000,
        chunk_overlap=0)
    assert [c.entry.entry_id for c in out.chunks] == ["u1", "u2", "a2"]
    assert out.skipped["cron_session"] == 2  # the prompt and the reply to it
    assert [(e.session_kind, e.ended_at) for e in out.ends] == [
        ("conversation", "2026-11-30T08:00:00.000Z"), ("conversation", "2026-11-30T09:00:05.000Z")]

    cron_only = SessionState("s")
    out = transform_records([record(1, msg(hook, event_id="c1", ts="2026-11-30T08:01:00Z")),
                             record(2, msg("Done.", "assistant", event_id="c2", ts="2026-11-30T08:01:30Z")),
                             record(3, msg("[cron:veritas-sync] again", event_id="c3", ts="2026-11-30T08:02:00Z"))],
                            cron_only, fallback_session="s", redact_key=b"k" * 32, max_line_bytes=1 << 20,
                            chunk_chars=2000, chunk_overlap=0)
    assert out.chunks == [] and out.skipped["cron_session"] == 3 and cron_only.session_kind == "cron"


def test_a_subagent_session_is_not_memory_until_a_person_types_in_it() -> None:
    """A `sessions_spawn` child (seen on the real OpenClaw 2026.9.6): its brief, its work and its result are
    the runtime's (OpenClaw's own memory does not promote them either); the parent's reply carries the result
    to the person. A visible child session a person goes on typing in is their conversation from then on."""
    def record(seq: int, event: dict[str, object]) -> RawRecord:
        return RawRecord(AGENT, json.dumps(event).encode(), SourceRef("sqlite", "db", session_id="c", seq=seq))

    brief = ("[Subagent Context] You are running as a subagent (depth 1/5). Complete the current [Subagent Task]; "
             "inherited conversation is background context, not your assignment.\n\n[Subagent Task]\n\n"
             "Compare three moving company quotes\n\nBegin. Execute the assigned task to completion.")
    child = SessionState("c")
    records = [record(1, msg(brief, event_id="b1", ts="2026-11-30T08:00:00Z")),
               record(2, msg("Cheapest quote: Pennine Movers at 640 pounds.", "assistant", event_id="r1",
                             ts="2026-11-30T08:00:30Z"))]
    out = transform_records(records, child, fallback_session="c", redact_key=b"k" * 32, max_line_bytes=1 << 20,
                            chunk_chars=2000, chunk_overlap=0)
    assert out.chunks == [] and out.skipped["subagent_session"] == 2 and child.session_kind == "subagent"

    visible = SessionState("c")
    records += [record(3, msg("Can you ask Pennine about Saturday slots?", event_id="u1", ts="2026-11-30T09:00:00Z")),
                record(4, msg("Pennine has Saturday slots at 8 and 13.", "assistant", event_id="a1",
                              ts="2026-11-30T09:00:20Z")),
                record(5, reset_event("new", "2026-11-30T10:00:00.000Z"))]
    out = transform_records(records, visible, fallback_session="c", redact_key=b"k" * 32, max_line_bytes=1 << 20,
                            chunk_chars=2000, chunk_overlap=0)
    assert [c.entry.entry_id for c in out.chunks] == ["u1", "a1"]
    assert [(e.session_kind, e.ended_at) for e in out.ends] == [("conversation", "2026-11-30T09:00:20.000Z")]
