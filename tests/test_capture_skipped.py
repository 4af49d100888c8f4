"""Credentials in lines that are not memory: captured into the agent's index, never stored or logged.

A sub-agent's brief (`sessions_spawn`), a cron job's prompt, another agent's message, a command's arguments: denoise
skips each as not memory, and the key in it still reaches credential capture, with the row pointing at that line.
A key the index already has from the parent's message is no second row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from veritas_watch.config import Config, CredentialsConfig, PathsConfig
from veritas_watch.features.capture import CredentialCapture
from veritas_watch.features.credentials import INDEX_FILE, read_index
from veritas_watch.model import ParsedLine, RawRecord, SessionState, SourceRef
from veritas_watch.pipeline import Transformed, transform_records
from veritas_watch.transforms.denoise import capture_text, clean_message
from veritas_watch.transforms.parse import parse_line

KEY = b"k" * 32
DEEPSEEK = "sk-3f9a1c2e8b7d6a5f4e3d2c1b0a9f8e7d"
PARENT = "0a1b2c3d-1111-4a4a-9b9b-0123456789ab"
CHILD = "0a1b2c3d-2222-4a4a-9b9b-0123456789ab"
DB = "/s/agents/ops/agent/openclaw-agent.sqlite"
# The brief OpenClaw 2026.9.6 writes as a sub-agent's first message (seen on the real gateway).
BRIEF = ("[Subagent Context] You are running as a subagent (depth 1/5). Complete the current [Subagent Task]; "
         "inherited conversation is background context, not your assignment.\n\n[Subagent Task]\n\n"
         f"Deploy the site with the DeepSeek key {DEEPSEEK} to staging\n\n"
         "Begin. Execute the assigned task to completion.")


def message(role: str, text: str, n: int, **fields: Any) -> dict[str, Any]:
    content: Any = text if role == "user" else [{"type": "text", "text": text}]
    return {"type": "message", "id": f"e{n}", "timestamp": f"2026-03-20T10:00:{n:02d}.000Z",
            "message": {"role": role, "content": content, **fields}}


def transform(session: str, lines: Sequence[dict[str, Any]]) -> Transformed:
    records = [RawRecord("ops", json.dumps(line).encode(), SourceRef("sqlite", DB, session_id=session, seq=n))
               for n, line in enumerate(lines)]
    return transform_records(records, SessionState(session), fallback_session=session, redact_key=KEY,
                             max_line_bytes=1 << 20, chunk_chars=2000, chunk_overlap=100)


def capture_for(tmp_path: Path) -> CredentialCapture:
    state, data = tmp_path / "state", tmp_path / "data"
    (state / "workspace-ops").mkdir(parents=True)
    data.mkdir()
    return CredentialCapture(Config(paths=PathsConfig(state_dir=str(state), data_dir=str(data)),
                                    credentials=CredentialsConfig()), redact_key=KEY)


def rows(capture: CredentialCapture) -> list[tuple[str, str]]:
    return [(r.key_name, r.location) for r in read_index(capture.workspace("ops") / INDEX_FILE)]


CHILD_LINES = [message("user", BRIEF, 0), message("assistant", "Deployed to staging.", 1)]


def test_a_subagent_brief_key_is_indexed_at_the_childs_line_and_never_stored(tmp_path: Path) -> None:
    out = transform(CHILD, CHILD_LINES)
    assert out.chunks == []  # a sub-agent session is not memory
    assert out.skipped["subagent_session"] == 2
    assert [(f.finding.key_name, f.location.session_id, f.location.seq) for f in out.found] == [
        ("DEEPSEEK_API_KEY", CHILD, 0)]
    assert DEEPSEEK not in repr(out)  # the value is not kept without a vault
    capture = capture_for(tmp_path)
    capture.capture(out.found)
    assert rows(capture) == [("DEEPSEEK_API_KEY", f"{DB}#{CHILD}:0")]
    assert DEEPSEEK not in (capture.workspace("ops") / INDEX_FILE).read_text()


def test_a_key_indexed_from_the_parents_message_is_no_second_row(tmp_path: Path) -> None:
    parent = transform(PARENT, [message("user", f"Deploy it with the DeepSeek key {DEEPSEEK}", 0),
                                message("assistant", "A helper is deploying it.", 1)])
    capture = capture_for(tmp_path)
    capture.capture(parent.found)
    capture.capture(transform(CHILD, CHILD_LINES).found)
    assert rows(capture) == [("DEEPSEEK_API_KEY", f"{DB}#{PARENT}:0")]


GIVEN_ELSEWHERE = [
    pytest.param(message("user", f"[cron:8f2d Nightly sync] Sync with the DeepSeek key {DEEPSEEK}", 0),
                 "cron_session", id="cron job prompt"),
    pytest.param(message("user", f"/config set models.providers.deepseek.apiKey {DEEPSEEK}", 0), "slash_command",
                 id="command argument"),
    pytest.param(message("user", f"Main asks: use the DeepSeek key {DEEPSEEK}", 0,
                         provenance={"kind": "inter_session", "sourceTool": "sessions_send"}),
                 "agent_to_agent", id="another agent's message"),
]


@pytest.mark.parametrize(("line", "reason"), GIVEN_ELSEWHERE)
def test_keys_in_other_lines_that_are_not_memory_are_indexed(line: dict[str, Any], reason: str) -> None:
    out = transform(CHILD, [line])
    assert out.chunks == [] and out.skipped[reason] == 1
    assert [f.finding.key_name for f in out.found] == ["DEEPSEEK_API_KEY"]


def test_a_delivery_mirror_is_a_copy_and_not_read_again() -> None:
    mirror = message("assistant", f"Your key {DEEPSEEK} is set.", 0, provider="openclaw", model="delivery-mirror")
    line = parse_line(json.dumps(mirror).encode())
    assert isinstance(line, ParsedLine) and capture_text(line, clean_message(line)) is None
    out = transform(PARENT, [message("user", "Hello", 1), mirror])
    assert out.skipped["delivery_mirror"] == 1 and out.found == []


def test_a_hook_emails_tokens_are_not_taken_for_credentials() -> None:
    """A webhook's email (a cron run, wrapped as external content): its unsubscribe token is third-party text."""
    email = ("Job ID: 5c1e | Received: 2026-03-20 10:00 UTC\n\nSECURITY NOTICE: The following content is from an "
             "EXTERNAL, UNTRUSTED source (e.g., email, webhook).\n<<<EXTERNAL_UNTRUSTED_CONTENT id=\"a1\">>>\n"
             "Weekly digest. Unsubscribe: https://news.example.com/u?token=a8f3k2j9d8s7f6g5h4j3k2l1\n"
             "<<<END_EXTERNAL_UNTRUSTED_CONTENT id=\"a1\">>>")
    out = transform(CHILD, [message("user", email, 0), message("user", f"{email}\nUse the DeepSeek key {DEEPSEEK}", 1)])
    assert out.chunks == [] and [f.finding.key_name for f in out.found] == ["DEEPSEEK_API_KEY"]


