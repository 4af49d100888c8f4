"""The 25 scenarios a tailer must pass (../shared/notes/tailing-and-secrets.md), one named test each.

All on real files and the real daemon process (tests/daemon_harness.py), checked through
`/export` against a ledger of every entry fully written: no missing id, no extra id, same text.
Memory is append-only history: an entry that was written whole and seen stays stored even after
the file is truncated, rewritten or deleted.

Where each scenario lives:
  1 test_s01_plain_appends                      14 test_s14_inode_reuse_with_different_content
  2 test_s02_unterminated_line_held_back,       15 test_s15_two_files_same_first_line
    test_s02_unterminated_line_across_restart,  16 test_s16_empty_and_tiny_files
    test_openclaw_lazy_creation_half_flush      17 test_s17_atomic_replace_same_prefix,
  3 tests/test_crash.py::test_s03_sigkill_...      test_s17_atomic_replace_different_prefix
  4 test_s04_crash_while_writing_cursor_file    18 test_s18_inotify_overflow_rescan_catches_up
  5 test_s05_corrupt_cursor_file_policy         19 test_s19_inotify_limit_falls_back_to_polling
  6 test_s06_rename_while_writer_appends        20 test_s20_polling_only_same_results
  7 test_s07_several_renames_quickly            21 test_s21_moved_into_and_out_of_tree
  8 test_s08_rename_while_down                  22 test_s22_symlinks_not_followed_outside
  9 test_s09_truncation_in_place_running        23 test_s23_long_lines_bad_utf8_bad_json
 10 test_s10_truncation_while_down_smaller         (and tests/test_fuzz_lines.py)
 11 test_s11_truncation_rewrite_past_offset     24 tests/test_store_faults.py
 12 test_s12_delete_with_unread_data_drained    25 tests/test_tailer_stateful.py
 13 test_s13_delete_and_recreate_same_path
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import (
    DaemonClient,
    DaemonProcess,
    Ledger,
    append,
    assert_store_matches,
    complete_length,
    file_key,
    header,
    line,
    message,
    read_cursors,
    stored_entries,
    wait_for,
)

HEARTBEAT_PROMPT = ("Read HEARTBEAT.md if it exists (workspace context). Follow it strictly. Do not infer or repeat "
                    "old tasks from prior chats. If nothing needs attention, reply HEARTBEAT_OK.")


def fresh_id(raw: bytes) -> str:
    entry_id: str = json.loads(raw)["id"]
    return entry_id


def cursor_keys_under(client: DaemonClient, book: Ledger) -> set[str]:
    """Keys of the committed cursors of this agent's files (dropped files must not linger)."""
    return {key for key, c in client.cursors().items() if c.agent_id == book.agent}


def entry_of_length(book: Ledger, session: str, length: int, role: str = "user") -> bytes:
    """A new entry whose line is exactly `length` bytes long (so it can end where an old line ended)."""
    bare = book.entry(session, role=role, text="")
    entry_id = json.loads(bare)["id"]
    text = f"exact {entry_id} " + "x" * (length - len(bare) - len(f"exact {entry_id} "))
    book.expected[(session, entry_id)] = text
    sized = message(entry_id, role, text)
    assert len(sized) == length, (len(sized), length)
    return sized


