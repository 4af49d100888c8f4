"""The SQLite transcript reader against real databases built from OpenClaw's DDL, in WAL mode,
written by an OpenClaw-like writer (in this process, a thread, or another process)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from tests.sqlite_fixture import (
    FIXTURE_SESSIONS,
    SHAPE_VERSIONS,
    SHAPES,
    OpenClawWriter,
    Shape,
    WorkloadResult,
    create_database,
    import_jsonl_file,
    long_text,
    message_event,
    start_workload,
)
from veritas_watch.model import point_id
from veritas_watch.sources.sqlite import (
    SessionCursor,
    SqlitePoll,
    SqliteSourceError,
    SqliteTranscriptReader,
    event_entry_id,
)
from veritas_watch.sources.sqlite_feed import taken_back

AGENT = "main"


def make_db(tmp_path: Path, shape: Shape = "v23", journal_mode: Literal["wal", "delete"] = "wal") -> Path:
    return create_database(tmp_path / "agents" / AGENT / "agent" / "openclaw-agent.sqlite", shape,
                           journal_mode=journal_mode)


def entry_id(data: bytes) -> str:
    """The entry id, computed here independently of the reader: every fixture event has an id."""
    ident = json.loads(data)["id"]
    assert isinstance(ident, str)
    return ident


def header_id(events: list[bytes]) -> str:
    return entry_id(events[0])


class Lead:
    """What the daemon does with polls: store records by point key, honour rewalks, commit cursors."""

    def __init__(self, reader: SqliteTranscriptReader) -> None:
        self.reader = reader
        self.cursors: dict[str, SessionCursor] = {}
        self.store: dict[tuple[str, str], bytes] = {}  # (point session id, entry id) -> event bytes
        self.deliveries: Counter[tuple[str, int, str | None]] = Counter()  # (session, seq, generation)
        self.rewalks: list[str] = []
        self.errors: list[tuple[str, int, str]] = []
        self.source_errors: Counter[str] = Counter()

    def apply(self, poll: SqlitePoll) -> None:
        for batch in poll.batches:
            if batch.rewalk:
                self.rewalks.append(batch.rewalk_reason or "")
                if batch.present_event_ids is not None and batch.rewalk_reason != "restored":
                    for key in [k for k in self.store if k[0] == batch.point_session_id
                                and k[1] not in batch.present_event_ids]:
                        del self.store[key]
            generation = batch.cursor.generation if batch.cursor else None
            for record in batch.records:
                assert record.source.kind == "sqlite" and record.source.session_id == batch.session_id
                assert record.source.seq is not None
                self.deliveries[(batch.session_id, record.source.seq, generation)] += 1
                self.store[(batch.point_session_id, event_entry_id(record.data))] = record.data
            self.errors.extend((e.session_id, e.seq, e.reason) for e in batch.errors)
            if batch.cursor is None:
                self.cursors.pop(batch.session_id, None)
            else:
                self.cursors[batch.session_id] = batch.cursor

    def poll(self, max_rows: int = 1000, max_bytes: int = 32 * 1024 * 1024) -> SqlitePoll:
        result = self.reader.poll(self.cursors, max_rows=max_rows, max_bytes=max_bytes)
        self.apply(result)
        return result

    def drain(self, max_rows: int = 1000, max_bytes: int = 32 * 1024 * 1024) -> None:
        for _ in range(10_000):
            if not self.poll(max_rows, max_bytes).has_more:
                return
        raise AssertionError("poll never settled")


def truth(transcripts: dict[str, list[bytes]]) -> dict[tuple[str, str], bytes]:
    """What the store must hold: every event of every session, keyed like the JSONL source does."""
    out: dict[tuple[str, str], bytes] = {}
    for events in transcripts.values():
        if events:
            for data in events:
                out[(header_id(events), entry_id(data))] = data
    return out


def writer_truth(writer: OpenClawWriter) -> dict[tuple[str, str], bytes]:
    return truth({sid: writer.events(sid) for sid in writer.session_ids()})


# ---------------------------------------------------------------------------------------------
# cursors


def test_cursor_round_trips_through_json() -> None:
    cursor = SessionCursor("s1", next_seq=7, generation="g-1", last_event_id="abc", row_count=7)
    assert SessionCursor.from_dict(json.loads(json.dumps(cursor.to_dict()))) == cursor
    assert SessionCursor.from_dict({"session_id": "s2"}) == SessionCursor("s2")
    for bad in ({}, {"session_id": "s", "next_seq": "3"}, {"session_id": "s", "row_count": -1},
                {"session_id": "s", "generation": 5}, {"session_id": "s", "next_seq": True}):
        with pytest.raises(ValueError):
            SessionCursor.from_dict(bad)


# ---------------------------------------------------------------------------------------------
# reading every shape


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_reads_new_rows_once(tmp_path: Path, shape: Shape) -> None:
    path = make_db(tmp_path, shape)
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, message_event("hello"), message_event(long_text(5000), "assistant"))
        lead = Lead(reader)
        first = lead.poll()
        assert first.schema.user_version == SHAPE_VERSIONS[shape][0]
        assert first.schema.schema_version == SHAPE_VERSIONS[shape][0]
        assert first.schema.app_version == SHAPE_VERSIONS[shape][1]
        assert first.schema.layout == ("sessions" if shape == "early" else "windows")
        assert [r.data for b in first.batches for r in b.records] == writer.events(sid)
        assert [s.session_id for s in first.sessions] == [sid]
        again = lead.poll()
        assert again.batches == () and again.unchanged
        writer.append(sid, message_event("more"))
        third = lead.poll()
        assert [r.data for b in third.batches for r in b.records] == writer.events(sid)[3:]
        assert [r.source.seq for b in third.batches for r in b.records] == [3]
        assert set(lead.deliveries.values()) == {1}
        assert lead.store == writer_truth(writer)
        assert lead.cursors[sid].next_seq == 4 and lead.cursors[sid].row_count == 4


@pytest.mark.parametrize("shape", ["v23", "v24"])
@pytest.mark.parametrize("content_size", [True, False])
def test_zstd_rows_decode_to_the_exact_bytes(tmp_path: Path, shape: Shape, content_size: bool) -> None:
    path = make_db(tmp_path, shape)
    with OpenClawWriter(path, zstd_content_size=content_size) as writer, \
            SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        seqs = writer.append(sid, message_event("短い"), message_event("長い " + long_text(20_000), "assistant"),
                             message_event(long_text(300_000, seed=3), "assistant"))
        assert [writer.stored_compressed(sid, s) for s in seqs] == [False, True, True]
        lead = Lead(reader)
        lead.drain()
        assert lead.errors == []
        assert lead.store == writer_truth(writer)


def test_bad_zstd_rows_become_row_errors_not_exceptions(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        seqs = writer.append(sid, *(message_event(long_text(4000, seed=i)) for i in range(4)))
        writer.zstd_content_size = False  # a frame that does not declare its size
        seqs += writer.append(sid, message_event(long_text(4000, seed=9)))
        corrupt, mismatch, truncated, good, undeclared = seqs
        events = writer.events(sid)
        frame = writer.conn.execute("SELECT event_zstd FROM transcript_events WHERE session_id = ? AND seq = ?",
                                    (sid, corrupt)).fetchone()[0]
        flipped = frame[:-3] + bytes([frame[-3] ^ 0xFF]) + frame[-2:]
        with writer.transaction() as conn:
            conn.execute("UPDATE transcript_events SET event_zstd = ? WHERE session_id = ? AND seq = ?",
                         (flipped, sid, corrupt))
            conn.execute("UPDATE transcript_events SET event_utf8_bytes = event_utf8_bytes + 1"
                         " WHERE session_id = ? AND seq = ?", (sid, mismatch))
            conn.execute("UPDATE transcript_events SET event_zstd = substr(event_zstd, 1, 20)"
                         " WHERE session_id = ? AND seq = ?", (sid, truncated))
            conn.execute("UPDATE transcript_events SET event_utf8_bytes = event_utf8_bytes + 5"
                         " WHERE session_id = ? AND seq = ?", (sid, undeclared))
        lead = Lead(reader)
        lead.drain()
        reasons = {seq: reason for _, seq, reason in lead.errors}
        assert reasons == {corrupt: "zstd_corrupt", mismatch: "zstd_length_mismatch", truncated: "zstd_corrupt",
                           undeclared: "zstd_length_mismatch"}
        assert lead.store == {
            (header_id(events), entry_id(events[i])): events[i] for i in (0, good)}
        assert lead.cursors[sid].next_seq == undeclared + 1  # moved past the bad rows
        assert lead.poll().batches == ()  # and they are not reported again


# ---------------------------------------------------------------------------------------------
# rewrites


@pytest.mark.parametrize("shape", SHAPES)
def test_suffix_rewrite_rewalks_and_leaves_the_final_transcript(tmp_path: Path, shape: Shape) -> None:
    path = make_db(tmp_path, shape)
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, *(message_event(f"m{i}", "user" if i % 2 else "assistant") for i in range(9)))
        lead = Lead(reader)
        lead.drain()
        dropped = {entry_id(e) for e in writer.events(sid)[6:]}
        writer.rewrite_suffix(sid, 6, [message_event("rewound answer", "assistant"), message_event("next")])
        result = lead.poll()
        (batch,) = result.batches
        assert batch.rewalk
        assert batch.rewalk_reason == ("rows_changed" if shape == "early" else "generation_changed")  # 10 rows -> 8
        assert [r.source.seq for r in batch.records] == list(range(8))
        assert batch.present_event_ids == frozenset(entry_id(e) for e in writer.events(sid))
        assert not dropped & {k[1] for k in lead.store}
        assert lead.store == writer_truth(writer)
        writer.append(sid, message_event("after"))
        assert [r.source.seq for b in lead.poll().batches for r in b.records] == [8]
        assert lead.store == writer_truth(writer)


@pytest.mark.parametrize("shape", SHAPES)
def test_full_replacement_rewalks_and_leaves_the_final_transcript(tmp_path: Path, shape: Shape) -> None:
    path = make_db(tmp_path, shape)
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, *(message_event(f"m{i}") for i in range(12)))
        lead = Lead(reader)
        lead.drain()
        kept = writer.events(sid)[:4]  # header + 3 kept, then a summary: fewer rows than before
        writer.replace_session(sid, [*(k.decode() for k in kept), message_event("summary of the rest", "assistant")])
        (batch,) = lead.poll().batches
        assert batch.rewalk and [r.source.seq for r in batch.records] == [0, 1, 2, 3, 4]
        assert lead.store == writer_truth(writer)
        assert len(lead.store) == 5


def _point(entry: str, ts: float | None) -> tuple[str, dict[str, object]]:
    return f"p-{entry}", {"entry_id": entry, "ts": ts}


def test_taken_back_keeps_history_trimmed_from_the_front() -> None:
    points = [_point(f"e{i}", float(i)) for i in range(6)]
    # the last two kept (--max-lines): the four before them stay
    assert taken_back(points, {"e4", "e5"}) == []
    # the tail withdrawn (a rewound answer): it goes
    assert taken_back(points, {"e0", "e1", "e2", "e3"}) == ["p-e4", "p-e5"]
    # a row gone between two kept ones is not a front trim: it goes, as before
    assert taken_back(points, {"e0", "e1", "e3", "e4", "e5"}) == ["p-e2"]
    # replaced by new events (none of its memories kept): memory reads as the session now does
    assert taken_back(points, {"summary"}) == [f"p-e{i}" for i in range(6)]
    # without a time, nothing can be placed before what was kept: it goes
    assert taken_back([*points, _point("x", None)], {"e4", "e5"}) == ["p-x"]
    # chunks of one entry share its time: all of them stay or go together
    chunks = [*points, ("p-e1#1", {"entry_id": "e1", "ts": 1.0})]
    assert taken_back(chunks, {"e2", "e3", "e4", "e5"}) == []


# OpenClaw rotates the generation with every destructive change; other events under the generation the rows
# were read with are the database gone back in time (a backup put in place): nothing was taken back.

def test_another_event_under_the_same_generation_is_a_restore_caught_by_event_id(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, *(message_event(f"m{i}") for i in range(5)))
        lead = Lead(reader)
        lead.drain()
        before = dict(lead.store)
        writer.rewrite_suffix(sid, 3, [message_event("x"), message_event("y"), message_event("z")],
                              rotate_generation=False)
        (batch,) = lead.poll().batches
        assert batch.rewalk and batch.rewalk_reason == "restored"
        assert lead.store == {**before, **writer_truth(writer)}  # the events it lost stay
        assert len(lead.store) > len(writer_truth(writer))


def test_vanished_rows_under_the_same_generation_are_a_restore_caught_by_row_count(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v19")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, *(message_event(f"m{i}") for i in range(6)))
        lead = Lead(reader)
        lead.drain()
        before = dict(lead.store)
        writer.delete_rows(sid, [2, 3], rotate_generation=False)  # same last row, same generation
        writer.append(sid, message_event("next turn"))  # found no later than the session's next append
        (batch,) = lead.poll().batches
        assert batch.rewalk and batch.rewalk_reason == "restored"
        assert lead.store == {**before, **writer_truth(writer)}


def test_without_a_generation_a_changed_event_is_a_rewrite(tmp_path: Path) -> None:
    path = make_db(tmp_path, "early")  # no watermark table: a rewrite cannot be told from a restore
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, *(message_event(f"m{i}") for i in range(5)))
        lead = Lead(reader)
        lead.drain()
        writer.rewrite_suffix(sid, 3, [message_event("x"), message_event("y")], rotate_generation=False)
        (batch,) = lead.poll().batches
        assert batch.rewalk and batch.rewalk_reason in ("rows_changed", "event_changed")
        assert lead.store == writer_truth(writer)


def test_plain_update_rewalks_and_refreshes_content(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v24")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, message_event("original", event_id="e1"), message_event("b", event_id="e2"))
        lead = Lead(reader)
        lead.drain()
        writer.update_event(sid, 1, message_event("edited " + long_text(3000), event_id="e1"))
        (batch,) = lead.poll().batches
        assert batch.rewalk
        assert b"edited" in lead.store[(sid, "e1")]
        assert lead.store == writer_truth(writer)


def test_rewalk_pages_through_the_budget_then_continues(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, *(message_event(f"m{i}") for i in range(24)))
        lead = Lead(reader)
        lead.drain(max_rows=10)
        writer.rewrite_suffix(sid, 20, [message_event("r1"), message_event("r2")])
        pages = [lead.poll(max_rows=10) for _ in range(3)]
        assert [p.has_more for p in pages] == [True, True, False]
        assert [b.rewalk for p in pages for b in p.batches] == [True, False, False]
        assert [r.source.seq for p in pages for b in p.batches for r in b.records] == list(range(22))
        assert lead.store == writer_truth(writer)


# ---------------------------------------------------------------------------------------------
# budgets


def test_row_and_byte_budgets_page_without_loss_or_starvation(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        big = writer.create_session("agent:main:big")
        small = writer.create_session("agent:main:small")
        writer.append(big, *(message_event(long_text(2000, seed=i)) for i in range(40)))
        writer.append(small, message_event("one"))
        lead = Lead(reader)
        first = lead.poll(max_rows=10)
        second = lead.poll(max_rows=10)
        # whichever session came first, the other one is served by the second poll at the latest
        assert {b.session_id for p in (first, second) for b in p.batches} == {big, small}
        lead.drain(max_rows=10)
        lead.drain(max_bytes=1)  # one row per poll still makes progress
        assert set(lead.deliveries.values()) == {1}
        assert lead.store == writer_truth(writer)
        writer.append(big, *(message_event(long_text(3000, seed=100 + i)) for i in range(5)))
        polls = 0
        while lead.poll(max_bytes=1).has_more:
            polls += 1
        assert polls == 4  # 5 rows, one per poll
        assert lead.store == writer_truth(writer)


# ---------------------------------------------------------------------------------------------
# sessions: resets, deletion, cold storage


def test_reset_is_a_new_window_and_ends_the_previous(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        key = "agent:main:main"
        old = writer.create_session(key)
        writer.append(old, message_event("before the reset"))
        lead = Lead(reader)
        lead.drain()
        (info,) = lead.poll().sessions
        assert not info.ended and info.session_key == key
        _, new = writer.reset(key)
        writer.append(new, message_event("after the reset"))
        result = lead.poll()
        sessions = {s.session_id: s for s in result.sessions}
        assert sessions[old].ended and not sessions[new].ended
        assert sessions[new].previous_session_id == old and sessions[new].reason == "reset"
        assert sessions[old].last_seq == 1
        assert [b.session_id for b in result.batches] == [new]  # the old rows stay, nothing re-read
        assert lead.store == writer_truth(writer)


def test_early_layout_reports_sessions_and_resets(tmp_path: Path) -> None:
    path = make_db(tmp_path, "early")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        old = writer.create_session("agent:main:main")
        _, new = writer.reset("agent:main:main")
        sessions = {s.session_id: s for s in Lead(reader).poll().sessions}
        assert sessions[old].ended and not sessions[new].ended
        assert sessions[new].previous_session_id is None  # the early layout does not record it


def test_deleted_session_forgets_its_cursor_and_keeps_its_points(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        keep = writer.create_session("agent:main:keep")
        gone = writer.create_session("agent:main:gone")
        writer.append(keep, message_event("stays"))
        writer.append(gone, message_event("deleted later"))
        lead = Lead(reader)
        lead.drain()
        before = dict(lead.store)
        writer.delete_session(gone)
        result = lead.poll()
        (batch,) = result.batches
        assert batch.session_id == gone and batch.rewalk and batch.rewalk_reason == "window_vanished"
        assert batch.cursor is None and batch.present_event_ids is None and batch.records == ()
        assert gone not in lead.cursors and gone not in {s.session_id for s in result.sessions}
        assert lead.store == before  # deletion archives are history: nothing removed
        assert lead.poll().batches == ()
        archived = writer.conn.execute("SELECT reason, encoding FROM session_transcript_archives WHERE"
                                       " session_id = ?", (gone,)).fetchall()
        assert archived == [("deleted", "zstd")]


def test_a_forgotten_session_is_reported_and_read_no_more(tmp_path: Path) -> None:
    """`openclaw memory forget` leaves the rows and adds a tombstone: the reader names the session in every
    poll and reads none of it, neither what it held nor what is appended to it."""
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        keep = writer.create_session("agent:main:keep")
        private = writer.create_session("agent:main:private")
        unread = writer.create_session("agent:main:unread")
        writer.append(keep, message_event("stays"))
        writer.append(private, message_event("my therapist is Dr. Lee"))
        lead = Lead(reader)
        lead.drain()
        assert lead.poll().forgotten == frozenset()
        writer.append(unread, message_event("forgotten before it was ever read"))
        writer.forget(private)
        writer.forget(unread)
        writer.append(private, message_event("and my pharmacist is Ms. Park"))
        writer.append(keep, message_event("still read"))
        result = lead.poll()
        assert result.forgotten == {private, unread}
        assert {b.session_id for b in result.batches} == {keep}
        assert lead.poll().forgotten == {private, unread}  # an unchanged poll says so too
        assert not any(b"Park" in data or b"ever read" in data for data in lead.store.values())


def test_cold_archived_session_is_not_a_rewrite(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, message_event("old history"))
        lead = Lead(reader)
        lead.drain()
        before, cursor = dict(lead.store), lead.cursors[sid]
        writer.cold_archive(sid)
        result = lead.poll()
        assert result.batches == ()
        assert lead.cursors[sid] == cursor and lead.store == before
        (info,) = result.sessions
        assert info.cold_archived and info.last_seq == cursor.next_seq - 1  # the archive's: nothing left to read


def test_the_unread_rows_of_a_cold_session_count_as_lag(tmp_path: Path) -> None:
    """`status` lag is last_seq + 1 - the cursor: a session OpenClaw moved to cold storage before it was read
    reports the last seq its archive holds (it once reported none, so lag said 0 while rows waited)."""
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, message_event("one"), message_event("two"))
        writer.cold_archive(sid)
        (info,) = reader.poll({}, max_rows=1).sessions
        assert info.cold_archived and info.last_seq == 2
        lead = Lead(reader)
        lead.drain()
        assert lead.cursors[sid].next_seq == 3


@pytest.mark.parametrize("storage", ["file", "sqlite"])
def test_a_session_in_cold_storage_before_it_was_read_is_read_from_its_archive(
        tmp_path: Path, storage: Literal["file", "sqlite"]) -> None:
    """A first run on a machine where OpenClaw's cold storage already moved old sessions out of the table."""
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:old")
        writer.append(sid, *(message_event(f"old turn {i}") for i in range(3)))
        truth = writer_truth(writer)
        archive = writer.cold_archive(sid, storage)
        assert (archive is not None) == (storage == "file")
        assert writer.conn.execute("SELECT count(*) FROM transcript_events").fetchone()[0] == 0
        lead = Lead(reader)
        lead.drain()
        assert lead.store == truth  # under the session's header id, as if it had been read hot
        assert lead.poll().batches == ()  # read once
        assert lead.cursors[sid].next_seq == 4 and lead.cursors[sid].row_count == 4  # as if read hot


