"""One index row per credential, whatever wrote it (several data dirs, backfills, restarts, two
daemons at once), and an index that never creates the agent's workspace: rows wait in the data dir."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from veritas_watch.config import Config, CredentialsConfig, PathsConfig
from veritas_watch.features.capture import CredentialCapture
from veritas_watch.features.credentials import (
    INDEX_FILE,
    STATE_FILE,
    CredentialIndex,
    IndexEntry,
    WorkspaceMissing,
    given_at,
    given_at_of,
    pending_counts,
    read_index,
)
from veritas_watch.model import RawRecord, SecretFinding, SessionState, SourceRef
from veritas_watch.pipeline import Found, transform_records
from veritas_watch.transforms.redact import redact, redact_with_matches

DEEPSEEK = "sk-3f9a1c2e8b7d6a5f4e3d2c1b0a9f8e7d"
DB_PASSWORD = "S3cr3tPassw0rd9"
PASSWORD_1 = "Tr0ub4dor&3horse-x"
PASSWORD_2 = "C0rrectH0rse-y9"
SESSION = "7d3c2a10-1111-4a4a-9b9b-0123456789ab"
# A transcript with six credentials: two OpenClaw masks (one `head…tail`, one `***`), a URL password,
# a key given twice on two lines, and two different passwords under one name in one message.
LINES = [
    {"type": "session", "version": 3, "id": SESSION, "timestamp": "2026-03-20T10:00:00.000Z"},
    {"type": "message", "id": "m1", "timestamp": "2026-03-20T10:00:01.000Z",
     "message": {"role": "user", "content": "OPENAI_API_KEY=sk-pro…HNzL and GITHUB_TOKEN=*** for the deploy"}},
    {"type": "message", "id": "m2", "timestamp": "2026-03-20T10:00:02.000Z",
     "message": {"role": "assistant", "content": [{"type": "text", "text": "Saved both."}]}},
    {"type": "message", "id": "m3", "timestamp": "2026-03-20T10:00:03.000Z",
     "message": {"role": "user", "content": f"the db is postgres://deploy:{DB_PASSWORD}@db.internal/app and my "
                                            f"deepseek key {DEEPSEEK}"}},
    {"type": "message", "id": "m4", "timestamp": "2026-03-20T10:00:04.000Z",
     "message": {"role": "user", "content": f"once more, the DeepSeek key: {DEEPSEEK}"}},
    {"type": "message", "id": "m5", "timestamp": "2026-03-20T10:00:05.000Z",
     "message": {"role": "user", "content": f"two hosts: PASSWORD={PASSWORD_1} and PASSWORD={PASSWORD_2}"}},
]
CREDENTIALS = 6


def transcript(state: Path, agent: str = "ops") -> Path:
    path = state / "agents" / agent / "sessions" / f"{SESSION}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in LINES))
    return path


def data_dir_config(state: Path, data: Path) -> tuple[Config, bytes]:
    """A data dir with its own random fingerprint key, as the daemon makes one."""
    data.mkdir(parents=True, exist_ok=True)
    key_file = data / "fingerprint.key"
    if not key_file.exists():
        key_file.write_text(os.urandom(32).hex())
    return Config(paths=PathsConfig(state_dir=str(state), data_dir=str(data)),
                  credentials=CredentialsConfig()), bytes.fromhex(key_file.read_text())


def backfill(state: Path, data: Path, path: Path, agent: str = "ops") -> CredentialCapture:
    """What one daemon's backfill does with the transcript: transform every line, capture the finds."""
    config, key = data_dir_config(state, data)
    capture = CredentialCapture(config)
    records = [RawRecord(agent, json.dumps(line, ensure_ascii=False).encode(), SourceRef("jsonl", str(path), line=n))
               for n, line in enumerate(LINES, 1)]
    out = transform_records(records, SessionState(None), fallback_session=SESSION, redact_key=key,
                            max_line_bytes=1 << 20, chunk_chars=2000, chunk_overlap=100)
    capture.capture(out.found)
    return capture


def index_rows(capture: CredentialCapture, agent: str = "ops") -> list[tuple[str, str, str]]:
    return [(r.key_name, r.location, r.status) for r in read_index(capture.workspace(agent) / INDEX_FILE)]


# ---------------------------------------------------------------------------------------------
# Where a credential was given


