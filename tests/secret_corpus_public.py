"""Recall corpora built from secrets nobody here wrote: public scanners' rule samples in chat contexts.

`tests/data/public_rules_gitleaks.json.gz` (tuning), `tests/data/public_rules_noseyparker.json.gz`
(the second set: no rule fitted to it, its misses read) and `tests/data/public_rules_trufflehog.json.gz`
(the third set: TruffleHog's detector tests, measured blind before its misses were read) and
`tests/data/public_rules_kingfisher.json.gz` (the fourth set, Kingfisher's rule examples, likewise) hold each
rule's secrets, written by bench/rule_samples.py from the scanners' published rules and tests: the
samples their authors wrote, the secrets of their examples and test inputs, and values generated from
their own regexes. `build_corpus` places every secret in the chat contexts
people paste (English and Chinese sentences, `export X=...`, code in ten languages and config
formats, JSON, `.env` dumps, and the scanner's own example text), and records where it sits.
A secret counts as caught only if one redacted span covers all of it.

`tests/data/public_shapes_detect_secrets.json` (the fifth set) is code lines instead of secrets: the lines
detect-secrets' keyword tests expect a secret in (Go, C, C++, config, quoted-value languages; comparisons,
declarations, `.assign(…)`). `code_line_corpus` puts four kinds of generated value into every line (a
random key, a hex key, a printable password, a chosen password: word, digits, a symbol); the family of a
placement is the kind of value, its shape the detect-secrets list.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
CORPORA = ("gitleaks", "noseyparker", "trufflehog", "kingfisher", "secretlint")
# Sets no detector was tuned on (issue 37): semgrep-rules' own secret rules, measured blind once (misses read
# since), and secrets-patterns-db's high-confidence rules (values generated from them), measured blind.
HELD_OUT = ("semgrep", "spdb")
SHAPES = ("en", "zh", "shell", "code", "json", "env", "curl", "url", "example")
# The six contexts issue 37 measures in (a chat sentence, a code block, a `.env` line, JSON config, a curl
# command, a URL parameter), each the union of the shapes above that write it; `example` (the scanner's own
# text) is reported on its own.
CONTEXTS: dict[str, tuple[str, ...]] = {
    "chat": ("en", "zh"), "code": ("code",), "env": ("env", "shell"), "json": ("json",), "curl": ("curl",),
    "url": ("url",),
}


@dataclass(frozen=True)
class Sample:
    source: str
    rule: str
    family: str
    ident: str  # the provider or name a user calls it by ("twitter", "slack")
    secret: str
    origin: str  # literal | generated | example | negative
    example: str = ""


@dataclass(frozen=True)
class Placed:
    sample: Sample
    shape: str  # one of SHAPES
    variant: str  # which template of the shape
    text: str
    start: int  # where the secret (as written in the text) sits
    end: int


@cache
def load_samples(corpus: str) -> tuple[Sample, ...]:
    # gzip: a plain file of key-shaped samples would trip secret scanners reading the repository
    raw: list[dict[str, Any]] = json.loads(gzip.decompress((DATA / f"public_rules_{corpus}.json.gz").read_bytes()))
    return tuple(
        Sample(r["source"], r["rule"], r["family"], r["ident"], r["secret"], r["origin"], r.get("example", ""))
        for r in raw
    )


def positives(corpus: str) -> list[Sample]:
    """The secrets recall is measured on: not the documented examples, not test filler (`abc123def456...`)."""
    return [s for s in load_samples(corpus) if s.secret and s.origin not in ("documented_example", "filler")]


def documented_examples(corpus: str) -> list[Sample]:
    """Placeholder keys of the scanners' samples and docs (`AKIAIOSFODNN7EXAMPLE`, `ghu_xxxx...`)."""
    return [s for s in load_samples(corpus) if s.origin == "documented_example"]


def negatives(corpus: str) -> list[Sample]:
    return [s for s in load_samples(corpus) if not s.secret]


def _noun(rule: str) -> str:
    r = rule.lower()
    # "Credentials in PsExec Invocation", "netrc Credentials", "Hardcoded Gradle Credentials": what such a
    # rule captures after the user name is a password (its pattern labels the group so), and that is
    # what people call it; an OAuth, client, application or API credential is a token or secret
    if "credential" in r and not re.search(r"oauth|client|application|\bapi\b", r):
        return "password"
    for word, noun in (("password", "password"), ("secret", "secret"), ("key", "key")):
        if word in r:
            return noun
    return "token"


