"""Cursors already in users' `cursors.sqlite` keep their positions and session state: both sources' cursors
now hold one versioned `SessionState`, and cursors written before that (the session facts as loose fields)
are read as they were. The old rows below are literal JSON as the previous code wrote it."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from tests.daemon_harness import DaemonProcess, Ledger, append, assert_store_matches, file_key
from tests.sqlite_fixture import OpenClawWriter, create_database, message_event
from veritas_watch.model import SESSION_STATE_VERSION, ConversationEnd, RawRecord, SessionState, SourceRef
from veritas_watch.openclaw import TranscriptDb
from veritas_watch.pipeline import transform_records
from veritas_watch.sources.cursors import CursorStore, FileCursor, SqliteCursor
from veritas_watch.sources.sqlite import SessionBatch, SessionCursor
from veritas_watch.sources.sqlite_feed import SqliteFeed, lost_conversation

DB = "/state/agents/main/agent/openclaw-agent.sqlite"

# `FileCursor.to_json` before the session state was one value.
OLD_FILE_CURSOR = (
    '{"key":"64769:1234","path":"/state/agents/main/sessions/s1.jsonl","agent_id":"main","offset":2048,'
    '"line":12,"head_len":2048,"head_hash":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",'
    '"tail_hash":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","session_id":"s1","session_kind":"conversation",'
    '"last_entry_ts":"2026-11-30T08:00:00.000Z","turn":"working","previous_text":"the heron mill opens at nine",'
    '"ended":false,"tail_len":180}')
# Older still: no `tail_len` (32-byte tail checks), no `turn`, no session facts learned yet.
OLDER_FILE_CURSOR = (
    '{"key":"64769:99","path":"/state/agents/ops/sessions/s2.jsonl.reset.2026-11-30T09-00-00.000Z",'
    '"agent_id":"ops","offset":40,"line":1,"head_len":40,"head_hash":"cc","tail_hash":"dd","session_id":null,'
    '"session_kind":"unknown","last_entry_ts":null,"previous_text":null,"ended":true}')

# `SqliteFeed.unit_for`'s states before the session state was one value (json.dumps, default separators).
OLD_SQLITE_STATE = (
    '{"session_id": "win-1", "next_seq": 5, "generation": "g1", "last_event_id": "e4", "row_count": 5, '
    '"session_kind": "conversation", "turn": "background", "last_entry_ts": "2026-11-30T08:00:00.000Z", '
    '"previous_text": "kayak at north slip", "conversation_entries": 3, "point_session_id": "hdr-1", '
    '"ended_reported": false, "ends_through_seq": 2, "pending_ends": [{"session_id": "hdr-1", '
    '"ended_at": "2026-11-30T07:00:00.000Z", "session_kind": "conversation", "reason": "new", '
    '"transcript": "' + DB + '#win-1:2", "seq": 2}]}')
OLD_SQLITE_VANISHED = (
    '{"session_id": "win-2", "next_seq": 9, "generation": null, "last_event_id": "e8", "row_count": 9, '
    '"session_kind": "cron", "turn": "conversation", "last_entry_ts": "2026-11-29T10:00:00.000Z", '
    '"previous_text": null, "conversation_entries": 0, "point_session_id": "hdr-2", "ended_reported": true, '
    '"ends_through_seq": null, "pending_ends": [], "vanished": true}')
OLD_SQLITE_TOMBSTONE = '{"vanished": true, "point_session_id": "hdr-3", "last_entry_ts": "2026-11-28T10:00:00.000Z"}'
# Before point session ids and conversation counts were kept.
OLD_SQLITE_EARLY = ('{"session_id": "win-4", "next_seq": 2, "generation": null, "last_event_id": null, '
                    '"row_count": 2, "session_kind": "conversation", "last_entry_ts": "2026-11-27T10:00:00.000Z"}')


def store_rows(path: Path, files: dict[str, str], sessions: dict[str, str]) -> CursorStore:
    CursorStore(path).close()  # the schema
    db = sqlite3.connect(path)
    with db:
        db.executemany("INSERT INTO file_cursors (key, state) VALUES (?, ?)", list(files.items()))
        db.executemany("INSERT INTO db_cursors (db, session_id, state) VALUES (?, ?, ?)",
                       [(DB, sid, state) for sid, state in sessions.items()])
    db.close()
    return CursorStore(path)


def test_a_jsonl_cursor_of_the_previous_format_keeps_its_position_and_session_state(tmp_path: Path) -> None:
    store = store_rows(tmp_path / "cursors.sqlite", {"64769:1234": OLD_FILE_CURSOR, "64769:99": OLDER_FILE_CURSOR}, {})
    loaded = store.load_files()
    cursor = loaded["64769:1234"]
    assert (cursor.key, cursor.path, cursor.agent_id, cursor.offset, cursor.line, cursor.head_len, cursor.head_hash,
            cursor.tail_hash, cursor.ended, cursor.tail_len) == (
        "64769:1234", "/state/agents/main/sessions/s1.jsonl", "main", 2048, 12, 2048, "a" * 32, "b" * 32, False, 180)
    assert cursor.session == SessionState("s1", "conversation", "2026-11-30T08:00:00.000Z", "working",
                                          "the heron mill opens at nine")
    older = loaded["64769:99"]
    assert (older.offset, older.line, older.ended, older.tail_len) == (40, 1, True, 32)
    assert older.session == SessionState(None)

    # Written back in the new format, read back the same.
    store.commit_files(loaded.values())
    assert store.load_files() == loaded
    store.close()
    raw = json.loads(sqlite3.connect(tmp_path / "cursors.sqlite").execute(
        "SELECT state FROM file_cursors WHERE key = '64769:1234'").fetchone()[0])
    assert raw["session"]["version"] == SESSION_STATE_VERSION
    assert "session_id" not in raw and "turn" not in raw


def test_a_jsonl_cursor_mixing_both_formats_or_of_an_unknown_version_is_corrupt() -> None:
    new = json.loads(FileCursor("1:2", "/p", "main").to_json())
    for bad in ({**new, "session_id": "s"}, {**new, "session": {**new["session"], "version": 99}},
                {**new, "session": {**new["session"], "turn": 3}}, {**new, "session": "s1"}):
        try:
            FileCursor.from_json(json.dumps(bad))
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_a_file_cursor_copy_has_its_own_session_state() -> None:
    cursor = FileCursor("1:2", "/p", "main", session=SessionState("s"))
    copy = cursor.copy(path="/q")
    copy.session.turn = "background"
    assert (cursor.session.turn, copy.path, cursor.path) == ("conversation", "/q", "/p")


def test_sqlite_cursors_of_the_previous_format_keep_their_positions_and_session_state(tmp_path: Path) -> None:
    store = store_rows(tmp_path / "cursors.sqlite", {}, {
        "win-1": OLD_SQLITE_STATE, "win-2": OLD_SQLITE_VANISHED, "win-3": OLD_SQLITE_TOMBSTONE,
        "win-4": OLD_SQLITE_EARLY})
    loaded = store.load_sqlite(DB)
    live = loaded["win-1"]
    assert live.position == SessionCursor("win-1", 5, "g1", "e4", 5)
    assert live.session == SessionState("hdr-1", "conversation", "2026-11-30T08:00:00.000Z", "background",
                                        "kayak at north slip", 3)
    assert (live.vanished, live.ended_reported, live.ends_through_seq) == (False, False, 2)
    assert live.pending_ends == [ConversationEnd("hdr-1", "2026-11-30T07:00:00.000Z", "conversation", "new",
                                                 f"{DB}#win-1:2", 2)]
    gone = loaded["win-2"]
    assert (gone.vanished, gone.ended_reported, gone.next_seq, gone.session.session_kind) == (True, True, 9, "cron")
    tomb = loaded["win-3"]
    assert tomb == SqliteCursor(None, SessionState("hdr-3", last_entry_ts="2026-11-28T10:00:00.000Z"), vanished=True)
    assert tomb == tomb.tombstone()
    early = loaded["win-4"]
    assert early.position == SessionCursor("win-4", 2, None, None, 2)
    assert early.session == SessionState(None, "conversation", "2026-11-27T10:00:00.000Z")

    store.commit_sqlite(DB, loaded)
    assert store.load_sqlite(DB) == loaded
    store.close()
    raw = json.loads(sqlite3.connect(tmp_path / "cursors.sqlite").execute(
        "SELECT state FROM db_cursors WHERE session_id = 'win-1'").fetchone()[0])
    assert raw["session"]["version"] == SESSION_STATE_VERSION and raw["position"]["next_seq"] == 5


def test_a_sqlite_cursor_whose_position_does_not_decode_keeps_its_facts_and_reads_the_session_again(
        tmp_path: Path) -> None:
    bad = json.dumps({**json.loads(OLD_SQLITE_STATE), "next_seq": "lots"})
    store = store_rows(tmp_path / "cursors.sqlite", {}, {"win-1": bad, "win-9": "[1, 2]"})
    loaded = store.load_sqlite(DB)
    assert list(loaded) == ["win-1"]  # a row that is no cursor at all is dropped
    assert loaded["win-1"].position is None and loaded["win-1"].session.conversation_entries == 3
    store.close()


def test_the_sqlite_feed_carries_on_from_a_cursor_of_the_previous_format(tmp_path: Path) -> None:
    store = store_rows(tmp_path / "cursors.sqlite", {}, {"win-1": OLD_SQLITE_STATE, "win-2": OLD_SQLITE_VANISHED})
    feed = SqliteFeed(store)
    feed.states[DB] = store.load_sqlite(DB)
    batch = SessionBatch("win-1", "hdr-1", (), (), SessionCursor("win-1", 7, "g1", "e6", 7))
    state = feed.session_state(DB, batch)
    assert state == SessionState("hdr-1", "conversation", "2026-11-30T08:00:00.000Z", "background",
                                 "kayak at north slip", 3)
    assert feed.session_state(DB, SessionBatch("win-1", "hdr-1", (), (), batch.cursor, rewalk=True)) == \
        SessionState("hdr-1")
    unit = feed.unit_for(DB, batch, state)
    assert unit.state is not None and unit.state.position == batch.cursor and unit.state.ends_through_seq == 2
    feed.commit([unit])
    # The pending end is handed on once; the vanished session becomes a tombstone; both durably.
    assert [e.reason for e in feed.ended_sessions(DB)] == ["new"]
    assert feed.ended_sessions(DB) == []
    again = store.load_sqlite(DB)
    assert again["win-1"].pending_ends == [] and again["win-1"].next_seq == 7
    assert again["win-2"] == SqliteCursor(None, SessionState("hdr-2", last_entry_ts="2026-11-29T10:00:00.000Z"),
                                          vanished=True)
    store.close()


def test_the_daemon_carries_a_transcript_on_from_a_cursor_of_the_previous_format(tmp_path: Path) -> None:
    """The header's session id lives only in the cursor once the header was read: a cursor of the previous
    format must hand it on, or the next entries would be stored under the file name's session."""
    (tmp_path / "state" / "agents").mkdir(parents=True)
    daemon = DaemonProcess(tmp_path / "state", tmp_path / "data")
    book = Ledger(daemon.state_dir, "formats")
    path = book.sessions / "not-the-session-id.jsonl"
    daemon.start()
    append(path, book.header("hdr-formats") + book.entry("hdr-formats"))
    daemon.wait_idle()
    daemon.stop()

    db = sqlite3.connect(daemon.data_dir / "cursors.sqlite")
    (state,) = db.execute("SELECT state FROM file_cursors WHERE key = ?", (file_key(path),)).fetchone()
    current = json.loads(state)
    session = current.pop("session")
    assert session["session_id"] == "hdr-formats" and session["version"] == SESSION_STATE_VERSION
    previous = current | {name: session[name] for name in ("session_id", "session_kind", "last_entry_ts", "turn",
                                                           "previous_text")}
    with db:
        db.execute("UPDATE file_cursors SET state = ? WHERE key = ?", (json.dumps(previous), file_key(path)))
    db.close()

    daemon.start()
    append(path, book.entry("hdr-formats"))
    daemon.wait_idle()
    assert_store_matches(daemon, book)
    entries = daemon.status()["entries"]
    assert (entries["stored"], entries["unchanged"]) == (1, 0), "the file was read again from its start"
    assert not daemon.events("cursor_corrupt")
    daemon.stop()


