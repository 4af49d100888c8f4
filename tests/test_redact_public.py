"""Credential detection on secrets nobody here wrote, and on the shapes and providers of issue 13.

Recall is measured on three corpora built by tests/secret_corpus_public.py from public scanners' rule
samples placed in chat contexts: gitleaks' (the tuning set), Nosey Parker's (the second set: no rule
was fitted to its samples, but its misses were read to choose general detectors; its figure is a
regression floor, not a blind result) and TruffleHog's detector tests (the third set: measured blind
first, docs/benchmarks.md; its misses then read the same way, so its floor is no longer a blind figure). A secret
counts as caught only if one redacted span covers all of it. False positives on ordinary chat: tests/test_redact.py.
"""

from __future__ import annotations

import base64
import random
import re
import string
import uuid
from functools import cache

import pytest

from tests.secret_corpus_public import (
    CORPORA,
    SHAPES,
    Placed,
    Recall,
    build_corpus,
    by_context,
    caught,
    code_line_corpus,
    documented_examples,
    file_paragraphs,
    measure,
    negatives,
    positives,
)
from veritas_watch.transforms import redact
from veritas_watch.transforms.redact import detect

KEY = b"test-fingerprint-key-0123456789ab"


def spans(text: str) -> list[tuple[int, int]]:
    return [(m.start, m.end) for m in detect(text)]


@cache
def corpus(name: str) -> tuple[Placed, ...]:
    return tuple(build_corpus(name))


@cache
def recall(name: str) -> Recall:
    return measure(list(corpus(name)), spans)


def report(name: str, result: Recall) -> None:
    print(f"\n{name}: recall {result.overall.recall:.4f} ({result.overall.found}/{result.overall.total})")
    for title, table in (("family", result.by_family), ("shape", result.by_shape)):
        for key, tally in sorted(table.items()):
            print(f"  {title} {key:14} {tally.recall:.4f}  {tally.found}/{tally.total}")
    for placed, how in result.misses[:40]:
        print(f"  {how.upper()} {placed.sample.rule} [{placed.shape}] {placed.text[:140]!r}")


# ---------------------------------------------------------------------------------------------
# The corpora


def test_the_corpora_cover_the_scanners_rule_sets() -> None:
    for name, rules, secrets in (("gitleaks", 210, 1800), ("noseyparker", 140, 1400), ("trufflehog", 800, 1000),
                                 ("kingfisher", 450, 2200)):
        samples = positives(name)
        assert len({s.rule for s in samples}) >= rules, name
        assert len(samples) >= secrets, name
        placed = corpus(name)
        assert {p.shape for p in placed} == set(SHAPES), name
        for p in placed:
            assert p.text[p.start : p.end] in (p.sample.secret, p.sample.secret.replace("\\", "\\\\")) or (
                p.shape == "json"
            ), (name, p.sample.rule, p.shape)


def test_recall_on_the_tuning_corpus_gitleaks() -> None:
    result = recall("gitleaks")
    report("gitleaks", result)
    assert result.overall.total >= 7000
    assert result.overall.recall >= 0.98
    for shape, tally in result.by_shape.items():
        assert tally.recall >= 0.95, shape
    partial = [p for p, how in result.misses if how == "partial"]
    assert len(partial) <= 0.001 * result.overall.total  # a sample's own stray character, at most


def test_recall_on_the_held_out_corpus_noseyparker() -> None:
    """The second set (misses read, no rule fitted to it): the floor guards against regressions (docs/benchmarks.md)."""
    result = recall("noseyparker")
    report("noseyparker", result)
    assert result.overall.total >= 5500
    assert result.overall.recall >= 0.985  # (0.978 before the chat, curl and URL pass of issue 37)
    for shape, tally in result.by_shape.items():
        # the example texts' misses are mostly documented placeholders (`Password=secret;`), kept visible
        assert tally.recall >= (0.93 if shape == "example" else 0.95), shape
    partial = [p for p, how in result.misses if how == "partial"]
    assert len(partial) <= 0.001 * result.overall.total


def test_recall_on_the_third_corpus_trufflehog() -> None:
    """TruffleHog's detector tests (blind 93.86% before its misses were read; docs/benchmarks.md): a floor."""
    result = recall("trufflehog")
    report("trufflehog", result)
    assert result.overall.total >= 5400
    assert len({s.rule.split(":")[0] for s in positives("trufflehog")}) >= 800
    assert result.overall.recall >= 0.985  # (0.978 before the chat, curl and URL pass of issue 37)
    floors = {"en": 0.965, "example": 0.97, "json": 0.99, "code": 0.99, "env": 0.99, "shell": 0.99, "zh": 0.99,
              "curl": 0.985, "url": 0.99}
    for shape, tally in result.by_shape.items():
        assert tally.recall >= floors[shape], shape
    partial = [p for p, how in result.misses if how == "partial"]
    assert len(partial) <= 0.004 * result.overall.total  # printable 90-character values cut at a quote


def test_recall_on_the_fourth_corpus_kingfisher() -> None:
    """Kingfisher's rule examples (blind 90.83% with the first builder, 96.49% once the builder knew its
    placeholders and identifiers, before any detector change; 98.06% after two passes over its misses;
    docs/benchmarks.md): a regression floor."""
    result = recall("kingfisher")
    report("kingfisher", result)
    assert result.overall.total >= 10000
    assert result.overall.recall >= 0.98  # (0.975 before the chat, curl and URL pass of issue 37)
    floors = {"en": 0.955, "example": 0.91, "json": 0.985, "code": 0.98, "env": 0.985, "shell": 0.99, "zh": 0.985,
              "curl": 0.985, "url": 0.99}
    for shape, tally in result.by_shape.items():
        assert tally.recall >= floors[shape], shape
    partial = [p for p, how in result.misses if how == "partial"]
    assert len(partial) <= 0.003 * result.overall.total


def test_recall_on_the_sixth_corpus_secretlint() -> None:
    """secretlint's rule snapshot tests and values from its rules' regexes (blind 99.33%, the misses then read:
    a placeholder password kept visible on purpose, a short cue-less password, a bare wallet key; docs/benchmarks.md):
    a regression floor."""
    result = recall("secretlint")
    report("secretlint", result)
    assert result.overall.total >= 1000
    assert len({s.rule.split(":")[0] for s in positives("secretlint")}) >= 25  # rule packages
    assert result.overall.recall >= 0.985  # (0.99 before the curl and URL shapes joined the corpus, issue 37)
    for shape, tally in result.by_shape.items():
        assert tally.recall >= 0.95, shape
    assert not [p for p, how in result.misses if how == "partial"]


@pytest.mark.parametrize("name", CORPORA)
def test_recall_in_the_six_contexts_people_paste_secrets_in(name: str) -> None:
    """Issue 37: >= 98% overall and >= 95% in each of the six contexts (a chat sentence, a code block, a `.env`
    line, JSON config, a curl command, a URL parameter), every scanner's secrets. The curl and URL shapes were
    tuned on gitleaks and Nosey Parker only (their misses read); TruffleHog's, Kingfisher's and secretlint's
    figures for them are held out (measured, misses not read). Before: curl 38-77%."""
    result = recall(name)
    contexts = by_context(result)
    found, total = sum(t.found for t in contexts.values()), sum(t.total for t in contexts.values())
    print(f"\n{name}: six contexts {found / total:.4f} ({found}/{total}); "
          + "  ".join(f"{c} {t.recall:.4f}" for c, t in contexts.items()))
    assert set(contexts) == {"chat", "code", "env", "json", "curl", "url"}
    assert found / total >= 0.98
    for context, tally in contexts.items():
        assert tally.total >= 100 and tally.recall >= 0.95, context


def test_recall_on_the_held_out_semgrep_set() -> None:
    """semgrep-rules' own secret rules (issue 37), measured blind once with the curl and URL shapes in place: six
    contexts 95.5% (chat 92.3%, code 98.7%, env 97.4%, JSON 98.7%, curl 94.7%, URL 92.1%). Its misses read
    afterwards are mostly what its samples call the secret: Teams webhook URLs cut before their
    `@…/IncomingWebhook/…` part, Braintree tokens with the `access_token$` word, unsigned JWTs (two parts),
    Google OAuth client ids (public), a low-entropy SonarQube example. The general detectors that followed
    (a JWT its header proves, webhook URLs with a token in their path, long keys as curl's user, URL query
    parameters named as secrets) took it to 98.9% (chat 97.4%, code, env and JSON 100%, curl 98.7%, URL 97.4%):
    no longer a blind figure, a regression floor."""
    result = recall("semgrep")
    contexts = by_context(result)
    found, total = sum(t.found for t in contexts.values()), sum(t.total for t in contexts.values())
    assert total >= 550 and found / total >= 0.985
    floors = {"chat": 0.97, "code": 0.99, "env": 0.99, "json": 0.99, "curl": 0.98, "url": 0.97}
    for context, tally in contexts.items():
        assert tally.recall >= floors[context], context


def test_recall_on_the_held_out_secrets_patterns_db_set() -> None:
    """secrets-patterns-db's high-confidence rules (issue 37; values generated from their regexes), measured blind
    before the chat, curl and URL pass: six contexts 96.64% (chat 95.2%, code 97.3%, env 97.8%, JSON 97.3%,
    curl 94.6%, URL 97.9%); after it, its misses still unread: 97.9% (chat 96.3%, code 98.2%, env 98.7%,
    JSON 98.2%, curl 98.5%, URL 98.8%). A regression floor at that figure."""
    result = recall("spdb")
    contexts = by_context(result)
    found, total = sum(t.found for t in contexts.values()), sum(t.total for t in contexts.values())
    assert len({s.rule for s in positives("spdb")}) >= 200
    assert total >= 2500 and found / total >= 0.979
    floors = {"chat": 0.96, "code": 0.98, "env": 0.985, "json": 0.98, "curl": 0.985, "url": 0.985}
    for context, tally in contexts.items():
        assert tally.recall >= floors[context], context