def _names(sample: Sample) -> dict[str, str]:
    ident = re.sub(r"[^A-Za-z0-9]", "", sample.ident) or "svc"
    noun = _noun(sample.rule)
    cap = noun.capitalize()
    return {
        "i": ident.lower(),
        "I": ident.upper(),
        "Svc": ident.capitalize(),
        "noun": noun,
        "Noun": cap,
        "NOUN": noun.upper(),
        "zh_noun": {"password": "密码", "secret": "密钥", "key": "密钥", "token": "令牌"}[noun],
    }


# `{s}` is the secret; the names come from `_names`.
EN = (
    "Here is the {Svc} {noun} for the deploy: {s}",
    "my {Svc} api {noun} is {s} - please keep it safe",
    "Can you wire up {Svc}? Use {s} as the {noun}, thanks.",
    "ok the new {Svc} {noun} is `{s}` (the old one is revoked)",
    "{Svc} {noun}:\n{s}\nthat's all",
    "ok so {s} is what {Svc} gave me, don't share it",  # no cue word: the value alone must tell
    "Quick one: the bot needs {s} to talk to {Svc}.",
)
ZH = (
    "这是{Svc}的{zh_noun}：{s}，帮我配置一下",
    "{Svc} 的 {noun} 是 {s} 别弄丢了",
    "帮我把这个{Svc} {noun}记下来：{s}",
    "新的 {Svc} {noun}：{s}（旧的已经作废）",
)
SHELL = (
    "export {I}_{NOUN}={s}",
    'export {I}_{NOUN}="{s}"',
    "```bash\nexport {I}_{NOUN}='{s}'\n./deploy.sh\n```",
    "docker run -e {I}_{NOUN}={s} -p 8080:8080 app:latest",
    "$env:{I}_{NOUN}=\"{s}\"",
)
# gitleaks' own sample shapes (cmd/generate/config/utils/generate.go) plus the config formats people paste
CODE = (
    'System.setProperty("{I}_{NOUN}", "{s}")',
    'var {i}{Noun} string = "{s}"',
    '{i}{Noun} := "{s}"',
    "{i}{Noun} := `{s}`",
    '${i}{Noun} .= "{s}"',
    '{I}_{NOUN} ::= "{s}"',
    '{I}_{NOUN} :::= "{s}"',
    '{I}_{NOUN} ?= "{s}"',
    '{I}_{NOUN} := "{s}"',
    '{I}_{NOUN} = "{s}"',
    "<{i}{Noun}>{s}</{i}{Noun}>",
    "<{i}{Noun}>\n    {s}\n</{i}{Noun}>",
    'String {i}{Noun} = "{s}";',
    'string {i}{Noun} = "{s}";',
    'var {i}{Noun} = "{s}"',
    "{i}{Noun} = '{s}'",
    '{i}{Noun} = "{s}"',
    '  "{i}{Noun}" => "{s}"',
    "```yaml\n{i}:\n  {noun}: {s}\n  timeout: 30\n```",
    "{i}_{noun}: '{s}'",
    '[{i}]\n{noun} = "{s}"',
    "[{i}]\n{i}_{noun}={s}",
    'provider "{i}" {\n  {noun} = "{s}"\n}',
    "```python\nclient = {Svc}Client({noun}=\"{s}\")\n```",
    "```js\nconst {i}{Noun} = '{s}';\n```",
)
JSON = (
    '{{"{i}_{noun}": "{s}"}}',
    '{{\n    "{i}_{noun}": "{s}"\n}}',
    '{{"provider": "{i}", "{noun}": "{s}", "enabled": true}}',
    '{{"config.ini": "{I}_{NOUN}={s}\\nBACKUP_ENABLED=true"}}',
    '```json\n{{\n  "{i}": {{\n    "{noun}": "{s}"\n  }}\n}}\n```',
)
ENV = (
    "NODE_ENV=production\nPORT=3000\n{I}_{NOUN}={s}\nLOG_LEVEL=debug",
    "here's my .env:\n```\n{I}_{NOUN}={s}\nREGION=us-east-1\n```",
    '{I}_{NOUN}="{s}"\nTIMEOUT_MS=3000',
)
# How APIs document their keys on the command line: the key as the basic-auth user with an empty password
# (Stripe, Mailgun, Recurly, Chargebee), or a placeholder password (Freshdesk's `:X`), or in a header.
CURL = (
    "curl -u {s}: https://api.{i}.com/v1/charges",
    "curl https://api.{i}.com/v3/messages -u {s}:",
    "curl --user {s}: https://api.{i}.com/v1/items",
    "curl -X POST --user={s}: https://api.{i}.com/v1/send -d to=me",
    'curl -u "{s}:" https://api.{i}.com/v2/accounts',
    "curl -u {s}:X https://{i}.example.com/api/v2/tickets",
    "```bash\ncurl -s -u {s}: \\\n  https://api.{i}.com/v1/customers\n```",
    'curl -H "Authorization: Bearer {s}" https://api.{i}.com/v1/me',
    "curl -H 'X-API-Key: {s}' https://api.{i}.com/v2/status",
)
# A key in a query string, as pasted from a browser, a log or an API's docs.
URL = (
    "https://api.{i}.com/v1/data?api_key={s}&format=json",
    "GET https://api.{i}.com/v2/search?q=test&key={s}",
    "open https://{i}.example.com/hooks/incoming?token={s} in the browser",
    "wss://stream.{i}.com/v1/ws?access_token={s}",
    "the docs say: https://api.{i}.com/v1/items?apikey={s}",
    "curl 'https://api.{i}.com/v1/query?{i}_{noun}={s}&units=metric'",
)
# A password goes where a command or a URL takes one: after a user name.
CURL_PASSWORD = (
    "curl -u admin:{s} https://{i}.example.com/api/health",
    'curl --user "deploy:{s}" https://{i}.example.com/api/v1/jobs',
    "curl -s --user=ops:{s} https://{i}.example.com/metrics",
    "curl -X POST https://{i}.example.com/api/login -u backup:{s}",
)
URL_PASSWORD = (
    "https://{i}.example.com/login?user=admin&password={s}",
    "GET https://{i}.example.com/api/auth?username=ops&pass={s}&remember=1",
    "the router page is http://192.168.1.1/cgi-bin/login?user=admin&pwd={s}",
)
TEMPLATES: dict[str, tuple[str, ...]] = {"en": EN, "zh": ZH, "shell": SHELL, "code": CODE, "json": JSON, "env": ENV,
                                         "curl": CURL, "url": URL}