@pytest.mark.parametrize(("location", "key"), [
    (f"/s/agents/ops/sessions/{SESSION}.jsonl:12", f"jsonl:{SESSION}:12"),
    (f"/s/agents/ops/sessions/{SESSION}.jsonl.reset.2026-03-17T19-10-15.753Z:12", f"jsonl:{SESSION}:12"),
    (f"/s/agents/ops/sessions/{SESSION}.jsonl.deleted.2026-03-17T19:10:15Z:12", f"jsonl:{SESSION}:12"),
    (f"/home/me/My Files/{SESSION}.jsonl:3 (transcript holds only a mask); vault:/d/credentials.vault#3",
     f"jsonl:{SESSION}:3"),
    (f"`agents/ops/sessions/{SESSION}.jsonl:12`", f"jsonl:{SESSION}:12"),
    ("/s/agents/ops/agent/openclaw-agent.sqlite#f62b828c-090f:4", "sqlite:f62b828c-090f:4"),
    ("/s/openclaw-agent.sqlite#sess:4 (transcript holds only a mask); vault:/d/v#2", "sqlite:sess:4"),
    ("memory/add", None),
    ("~/.aws/credentials", None),
    ("1Password vault, item 'prod db'", None),
    ("vault:/d/credentials.vault#3", None),
    ("", None),
])
def test_given_at_parses_index_locations(location: str, key: str | None) -> None:
    assert given_at(location) == key


@pytest.mark.parametrize("ref", [
    SourceRef("jsonl", f"/s/agents/ops/sessions/{SESSION}.jsonl", line=7),
    SourceRef("jsonl", f"/s/agents/ops/sessions/{SESSION}-topic-42.jsonl.reset.2026-03-01T00-00-00.000Z", line=1),
    SourceRef("sqlite", "/s/agents/ops/agent/openclaw-agent.sqlite", session_id="abc-def", seq=0),
    SourceRef("api", "memory/add"),
])
def test_given_at_of_a_position_matches_its_rendered_location(ref: SourceRef) -> None:
    assert given_at_of(ref) == given_at(ref.render())


# ---------------------------------------------------------------------------------------------
# Several data dirs, backfills, restarts