def test_recall_on_the_fifth_set_detect_secrets_code_lines() -> None:
    """detect-secrets' keyword-test lines with generated values (blind 70.70% before its misses were read,
    90.62% after; docs/benchmarks.md). Left missed on purpose: `secrete` is an English verb, not a secret's name."""
    placed = code_line_corpus()
    result = measure(placed, spans)
    report("detect-secrets code lines", result)
    assert result.overall.total >= 250 and len(result.by_shape) == 5
    assert result.overall.recall >= 0.90
    assert result.by_family["random_key"].recall == 1.0
    for kind in ("hex_key", "printable", "chosen_password"):
        assert result.by_family[kind].recall >= 0.8, kind
    missed = [p for p, _ in result.misses if "secrete" not in p.text]
    assert len(missed) <= 8, [p.text for p in missed]


def test_few_findings_in_openclaw_own_docs() -> None:
    """The installed OpenClaw's `docs/` read as chat, paragraph by paragraph: configuration examples full of
    placeholders, ids, versions and model names, as users paste them (65 findings before they were read,
    13 after; docs/benchmarks.md). What is left: voice ids beside an alias, commit ids in a table, model names."""
    from tests.openclaw_harness import install_or_skip

    docs = install_or_skip().package / "docs"
    paragraphs = file_paragraphs(sorted(docs.rglob("*.md")), docs)
    assert len(paragraphs) > 20_000
    found = [(where, number, m.rule, paragraph[m.start:m.end][:40]) for where, number, paragraph in paragraphs
             for m in detect(paragraph)]
    assert len(found) <= 20, found


def test_the_trufflehog_builder_keeps_the_credential_of_a_combined_result() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from bench.rule_samples import _TH_FILLER_RE, _th_credential, _th_parts

    key, ident = "CwgR2UwgaWd7hgUdQkwFnK9vvEeO4R", "LTAIXgRPqwF1DhBf6Q1uZ5DrM"
    text = f"Using Key={key}\nUsing ID={ident}"
    patterns = [("keyPat", re.compile(r"\b([a-zA-Z0-9]{30})\b")),
                ("idPat", re.compile(r"\b(LTAI[a-zA-Z0-9]{17,21})\b"))]
    parts = _th_parts(key + ident, text, patterns)
    assert parts == [("keyPat", key), ("idPat", ident)]
    assert _th_credential(parts) == ("keyPat", key)
    pair = _th_parts("myuser:ATBB123abcDEF456", "creds myuser:ATBB123abcDEF456 ok",
                     [("", re.compile(r"(?P<username>\w{1,30}):(?P<password>ATBB\w+)"))])
    assert _th_credential(pair or []) == ("password", "ATBB123abcDEF456")
    account = '{"accountName":"store1","accountKey":"YutGV0Vlauqsobd5tPWz2AKw=="}'
    assert _th_credential(_th_parts(account, "name store1 key YutGV0Vlauqsobd5tPWz2AKw==", []) or []) == (
        "accountKey", "YutGV0Vlauqsobd5tPWz2AKw==")
    assert _th_credential([("key", "jdbc:mysql://host:3306/db")]) is None  # a URL without a password
    assert _th_credential([("key", "jdbc:mysql://app:s3cr3tPw@host:3306/db")]) == ("password", "s3cr3tPw")
    assert _th_credential([("key", "https://hooks.zapier.com/hooks/catch/bJdWL5uSLdrqauDu")]) is not None
    assert _th_credential([("emailPat", "kk18@example.com")]) is None
    assert _TH_FILLER_RE.search("shippo_live_1111111111111111111111111111111111111111")
    assert not _TH_FILLER_RE.search("sk-76cnJ2Ns8wHZao70KdUdlZpBuSzej8gEokToNyeSPtd1RyZB")


def test_redacting_the_corpus_leaves_no_caught_value_behind() -> None:
    for placed in corpus("gitleaks")[::7]:
        if caught(spans(placed.text), placed.start, placed.end) != "ok":
            continue
        out = redact.redact(placed.text, KEY).text
        assert placed.text[placed.start : placed.end] not in out, placed.sample.rule


def test_scanners_negative_examples_are_counted() -> None:
    """The scanners' own negatives (placeholders, near misses): printed, not asserted (several are
    real-looking keys a scanner drops for its own reasons)."""
    for name in ("gitleaks", "noseyparker"):
        found = sum(bool(detect(s.example)) for s in negatives(name))
        print(f"{name}: {found} of {len(negatives(name))} negative examples have a finding")


# ---------------------------------------------------------------------------------------------
# Documented example keys are examples, not secrets

DOCUMENTED = [
    "AKIAIOSFODNN7EXAMPLE",
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "xoxp-1-RANDOMSTRINGHERE",
    "xoxe.xoxp-1-RANDOMSTRINGHERE",
    "ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "https://hooks.slack.com/services/TXXXXXXXX/BXXXXXXXX/XXXXXXXXXXXXXXXXXXXXXXXX",
    "AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ",
]


@pytest.mark.parametrize("value", DOCUMENTED)
def test_documented_example_keys_are_not_redacted(value: str) -> None:
    for text in (
        f"the AWS docs use {value} in every example",
        f"export AWS_ACCESS_KEY_ID={value}",
        f'{{"aws_secret_access_key": "{value}"}}',
        f"文档里的示例密钥是 {value}",
    ):
        assert redact.redact(text, KEY).text == text, text


def test_the_scanners_documented_examples_are_not_redacted() -> None:
    samples = documented_examples("gitleaks") + documented_examples("noseyparker")
    assert len(samples) >= 20
    for sample in samples:
        text = f"the docs show {sample.secret} as an example"
        assert [m for m in detect(text) if m.rule != "high_entropy_token"] == [], sample.secret


# ---------------------------------------------------------------------------------------------
# Assignment shapes of the languages and config formats people paste (issue 13: recall was 31%)

VALUE = "q8Zr2LmX9vKp4TnW7yBd"  # no provider prefix: only the name can tell
CODE_SHAPES = [
    ('System.setProperty("ACME_TOKEN", "{v}")', "java setProperty"),
    ('config.put("acme.api.key", "{v}");', "java map put"),
    ('var acmeToken string = "{v}"', "go var with type"),
    ('acmeToken := "{v}"', "go short"),
    ("acmeToken := `{v}`", "go backticks"),
    ('$acmeToken .= "{v}";', "php concat"),
    ('$acmeToken = "{v}";', "php"),
    ('ACME_TOKEN ::= "{v}"', "makefile shell assignment"),
    ('ACME_TOKEN :::= "{v}"', "makefile evaluated shell assignment"),
    ('ACME_TOKEN ?= "{v}"', "makefile conditional"),
    ('ACME_TOKEN := "{v}"', "makefile simple"),
    ("ACME_TOKEN += {v}", "makefile append"),
    ("<acmeToken>{v}</acmeToken>", "xml element"),
    ("<acmeToken>\n    {v}\n</acmeToken>", "xml element multiline"),
    ('<add key="ClearTextPassword" value="{v}" />', "nuget config"),
    ('<entry name="acmeToken" value="{v}"/>', "xml key/value"),
    ('String acmeToken = "{v}";', "java"),
    ('var acmeToken: String = "{v}"', "kotlin typed"),
    ('const acmeToken = "{v}";', "js"),
    ("acme_token = '{v}'", "python"),
    ('  "acmeToken" => "{v}"', "logstash / ruby hash"),
    ("acme:\n  api_key: {v}\n", "yaml"),
    ('[acme]\ntoken = "{v}"', "toml"),
    ("[acme]\napi_key={v}", "ini"),
    ('provider "acme" {{\n  token = "{v}"\n}}', "hcl"),
    ("ACME_API_KEY={v}\nLOG_LEVEL=debug", ".env"),
    ("export ACME_API_KEY={v}", "shell export"),
    ('{{"acme_api_key": "{v}"}}', "json"),
    ('{{"config.ini": "ACME_TOKEN={v}\\nBACKUP=true"}}', "json escaped newline"),
    ("acme_token || '{v}'", "js default"),
    ('client = Acme(api_key="{v}")', "keyword argument"),
]


@pytest.mark.parametrize(("template", "shape"), CODE_SHAPES, ids=[s for _, s in CODE_SHAPES])
def test_assignment_shapes_hide_the_whole_value(template: str, shape: str) -> None:
    text = template.replace("{{", "{").replace("}}", "}").replace("{v}", VALUE)
    start = text.index(VALUE)
    assert caught(spans(text), start, start + len(VALUE)) == "ok", (shape, detect(text))
    assert VALUE not in redact.redact(text, KEY).text


CODE_NOT_SECRETS = [
    'System.setProperty("ACME_TOKEN", System.getenv("X"))',
    "var acmeToken string = os.Getenv(\"ACME_TOKEN\")",
    "$acmeToken .= $suffix;",
    "ACME_TOKEN ?= $(shell cat token.txt)",
    "<acmeToken>${ACME_TOKEN}</acmeToken>",
    "<apiKey>your-api-key-here</apiKey>",
    'password: "changeme"',
    "token := getToken(ctx)",
    "maxTokens := 4096",
    "<tokenCount>12</tokenCount>",
]


def assert_left_alone(text: str) -> None:
    assert detect(text) == [], [(m.rule, m.value) for m in detect(text)]


# ---------------------------------------------------------------------------------------------
# Providers issue 13 lists as missed whole or in part (every value must be covered by one span)

