"""OpenClaw's own masks (`sk-pro…HNzL`, `***`): recognised and replaced whole, indexed as masked,
and (with a vault only) the value found again in OpenClaw's `task_runs`, read-only.

The pairs below are what OpenClaw 2026.9.6 itself writes to a transcript for each input: produced
by its `redactTranscriptMessage` (dist/transcript-redact-*.mjs over dist/redact-*.mjs, `maskToken`).
`test_live_openclaw_agrees` regenerates them from the npm package when it is installed.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyrage
import pytest
from structlog.testing import capture_logs

from tests.openclaw_harness import install_or_skip
from veritas_watch.config import Config, CredentialsConfig, PathsConfig
from veritas_watch.features.capture import MASK_NOTE, CredentialCapture
from veritas_watch.features.credentials import (
    INDEX_FILE,
    OPENCLAW_STATE_DB,
    MaskProbe,
    Recovery,
    TaskRunValues,
    pending_counts,
    read_index,
)
from veritas_watch.model import RawRecord, SessionState, SourceRef
from veritas_watch.pipeline import Found, transform_records
from veritas_watch.transforms.redact import (
    detect,
    is_masked_rule,
    masked_fingerprint,
    openclaw_mask,
    recover_unmasked,
    redact,
    redact_with_matches,
    split_mask,
)
from veritas_watch.transforms.redact.masks import _MAX_MASK_ATOMS

KEY = b"test-fingerprint-key-0123456789ab"
OPENAI = "sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL"
GITHUB = "ghp_Tj7Kx2Lm9Qp4Rs6Vw8Yz1Ab3Cd5Ef0GhQjwR"
DB_PASSWORD = "S3cr3tPassw0rd9"

OPENCLAW_MASKED: list[tuple[str, str]] = [
    ("OPENAI_API_KEY=sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL", "OPENAI_API_KEY=sk-pro…HNzL"),
    (
        "export OPENAI_API_KEY=\"sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL\"",
        "export OPENAI_API_KEY=\"sk-pro…HNzL\"",
    ),
    ("OPENAI_API_KEY='sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL'", "OPENAI_API_KEY='sk-pro…HNzL'"),
    ("DEEPSEEK_API_KEY: abcdef0123456789abcdef0123456789", "DEEPSEEK_API_KEY: abcdef…6789"),
    ("GITHUB_TOKEN=short12", "GITHUB_TOKEN=***"),
    ("DB_PASSWORD=Tr0ub4dor&3horse", "DB_PASSWORD=***"),
    ("DB_PASSWORD=Tr0ub4dor&3horse-battery-staple", "DB_PASSWORD=Tr0ub4…aple"),
    ("MY_SECRET=abc", "MY_SECRET=***"),
    ("api_key=abcdefghijklmnopqrstuv", "api_key=***"),
    ("token=abcdefghijklmnopqrstuv&user=bob", "token=***&user=bob"),
    ("password=hunter2 user=bob", "password=*** user=bob"),
    ("password: correcthorsebatterystaple", "password: correc…aple"),
    ("password = correcthorsebatterystaple", "password = correc…aple"),
    ("db.password=correcthorsebatterystaple", "db.password=correc…aple"),
    ("smtp_password: correcthorsebatterystaple", "smtp_password: correc…aple"),
    ("{\"apiKey\": \"sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL\"}", "{\"apiKey\": \"***\"}"),
    (
        "{\"password\":\"correcthorsebatterystaple\",\"user\":\"bob\"}",
        "{\"password\":\"correc…aple\",\"user\":\"bob\"}",
    ),
    ("{\"token\": \"abc\"}", "{\"token\": \"***\"}"),
    ("{\"client_secret\": \"abcdefghijklmnopqrstuvwxyz\"}", "{\"client_secret\": \"***\"}"),
    ("client_secret: 'abcdefghijklmnopqrstuvwxyz'", "client_secret: 'abcdef…wxyz'"),
    (
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",  # noqa: E501
        "Authorization: Bearer eyJhbG…sR8U",
    ),
    ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123", "Authorization: Bearer abcdef…0123"),
    ("Authorization: Bearer shorttoken12", "Authorization: Bearer ***"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZDEyMzQ1Njc4", "Authorization: Basic dXNlcj…Njc4"),
    ("Authorization: Token abcdefghijklmnopqrstuvwxyz0123", "Authorization: Token abcdef…0123"),
    (
        "curl -H 'Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123' https://api.example.com",
        "curl -H 'Authorization: Bearer abcdef…0123' https://api.example.com",
    ),
    ("x-api-key: abcdefghijklmnopqrstuvwxyz0123", "x-api-key: abcdef…0123"),
    ("X-Api-Key: abcdefghijklmnopqrstuvwxyz0123", "X-Api-Key: abcdef…0123"),
    ("X-Auth-Token: shortone", "X-Auth-Token: ***"),
    ("bearer abcdefghijklmnopqrstuvwxyz0123 is the token", "bearer abcdef…0123 is the token"),
    ("--api-key abcdefghijklmnopqrstuvwxyz0123", "--api-key abcdef…0123"),
    ("--password=hunter2hunter2", "--password=***"),
    ("--token \"abcdefghijklmnopqrstuvwxyz0123\"", "--token \"abcdef…0123\""),
    ("mysql://root:Sup3rS3cretRootPassw0rd@db.local/app", "mysql://root:Sup3rS…w0rd@db.local/app"),
    ("postgres://deploy:S3cr3tPassw0rd9@db.internal:5432/app", "postgres://deploy:***@db.internal:5432/app"),
    ("postgresql://u:p@h/db", "postgresql://u:***@h/db"),
    (
        "mongodb+srv://admin:MongoPass123456789012@cluster0.mongodb.net/x",
        "mongodb+srv://admin:MongoP…9012@cluster0.mongodb.net/x",
    ),
    ("redis://:RedisPassw0rdLongEnough1@cache:6379", "redis://:RedisP…ugh1@cache:6379"),
    ("https://user:pw12345678901234567890@host.com/x", "https://user:pw1234…7890@host.com/x"),
    ("https://user:short@host.com/x", "https://user:***@host.com/x"),
    ("ftp://anon:ftpPassword1234567890@ftp.example.com", "ftp://anon:ftpPas…7890@ftp.example.com"),
    ("https://api.x.com/v1?api_key=abcdefghijklmnopqrstuv&x=1", "https://api.x.com/v1?api_key=abcdef…stuv&x=1"),
    ("https://api.x.com/v1?token=short&x=1", "https://api.x.com/v1?token=***&x=1"),
    ("https://api.x.com/cb?code=abcdefghijklmnopqrstuv", "https://api.x.com/cb?code=abcdef…stuv"),
    ("my github token ghp_Tj7Kx2Lm9Qp4Rs6Vw8Yz1Ab3Cd5Ef0GhQjwR ok", "my github token ghp_Tj…QjwR ok"),
    ("ghp_Tj7Kx2Lm9Q", "***"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVW", "github…TUVW"),
    ("xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "xoxb-1…UvWx"),
    ("AKIAIOSFODNN7EXAMPLE", "AKIAIO…MPLE"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_access_key = wJalrX…EKEY"),
    ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrX…EKEY"),
    ("AIzaSyA1234567890abcdefghijklmnopqrstuv", "AIzaSy…stuv"),
    ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJ-abcdefAA", "sk-ant…efAA"),
    ("sk_live_abcdefghijklmnopqrstuvwxyz", "sk_liv…wxyz"),
    ("hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "hf_abc…EFGH"),
    ("bot123456789:ABCdefGHIjklMNOpqrSTUvwxYZ012345", "bot123456…2345"),
    ("123456789:ABCdefGHIjklMNOpqrSTUvwxYZ012345", "123456…2345"),
    ("npm_abcdefghijklmnopqrstuvwxyz0123456789", "npm_ab…6789"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "eyJhbG…sR8U"),
    ("sk-abc12345", "***"),
    ("abcd-efgh-ijkl-mnop", "abcd-e…mnop"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAabcdefghijklmnop\nqrstuvwxyz0123456789abcdefghij\n-----END RSA PRIVATE KEY-----",  # noqa: E501
        "-----BEGIN RSA PRIVATE KEY-----\n…redacted…\n-----END RSA PRIVATE KEY-----",
    ),
    (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----",  # noqa: E501
        "-----BEGIN OPENSSH PRIVATE KEY-----\n…redacted…\n-----END OPENSSH PRIVATE KEY-----",
    ),
    ("API_KEY=${API_KEY:-defaultvalue123}", "API_KEY=***"),
    ("API_KEY=$API_KEY", "API_KEY=$API_KEY"),
    ("TOKEN=sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL", "TOKEN=***"),
    ("the key is sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL", "the key is sk-pro…HNzL"),
    (
        "grant_type=password&username=bob&password=hunter2&client_secret=abcdefghijklmnop",
        "grant_type=password&username=bob&password=***&client_secret=***",
    ),
    ("body: password=hunter2", "body: password=***"),
    ("cookie: session=abcdefghijklmnopqrstuvwxyz0123", "cookie: session=abcdefghijklmnopqrstuvwxyz0123"),
    ("set-cookie: sid=abcdefghijklmnopqrstuvwxyz; Path=/", "set-cookie: sid=abcdefghijklmnopqrstuvwxyz; Path=/"),
    ("card_number=4242424242424242", "card_number=***"),
    (
        "OPENAI_API_KEY=sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL GITHUB_TOKEN=ghp_Tj7Kx2Lm9Qp4Rs6Vw8Yz1Ab3Cd5Ef0GhQjwR",  # noqa: E501
        "OPENAI_API_KEY=sk-pro…HNzL GITHUB_TOKEN=ghp_Tj…QjwR",
    ),
    ("密码是 Hunter2Pony", "密码是 Hunter2Pony"),
    ("API_KEY=密钥密钥密钥密钥密钥密钥密钥密钥密钥密钥", "API_KEY=***"),
    ("API_KEY=😀😀😀😀😀😀😀😀😀😀😀😀", "API_KEY=***"),
    ("secret: \"has spaces inside the secret value here\"", "secret: \"has sp…here\""),
    ("\"password\": \"has spaces inside the secret value here\"", "\"password\": \"has sp…here\""),
    ("SECRET_KEY=abc…def0123456789012345", "SECRET_KEY=abc…de…2345"),
    ("OPENAI_API_KEY=sk-pro…HNzL", "OPENAI_API_KEY=***"),
    ("API_KEY=abcde😀fghijklmnopqrstuvw", "API_KEY=***"),
    ("API_KEY=abcdefghijklmnopqrstu😀w", "API_KEY=***"),
    ("SECRET_TOKEN=Zq8vLm2XkP9wRt4YbN6c😀", "SECRET_TOKEN=Zq8vLm…6c😀"),
    ("密钥：sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL", "密钥：sk-pro…HNzL"),
    (
        "我的 GitHub token 是 ghp_Tj7Kx2Lm9Qp4Rs6Vw8Yz1Ab3Cd5Ef0GhQjwR，请保存",
        "我的 GitHub token 是 ghp_Tj…QjwR，请保存",
    ),
    (
        "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "export AWS_SECRET_ACCESS_KEY=wJalrX…EKEY",
    ),
    (
        "{\"env\": {\"OPENAI_API_KEY\": \"sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL\"}}",
        "{\"env\": {\"OPENAI_API_KEY\": \"sk-pro…HNzL\"}}",
    ),
    (
        "curl -u admin:S3cretPassw0rdThatIsLong https://x.example.com",
        "curl -u admin:S3cretPassw0rdThatIsLong https://x.example.com",
    ),
    ("Proxy-Authorization: Basic dXNlcjpwYXNzd29yZDEyMzQ1Njc4", "Proxy-Authorization: Basic ***"),
    ("x-goog-api-key: AIzaSyA1234567890abcdefghijklmnopqrstuv", "x-goog-api-key: AIzaSy…stuv"),
    ("https://hooks.slack.com/services/T0ABCDEFG/B0ABCDEFG/abcdefghijklmnopqrstuvwx", "https:…uvwx"),
    (
        "DATABASE_URL=postgres://app:VeryLongDatabasePassword123@db:5432/app",
        "DATABASE_URL=postgres://app:VeryLo…d123@db:5432/app",
    ),
    ("token: ghp_Tj7Kx2Lm9Qp4Rs6Vw8Yz1Ab3Cd5Ef0GhQjwR", "token: ghp_Tj…QjwR"),
    (
        "Use key sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJ-abcdefAA for claude",
        "Use key sk-ant…efAA for claude",
    ),
    ("passphrase=correct horse battery staple", "passphrase=*** horse battery staple"),
    (
        "STRIPE_SECRET_KEY=sk_live_abcdefghijklmnopqrstuvwxyz and STRIPE_WEBHOOK_SECRET=whsec_abcdefghijklmnopqrstuvwxyz012345",  # noqa: E501
        "STRIPE_SECRET_KEY=sk_liv…wxyz and STRIPE_WEBHOOK_SECRET=whsec_…2345",
    ),
    ("xai-abcdefghijklmnopqrstuvwxyz0123456789ABCD", "xai-ab…ABCD"),
    ("glpat-abcdefghijklmnopqrstuvwx", "glpat-…uvwx"),
    ("--client-secret abcdefghijklmnopqrstuvwxyz", "--client-secret abcdef…wxyz"),
    ("password=\"p@ss w0rd with spaces and more\"", "password=*** w…more\""),
    ("mysql://root:short@localhost/db", "mysql://root:***@localhost/db"),
    (
        "Here is the .env:\nOPENAI_API_KEY=sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL\nGITHUB_TOKEN=ghp_Tj7Kx2Lm9Qp4Rs6Vw8Yz1Ab3Cd5Ef0GhQjwR\nDB_PASSWORD=hunter2\n",  # noqa: E501
        "Here is the .env:\nOPENAI_API_KEY=sk-pro…HNzL\nGITHUB_TOKEN=ghp_Tj…QjwR\nDB_PASSWORD=***\n",
    ),
    ("password=\"short pw\"", "password=\"***\""),
    ("password='p@ss w0rd with spaces and more'", "password=*** w…more'"),
    ("password: \"p@ss w0rd with spaces and more\"", "password: \"p@ss w…more\""),
    ("PASSWORD=\"p@ss w0rd with spaces and more\"", "PASSWORD=*** w…more\""),
    ("secret='a b c d e f g h i j k l m n'", "secret=*** b c … m n'"),
    ("token=\"abc def ghi jkl mno pqr\" next", "token=*** de… pqr\" next"),
    ("api_key=\"sk-proj-Zq8vLm2XkP9wRt4YbN6cJd1FhG3sA7eU0iOyTqWzXcVbHNzL\"", "api_key=\"***\""),
    ("pass=\"x y\"", "pass=\"***\""),
    ("client_secret=\"abcdefghij klmnopqrstuvwxyz\" and more text", "client_secret=\"***\" and more text"),
    ("auth_token='abcdefghij klmnopqrstuvwxyz' x", "auth_token='***' x"),
    ("password=`p@ss w0rd with spaces and more`", "password=*** w…more`"),
]

# What OpenClaw 2026.9.6 wrote for a real `openclaw agent --message ...` run through its Gateway
# (mock model), and the row it kept in <state>/state/openclaw.sqlite: the transcript event holds
# masks only, `task_runs.task` the message as typed.
REAL_SESSION = "f62b828c-090f-458c-9ce8-6c06f7ceaf3a"
REAL_HEADER = {"type": "session", "version": 4, "id": REAL_SESSION, "timestamp": "2026-12-01T15:41:16.932Z",
               "cwd": "/tmp/cm-oc/home/.openclaw/workspace"}
REAL_EVENT = {
    "type": "message", "id": "ff663c21-858c-4fe1-807f-a1baadb72eb2", "parentId": "ec486746-1f4e-4a9e-88a2-fdbab75fa511",
    "timestamp": "2026-12-01T15:41:17.684Z",
    "message": {
        "role": "user",
        "content": "Please keep these: OPENAI_API_KEY=sk-pro…HNzL and my github token ghp_Tj…QjwR and the db "
                   "postgres://deploy:***@db.internal:5432/app password is Hunter2Pony!",
        "timestamp": 1796139665647, "idempotencyKey": "3f103f89-f674-47fb-a19c-c828b54cf32f:user",
        "__openclaw": {"senderIsOwner": True},
    },
}
REAL_TASK = (f"Please keep these: OPENAI_API_KEY={OPENAI} and my github token {GITHUB} and the db "
             f"postgres://deploy:{DB_PASSWORD}@db.internal:5432/app password is Hunter2Pony!")
REAL_TASK_CREATED_AT = 1796139665773
# OpenClaw 2026.9.6's DDL (OPENCLAW_STATE_SCHEMA_SQL in dist/managed-handoff-runtime.mjs).
TASK_RUNS_DDL = """
CREATE TABLE IF NOT EXISTS task_runs (
  task_id TEXT NOT NULL PRIMARY KEY, runtime TEXT NOT NULL, task_kind TEXT, source_id TEXT,
  requester_session_key TEXT, owner_key TEXT NOT NULL, scope_kind TEXT NOT NULL, child_session_key TEXT,
  parent_flow_id TEXT, parent_task_id TEXT, agent_id TEXT, requester_agent_id TEXT, run_id TEXT,
  execution_owner_host TEXT, execution_owner_pid INTEGER, execution_owner_start_identity INTEGER, label TEXT,
  task TEXT NOT NULL, status TEXT NOT NULL, delivery_status TEXT NOT NULL, notify_policy TEXT NOT NULL,
  created_at INTEGER NOT NULL, started_at INTEGER, ended_at INTEGER, last_event_at INTEGER, cleanup_after INTEGER,
  tool_use_count INTEGER, last_tool_name TEXT, error TEXT, progress_summary TEXT, terminal_summary TEXT,
  terminal_outcome TEXT, detail_json TEXT
) STRICT;
CREATE INDEX IF NOT EXISTS idx_task_runs_run_id ON task_runs(run_id);
"""


def make_task_runs(state: Path, rows: Sequence[tuple[str, str, str, int]], *, wal: bool = True) -> Path:
    """`<state>/state/openclaw.sqlite` with task_runs rows (task_id, agent, task, created_at ms)."""
    path = state / OPENCLAW_STATE_DB
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(TASK_RUNS_DDL)
    for task_id, agent, task, created in rows:
        conn.execute(
            "INSERT INTO task_runs (task_id, runtime, owner_key, scope_kind, child_session_key, agent_id, "
            "requester_agent_id, task, status, delivery_status, notify_policy, created_at, ended_at, cleanup_after) "
            "VALUES (?, 'cli', ?, 'session', ?, ?, ?, ?, 'succeeded', 'not_applicable', 'silent', ?, ?, ?)",
            (task_id, f"agent:{agent}:main", f"agent:{agent}:main", agent, agent, task, created, created + 5000,
             created + 5000 + 7 * 86400 * 1000))
    conn.commit()
    conn.close()
    return path


def make_config(tmp_path: Path, *, vault: str = "") -> Config:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "fingerprint.key").write_text(KEY.hex())
    return Config(paths=PathsConfig(state_dir=str(tmp_path / "state"), data_dir=str(data)),
                  credentials=CredentialsConfig(vault_recipient=vault))


def found_in(text: str, *, agent: str = "ops", path: str = "/state/agents/ops/sessions/sess-1.jsonl", line: int = 3,
             seen_at: str | None = "2026-12-01T15:41:17.684Z", keep_values: bool = True) -> list[Found]:
    redacted, matches = redact_with_matches(text, KEY)
    ref = SourceRef("jsonl", path, line=line)
    return [Found(agent, "sess-1", f, ref, seen_at, m.value if keep_values else None)
            for f, m in zip(redacted.findings, matches, strict=True)]


def vault_values(path: Path, identity: pyrage.x25519.Identity) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        out[entry["key_name"]] = json.loads(pyrage.decrypt(entry["age"].encode(), [identity]))["value"]
    return out


class ScriptedTaskRuns(TaskRunValues):
    """A task_runs lookup answering from a script; records every probe."""

    def __init__(self, *answers: Recovery) -> None:
        super().__init__(Path("/nonexistent/openclaw.sqlite"))
        self.answers = list(answers)
        self.probes: list[MaskProbe] = []

    def recover(self, probe: MaskProbe) -> Recovery:
        self.probes.append(probe)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


# ---------------------------------------------------------------------------------------------
# Recognising OpenClaw's masks


def mask_pieces(masked: str) -> list[str]:
    """Every `head…tail` and `***` OpenClaw left in a text (what must not reach the store)."""
    pieces = re.findall(r"\S{0,6}…\S{0,5}", masked) + (["***"] if "***" in masked else [])
    return [p for p in pieces if p != "…redacted…"] + (["…redacted…"] if "…redacted…" in masked else [])


@pytest.mark.parametrize(("raw", "masked"), OPENCLAW_MASKED, ids=[r[:40] for r, _ in OPENCLAW_MASKED])
def test_every_mask_openclaw_writes_is_replaced_whole(raw: str, masked: str) -> None:
    result = redact(masked, KEY)
    if masked == raw:
        assert not any(is_masked_rule(f.rule) for f in result.findings)  # OpenClaw masked nothing here
        return
    if masked in ("***",):  # a bare `***` (short token, no key beside it) says nothing: left alone
        assert result.text == masked
        return
    assert "…" not in result.text and "***" not in result.text, result.text
    assert any(is_masked_rule(f.rule) for f in result.findings)
    for piece in mask_pieces(masked):
        assert piece not in result.text
    # nothing of a value beyond what OpenClaw showed: every token of the raw input that OpenClaw hid
    # is absent (the store gets less than the transcript, never more)
    hidden = [w for w in re.findall(r"[A-Za-z0-9_\-./+=@]{6,}", raw) if w not in masked]
    assert not any(w in result.text for w in hidden)


EXPECTED = {
    "OPENAI_API_KEY=sk-pro…HNzL": [("masked_assignment", "OpenAI", "OPENAI_API_KEY")],
    "GITHUB_TOKEN=***": [("masked_assignment", "GitHub", "GITHUB_TOKEN")],
    "postgres://deploy:***@db.internal:5432/app": [("masked_url_credentials", "PostgreSQL", "deploy@db.internal")],
    "mysql://root:Sup3rS…w0rd@db.local/app": [("masked_url_credentials", "MySQL", "root@db.local")],
    "my github token ghp_Tj…QjwR ok": [("masked_token", "GitHub", "GITHUB_TOKEN")],
    "the key is sk-pro…HNzL": [("masked_token", "OpenAI", "OPENAI_API_KEY")],
    "token: ghp_Tj…QjwR": [("masked_assignment", "GitHub", "GITHUB_TOKEN")],
    '{"apiKey": "***"}': [("masked_json_field", "Unknown", "apiKey")],
    '{"password":"correc…aple","user":"bob"}': [("masked_json_field", "Unknown", "password")],
    "Authorization: Bearer eyJhbG…sR8U": [("masked_authorization", "JWT", "Authorization")],
    "Proxy-Authorization: Basic ***": [("masked_authorization", "Unknown", "Proxy-Authorization")],
    "X-Auth-Token: ***": [("masked_header", "Unknown", "X-Auth-Token")],
    "x-goog-api-key: AIzaSy…stuv": [("masked_header", "Google", "x-goog-api-key")],
    "--password=***": [("masked_cli_flag", "Unknown", "--password")],
    "https://api.x.com/v1?token=***&x=1": [("masked_query_param", "api.x.com", "token")],
    "bot123456…2345": [("masked_token", "Telegram", "TELEGRAM_BOT_TOKEN")],
    "AKIAIO…MPLE": [("masked_token", "AWS", "AWS_ACCESS_KEY_ID")],
    "-----BEGIN OPENSSH PRIVATE KEY-----\n…redacted…\n-----END OPENSSH PRIVATE KEY-----":
        [("masked_private_key", "SSH", "SSH_PRIVATE_KEY")],
    "密钥：sk-pro…HNzL": [("masked_token", "OpenAI", "OPENAI_API_KEY")],
    "grant_type=password&username=bob&password=***&client_secret=***":
        [("masked_query_param", "Unknown", "password"), ("masked_query_param", "Unknown", "client_secret")],
    "STRIPE_SECRET_KEY=sk_liv…wxyz and STRIPE_WEBHOOK_SECRET=whsec_…2345":
        [("masked_assignment", "Stripe", "STRIPE_SECRET_KEY"),
         ("masked_assignment", "Stripe", "STRIPE_WEBHOOK_SECRET")],
    'password=*** w…more"': [("masked_assignment", "Unknown", "password")],
}


@pytest.mark.parametrize("masked", list(EXPECTED), ids=[m[:40] for m in EXPECTED])
def test_service_key_name_and_shape_of_each_mask(masked: str) -> None:
    assert any(m == masked for _, m in OPENCLAW_MASKED), "expectations are about real OpenClaw output"
    findings = redact(masked, KEY).findings
    assert [(f.rule, f.service, f.key_name) for f in findings] == EXPECTED[masked]
    assert all(f.masked in ("hinted", "opaque") for f in findings)


def test_the_issue_message_leaves_no_head_or_tail() -> None:
    text = REAL_EVENT["message"]["content"]  # type: ignore[index]
    result = redact(text, KEY)
    assert [(f.rule, f.key_name, f.masked) for f in result.findings] == [
        ("masked_assignment", "OPENAI_API_KEY", "hinted"),
        ("masked_token", "GITHUB_TOKEN", "hinted"),
        ("masked_url_credentials", "deploy@db.internal", "opaque"),
        ("password_cue", "password", ""),
    ]
    for leftover in ("sk-pro", "HNzL", "ghp_Tj", "QjwR", "…", "***", "Hunter2Pony"):
        assert leftover not in result.text
    assert result.text.startswith("Please keep these: OPENAI_API_KEY=[REDACTED:masked_assignment:")


@pytest.mark.parametrize("cue", ["api key: ", "the token is ", "password = ", "密钥是 ", "API_KEY=", "key ",
                                 "secret: '", "Authorization: Bearer ", "https://u:"])
@pytest.mark.parametrize("mask", ["sk-pro…HNzL", "a1B2c3…Z9y8", "wJalrX…EKEY"])
def test_no_rule_takes_a_piece_of_a_mask(cue: str, mask: str) -> None:
    text = f"here {cue}{mask}{chr(39) if cue.endswith(chr(39)) else ''}{'@h.io' if cue.startswith('https') else ''} ok"
    result = redact(text, KEY)
    head, tail = split_mask(mask) or ("", "")
    assert head not in result.text and tail not in result.text and "…" not in result.text, result.text
    assert len(result.findings) == 1 and is_masked_rule(result.findings[0].rule)


@pytest.mark.parametrize("text", [
    "sk-pro...HNzL",  # three dots: somebody's elision, not OpenClaw's mask
    "OPENAI_API_KEY=sk-pro...HNzL",
    "ghp_Tj...QjwR",
    "use sk-proj-…HNzL like this",  # 8 before the ellipsis: no maskToken output
    "sk-pro…",  # head only
    "…HNzL",  # tail only
    "OPENAI_API_KEY=sk-pro…HN",  # tail too short
    "OPENAI_API_KEY=sk-pro…HNzLx",  # tail too long
])
def test_ascii_dots_and_partial_masks_are_not_masks(text: str) -> None:
    assert not any(m.masked for m in detect(text))


@pytest.mark.parametrize("text", [
    "wait… what", "really…that is it", "Loading…", "……", "然后……我们走了", "v1.2.3…v1.2.9 changed",
    "commits a1b2c3d…e4f5a6b", "session f62b828c…0c3d", "run 3f10…f32f done", "of 24011)…\"). But",
    'f"{v[:6]}…{v[-4:]}"', "return `${t.slice(0, 6)}…${t.slice(-4)}`", "x = s[:6] + '…' + s[-4:]",
    "range=aaaaaa…zzzz", "Note: hello…world", "***", "***bold italic***", "Rating: ***", "* * *",
    "password is *** (I will not say)", "| a | *** | b |", "x ** y *** z", "****", "a***b",
    "console.log(`${'*'.repeat(3)}`)", "page1…page9", "2024-01…2024-09",
])
def test_ellipses_and_stars_in_prose_and_code_are_not_masks(text: str) -> None:
    assert not any(m.masked for m in detect(text)), [m.rule for m in detect(text)]


def test_huge_hostile_inputs_stay_linear() -> None:
    inputs = [
        "a…b " * 250_000,
        "sk-pro…HNzL " * 50_000,
        "KEY=*** " * 100_000,
        "…" * 1_000_000,
        "*" * 1_000_000,
        ("x" * 5000 + "…") * 200,
    ]
    for text in inputs:
        started = time.perf_counter()
        matches = detect(text)
        assert time.perf_counter() - started < 20
        assert sum(m.masked for m in matches) <= _MAX_MASK_ATOMS


# ---------------------------------------------------------------------------------------------
# OpenClaw's maskToken, fingerprints


@pytest.mark.parametrize(("value", "mask"), [
    ("a" * 17, "***"),
    ("abcdefghijklmnopqr", "abcdef…opqr"),
    (OPENAI, "sk-pro…HNzL"),
    ("***", "***"),
    ("abcde😀fghijklmnopqrstuvw", "abcde…tuvw"),  # the 6th unit would split a surrogate pair
    ("Zq8vLm2XkP9wRt4YbN6c😀", "Zq8vLm…6c😀"),  # what OpenClaw wrote (OPENCLAW_MASKED)
    ("abcdefghijklmnopqr😀abc", "abcdef…abc"),  # the last 4 units would start mid-pair
    ("😀" * 9, "😀😀😀…😀😀"),
    ("abc…def0123456789012345", "abc…de…2345"),
])
def test_openclaw_mask_is_mask_token(value: str, mask: str) -> None:
    assert openclaw_mask(value) == mask
    if mask != "***":
        assert split_mask(mask) is not None


def test_mask_fingerprints_identify_hinted_masks_only() -> None:
    a = masked_fingerprint("masked_assignment", "OPENAI_API_KEY", "sk-pro…HNzL", KEY)
    echo = masked_fingerprint("masked_token", "OPENAI_API_KEY", "sk-pro…HNzL", KEY)
    assert a == echo  # the assistant repeating the mask is the same credential
    assert a != masked_fingerprint("masked_assignment", "OPENAI_API_KEY", "sk-pro…HNzM", KEY)
    assert a != masked_fingerprint("masked_assignment", "OPENAI_API_KEY", "sk-pro…HNzL", b"another-key")
    opaque = masked_fingerprint("masked_assignment", "GITHUB_TOKEN", "***", KEY)
    assert opaque == masked_fingerprint("masked_assignment", "GITHUB_TOKEN", "***", KEY)
    assert opaque != masked_fingerprint("masked_assignment", "DB_PASSWORD", "***", KEY)
    finding = redact("GITHUB_TOKEN=***", KEY).findings[0]
    assert (finding.fingerprint, finding.masked) == (opaque, "opaque")


# ---------------------------------------------------------------------------------------------
# Finding the value again in an unmasked copy


def test_recover_a_hinted_mask_exactly() -> None:
    text = f"here: OPENAI_API_KEY={OPENAI}, and a decoy sk-proj-XXXXHNzL and sk-pro{'z' * 30}HNzL."
    assert recover_unmasked(text, rule="masked_assignment", key_name="OPENAI_API_KEY", mask="sk-pro…HNzL") == [
        OPENAI, "sk-pro" + "z" * 30 + "HNzL"]  # both mask to sk-pro…HNzL; the caller refuses two
    assert recover_unmasked(f"x {OPENAI} y", rule="masked_token", key_name="x", mask="sk-pro…HNzL") == [OPENAI]
    assert recover_unmasked("no key here", rule="masked_token", key_name="x", mask="sk-pro…HNzL") == []
    # the mask itself in the text is no value
    assert recover_unmasked("KEY=sk-pro…HNzL", rule="masked_assignment", key_name="KEY", mask="sk-pro…HNzL") == []


@pytest.mark.parametrize(("text", "rule", "key_name", "value"), [
    (f"postgres://deploy:{DB_PASSWORD}@db.internal:5432/app", "masked_url_credentials", "deploy@db.internal",
     DB_PASSWORD),
    ("GITHUB_TOKEN=short12 ok", "masked_assignment", "GITHUB_TOKEN", "short12"),
    ("export DB_PASSWORD='Tr0ub4dor&3'", "masked_assignment", "DB_PASSWORD", "Tr0ub4dor&3"),
    ('password="p@ss w0rd with spaces and more"', "masked_assignment", "password", "p@ss w0rd with spaces and more"),
    ('{"apiKey": "sk-proj-abc"}', "masked_json_field", "apiKey", "sk-proj-abc"),
    ("db.password=hunter2", "masked_assignment", "password", "hunter2"),
    ("Authorization: Bearer shorttoken12", "masked_authorization", "Authorization", "shorttoken12"),
    ("curl -H 'X-Auth-Token: shortone' x", "masked_header", "X-Auth-Token", "shortone"),
    ("--password=hunter2hunter2 --verbose", "masked_cli_flag", "--password", "hunter2hunter2"),
    ("https://api.x.com/v1?token=short&x=1", "masked_query_param", "token", "short"),
    ("API_KEY=${API_KEY:-defaultvalue123}", "masked_assignment", "API_KEY", "defaultvalue123"),
])
def test_recover_an_opaque_mask_by_key_and_shape(text: str, rule: str, key_name: str, value: str) -> None:
    assert recover_unmasked(text, rule=rule, key_name=key_name, mask="***") == [value]


def test_recover_never_returns_references_or_masks() -> None:
    for text in ("API_KEY=$API_KEY", "API_KEY=${API_KEY}", "GITHUB_TOKEN=***", "GITHUB_TOKEN=ghp_Tj…QjwR"):
        assert recover_unmasked(text, rule="masked_assignment", key_name=text.split("=")[0], mask="***") == []
    assert recover_unmasked("x", rule="password_cue", key_name="password", mask="***") == []  # not a mask


def test_recover_a_private_key_block() -> None:
    block = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n-----END OPENSSH PRIVATE KEY-----"
    mask = "-----BEGIN OPENSSH PRIVATE KEY-----\n…redacted…\n-----END OPENSSH PRIVATE KEY-----"
    assert recover_unmasked(f"my key:\n{block}\nthanks", rule="masked_private_key", key_name="SSH_PRIVATE_KEY",
                            mask=mask) == [block]


def test_recover_is_bounded_on_hostile_text() -> None:
    text = "sk-pro" * 200_000 + "HNzL"
    started = time.perf_counter()
    recover_unmasked(text, rule="masked_token", key_name="x", mask="sk-pro…HNzL")
    assert time.perf_counter() - started < 20


# ---------------------------------------------------------------------------------------------
# task_runs, read-only


def test_task_runs_lookup_finds_the_nearest_exact_value(tmp_path: Path) -> None:
    seen = "2026-12-01T15:41:17.684Z"
    other = "sk-proj-" + "Q" * 40 + "HNzL"
    db = make_task_runs(tmp_path / "state", [
        ("t1", "main", REAL_TASK, REAL_TASK_CREATED_AT),
        ("t2", "other", f"OPENAI_API_KEY={other}", REAL_TASK_CREATED_AT),  # another agent's run
        ("t3", "main", "GITHUB_TOKEN=short12", REAL_TASK_CREATED_AT - 3 * 3600 * 1000),  # hours before
    ])
    before = db.read_bytes()
    runs = TaskRunValues(db)
    found = runs.recover(MaskProbe("main", "masked_assignment", "OPENAI_API_KEY", "sk-pro…HNzL", seen))
    assert (found.status, found.value, found.task_id) == ("found", OPENAI, "t1")
    assert "sk-proj" not in repr(found)  # a Recovery never shows its value
    assert runs.recover(MaskProbe("main", "masked_token", "GITHUB_TOKEN", "ghp_Tj…QjwR", seen)).value == GITHUB
    url = runs.recover(MaskProbe("main", "masked_url_credentials", "deploy@db.internal", "***", seen))
    assert url.value == DB_PASSWORD
    # `***` only near in time: the 3-hour-old GITHUB_TOKEN=short12 is not taken for it
    assert runs.recover(MaskProbe("main", "masked_assignment", "GITHUB_TOKEN", "***", seen)).status == "not_found"
    assert runs.recover(MaskProbe("main", "masked_assignment", "GITHUB_TOKEN", "***", None)).status == "not_found"
    assert runs.recover(MaskProbe("nobody", "masked_token", "GITHUB_TOKEN", "ghp_Tj…QjwR", seen)).status == "not_found"
    assert db.read_bytes() == before  # read-only


def test_task_runs_lookup_refuses_two_candidate_values(tmp_path: Path) -> None:
    seen = "2026-12-01T15:41:17.684Z"
    db = make_task_runs(tmp_path / "state", [
        ("t1", "main", "GITHUB_TOKEN=short12", REAL_TASK_CREATED_AT),
        ("t2", "main", "GITHUB_TOKEN=short34", REAL_TASK_CREATED_AT - 60_000),
    ])
    assert TaskRunValues(db).recover(MaskProbe("main", "masked_assignment", "GITHUB_TOKEN", "***", seen)).status == (
        "ambiguous")


def test_task_runs_lookup_without_database_table_or_lock(tmp_path: Path) -> None:
    probe = MaskProbe("main", "masked_token", "GITHUB_TOKEN", "ghp_Tj…QjwR", "2026-12-01T15:41:17.684Z")
    missing = TaskRunValues(tmp_path / "state" / OPENCLAW_STATE_DB)
    assert missing.recover(probe).status == "not_found"
    assert not (tmp_path / "state").exists()  # nothing created
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).execute("CREATE TABLE other (x)").connection.commit()
    assert TaskRunValues(empty).recover(probe).status == "not_found"
    locked_db = make_task_runs(tmp_path / "locked", [("t1", "main", REAL_TASK, REAL_TASK_CREATED_AT)], wal=False)
    writer = sqlite3.connect(locked_db, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        assert TaskRunValues(locked_db, busy_timeout_s=0.05).recover(probe).status == "unavailable"
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert TaskRunValues(locked_db).recover(probe).status == "found"
    assert sorted(p.name for p in locked_db.parent.iterdir()) == ["openclaw.sqlite"]  # no journal, no wal


def test_task_runs_connection_is_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = make_task_runs(tmp_path / "state", [("t1", "main", REAL_TASK, REAL_TASK_CREATED_AT)])
    seen: list[str] = []
    real_connect = sqlite3.connect

    def spy(database: str, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        seen.append(database)
        conn: sqlite3.Connection = real_connect(database, *args, **kwargs)
        conn.set_trace_callback(seen.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", spy)
    TaskRunValues(db).recover(MaskProbe("main", "masked_token", "GITHUB_TOKEN", "ghp_Tj…QjwR", None))
    assert seen[0].startswith("file:") and seen[0].endswith("?mode=ro")
    statements = seen[1:]
    assert statements[0] == "PRAGMA query_only=ON"
    assert all(s.split()[0] in ("PRAGMA", "SELECT") for s in statements), statements


# ---------------------------------------------------------------------------------------------
# Capture: index rows for masks, the vault from task_runs


def test_a_mask_is_indexed_as_masked_and_nothing_reads_task_runs_without_a_vault(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    scripted = ScriptedTaskRuns(Recovery("found", OPENAI, "t1"))
    capture = CredentialCapture(config, task_runs=scripted)
    workspace = capture.workspace("ops")
    workspace.mkdir(parents=True)
    found = found_in("OPENAI_API_KEY=sk-pro…HNzL and GITHUB_TOKEN=*** please", keep_values=False)
    capture.capture(found)
    assert scripted.probes == []  # no vault: task_runs is never read
    rows = read_index(workspace / INDEX_FILE)
    assert [(r.service, r.key_name, r.status) for r in rows] == [
        ("OpenAI", "OPENAI_API_KEY", "masked"), ("GitHub", "GITHUB_TOKEN", "masked")]
    assert all(r.location == f"/state/agents/ops/sessions/sess-1.jsonl:3 ({MASK_NOTE})" for r in rows)
    content = (workspace / INDEX_FILE).read_text()
    assert "sk-pro" not in content and "HNzL" not in content and "***" not in content


# A tool result as OpenClaw 2026.9.6 wrote it (real OpenClaw, an `exec` echoing two credentials): the output is
# in `content` and again in `details.aggregated`, masked differently.
TOOL_RESULT_TWICE = {
    "type": "message", "id": "4c1805c0", "parentId": "b220c7a5", "timestamp": "2026-12-03T02:23:55.123Z",
    "message": {"role": "toolResult", "toolCallId": "call_5f02", "toolName": "exec",
                "content": [{"type": "text", "text": "DATABASE_URL=postgres://admin:***@db.prod:5432/main\n"
                                                     "SENDGRID_API_KEY=SG.nge\u2026s5cr"}],
                "details": {"status": "completed", "exitCode": 0, "durationMs": 30,
                            "aggregated": "DATABASE_URL=postgres://admin:***@db.prod:5432/main\nSENDGRID_API_KEY=***"},
                "isError": False, "timestamp": 1796264635121}}


def test_a_tool_result_carrying_its_output_twice_gives_one_row_per_credential(tmp_path: Path) -> None:
    record = RawRecord("ops", json.dumps(TOOL_RESULT_TWICE).encode(), SourceRef("sqlite", "db", session_id="s", seq=21))
    out = transform_records([record], SessionState("s"), fallback_session="s", redact_key=KEY, max_line_bytes=1 << 20,
                            chunk_chars=2000, chunk_overlap=0)
    assert sorted((f.finding.service, f.finding.key_name, f.finding.masked) for f in out.found) == [
        ("PostgreSQL", "admin@db.prod", "opaque"), ("SendGrid", "SENDGRID_API_KEY", "hinted")]
    capture = CredentialCapture(make_config(tmp_path), task_runs=ScriptedTaskRuns(Recovery("found", "x", "t1")))
    workspace = capture.workspace("ops")
    workspace.mkdir(parents=True)
    capture.capture(out.found)
    assert sorted((r.service, r.key_name) for r in read_index(workspace / INDEX_FILE)) == [
        ("PostgreSQL", "admin@db.prod"), ("SendGrid", "SENDGRID_API_KEY")]


def test_with_a_vault_the_value_behind_the_mask_is_vaulted(tmp_path: Path) -> None:
    identity = pyrage.x25519.Identity.generate()
    config = make_config(tmp_path, vault=str(identity.to_public()))
    make_task_runs(tmp_path / "state", [("t1", "ops", REAL_TASK, REAL_TASK_CREATED_AT)])
    capture = CredentialCapture(config)
    workspace = capture.workspace("ops")
    workspace.mkdir(parents=True)
    capture.capture(found_in(REAL_EVENT["message"]["content"]))  # type: ignore[index]
    rows = read_index(workspace / INDEX_FILE)
    assert [(r.key_name, r.status) for r in rows] == [
        ("OPENAI_API_KEY", "masked"), ("GITHUB_TOKEN", "masked"), ("deploy@db.internal", "masked"),
        ("password", "captured")]
    vault = tmp_path / "data" / "credentials.vault"
    for n, row in enumerate(rows[:3], 1):
        assert row.location == f"/state/agents/ops/sessions/sess-1.jsonl:3 ({MASK_NOTE}); vault:{vault}#{n}"
        assert len(row.fingerprint.split()) == 2  # the mask's fingerprint and the value's
    assert vault_values(vault, identity) == {"OPENAI_API_KEY": OPENAI, "GITHUB_TOKEN": GITHUB,
                                             "deploy@db.internal": DB_PASSWORD, "password": "Hunter2Pony!"}
    index_text = (workspace / INDEX_FILE).read_text()
    assert not any(v in index_text for v in (OPENAI, GITHUB, DB_PASSWORD, "sk-pro", "HNzL"))


def test_a_mask_whose_value_is_gone_says_so(tmp_path: Path) -> None:
    identity = pyrage.x25519.Identity.generate()
    config = make_config(tmp_path, vault=str(identity.to_public()))
    capture = CredentialCapture(config, task_runs=ScriptedTaskRuns(Recovery("not_found")))
    workspace = capture.workspace("ops")
    workspace.mkdir(parents=True)
    capture.capture(found_in("OPENAI_API_KEY=sk-pro…HNzL"))
    (row,) = read_index(workspace / INDEX_FILE)
    assert row.location.endswith("(transcript holds only a mask; no unmasked copy found)")
    assert "vault:" not in row.location
    assert not (tmp_path / "data" / "credentials.vault").exists()


def test_a_busy_database_defers_the_row_until_the_value_is_read(tmp_path: Path) -> None:
    identity = pyrage.x25519.Identity.generate()
    config = make_config(tmp_path, vault=str(identity.to_public()))
    scripted = ScriptedTaskRuns(Recovery("unavailable", detail="database is locked"), Recovery("found", OPENAI, "t1"))
    capture = CredentialCapture(config, task_runs=scripted)
    workspace = capture.workspace("ops")
    workspace.mkdir(parents=True)
    capture.capture(found_in("OPENAI_API_KEY=sk-pro…HNzL"))
    assert not (workspace / INDEX_FILE).exists()
    assert capture.pending_counts() == {"ops": 1} == pending_counts(tmp_path / "data")
    (report,) = capture.pending_report()
    assert (report.agent_id, report.rows, report.resolving, report.workspace_exists) == ("ops", 1, 1, True)
    state_text = (tmp_path / "data" / "credentials-index.json").read_text()
    assert OPENAI not in state_text and oct((tmp_path / "data" / "credentials-index.json").stat().st_mode)[-3:] == "600"
    assert capture.flush_pending() == 1
    (row,) = read_index(workspace / INDEX_FILE)
    assert row.location.endswith(f"({MASK_NOTE}); vault:{tmp_path / 'data' / 'credentials.vault'}#1")
    assert capture.pending_counts() == {}
    assert vault_values(tmp_path / "data" / "credentials.vault", identity) == {"OPENAI_API_KEY": OPENAI}
    assert "sk-pro…HNzL" not in (tmp_path / "data" / "credentials-index.json").read_text()  # mask dropped too


def test_real_openclaw_transcript_row_through_the_pipeline(tmp_path: Path) -> None:
    """The transcript event and task_runs row OpenClaw wrote, through transform_records and capture."""
    identity = pyrage.x25519.Identity.generate()
    config = make_config(tmp_path, vault=str(identity.to_public()))
    make_task_runs(tmp_path / "state", [("8e3fc23b-1a82-4280-a296-c0b42c3e421b", "main", REAL_TASK,
                                         REAL_TASK_CREATED_AT)])
    db = str(tmp_path / "state" / "agents" / "main" / "agent" / "openclaw-agent.sqlite")
    records = [RawRecord("main", json.dumps(obj, ensure_ascii=False).encode(),
                         SourceRef("sqlite", db, session_id=REAL_SESSION, seq=seq))
               for seq, obj in ((0, REAL_HEADER), (4, REAL_EVENT))]
    out = transform_records(records, SessionState(None), fallback_session="x", redact_key=KEY, max_line_bytes=1 << 20,
                            chunk_chars=2000, chunk_overlap=100, keep_values=True)
    stored = " ".join(c.text for c in out.chunks)
    assert not any(s in stored for s in ("HNzL", "QjwR", "sk-pro", "ghp_Tj", "***", "…", "Hunter2Pony"))
    capture = CredentialCapture(config)
    workspace = capture.workspace("main")
    workspace.mkdir(parents=True)
    capture.capture(out.found)
    assert all(f.value is None for f in out.found)
    rows = read_index(workspace / INDEX_FILE)
    assert [r.status for r in rows] == ["masked", "masked", "masked", "captured"]
    assert all(f"#{REAL_SESSION}:4" in r.location for r in rows)
    assert vault_values(tmp_path / "data" / "credentials.vault", identity) == {
        "OPENAI_API_KEY": OPENAI, "GITHUB_TOKEN": GITHUB, "deploy@db.internal": DB_PASSWORD, "password": "Hunter2Pony!"}


# ---------------------------------------------------------------------------------------------
# The real package (tests/openclaw_harness.py installs it)

_MASK_SCRIPT = """
const fs = await import("node:fs");
const dist = process.env.OPENCLAW_DIST;
const file = fs.readdirSync(dist).find((f) => /^transcript-redact-.*\\.mjs$/.test(f));
const source = fs.readFileSync(`${dist}/${file}`, "utf8");
const alias = source.match(/\\bredactTranscriptMessage as (\\w+)/)[1];
const mod = await import(`${dist}/${file}`);
const inputs = JSON.parse(fs.readFileSync(0, "utf8"));
const out = inputs.map((text) => mod[alias]({ role: "user", content: [{ type: "text", text }], timestamp: 1 }, {})
  .content[0].text);
