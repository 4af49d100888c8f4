"""SQLite reader cost: initial read rate, a poll with nothing new (slow and fast path), one append.

    .venv/bin/python bench/sqlite_reader.py [--sizes 100x1000,1000x100,1000x1000]

Databases are built with the real schema-23 DDL (tests/sqlite_fixture.py) in a temp dir.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.sqlite_fixture import (
    create_database,
    js_stringify,
    message_event,
    register_octet_length,
    session_header,
)
from veritas_watch.sources.sqlite import SessionCursor, SqliteTranscriptReader


def build(path: Path, sessions: int, per_session: int) -> None:
    create_database(path, "v23")
    conn = sqlite3.connect(path, isolation_level=None)
    register_octet_length(conn)
    conn.execute("BEGIN")
    now = int(time.time() * 1000)
    for s in range(sessions):
        sid, key = str(uuid.UUID(int=s)), f"agent:main:k{s}"
        conn.execute("INSERT INTO session_nodes (session_key, current_session_id, entry_json, updated_at) "
                     "VALUES (?,?,?,?)", (key, sid, "{}", now))
        conn.execute("INSERT INTO session_windows (session_id, session_key, created_at, updated_at) VALUES (?,?,?,?)",
                     (sid, key, now, now))
        conn.execute("INSERT INTO transcript_rewrite_watermarks VALUES (?,?,?)", (sid, "g0", now))
        rows = [(sid, 0, js_stringify(session_header(sid)), now)]
        rows += [(sid, i, js_stringify(message_event(f"msg {i} " + "x" * 200, event_id=f"{s}-{i}")), now)
                 for i in range(1, per_session)]
        conn.executemany("INSERT INTO transcript_events (session_id, seq, event_json, created_at) VALUES (?,?,?,?)",
                         rows)
    conn.execute("COMMIT")
    conn.close()


def measure(path: Path, sessions: int, per: int) -> str:
    reader = SqliteTranscriptReader(path, "main")
    cursors: dict[str, SessionCursor] = {}
    started, rows = time.perf_counter(), 0
    while True:
        result = reader.poll(cursors, max_rows=5000)
        for batch in result.batches:
            rows += len(batch.records)
            if batch.cursor is not None:
                cursors[batch.session_id] = batch.cursor
        if not result.has_more:
            break
    initial = time.perf_counter() - started
    writer = sqlite3.connect(path, isolation_level=None)
    register_octet_length(writer)
    slow = []
    for _ in range(5):  # a foreign commit that adds no rows: the full check runs and finds nothing
        writer.execute("UPDATE schema_meta SET updated_at = updated_at + 1")
        started = time.perf_counter()
        assert not reader.poll(cursors).batches
        slow.append(time.perf_counter() - started)
    started = time.perf_counter()
    assert reader.poll(cursors).unchanged
    fast = time.perf_counter() - started
    sid = next(iter(cursors))
    writer.execute("INSERT INTO transcript_events (session_id, seq, event_json, created_at) VALUES (?,?,?,?)",
                   (sid, per, js_stringify(message_event("new", event_id="new")), 0))
    started = time.perf_counter()
    reader.poll(cursors)
    one = time.perf_counter() - started
    writer.close()
    reader.close()
    return (f"| {sessions} x {per} | {rows / initial:,.0f} rows/s | {1000 * sorted(slow)[2]:.1f} ms | "
            f"{1000 * fast:.2f} ms | {1000 * one:.1f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100x1000,1000x100,1000x1000", help="sessions x rows, comma-separated")
    args = parser.parse_args()
    print("| sessions x rows | initial read | poll, nothing new | unchanged fast path | poll after one append |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            sessions, per = (int(x) for x in size.split("x"))
            path = Path(tmp) / f"db-{sessions}-{per}.sqlite"
            build(path, sessions, per)
            print(measure(path, sessions, per), flush=True)


if __name__ == "__main__":
    main()