PROVIDERS = [
    ("age secret key", "AGE-SECRET-KEY-1QL2W3E4R5T6Y7U8I9O0PASDFGHJKLZXCVBNM2345678QWERTYUASDFGH9UP",
     "my age identity is {v}"),
    ("discord client secret", "kF3mZ9qL2xR7vT1wN8bY5cJ0hD4gS6pA", "DISCORD_CLIENT_SECRET={v}"),
    ("slack webhook (services)",
     "https://hooks.slack.com/services/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", "post to {v} please"),
    ("slack webhook (workflows)",
     "https://hooks.slack.com/workflows/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",
     "新的 webhook：{v}"),
    ("slack legacy workspace token", "xoxr-6fD9T8oUDpTR92luziCcOE14sCW8", "legacy token {v}"),
    ("slack configuration token",
     "xoxe.xoxp-1-Mi0yLTM0MTQwNDE0MDE3Ni0zNjU5NDY0Njg4MTctNTE4MjA3NTQ5NjA4MC01NDEyOTYyODY5NzUxLThhMTBjZmI1ZWIzMGIw"
     "NTg0ZDdmMDI5Y2UxNzVlZWVhYzU2ZWQyZTZiODNjNDZiMGUxMzRlNmNjNDEwYmQxMjQ", "config token: {v}"),
    ("kubernetes secret yaml data", "UzNjcjN0UGFzc3dvcmQ5OQ==",
     "```yaml\napiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ntype: Opaque\ndata:\n  password: {v}\n```"),
    ("1password secret key", "A3-FR4QZQ-YSJBAV-65QCD-GIRDY-OP9GL-M2F8X", "my 1Password secret key {v}"),
    ("1password service account token",
     "ops_eyJzaWduSW5BZGRyZXNzIjoibXkuMXBhc3N3b3JkLmNvbSIsInVzZXJBdXRoIjp7Im1ldGhvZCI6IlNSUGctNDA5NiIsImFsZyI6IlBC"
     "RVMyZy1IUzI1NiIsIml0ZXJhdGlvbnMiOjY1MDAwMCwic2FsdCI6IkRmUG1oMjNvRzZjaHJyVmJKeWpqQkEifSwiZW1haWwiOiJ4",
     "export OP_SERVICE_ACCOUNT_TOKEN={v}"),
    ("nuget config password", "Pr0d-Feed!Pass2024",
     '<packageSourceCredentials>\n  <feed>\n    <add key="ClearTextPassword" value="{v}" />'),
    ("curl -u user:password", "deploy:Qo3j9V98TAgdB6", "curl -u {v} https://api.example.com/v1"),
    ("curl --user quoted", "api:d2LkV78zLx!t", "curl -s --user '{v}' https://api.mailgun.net/v3"),
    ("sourcegraph token without a cue", "sgp_1a2b3c4d5e6f7a8b_0123456789abcdef0123456789abcdef01234567",
     "here you go {v}"),
    ("sourcegraph token, short form", "sgp_0123456789abcdef0123456789abcdef01234567", "{v}"),
    ("teams webhook",
     "https://acme.webhook.office.com/webhookb2/3f2a6b1c-1d2e-4f5a-8b9c-0d1e2f3a4b5c@7a8b9c0d-1e2f-4a5b-8c9d-0e1f2a3b4c5d"
     "/IncomingWebhook/0123456789abcdef0123456789abcdef/9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a",
     "Teams 通知地址 {v}"),
    ("jwt with backslash-escaped slashes",
     "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwidXJsIjoiaHR0cHM6XC9cL2V4YW1wbGUuY29tIn0\\/x.SflKxwRJSMeKKF2QT4"
     "fwpMeJf36POk6yJV\\/adQssw5c", '{{"token": "{v}"}}'),
    ("unsigned jwt", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ0ZXN0LXVzZXIiLCJhZG1pbiI6dHJ1ZX0.", "token {v} ok"),
    ("url password with #", "deploy:Qo3j9V#98TAgdB6", "postgres://{v}@db:5432/app"),
    ("url password with @ and ?", "admin:p@ss?w0rd!9", "redis://{v}@cache.internal:6379/0"),
    ("bare high-entropy key", "Zq8vN2kLmP4xR7tY1wB5cD9fG3hJ6",
     "ok so {v} is what they gave me"),
    ("bare key named by its provider", "65iekx9l8d3xt02lohc08kpbmv06u8lu", "the bot needs {v} to talk to Algolia"),
    ("value before its cue", "m37lz803rm2jllha7jx8dgzm28oposnuevr1bjcw", "Use {v} as the secret, thanks."),
    ("netrc", "s3cr3tPass9x", "machine api.example.com\nlogin bob\npassword {v}"),
    ("NetworkCredential", "Qo3j9V98!TAgdB6x", 'new NetworkCredential("admin", "{v}")'),
    ("mysql -p", "Qo3j9V98TAgdB6x", "mysql -u root -p{v} shop"),
    ("psexec -p", "Qo3j9V98TAgdB6x", "psexec \\\\srv -u admin -p {v} cmd.exe"),
    ("digit-only client id", "792126801425713628", "DISCORD_CLIENT_ID_TOKEN={v}"),
]


def assert_hidden_whole(label: str, value: str, template: str) -> None:
    text = template.replace("{{", "{").replace("}}", "}").replace("{v}", value)
    start = text.index(value)
    assert caught(spans(text), start, start + len(value)) == "ok", (label, [(m.rule, m.value) for m in detect(text)])
    out = redact.redact(text, KEY).text
    assert value not in out
    assert not re.search(re.escape(value[-8:]) + "|" + re.escape(value[:10]), out), out


# ---------------------------------------------------------------------------------------------
# Over-redaction issue 13 lists


def test_an_empty_setting_does_not_take_the_next_line() -> None:
    text = (
        "snowflake.user=etl\nsnowflake.password=\njdbc.snowflake.url=jdbc:snowflake://acme.snowflakecomputing.com/"
        "?db=prod\nsnowflake.role=LOADER"
    )
    assert detect(text) == []
    text = "password:\n  url: https://example.com\n"
    assert detect(text) == []


def test_a_value_on_the_next_line_is_still_found() -> None:
    text = "the new password is\nHunter2024!x"
    (match,) = detect(text)
    assert match.value == "Hunter2024!x"


def test_url_credentials_keep_the_host_and_path_visible() -> None:
    text = "DATABASE_URL=postgres://deploy:Qo3j9V#98TAgdB6@db.internal:5432/app?sslmode=require"
    out = redact.redact(text, KEY).text
    assert out.startswith("DATABASE_URL=postgres://[REDACTED:")
    assert out.endswith("@db.internal:5432/app?sslmode=require")
    (match,) = detect(text)
    assert match.value == "Qo3j9V#98TAgdB6"  # the vault gets the password
    assert match.key_name == "deploy@db.internal"


# ---------------------------------------------------------------------------------------------
# Formats and contexts added after measuring the public corpora. The values are built here at
# random (seeded) from each provider's published format: no key-shaped literal in the source.

_RNG = random.Random(13)
_ALNUM = string.ascii_letters + string.digits


def _rand(n: int, alphabet: str = _ALNUM) -> str:
    return "".join(_RNG.choice(alphabet) for _ in range(n))


def _uuid() -> str:
    return str(uuid.UUID(int=_RNG.getrandbits(128)))


def _key_body(kind: str, lines: int = 12) -> list[str]:
    """The base64 body of a private key (random bytes behind the real header), in 64-column lines."""
    if kind == "openssh":
        raw = b"openssh-key-v1\x00" + _RNG.randbytes(48 * lines)
    elif kind == "pkcs8":
        raw = b"\x30\x82\x04\xbe\x02\x01\x00\x30\x0d\x06\x09" + _RNG.randbytes(48 * lines)
    else:  # SEC1 EC key: SEQUENCE (short length), INTEGER 1
        raw = b"\x30\x77\x02\x01\x01\x04\x20" + _RNG.randbytes(112)
    body = base64.b64encode(raw).decode()
    return [body[i : i + 64] for i in range(0, len(body), 64)]


DJANGO_ALPHABET = string.ascii_lowercase + string.digits + "!@#$%^&*(-_=+)"
MORE_PROVIDERS = [
    ("teams webhook, outlook.office.com form",
     f"https://outlook.office.com/webhook/{_uuid()}@{_uuid()}/IncomingWebhook/{_rand(32, '0123456789abcdef')}"
     f"/{_uuid()}", "the Teams hook is {v} for alerts"),
    ("django insecure secret key", "django-insecure-" + _rand(50, DJANGO_ALPHABET), "SECRET_KEY = '{v}'"),
    ("django key in chinese prose", "django-insecure-" + _rand(50, DJANGO_ALPHABET),
     "新的 Django secret：{v}（旧的已经作废）"),
    ("doppler service token with its environment", "dp.st.dev." + _rand(43), "ok so {v} is what Doppler gave me"),
    ("doppler personal token", "dp.pt." + _rand(43), "export DOPPLER_TOKEN={v}"),
    ("vault batch token before 1.10", "b." + _rand(40, _ALNUM + "_-"), "ok so {v} is what Hashicorp gave me"),
    ("telegram bot token without a cue", f"{_RNG.randrange(10**9, 10**10)}:AA{_rand(32, _ALNUM + '_-')}",
     "ok so {v} is what Telegram gave me"),
    ("slack legacy workspace token, mostly digits",
     f"xoxa-2-{_RNG.randrange(10**8, 10**9)}-{_RNG.randrange(10**10, 10**11)}-{_RNG.randrange(10**12, 10**13)}-"
     f"{_rand(20, '0123456789abcdef')}", '$slackToken .= "{v}"'),
    ("aws secret after its value", _rand(40, _ALNUM + "/+"), "ok so {v} is what Aws gave me, don't share it"),
    ("key on the line after 'X token:'", _rand(36), "Mapbox token:\n{v}\nthat's all"),
    ("40-hex key named by a provider", _rand(40, "0123456789abcdef"), "the bot needs {v} to talk to Datadog."),
    ("jwt secret with a symbol", "development#product", "JWT_SECRET={v}"),
    ("jwt secret with a symbol, in prose", "staging!harbor9", "Here is the Jwt secret for the deploy: {v}"),
    ("password ending in a symbol", "Prestigitariu$", "my password is {v}"),
    ("curl -u with # in the password", "deploy:Qo3#j9V" + _rand(6), "curl -u {v} https://api.example.com/v1"),
    ("url password with # (mongodb+srv)", "app:" + _rand(6) + "#" + _rand(8), "mongodb+srv://{v}@cluster0.example.net/db"),
    ("openssh private key body, no armor", "\n".join(_key_body("openssh")), "my key:\n{v}\nthanks"),
    ("pkcs8 private key body, JSON-escaped", "\\n".join(_key_body("pkcs8")), '{{"private_key": "{v}"}}'),
    ("pkcs8 private key body, concatenated strings", '" +\n  "'.join(_key_body("pkcs8")), 'String k = "{v}";'),
    ("ec private key body on one line", "".join(_key_body("ec")), "ssh key {v}"),
]


def _certificate_body() -> list[str]:
    # a certificate: SEQUENCE { SEQUENCE tbsCertificate ... }, public, not a key
    body = base64.b64encode(b"\x30\x82\x03\x10\x30\x82\x02\xb8\xa0\x03\x02\x01\x02" + _RNG.randbytes(600)).decode()
    return [body[i : i + 64] for i in range(0, len(body), 64)]


NOT_SECRETS_NEAR_PROVIDERS = [
    "I'm currently on `openai-codex/gpt-5.4` with the OpenAI provider",
    f"I pushed {_rand(40, '0123456789abcdef')} to GitHub this morning",
    f"the Datadog agent reported commit {_rand(40, '0123456789abcdef')} as deployed",
    "see docs.djangoproject.com/en/5.1/howto/deployment/checklist for Django settings",
    "the Slack bot uses os.path.join and config.api_v2 to build paths",
]


@pytest.mark.parametrize("glued", ["=https://example.com/docs?page=2 ", "==", "\nthanks"])
def test_a_key_body_ends_where_base64_does_even_with_text_glued_on(glued: str) -> None:
    body = "\n".join(_key_body("openssh", 4))
    out = redact.redact(body + glued, KEY).text
    assert all(line not in out for line in body.splitlines()), out  # its last line was left out before


def test_a_certificate_body_is_not_taken_for_a_private_key() -> None:
    text = "the cert:\n" + "\n".join(_certificate_body())
    assert [m for m in detect(text) if m.rule == "private_key_body"] == []


# ---------------------------------------------------------------------------------------------
# Shapes added after the second measurement: generated secrets drawn from every printable character,
# word-built passwords under an explicit password name, `.env` values with punctuation, comparisons
# with a literal, connection-string fields, Chinese-set-off values, bare generated passwords.

_PRINTABLE = "".join(c for c in string.printable if not c.isspace())


def _printable_secret(n: int = 20) -> str:
    """A random printable secret of the kind JWT HMAC secrets are generated as (all four classes)."""
    while True:
        value = _rand(n, _PRINTABLE)
        if (any(c.islower() for c in value) and any(c.isupper() for c in value) and any(c.isdigit() for c in value)
                and sum(c in "!#$%&*+;<>?@^|~" for c in value) >= 2 and not re.search(r"[a-z]-[a-z]|[A-Z]-[A-Z]|0-9|"
                                                                                       r"\\[a-zA-Z]|[{}$%]|=>|->|::",
                                                                                       value)):
            return value


_QUOTE_FREE = _printable_secret().replace('"', "!").replace("'", "#").replace("`", "~")
PRINTABLE_SHAPES = [
    ("yaml jwtsecret, double quotes", 'oauthproviders:\n  jwtsecret: "{v}"\n'),
    ("spring jwt: secret:", "jwt:\n  secret: '{v}'\n  ttl: 640000\n"),
    ("go const", 'const jwtSecret = "{v}"'),
    ("env file line", "NODE_ENV=production\nJWT_SECRET={v}\nLOG_LEVEL=debug"),
    ("docker -e", "docker run -e JWT_SECRET={v} -p 8080:8080 app"),
    ("json", '{{"jwt_secret": "{v}"}}'),
    ("prose after a secret cue", "Jwt 的 secret 是 {v} 别弄丢了"),
    ("password cue in english", "my Mongo api password is {v} - please keep it safe"),
]


WORD_PASSWORDS = [
    ("quoted in code", "centipede", 'String dbPassword = "{v}";'),
    ("json", "open_sesame", '{{"password": "{v}", "enabled": true}}'),
    ("yaml line", "blooberry", "smtp:\n  password: {v}\n  port: 587"),
    ("ini section", "open_sesame", "[support]\nusername = bob\npassword = {v}\n"),
    ("xml element", "centipede", "<dbPassword>{v}</dbPassword>"),
    ("env secret", "logmein", "GENERIC_SECRET={v}"),
    ("comparison with a literal", "team10", 'if username == "jojoba" and password == "{v}":'),
    ("go comparison, secret field", "open-sesame", 'if creds.Secret != "{v}" {{\n  return\n}}'),
    ("chinese colon", "whiteduke", "这是React的密码：{v}，帮我配置一下"),
    ("chinese 是", "goodspec", "Odbc 的 password 是 {v} 别弄丢了"),
    ("letters in no word's shape", "Zxcvbnm", "my Mongo api password is {v} - please keep it safe"),
]


ENV_VALUES = [
    ("comma and tilde", "Zv7iGbG,qHX~8XXc0q+oAYH", "POSTGRES_PASSWORD={v}\nREGION=us-east-1"),
    ("ampersand is no query separator here", "QeazZe4ppVbrZ&R=tfZD0zpVk", "export POSTGRES_PASSWORD={v}"),
    ("trailing question marks", "1qay@WXS????", "GENERIC_PASSWORD={v}\nREGION=us-east-1"),
    ("trailing dot", "k_6ZKq5f5X&=-.", "NODE_ENV=production\nGENERIC_TOKEN={v}\nLOG_LEVEL=debug"),
    (".env inside a JSON string", "FDfUfoPn5~&lb6=%-", '{{"config.ini": "GENERIC_PASSWORD={v}\\nBACKUP=true"}}'),
    ("connection string field", "#gets0m3", "Server=db,1433;User ID=b2b;Password={v};Trusted_Connection=False"),
    ("teamcity token", "eyJ0eXAiOiAiVENWMiJ9." + _rand(36, _ALNUM + "-_") + "." + _rand(48, _ALNUM + "-_"),
     "ok so {v} is what the CI gave me"),
    ("kubernetes bootstrap token", _rand(6, "abcdef0123456789") + "." + _rand(16, "abcdef0123456789"),
     '{{"kubernetes_token": "{v}"}}'),
    ("directoryentry over lines", "Rrhh1234", 'new DirectoryEntry("LDAP://corp",\n    "ADMIN@corp",\n    "{v}");'),
    ("bare generated password", "LK@au9j*xb*rDrV!k6ngDh7Kem90", "ok so {v} is what they gave me"),
]


NOT_PASSWORDS = [
    'password = "password_input"',
    "password: bytes",
    'fields = ("login", "password", "encoding")',
    "password = hashed_value",
    'if password == confirm_password:',
    'SOME_PASSWORD_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789!@#$"',
    "const topLevelWebhookSecretActive = !surface.channelEnabled",
    'TOKEN_RE = "[A-Za-z0-9]{32}"',
    "format_key1 = self.LOG_FORMAT_MAP[atom[0]]",
    "if sock.family in (socket.AF_INET, socket.AF_INET6):",
    "Parameters<typeof handleLineWebhookEvents>[1]",
    "Requires-Dist: PySocks!=1.5.7,>=1.5.6",
    ".. |Screenshot-Jupyter1| image:: https://example.com/a.gif",
    "TextGenerationStreamOutput(token=TokenElement(id=3426, text='x'))",
    "root@Build-01:~# ls",
    "the password: required",
    "我的密码是 password 别告诉别人",
]


def test_the_corpus_never_places_a_secret_that_breaks_its_own_quoting() -> None:
    from tests.secret_corpus_public import _breaks_quoting

    for placed in corpus("noseyparker"):
        if placed.shape in ("code", "shell", "env") and placed.variant:
            head = placed.text[: placed.start]
            quote = head[-1:]
            if quote in ("\"", "'", "`") and placed.text[placed.end : placed.end + 1] == quote:
                assert quote not in placed.sample.secret, placed.text
    assert _breaks_quoting('x = "{s}"', 'a"b', "code") and not _breaks_quoting('x = "{s}"', "a'b", "code")


def test_credentials_rules_are_placed_as_passwords() -> None:
    from tests.secret_corpus_public import _noun

    assert _noun("psexec:Credentials in PsExec Invocation") == "password"
    assert _noun("netrc:netrc Credentials") == "password"
    assert _noun("google:Google OAuth Credentials") == "token"
    assert _noun("auth0:Auth0 Application Credentials") == "token"


def test_the_builder_keeps_the_credential_itself() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the builder parses regexes with sre_parse
        from bench.rule_samples import final_secret

    base = {"source": "x", "rule": "r", "family": "f", "ident": "i", "origin": "example"}
    body = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"
    assert final_secret({**base, "secret": f'+\n"{body}" +\n"AAAA" +'})["secret"] == f'{body}" +\n"AAAA'
    assert final_secret({**base, "secret": f"\\r\\n{body}\\r\\n"})["secret"] == body
    conn = "Server=db,1433;Database=B2B;User ID=u;Password=#gets0m3;Trusted_Connection=False"
    assert final_secret({**base, "secret": conn})["secret"] == "#gets0m3"
    assert final_secret({**base, "secret": "#{datastore['DBPASSWORD"}) is None


# ---------------------------------------------------------------------------------------------
# Shapes added after the third measurement: values that run past an escaped quote or begin with a
# backtick, short generated secrets, hex tokens, a value alone under a label line, the names providers
# document for bare hex tokens, more provider formats, JWE and padded JWTs, URL userinfo as pasted,
# words with a symbol after a token cue, generated passwords without digits.

_JWT_HEADER = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode()  # padded: `...J9`
_JWE_HEADER = base64.urlsafe_b64encode(b'{"alg":"RSA-OAEP","enc":"A256GCM"}').decode().rstrip("=")
_JWT_CLAIMS = base64.urlsafe_b64encode(b'{"sub":"svc-ingest","iat":1733000000}').decode()
THIRD_ROUND = [
    ("json value with an escaped quote", '7k`D\\"}/vYR)T;W\\\\5]EBrf;_&k>qX?', '{{"jwt_secret": "{v}"}}'),
    ("gradle buildConfigField, single-quoted java literal", _rand(32, "0123456789abcdef"),
     "buildConfigField 'String', 'API_KEY', '\"{v}\"'"),
    ("gradle buildConfigField, escaped java literal", _rand(32, "0123456789abcdef"),
     'buildConfigField "String", "MAPS_API_KEY", "\\"{v}\\""'),
    ("quoted password starting with a backtick", "`9Zxqwe" + _rand(6), "password = '{v}'"),
    ("env password starting with a backtick", "`9Zxqwe" + _rand(6), "NODE_ENV=production\nDB_PASSWORD={v}\nPORT=3000"),
    ("chinese cue, value starting with a backtick", "`9Zxqwe" + _rand(6), "新的 Redis password：{v}（旧的已经作废）"),
    ("nine printable characters under a secret name", "k_gr[/xK7", 'jwtSecret = "{v}"'),
    ("hex token after a token cue", "3fea6af1349166ea", "curl -H \"Token: {v}\" https://ci.example.com/api"),
    ("hex token on the line after a cue", "3fea6af1349166ea", "Drone token:\n{v}\nthat's all"),
    ("jenkins setup wizard", _rand(32, "0123456789abcdef"),
     "Jenkins initial setup is required. An admin user has been created and a password generated.\n"
     "Please use the following password to proceed to installation:\n\n{v}\n\n"
     "This may also be found at: /var/jenkins_home/secrets/initialAdminPassword"),
    ("sonar.login property", _rand(40, "0123456789abcdef"), "mvn sonar:sonar -Dsonar.login={v}"),
    ("sonarLogin variable", _rand(40, "0123456789abcdef"), '$sonarLogin = "{v}"'),
    ("code climate reporter id in CI yaml", _rand(64, "0123456789abcdef"), "env:\n  CC_TEST_REPORTER_ID: {v}\n"),
    ("jenkins crumb header", _rand(32, "0123456789abcdef"), "curl -X POST -H 'Jenkins-Crumb:{v}' https://ci/job/x"),
    ("new relic license key", "eu01xx" + _rand(30, "0123456789abcdef") + "NRAL", "    license: {v}"),
    ("new relic insights query key", "NRIQ-" + _rand(32, _ALNUM + "-_"), '  "querykey": "{v}",'),
    ("azure devops PAT, 2024 format", _rand(52) + "JQQJ99" + _rand(18) + "AZDO" + _rand(4), "token = '{v}'"),
    ("asana PAT", "2/1204567890123456/1207654321098765:" + _rand(32, "0123456789abcdef"), "asana: {v}"),
    ("twitch chat token", "oauth:" + _rand(30, "abcdefghijklmnopqrstuvwxyz0123456789"), "PASS {v}"),
    ("buildkite token", "bkua_" + _rand(40, "0123456789abcdef"), "here: {v}"),
    ("langfuse secret key", "sk-lf-" + _uuid(), "LANGFUSE_SECRET_KEY={v}"),
    ("grafana key with a one-letter name",
     base64.b64encode(b'{"k":"' + _rand(32).encode() + b'","n":"a","id":1}').decode().rstrip("="),
     "use {v} for grafana"),
    ("JWE, five segments", f"{_JWE_HEADER}.{_rand(86, _ALNUM + '-_')}.{_rand(16)}.{_rand(60)}.{_rand(22)}",
     "id_token={v}"),
    ("JWT with padded segments", f"{_JWT_HEADER}.{_JWT_CLAIMS}.{_rand(43, _ALNUM + '-_')}", "Bearer {v}"),
    ("password with a slash in URL userinfo", "ab/cd9Xk2" + _rand(6), "redis://:{v}@cache.internal:6379/0"),
    ("password with a quote in URL userinfo", "Zq'9xLm2" + _rand(4), "postgres://app:{v}@db/app"),
    ("URL userinfo before an IPv6 host", "Qo3j9V98" + _rand(6), "postgresql://app:{v}@[::1]:5432/db"),
    ("go mysql DSN", "Qo3j9V98" + _rand(6), 'sql.Open("mysql", "deploy:{v}@tcp(127.0.0.1:3306)/app")'),
    ("word with a symbol after a token cue, quoted", "Quintessa$",
     "ok the new Acme token is `{v}` (the old one is revoked)"),
    ("word with a symbol after a chinese token cue", "Quintessa$", "Acme 的 token 是 {v} 别弄丢了"),
    ("word with a symbol under an env token name", "Quintessa$", 'ACME_TOKEN="{v}"\nTIMEOUT_MS=3000'),
    ("bare generated password without digits", "iCNGKxzqSPObw&$l%@T^w", "ok so {v} is what they gave me"),
    ("bare generated password opening with a mark", "!oeAbAj*kjdpWDCpjHzMswG=N", "ok so {v} is what they gave me"),
    ("one mark, cases switching, after a password cue", "qaKLal)Idi", "新的 Mongo password：{v}（旧的已经作废）"),
    ("ascii stop glued to chinese text", "e_Tagju.", "新的 Mongo password：{v}（旧的已经作废）"),
    ("a run of question marks ending a generated password", "7wsx@EDC????", "my Acme password is {v} - keep it"),
    ("symbol-bearing token alone on the line after its cue", "kPOfvQ+onByaUvZ==", "Acme token:\n{v}\nthat's all"),
]


NOT_SECRETS_THIRD = [
    "export PATH=/usr/bin export PATH=/usr/bin = password: ",  # a setting before a cue: no value of its own
    'secret = "config_map[key"',  # a subscript cut at a quote
    "the token is `read+write`",  # scopes
    "GITHUB_TOKEN=read+write",
    "Password:\n\nReset it in the settings page.\n",
    "Your API key:\n\nhttps://console.example.com/keys\n",
    "see https://example.com:8443/docs/v2@latest",
    "docker pull docker://registry:5000/img@sha256:abc",
    "pip install git+https://github.com/org/repo.git@v1.2.3",
    "url: https://cdn.example.com:443/npm/pkg@1.2.3/dist/x.js",
    'dsn := "root:@tcp(localhost:3306)/db"',
    "if !isEnabled && !hasValue then",
    "use !important here",
    "sonar.login is required by the scanner",
    'password = "`hunter2`"',
    "密钥： `Authorization: Authorization: ",  # a header's name after a stray backtick (found by hypothesis)
    "token:\nread+write\nok",
    "password:，password: ok，password: ",  # Chinese punctuation and a word (found by hypothesis)
]


def test_a_full_stop_after_an_english_password_stays_text() -> None:
    assert [m.value for m in detect("my password is hunter22.")] == ["hunter22"]


# ---------------------------------------------------------------------------------------------
# Shapes added after the TruffleHog measurement (its misses read; general formats, no sample string):
# long assignment values, `FlyV1 ` before a Fly.io macaroon, Jenkins-style `<secret>{label AQAAABAAA value}`
# elements, one-case random keys in prose, New Relic mobile tokens, Tines and Zapier webhook URLs.

_LOWER36 = "abcdefghijklmnopqrstuvwxyz0123456789"
TRUFFLEHOG_ROUND = [
    ("entra refresh token over 1 KB in code", "1.AAEA-" + _rand(60, _ALNUM + "-_") + "." + _rand(1100, _ALNUM + "-_"),
     'refreshToken = "{v}"'),
    ("a 2 KB docker auth in .env", base64.b64encode(_rand(1600).encode()).decode(), "DOCKER_AUTH={v}\nPORT=3000"),
    ("fly.io token with its scheme", "FlyV1 fm2_" + _rand(120, _ALNUM + "+/"), "export FLY_API_TOKEN={v}"),
    ("jenkins secret element with a label", "9f" + _rand(30, _LOWER36),
     "<secret>{{acme AQAAABAAA {v}}}</secret>"),
    ("api key element, several words", _rand(40), "<apiKey>prod key {v}</apiKey>"),
    ("one-case random key, no cue", "rtwtgvvvekkik48t08tvf659hvyb5w8u4xnueh3u",
     "Quick one: the bot needs {v} to talk to Acme."),
    ("new relic mobile token", "eu01xx" + _rand(36, "0123456789abcdef") + "-NRMA", "token: {v}"),
    ("tines webhook", "https://acme.tines.com/webhook/" + _rand(32, _LOWER36) + "/" + _rand(32, _LOWER36),
     "post it to {v} please"),
    ("zapier catch hook", "https://hooks.zapier.com/hooks/catch/1234567/" + _rand(6, _LOWER36) + "/",
     "the zap is {v} now"),
]


NOT_SECRETS_TRUFFLEHOG = [
    "<secret>see the vault entry for this one</secret>",
    "<password>{{ vault_password }}</password>",
    "<apiKey>set in CI settings</apiKey>",
    'collection_slug="username/iccv-2023-64f9a55bb3115b4f513ec026"',
    "see https://hooks.zapier.com/hooks/catch/ for the docs",
    "https://docs.tines.com/webhook/overview",
    "the build id is 7f3k2p9x and the branch is main",
]


# ---------------------------------------------------------------------------------------------
# Shapes added after the Kingfisher measurement (its misses read; general formats, no sample string): a
# generated secret opening with a sigil (`@`, `%`, `$`) that is no variable, a word password alone on the
# line after its cue, Tailscale, Zoho and PubNub formats, a random key right after `key`/`token`, a key
# beside any provider the public scanners know, base64 opening with `+` or `/`.

KINGFISHER_ROUND = [
    ("password opening with @ under a secret name", "@qyR6j6$Ul#!AT%_T6ZzK$AI5IY6YT8g#LI*8t8TH3%bYzD",
     'DJANGO_SECRET = "{v}"'),
    ("password opening with @ in json", "@D9#yM9+U*Ed08V=r4", '{{"password": "{v}"}}'),
    ("password opening with % under an env name", "%Ts/cRZB+ZfwKgZoK", 'export ACME_PASSWORD="{v}"'),
    ("word password alone on the line after its cue", "braksha", "Psexec password:\n{v}\nthat's all"),
    ("tailscale api key", "tskey-api-" + _rand(12) + "-" + _rand(30), "TS key {v}"),
    ("tailscale auth key in prose", "tskey-auth-" + _rand(12) + "-" + _rand(30), "join with {v} on the box"),
    ("zoho oauth token", "1000." + _rand(32, "0123456789abcdef") + "." + _rand(32, "0123456789abcdef"),
     "Quick one: the bot needs {v} to talk to it."),
    ("pubnub publish key", "pub-c-" + "-".join(_rand(n, "0123456789abcdef") for n in (8, 4, 4, 4, 12)),
     "publish with {v}"),
    ("pubnub secret key", "sec-c-" + _rand(48), "PubNub secret {v}"),
    ("hex key right after 'API key'", "9c" + _rand(30, "0123456789abcdef"), "use API key {v} for the weather"),
    ("mixed key right after 'token'", "8c1eAb92Kd83" + _rand(12), "token {v} works"),
    ("key beside a provider only scanners know", "8Hq2" + _rand(28), "the bot needs {v} to talk to Weatherbit."),
    ("hex key beside a provider only scanners know", "4d" + _rand(30, "0123456789abcdef"),
     "ok so {v} is what Newsapi gave me"),
    ("key beside a provider named with its key word", "c2" + _rand(30, "0123456789abcdef"),
     "ok so {v} is what HubspotApiKey gave me"),
    ("aws secret opening with +", "+g5CfcYe0lF=AJKU/SR=MWfiR86bVsTn+ZSBbMB4", "the bot needs {v} to talk to AWS."),
    ("base64 key opening with /", "/VlVBn/UeBWiOdesQOUvB/J3pAO6+u1SW4cyD12Yg2o1frN9Pfo=i3Kj",
     "Quick one: the bot needs {v} to talk to Bombbomb."),
]

NOT_SECRETS_KINGFISHER = [
    'password = "@Value"',
    "token: @user",
    'SECRET_KEY = "$this->secretKey"',
    '"api_key": "@babel/core"',
    "password: %DB_PASSWORD%",
    'password=@Secret("x")',
    "Password:\nrequired\n",
    "Reset password:\nhttps://example.com/reset",
    "sha256 key 3f9a2b7c8d1e4f5a6b7c8d9e0f1a2b3c3f9a2b7c8d1e4f5a6b7c8d9e0f1a2b3c",
    "the commit key 4b825dc642cb6eb9a060e54bf8d69288fbee4904",
    "press key F12 to open the tools",
    "the primary key 550e8400-e29b-41d4-a716-446655440000 is set",
    "their public key 3f9a2b7c8d1e4f5a6b7c8d9e0f1a2b3c is on the site",
    "tskey-secret-12345678-abcd is the docs' example",
    "we use a debounce of 300ms on the search box",
    "see /usr/local/share/applications/org.example.App.desktop",
    "run ./configure --prefix=/opt/local then make",
]


# ---------------------------------------------------------------------------------------------
# Shapes added in the second pass over the Kingfisher misses (general formats, no sample string): keys
# longer than 300 characters, a letters-only key beside a provider, a bare `key` inside a block the
# provider names (JSON object, Terraform provider, YAML map), a printable secret after a provider's token
# cue, base64 that opens with `/`, one apostrophe inside a quoted generated secret.

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

KINGFISHER_SECOND_ROUND = [
    ("a 400-character key beside a provider", "." + _rand(399, _LETTERS + "0123456789._-"),
     "Quick one: the bot needs {v} to talk to Storychief."),
    ("a letters-only key beside a provider", "b_" + _rand(44, _LETTERS), "ok so {v} is what Beamer gave me"),
    ("a bare key in a JSON object named by its provider", "-" + _rand(15, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-"),
     '```json\n{{\n  "raven": {{\n    "key": "{v}"\n  }}\n}}\n```'),
    ("a uuid key in a Terraform provider block", "9f5c17d2-957e-4dda-ae24-" + _rand(12, "0123456789abcdef"),
     'provider "blocknative" {{\n  key = "{v}"\n}}'),
    ("a bare key under a YAML map named by its provider", "Q" + _rand(23),
     "sendgrid:\n  key: {v}\n  from: ops@example.com"),
    ("a printable token after a provider's token cue",
     "".join(_rand(2, _LETTERS) + _rand(1, "!#%&*+:;=?@^~") for _ in range(6)),
     "Here is the Azure token for the deploy: {v}"),
    ("base64 opening with / under a key name", "/" + _rand(63, _LETTERS + "0123456789+-"),
     'hellosignKey = "{v}"'),
    ("one apostrophe inside a quoted generated secret", "EAyw:F@vU'" + _rand(10, _LETTERS + "~@"),
     'AZURE_TOKEN = "{v}"'),
]

NOT_SECRETS_KINGFISHER_SECOND = [
    '{\n  "cache": {\n    "key": "user-profile-v2"\n  }\n}',
    '{\n  "redis": {\n    "key": "session:12345"\n  }\n}',
    'provider "aws" {\n  region = "eu-west-1"\n}',
    "stripe:\n  key: STRIPE_SECRET_KEY\n",
    "the Azure token for the deploy: ask-ops-first!",
    'api_key = "/home/alice/.config/acme/key.pem"',
    'TOKEN_FILE = "/var/lib/docker/overlay2/3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c/diff"',
    'token = r"[-!#$%&\'*+.^_`|~0-9a-zA-Z]+"',
    'key = f"zqx{i:05d}marker"',
    "please use ReallyLongCamelCaseIdentifierName to talk to Slack",
]


# ---------------------------------------------------------------------------------------------
# Code shapes added after the detect-secrets measurement (its misses read; general syntax, no line of
# its tests): a literal handed to a secret-named setter, builder or constructor, a literal compared with a
# secret-named variable from the left, a C array declaration, a subscript with a secret-named key, a
# Rust `&str` annotation, an Objective-C `@"…"` string, a chosen value in a string under a qualified key name.

CODE_LINE_ROUND = [
    ("a literal handed to a password setter", "Xk9mQ2vLp7" + _rand(6), 'ds.setPassword("{v}");'),
    ("a literal handed to a builder's apiKey", _rand(24), 'Client.builder().apiKey("{v}").build();'),
    ("a C++ string constructed with the secret", _rand(16), 'std::string secret("{v}");'),
    ("a literal compared with a password from the left", "q" + _rand(15), 'if ("{v}" == password) {{'),
    ("a hex literal compared with a member's api key", _rand(32, "0123456789abcdef"),
     'if ("{v}" !== this.config.apiKey) {{'),
    ("a C array declaration", _rand(18), 'char secret[25] = "{v}";'),
    ("a subscript with a secret-named key", _rand(20), 'os.environ["API_KEY"] = "{v}"'),
    ("a header set by a secret-named key", _rand(20), 'headers["X-Api-Key"] = "{v}"'),
    ("a Rust &str annotation", _rand(16), 'let password: &str = "{v}";'),
    ("an Objective-C string under a password name", _rand(16), 'my_password_secure = @"{v}";'),
    ("a chosen value in a string under a qualified key name", "Liverpool1892!", 'api_key = "{v}"'),
]

NOT_SECRETS_CODE_LINES = [
    'tokens = tokenize("hello world")',
    'refresh = get_token("refresh")',
    'if ("admin" == password_policy) {',
    'if ("Bearer" == token_type) {',
    'assert "password" == field_name',
    'setPassword("${DB_PASSWORD}")',
    'check_password("")',
    'os.environ["API_KEY"] = api_key',
    'has_key("foo_bar")',
    'secret_name("prod/db/main")',
    "the gland will secrete insulin when glucose rises",
    # read in whispers' compliant fixtures (Skyscanner/whispers tests/fixtures)
    "// Compliant\nvariable_password0 = password;\nvariable_password1 = $password;",
    '"02_variable_password": "$$password",',
    "02_variable_password: $$password",
]


# ---------------------------------------------------------------------------------------------
# Setting shapes read in whispers' fixtures (general formats, values generated): a name field and a value
# field of one entry (Kubernetes/ECS env lists, CloudFormation parameters, key/value settings, their XML
# form), curl's proxy user and TLS key passwords, wget's protocol passwords.

SETTINGS_ROUND = [
    ("a Kubernetes env entry", "Q" + _rand(17), 'env:\n  - name: DB_PASSWORD\n    value: "{v}"'),
    ("an unquoted Kubernetes env entry", _rand(24), "env:\n  - name: API_TOKEN\n    value: {v}\n"),
    ("an ECS environment entry", _rand(20), '{{"Name": "DB_PASSWORD", "Value": "{v}"}}'),
    ("a CloudFormation parameter", _rand(20), '"ParameterKey": "DBPassword", "ParameterValue": "{v}"'),
    ("a key/value setting", _rand(20), '{{"key": "smtp.password", "value": "{v}"}}'),
    ("an XML key/value setting", _rand(20), "<entry>\n  <key>pro_password</key>\n  <value>{v}</value>\n</entry>"),
    ("curl's proxy user", _rand(16), "curl -k --proxy-user admin:{v} --proxy https://localhost:8080 https://x"),
    ("curl's TLS key password", _rand(16), "curl --tlspassword {v} https://localhost"),
    ("wget's HTTP password", _rand(16), "wget --http-password={v} https://localhost"),
]

NOT_SECRETS_SETTINGS = [
    "env:\n  - name: LOG_LEVEL\n    value: debug\n  - name: DB_PASSWORD\n    valueFrom:\n      secretKeyRef:\n"
    "        name: db\n        key: password",
    '{"key": "password", "value": ""}',
    '{"name": "api_key", "value": "${API_KEY}"}',
    "- name: TOKEN_TTL\n  value: \"3600\"",
    '{"Name": "SECRET_ARN", "Value": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:db-AbCdEf"}',
    'SECRET_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:db-AbCdEf"',
    "curl --tlspassword",
]


# ---------------------------------------------------------------------------------------------
# What OpenClaw's own docs (52,833 paragraphs of the installed package) showed the detector taking for
# secrets: release tags, camel-case code names, names of short pieces beside a provider, the docs' example
# ids, stand-in keys and placeholders, another setting's name, a file reference, `date -u`, camel-case `…Id`
# labels, prices and HTML entities.

NOT_SECRETS_OPENCLAW_DOCS = [
    "The earlier `hot` and `restart` modes were retired in `v2026.7.2-beta.4`.",
    "openclaw update --tag 2026.4.1-beta.1",
    "Beta tags look like `v2026.3.N-beta.1`.",
    "The narrow fake-IP proxy flags are `allowRfc2544BenchmarkRange` and friends.",
    "- `tools.web.fetch.ssrfPolicy.allowRfc2544BenchmarkRange` when model-selected URLs are trusted",
    "Npm preflight retains `blacksmith-32vcpu-ubuntu-2404` for now",
    "Azure accepts output formats such as `audio-24khz-48kbitrate-mono-mp3`.",
    'channels: {\n  modelByChannel: {\n    discord: {\n      "123456789012345678": "openai/gpt-5"',
    'whatsapp: ["+15555550123"],\n        discord: ["1234567890123", "987654321098765432"]',
    '    password: "replace-me",',
    "export VLLM_API_KEY=\"vllm-local\"",
    "set `LLMMAN_API_KEY=llmman-local` on the machine running OpenClaw",
    'env: { vars: { ANTHROPIC_API_KEY: "example-anthropic-key-not-real" } }',
    'env: { vars: { XIAOMI_TOKEN_PLAN_API_KEY: "tp-your-key" } }',
    'passEnv: ["BWS_ACCESS_TOKEN", "BWS_SERVER_URL"],',
    "  - password: `OPENCLAW_GATEWAY_PASSWORD`",
    'For example, `XAI_API_KEY: "file:secrets/xai-api-key.txt"` is passed as is.',
    'BUILD_TIMESTAMP="$(date -u +%Y-%m-%dT%H:%M:%SZ)"',
    'elevenlabs: { speakerVoiceId: "EXAVITQu4vr4xnSDxMaL" }',
    'apiKey: "${VYDRA_API_KEY}",\n            voiceId: "21m00Tcm4TlvDq8ikWAM",',
    "Catalog pricing is $3/MTok input, $15/MTok output, and $0.30/MTok cache reads.",
    "Local files and in-memory buffers of 5&nbsp;MiB or less are sent inline.",
]


# ---------------------------------------------------------------------------------------------
# Passwords on command lines people paste, found by a credential trial: a short flag whose next
# argument is the password (sshpass, docker login, redis-cli, sqlcmd, ldapsearch, mosquitto, zip,
# mongosh, xfreerdp), mysql's attached `-p` quoted, `pass:` as a label, and a password given right
# after its name or as `user / password` after a login cue. Prose that names such a command with an
# ordinary word after the flag, or a password with a word or a name after it, is no password.

COMMAND_LINE_ROUND = [
    ("sshpass -p", "Tr0ub4dor&3x", "sshpass -p '{v}' ssh deploy@10.0.0.5"),
    ("sshpass by path", "hunter22", "/usr/bin/sshpass -p {v} scp a.txt box:"),
    ("docker login -p", "Hn6tYq2Lx9", "docker login -u bob -p {v} registry.example.com"),
    ("podman login -p", "Pd4mKq8zLx", "$ podman login quay.io -u bob -p {v}"),
    ("redis-cli -a", "f00bared", "try this: `redis-cli -a {v} ping`"),
    ("sqlcmd -P", "Pa55w0rd!x", 'sqlcmd -S db -U sa -P "{v}" -Q "select 1"'),
    ("ldapsearch -w", "Sup3rSecret", "ldapsearch -x -D cn=admin,dc=example -w {v} -b dc=example"),
    ("mosquitto_pub -P", "Mq7zLp2x", "mosquitto_pub -h broker -u dev -P {v} -t t -m hi"),
    ("zip -P after &&", "0pensesame", "cd /tmp && zip -P {v} x.zip notes.txt"),
    ("mongosh -p", "Mg6nLq8z", "mongosh -u admin -p {v} --authenticationDatabase admin"),
    ("xfreerdp /p:", "Rdp7zLq2x", "xfreerdp /v:10.0.0.9 /u:admin /p:{v}"),
    ("mysql -p quoted", "S3cr3tPw9x", "mysql -u root -p'{v}' shop"),
    ("psexec in cmd /c", "dev_admin", "cmd.exe /C PSEXEC \\\\10.0.94.120 -u Administrator -p {v} CMD"),
    ("pass: label", "Gx7mK2qLz", "wifi pass: {v}"),
    ("password then the value", "sunshine42", "log in as admin with password {v}"),
    ("the password then the value", "Tr0ub4dor3x", "ssh in with the password {v} please"),
    ("login pair", "sunshine42", "login: admin / {v}"),
    ("creds pair", "Qwerty2024", "the creds are admin / {v}"),
]
NOT_SECRETS_COMMAND_LINES = [
    "I'll zip -P the files later",
    "zip -P requires a password argument",
    "run redis-cli -a then paste",
    "the docker login page asks -p first",
    "mysql -u root -p shop",
    "mongosh -u admin -p --authenticationDatabase admin",
    "boarding pass: gate 12",
    "the pass: a narrow road through the mountains",
    "account: billing / invoices-2024",
    "credentials / aws-prod-2",
    "password 2fa-enabled",
    "login: admin / settings",
    "sign in with Google / Apple",
    "the password policy requires 12chars minimum",
    "I changed my password 3 times",
    "pwd /home/bob2",
]


# ---------------------------------------------------------------------------------------------
# A second credential trial (930 inputs written as people paste them to an ops assistant): a word told as the
# password in prose, markdown around the cue, a password column of a table, a Chinese or Japanese cue without
# 是/は/colon, a password typed twice, a quoted passphrase, tools' own syntax (SQL, Redis, Wi-Fi, sudo -S,
# chpasswd, sqlplus, PowerShell, httpie, smbclient, lftp, 7z, gpg, kubectl), a token as a URL's user, `user:X@`
# an IP or after ssh, Google app passwords, BitLocker recovery keys, spaced TOTP setup keys. And what it
# redacted that is public or an identifier: integrity digests, SSH public keys, certificate bodies, data: URIs,
# WireGuard's PublicKey, Stripe object ids, OpenAI organisation ids, a getter's arguments, `passwordEncoder`.

SECOND_TRIAL_ROUND = [
    ("told word", "sunshine", "my password is {v}"),
    ("told word, full stop", "bluewhale", "the wifi password is {v}."),
    ("told word then and", "letmein", "the password is {v} and it works"),
    ("markdown bold label", "Kx8#pL2mQ", "- **Password:** {v}"),
    ("markdown bold cue", "Kx8#pL2mQ", "**password**: {v}"),
    ("table column", "Rt7#mVq92", "| host | user | password |\n|---|---|---|\n| db1 | root | {v} |"),
    ("table column, second row", "sunflower42",
     "| Host | Username | Password |\n| --- | --- | --- |\n| 10.0.0.4 | bob | Xq9#mLp2v |\n| 10.0.0.5 | root | {v} |"),
    ("parenthesised", "Gh7kLm22", "password is ({v})"),
    ("dash", "Gh7kLm25", "password - {v}"),
    ("apostrophe s", "Gh7kLm26", "the password's {v}"),
    ("quoted passphrase", "my long passphrase here", "password: '{v}'"),
    ("quoted passphrase told", "blue sky 42", 'password is "{v}"'),
    ("chinese cue, no colon", "Qwe!2345", "账号 admin 密码 {v}"),
    ("chinese cue, digits", "88886666", "wifi 密码 {v}"),
    ("japanese cue with particle", "Vq7kR2mx", "パスワードを {v} に変更しました"),
    ("sql identified by", "Hx7#kL9q", "CREATE USER 'app'@'%' IDENTIFIED BY '{v}';"),
    ("sql alter user password", "sunflowerfield", "ALTER USER app PASSWORD '{v}';"),
    ("redis requirepass", "Hx7#kL9q", "requirepass {v}"),
    ("wpa psk", "sunflowerfield", 'network={{\n  ssid="HomeNet"\n  psk="{v}"\n}}'),
    ("wifi qr", "sunflower42", "WIFI:T:WPA;S:HomeNet;P:{v};;"),
    ("echo to sudo -S", "Vq7kR2mxL9pZa3Qw", "echo {v} | sudo -S systemctl restart nginx"),
    ("echo to --password-stdin", "Vq7kR2mx", "echo '{v}' | docker login --username bob --password-stdin"),
    ("chpasswd", "Vq7kR2mxL9pZa3Qw", "echo 'root:{v}' | chpasswd"),
    ("sqlplus", "Vq7kR2mxL9pZa3Qw", "sqlplus system/{v}@//db:1521/XEPDB1"),
    ("powershell securestring", "Hx7#kL9q", '$password = ConvertTo-SecureString "{v}" -AsPlainText -Force'),
    ("httpie -a", "Vq7kR2mxL9pZa3Qw", "http -a admin:{v} GET https://x"),
    ("smbclient -U", "Vq7kR2mxL9pZa3Qw", "smbclient //nas/share -U 'bob%{v}'"),
    ("lftp -u", "Vq7#kR2m!xL9pZ", "lftp -u 'bob,{v}' sftp://host"),
    ("7z quoted", "Vq7kR2mxL9pZa3Qw", "7z x archive.7z -p'{v}'"),
    ("gpg --passphrase", "Vq7kR2mxL9pZa3Qw", "gpg --batch --passphrase '{v}' -d file.gpg"),
    ("kubectl --docker-password", "Vq7kR2mx", "kubectl create secret docker-registry r --docker-username=bob "
                                              "--docker-password={v}"),
    ("token as the url's user", "Vq7kR2mxL9pZa3Qw", "git clone https://{v}@github.com/org/repo.git"),
    ("user:password@ip", "Vq7kR2mx", "use admin:{v}@192.168.1.1 for the router"),
    ("ssh user:password@host", "Vq7kR2mx", "ssh bob:{v}@build.internal"),
    ("google app password", "qwer tyui asdf zxcv", "Gmail app password: {v}"),
    ("google app password, one run", "qwertyuiasdfzxcv", "app password {v}"),
    ("bitlocker", "314424-007123-170776-539235-912457-684461-249949-633693", "BitLocker recovery key: {v}"),
    ("totp setup key", "rh5r bo54 qdtq p6yr tckd fguc ywq7 qnyd", "2FA setup key: {v}"),
    ("json pass key", "Hx7kL9q2", '{{"host":"db1","pass":"{v}"}}'),
]
NOT_SECRETS_SECOND_TRIAL = [
    "the password is incorrect", "the password is required.", "my password is wrong, I think",
    "password is case-sensitive", "the password is stored in the vault", "the password is changed every month",
    "your password is too short", "the password is different now", "password: required",
    "Remember: the admin password is something only Priya knows.", "password reset link expired",
    '"integrity": "sha512-8VVaYc0wTnn0KVc7aQ+IlYvL6g2k3LG2x1XR4zL8Gx3KcG9cS2Ls4v0wB4nU2sDq7pWm0bE4vN3jY2F8ZkXyDa=="',
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq8Zk3bYqLpV3n9d2L4m0xvG5tR8sQ1yJ7wE6uH2fKc bob@laptop",
    "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBaMQswCQYDVQQGEwJJ\n"
    "RTESMBAGA1UEChMJQmFsdGltb3JlMRMwEQYDVQQLEwpDeWJlclRydXN0MSIwIAYD\n-----END CERTIFICATE-----",
    "PublicKey = xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=",
    "![img](data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJ"
    "RU5ErkJggg==)",
    "customer cus_NffrFeUfNV2Hib, invoice in_1MtHbELkdIwHu7ixl4OzzPMv, price price_1MoBy5LkdIwHu7ixZhnattbh",
    "OpenAI-Organization: org-8f3Kq92LmZxP0aBcD4eFgH1i",
    "passwordEncoder: bcrypt",
    "keyring.get_password('system', 'username')",
    "use `id:` with the sender identity value: `id:alice` or `id:alice!~alice@irc.example.net`",
    "| Token | Meaning |\n|---|---|\n| `--surface` | Page-level surface color |",
    "| host | password |\n|---|---|\n| db1 | (in the vault) |",
    "email me: mailto:alice@example.com",
    'url = URL("https://example.com").copy_with(username="jo@gmail.com", password="a secret")',
    "if auth_from_netrc:\n    login, account, password = auth_from_netrc(host)",
    '{"test": "x", "pass": "yes"}', '{"pass": true, "fail": false}',
]


# Issue 37, the chat, curl and URL contexts (misses of the scanners' sets read, general shapes kept): a JWT its
# header alone proves (unsigned, an opaque body), a key as curl's user running to hundreds of characters, a
# webhook URL whose path carries the token, a URL query parameter named as a secret. Values written here.
_LONG_B64_KEY = (
    "K8dxLrBov2bTJigCvZ5OiylNfBE4/SJfzMaIdH4CQTAUoV+i5vlKOe+sfO6l+wsVzvuDOjvnJ9CmcoUauQ9jiLDYFh1/Ivd6AitF/65VFuotbG9Q"
    "utr8ekdrfFGGFD+KTY++ZiCP/To2iv/3ZULs6FC34sLmWhDolNgfJEf/GWShtkZuO7zS6TGz91TTisY+ovawwbDA8jKt6/wav7P5MupqX/tWWxo"
    "EEgiMQpCnKCOR/Ouv7ljFgj2KIfVK7H0RS58HI1o5vE75O6Lx8pbNdOPXV3bvWKh51CXTkZgis1Ly"
)
CHAT_URL_CURL_ROUND = [
    ("unsigned JWT (alg none, no signature)",
     "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJvcHMtYm90Iiwic2NvcGUiOiJhZG1pbiJ9",
     "the bot needs {v} to call it"),
    ("JWT header, opaque body", "eyJhbGciOiJIUzI1NiJ9.leV4n6KW24sgl0jKU3UeB1ibaUiCdPTucbBNDMfKIA9sBIg45naIEl4qRSdmtiuF",
     "ok so {v} is what the vendor gave me"),
    ("curl -u with a 300-character key", _LONG_B64_KEY, "curl -u {v}: https://api.example.com/v1/items"),
    ("curl --user= with a long key and X", _LONG_B64_KEY, "curl -X POST --user={v}:X https://api.example.com/v1/send"),
    ("webhook URL, token in its path", "https://chat.example.org/hooks/ssYvKWuZAYVKDc90iY0hDpGD",
     "post to {v} when the deploy is done"),
    ("older Teams webhook form", "https://outlook.office.com/webhook/206147976f4c0-73e-350c996779303b4405",
     "Use {v} as the token, thanks."),
    ("URL query password, a chosen word", "bluefrog", "https://ftp.example.com/login?user=admin&password={v}"),
    ("URL query password, letters and a dot", "Rk.mWqZtxBvL", "https://intranet.example.com/login?user=ops&password={v}"),
    ("URL query api key, padded base64", "qWsbTkePxJmNvR+z==", "see https://api.example.com/v1/items?apikey={v}"),
    ("URL query secret, short mixed case", "tQNAROAw",
     "curl 'https://api.example.com/v1/query?django_secret={v}&units=metric'"),
]
NOT_SECRETS_CHAT_URL_CURL = [
    "see https://github.com/org/repo/settings/hooks/123456789 for the hook",
    "the guide is at https://docs.example.com/webhooks/getting-started-with-the-api-guide",
    "https://api.github.com/repos/octo-org/hello-world/hooks/12345678/pings",
    "https://example.com/search?q=password&page_token=next_page&key=value",
    "https://x.example.com/login?user=admin&password=YOUR_PASSWORD",
    "https://x.example.com/login?user=admin&password=${DB_PASSWORD}",
    "the profile blob eyJuYW1lIjoiYWxpY2UiLCJhZ2UiOjMwfQ.backup2024x is in the bucket",
    "the header eyJhbGciOiJIUzI1NiJ9 alone says nothing",
]


def test_a_password_typed_twice_is_hidden_both_times() -> None:
    for text, value in (("my password is Summer24! and when I type Summer24! on the VPN it fails", "Summer24!"),
                        ('password is hunter22 and I typed "hunter22"', "hunter22")):
        out = redact.redact(text, KEY).text
        assert value not in out, out
    # a word that only contains it stays
    assert "Summer24!x" in redact.redact("password is Summer24! and Summer24!x is the old one", KEY).text


# ---------------------------------------------------------------------------------------------
# Every round's cases through the same two checks: each secret covered whole by one span and gone from the
# redacted text; each text that holds none left without a finding.

HIDDEN_WHOLE = {
    "provider": PROVIDERS,
    "more formats": MORE_PROVIDERS,
    "printable under a secret name": [(label, _QUOTE_FREE, template) for label, template in PRINTABLE_SHAPES],
    "word password under a password name": WORD_PASSWORDS,
    "second measurement": ENV_VALUES,
    "third measurement": THIRD_ROUND,
    "trufflehog measurement": TRUFFLEHOG_ROUND,
    "kingfisher measurement": KINGFISHER_ROUND,
    "kingfisher second pass": KINGFISHER_SECOND_ROUND,
    "detect-secrets code lines": CODE_LINE_ROUND,
    "settings (whispers)": SETTINGS_ROUND,
    "command lines": COMMAND_LINE_ROUND,
    "second credential trial": SECOND_TRIAL_ROUND,
    "chat, curl and URL shapes (issue 37)": CHAT_URL_CURL_ROUND,
}
LEFT_ALONE = {
    "code": CODE_NOT_SECRETS,
    "beside a provider": NOT_SECRETS_NEAR_PROVIDERS,
    "not a password": NOT_PASSWORDS,
    "third measurement": NOT_SECRETS_THIRD,
    "trufflehog measurement": NOT_SECRETS_TRUFFLEHOG,
    "kingfisher measurement": NOT_SECRETS_KINGFISHER,
    "kingfisher second pass": NOT_SECRETS_KINGFISHER_SECOND,
    "detect-secrets code lines": NOT_SECRETS_CODE_LINES,
    "settings (whispers)": NOT_SECRETS_SETTINGS,
    "openclaw docs": NOT_SECRETS_OPENCLAW_DOCS,
    "command lines": NOT_SECRETS_COMMAND_LINES,
    "second credential trial": NOT_SECRETS_SECOND_TRIAL,
    "chat, curl and URL shapes (issue 37)": NOT_SECRETS_CHAT_URL_CURL,
}


@pytest.mark.parametrize(("label", "value", "template"),
                         [case for cases in HIDDEN_WHOLE.values() for case in cases],
                         ids=[f"{name}: {case[0]}" for name, cases in HIDDEN_WHOLE.items() for case in cases])
def test_secrets_of_every_round_are_hidden_whole(label: str, value: str, template: str) -> None:
    assert_hidden_whole(label, value, template)


@pytest.mark.parametrize("text", [text for texts in LEFT_ALONE.values() for text in texts],
                         ids=[f"{name} {i}" for name, texts in LEFT_ALONE.items() for i in range(len(texts))])
def test_texts_of_every_round_without_a_secret_are_left_alone(text: str) -> None:
    assert_left_alone(text)
