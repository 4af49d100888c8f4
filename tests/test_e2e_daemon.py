"""End to end, on real parts: the daemon process, real transcripts, inotify, the model, Qdrant Edge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.daemon_harness import (
    FIXTURE_SESSIONS,
    DaemonProcess,
    copy_fixture_sessions,
    header,
    message,
    read_cursors,
    running_daemon,
    wait_for,
)

pytestmark = [pytest.mark.long,
              pytest.mark.skipif(not FIXTURE_SESSIONS.is_dir(), reason="../shared fixtures not present")]

NOISE_MARKERS = ("Sender (untrusted metadata)", "[[reply_to", "⟦openclaw:ctx⟧", "[message_id:",
                 "A new session was started via /new or /reset", "Read HEARTBEAT.md")


def texts_of(points: list[dict]) -> list[str]:
    return [p["payload"]["data"] for p in points]


def entry_keys(points: list[dict]) -> Counter[tuple[str, str, str | None, str | None, int]]:
    """One point per entry and chunk; a group chat's quoted messages share their carrying entry's id,
    each is told apart by its speaker and own time."""
    return Counter((p["payload"]["session_id"], p["payload"]["entry_id"], p["payload"].get("speaker"),
                    p["payload"]["timestamp"] if "speaker" in p["payload"] else None, p["payload"]["chunk"])
                   for p in points)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_live_ingestion_end_to_end(tmp_path: Path) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    sessions = copy_fixture_sessions(state)
    with running_daemon(state, data) as daemon:
        daemon.wait_idle()
        initial = daemon.export()
        assert initial, "the real transcripts produced no memory"
        assert max(entry_keys(initial).values()) == 1
        for text in texts_of(initial):
            assert text.strip() not in ("HEARTBEAT_OK", "NO_REPLY")
            for marker in NOISE_MARKERS:
                assert marker not in text, (marker, text[:200])

        # A new session, created lazily with a half-written first flush.
        live = sessions / "e2e-session.jsonl"
        first = header("e2e-session") + message("u1", "user", "Please remember the blue heron nests by the old mill")
        append(live, first[:-20])
        append(live, first[-20:] + message("a1", "assistant", "Noted: the blue heron nests by the old mill.")[:30])
        wait_for(lambda: daemon.search("main", "blue heron old mill"), what="first entry searchable")
        hits = [h for h in daemon.search("main", "blue heron old mill") if h["session_id"] == "e2e-session"]
        assert {h["entry_id"] for h in hits} == {"u1"}  # the half line waits
        append(live, message("a1", "assistant", "Noted: the blue heron nests by the old mill.")[30:])
        wait_for(lambda: {h["entry_id"] for h in daemon.search("main", "blue heron old mill")
                          if h["session_id"] == "e2e-session"} == {"u1", "a1"}, what="completed half line")

        # Metadata-wrapped user message: stored without its metadata block.
        wrapped = ("Sender (untrusted metadata):\n```json\n{\"label\": \"Alice\", \"id\": \"42\"}\n```\n\n"
                   "What is the tallest mountain in Hokkaido?")
        append(live, message("u2", "user", wrapped))
        hit = wait_for(lambda: [h for h in daemon.search("main", "tallest mountain Hokkaido") if h["entry_id"] == "u2"],
                       what="wrapped message")
        assert hit[0]["text"] == "What is the tallest mountain in Hokkaido?"

        # Heartbeat turn appended, then pruned in place (the file shrinks), then a real message.
        size_before = live.stat().st_size
        append(live, message("hb1", "user", "Read HEARTBEAT.md if it exists (workspace context). Follow it strictly. "
                                            "Do not infer or repeat old tasks from prior chats. If nothing needs "
                                            "attention, reply HEARTBEAT_OK."))
        append(live, message("hb2", "assistant", "HEARTBEAT_OK"))
        daemon.wait_idle()
        os.truncate(live, size_before)
        append(live, message("u3", "user", "The ferry to Rebun leaves at seven fifteen"))
        wait_for(lambda: [h for h in daemon.search("main", "ferry Rebun seven") if h["entry_id"] == "u3"],
                 what="entry after truncation")

        # Reset: the live file is renamed while the writer keeps appending through its handle.
        with open(live, "ab") as writer:
            archived = sessions / "e2e-session.jsonl.reset.2026-03-20T10-30-00.000Z"
            live.rename(archived)
            writer.write(message("a3", "assistant", "Rebun ferry at 07:15, got it."))
        wait_for(lambda: [h for h in daemon.search("main", "Rebun ferry 07:15") if h["entry_id"] == "a3"],
                 what="append after rename")

        # A cron session is skipped whole.
        cron = sessions / "cron-run.jsonl"
        append(cron, header("cron-run") + message("c1", "user", "[cron:job-1 nightly] Summarise the zebra migration")
               + message("c2", "assistant", "The zebra migration summary is ready."))
        daemon.wait_idle()
        assert not [h for h in daemon.search("main", "zebra migration summary") if h["session_id"] == "cron-run"]

        points = daemon.export()
        keys = entry_keys(points)
        assert max(keys.values()) == 1
        mine = {k[1] for k in keys if k[0] == "e2e-session"}
        assert mine == {"u1", "a1", "u2", "u3", "a3"}
        assert not any(k[0] == "cron-run" for k in keys)

    # Restart: nothing is stored twice, nothing is re-embedded.
    with running_daemon(state, data) as daemon:
        daemon.wait_idle()
        after = daemon.export()
        assert sorted(json.dumps(p, sort_keys=True) for p in after) == sorted(
            json.dumps(p, sort_keys=True) for p in points)
        assert daemon.get("/status")["entries"]["stored"] == 0


def test_zero_config_exits_cleanly_on_sigterm_and_backfill_is_idempotent(tmp_path: Path) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    copy_fixture_sessions(state, agent="ops")
    backfill = DaemonProcess(state, data).start("backfill")
    assert backfill.proc is not None
    assert backfill.proc.wait(timeout=600) == 0
    first = backfill.export(agent="ops")
    assert first
    again = DaemonProcess(state, data).start("backfill")
    assert again.proc is not None and again.proc.wait(timeout=600) == 0
    assert sorted(p["id"] for p in again.export(agent="ops")) == sorted(p["id"] for p in first)
    stored_events = [e for e in again.log_events() if e.get("event") == "daemon_stopped"]
    assert stored_events and stored_events[-1]["stored"] == 0


def test_an_interrupted_backfill_says_so_and_the_next_one_finishes_the_pass(tmp_path: Path) -> None:
    """A backfill stopped by SIGTERM exits 1 with `backfill_interrupted` (it exited 0, as if the pass were
    done); while it runs, `status` says who holds the store at once (it waited, "daemon starting", for the
    whole backfill); the next backfill stores the rest; a mistyped state dir is an error, not an empty pass."""
    state, data = tmp_path / "state", tmp_path / "data"
    sessions = state / "agents" / "ops" / "sessions"
    sessions.mkdir(parents=True)
    for n in range(60):
        (sessions / f"s-{n}.jsonl").write_bytes(header(f"s-{n}") + b"".join(
            message(f"m{k}", "user" if k % 2 == 0 else "assistant", f"Session {n}, note {k}: item {n * 10 + k}.")
            for k in range(10)))
    backfill = DaemonProcess(state, data).start("backfill")
    assert backfill.proc is not None
    wait_for(lambda: read_cursors(data), timeout=120, what="the backfill storing")
    started = time.monotonic()
    busy = subprocess.run([sys.executable, "-m", "veritas_watch.cli", "status"], env=backfill.env,
                          capture_output=True, text=True, timeout=60)
    if backfill.proc.poll() is None:  # still running (a fast machine may have finished the pass)
        assert busy.returncode == 4 and "in use by `veritas-watch backfill`" in busy.stderr, busy.stderr
        assert time.monotonic() - started < 30
        backfill.proc.send_signal(signal.SIGTERM)
        assert backfill.proc.wait(timeout=120) == 1
        (line,) = backfill.events("backfill_interrupted")
        assert line["stored"] < 600
        # `status` on the stopped data dir counts the files the backfill never reached, as backlog
        ops = json.loads(backfill.cli("status", "--json").stdout)["agents"]["ops"]
        assert ops["files"] == 60 and ops["lag_bytes"] > 0, ops
    again = DaemonProcess(state, data).start("backfill")
    assert again.proc is not None and again.proc.wait(timeout=600) == 0
    assert len(again.export(agent="ops")) == 600
    ops = json.loads(again.cli("status", "--json").stdout)["agents"]["ops"]
    assert (ops["files"], ops["lag_bytes"], ops["entries_stored"]) == (60, 0, 600), ops
    missing = subprocess.run([sys.executable, "-m", "veritas_watch.cli", "backfill"], capture_output=True, text=True,
                             timeout=120, env={**backfill.env, "OPENCLAW_STATE_DIR": str(tmp_path / "typo")})
    assert missing.returncode == 1 and "typo does not exist" in missing.stderr, missing.stderr
