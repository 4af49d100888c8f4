"""Secret detection and redaction: every rule, recall on a generated corpus, precision on real text."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.secret_corpus import KINDS, KINDS_BY_RULE, CorpusMessage, SecretKind, generate_corpus, near_misses
from tests.secret_corpus_public import AUDIT_KEY, FIXTURE_SECRETS
from veritas_watch.transforms import redact
from veritas_watch.transforms.redact import RULES, detect, fingerprint

KEY = b"test-fingerprint-key-0123456789ab"
MARKER = re.compile(r"\[REDACTED:([a-z0-9_]+):([0-9a-f]{8})\]")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures"

FORMAT_RULES = [r for r in RULES if r.kind in ("provider", "context")]
FORMAT_KINDS = [k for k in KINDS if k.rule in {r.name for r in FORMAT_RULES}]


def shared_fixture(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared fixture {path} not present")
    return path


def sample_sentence(kind: SecretKind, wrapped: str) -> str:
    if kind.context:
        return f"for {kind.service} ({kind.context}): {wrapped} ok"
    return f"ok here it is {wrapped} thanks"


def covering(matches: list[redact.SecretMatch], start: int, end: int) -> list[redact.SecretMatch]:
    return [m for m in matches if m.start <= start and m.end >= end]


# ---------------------------------------------------------------------------------------------
# The rule table


def test_rule_table_is_large_and_well_named() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[a-z0-9_]+", n) for n in names)
    assert len([r for r in RULES if r.kind == "provider"]) >= 40
    # markers carry the rule name: it must not itself look like a secret
    assert not detect(" ".join(f"[REDACTED:{n}:0123abcd]" for n in names))
    # the prefilter compares keywords with the lowercased text
    assert all(k == k.lower() for r in RULES for k in r.keywords)


def test_every_format_rule_has_corpus_samples() -> None:
    missing = {r.name for r in FORMAT_RULES} - set(KINDS_BY_RULE)
    assert not missing, f"rules without generated samples: {sorted(missing)}"


@pytest.mark.parametrize("kind", FORMAT_KINDS, ids=lambda k: k.rule)
def test_format_rule_true_samples(kind: SecretKind) -> None:
    rng = random.Random(kind.rule)
    for _ in range(5):
        value = kind.make(rng)
        wrapped = kind.wrap(value) if kind.wrap else value
        text = sample_sentence(kind, wrapped)
        start = text.index(value)
        found = covering(detect(text), start, start + len(value))
        assert [m.rule for m in found] == [kind.rule], (text, [(m.rule, m.start, m.end) for m in detect(text)])
        assert found[0].value == value


@pytest.mark.parametrize("kind", FORMAT_KINDS, ids=lambda k: k.rule)
def test_format_rule_false_samples(kind: SecretKind) -> None:
    rng = random.Random("miss-" + kind.rule)
    for miss in near_misses(kind, rng):
        text = f"the docs show {miss} as the shape"
        # too short, a filler, or (context rules) the right shape without its provider named: the
        # format rule stays silent. A random fragment may still be taken for a bare key or a bare
        # generated password, rightly.
        found = [m for m in detect(text) if m.rule not in ("high_entropy_token", "random_password")]
        assert found == [], (miss, [(m.rule, m.value) for m in found])


# ---------------------------------------------------------------------------------------------
# Generic chat forms: (text, the secret that must be found, its rule, key name, service)

GENERIC_TRUE: list[tuple[str, str, str, str | None, str | None]] = [
    (
        "mailgun private key 3f9a1c2e8b7d6a5f4e3d2c1b0a9f8e7d-1a2b3c4d-5e6f7a8b done",
        "3f9a1c2e8b7d6a5f4e3d2c1b0a9f8e7d-1a2b3c4d-5e6f7a8b",
        "mailgun_api_key",
        None,
        "Mailgun",
    ),
    (
        "export TOKENMALL_API_KEY=tm8f7a9c2b4d6e1f3a5b7c9d0e",
        "tm8f7a9c2b4d6e1f3a5b7c9d0e",
        "env_assignment",
        "TOKENMALL_API_KEY",
        "Tokenmall",
    ),
    ("DB_PASSWORD=postgres2024\nDB_HOST=localhost", "postgres2024", "env_assignment", "DB_PASSWORD", None),
    ("MYSQL_ROOT_PASSWORD='correct horse battery'", "correct horse battery", "env_assignment", None, None),
    ('{"clientSecret": "Zq8vN2kLmP4xR7tY1wB5"}', "Zq8vN2kLmP4xR7tY1wB5", "env_assignment", "clientSecret", None),
    ("api_key: a83Jd92kLq0Zm4Nx7Pw1", "a83Jd92kLq0Zm4Nx7Pw1", "env_assignment", "api_key", None),
    (
        '$env:MISTRAL_API_KEY="Vq2mX8rT4kP9sL3wN7bZ1cY6dF0hJ5gA"',
        "Vq2mX8rT4kP9sL3wN7bZ1cY6dF0hJ5gA",
        "mistral_api_key",
        "MISTRAL_API_KEY",
        "Mistral",
    ),
    ("mytool login --token 9f8e7d6c5b4a39281706f5e4", "9f8e7d6c5b4a39281706f5e4", "cli_secret_flag", "--token", None),
    (
        "curl -H 'Authorization: Bearer qL9x2Vb7Nm4Kp8Rt3Yw6Zs1A' https://x.example",
        "qL9x2Vb7Nm4Kp8Rt3Yw6Zs1A",
        "authorization_header",
        "Authorization",
        None,
    ),
    ("Authorization: Basic YWRtaW46czNjcjN0UGFzcw==", "YWRtaW46czNjcjN0UGFzcw==", "authorization_header", None, None),
    # a password a person chose, under a key's name: wordish, yet a secret
    ("apikey = Marlboro4736@", "Marlboro4736@", "env_assignment", None, None),
    ("private_key := dragon9053!", "dragon9053!", "env_assignment", None, None),
    # Docker's config.json, and the same JSON escaped inside a GitLab runner's DOCKER_AUTH_CONFIG: ci-bot:Hq7#xV2pL9
    ('{"auths": {"registry.example.com": {"auth": "Y2ktYm90OkhxNyN4VjJwTDk="}}}', "Y2ktYm90OkhxNyN4VjJwTDk=",
     "docker_config_auth", "auth", None),
    ('DOCKER_AUTH_CONFIG={\\"auths\\":{\\"r.example\\":{\\"auth\\":\\"Y2ktYm90OkhxNyN4VjJwTDk=\\"}}}',
     "Y2ktYm90OkhxNyN4VjJwTDk=", "docker_config_auth", "auth", None),
    ("use bearer Xk29Lm4Np8Qr1St5Uv7W to call it", "Xk29Lm4Np8Qr1St5Uv7W", "bearer_token", None, None),
    (
        "postgres://admin:S3cr3tPass@db.example.com:5432/app",
        "S3cr3tPass",
        "url_credentials",
        "admin@db.example.com",
        "PostgreSQL",
    ),
    # the user names the login, the vault keeps the password (as for URL credentials)
    ("curl -u ops:Gr4fana!pw https://grafana.example.com", "Gr4fana!pw", "curl_user_password", "ops (curl -u)", None),
    (
        "Driver={ODBC Driver 18 for SQL Server};Server=tcp:db.example.net,1433;Uid=app;Pwd={Xk9#mQ2;vLp7!zR4};",
        "Xk9#mQ2;vLp7!zR4",
        "connection_string_password",
        "Pwd",
        None,
    ),
    ("Data Source=db;User ID=sa;Password={7hGq;2Lm!pZ9x};", "7hGq;2Lm!pZ9x", "connection_string_password", None, None),
    ("my password is hunter2024!", "hunter2024!", "password_cue", "password", None),
    ("the password for the router is Xy12ab!9", "Xy12ab!9", "password_cue", None, "router"),
    ("The wifi password is `sunshine`.", "sunshine", "password_cue", None, "Wi-Fi"),
    ("密码是Abc123!@#，记住了", "Abc123!@#", "password_cue", "密码", None),
    ("我的wifi密码：88888888", "88888888", "password_cue", None, "Wi-Fi"),
    ("口令是 woaini1314", "woaini1314", "password_cue", "口令", None),
    # Japanese cues, `pw`, a generated passphrase (a credential trial's misses)
    ("パスワードは Qw8rTy2uIo です。ルーターの管理画面用です。", "Qw8rTy2uIo", "password_cue", "パスワード", None),
    ("私のパスワードは「Sakura2024!」です", "Sakura2024!", "password_cue", "パスワード", None),
    ("APIキー: 3f9a8c7d6e5b4a3928171615a4b3c2d1", "3f9a8c7d6e5b4a3928171615a4b3c2d1", "token_cue", None, None),
    ("秘密鍵は aB3dE5gH7jK9mN2pQ4 です", "aB3dE5gH7jK9mN2pQ4", "token_cue", "秘密鍵", None),
    ("router admin pw: Xk9mPq2vLr", "Xk9mPq2vLr", "password_cue", "pw", None),
    ("my password is correct-horse-battery-staple for the NAS", "correct-horse-battery-staple", "password_cue",
     "password", None),
    (
        "here is the TokenMall key: tm-8f7a9c2b4d6e1f3a5b7c9d0e2f4a6b8c",
        "tm-8f7a9c2b4d6e1f3a5b7c9d0e2f4a6b8c",
        "token_cue",
        None,
        "TokenMall",
    ),
    ("key 是 AbCdEf1234567890GhIjKl", "AbCdEf1234567890GhIjKl", "token_cue", None, None),
    ("TokenMall的密钥：Qw3rTy7uIo9pAs2dFg5h", "Qw3rTy7uIo9pAs2dFg5h", "token_cue", "密钥", "TokenMall"),
    ("帮我把这个令牌记下来：7081b87ea2c9c3be6ee8", "7081b87ea2c9c3be6ee8", "token_cue", None, None),
    (
        "DeepSeek 的 key：sk-0123456789abcdef0123456789abcdef",
        "sk-0123456789abcdef0123456789abcdef",
        "deepseek_api_key",
        None,
        "DeepSeek",
    ),
    (
        "通义千问的key sk-0123456789abcdef0123456789abcdef",
        "sk-0123456789abcdef0123456789abcdef",
        "deepseek_api_key",
        None,
        "Alibaba DashScope",
    ),
    (
        "my deploy key (the rest got cut off):\n-----BEGIN OPENSSH PRIVATE KEY-----\n"
        "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\nQyNTUxOQAAACB",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
        "QyNTUxOQAAACB",
        "openssh_private_key",
        None,
        "SSH",
    ),
]

GENERIC_FALSE = [
    '{"auth": "dXNlcjpwYXNzd29yZA=="}',  # Docker's documented example: user:password
    "api_key = abc12!",  # too short for a chosen password under a key's name
    "I scored 2024! on the key test",
    "password is required",
    'conn = f"Server={host};Uid={user};Pwd={password};"',
    'dsn = f"Pwd={self.db_password};Encrypt=yes"',
    "Password={PASSWORD};Pwd={0};",
    "The password is stored in 1Password",
    "the password was reset yesterday",
    "密码是什么？",
    "密码错误：code 401",
    "パスワードを変更しました",
    "トークン数は 4096 です",
    "キーボードは US 配列です",
    "このAPIキーは無効です",
    "the pw is expired",
    "my password is case-sensitive",
    "the state-of-the-art password manager",
    'token: "hook-token"',
    'hooks: { enabled: true, token: "shared-gateway-token-1234567890" }',
    'const hookToken = overrides.hookToken ?? hooks?.token ?? "";',
    "password: Optional[str] = None,",
    "password = config['password']",
    'proxy_password=self._socks_options["password"],',
    "Authorization: Bearer $OPENAI_API_KEY",
    'curl -H "Authorization: Bearer ${TOKEN}" https://x',
    "OPENAI_API_KEY=your_api_key_here",
    "GITHUB_TOKEN=${{ secrets.GITHUB_TOKEN }}",
    "SECRET_KEY_PATH=/etc/app/secret.key",
    "PWD=/home/user/project",
    "maxTokens: 4096, totalTokens: 0",
    '"key": "agent:main:tui-06888e60-c0e0-42f4-8e60-d12451ffc3c1"',
    "the key is to stay calm and keep going",
    'publicKeyToken="1fc8b3b9a1e18e3b"',
    "https://user:password@example.com/",
    "git clone https://github.com/org/repo.git",
    'verify_token="eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9..."',
    "use --password options to pass it",
    "the commit 3f9a1c2e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39 fixed it",
    "session 06826999-c084-45d8-9da5-236646ccc145 started",
    # where a transcript row is, as every log line names it (a provider's name in the file name: a real run's
    # gap line lost its location to this)
    "/home/u/.openclaw/agents/main/agent/openclaw-agent.sqlite#00a41b83-ff1a-4542-b976-040a7edcfd5b",
    "-----BEGIN PRIVATE KEY-----\n...\n-----END PRIVATE KEY-----",
    "-----BEGIN RSA PRIVATE KEY----- is the first line of a PEM file, then base64 lines follow",
    "-----BEGIN PRIVATE KEY-----\n-----BEGIN PRIVATE KEY-----\n-----BEGIN PRIVATE KEY-----",
]


@pytest.mark.parametrize(("text", "secret", "rule", "key_name", "service"), GENERIC_TRUE)
def test_generic_true_samples(text: str, secret: str, rule: str, key_name: str | None, service: str | None) -> None:
    start = text.index(secret)
    found = covering(detect(text), start, start + len(secret))
    assert len(found) == 1, (text, detect(text))
    assert found[0].rule == rule
    assert found[0].value == secret
    if key_name is not None:
        assert found[0].key_name == key_name
    if service is not None:
        assert found[0].service == service


@pytest.mark.parametrize("text", GENERIC_FALSE)
def test_generic_false_samples(text: str) -> None:
    assert detect(text) == [], [(m.rule, m.value) for m in detect(text)]


def test_env_name_wins_key_name_and_provider_wins_rule() -> None:
    value = "sk-proj-" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7" * 3
    found = detect(f"export OPENAI_API_KEY={value}\n")
    assert [(m.rule, m.key_name, m.service, m.value) for m in found] == [
        ("openai_project_key", "OPENAI_API_KEY", "OpenAI", value)
    ]


def test_shared_sk_format_takes_its_service_from_the_variable_name() -> None:
    value = "sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9T0u1V2w3X4"
    (match,) = detect(f"TOKENMALL_API_KEY={value}")
    assert (match.rule, match.service, match.key_name) == ("sk_api_key", "Tokenmall", "TOKENMALL_API_KEY")


def test_multiline_pem_in_json_escapes() -> None:
    body = "\\n".join("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7" for _ in range(6))
    text = '{"private_key": "-----BEGIN PRIVATE KEY-----\\n' + body + '\\n-----END PRIVATE KEY-----\\n"}'
    (match,) = [m for m in detect(text) if m.rule == "private_key"]
    assert text[match.start : match.end].endswith("-----END PRIVATE KEY-----")
    assert "MIIEvQIBADAN" not in redact.redact(text, KEY).text


def test_terminal_wrapped_json_value_is_hidden_whole() -> None:
    head, tail = "qxBWTQLpAJz91Ai8oAtcQj25BVMB02ZgeX", "aNpW/1bpKMWQ3EoBQPU6YcTKBN2YI="
    text = '{\r\n  "channelAccessToken": "' + head + "\r\n" + tail + '",\r\n  "x": 1\r\n}'
    (match,) = detect(text)
    assert match.value == head + tail  # the vault gets the real value, without the wrap
    out = redact.redact(text, KEY).text
    assert head[:12] not in out and tail[:12] not in out


def test_a_found_value_is_hidden_where_it_recurs() -> None:
    value = "Zq8vN2kLmP4xR7tY1wB5"
    text = f"API_TOKEN={value}\nlater I typed {value} again"
    result = redact.redact(text, KEY)
    assert value not in result.text
    assert len(result.findings) == 2
    assert result.findings[0].fingerprint == result.findings[1].fingerprint


# ---------------------------------------------------------------------------------------------
# Markers, fingerprints, spans


def test_fingerprint_is_keyed_short_and_not_a_prefix() -> None:
    value = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    fp = fingerprint(value, KEY)
    assert re.fullmatch(r"[0-9a-f]{8}", fp)
    assert fp == fingerprint(value, KEY)
    assert fp != fingerprint(value, b"another key")
    assert fp not in value and not value.startswith(fp)


def test_redact_markers_and_spans_in_the_original_text() -> None:
    text = (
        "这是 GitHub 的 token：ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8，还有 "
        "AKIAIOSFODNN7EXAMPL3 和 password: Tr0ub4dor&3"
    )
    result = redact.redact(text, KEY)
    rules = [f.rule for f in result.findings]
    assert rules == ["github_personal_access_token", "aws_access_key_id", "password_cue"]
    markers = MARKER.findall(result.text)
    assert [(r, fp) for r, fp in markers] == [(f.rule, f.fingerprint) for f in result.findings]
    for finding in result.findings:
        original = text[finding.start : finding.end]
        assert finding.fingerprint == fingerprint(original, KEY)
        assert original not in result.text
    assert result.text.startswith("这是 GitHub 的 token：[REDACTED:github_personal_access_token:")


def test_redact_with_matches_pairs_each_finding_with_its_value() -> None:
    text = "GITHUB_TOKEN=ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8 and 密码是Abc123!@#"
    result, matches = redact.redact_with_matches(text, KEY)
    assert result == redact.redact(text, KEY)
    assert [fingerprint(m.value, KEY) for m in matches] == [f.fingerprint for f in result.findings]
    assert [m.value for m in matches] == ["ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "Abc123!@#"]
    assert "ghp_" not in repr(matches)  # values stay out of reprs (and so out of accidental logs)


def test_text_without_secrets_is_returned_unchanged() -> None:
    text = "Caroline: I went to a LGBTQ support group yesterday and it was so powerful."
    assert redact.redact(text, KEY).text == text
    assert redact.redact(text, KEY).findings == ()


def test_spans_survive_case_folding_that_changes_length() -> None:
    text = "İİİ ﬃ token: ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    (match,) = detect(text)
    assert text[match.start : match.end] == match.value


# ---------------------------------------------------------------------------------------------
# Recall on the generated corpus


@pytest.fixture(scope="module")
def corpus() -> list[CorpusMessage]:
    return generate_corpus()


def test_corpus_is_large_and_varied(corpus: list[CorpusMessage]) -> None:
    assert len(corpus) >= 1000
    categories = {m.category for m in corpus}
    assert {"en", "zh", "code", "json", "env", "url", "backtick", "curl"} <= categories
    planted_rules = {p.rule for m in corpus for p in m.planted}
    assert {k.rule for k in KINDS} <= planted_rules


def test_recall_on_generated_corpus(corpus: list[CorpusMessage]) -> None:
    total = 0
    misses: list[str] = []
    for message in corpus:
        found = detect(message.text)
        redacted = redact.redact(message.text, KEY).text
        for planted in message.planted:
            total += 1
            covered = covering(found, planted.start, planted.end)
            if not covered or planted.value in redacted:
                misses.append(f"MISS {planted.rule} [{message.category}] {message.text[:200]!r}")
    for line in misses:
        print(line)
    recall = 1 - len(misses) / total
    print(f"recall {recall:.4f} over {total} planted secrets in {len(corpus)} messages")
    assert recall >= 0.98


def test_keyword_prefilter_never_hides_a_match(corpus: list[CorpusMessage]) -> None:
    texts = [m.text for m in corpus] + [t for t, *_ in GENERIC_TRUE]
    for rule in RULES:
        if not rule.keywords:
            continue
        for text in texts:
            if any(rule.extract(rule, m, text) for m in rule.pattern.finditer(text)):
                assert any(k in text.lower() for k in rule.keywords), (rule.name, text[:120])


def test_corpus_redaction_leaks_nothing_and_is_idempotent(corpus: list[CorpusMessage]) -> None:
    for message in corpus:
        result = redact.redact(message.text, KEY)
        for match in detect(message.text):
            assert not leaked_pieces(match.value, result.text), (match.rule, message.text[:120])
        again = redact.redact(result.text, KEY)
        assert again.findings == () and again.text == result.text


def leaked_pieces(value: str, text: str, width: int = 12) -> list[str]:
    if len(value) <= width:
        return [value] if value in text else []
    return [value[i : i + width] for i in range(len(value) - width + 1) if value[i : i + width] in text]


# ---------------------------------------------------------------------------------------------
# Precision on real text



def _message_texts(node: Any) -> Iterator[str]:
    """All text of a message: text and thinking blocks, tool call arguments, tool results."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from _message_texts(item)
    elif isinstance(node, dict):
        for key in ("text", "thinking", "content"):
            if key in node:
                yield from _message_texts(node[key])
        if isinstance(node.get("arguments"), dict):
            yield json.dumps(node["arguments"], ensure_ascii=False)