def test_the_reset_a_conversation_began_at_is_kept_by_id_for_a_restore_to_check(tmp_path: Path) -> None:
    """A restored backup may put other events at the seqs the reset held (OpenClaw reuses them): the reset is known by
    its event id, kept in the cursor across restarts; a cursor written before that knows no id."""
    path = tmp_path / "cursors.sqlite"
    feed = SqliteFeed(CursorStore(path))
    reset = RawRecord("main", b'{"type":"reset","id":"r7","reason":"new"}',
                      SourceRef("sqlite", DB, session_id="w", seq=7))
    state = SessionState("hdr", "conversation", "2026-11-30T09:00:00.000Z", conversation_entries=2,
                         conversation_start=7)
    first = SessionBatch("w", "hdr", (reset,), (), SessionCursor("w", 10, "g", "e9", 10))
    feed.commit([feed.unit_for(DB, first, state)])
    later = SessionBatch("w", "hdr", (), (), SessionCursor("w", 12, "g", "e11", 12))  # read on, no reset in it
    feed.commit([feed.unit_for(DB, later, dataclasses.replace(state, conversation_entries=4))])
    kept = CursorStore(path).load_sqlite(DB)["w"]
    assert kept.conversation_start_id == "r7"
    assert not lost_conversation(kept, frozenset({"r7", "e9"}))  # the backup holds its start: it goes on
    assert lost_conversation(kept, frozenset({"e9"}))  # begun after the backup: removed
    assert not lost_conversation(dataclasses.replace(kept, session=SessionState("hdr", conversation_start=7)),
                                 frozenset())  # nothing said since its reset: it had ended
    assert not lost_conversation(dataclasses.replace(kept, session=dataclasses.replace(
        kept.session, conversation_start=None)), frozenset())  # begun at the session's start, which stays
    older = json.loads(kept.to_json())
    del older["conversation_start_id"]  # the format before it: the reset's id unknown, counted as removed
    assert lost_conversation(SqliteCursor.from_json(json.dumps(older)), frozenset({"r7"}))


