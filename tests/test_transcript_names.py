"""Which files in an agent's `sessions/` are transcripts to index (names as OpenClaw writes them)."""

from __future__ import annotations

import pytest

from veritas_watch.openclaw import classify_transcript

SID = "1b09d548-ba39-486a-9491-8f77e12bebe0"


@pytest.mark.parametrize(("name", "kind"), [
    (f"{SID}.jsonl", "live"),
    (f"{SID}-topic-42.jsonl", "live"),
    (f"{SID}.jsonl.reset.2026-03-17T19-10-15.753Z", "reset"),
    (f"{SID}.jsonl.deleted.2026-03-17T19-10-15.753Z", "deleted"),
])
def test_transcripts(name: str, kind: str) -> None:
    found = classify_transcript(name)
    assert found is not None and found.kind == kind


@pytest.mark.parametrize("name", [
    # 2026.9.6 `sessions delete`: a zstd archive, and the staging file it is written through (seen live).
    f"{SID}.jsonl.deleted.2026-12-01T15-51-25.713Z.a6f8df46da134fd4bcd3d8978ba6a77e.zst",
    f"{SID}.jsonl.deleted.2026-12-01T15-51-25.713Z.a6f8df46da134fd4bcd3d8978ba6a77e.zst."
    "0ba277d1-f99f-4091-b1dc-b518569f67c7.stage",
    # and the uncompressed one before it (caught once by a CI run's sweep: it was taken for a `.deleted` archive)
    f"{SID}.jsonl.deleted.2026-12-04T02-32-42.990Z.d555b42e7e694d8594e5e2a2882a7d42."
    "dfe2c95b-cf45-4c70-a564-1f3dafc24baa.jsonl-stage",
    f"{SID}.jsonl.bak.2026-03-17T19-10-15.753Z",
    f"{SID}.checkpoint.0ba277d1.jsonl",
    f"{SID}.trajectory.jsonl",
    f"{SID}.jsonl.lock",
    f"{SID}.jsonl.manual-compaction-tmp",
    "sessions.json",
    ".hidden.jsonl",
])
def test_not_transcripts(name: str) -> None:
    assert classify_transcript(name) is None