def test_only_the_unread_tail_of_a_cold_session_is_read_from_its_archive(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, message_event("read while hot"))
        lead = Lead(reader)
        lead.drain()
        writer.append(sid, message_event("written while the daemon was down"))
        truth = writer_truth(writer)
        writer.cold_archive(sid)
        deliveries = sum(lead.deliveries.values())
        lead.drain()
        assert lead.store == truth
        assert sum(lead.deliveries.values()) == deliveries + 1


def test_an_archive_that_fails_verification_is_told_once_and_read_nothing_from(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:old")
        writer.append(sid, message_event("old"))
        archive = writer.cold_archive(sid)
        assert archive is not None
        archive.write_bytes(archive.read_bytes()[:-1] + b"\0")  # same size, other bytes
        with capture_logs() as logs:
            lead = Lead(reader)
            lead.drain()
            lead.poll()
        assert lead.store == {}
        told = [e for e in logs if e["event"] == "cold_archive_unreadable"]
        assert len(told) == 1 and str(archive) == told[0]["path"] and "SHA-256" in told[0]["detail"]


# ---------------------------------------------------------------------------------------------
# migration from JSONL: one point per entry, whichever source read it


def _jsonl_point_ids(path: Path) -> set[str]:
    """Point ids as the JSONL source keys them: the header's id, each line's own id."""
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    session_id = lines[0]["id"]
    return {point_id(AGENT, session_id, line["id"], 0) for line in lines[1:] if isinstance(line.get("id"), str)}


def _sqlite_point_ids(lead: Lead) -> set[str]:
    out: set[str] = set()
    for (point_sid, eid), data in lead.store.items():
        if json.loads(data).get("type") != "session":
            out.add(point_id(AGENT, point_sid, eid, 0))
    return out


def _write_jsonl(path: Path, header: str, n: int) -> None:
    lines = [{"type": "session", "version": 3, "id": header, "timestamp": "2026-03-12T15:05:57.096Z", "cwd": "/w"}]
    parent = None
    for i in range(n):
        event = message_event(f"line {i} " + long_text(1500 if i == 2 else 30, seed=i),
                              "user" if i % 2 == 0 else "assistant", parent_id=parent)
        parent = event["id"]
        lines.append(event)
    path.write_text("".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines))