def test_three_data_dirs_backfilling_one_transcript_write_one_row_per_credential(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = transcript(state)
    (state / "workspace-ops").mkdir()
    captures = [backfill(state, tmp_path / f"data{n}", path) for n in range(3)]
    rows = index_rows(captures[0])
    assert len(rows) == CREDENTIALS, rows
    assert sorted(k for k, _, _ in rows) == sorted(
        ["OPENAI_API_KEY", "GITHUB_TOKEN", "deploy@db.internal", "DEEPSEEK_API_KEY", "password", "password"])
    assert [s for k, _, s in rows if k in ("OPENAI_API_KEY", "GITHUB_TOKEN")] == ["masked", "masked"]
    assert captures[0].captured["ops"] == CREDENTIALS and captures[1].captured["ops"] == 0
    # the second and third data dirs learnt that their fingerprints stand for rows already there
    for n in (1, 2):
        aliases = json.loads((tmp_path / f"data{n}" / STATE_FILE).read_text())["aliases"]
        assert len(aliases[str(captures[n].workspace("ops"))]) >= 4
    # restarts and repeated backfills add nothing, in any data dir
    before = (state / "workspace-ops" / INDEX_FILE).read_bytes()
    for n in (2, 0, 1):
        backfill(state, tmp_path / f"data{n}", path)
    assert (state / "workspace-ops" / INDEX_FILE).read_bytes() == before


def test_a_value_repeated_later_is_no_new_row_in_a_second_data_dir(tmp_path: Path) -> None:
    """Data dir B meets line 4 (a key first given on line 3) with its own fingerprint: still one row."""
    state = tmp_path / "state"
    path = transcript(state)
    workspace = state / "workspace-ops"
    workspace.mkdir()
    backfill(state, tmp_path / "a", path)
    rows_a = read_index(workspace / INDEX_FILE)
    deepseek_rows = [r for r in rows_a if r.key_name == "DEEPSEEK_API_KEY"]
    assert len(deepseek_rows) == 1 and f"{SESSION}.jsonl:4" in deepseek_rows[0].location
    backfill(state, tmp_path / "b", path)
    assert read_index(workspace / INDEX_FILE) == rows_a


def test_distinct_credentials_with_one_name_in_one_message_keep_two_rows(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    location = f"/s/{SESSION}.jsonl:9"
    text = f"PASSWORD={PASSWORD_1} and PASSWORD={PASSWORD_2} and PASSWORD={PASSWORD_1}"
    for key in (b"k1" * 16, b"k2" * 16, b"k1" * 16):
        assert len(redact(text, key).findings) == 3
        CredentialIndex().record(workspace, redact(text, key).findings, location, "t", None)
    assert [r.key_name for r in read_index(workspace / INDEX_FILE)] == ["password", "password"]


def opaque_found(location: SourceRef, seen_at: str, key: bytes, text: str = "GITHUB_TOKEN=***") -> list[Found]:
    redacted, matches = redact_with_matches(text, key)
    return [Found("ops", SESSION, f, location, seen_at, None) for f, m in zip(redacted.findings, matches, strict=True)]


def test_opaque_masks_are_told_apart_by_place_and_time_not_fingerprint(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "workspace-ops").mkdir(parents=True)
    config, key = data_dir_config(state, tmp_path / "data")
    capture = CredentialCapture(config)
    line = f"/s/agents/ops/sessions/{SESSION}.jsonl"
    # two different `GITHUB_TOKEN=***` in two messages: the same fingerprint, two credentials
    capture.capture(opaque_found(SourceRef("jsonl", line, line=2), "2026-03-20T10:00:01.000Z", key))
    capture.capture(opaque_found(SourceRef("jsonl", line, line=8), "2026-03-20T11:00:00.000Z", key))
    # two in one message: two credentials
    capture.capture(opaque_found(SourceRef("jsonl", line, line=9), "2026-03-20T11:05:00.000Z", key,
                                 "GITHUB_TOKEN=*** and GITHUB_TOKEN=***"))
    # a group chat quoting the 11:00 message again on a later line: the same credential
    capture.capture(opaque_found(SourceRef("jsonl", line, line=12), "2026-03-20T11:00:00.000Z", key))
    rows = read_index(capture.workspace("ops") / INDEX_FILE)
    assert [r.location.split(".jsonl:")[1].split()[0] for r in rows] == ["2", "8", "9", "9"]
    assert len({r.fingerprint for r in rows}) == 1  # the fingerprint of `***` names no value
    # another data dir (another key) reading the same lines adds nothing
    other_config, other_key = data_dir_config(state, tmp_path / "other")
    other = CredentialCapture(other_config)
    for n, seen in ((2, "2026-03-20T10:00:01.000Z"), (8, "2026-03-20T11:00:00.000Z"), (12, "2026-03-20T11:00:00.000Z")):
        other.capture(opaque_found(SourceRef("jsonl", line, line=n), seen, other_key))
    other.capture(opaque_found(SourceRef("jsonl", line, line=9), "2026-03-20T11:05:00.000Z", other_key,
                               "GITHUB_TOKEN=*** and GITHUB_TOKEN=***"))
    assert read_index(capture.workspace("ops") / INDEX_FILE) == rows


def test_rows_written_by_hand_or_by_an_older_version_count(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / INDEX_FILE).write_text(
        "| Service | Key Name | Location | Status | First Seen | Fingerprint |\n|---|---|---|---|---|---|\n"
        f"| DeepSeek | DEEPSEEK_API_KEY | `agents/ops/sessions/{SESSION}.jsonl.reset.2026-03-21T00-00-00.000Z:4` "
        "| rotated | 2026-03-20 | 0badc0de |\n")
    finding = redact(f"key {DEEPSEEK}", b"x" * 32).findings[0]
    entry = IndexEntry(finding, f"/other/path/{SESSION}.jsonl:4", "2026-03-20T10:00:04.000Z")
    assert CredentialIndex().add(workspace, [entry]).added == 0
    assert CredentialIndex().add(workspace, [IndexEntry(finding, f"/p/{SESSION}.jsonl:5", "t")]).added == 1


def _backfill_in_process(state: str, data: str, path: str) -> None:
    backfill(Path(state), Path(data), Path(path))


def test_two_daemons_writing_one_index_at_once_duplicate_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = transcript(state)
    (state / "workspace-ops").mkdir()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_backfill_in_process, args=(str(state), str(tmp_path / f"d{n}"), str(path)))
             for n in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    rows = read_index(state / "workspace-ops" / INDEX_FILE)
    assert len(rows) == CREDENTIALS, [(r.key_name, r.location) for r in rows]


# ---------------------------------------------------------------------------------------------
# The workspace is OpenClaw's to create


def finding(n: int) -> SecretFinding:
    return SecretFinding("deepseek_api_key", "DeepSeek", "DEEPSEEK_API_KEY", f"{n:08x}", 0, 10)


def test_the_index_never_creates_a_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "not-yet" / "workspace"
    with pytest.raises(WorkspaceMissing):
        CredentialIndex().record(workspace, [finding(1)], "a.jsonl:1", "t", None)
    with pytest.raises(FileNotFoundError):  # WorkspaceMissing is one: old `except OSError` callers still cope
        CredentialIndex().add(workspace, [IndexEntry(finding(1), "a.jsonl:1", "t")])
    assert not (tmp_path / "not-yet").exists()
    assert CredentialIndex().add(workspace, []).added == 0  # nothing to add: no error either


def test_rows_wait_in_the_data_dir_until_the_workspace_appears(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = transcript(state)
    data = tmp_path / "data"
    capture = backfill(state, data, path)
    workspace = capture.workspace("ops")
    assert not workspace.exists() and not (state / "workspace-ops").exists()
    assert capture.pending_counts() == {"ops": CREDENTIALS} == pending_counts(data)
    (report,) = capture.pending_report()
    assert (report.agent_id, report.workspace, report.rows, report.workspace_exists) == (
        "ops", workspace, CREDENTIALS, False)
    state_file = data / STATE_FILE
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
    raw = state_file.read_text()
    assert not any(v in raw for v in (DEEPSEEK, DB_PASSWORD, PASSWORD_1, PASSWORD_2, "sk-pro", "HNzL"))
    assert capture.flush_pending() == 0 and not workspace.exists()
    # a restart, or another data dir, while it waits: nothing is lost, nothing doubles
    backfill(state, data, path)
    assert pending_counts(data) == {"ops": CREDENTIALS}
    workspace.mkdir()
    again = CredentialCapture(data_dir_config(state, data)[0])
    assert again.flush_pending() == CREDENTIALS
    assert pending_counts(data) == {} and again.flush_pending() == 0
    rows = read_index(workspace / INDEX_FILE)
    assert [r.key_name for r in rows][:2] == ["OPENAI_API_KEY", "GITHUB_TOKEN"]  # in the order they were given
    assert len(rows) == CREDENTIALS
    backfill(state, tmp_path / "other-data", path)
    assert len(read_index(workspace / INDEX_FILE)) == CREDENTIALS


def test_a_refused_write_keeps_its_rows_until_the_index_can_be_written(tmp_path: Path) -> None:
    """An index that links out of the workspace is never followed; the rows wait and are written once the
    link is gone (they were lost before)."""
    state = tmp_path / "state"
    config, key = data_dir_config(state, tmp_path / "data")
    capture = CredentialCapture(config)
    workspace = capture.workspace("ops")
    workspace.mkdir(parents=True)
    outside = tmp_path / "outside.md"
    outside.write_text("someone else's file\n")
    (workspace / INDEX_FILE).symlink_to(outside)
    redacted, _ = redact_with_matches(f"DEEPSEEK_API_KEY={DEEPSEEK}", key)
    ref = SourceRef("jsonl", f"/s/agents/ops/sessions/{SESSION}.jsonl", line=1)
    capture.capture([Found("ops", SESSION, f, ref, "2026-03-20T10:00:01.000Z") for f in redacted.findings])
    assert outside.read_text() == "someone else's file\n" and capture.pending_counts() == {"ops": 1}
    assert capture.flush_pending() == 0 and capture.pending_counts() == {"ops": 1}  # still refused
    (workspace / INDEX_FILE).unlink()
    assert capture.flush_pending() == 1 and capture.pending_counts() == {}
    assert [r.key_name for r in read_index(workspace / INDEX_FILE)] == ["DEEPSEEK_API_KEY"]


def test_a_new_finding_flushes_what_waited_first_and_other_agents_keep_waiting(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config, key = data_dir_config(state, tmp_path / "data")
    capture = CredentialCapture(config)

    def found(agent: str, text: str, line: int) -> list[Found]:
        redacted, _ = redact_with_matches(text, key)
        ref = SourceRef("jsonl", f"/s/agents/{agent}/sessions/{SESSION}.jsonl", line=line)
        return [Found(agent, SESSION, f, ref, f"2026-03-20T10:00:0{line}.000Z") for f in redacted.findings]

    capture.capture(found("ops", f"DEEPSEEK_API_KEY={DEEPSEEK}", 1))
    capture.capture(found("writer", f"DB_PASSWORD={PASSWORD_1}", 1))
    assert capture.pending_counts() == {"ops": 1, "writer": 1}
    capture.workspace("ops").mkdir(parents=True)
    capture.capture(found("ops", f"PASSWORD={PASSWORD_2}", 2))
    assert [r.key_name for r in read_index(capture.workspace("ops") / INDEX_FILE)] == ["DEEPSEEK_API_KEY", "password"]
    assert capture.pending_counts() == {"writer": 1}
    assert [(p.agent_id, p.workspace_exists) for p in capture.pending_report()] == [("writer", False)]


def test_an_unreadable_state_file_is_reported_not_fatal(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / STATE_FILE).write_text("{not json")
    assert pending_counts(data) == {}
    config, key = data_dir_config(tmp_path / "state", data)
    capture = CredentialCapture(config)
    redacted, _ = redact_with_matches(f"DEEPSEEK_API_KEY={DEEPSEEK}", key)
    capture.capture([Found("ops", SESSION, f, SourceRef("jsonl", "/s/x.jsonl", line=1), "t")
                     for f in redacted.findings])
    assert capture.pending_counts() == {"ops": 1}


def entries_for(findings: Sequence[SecretFinding], location: str) -> list[IndexEntry]:
    return [IndexEntry(f, location, "t") for f in findings]