process.stdout.write(JSON.stringify(out));
"""


def openclaw_masks(inputs: Sequence[str]) -> list[str]:
    """OpenClaw's own transcript masking (its `redactTranscriptMessage`) applied to each input."""
    found = install_or_skip()
    env = {**os.environ, "OPENCLAW_DIST": str(found.package / "dist")}
    done = subprocess.run([str(found.node_bin / "node"), "--input-type=module", "-e", _MASK_SCRIPT],
                          input=json.dumps(inputs),
                          capture_output=True, text=True, timeout=120, check=True, env=env)
    result: list[str] = json.loads(done.stdout)
    return result


def test_live_openclaw_agrees() -> None:
    """The fixture is what the installed OpenClaw writes; and every mask it writes is recognised."""
    raws = [raw for raw, _ in OPENCLAW_MASKED]
    masked = openclaw_masks(raws)
    assert list(zip(raws, masked, strict=True)) == OPENCLAW_MASKED
    # and over generated values: every length around the 18-unit threshold, in the common shapes
    values = ["x" * n for n in (1, 5, 17, 18, 19)] + ["aB3$" * n for n in (3, 5, 9)] + [OPENAI, GITHUB, "密码" * 10]
    shapes = ["API_KEY={v}", 'export DB_PASSWORD="{v}"', '{{"apiKey": "{v}"}}', "Authorization: Bearer {v}",
              "--token {v}", "https://u:{v}@h.io/x", "x-api-key: {v}", "token: {v}", "secret = '{v}'"]
    raws = [shape.format(v=v) for shape in shapes for v in values if "\\" not in v]
    for raw, text in zip(raws, openclaw_masks(raws), strict=True):
        if text == raw:
            continue
        result = redact(text, KEY)
        assert "…" not in result.text and "***" not in result.text, (raw, text, result.text)