def test_migrated_session_keeps_jsonl_point_ids(tmp_path: Path) -> None:
    # The real fixture has a transcript whose header id is not its file name; build one like it.
    jsonl = tmp_path / "06826999-c084-45d8-9da5-236646ccc145.jsonl"
    _write_jsonl(jsonl, "6a5e48ab-0bc4-4ea3-b88d-d3642ace950b", 8)
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = import_jsonl_file(writer, jsonl, session_key="agent:main:main")
        assert writer.stored_compressed(sid, 3)  # the 1.5 KB line went to event_zstd
        lead = Lead(reader)
        result = lead.poll()
        (batch,) = result.batches
        assert batch.session_id == "06826999-c084-45d8-9da5-236646ccc145"  # rows: sessions.json's id
        assert batch.point_session_id == "6a5e48ab-0bc4-4ea3-b88d-d3642ace950b"  # points: the header's
        assert _sqlite_point_ids(lead) == _jsonl_point_ids(jsonl)
        # the point session id holds for later, incremental batches too
        writer.append(sid, message_event("live after migration"))
        (later,) = lead.poll().batches
        assert later.point_session_id == "6a5e48ab-0bc4-4ea3-b88d-d3642ace950b"


@pytest.mark.skipif(not FIXTURE_SESSIONS.is_dir(), reason="../shared fixtures not present")
def test_real_transcripts_migrate_without_new_point_ids(tmp_path: Path) -> None:
    files = sorted(p for p in FIXTURE_SESSIONS.glob("*.jsonl"))
    assert files
    path = make_db(tmp_path, "v24")
    expected: set[str] = set()
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        for n, jsonl in enumerate(files):
            import_jsonl_file(writer, jsonl, session_key=f"agent:main:s{n}")
            expected |= _jsonl_point_ids(jsonl)
        lead = Lead(reader)
        lead.drain(max_rows=200)
        assert lead.errors == []
        assert _sqlite_point_ids(lead) == expected
        mismatched = [b for b in lead.reader.poll({}).batches if b.point_session_id != b.session_id]
        assert mismatched  # the fixture's header-id quirk is really exercised