def transcript_messages() -> list[tuple[str, int, str]]:
    root = shared_fixture("openclaw", "zapabob-main", "sessions")
    messages = []
    for path in sorted(root.iterdir()):
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("type") == "message":
                text = "\n".join(_message_texts((entry.get("message") or {}).get("content")))
                messages.append((path.name, number, text))
    return messages


def locomo_messages() -> list[tuple[str, int, str]]:
    samples = json.loads(shared_fixture("locomo", "locomo10-dev.json").read_text(encoding="utf-8"))
    messages = []
    for sample in samples:
        for name, session in sample["conversation"].items():
            if name.startswith("session_") and isinstance(session, list):
                for number, turn in enumerate(session, 1):
                    text = turn.get("text", "")
                    if turn.get("blip_caption"):
                        text += "\n" + turn["blip_caption"]
                    messages.append((f"{sample['sample_id']}/{name}", number, text))
    return messages


def test_precision_on_real_transcripts_and_conversations() -> None:
    messages = transcript_messages() + locomo_messages()
    false_positives: list[str] = []
    true_found: set[tuple[str, int, str]] = set()
    for where, number, text in messages:
        for match in detect(text):
            ident = (where, number, fingerprint(match.value, AUDIT_KEY))
            if ident in FIXTURE_SECRETS:
                true_found.add(ident)
                continue
            context = text[max(0, match.start - 60) : match.start] + "<<<" + text[match.start : match.end] + ">>>"
            false_positives.append(f"FP {where}:{number} {match.rule}: {context[-200:]!r}")
    for line in false_positives:
        print(line)
    allowed = len(messages) / 2000
    print(f"{len(false_positives)} false positives in {len(messages)} messages (allowed {allowed:.2f})")
    assert len(messages) > 3000
    assert len(false_positives) <= allowed
    assert true_found == FIXTURE_SECRETS  # and the real credentials in there are all caught