def archive_name(path: Path, kind: str, n: int = 0) -> Path:
    """OpenClaw's archive name: `<id>.jsonl.<kind>.<ISO time with ':' as '-'>`."""
    return path.with_name(f"{path.name}.{kind}.2026-03-20T10-{30 + n:02d}-00.000Z")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon for the scenarios that happen while it runs; each test has its own agent."""
    root = tmp_path_factory.mktemp("live")
    daemon = DaemonProcess(root / "state", root / "data")
    (root / "state" / "agents").mkdir(parents=True)
    daemon.start()
    yield daemon
    daemon.stop()


# -- 1, 2: appends and unfinished lines -------------------------------------------------------------

def test_s01_plain_appends(live: DaemonProcess) -> None:
    book = Ledger(live.state_dir, "s01")
    path = book.path("plain")
    append(path, book.header("plain"))
    for n in range(24):
        append(path, book.entry("plain", role="user" if n % 2 == 0 else "assistant"))
        if n % 6 == 5:  # several lines in one write, too
            append(path, book.entry("plain") + book.entry("plain", role="assistant"))
    live.wait_idle()
    points = assert_store_matches(live, book)
    lines = path.read_bytes().splitlines()
    for point in points:  # each entry points at its own line
        source_path, number = point["payload"]["source"].rsplit(":", 1)
        assert source_path == str(path)
        assert json.loads(lines[int(number) - 1])["id"] == point["payload"]["entry_id"]


def test_s02_unterminated_line_held_back(live: DaemonProcess) -> None:
    book = Ledger(live.state_dir, "s02")
    path = book.path("partial")
    first = book.entry("partial")
    second = book.entry("partial", role="assistant")
    append(path, book.header("partial") + first + second[:25])
    live.wait_idle()  # an unfinished line is not backlog: the daemon is idle, waiting for its end
    assert set(stored_entries(live.export_http("s02"))) == {("partial", "partial-m1")}
    append(path, second[25:-1])  # everything but the newline: still unfinished
    live.wait_idle()
    assert set(stored_entries(live.export_http("s02"))) == {("partial", "partial-m1")}
    append(path, b"\n" + book.entry("partial"))
    live.wait_idle()
    assert_store_matches(live, book)


def test_openclaw_lazy_creation_half_flush(live: DaemonProcess) -> None:
    """OpenClaw creates the file at the first assistant message: header and buffered entries in one
    flush, which a reader can catch half written (here: cut inside the header itself)."""
    book = Ledger(live.state_dir, "lazy")
    path = book.path("lazy")
    flush = book.header("lazy") + book.entry("lazy") + book.entry("lazy", role="assistant")
    append(path, flush[:40])
    live.wait_idle()
    assert live.export_http("lazy") == []
    append(path, flush[40:])
    append(path, book.entry("lazy"))
    live.wait_idle()
    assert_store_matches(live, book)


# -- 6, 7: renames while running --------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["reset", "deleted"])
def test_s06_rename_while_writer_appends(live: DaemonProcess, kind: str) -> None:
    book = Ledger(live.state_dir, f"s06-{kind}")
    path = book.path("sess")
    with open(path, "ab", buffering=0) as writer:
        writer.write(book.header("sess") + book.entry("sess") + book.entry("sess", role="assistant"))
        live.wait_idle()
        archived = archive_name(path, kind)
        path.rename(archived)
        writer.write(book.entry("sess"))  # the writer still holds the renamed file
        writer.write(book.entry("sess", role="assistant"))
    live.wait_idle()
    points = assert_store_matches(live, book)
    late = {p["payload"]["entry_id"]: p["payload"]["source"] for p in points}
    assert late["sess-m3"].startswith(str(archived) + ":")
    assert not path.exists()


def test_s07_several_renames_quickly(live: DaemonProcess) -> None:
    book = Ledger(live.state_dir, "s07")
    path = book.path("hop")
    names = [archive_name(path, "reset", 1), path.with_name("hop.jsonl.bak.2026-03-20T10-31-00.000Z"),
             archive_name(path, "deleted", 2), archive_name(path, "reset", 3)]
    with open(path, "ab", buffering=0) as writer:
        writer.write(book.header("hop") + book.entry("hop"))
        live.wait_idle()
        current = path
        for name in names:  # one of them (.bak) is not a transcript name: gone for a moment
            current.rename(name)
            current = name
            writer.write(book.entry("hop"))
    live.wait_idle()
    assert_store_matches(live, book)
    assert file_key(current) in live.cursors()


# -- 9: truncation in place while running (heartbeat pruning) ----------------------------------------

def test_s09_truncation_in_place_running(live: DaemonProcess) -> None:
    book = Ledger(live.state_dir, "s09")
    path = book.path("hb")
    append(path, book.header("hb") + book.entry("hb", pad=40) + book.entry("hb", role="assistant", pad=40))
    live.wait_idle()
    assert path.stat().st_size > 1024  # so that below the head fingerprint never changes

    # A heartbeat turn, then pruned: the file shrinks back, no later append.
    before = path.stat().st_size
    append(path, message("hb-beat1", "user", HEARTBEAT_PROMPT) + message("hb-ok1", "assistant", "HEARTBEAT_OK"))
    live.wait_idle()
    os.truncate(path, before)
    live.wait_idle()
    assert_store_matches(live, book)
    assert live.cursors()[file_key(path)].offset == before

    # Pruned again, with an append right after the truncation.
    append(path, message("hb-beat2", "user", HEARTBEAT_PROMPT) + message("hb-ok2", "assistant", "HEARTBEAT_OK"))
    live.wait_idle()
    os.truncate(path, before)
    append(path, book.entry("hb"))
    live.wait_idle()
    assert_store_matches(live, book)

    # Pruned, and a message exactly as long as the pruned turn written in its place, before the
    # daemon looks (it is frozen): same size as before, same head, and the same last 32 bytes
    # (every message line ends in the same JSON), so only a check of the whole last line tells.
    before = path.stat().st_size
    append(path, message("hb-beat3", "user", HEARTBEAT_PROMPT) + message("hb-ok3", "assistant", "HEARTBEAT_OK"))
    live.wait_idle()
    pruned = path.stat().st_size - before
    live.pause()
    try:
        os.truncate(path, before)
        append(path, entry_of_length(book, "hb", pruned))
    finally:
        live.resume()
    live.wait_idle()
    assert_store_matches(live, book)
    assert path.read_bytes()[-32:] == message("hb-ok3", "assistant", "HEARTBEAT_OK")[-32:]

    # Pruned and grown past the old offset before the daemon looks.
    before = path.stat().st_size
    append(path, message("hb-beat4", "user", HEARTBEAT_PROMPT) + message("hb-ok4", "assistant", "HEARTBEAT_OK"))
    live.wait_idle()
    old_offset = path.stat().st_size
    live.pause()
    try:
        os.truncate(path, before)
        while path.stat().st_size <= old_offset:
            append(path, book.entry("hb", pad=8))
    finally:
        live.resume()
    live.wait_idle()
    assert_store_matches(live, book)
    assert any(e.get("path") == str(path) and e.get("reason") == "content_changed"
               for e in live.events("transcript_reread"))


# -- 12, 13: deletes ---------------------------------------------------------------------------------

def test_s12_delete_with_unread_data_drained(live: DaemonProcess) -> None:
    book = Ledger(live.state_dir, "s12")
    path = book.path("doomed")
    append(path, book.header("doomed") + book.entry("doomed"))
    live.wait_idle()
    live.pause()  # frozen: the new lines are unread when the file disappears
    try:
        append(path, book.entry("doomed", role="assistant") + book.entry("doomed"))
        path.unlink()
    finally:
        live.resume()
    live.wait_idle()
    assert_store_matches(live, book)
    gone = [e for e in live.events("transcript_gone") if e.get("path") == str(path)]
    assert len(gone) == 1 and gone[0]["deleted"] is True and gone[0]["unread"] > 0


def test_s13_delete_and_recreate_same_path(live: DaemonProcess) -> None:
    book = Ledger(live.state_dir, "s13")
    path = book.path("again")
    append(path, book.header("again") + book.entry("again") + book.entry("again", role="assistant"))
    live.wait_idle()
    path.unlink()
    append(path, book.header("again", ts="2026-03-21T09:00:00.000Z") + book.entry("again"))
    live.wait_idle()
    assert_store_matches(live, book)
    # And while the daemon is frozen holding the old file open: both contents arrive.
    live.pause()
    try:
        append(path, book.entry("again"))
        path.unlink()
        append(path, book.header("again", ts="2026-03-22T09:00:00.000Z") + book.entry("again", role="assistant"))
    finally:
        live.resume()
    live.wait_idle()
    assert_store_matches(live, book)
    assert cursor_keys_under(live, book) == {file_key(path)}


# -- 15, 16, 17: identity ----------------------------------------------------------------------------

def test_s15_two_files_same_first_line(live: DaemonProcess) -> None:
    """Same header and same first entry (a copied session), then different entries: both followed."""
    book = Ledger(live.state_dir, "s15")
    common = book.header("twin") + book.entry("twin") + book.entry("twin", role="assistant", pad=120)
    assert len(common) > 1024  # the head fingerprints are identical too
    first, second = book.sessions / "twin.jsonl", book.sessions / "twin.jsonl.reset.2026-03-20T10-00-00.000Z"
    append(first, common + book.entry("twin"))
    append(second, common + book.entry("twin", role="assistant"))
    live.wait_idle()
    append(first, book.entry("twin"))
    append(second, book.entry("twin"))
    live.wait_idle()
    assert_store_matches(live, book)
    cursors = live.cursors()
    for path in (first, second):
        assert cursors[file_key(path)].offset == path.stat().st_size


def test_s16_empty_and_tiny_files(live: DaemonProcess) -> None:
    book = Ledger(live.state_dir, "s16")
    empty, newline, head_only = book.path("empty"), book.path("newline"), book.path("head")
    empty.touch()
    newline.write_bytes(b"\n")
    head_only.write_bytes(book.header("head"))
    live.wait_idle()
    assert live.export_http("s16") == []
    append(empty, book.entry("empty", text="ok"))  # no header: the session is the file's name
    append(newline, book.entry("newline", text="y"))
    append(head_only, book.entry("head", role="assistant", text="k"))
    live.wait_idle()
    assert_store_matches(live, book)


@pytest.mark.parametrize("temp_suffix", [".manual-compaction-tmp", ".truncate-tmp"])
def test_s17_atomic_replace_same_prefix(live: DaemonProcess, temp_suffix: str) -> None:
    """Compaction: a temp file with the kept entries (same ids) renamed over the original."""
    agent = f"s17-same{temp_suffix.replace('.', '-')}"
    book = Ledger(live.state_dir, agent)
    path = book.path("comp")
    kept = [book.entry("comp"), book.entry("comp", role="assistant")]
    original = book.header("comp") + book.entry("comp") + book.entry("comp", role="assistant") + b"".join(kept)
    append(path, original)
    live.wait_idle()
    temp = path.with_name(path.name + temp_suffix)
    summary = line({"type": "compaction", "id": "comp-c1", "parentId": None, "timestamp": "2026-03-20T11:00:00.000Z",
                    "summary": "The user and the assistant discussed notes.", "firstKeptEntryId": "comp-m3"})
    fresh = book.entry("comp", expect=False)
    temp.write_bytes(book.header("comp") + summary + b"".join(kept) + fresh)
    live.wait_idle()
    assert_store_matches(live, book)  # the temp file is not a transcript: nothing from it yet
    temp.replace(path)
    book.release("comp", fresh_id(fresh))
    append(path, book.entry("comp", role="assistant"))
    live.wait_idle()
    assert_store_matches(live, book)
    assert cursor_keys_under(live, book) == {file_key(path)}


def test_s17_atomic_replace_different_prefix(live: DaemonProcess) -> None:
    book = Ledger(live.state_dir, "s17-diff")
    path = book.path("swap")
    append(path, book.header("swap") + book.entry("swap") + book.entry("swap", role="assistant"))
    live.wait_idle()
    temp = path.with_name(path.name + ".truncate-tmp")
    temp.write_bytes(book.header("swap", ts="2026-04-01T08:00:00.000Z") + book.entry("swap", pad=40)
                     + book.entry("swap"))
    temp.replace(path)
    live.wait_idle()
    assert_store_matches(live, book)


# -- 18: inotify overflow ------------------------------------------------------------------------------

def test_s18_inotify_overflow_rescan_catches_up(live: DaemonProcess) -> None:
    """More events than the kernel queue holds while the daemon is frozen: the queue overflows
    (watchdog drops that silently); the daemon says so once and a full sweep catches up."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 200_000:
        pytest.skip(f"max_queued_events={limit}: too many events to flood in a test")
    book = Ledger(live.state_dir, "s18")
    path = book.path("flood")
    append(path, book.header("flood") + book.entry("flood"))
    live.wait_idle()
    noise = [book.sessions / f"noise-{i}.lock" for i in range(2)]  # not transcripts
    live.pause()
    try:
        # Each open-write-close is 2 events (modify, close_write: the watch does not ask for opens); alternating
        # two files defeats the kernel's coalescing.
        for i in range(limit // 2 + 2000):
            with open(noise[i % 2], "ab") as handle:
                handle.write(b"x")
        append(path, book.entry("flood", role="assistant"))  # its events are lost: queue full
        append(book.path("late"), book.header("late") + book.entry("late"))
    finally:
        live.resume()
    live.wait_idle()
    assert_store_matches(live, book)
    # The overflow is the last of ~16k queued events: the sweep may have caught up before the watcher's
    # thread has read that far.
    wait_for(lambda: live.events("watch_overflow"), timeout=60, what="the overflow noticed")
    status = live.status()
    assert status["watcher"]["mode"] == "inotify"


# -- 21, 22: tree boundaries -------------------------------------------------------------------------

def test_s21_moved_into_and_out_of_tree(live: DaemonProcess, tmp_path: Path) -> None:
    book = Ledger(live.state_dir, "s21")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    incoming = outside / "incoming.jsonl"
    incoming.write_bytes(book.header("incoming") + book.entry("incoming") + book.entry("incoming"))
    incoming.rename(book.path("incoming"))  # moved in: read from 0
    live.wait_idle()
    assert_store_matches(live, book)

    leaving = book.path("leaving")
    append(leaving, book.header("leaving") + book.entry("leaving"))
    live.wait_idle()
    key = file_key(leaving)
    live.pause()
    try:
        append(leaving, book.entry("leaving", role="assistant"))  # unread when it leaves: drained
        leaving.rename(outside / "leaving.jsonl")
    finally:
        live.resume()
    live.wait_idle()
    assert_store_matches(live, book)
    append(outside / "leaving.jsonl", book.entry("leaving", expect=False))  # outside now: not ours
    live.wait_idle()
    assert_store_matches(live, book)
    assert key not in live.cursors()


def test_s22_symlinks_not_followed_outside(live: DaemonProcess, tmp_path: Path) -> None:
    book = Ledger(live.state_dir, "s22")
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "other.jsonl"
    secret.write_bytes(header("other") + message("x1", "user", "outside the state dir: never read"))
    link = book.sessions / "other.jsonl"
    link.symlink_to(secret)
    # A whole sessions dir that points outside.
    linked_agent = live.state_dir / "agents" / "s22-linked"
    linked_agent.mkdir()
    (outside / "sessions").mkdir()
    (outside / "sessions" / "far.jsonl").write_bytes(header("far") + message("f1", "user", "far away"))
    (linked_agent / "sessions").symlink_to(outside / "sessions")
    # A symlink inside the state dir to a transcript inside: read once, through the real file.
    real = book.path("real")
    append(real, book.header("real") + book.entry("real"))
    (book.sessions / "alias.jsonl").symlink_to(real)
    live.wait_idle()
    append(real, book.entry("real", role="assistant"))
    append(secret, message("x2", "assistant", "still outside"))
    live.wait_idle()
    live.wait_idle()  # several sweeps: the warning must not repeat
    assert_store_matches(live, book)
    assert live.export_http("s22-linked") == []
    warned = [e["path"] for e in live.events("symlink_outside_state_dir_ignored")]
    assert warned.count(str(link)) == 1
    assert warned.count(str(linked_agent / "sessions")) == 1


# -- 23: bad lines ---------------------------------------------------------------------------------

def test_s23_long_lines_bad_utf8_bad_json(live: DaemonProcess) -> None:
    book = Ledger(live.state_dir, "s23")
    path = book.path("mixed")
    big_valid = line({"type": "custom", "customType": "blob", "id": "blob1", "data": "z" * (2 * 1024 * 1024)})
    bad: list[tuple[bytes, str]] = [
        (b'{"type": "message", "id": "broken", "message": {"role": "user"' + b"\n", "invalid_json"),
        (b'{"type": "message", "id": "utf", "text": "\xff\xfe bad"}\n', "invalid_utf8"),
        (b"\x00" * 64 + b"\n", "invalid_json"),
        (b'{"type": "' + b"y" * (5 * 1024 * 1024) + b'"}\n', "line_too_long"),
        (b'{"type": "message", "message": "not an object"}\n', "wrong_field_type"),
    ]
    content = book.header("mixed")
    offsets: dict[int, tuple[int, str]] = {}  # line number -> (offset, reason)
    pieces: list[bytes | tuple[bytes, str]] = [
        book.entry("mixed"), bad[0], big_valid, book.entry("mixed", role="assistant"), bad[1], bad[2],
        book.entry("mixed"), bad[3], book.entry("mixed"), bad[4], book.entry("mixed", role="assistant")]
    for piece in pieces:
        if isinstance(piece, tuple):
            offsets[content.count(b"\n") + 1] = (len(content), piece[1])
            content += piece[0]
        else:
            content += piece
    append(path, content)
    live.wait_idle()
    points = assert_store_matches(live, book)
    numbers = content.splitlines()
    for point in points:  # line numbers stay right around the bad lines
        number = int(point["payload"]["source"].rsplit(":", 1)[1])
        assert json.loads(numbers[number - 1])["id"] == point["payload"]["entry_id"]
    logged = {e["line"]: (e["offset"], e["reason"]) for e in live.events("line_invalid") if e["file"] == str(path)}
    assert logged == offsets
    assert live.cursors()[file_key(path)].offset == len(content)


# -- 2, 8, 10, 11, 14: while the daemon is down --------------------------------------------------------

@dataclass
class DownScenario:
    """Set up while the daemon runs, change things while it is stopped, then check after restart."""

    agent: str
    before: Callable[[Ledger], None]
    while_down: Callable[[Ledger, Path], None]
    checks: list[Callable[[DaemonProcess, Ledger], None]] = field(default_factory=list)


def _partial_before(book: Ledger) -> None:
    whole = book.entry("cut", expect=False)  # cut-m1: half written now, finished while down
    append(book.path("cut"), book.header("cut") + book.entry("cut") + whole[:30])
    book.notes["tail"] = whole[30:]


def _partial_down(book: Ledger, data_dir: Path) -> None:
    append(book.path("cut"), book.notes["tail"])
    book.release("cut", "cut-m1")


def _rename_before(book: Ledger) -> None:
    append(book.path("old"), book.header("old") + book.entry("old") + book.entry("old", role="assistant"))


def _rename_down(book: Ledger, data_dir: Path) -> None:
    archived = archive_name(book.path("old"), "reset")
    book.path("old").rename(archived)
    append(archived, book.entry("old"))


def _truncate_smaller_before(book: Ledger) -> None:
    path = book.path("shrink")
    append(path, book.header("shrink") + book.entry("shrink"))
    book.notes["cut"] = path.stat().st_size
    append(path, b"".join(book.entry("shrink", pad=5) for _ in range(5)))


def _truncate_smaller_down(book: Ledger, data_dir: Path) -> None:
    path = book.path("shrink")
    old = path.stat().st_size
    os.truncate(path, book.notes["cut"])
    append(path, book.entry("shrink"))
    assert path.stat().st_size < old


def _rewrite_before(book: Ledger) -> None:
    path = book.path("regrow")
    append(path, book.header("regrow") + b"".join(book.entry("regrow", pad=30) for _ in range(3)))
    assert path.stat().st_size > 1024
    book.notes["cut"] = path.stat().st_size
    append(path, book.entry("regrow") + book.entry("regrow", role="assistant"))


def _rewrite_down(book: Ledger, data_dir: Path) -> None:
    """Same first 1024+ bytes, then other lines, one ending exactly at the old offset, and longer
    than before: neither the size nor the head nor the last 32 bytes tell; the last line does."""
    path = book.path("regrow")
    old = path.stat().st_size
    os.truncate(path, book.notes["cut"])
    append(path, book.entry("regrow", pad=3))
    append(path, entry_of_length(book, "regrow", old - path.stat().st_size))
    assert path.stat().st_size == old
    append(path, book.entry("regrow", pad=3))


def _reuse_before(book: Ledger) -> None:
    append(book.path("reuse"), book.header("reuse") + book.entry("reuse") + book.entry("reuse"))


def _reuse_down(book: Ledger, data_dir: Path) -> None:
    """A new file with the old file's inode: for real when the filesystem reuses it, else the
    cursor store is given exactly the state inode reuse produces (the old cursor under the new key)."""
    path = book.path("reuse")
    old_key = file_key(path)
    path.unlink()
    content = book.header("reuse", ts="2026-05-01T00:00:00.000Z") + book.entry("reuse", pad=12) + book.entry("reuse")
    for attempt in range(64):
        candidate = book.sessions / f".probe-{attempt}"
        candidate.write_bytes(content)
        if file_key(candidate) == old_key:
            candidate.rename(path)
            break
        candidate.unlink()
    else:
        path.write_bytes(content)
        db = sqlite3.connect(data_dir / "cursors.sqlite")
        (state,) = db.execute("SELECT state FROM file_cursors WHERE key = ?", (old_key,)).fetchone()
        moved = json.loads(state) | {"key": file_key(path)}
        with db:
            db.execute("DELETE FROM file_cursors WHERE key = ?", (old_key,))
            db.execute("INSERT INTO file_cursors (key, state) VALUES (?, ?)", (file_key(path), json.dumps(moved)))
        db.close()
    book.notes["key"] = file_key(path)


DOWN_SCENARIOS = {
    "s02-down": DownScenario("s02-down", _partial_before, _partial_down),
    "s08": DownScenario("s08", _rename_before, _rename_down),
    "s10": DownScenario("s10", _truncate_smaller_before, _truncate_smaller_down),
    "s11": DownScenario("s11", _rewrite_before, _rewrite_down),
    "s14": DownScenario("s14", _reuse_before, _reuse_down),
}


@pytest.fixture(scope="module")
def down_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, dict[str, Ledger]]]:
    root = tmp_path_factory.mktemp("down")
    daemon = DaemonProcess(root / "state", root / "data")
    books = {name: Ledger(daemon.state_dir, s.agent) for name, s in DOWN_SCENARIOS.items()}
    daemon.start()
    for name, scenario in DOWN_SCENARIOS.items():
        scenario.before(books[name])
    daemon.wait_idle()
    for book in books.values():
        assert_store_matches(daemon, book)  # the half line of s02 is not among them yet
    daemon.stop()
    for name, scenario in DOWN_SCENARIOS.items():
        scenario.while_down(books[name], daemon.data_dir)
    daemon.start()
    daemon.wait_idle()
    yield daemon, books
    daemon.stop()