# ---------------------------------------------------------------------------------------------
# concurrency: a writer in another process, the reader polling in a tight loop


def _run_against_workload(path: Path, *, rewrites: bool, turns: int, pause_s: float,
                          busy_timeout_ms: int) -> tuple[Lead, WorkloadResult, int]:
    process, results = start_workload(path, seed=7, turns=turns, busy_timeout_ms=busy_timeout_ms,
                                      pause_s=pause_s, rewrites=rewrites)
    reader = SqliteTranscriptReader(path, AGENT)
    lead = Lead(reader)
    polls = 0
    result: WorkloadResult | None = None
    deadline = time.monotonic() + 120
    try:
        while result is None and time.monotonic() < deadline:
            try:
                lead.poll(max_rows=50)
                polls += 1
            except SqliteSourceError as exc:
                lead.source_errors[exc.reason] += 1  # the daemon logs and retries
            with contextlib.suppress(queue.Empty):
                result = results.get_nowait()
        assert result is not None, "writer process did not finish"
        process.join(30)
        lead.drain()
    finally:
        reader.close()
        if process.is_alive():
            process.kill()
    return lead, result, polls


def test_live_appends_are_returned_once_while_the_writer_runs(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    busy_timeout_ms = 2000
    lead, result, polls = _run_against_workload(path, rewrites=False, turns=80, pause_s=0.003,
                                                busy_timeout_ms=busy_timeout_ms)
    assert result.errors == [] and result.busy_errors == 0
    assert result.max_lock_wait_s < busy_timeout_ms / 1000
    assert polls > 10  # the reader really polled while the writer wrote
    assert lead.rewalks == [] and lead.errors == []
    assert set(lead.deliveries.values()) == {1}  # every row exactly once
    assert lead.store == truth(result.transcripts)


def test_live_rewrites_and_resets_leave_the_final_transcripts(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v24")
    lead, result, _ = _run_against_workload(path, rewrites=True, turns=60, pause_s=0.003, busy_timeout_ms=2000)
    assert result.errors == [] and result.busy_errors == 0
    assert lead.rewalks  # the rewrites were seen as such
    assert lead.store == truth(result.transcripts)
    assert len(result.transcripts) == 3  # two keys, one of them reset


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
def test_tight_polling_never_blocks_the_writer(tmp_path: Path, journal_mode: Literal["wal", "delete"]) -> None:
    """BEGIN IMMEDIATE appends complete while the reader polls flat out. In rollback-journal mode
    (network filesystems) the reader may itself be told "locked" (typed error, retried), never the writer."""
    path = make_db(tmp_path, "v23", journal_mode=journal_mode)
    busy_timeout_ms = 1000
    lead, result, polls = _run_against_workload(path, rewrites=False, turns=150, pause_s=0.0,
                                                busy_timeout_ms=busy_timeout_ms)
    print(f"\n{journal_mode}: {result.transactions} writer transactions, {polls} polls, max lock wait "
          f"{result.max_lock_wait_s * 1000:.2f} ms, max commit {result.max_commit_s * 1000:.2f} ms, "
          f"reader retries {dict(lead.source_errors)}")
    assert result.errors == [] and result.busy_errors == 0
    assert result.max_lock_wait_s < busy_timeout_ms / 1000
    assert result.max_commit_s < busy_timeout_ms / 1000
    assert set(lead.source_errors) <= {"locked"}
    if journal_mode == "wal":
        assert not lead.source_errors  # WAL readers are never refused
    assert lead.store == truth(result.transcripts)


def test_no_read_transaction_outlives_a_poll(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, *(message_event(long_text(3000, seed=i)) for i in range(200)))
        lead = Lead(reader)
        assert lead.poll(max_rows=10).has_more  # stopped mid-session: the SELECT was not finished
        # A TRUNCATE checkpoint needs every reader off the WAL: busy = 0 proves none holds a snapshot.
        busy, _, _ = writer.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
        assert os.path.getsize(str(path) + "-wal") == 0


def test_reader_in_a_thread_sees_concurrent_rewrites(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    writer = OpenClawWriter(path)
    sid = writer.create_session("agent:main:main")
    reader = SqliteTranscriptReader(path, AGENT)
    lead = Lead(reader)
    stop = threading.Event()
    failures: list[BaseException] = []

    def poll_loop() -> None:
        try:
            while not stop.is_set():
                lead.poll(max_rows=7)
        except BaseException as exc:  # surfaced by the assertion below
            failures.append(exc)

    thread = threading.Thread(target=poll_loop)
    thread.start()
    try:
        for turn in range(30):
            writer.append(sid, message_event(f"q{turn}"),
                          message_event(f"a{turn} " + long_text(1500, turn), "assistant"))
            if turn % 7 == 6:
                n = len(writer.events(sid))
                writer.rewrite_suffix(sid, n - 3, [message_event(f"rewritten {turn}", "assistant")])
    finally:
        stop.set()
        thread.join()
    assert failures == []
    lead.drain()
    assert lead.store == writer_truth(writer)
    reader.close()
    writer.close()


# ---------------------------------------------------------------------------------------------
# broken databases: typed errors, then recovery


def test_missing_corrupt_and_empty_files_raise_typed_errors(tmp_path: Path) -> None:
    path = tmp_path / "openclaw-agent.sqlite"
    reader = SqliteTranscriptReader(path, AGENT)
    with pytest.raises(SqliteSourceError) as missing:
        reader.poll({})
    assert missing.value.reason == "missing"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(SqliteSourceError) as garbage:
        reader.poll({})
    assert garbage.value.reason == "corrupt"
    path.write_bytes(b"")
    with pytest.raises(SqliteSourceError) as empty:
        reader.poll({})
    assert empty.value.reason == "schema_missing"
    path.unlink()
    create_database(path, "v23", journal_mode="delete")
    with OpenClawWriter(path) as writer:
        sid = writer.create_session("agent:main:main")
        writer.append(sid, *(message_event(long_text(3000, seed=i)) for i in range(50)))
    assert [b.session_id for b in reader.poll({}).batches] == [sid]  # recovered: a new file, reopened
    # damage every page after the schema page: the schema reads, the tables do not
    data = bytearray(path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    for offset in range(page_size, len(data), 97):
        data[offset] ^= 0x5A
    damaged = tmp_path / "damaged.sqlite"
    damaged.write_bytes(bytes(data))
    with pytest.raises(SqliteSourceError) as malformed:
        SqliteTranscriptReader(damaged, AGENT).poll({})
    assert malformed.value.reason == "corrupt"
    reader.close()


def test_locked_database_raises_then_recovers(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v19", journal_mode="delete")  # rollback journal: an exclusive lock shuts readers out
    with OpenClawWriter(path) as writer:
        sid = writer.create_session("agent:main:main")
    locker = sqlite3.connect(path, isolation_level=None)
    reader = SqliteTranscriptReader(path, AGENT, busy_timeout_s=0.05)
    try:
        locker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(SqliteSourceError) as locked:
            reader.poll({})
        assert locked.value.reason == "locked"
        locker.execute("COMMIT")
        assert [b.session_id for b in reader.poll({}).batches] == [sid]
    finally:
        locker.close()
        reader.close()


def test_wal_database_held_exclusively_raises_then_recovers(tmp_path: Path) -> None:
    path = make_db(tmp_path, "v23")
    with OpenClawWriter(path) as writer:
        sid = writer.create_session("agent:main:main")
    locker = sqlite3.connect(path, isolation_level=None)
    reader = SqliteTranscriptReader(path, AGENT, busy_timeout_s=0.05)
    try:
        locker.execute("PRAGMA locking_mode=EXCLUSIVE")
        locker.execute("BEGIN EXCLUSIVE")
        locker.execute("COMMIT")  # the exclusive lock is kept until the connection closes
        with pytest.raises(SqliteSourceError) as locked:
            reader.poll({})
        assert locked.value.reason == "locked"
        locker.close()
        assert [b.session_id for b in reader.poll({}).batches] == [sid]
    finally:
        locker.close()
        reader.close()


# ---------------------------------------------------------------------------------------------
# property: any mix of mutations and polls ends with the store equal to the final transcripts

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 1), st.integers(1, 4), st.booleans()),
        st.tuples(st.just("rewrite"), st.integers(0, 1), st.integers(1, 6), st.integers(0, 3)),
        st.tuples(st.just("replace"), st.integers(0, 1), st.integers(1, 5), st.integers(0, 2)),
        st.tuples(st.just("update"), st.integers(0, 1), st.integers(1, 8), st.booleans()),
        st.tuples(st.just("reset"), st.integers(0, 1), st.just(0), st.just(0)),
        st.tuples(st.just("poll"), st.integers(1, 6), st.just(0), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, shape=st.sampled_from(["early", "v19", "v23"]))
def test_any_history_converges_to_the_final_transcripts(tmp_path: Path, ops: list[tuple[str, int, int, object]],
                                                        shape: Shape) -> None:
    base = tmp_path / f"prop-{time.monotonic_ns()}"
    path = make_db(base, shape)
    counter = iter(range(10**6))
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        keys = ["agent:main:a", "agent:main:b"]
        for key in keys:
            writer.create_session(key)
        lead = Lead(reader)

        def event(big: object = False) -> dict[str, object]:
            n = next(counter)
            return message_event(f"e{n} " + (long_text(1500, n) if big else "short"), event_id=f"id{n}")

        for op, which, amount, extra in ops:
            if op == "poll":
                lead.poll(max_rows=which)
                continue
            key = keys[which]
            sid = writer.current_session_id(key)
            assert sid is not None
            rows = len(writer.events(sid))
            if op == "append":
                writer.append(sid, *(event(extra) for _ in range(amount)))
            elif op == "rewrite" and rows > 1:
                start = max(1, rows - amount)
                writer.rewrite_suffix(sid, start, [event() for _ in range(int(str(extra)))])
            elif op == "replace":
                kept = [e.decode() for e in writer.events(sid)[: 1 + int(str(extra))]]
                writer.replace_session(sid, [*kept, *(event() for _ in range(amount))])
            elif op == "update" and rows > 1 and shape != "early":
                # an in-place edit keeps id and row count: only a rotated watermark can reveal it, so
                # the early layout (no watermarks) is not expected to see it
                seq = amount % rows or 1
                old = json.loads(writer.events(sid)[seq])
                writer.update_event(sid, seq, message_event("edited " + str(next(counter)), event_id=old["id"]))
            elif op == "reset":
                writer.reset(key)
        lead.drain(max_rows=3)
        assert lead.store == writer_truth(writer)


def test_a_fork_of_a_session_now_in_cold_storage_stores_the_copied_rows_once(tmp_path: Path) -> None:
    """The parent read, then forked, then moved to cold storage before the fork is read: its identities went with
    its rows (they cascade), so which rows the fork copied is read from the parent's archive."""
    path = make_db(tmp_path, "v24")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, AGENT) as reader:
        parent = writer.create_session("agent:main:main")
        writer.append(parent, message_event("The kayak is behind the boathouse.", event_id="q1", at_ms=1_000),
                      message_event("Behind the boathouse, noted.", "assistant", event_id="a1", at_ms=2_000))
        lead = Lead(reader)
        lead.drain()
        _, fork = writer.fork("agent:main:main", through_seq=2)
        writer.append(fork, message_event("In the fork: the kayak is blue.", event_id="f1"))
        writer.cold_archive(parent)
        assert not writer.conn.execute("SELECT 1 FROM transcript_event_identities WHERE session_id = ?",
                                       (parent,)).fetchall()
        lead.drain()
        stored = Counter(entry for _, entry in lead.store)
        assert {e: stored[e] for e in ("q1", "a1", "f1")} == {"q1": 1, "a1": 1, "f1": 1}, stored