def test_a_name_holding_part_of_the_value_behind_a_mask_is_not_written(tmp_path: Path) -> None:
    """Issue 37: the labels are checked again once the value behind a mask is known (a name that shares 8
    characters with it names the row by its rule instead), in the index, the vault's metadata and the log."""
    identity = pyrage.x25519.Identity.generate()
    config = make_config(tmp_path, vault=str(identity.to_public()))
    value = "Bluewhale-password-1984"
    capture = CredentialCapture(config, task_runs=ScriptedTaskRuns(Recovery("found", value, "t1")))
    workspace = capture.workspace("ops")
    workspace.mkdir(parents=True)
    found = found_in("BLUEWHALE_PASSWORD=***")
    assert [f.finding.key_name for f in found] == ["BLUEWHALE_PASSWORD"]  # fine until the value is known
    with capture_logs() as logs:
        capture.capture(found)
    (row,) = read_index(workspace / INDEX_FILE)
    assert row.key_name == "unknown"  # (a mask's rule has no name of its own in the table)
    vault_meta = [{k: v for k, v in json.loads(line).items() if k != "age"}
                  for line in (tmp_path / "data" / "credentials.vault").read_text().splitlines()]
    assert "bluewhale" not in json.dumps([vault_meta, logs], default=str).lower()