_PASSWORD_TEMPLATES = {"curl": CURL_PASSWORD, "url": URL_PASSWORD}
# What a value cannot hold and still be one argument of a command, or one parameter of a query string.
_BREAKS_SHAPE = {"curl": re.compile(r"[\s\"'\\]"), "url": re.compile(r"[\s&#\"'<>]")}


def _escape_for(shape: str, template: str, secret: str) -> str:
    if shape == "json":
        return json.dumps(secret)[1:-1]
    return secret


def _fill(template: str, names: dict[str, str], secret: str, shape: str) -> tuple[str, int, int]:
    written = _escape_for(shape, template, secret)
    text = template
    if shape == "json":
        text = text.replace("{{", "\x00").replace("}}", "\x01")
    for key in sorted(names, key=len, reverse=True):
        text = text.replace("{" + key + "}", names[key])
    head, _, tail = text.partition("{s}")
    head = head.replace("\x00", "{").replace("\x01", "}")
    tail = tail.replace("\x00", "{").replace("\x01", "}")
    return head + written + tail, len(head), len(head) + len(written)


def _breaks_quoting(template: str, secret: str, shape: str) -> bool:
    """Would `secret` end the string literal or element it is placed in (JSON escapes its values)?"""
    if shape == "json":
        return False
    head, _, tail = template.partition("{s}")
    quote = head[-1:] if head[-1:] in ("\"", "'", "`") and tail[:1] == head[-1:] else ""
    if quote and quote in secret:
        return True
    return head.rstrip().endswith(">") and tail.lstrip().startswith("</") and any(c in secret for c in "<&")