def test_real_fixture_credentials_leave_no_trace_after_redaction() -> None:
    for _where, _number, text in transcript_messages():
        result = redact.redact(text, KEY)
        for match in detect(text):
            assert not leaked_pieces(match.value, result.text)


# ---------------------------------------------------------------------------------------------
# Properties

PROSE = [
    "ok",
    "好的，我看一下",
    "the password is required",
    "密码是什么？",
    "token: see above",
    "here is the key",
    "Let me check the config.",
    "```bash\nls -la\n```",
    '{"enabled": true}',
    "export PATH=/usr/bin",
    "https://example.com/docs?page=2",
    "key 是",
    "密钥：",
    "Authorization:",
    "password:",
    "我的 token 是",
    "明天下午三点开会",
    "I'll deploy it tonight",
    "| a | b |",
    "see `config.yaml`",
]
SEPARATORS = [" ", "\n", "，", "：", ": ", " `", "` ", "（", "）", "\n\n", " = ", "=", "\t"]
PROVIDER_KINDS = [k for k in KINDS if k.provider and not k.context]


@st.composite
def chat_with_secrets(draw: st.DrawFn) -> tuple[str, list[str]]:
    parts: list[str] = []
    planted: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            kind = draw(st.sampled_from(PROVIDER_KINDS))
            value = kind.make(random.Random(draw(st.integers(0, 2**32))))
            parts.append(kind.wrap(value) if kind.wrap else value)
            planted.append(value)
        else:
            parts.append(draw(st.sampled_from(PROSE)))
        parts.append(draw(st.sampled_from(SEPARATORS)))
    return "".join(parts), planted


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_redact_never_raises_and_is_idempotent_on_any_text(text: str) -> None:
    result = redact.redact(text, KEY)
    again = redact.redact(result.text, KEY)
    assert again.findings == () and again.text == result.text
    for finding in result.findings:
        assert 0 <= finding.start < finding.end <= len(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_with_secrets())