def test_s02_unterminated_line_across_restart(down_world: tuple[DaemonProcess, dict[str, Ledger]]) -> None:
    daemon, books = down_world
    assert_store_matches(daemon, books["s02-down"])


def test_s08_rename_while_down(down_world: tuple[DaemonProcess, dict[str, Ledger]]) -> None:
    daemon, books = down_world
    assert_store_matches(daemon, books["s08"])
    renamed = [e for e in daemon.events("transcript_reread") if "old.jsonl" in e.get("path", "")]
    assert not renamed, "a rename while down must not cost a re-read"


def test_s10_truncation_while_down_smaller(down_world: tuple[DaemonProcess, dict[str, Ledger]]) -> None:
    daemon, books = down_world
    assert_store_matches(daemon, books["s10"])
    path = books["s10"].path("shrink")
    assert daemon.cursors()[file_key(path)].offset == path.stat().st_size


def test_s11_truncation_rewrite_past_offset(down_world: tuple[DaemonProcess, dict[str, Ledger]]) -> None:
    daemon, books = down_world
    assert_store_matches(daemon, books["s11"])
    path = books["s11"].path("regrow")
    reasons = {e["reason"] for e in daemon.events("transcript_reread") if e.get("path") == str(path)}
    assert reasons == {"content_changed"}