def test_a_group_members_key_quoted_by_a_command_is_one_credential(tmp_path: Path) -> None:
    """A `/status` in a group chat carries the members' messages since the agent's last reply: each member's message
    is read as an entry of its own, the command's line for its own text only (a `***` mask read twice would be two
    rows: an opaque mask is told apart by place and time alone)."""
    history = json.dumps([{"sender": "Bo", "timestamp_ms": 1773000000000, "body": "deploy GITHUB_TOKEN=*** today"}])
    text = f"Chat history since last reply (untrusted, for context):\n```json\n{history}\n```\n\n/status"
    out = transform(PARENT, [message("user", text, 0)])
    assert out.skipped["slash_command"] == 1 and len(out.chunks) == 1
    assert [(f.finding.key_name, f.finding.masked) for f in out.found] == [("GITHUB_TOKEN", "opaque")]
    capture = capture_for(tmp_path)
    capture.capture(out.found)
    assert rows(capture) == [("GITHUB_TOKEN", f"{DB}#{PARENT}:0 (transcript holds only a mask)")]


def test_a_steered_key_is_redacted_and_indexed() -> None:
    out = transform(PARENT, [message("user", f"/steer use the DeepSeek key {DEEPSEEK} instead", 0)])
    texts = [c.text for c in out.chunks]
    assert len(texts) == 1 and texts[0].startswith("use the DeepSeek key ") and DEEPSEEK not in texts[0]
    assert [f.finding.key_name for f in out.found] == ["DEEPSEEK_API_KEY"]