def test_planted_secrets_never_leak(sample: tuple[str, list[str]]) -> None:
    text, planted = sample
    result = redact.redact(text, KEY)
    for value in planted:
        assert not leaked_pieces(value, result.text), value
    for match in detect(text):
        assert not leaked_pieces(match.value, result.text), match.rule
    again = redact.redact(result.text, KEY)
    assert again.findings == () and again.text == result.text


# ---------------------------------------------------------------------------------------------
# Keys in prose with no cue word: a provider named in the same clause, or an explicit cue


def _rand(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


_LOWER_DIGITS = "abcdefghijklmnopqrstuvwxyz0123456789"


@pytest.mark.parametrize("seed", range(5))
def test_prose_keys_beside_a_provider_name(seed: int) -> None:
    rng = random.Random(seed)
    short = _rand(rng, "abcdefghjkmnpqrstuvwxyz", 6) + _rand(rng, "23456789", 3)
    short += _rand(rng, "abcdefghjkmnpqrstvwxz", 5)
    hex24 = _rand(rng, "0123456789abcdef", 24)
    long = "-".join(_rand(rng, _LOWER_DIGITS, 18) for _ in range(3))
    picked = rng.sample("bcdfghjklmnpqrstvwxz", 14)
    mixed = "".join(c.upper() if i // 2 % 2 else c for i, c in enumerate(picked))
    number = str(rng.randrange(10**17, 10**18))
    for text, value in (
        (f"for LinkedIn I'm using {short} right now", short),
        (f"Kucoin后台给的是 {hex24}，你先存一下", hex24),
        (f"Got this from the Coinbase dashboard: -{long}", f"-{long}"),
        (f"hey, Sumologic finally approved us. token: {mixed}", mixed),
        (f"I set the discord token to {number} yesterday", number),
        (f"use {number} for Asana", number),
    ):
        found = [(m.start, m.end) for m in detect(text)]
        start = text.index(value)
        assert any(s <= start and e >= start + len(value) for s, e in found), text


def test_password_cue_takes_letters_no_word_is_made_of() -> None:
    rng = random.Random(3)
    value = _rand(rng, "bcdfghjklmnpqrstvwxz", 8)
    assert [m.value for m in detect(f"hey, Nuget approved us. password: {value}")] == [value]
    assert detect("the password: required") == []
    assert detect("subprocess.Popen(args, pass_fds=pass_fds)") == []
    assert detect("a quoted word in prose (`password is 'required'`) does not count") == []
    # a word in a string literal under a password's name is the password itself (issue 13)
    assert [m.value for m in detect("password='IAmSensitive'")] == ["IAmSensitive"]


_ID_RNG = random.Random(11)
_HEX24, _HEX40 = _rand(_ID_RNG, "0123456789abcdef", 24), _rand(_ID_RNG, "0123456789abcdef", 40)
_B62 = _rand(_ID_RNG, "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789", 17)
_DISCORD_ID = str(_ID_RNG.randrange(10**17, 10**18))


@pytest.mark.parametrize(
    "text",
    [
        # ids, slugs, URLs' query values and fragments, commit ids: no credential beside a provider's name
        "See https://github.com/huggingface/huggingface_hub/pull/1855#discussion_r1404286419",
        f"Slug of the collection. E.g. `\"TheBloke/recent-models-{_HEX24}\"`",
        f'collection_slug="davanstrien/climate-{_HEX24}"',
        f"401 Client Error. (Request ID: {_B62[:4]}_{_B62})",
        f"owner=JobOwner(id='{_HEX24}', name='me')",
        f"<https://www.youtube.com/watch?v={_B62[:6]}_{_B62[6:10]}>",
        "- [flake8-no-pep420](https://pypi.org/project/flake8-no-pep420/)",
        "a corrupted `manylinux2014_aarch64` wheel ([pydantic-core#1843](https://github.com/pydantic/pydantic-core/pull/1843))",
        f"models--t5-base/snapshots/{_HEX40} (huggingface cache)",
        'UNRESERVED = "' + "".join(map(chr, range(65, 91))) + "".join(map(chr, range(97, 123))) + '0123456789-._~"',
        f"the Discord channel {_DISCORD_ID} is where the bot posts",
        f"Discord user id {_DISCORD_ID}",
        'HEADER_X_XET_ACCESS_TOKEN = "X-Xet-Access-Token"',
        "I need the token to login",
    ],
)
def test_prose_detectors_leave_ids_slugs_and_urls(text: str) -> None:
    assert detect(text) == [], [(m.rule, text[m.start : m.end]) for m in detect(text)]


def test_a_connection_strings_first_field_after_a_cue_is_no_secret() -> None:
    """Found by test_planted_secrets_never_leak: `key 是=DefaultEndpointsProtocol=https;…` took the first field as
    a token, and its repeat without the `=` stayed in the text (a value hidden in one place, shown in another)."""
    account_key = "X1fH+ZM9TBrKrmGsNmjQ8mT3OA94HhblZa/QFPiyCEs5lkO+nMLpQAK4lXOELxyxeH8ilqtekYJEB1J5/TkPo+=="
    conn = (f"DefaultEndpointsProtocol=https;AccountName=prodfiles;AccountKey={account_key};"
            "EndpointSuffix=core.windows.net")
    for text in (f"key 是={conn} ok {conn} ", f"key: {conn}", f"密钥： `{conn} ok {conn} "):
        assert {m.value for m in detect(text)} == {account_key}, [(m.rule, m.value) for m in detect(text)]
        assert account_key[:12] not in redact.redact(text, KEY).text


def test_a_stripe_webhook_secret_ends_where_base64_does() -> None:
    """Found by test_planted_secrets_never_leak: `=` inside the key's class took `=ok=Authorization` with it."""
    text = "whsec_2yW4Acq9GFz6Y1t9EwL56nGisiWgNZq6=ok=Authorization: Authorization: "
    key = "whsec_2yW4Acq9GFz6Y1t9EwL56nGisiWgNZq6"
    assert [(m.rule, m.value) for m in detect(text)] == [("stripe_webhook_secret", key)]


# Issue 37, finding 3: the shapes people paste keys and passwords in that were missed. A key as the basic-auth user
# (how Stripe, Mailgun, Recurly and Freshdesk document theirs), a password after a CJK, Japanese or Korean cue with
# no punctuation, a key as a URL's user part, an API key as a `key=` query parameter.
_KEY = "9f8e7d6c5b4a3928" + "1706f5e4d3c2b1a0"
_MAILGUN = "key-3ax6xnjp29jd6fds" + "4gc373sgvjxteol0"
PASTED_SHAPES = [
    (f"curl -u {_KEY}: https://api.example.com/v1/charges", _KEY),
    (f"curl https://api.mailgun.net/v3/domains -u {_MAILGUN}:", _MAILGUN),
    (f"curl --user {_KEY}: https://api.example.com/v1/items", _KEY),
    (f"curl -X POST --user={_KEY}: https://api.example.com/v1/send", _KEY),
    (f"curl -u {_KEY}:X https://acme.freshdesk.com/api/v2/tickets", _KEY),
    (f"curl -u {_KEY}:Pw9xQ2mLk7vBn4 https://api.example.com/v1/things", f"{_KEY}:Pw9xQ2mLk7vBn4"),
    (f"cache at redis://{_KEY}:Pw9xQ2mLk7vBn4@cache.example.com:6379/0", f"{_KEY}:Pw9xQ2mLk7vBn4"),
    (f"GET https://maps.example.com/api/geocode/json?address=Paris&key={_KEY}", _KEY),
    ("账号 admin 密码 Sapphire-Kettle-4417!", "Sapphire-Kettle-4417!"),
    ("wifi 密码 Hunter2Mango77", "Hunter2Mango77"),
    ("アカウント admin パスワード Quartz88Meadow!x", "Quartz88Meadow!x"),
    ("비밀번호 Tr0ub4dor&3x", "Tr0ub4dor&3x"),
    ("와이파이 비밀번호는 Hunter2Mango77 입니다", "Hunter2Mango77"),
]


@pytest.mark.parametrize(("text", "secret"), PASTED_SHAPES)
def test_the_shapes_people_paste_are_hidden_whole(text: str, secret: str) -> None:
    start = text.index(secret)
    assert covering(detect(text), start, start + len(secret)), (text, detect(text))
    assert secret not in redact.redact(text, KEY).text


@pytest.mark.parametrize("text", [
    "curl -u AKIAIOSFODNN7EXAMPLE: https://example.com",  # documented example keys stay visible
    "curl -u admin: https://localhost:8080/api",  # a user with an empty password is no key
    "curl -u \"$API_KEY:\" https://api.example.com/v1",
    "https://cdn.example.com/list?sort=asc&key=createdAt",
    "비밀번호를 변경했습니다",
    "암호화 설정 완료",
])
def test_the_same_shapes_without_a_secret_are_left_alone(text: str) -> None:
    assert detect(text) == [], [(m.rule, m.value) for m in detect(text)]


def test_a_basic_auth_key_is_named_by_the_provider_the_command_calls() -> None:
    """`curl -u KEY: https://api.mailgun.net/…`: the host names the service (the key itself never names anything)."""
    for text, service in ((f"curl https://api.mailgun.net/v3/domains -u {_MAILGUN}:", "Mailgun"),
                          (f"curl -s -u {_KEY}: \\\n  https://api.stripe.com/v1/customers", "Stripe"),
                          (f"curl -u {_KEY}: https://x.example.com/v1\nsee https://api.stripe.com", "Unknown")):
        (match,) = detect(text)
        assert (match.service, match.key_name) == (service, "key (curl -u)"), text