def test_s14_inode_reuse_with_different_content(down_world: tuple[DaemonProcess, dict[str, Ledger]]) -> None:
    daemon, books = down_world
    assert_store_matches(daemon, books["s14"])
    path = books["s14"].path("reuse")
    assert daemon.cursors()[books["s14"].notes["key"]].offset == path.stat().st_size
    assert any(e.get("path") == str(path) for e in daemon.events("transcript_reread"))


# -- 4, 5: the cursor file ---------------------------------------------------------------------------

def _fresh(tmp_path: Path, **kwargs: Any) -> DaemonProcess:
    (tmp_path / "state" / "agents").mkdir(parents=True, exist_ok=True)
    return DaemonProcess(tmp_path / "state", tmp_path / "data", **kwargs)


def test_s04_crash_while_writing_cursor_file(tmp_path: Path) -> None:
    daemon = _fresh(tmp_path)
    book = Ledger(daemon.state_dir, "s04")
    path = book.path("c")
    daemon.start()
    append(path, book.header("c") + book.entry("c") + book.entry("c"))
    daemon.wait_idle()
    daemon.kill()  # SIGKILL: the WAL is left behind, with our commits in it
    wal = daemon.data_dir / "cursors.sqlite-wal"
    assert wal.exists() and wal.stat().st_size > 0
    with open(wal, "ab") as handle:  # a frame torn half way: what a crash inside a write leaves
        handle.write(os.urandom(2100))
    daemon.start()
    append(path, book.entry("c"))
    daemon.wait_idle()
    assert_store_matches(daemon, book)
    assert not daemon.events("cursor_store_corrupt")
    assert daemon.status()["entries"]["unchanged"] == 0  # the committed cursor survived: no re-read
    daemon.stop()

    # A half-written cursor file (the second half of its pages missing).
    db_file = daemon.data_dir / "cursors.sqlite"
    os.truncate(db_file, db_file.stat().st_size // 2)
    daemon.start()
    append(path, book.entry("c"))
    daemon.wait_idle()
    assert_store_matches(daemon, book)
    corrupt = daemon.events("cursor_store_corrupt")
    assert len(corrupt) == 1 and "re-read" in corrupt[0]["policy"]
    assert Path(corrupt[0]["moved_to"]).exists()
    daemon.stop()


def test_s05_corrupt_cursor_file_policy(tmp_path: Path) -> None:
    daemon = _fresh(tmp_path)
    book = Ledger(daemon.state_dir, "s05")
    daemon.start()
    append(book.path("a"), book.header("a") + book.entry("a") + book.entry("a", role="assistant"))
    append(book.path("b"), book.header("b") + book.entry("b"))
    daemon.wait_idle()
    daemon.stop()

    db_file = daemon.data_dir / "cursors.sqlite"
    db_file.write_bytes(b"this is not a database" * 100)  # garbage: the whole store is re-read
    daemon.start()
    daemon.wait_idle()
    assert_store_matches(daemon, book)
    assert len(daemon.events("cursor_store_corrupt")) == 1
    entries = daemon.status()["entries"]
    assert entries["stored"] == 0 and entries["unchanged"] == 3  # re-read, and nothing embedded again
    daemon.stop()

    # One bad row: that file alone is re-read from 0.
    db = sqlite3.connect(db_file)
    with db:
        db.execute("UPDATE file_cursors SET state = ? WHERE key = ?",
                   (json.dumps({"key": file_key(book.path("a")), "offset": "lots"}), file_key(book.path("a"))))
    db.close()
    daemon.start()
    append(book.path("b"), book.entry("b"))
    daemon.wait_idle()
    assert_store_matches(daemon, book)
    bad = daemon.events("cursor_corrupt")
    assert [e["key"] for e in bad] == [file_key(book.path("a"))]
    entries = daemon.status()["entries"]
    assert entries["stored"] == 1 and entries["unchanged"] == 2
    daemon.stop()


# -- 19, 20: inotify limits and polling --------------------------------------------------------------

def _userns_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-U", "-r", "sh", "-c", "echo 1 > /proc/sys/user/max_inotify_instances"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.parametrize(("limit", "value"), [
    ("max_inotify_instances", 0),  # inotify_init fails: EMFILE
    ("max_inotify_watches", 0),  # the first watch fails: ENOSPC
    ("max_inotify_watches", 2),  # the top directories are watched, their subdirectories silently not
])
def test_s19_inotify_limit_falls_back_to_polling(tmp_path: Path, limit: str, value: int) -> None:
    """The daemon runs in its own user namespace whose inotify limit is lowered: the kernel refuses
    for real (EMFILE for instances; ENOSPC for watches, which watchdog swallows for subdirectories)."""
    if not _userns_available():
        pytest.skip("user namespaces (unshare -U) are not available here")
    wrapper = ["unshare", "-U", "-r", "sh", "-c", f'echo {value} > /proc/sys/user/{limit} && exec "$@"', "sh"]
    daemon = _fresh(tmp_path, wrapper=wrapper)
    book = Ledger(daemon.state_dir, "s19")
    append(book.path("p"), book.header("p") + book.entry("p"))
    daemon.start()
    try:
        wait_for(lambda: daemon.events("watcher_fallback_polling"), timeout=30, what="fallback warning")
        append(book.path("p"), book.entry("p", role="assistant"))
        append(book.path("q"), book.header("q") + book.entry("q"))
        daemon.wait_idle()
        assert_store_matches(daemon, book)
        fallbacks = daemon.events("watcher_fallback_polling")
        assert len(fallbacks) == 1 and fallbacks[0]["level"] == "warning"
        status = json.loads(daemon.cli("status", "--json").stdout)
        assert status["watcher"]["mode"] == "polling"
        assert status["watcher"]["fallback_reason"] == fallbacks[0]["reason"]
    finally:
        daemon.stop()