def drain(feed: SqliteFeed, source: TranscriptDb) -> list[ConversationEnd]:
    """What the daemon does with one database, the store left out: poll until read, transform, commit each
    batch's unit, then hand on the ends due."""
    while (poll := feed.poll(source)) is not None:
        for batch in poll.batches:
            state = feed.session_state(poll.key, batch)
            out = transform_records(batch.records, state, fallback_session=batch.point_session_id,
                                    redact_key=b"k" * 32, max_line_bytes=1 << 20, chunk_chars=2000, chunk_overlap=0)
            feed.commit([feed.unit_for(poll.key, batch, state, out.ends)])
        if not poll.has_more:
            break
    return feed.ended_sessions(source.key)


def test_a_cursor_written_before_reset_ids_learns_its_id_at_the_first_poll_so_a_restore_is_judged_by_it(
        tmp_path: Path) -> None:
    """A cursor of the previous format knows the seq of the reset its conversation began at, not its id: a restore
    would count that conversation removed even where the backup holds the reset (a spurious `restored` end). The
    upgraded daemon's first poll reads the id while the rows are still the ones the cursor read, and keeps it; a
    session restored before that first poll stays unknown (counted removed, as before)."""
    path = tmp_path / "state" / "agents" / "main" / "agent" / "openclaw-agent.sqlite"
    path.parent.mkdir(parents=True)
    create_database(path, "v23")
    source = TranscriptDb(path, "main")
    cursors = tmp_path / "cursors.sqlite"
    with OpenClawWriter(path) as writer:
        seqs = {}
        for name in ("kept", "early"):
            sid = writer.create_session(f"agent:main:{name}")
            writer.append(sid, message_event("Book the venue.", event_id=f"{name}-u1"))
            (reset,) = writer.append(sid, {"type": "reset", "id": f"{name}-r", "reason": "new"})
            writer.append(sid, message_event("Order the banners.", event_id=f"{name}-u2"),
                          message_event("Banners ordered.", "assistant", event_id=f"{name}-a2"))
            seqs[name] = (sid, reset)
        first = SqliteFeed(CursorStore(cursors))
        assert [e.reason for e in drain(first, source)] == ["new", "new"]
        first.close()
        # the cursors as the previous version wrote them: no reset id
        db = sqlite3.connect(cursors)
        with db:
            for sid, state in db.execute("SELECT session_id, state FROM db_cursors").fetchall():
                older = json.loads(state)
                assert older.pop("conversation_start_id") == ("kept-r" if sid == seqs["kept"][0] else "early-r")
                db.execute("UPDATE db_cursors SET state = ? WHERE session_id = ?", (json.dumps(older), sid))
        db.close()
        # "early" is restored (to before its reset) while no version that keeps ids has read it
        early, early_reset = seqs["early"]
        writer.rewrite_suffix(early, early_reset, [], rotate_generation=False)

        upgraded = SqliteFeed(CursorStore(cursors))
        ended = drain(upgraded, source)
        assert [(e.reason, e.transcript) for e in ended] == [("restored", f"{path}#{early}")], ended
        kept, kept_reset = seqs["kept"]
        assert CursorStore(cursors).load_sqlite(source.key)[kept].conversation_start_id == "kept-r"  # durably
        # a backup that holds the reset (not the last answer): the conversation goes on there, no end
        writer.rewrite_suffix(kept, kept_reset + 2, [], rotate_generation=False)
        assert drain(upgraded, source) == []
        assert upgraded.states[source.key][kept].conversation_start_id == "kept-r"
        upgraded.close()


def test_cursors_committed_from_several_threads_at_once_all_land(tmp_path: Path) -> None:
    """The sink commits in its thread while a poll (a learned reset id, ends handed on) or the sweep commits in
    another, on the one connection: a transaction begun inside another thread's failed."""
    store = CursorStore(tmp_path / "cursors.sqlite")
    errors: list[BaseException] = []

    def commit(one: Callable[[int], None]) -> None:
        try:
            for i in range(1000):
                one(i)
        except BaseException as exc:  # any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(lambda i: store.commit_files([FileCursor(f"1:{i}", "/p", "m")]),)),
               threading.Thread(target=commit, args=(lambda i: store.commit_sqlite(DB, {f"s{i}": SqliteCursor(
                   SessionCursor(f"s{i}", i), SessionState(None))}),))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(store.load_files()) == 1000 and len(store.load_sqlite(DB)) == 1000
    store.close()