def place(sample: Sample, shape: str, index: int) -> Placed | None:
    """`sample` in one context of `shape` (the `index`-th template, cycling); None if it cannot go there."""
    if shape == "example":
        if not sample.example or sample.secret not in sample.example:
            return None
        start = sample.example.index(sample.secret)
        return Placed(sample, shape, "scanner", sample.example, start, start + len(sample.secret))
    multiline = "\n" in sample.secret
    if shape in _BREAKS_SHAPE and _BREAKS_SHAPE[shape].search(sample.secret):
        return None
    templates = TEMPLATES[shape]
    if shape in _PASSWORD_TEMPLATES and _noun(sample.rule) == "password":
        templates = _PASSWORD_TEMPLATES[shape]
    if shape == "curl" and ":" in sample.secret:
        templates = tuple(t for t in templates if "{s}:" not in t)  # the user part of `-u` holds no colon
    if multiline:
        if shape not in ("en", "zh", "code"):
            return None
        templates = tuple(t for t in templates if "`{s}`" not in t and "'{s}'" not in t and '"{s}"' not in t
                          and "{s} " not in t.split("\n")[-1]) or templates
    # A value holding the template's own quote (or `<`/`&` in XML) is written the way its author would
    # have to write it: in another template of the shape, never as broken code (`"ab"cd"`, `'ab'cd'`).
    clash = tuple(t for t in templates if not _breaks_quoting(t, sample.secret, shape))
    templates = clash or templates
    template = templates[index % len(templates)]
    text, start, end = _fill(template, _names(sample), sample.secret, shape)
    return Placed(sample, shape, f"{shape}{index % len(templates)}", text, start, end)