def _mixed_script(client: DaemonClient, book: Ledger) -> None:
    """Appends, an unfinished line, a rename under a writer, a prune, a compaction, a delete."""
    path = book.path("mix")
    with open(path, "ab", buffering=0) as writer:
        writer.write(book.header("mix") + book.entry("mix"))
        tail = book.entry("mix", role="assistant")
        writer.write(tail[:20])
        client.wait_idle()
        writer.write(tail[20:])
        archived = archive_name(path, "reset")
        path.rename(archived)
        writer.write(book.entry("mix"))
    client.wait_idle()
    size = archived.stat().st_size
    append(archived, message("beat", "user", HEARTBEAT_PROMPT) + message("beat-ok", "assistant", "HEARTBEAT_OK"))
    client.wait_idle()
    os.truncate(archived, size)
    live_path = book.path("mix2")
    append(live_path, book.header("mix2") + book.entry("mix2") + book.entry("mix2"))
    client.wait_idle()
    temp = live_path.with_name(live_path.name + ".manual-compaction-tmp")
    temp.write_bytes(book.header("mix2") + book.entry("mix2"))
    temp.replace(live_path)
    append(live_path, book.entry("mix2"))
    client.wait_idle()
    archived.unlink()
    client.wait_idle()


def test_s20_polling_only_same_results(live: DaemonProcess, tmp_path: Path) -> None:
    polling = _fresh(tmp_path, config={"watch": {"force_polling": True, "poll_interval": 0.5}})
    polled = Ledger(polling.state_dir, "s20")
    watched = Ledger(live.state_dir, "s20")
    polling.start()
    try:
        assert polling.status()["watcher"]["mode"] == "polling"
        _mixed_script(polling, polled)
        _mixed_script(live, watched)
        by_polling = assert_store_matches(polling, polled)
        by_inotify = assert_store_matches(live, watched)

        def comparable(points: list[dict[str, Any]], state: Path) -> list[tuple[str, str]]:
            return sorted((p["id"], json.dumps(p["payload"] | {"source": p["payload"]["source"].replace(
                str(state), "")}, sort_keys=True)) for p in points)

        assert comparable(by_polling, polling.state_dir) == comparable(by_inotify, live.state_dir)
    finally:
        polling.stop()


