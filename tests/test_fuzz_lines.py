"""Malformed transcript lines (scenario 23, at scale): the daemon neither crashes nor stalls, logs
each bad line once with its file, line, offset and reason, stores every good line, and keeps
its offsets right.

Two levels:
- the real daemon, fed thousands of bad lines of every kind mixed with good ones, written in
  random pieces while it runs (so it sees half lines, and 10 MB lines arriving over time);
- the tailer alone, under hypothesis: any byte stream split into any writes yields every line
  exactly once, with the right line number and offset, over-long lines reported instead.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.daemon_harness import DaemonProcess, Ledger, assert_store_matches, file_key
from veritas_watch.openclaw import AgentDirs
from veritas_watch.sources.jsonl import JsonlTailer

BAD_LINES = 3000
GOOD_LINES = 240
HUGE = 10 * 1024 * 1024


def bad_line(rng: random.Random, kind: str) -> tuple[bytes, str]:
    """One malformed line (without its newline) and the reason the daemon must give for it."""
    junk = "".join(rng.choice("abc{}[]:,\"' 019\\") for _ in range(rng.randint(1, 60)))
    if kind == "invalid_json":
        options = [b'{"type": "message", "id": "x' + junk.encode(),  # cut short
                   b'{"type": "message",, "id": 1}', b"{" + junk.encode() + b"{", b"not json at all " + junk.encode(),
                   b'{"type": "message", "message": {"role": "user", "content": "\x00 raw NUL"}}',
                   b"\x00" * rng.randint(1, 300)]
        return rng.choice(options), "invalid_json"
    if kind == "invalid_utf8":
        bad = bytes([rng.choice([0x80, 0xC0, 0xE0, 0xF8, 0xFF]), rng.randint(0x20, 0x7E)])
        return b'{"type": "message", "id": "u", "note": "' + bad + junk.replace('"', "").encode() + b'"}', \
            "invalid_utf8"
    if kind == "wrong_field_type":
        shapes: list[dict[str, object]] = [
            {"type": rng.randint(0, 9)}, {"type": "message", "message": [junk]},
            {"type": "message", "message": {"role": 5, "content": "hi"}},
            {"type": "message", "message": {"role": "user", "content": rng.randint(0, 9)}}]
        return json.dumps(rng.choice(shapes)).encode(), "wrong_field_type"
    if kind == "too_deep":
        depth = rng.randint(3000, 60000)
        if rng.random() < 0.5:
            return b"[" * depth + b"]" * depth, "too_deep"
        return (b'{"type": "message", "message": {"role": "user", "content": ' + b"[" * depth + b"]" * depth
                + b"}}"), "too_deep"
    if kind == "not_an_object":
        return rng.choice([b"[1, 2, 3]", b'"just a string"', b"42", b"null", b"true"]), "not_an_object"
    if kind == "missing_type":
        return json.dumps({"id": junk, "message": {"role": "user", "content": "x"}}).encode(), "missing_type"
    if kind == "empty_line":
        return rng.choice([b"", b"   ", b"\t", b"\r"]), "empty_line"
    raise ValueError(kind)


KINDS = ("invalid_json", "invalid_utf8", "wrong_field_type", "too_deep", "not_an_object", "missing_type",
         "empty_line")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "state" / "agents").mkdir(parents=True)
    process = DaemonProcess(root / "state", root / "data")
    process.start()
    yield process
    process.stop()


def test_thousands_of_malformed_lines(daemon: DaemonProcess) -> None:
    rng = random.Random(23)
    book = Ledger(daemon.state_dir, "fuzz")
    files = [book.path(f"f{i}") for i in range(3)]
    streams: dict[Path, bytearray] = {path: bytearray(book.header(path.stem)) for path in files}
    expected_invalid: dict[tuple[str, int], tuple[int, str]] = {}
    plan = ["good"] * GOOD_LINES + [rng.choice(KINDS) for _ in range(BAD_LINES)] + ["huge"] * 3
    rng.shuffle(plan)
    for kind in plan:
        path = rng.choice(files)
        stream = streams[path]
        if kind == "good":
            stream += book.entry(path.stem, role=rng.choice(["user", "assistant"]))
            continue
        if kind == "huge":
            data, reason = b'{"type": "message", "pad": "' + b"q" * HUGE + b'"}', "line_too_long"
        else:
            data, reason = bad_line(rng, kind)
        expected_invalid[(str(path), stream.count(b"\n") + 1)] = (len(stream), reason)
        stream += data + b"\n"

    # Written in random pieces, interleaved across the files, while the daemon reads.
    written = dict.fromkeys(files, 0)
    handles = {path: open(path, "ab", buffering=0) for path in files}  # noqa: SIM115 - closed below
    try:
        while any(written[p] < len(streams[p]) for p in files):
            path = rng.choice([p for p in files if written[p] < len(streams[p])])
            size = rng.choice([1, 7, 100, 4096, 65536, 1 << 20])
            piece = bytes(streams[path][written[path]:written[path] + size])
            handles[path].write(piece)
            written[path] += len(piece)
            if rng.random() < 0.02:
                time.sleep(0.01)  # let the daemon catch the files mid-line
    finally:
        for handle in handles.values():
            handle.close()
    daemon.wait_idle(timeout=300)

    assert daemon.running
    assert_store_matches(daemon, book)
    logged = [e for e in daemon.events("line_invalid") if e["file"] in {str(p) for p in files}]
    counts = Counter((e["file"], e["line"]) for e in logged)
    assert max(counts.values()) == 1, "a bad line was logged more than once"
    assert {(e["file"], e["line"]): (e["offset"], e["reason"]) for e in logged} == expected_invalid
    cursors = daemon.cursors()
    for path in files:
        cursor = cursors[file_key(path)]
        assert cursor.offset == len(streams[path])
        assert cursor.line == streams[path].count(b"\n")
    assert daemon.status()["entries"]["invalid_lines"] >= len(expected_invalid)


# -- the tailer alone, under hypothesis ---------------------------------------------------------------

MAX_LINE = 6000  # small limits, so that lines longer than a read chunk and than the limit are common
CHUNK = 4096


def _lines() -> st.SearchStrategy[list[bytes]]:
    short = st.binary(max_size=80).map(lambda b: b.replace(b"\n", b" "))
    long = st.integers(min_value=CHUNK - 10, max_value=MAX_LINE * 3).map(lambda n: b"L" * n)
    return st.lists(st.one_of(short, short, short, long), min_size=1, max_size=25)


def _drain(tailer: JsonlTailer, agents: list[AgentDirs]) -> list[tuple[str, int, int, int]]:
    """Sweep and read until nothing moves: (what, line, offset, length) for every line seen."""
    seen: list[tuple[str, int, int, int]] = []
    for _ in range(50):
        changed = tailer.sweep(agents).changed
        progressed = False
        for tracked in changed:
            while (unit := tailer.read(tracked)) is not None:
                progressed = True
                for record in unit.records:
                    assert record.source.line is not None and record.source.offset is not None
                    seen.append(("line", record.source.line, record.source.offset, len(record.data)))
                for ref in unit.too_long:
                    assert ref.line is not None and ref.offset is not None
                    seen.append(("too_long", ref.line, ref.offset, -1))
                tailer.mark_committed(unit)
        if not progressed:
            return seen
    raise AssertionError("the tailer kept finding work")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(lines=_lines(), cuts=st.lists(st.integers(min_value=0, max_value=10**6), max_size=12),
       finish=st.booleans())
def test_tailer_reads_every_line_once_at_the_right_offset(tmp_path: Path, lines: list[bytes], cuts: list[int],
                                                          finish: bool) -> None:
    sessions = tmp_path / f"case-{time.monotonic_ns()}" / "agents" / "a" / "sessions"
    sessions.mkdir(parents=True)
    state = sessions.parents[2]
    agents = [AgentDirs("a", sessions, state / "agents" / "a" / "agent" / "x.sqlite")]
    stream = b"\n".join(lines) + (b"\n" if finish else b"")
    path = sessions / "t.jsonl"
    path.touch()
    tailer = JsonlTailer(state, {}, max_line_bytes=MAX_LINE, read_chunk_bytes=CHUNK)
    seen: list[tuple[str, int, int, int]] = []
    try:
        points = sorted({c % (len(stream) + 1) for c in cuts} | {len(stream)})
        start = 0
        with open(path, "ab", buffering=0) as handle:
            for point in points:  # every write boundary may fall inside a line
                handle.write(stream[start:point])
                start = point
                seen += _drain(tailer, agents)
    finally:
        tailer.close()
    expected = []
    offset = 0
    complete = lines if finish else lines[:-1]
    for number, data in enumerate(complete, start=1):
        expected.append(("too_long", number, offset, -1) if len(data) > MAX_LINE else
                        ("line", number, offset, len(data)))
        offset += len(data) + 1
    assert seen == expected
    os.unlink(path)