def build_corpus(corpus: str, *, per_sample: int = 4, seed: int = 13) -> list[Placed]:
    """Every secret of `corpus` in `per_sample` context shapes (its scanner example too, if it has one);
    across the corpus each shape and each of its templates is used about equally. Deterministic."""
    rng = random.Random(f"{seed}-{corpus}")
    out: list[Placed] = []
    plain = [s for s in SHAPES if s != "example"]
    for n, sample in enumerate(positives(corpus)):
        shapes = [plain[(n + k) % len(plain)] for k in range(per_sample)]
        if sample.example:
            shapes.append("example")
        for k, shape in enumerate(shapes):
            placed = place(sample, shape, n // len(plain) + k + rng.randrange(3))
            if placed is not None:
                out.append(placed)
    return out


# ---------------------------------------------------------------------------------------------
# Ordinary chat: the false-positive sets (shared fixtures)

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_WORDS = ("sunflower", "Marlboro", "qwerty", "dragon", "Liverpool", "princess", "shadow", "baseball")
CODE_LINE_VALUES = ("random_key", "hex_key", "printable", "chosen_password")


def _code_line_value(kind: str, rng: random.Random) -> str:
    if kind == "random_key":
        return "".join(rng.choice(_ALNUM) for _ in range(22)) + str(rng.randint(10, 99))
    if kind == "hex_key":
        return "".join(rng.choice("0123456789abcdef") for _ in range(32))
    if kind == "printable":
        return "".join(rng.choice(_ALNUM + "!#%&*+-=?@^_~") for _ in range(16))
    return rng.choice(_WORDS) + str(rng.randint(10, 9999)) + rng.choice("!#@$%")


def code_line_corpus(*, seed: int = 17) -> list[Placed]:
    """Every detect-secrets code line with each kind of generated value in it."""
    lines = json.loads((DATA / "public_shapes_detect_secrets.json").read_text())
    rng = random.Random(seed)
    out = []
    for number, line in enumerate(lines):
        before, _, after = line["template"].partition("<SECRET>")
        for kind in CODE_LINE_VALUES:
            value = _code_line_value(kind, rng)
            sample = Sample(line["source"], f"{line['list']}:{number}", kind, "", value, "generated")
            out.append(Placed(sample, line["list"], str(number), before + value + after, len(before),
                              len(before) + len(value)))
    return out


# Real credentials present in the public OpenClaw fixture (an openclaw.json printed by a tool and an
# env dump): finding them is right. Identified by file, line and a fingerprint under AUDIT_KEY.
AUDIT_KEY = b"veritas-watch-fixture-audit"
FIXTURE_SECRETS = {
    ("06826999-c084-45d8-9da5-236646ccc145.jsonl", 8, "11049465"),  # OPENCLAW_GATEWAY_TOKEN
    ("27f2e411-11f0-4e15-95d7-cc5e7979b99e.jsonl", 21, "7fb1beb7"),  # hooks.token
    ("27f2e411-11f0-4e15-95d7-cc5e7979b99e.jsonl", 21, "ff518128"),  # LINE channelAccessToken
    ("27f2e411-11f0-4e15-95d7-cc5e7979b99e.jsonl", 21, "e63905f7"),  # LINE channelSecret
    ("27f2e411-11f0-4e15-95d7-cc5e7979b99e.jsonl", 21, "11049465"),  # gateway.auth.token
    ("27f2e411-11f0-4e15-95d7-cc5e7979b99e.jsonl", 22, "54d4287f"),  # operator device token
    ("27f2e411-11f0-4e15-95d7-cc5e7979b99e.jsonl", 36, "7fb1beb7"),
    ("27f2e411-11f0-4e15-95d7-cc5e7979b99e.jsonl", 36, "ff518128"),  # the same token, terminal-wrapped
    ("27f2e411-11f0-4e15-95d7-cc5e7979b99e.jsonl", 36, "e63905f7"),
    ("27f2e411-11f0-4e15-95d7-cc5e7979b99e.jsonl", 36, "11049465"),
}


def _message_texts(node: Any) -> Iterator[str]:
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


def false_positives(
    messages: list[tuple[str, int, str]], detect: Any, fingerprint: Any
) -> list[tuple[str, int, str, str]]:
    """(where, line, rule, context) of every finding in ordinary chat that is not a known fixture secret."""
    out = []
    for where, number, text in messages:
        for match in detect(text):
            if (where, number, fingerprint(match.value, AUDIT_KEY)) in FIXTURE_SECRETS:
                continue
            context = text[max(0, match.start - 60) : match.start] + "<<<" + text[match.start : match.end] + ">>>"
            out.append((where, number, match.rule, context[-200:]))
    return out


def file_paragraphs(paths: Iterable[Path], root: Path) -> list[tuple[str, int, str]]:
    """Text files read as chat, one message per paragraph: (file under root, paragraph number, text).
    Files that are not UTF-8 are skipped; a paragraph is cut at 20,000 characters."""
    out = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for number, paragraph in enumerate(re.split(r"\n\s*\n", text)):
            if paragraph.strip():
                out.append((str(path.relative_to(root)), number, paragraph[:20000]))
    return out


def transcript_messages(shared: Path) -> list[tuple[str, int, str]]:
    root = shared / "fixtures" / "openclaw" / "zapabob-main" / "sessions"
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


def locomo_messages(shared: Path) -> list[tuple[str, int, str]]:
    samples = json.loads((shared / "fixtures" / "locomo" / "locomo10-dev.json").read_text(encoding="utf-8"))
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


# ---------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Tally:
    found: int = 0
    total: int = 0

    @property
    def recall(self) -> float:
        return self.found / self.total if self.total else 1.0


@dataclass
class Recall:
    overall: Tally
    by_family: dict[str, Tally]
    by_shape: dict[str, Tally]
    by_rule: dict[str, Tally]
    misses: list[tuple[Placed, str]]  # what was missed, and how ("missed" or "partial")


def by_context(result: Recall) -> dict[str, Tally]:
    """The recall of each of the six CONTEXTS, from the shapes that write it."""
    out: dict[str, Tally] = {}
    for context, shapes in CONTEXTS.items():
        tally = out.setdefault(context, Tally())
        for shape in shapes:
            part = result.by_shape.get(shape, Tally())
            tally.found += part.found
            tally.total += part.total
    return out


def caught(spans: list[tuple[int, int]], start: int, end: int) -> str:
    """'ok' if one span covers [start, end), 'partial' if spans only touch it, else 'missed'."""
    if any(s <= start and e >= end for s, e in spans):
        return "ok"
    if any(s < end and e > start for s, e in spans):
        return "partial"
    return "missed"


def measure(placed: list[Placed], spans_of: Any) -> Recall:
    """Recall of `spans_of(text) -> [(start, end)]` over the placed secrets."""
    result = Recall(Tally(), {}, {}, {}, [])
    for p in placed:
        how = caught(spans_of(p.text), p.start, p.end)
        ok = how == "ok"
        for table, key in ((result.by_family, p.sample.family), (result.by_shape, p.shape),
                           (result.by_rule, p.sample.rule)):
            tally = table.setdefault(key, Tally())
            tally.total += 1
            tally.found += ok
        result.overall.total += 1
        result.overall.found += ok
        if not ok:
            result.misses.append((p, how))
    return result