def test_harness_idle_barrier_sees_unread_lines(live: DaemonProcess) -> None:
    """The barrier the other tests rely on: a frozen daemon is not idle, a thawed one becomes idle."""
    book = Ledger(live.state_dir, "barrier")
    path = book.path("b")
    live.pause()
    try:
        append(path, book.header("b") + book.entry("b"))
        assert complete_length(path) == path.stat().st_size
        with pytest.raises(AssertionError):
            live.wait_idle(timeout=1.5)
    finally:
        live.resume()
    live.wait_idle()
    assert_store_matches(live, book)
    assert read_cursors(live.data_dir)[file_key(path)].offset == path.stat().st_size


# -- the tailer's handle budget (many archived sessions, a low RLIMIT_NOFILE) ---------------------------

def test_idle_handles_closed_and_reopened_without_losing_identity(tmp_path: Path) -> None:
    """Past `max_open_files`, fully read files lose their handle; a change reopens them (same inode
    checked), a rename is still followed, and a delete is still noticed."""
    from veritas_watch.openclaw import AgentDirs
    from veritas_watch.sources.jsonl import JsonlTailer

    sessions = tmp_path / "agents" / "a" / "sessions"
    sessions.mkdir(parents=True)
    agents = [AgentDirs("a", sessions, tmp_path / "agents" / "a" / "agent" / "x.sqlite")]
    for i in range(8):
        (sessions / f"f{i}.jsonl").write_bytes(header(f"f{i}") + message(f"m{i}", "user", f"text {i}"))
    tailer = JsonlTailer(tmp_path, {}, max_line_bytes=1 << 20, read_chunk_bytes=1 << 16, max_open_files=3)

    def pump() -> list[tuple[str, int]]:
        read = []
        for tracked in tailer.sweep(agents).changed:
            while (unit := tailer.read(tracked)) is not None:
                read += [(Path(r.source.path).name, r.source.line or 0) for r in unit.records]
                tailer.mark_committed(unit)
        return read

    try:
        assert len(pump()) == 16
        pump()
        assert sum(t.fd is not None for t in tailer.files.values()) == 3
        closed = next(t for t in tailer.files.values() if t.fd is None)
        name = Path(closed.read.path)
        append(name, message("late", "assistant", "appended to a closed file"))
        assert pump() == [(name.name, 3)]
        renamed = name.with_name(name.name + ".reset.2026-03-20T10-00-00.000Z")
        name.rename(renamed)
        append(renamed, message("later", "user", "after the rename"))
        assert pump() == [(renamed.name, 4)]
        victim = next(t for t in tailer.files.values() if t.fd is None)
        key = victim.key
        Path(victim.read.path).unlink()
        dropped = tailer.sweep(agents).dropped + tailer.sweep(agents).dropped
        assert key in dropped and key not in tailer.files
    finally:
        tailer.close()
