"""Rebuild the public-rule sample files under tests/data/ from four secret scanners' published rules.

The recall corpora of tests/secret_corpus_public.py are built from secrets nobody here wrote:

- tuning set: gitleaks (`config/gitleaks.toml` and the sample secrets in
  `cmd/generate/config/rules/*.go`). For every rule: the literal samples its authors wrote, and
  values generated at random from the rule's own regex (the secret capture group only).
- held-out set: Nosey Parker (`crates/noseyparker/data/default/builtin/rules/*.yml`): the secrets of
  every rule's `examples` (found with the rule's own pattern) and values generated from the pattern.
  Never tuned on: detection was written from the providers' formats and the tuning set only.

- third set: TruffleHog (`pkg/detectors/<name>/<name>_test.go`, the pattern tests beside each
  detector). For every test case whose input and expected results read as strings (literals, constants,
  `fmt.Sprintf`, `+`): the credential of each expected result, with the test's input as its example
  text; cases that expect nothing are kept as negative examples. The detector's keywords and name give
  the identifier (`abuseipdb`); its regexes only label the parts of a result. Measured blind first
  (README), its misses read afterwards. Which part of a result is the credential:
  * a result TruffleHog joins from several values (`<key><id>`, `<id>:<secret>`, `user:ATBB...`, or a
    JSON object such as `{"accountName": ..., "accountKey": ...}`) is split back into the values found in
    the input (the detector's capture groups, else the input's words, joined by nothing or by one of
    `: / ; | , @ - _ .`); each part is named by its JSON key, its named group (`password`) or its
    pattern variable (`idPat`, `secretPat`). The credential is the longest part not named like an
    identifier (id, user, email, URL, host, domain, endpoint, account, org, tenant, region, ...; a name
    that also says key, secret, token or password is a credential: `accountKey`, `clientSecret`), and
    beside a key an endpoint URL, an e-mail address or a host name is never it;
  * a URL's credential is the password of its userinfo or of a `password=` parameter; a URL with a
    token in its path (webhooks: Discord, Slack, Tines, Zapier) is a credential whole; a URL with
    neither (`jdbc:mysql://host:3306/db`, `https://jira.corp.com`) holds none and is dropped;
  * a connection string (`Endpoint=...;Id=...;Secret=...`) gives its `Secret`/`Password` field;
  * a result that is only an identifier (an e-mail address reported alone) is dropped;
  * test filler (one character repeated twelve times, `API-AAAA...`, `shippo_live_1111...`, or a counted
    run, `1234567890abcdef...`) is kept as a documented example, not a secret.

- fourth set: Kingfisher (`data/rules/*.yml`, Nosey Parker's format): read as Nosey Parker's is, measured
  blind first (README). Rules that find only what accompanies a credential (`visible: false`, names ending
  in ID, Domain, Host, Username, an instance URL) and password hashes are skipped.

- fifth set, code lines: detect-secrets (`tests/plugins/keyword_test.py`, its keyword detector's tests in
  config, Go, C, C++, Objective-C, C#, Java, Python, JS, Swift and Terraform syntax): every line its
  authors expect a secret in, with the secret replaced by `<SECRET>` (`public_shapes_detect_secrets.json`);
  tests/secret_corpus_public.py puts generated values of four kinds into each line. Measured blind first
  (README). Its own values (`m{{h}o)p${e]nob(ody…`, a phrase with spaces, `A,.:-¨@*¿?!`) are not kept.

- sixth set: secretlint (`packages/@secretlint/secretlint-rule-*/test/snapshots/*`): the value each finding of
  a rule's snapshot tests names, with the test input as its example text; cases without findings are negative
  examples; values generated from the rules' regex literals (`secretlint_samples`). Measured blind first.

- seventh set, held out (issue 37): semgrep-rules' own secret rules (`generic/secrets/security/*.yaml` and the
  test file beside each): the secret of every `ruleid:` case (the rule's `SECRET` group, else its match), the
  case as its example text; `ok:` cases are negative examples; values generated from the rules' regexes.
  Measured once, its misses not read.

- eighth set, held out (issue 37): secrets-patterns-db (mazen160/secrets-patterns-db, `db/rules-stable.yml`), a
  pattern database without test cases: values generated from its high-confidence rules' regexes (the capture
  group where a keyword and `.{0,40}` come first); rules for what goes with a key (ARNs, buckets, hosts, ids,
  URLs, e-mail addresses, the later parts of a multi-part rule) skipped. Measured blind first.

Every set: a URL with a password in its userinfo gives the password; a sample that is a published example
(the detector's `is_documented_example`) is `documented_example`, test filler (`abc123def456...`,
`1234567890`, a unit said three times) is `filler`, and neither is counted by the recall measurement.

Only data is written (rule id, the identifier a user would name the secret with, the secret, and
for the scanners' own examples the text around it); no scanner code is copied. Run it again with
checkouts of the repositories to regenerate:

  .venv/bin/python bench/rule_samples.py --gitleaks ../gitleaks --noseyparker ../noseyparker
  .venv/bin/python bench/rule_samples.py --trufflehog ../trufflehog
  .venv/bin/python bench/rule_samples.py --kingfisher ../kingfisher
  .venv/bin/python bench/rule_samples.py --detect-secrets ../detect-secrets
  .venv/bin/python bench/rule_samples.py --secretlint ../secretlint
  .venv/bin/python bench/rule_samples.py --semgrep ../semgrep-rules
  .venv/bin/python bench/rule_samples.py --spdb ../secrets-patterns-db
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sre_constants as c
import sre_parse
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from veritas_watch.transforms.redact.base import is_documented_example  # noqa: E402

OUT = REPO / "tests" / "data"
PRINTABLE = [chr(i) for i in range(33, 127)]
PER_RULE = 8  # generated values per rule
# A rule that takes "any non-space character" (`\S`, `[^'"]`) is sampled from the characters
# passwords and keys are made of: letters, digits and common punctuation, not quotes or brackets.
PASSWORD_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!@#$%^&*-_+=.~"


# ---------------------------------------------------------------------------------------------
# Go/Rust regex -> Python re

_POSIX = {
    "alnum": "a-zA-Z0-9",
    "alpha": "a-zA-Z",
    "digit": "0-9",
    "xdigit": "0-9a-fA-F",
    "upper": "A-Z",
    "lower": "a-z",
    "space": r"\s",
    "punct": r"!-/:-@\[-`{-~",
    "word": r"\w",
}


def to_python(pattern: str) -> tuple[str, int]:
    flags = 0
    p = pattern
    p = re.sub(r"\[:(\w+):\]", lambda m: _POSIX.get(m.group(1), m.group(0)), p)
    p = p.replace(r"\z", r"\Z").replace(r"\A", r"\A")
    p = re.sub(r"\\x\{([0-9A-Fa-f]+)\}", lambda m: "\\x" + m.group(1).zfill(2) if len(m.group(1)) <= 2 else
               "\\u" + m.group(1).zfill(4), p)
    p = p.replace(r"\p{L}", "a-zA-Z").replace(r"\p{N}", "0-9")
    # global flags anywhere: Python wants them first (case-insensitivity on everything is a superset)
    while True:
        m = re.search(r"\(\?([imsx-]+)\)", p)
        if not m:
            break
        for ch in m.group(1).split("-")[0]:
            flags |= {"i": re.I, "m": re.M, "s": re.S, "x": re.X}[ch]
        p = p[: m.start()] + p[m.end() :]
    p = re.sub(r"\(\?-?u:", "(?:", p)
    p = re.sub(r"\(\?([ims]*)-[ims]+:", lambda m: "(?" + m.group(1) + ":" if m.group(1) else "(?:", p)
    return p, flags


# ---------------------------------------------------------------------------------------------
# Random strings from a regex


class Gen:
    def __init__(self, rng: random.Random, max_extra: int = 24) -> None:
        self.rng = rng
        self.max_extra = max_extra
        self.groups: dict[int, str] = {}

    def chars_of(self, items: list[Any]) -> list[str]:
        negate = False
        out: set[str] = set()
        for op, av in items:
            if op is c.NEGATE:
                negate = True
            elif op is c.LITERAL:
                out.add(chr(av))
            elif op is c.RANGE:
                lo, hi = av
                out.update(chr(i) for i in range(lo, min(hi, 126) + 1) if i >= 32)
            elif op is c.CATEGORY:
                out.update(self.category(av))
        if negate:
            # "anything but ...": draw from what passwords are made of, not from quotes and brackets
            return [ch for ch in PASSWORD_CHARS if ch not in out]
        return sorted(ch for ch in out if 32 <= ord(ch) < 127) or sorted(out)

    @staticmethod
    def category(cat: Any) -> list[str]:
        if cat is c.CATEGORY_DIGIT:
            return list("0123456789")
        if cat is c.CATEGORY_WORD:
            return list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
        if cat is c.CATEGORY_SPACE:
            return [" "]
        if cat is c.CATEGORY_NOT_SPACE:
            return list(PASSWORD_CHARS)
        if cat is c.CATEGORY_NOT_DIGIT:
            return list("abcdefghijklmnopqrstuvwxyz")
        if cat is c.CATEGORY_NOT_WORD:
            return list("-.:/ ")
        return list("abc")

    def run(self, parsed: Any) -> str:
        out: list[str] = []
        for op, av in parsed:
            out.append(self.one(op, av))
        return "".join(out)

    def one(self, op: Any, av: Any) -> str:
        rng = self.rng
        if op is c.LITERAL:
            return chr(av)
        if op is c.NOT_LITERAL:
            return rng.choice([ch for ch in PRINTABLE if ord(ch) != av])
        if op is c.ANY:
            # a lone `.` in a scanner's pattern is nearly always an unescaped literal dot
            # (`hooks.slack.com`); inside a repeat (`.{4}`) it stands for any character
            rng.choice("abcdefghijklmnopqrstuvwxyz0123456789")  # drawn as before: other values stay the same
            return "."
        if op is c.IN:
            return rng.choice(self.chars_of(av))
        if op is c.CATEGORY:
            return rng.choice(self.category(av))
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = av
            single = len(sub) == 1 and sub[0][0] in (c.IN, c.LITERAL, c.CATEGORY, c.ANY, c.NOT_LITERAL)
            wild = single and sub[0][0] is c.ANY
            if op is c.MIN_REPEAT or not single or wild:
                n = lo
            else:
                top = min(hi, lo + self.max_extra) if hi != c.MAXREPEAT else lo + self.max_extra
                n = rng.randint(lo, max(lo, top))
            if wild:
                return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(n))
            return "".join(self.run(sub) for _ in range(n))
        if op is c.SUBPATTERN:
            group, _add, _del, sub = av
            s = self.run(sub)
            if group is not None:
                self.groups[group] = s
            return s
        if op is c.BRANCH:
            return self.run(rng.choice(av[1]))
        if op is c.GROUPREF:
            return self.groups.get(av, "")
        if op in (c.AT, c.ASSERT, c.ASSERT_NOT):
            return ""
        if op is getattr(c, "ATOMIC_GROUP", None):
            return self.run(av)
        raise ValueError(f"unsupported {op}")


def secret_of(m: re.Match[str], group: int | None, *, last: bool = False) -> str:
    return _clean(_secret_of(m, group, last=last))


def _clean(secret: str) -> str:
    """The credential itself: no surrounding quotes, no `name:` of a YAML line the rule captured."""
    secret = secret.strip()
    escaped = re.fullmatch(r"\\([\"'])(.+?)\\\1?", secret)
    if escaped:
        secret = escaped.group(2)  # a quoted value inside a C-style string: `\"goodspec\"`
    if len(secret) >= 2 and secret[0] == secret[-1] and secret[0] in "\"'`":
        secret = secret[1:-1].strip()
    if re.match(r"[\w.-]+:[ \t]+\S", secret):
        secret = secret.split(":", 1)[1].strip().strip("\"'")
    # a boundary character some rules capture with the token (`(?:[^a-zA-Z0-9+/]|\z)`), or the separator
    # ahead of it (`[=:-]?` inside the group: `=1a2b...`)
    return secret.rstrip("\"'`()[]{},;<>|\\").lstrip("=:")


_LINE_DEBRIS_RE = re.compile(r"^(?:\s|[+\"'`]|\\[rn])+|(?:\s|[+\"'`]|\\[rn])+$")
_INTERPOLATION_RE = re.compile(r"#\{|\$\{|\{\{|<%=?")
_CONNECTION_PASSWORD_RE = re.compile(r"(?i)(?:^|;)\s*(?:password|pwd)\s*=\s*([^;\"']+)")


def final_secret(sample: dict[str, Any]) -> dict[str, Any] | None:
    """The credential a placed sample must hide, once more (applied to fresh and to stored samples):
    - a key body a rule captured across string concatenation or escaped line breaks starts and ends
      with that debris (`+\\n"b3Bl...` / `\\r\\nb3Bl...\\r\\n`): the key is what lies between;
    - a connection string (`Server=...;User ID=...;Password=#gets0m3;...`): its secret is the password,
      the server, database and user names around it are not;
    - a template expression (`#{datastore['DBPASSWORD']}`, `${DB_PASS}`) holds no secret: dropped.
    """
    secret = sample["secret"]
    if not secret:
        return sample
    if _INTERPOLATION_RE.search(secret):
        return None
    if "\n" in secret or "\\n" in secret:
        secret = _LINE_DEBRIS_RE.sub("", secret)
    conn = _CONNECTION_PASSWORD_RE.search(secret) if secret.count(";") >= 2 and "=" in secret else None
    if conn:
        secret = conn.group(1).strip()
    if secret[-1] in "\"'" and secret[0] != secret[-1]:
        secret = secret[:-1]  # the closing quote of the string a rule read the key from (`Key=...w="`)
    return {**sample, "secret": secret}


def placeholder(secret: str) -> str | None:
    """What a sample is when it is no key: `documented_example` for the examples published for copying,
    which the detector must leave visible (`AKIAIOSFODNN7EXAMPLE`, `ghu_xxxx...`, `QQQQ...`); `filler` for
    test filler (`abc123def456...`, `1234567890`, a dictionary word under a password rule), which is neither
    a hit nor a miss of the recall measurement (hiding it or not is the detector's choice)."""
    if is_documented_example(secret):
        return "documented_example"
    if (
        _PLACEHOLDER_RE.search(secret)
        or _PLACEHOLDER_WORD_RE.fullmatch(secret)
        or any(set(m.group(1)) - _ZERO_BYTES for m in _REPEATED_UNIT_RE.finditer(secret))
        or (len(secret) >= 20 and len(set(secret)) <= 8)  # `6Lcr--w-BBBBBw-w-w----w-w-www-...`
    ):
        return "filler"
    return None


# Filler: the words, `x`/`*` runs and repeated characters docs use, an alphabet or a count written out
# (`abcdefghij`, `1234567890`), runs of two characters (`aaaabbbb`), the UUID of RFC 4122's example and
# md5("hello"). Runs of `A` are left out: base64 of zero bytes, which real formats hold (Dropbox's
# `AAAAAAAAAA`, Twitter's bearer tokens, OpenSSH key bodies).
_PLACEHOLDER_RE = re.compile(
    r"GOES_HERE|YOUR_|(?i:abcdefghij|bcdefghijk)|"
    r"1234567890|0123456789|zyxwvutsrq|ZYXWVUTSRQ|(?i:abcd1234|abc123|1a2b3c4d)|([^A])\1{3}(?!\1)([^A])\2{3}|"
    r"123e4567-e89b-12d3-a456-42661417400|5d41402abc4b2a76b9719d911017c592"
)
# A short unit said three times or more (`abcdef12abcdef12abcdef12`, `GFPYYSJZGFPYYSJZ...`), unless it is
# made of what base64 writes for zero bytes or ASCII zeros (`AAA`, `MDAw`)
_REPEATED_UNIT_RE = re.compile(r"(.{3,10}?)\1{2,}")
_ZERO_BYTES = frozenset("AMDwg=")
_PLACEHOLDER_WORD_RE = re.compile(
    r"(?i)password|passwd|secret|changeme|mypass(?:word)?|hunter2|letmein|contoso|some_password|\w+_password"
)


_NOT_SECRET_LABEL_RE = re.compile(r"(?i)\b(?:user(?:name)?|host(?:name)?|path|api key|client id|id)\b")


def group_labels(pattern: str) -> list[str]:
    """The `(?# ...)` comment written after each capture group of a verbose pattern (`(?# username )`), or ""."""
    opens: list[int] = []
    spans: list[tuple[int, int]] = []
    stack: list[int | None] = []
    i, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            if pattern.startswith("[^]", i) or pattern.startswith("[]", i):
                i += 2 if pattern[i + 1] == "]" else 3
                continue
        elif ch == "(":
            if pattern.startswith("(?#", i):
                i = pattern.find(")", i) + 1 or len(pattern)
                continue
            capturing = not pattern.startswith("(?", i) or pattern.startswith("(?P<", i)
            stack.append(len(opens) if capturing else None)
            if capturing:
                opens.append(i)
                spans.append((i, -1))
        elif ch == ")" and stack:
            idx = stack.pop()
            if idx is not None:
                spans[idx] = (spans[idx][0], i)
        i += 1
    labels = []
    for _start, end in spans:
        line_end = pattern.find("\n", end)
        rest = pattern[end : line_end if line_end >= 0 else len(pattern)]
        m = re.search(r"\(\?#([^)]*)\)", rest)
        labels.append(m.group(1).strip() if m else "")
    return labels


def secret_group(pattern: str, groups: int) -> int | None:
    """Which capture group holds the credential, from the pattern's own comments: the one labelled a
    password or secret, else the last one not labelled a username, host, path or id; None if unlabelled."""
    labels = group_labels(pattern)
    if len(labels) != groups or not any(labels):
        return None
    for n, label in enumerate(labels, 1):
        if re.search(r"(?i)password|secret", label):
            return n
    candidates = [n for n, label in enumerate(labels, 1) if not _NOT_SECRET_LABEL_RE.search(label)]
    return candidates[-1] if candidates else None


def _secret_of(m: re.Match[str], group: int | None, *, last: bool = False) -> str:
    if group:
        return m.group(group) or ""
    if last and m.re.groups > 1:  # user, host, password: the credential comes last
        return next((g for g in reversed(m.groups()) if g), m.group(0))
    if m.re.groups:
        return next((g for g in m.groups() if g), m.group(0))
    # no group: the match may end with the boundary character the rule requires (`[^a-zA-Z0-9+/]`)
    return re.sub(r"[^A-Za-z0-9+/=_\-.]$", "", m.group(0))


def generate(pattern: str, group: int | None, rng: random.Random, n: int, *, last: bool = False) -> list[str]:
    py, flags = to_python(pattern)
    try:
        compiled = re.compile(py, flags)
        parsed = sre_parse.parse(py, flags)
    except (re.error, ValueError, OverflowError) as exc:
        print(f"  skip pattern ({exc}): {pattern[:80]}", file=sys.stderr)
        return []
    if compiled.groups > 1 and ".*" in py:
        return []  # a multi-line record (mailer settings, ODBC strings): its examples are used instead
    out: list[str] = []
    tries = 0
    while len(out) < n and tries < n * 30:
        tries += 1
        gen = Gen(rng)
        try:
            text = gen.run(parsed)
        except (ValueError, IndexError, RecursionError):
            return out
        m = compiled.search(" " + text + " ")
        if not m:
            continue
        secret = secret_of(m, group, last=last).strip()
        if len(secret) >= 8 and secret not in out and "\n" not in secret:
            out.append(secret)
    return out


# ---------------------------------------------------------------------------------------------
# gitleaks

_GO_STR = r"(?:`(?P<raw>[^`]*)`|\"(?P<dq>(?:[^\"\\\n]|\\.)*)\")"


def _go_unquote(m: re.Match[str]) -> str:
    if m.group("raw") is not None:
        return m.group("raw")
    return bytes(m.group("dq"), "utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")


def _go_literals(source: str) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """rule id -> {"samples": [(identifier, secret)], "tps": [(text, "")], "fps": [(text, "")]}."""
    out: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for func in re.split(r"\nfunc ", source):
        rid = re.search(r"RuleID:\s*\"([^\"]+)\"", func)
        if not rid:
            continue
        entry = out.setdefault(rid.group(1), {"samples": [], "tps": [], "fps": []})
        for m in re.finditer(r"GenerateSampleSecrets?\(\s*\"([^\"]*)\",\s*" + _GO_STR + r"\s*\)", func):
            entry["samples"].append((m.group(1), _go_unquote(m)))
        for kind in ("tps", "fps"):
            for block in re.finditer(kind + r"\s*(?::=|=)\s*(?:append\(" + kind + r",|\[\]string\{)(.*?)\n\t[)}]",
                                     func, re.S):
                body = block.group(1)
                # top-level literals only: a literal followed by `+` or `,` at line level
                for lm in re.finditer(r"(?m)^\s*" + _GO_STR + r"\s*,?\s*(?://.*)?$", body):
                    entry[kind].append((_go_unquote(lm), ""))
    return out


def _family(rule_id: str) -> str:
    r = rule_id.lower()
    table = [
        ("private", ("private-key", "pkcs12", "age-secret", "pem", "ssh", "pgp", "putty", "wireguard")),
        ("ai", ("openai", "anthropic", "cohere", "huggingface", "perplexity", "groq", "privateai", "jina",
                "tavily", "firecrawl", "kagi", "bedrock")),
        ("cloud", ("aws", "azure", "gcp", "google", "alibaba", "yandex", "digitalocean", "cloudflare", "heroku",
                   "flyio", "fly", "scalingo", "openshift", "ibm", "oracle", "linode", "vultr", "kubernetes",
                   "hashicorp", "vault", "doppler", "pulumi", "databricks", "snowflake", "infracost", "planetscale",
                   "clickhouse", "confluent", "netlify", "vercel", "nasa", "vmware", "truenas", "particle",
                   "thingsboard", "blynk", "defined-networking", "1password", "settlemint", "harness")),
        ("code", ("github", "gitlab", "bitbucket", "atlassian", "npm", "pypi", "rubygems", "nuget", "clojars",
                  "jfrog", "artifactory", "sonar", "snyk", "codecov", "travis", "drone", "circle", "sourcegraph",
                  "docker", "octopus", "prefect", "readme", "postman", "linear", "gitter", "crates", "gradle",
                  "jenkins", "teamcity", "codeclimate", "dependency", "django", "react", "sauce", "stackhawk",
                  "gitalk", "frameio", "launchdarkly", "sidekiq", "freemius", "authress", "okta", "auth0",
                  "salesforce", "sentry", "grafana", "new-relic", "newrelic", "datadog", "dynatrace", "sumologic",
                  "segment", "zendesk", "intercom", "asana", "notion", "airtable", "contentful", "typeform",
                  "figma", "adobe", "adafruit", "looker", "hubspot", "beamer", "mattermost", "intra42")),
        ("messaging", ("slack", "discord", "telegram", "twilio", "sendgrid", "sendinblue", "mailgun", "mailchimp",
                       "messagebird", "sendbird", "teams", "microsoft", "twitch", "twitter", "facebook", "linkedin",
                       "postmark", "mapbox", "flickr", "etsy", "nytimes", "yandex", "squarespace", "lob", "easypost",
                       "shippo", "duffel", "maxmind", "rapidapi", "finnhub", "dropbox", "mongo")),
        ("payments", ("stripe", "square", "paypal", "braintree", "shopify", "plaid", "coinbase", "kraken",
                      "kucoin", "bittrex", "flutterwave", "gocardless", "finicity", "freshbooks")),
        ("url_and_auth", ("curl", "http", "netrc", "postgres", "odbc", "jdbc", "url", "psexec", "phpmailer")),
        ("jwt", ("jwt",)),
    ]
    for family, words in table:
        if any(w in r for w in words):
            return family
    return "generic" if "generic" in r or "password" in r or "secret" in r or "hashes" in r else "other"


def _identifier(rule_id: str, keywords: list[str]) -> str:
    """The name a user gives the secret: the provider part of the rule id (`twitter-api-key` -> twitter)."""
    head = re.split(r"[-._]", rule_id.lower().removeprefix("np."))[0]
    return re.sub(r"[^a-z0-9]", "", head) or (keywords[0] if keywords else "service")


# Rules whose regex admits far more than the format (any junk between PEM lines, a YAML document, a
# shell line): values generated from them are noise, so only the samples their authors wrote count.
_EXAMPLES_ONLY = frozenset(
    {"private-key", "jwt-base64", "kubernetes-secret-yaml", "curl-auth-header", "curl-auth-user", "pkcs12-file",
     "generic-api-key"}
)


# Nosey Parker's likewise: the PEM rule's body class (`[a-zA-Z0-9+/=\s\\r\\n]`...) yields line-break soup.
_NP_EXAMPLES_ONLY = frozenset({"np.pem.1"})


def gitleaks_samples(root: Path, rng: random.Random) -> list[dict[str, Any]]:
    config = tomllib.loads((root / "config" / "gitleaks.toml").read_text(encoding="utf-8"))
    literals: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for path in sorted((root / "cmd" / "generate" / "config" / "rules").glob("*.go")):
        for rid, entry in _go_literals(path.read_text(encoding="utf-8")).items():
            literals.setdefault(rid, {"samples": [], "tps": [], "fps": []})
            for k, v in entry.items():
                literals[rid][k].extend(v)
    out: list[dict[str, Any]] = []
    for rule in config["rules"]:
        rid = rule["id"]
        pattern = rule.get("regex")
        group = rule.get("secretGroup")
        keywords = [k.lower() for k in rule.get("keywords", [])]
        ident = _identifier(rid, keywords)
        family = _family(rid)
        base = {"source": "gitleaks", "rule": rid, "family": family, "ident": ident}
        seen: set[str] = set()
        lit = literals.get(rid, {"samples": [], "tps": [], "fps": []})
        for sample_ident, raw in lit["samples"]:
            secret = _clean(raw) if "\n" not in raw.strip() else raw
            if secret and secret not in seen and "\n" not in secret.strip():
                seen.add(secret)
                out.append({**base, "ident": sample_ident or ident, "secret": secret, "origin": "literal"})
            elif secret and "\n" in secret and secret not in seen:
                seen.add(secret)
                out.append({**base, "secret": secret, "origin": "literal"})
        if pattern:
            py, flags = to_python(pattern)
            try:
                compiled: re.Pattern[str] | None = re.compile(py, flags)
            except re.error:
                compiled = None
            for text, _ in lit["tps"]:
                if compiled is None or ("\n" in text and len(text) > 4000):
                    continue
                m = compiled.search(text)
                if m:
                    secret = secret_of(m, group).strip()
                    if len(secret) >= 8 and secret not in seen:
                        seen.add(secret)
                        out.append({**base, "secret": secret, "origin": "literal", "example": text})
            for secret in [] if rid in _EXAMPLES_ONLY else generate(pattern, group, rng, PER_RULE):
                if secret not in seen:
                    seen.add(secret)
                    out.append({**base, "secret": secret, "origin": "generated"})
        for text, _ in lit["fps"]:
            out.append({**base, "secret": "", "origin": "negative", "example": text})
    return out


# ---------------------------------------------------------------------------------------------
# Nosey Parker


def noseyparker_samples(root: Path, rng: random.Random) -> list[dict[str, Any]]:
    rules_dir = root / "crates" / "noseyparker" / "data" / "default" / "builtin" / "rules"
    return yaml_rule_samples(sorted(rules_dir.glob("*.yml")), "noseyparker", rng, _NP_EXAMPLES_ONLY)


def kingfisher_samples(root: Path, rng: random.Random) -> list[dict[str, Any]]:
    """Kingfisher (`data/rules/*.yml`) writes its rules in Nosey Parker's format, with its own examples."""
    return yaml_rule_samples(sorted((root / "data" / "rules").glob("*.yml")), "kingfisher", rng, _KF_EXAMPLES_ONLY)


# Kingfisher's rules whose regex admits far more than the format: PEM bodies of any characters, a service
# account's JSON document.
_KF_EXAMPLES_ONLY = frozenset({"kingfisher.pem.1", "kingfisher.pem.2", "kingfisher.privkey.1", "kingfisher.privkey.2",
                               "kingfisher.gcp.1", "kingfisher.gcp.3"})


# Rules that find what accompanies a credential (an account, client or key id, a host, a domain, a user
# name, an instance URL), a password hash, or a bare dictionary word: not credentials themselves.
_NOT_A_CREDENTIAL_RULE_RE = re.compile(
    r"(?i)\b(?:id|domain|host|username|org name|account name)$|\b(?:instance|search|jfrog) url$|"
    r"password hash|weak password"
)
_URL_USERINFO_RE = re.compile(r"^[a-z][\w+.-]*://[^/\s:@]*:(\S+)@[^@\s/]+(?:[/?#]\S*)?$", re.I)


def _url_password(found: str) -> str | None:
    """A URL with a password in its userinfo: the password is the credential (it may hold `@`: the host
    follows the last one), not the user, host and path around it."""
    m = _URL_USERINFO_RE.match(found.strip().strip("\"'`"))
    return m.group(1) if m else None


def yaml_rule_samples(paths: list[Path], source: str, rng: random.Random,
                      examples_only: frozenset[str]) -> list[dict[str, Any]]:
    """The secrets of every rule's `examples` (found with the rule's own pattern) and values generated from it."""
    out: list[dict[str, Any]] = []
    for path in paths:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for rule in doc.get("rules", []):
            cats = set(rule.get("categories") or [])
            if "identifier" in cats or "hashed" in cats or "public" in rule["name"].lower() \
                    or rule.get("visible") is False or _NOT_A_CREDENTIAL_RULE_RE.search(rule["name"]):
                continue
            rid = f"{path.stem}:{rule['name']}"
            pattern = rule["pattern"]
            ident = re.sub(r"[^a-z0-9]", "", path.stem.lower().split(".")[0]) or "service"
            base = {"source": source, "rule": rid, "family": _family(path.stem + " " + rule["name"]),
                    "ident": ident}
            py, flags = to_python(pattern)
            try:
                compiled = re.compile(py, flags)
            except re.error as exc:
                print(f"  skip {rid}: {exc}", file=sys.stderr)
                continue
            seen: set[str] = set()
            # several groups (user, password, host): the pattern's comments say which is the secret
            group = secret_group(pattern, compiled.groups) if compiled.groups > 1 else None
            for example in rule.get("examples", []) or []:
                m = compiled.search(example)
                if not m:
                    continue
                secret = _url_password(m.group(0)) or secret_of(m, group, last=True).strip()
                if re.fullmatch(r"\$\{?\w+\}?|%\w+%", secret):
                    continue  # `-Password $password`: a variable, the example holds no secret
                if len(secret) >= 6 and secret not in seen:
                    seen.add(secret)
                    out.append({**base, "secret": secret, "origin": "example", "example": example})
            try:
                generated = [] if rule.get("id") in examples_only else generate(pattern, group, rng, PER_RULE,
                                                                                last=True)
            except (re.error, ValueError, RecursionError) as exc:
                print(f"  no generated values for {rid}: {exc}", file=sys.stderr)
                generated = []
            # a character the rule's regex admits but none of its examples uses (a `\\` inside a base64
            # class) is a slip of the regex, not of the format
            backslash = any("\\" in e for e in seen)
            for secret in (_url_password(g) or g for g in generated):
                if secret not in seen and (backslash or "\\" not in secret):
                    seen.add(secret)
                    out.append({**base, "secret": secret, "origin": "generated"})
            for example in rule.get("negative_examples", []) or []:
                out.append({**base, "secret": "", "origin": "negative", "example": example})
    return out


# ---------------------------------------------------------------------------------------------
# TruffleHog (the third set)

_GO_TOKEN_RE = re.compile(
    r"//[^\n]*|/\*.*?\*/|`[^`]*`|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|[A-Za-z_][\w.]*|\d+|:=|\S", re.S
)
# A part of a combined result named like these is what accompanies a key (an account, a user, a URL, a
# region), not the credential; a name that also says key, secret, token or password is the credential.
_TH_IDENT_NAME_RE = re.compile(
    r"(?i)id|user|email|mail|url|uri|host|domain|endpoint|org|tenant|region|name|project|server|sub|instance|"
    r"workspace|team|zone|base|location|phone|account|env|app|client|login|site|shop|store|cloud|realm|"
    r"environment|version|datacenter|dc|cluster|port|path|company|bucket|registry"
)
_TH_SECRET_NAME_RE = re.compile(r"(?i)secret|key|token|pass|pword|pwd|cred|auth|sig|private|refresh|pat$")


def _th_is_identifier(label: str) -> bool:
    label = re.sub(r"(?i)pat(tern)?s?$", "", label)
    return bool(_TH_IDENT_NAME_RE.search(label)) and not _TH_SECRET_NAME_RE.search(label)


class _GoExpr:
    """Just enough of Go's expression syntax to read a test's string constants and its test-case table:
    string literals, `+`, `fmt.Sprintf`, `strings.Repeat`, `[]string{...}`, `[]byte(...)`, identifiers."""

    def __init__(self, source: str) -> None:
        self.tokens = [t for t in _GO_TOKEN_RE.findall(source) if not t.startswith(("//", "/*"))]
        self.defs: dict[str, int] = {}
        for i in range(len(self.tokens) - 2):
            name, op = self.tokens[i], self.tokens[i + 1]
            if op in ("=", ":=") and re.fullmatch(r"[A-Za-z_]\w*", name) and name not in self.defs:
                self.defs[name] = i + 2
        self.depth = 0

    @staticmethod
    def literal(tok: str) -> str | None:
        if tok.startswith("`"):
            return tok[1:-1]
        if tok.startswith('"'):
            try:
                return bytes(tok[1:-1], "utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")
            except (UnicodeDecodeError, UnicodeEncodeError):
                return None
        return None

    def skip(self, i: int) -> int:
        """Past one balanced bracket group starting at tokens[i]."""
        pairs = {"(": ")", "{": "}", "[": "]"}
        stack = [pairs[self.tokens[i]]]
        i += 1
        while stack and i < len(self.tokens):
            tok = self.tokens[i]
            if tok in pairs:
                stack.append(pairs[tok])
            elif tok == stack[-1]:
                stack.pop()
            i += 1
        return i

    def args(self, i: int) -> tuple[list[Any], int]:
        """Comma-separated expressions from tokens[i] (just past an opening bracket) to its closing one."""
        out: list[Any] = []
        toks = self.tokens
        while i < len(toks) and toks[i] not in (")", "}"):
            value, i = self.expr(i)
            out.append(value)
            if i < len(toks) and toks[i] == ",":
                i += 1
            elif i < len(toks) and toks[i] not in (")", "}"):
                return [*out, None], self.skip_to_close(i)
        return out, i + 1

    def skip_to_close(self, i: int) -> int:
        depth = 0
        while i < len(self.tokens):
            tok = self.tokens[i]
            if tok in "({[":
                depth += 1
            elif tok in ")}]":
                if depth == 0:
                    return i + 1
                depth -= 1
            i += 1
        return i

    def expr(self, i: int) -> tuple[Any, int]:
        value, i = self.primary(i)
        while i < len(self.tokens) and self.tokens[i] == "+":
            right, i = self.primary(i + 1)
            value = value + right if isinstance(value, str) and isinstance(right, str) else None
        return value, i

    def primary(self, i: int) -> tuple[Any, int]:
        toks = self.tokens
        if i >= len(toks):
            return None, i
        tok = toks[i]
        lit = self.literal(tok)
        if lit is not None:
            return lit, i + 1
        if tok == "nil":
            return [], i + 1
        if tok == "[" and toks[i + 1 : i + 4] == ["]", "string", "{"]:
            items, j = self.args(i + 4)
            return (items if all(isinstance(x, str) for x in items) else None), j
        if tok == "[":
            j = self.skip(i)
            while j < len(toks) and toks[j] not in ("{", "(", ",", ")", "}"):
                j += 1
            return None, (self.skip(j) if j < len(toks) and toks[j] in "{(" else j)
        if re.fullmatch(r"[A-Za-z_][\w.]*", tok):
            if i + 1 < len(toks) and toks[i + 1] == "(":
                args, j = self.args(i + 2)
                return self.call(tok, args), j
            if i + 1 < len(toks) and toks[i + 1] == "{":
                return None, self.skip(i + 1)
            return self.lookup(tok), i + 1
        if tok in "({[":
            return None, self.skip(i)
        return None, i + 1

    def lookup(self, name: str) -> Any:
        at = self.defs.get(name)
        if at is None or self.depth > 8:
            return None
        self.depth += 1
        try:
            return self.expr(at)[0]
        finally:
            self.depth -= 1

    @staticmethod
    def call(name: str, args: list[Any]) -> Any:
        if name in ("string", "[]byte") and len(args) == 1:
            return args[0]
        if name == "strings.Repeat" and len(args) == 2 and isinstance(args[0], str):
            return None  # the count is a number literal: not read here
        if name == "fmt.Sprintf" and args and isinstance(args[0], str) and all(isinstance(a, str) for a in args[1:]):
            rest = list(args[1:])

            def verb(m: re.Match[str]) -> str:
                if m.group(0) == "%%":
                    return "%"
                if not rest:
                    raise ValueError("missing argument")
                arg = rest.pop(0)
                return json.dumps(arg) if m.group(1) == "q" else arg

            try:
                return re.sub(r"%[-+# 0-9.]*([svqdx])|%%", verb, args[0])
            except ValueError:
                return None
        return None

    def cases(self) -> list[tuple[str, list[str]]]:
        """(input, want) of every test case whose input and want read as strings."""
        toks = self.tokens
        out = []
        for i in range(len(toks) - 2):
            if toks[i] not in ("input", "data") or toks[i + 1] != ":":
                continue
            text, j = self.expr(i + 2)
            if isinstance(text, list) or not isinstance(text, str):
                continue
            k = j
            while k < len(toks) - 2 and not (toks[k] in ("input", "data") and toks[k + 1] == ":"):
                if toks[k] == "want" and toks[k + 1] == ":":
                    want, _ = self.expr(k + 2)
                    if isinstance(want, list):
                        out.append((text, want))
                    break
                k += 1
        return out


def _th_patterns(source: str) -> list[tuple[str, re.Pattern[str]]]:
    """(variable name, compiled regex without its keyword prefix) of a detector's `regexp.MustCompile`s."""
    out = []
    go = _GoExpr(source.replace("detectors.PrefixRegex", "_prefix"))
    for m in re.finditer(r"(?:(\w+)\s*(?::=|=)\s*)?regexp\.MustCompile\(", source):
        name = m.group(1) or ""
        # the keyword prefix only narrows where a scanner looks; the value's own shape is what is kept
        start = source.index("(", m.end() - 1) + 1
        depth, j = 1, start
        while j < len(source) and depth:
            depth += {"(": 1, ")": -1}.get(source[j], 0) if source[j] not in "`\"" else 0
            if source[j] == "`":
                j = source.index("`", j + 1)
            elif source[j] == '"':
                j = re.compile(r'"(?:[^"\\\n]|\\.)*"').match(source, j).end() - 1  # type: ignore[union-attr]
            j += 1
        expr = source[start : j - 1]
        expr = re.sub(r"detectors\.PrefixRegex\([^)]*\)\s*\+", "", expr)
        sub = _GoExpr(expr)
        value, _ = sub.expr(0)
        if not isinstance(value, str):
            value = None
        if value is None:
            continue
        py, flags = to_python(value)
        try:
            out.append((name, re.compile(py, flags)))
        except re.error:
            continue
    del go
    return out


def _th_labelled(text: str, want: str, patterns: list[tuple[str, re.Pattern[str]]]) -> dict[str, str]:
    """value -> label of what the detector's patterns capture in `text` and `want` holds (a named group's
    name, else the pattern's variable name)."""
    labelled: dict[str, str] = {}
    for name, rx in patterns:
        names = {i: n for n, i in rx.groupindex.items()}
        for m in rx.finditer(text):
            groups = [(names.get(i, name), m.group(i)) for i in range(1, rx.groups + 1)] or [(name, m.group(0))]
            for label, g in groups:
                if g and len(g) >= 3 and g in want:
                    labelled.setdefault(g, label)
    return labelled


def _th_split(want: str, labelled: dict[str, str]) -> list[tuple[str, str]] | None:
    """The shortest split of `want` into found values and the separators scanners join them with."""
    best: dict[int, list[tuple[str, str]]] = {0: []}
    for pos in range(len(want) + 1):
        if pos not in best:
            continue
        if pos == len(want):
            return best[pos]
        for sep in ("", ":", "/", ";", "|", ",", " ", "@", "\n", "-", "_", "."):
            if sep and not want.startswith(sep, pos):
                continue
            at = pos + len(sep)
            for value, label in labelled.items():
                if want.startswith(value, at) and at + len(value) not in best:
                    best[at + len(value)] = best[pos] + [(label, value)]
    return None


def _th_parts(want: str, text: str, patterns: list[tuple[str, re.Pattern[str]]]) -> list[tuple[str, str]] | None:
    """`want` as the (label, value) parts it joins, each found in `text`; None if it cannot be split."""
    try:
        doc = json.loads(want)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        parts = [(str(k), v) for k, v in doc.items() if isinstance(v, str) and v and v in text]
        return parts or None
    labelled = _th_labelled(text, want, patterns)
    split = _th_split(want, labelled)
    if split and (len(split) > 1 or want not in text):
        return split  # `user:ATBB...` written so in the text: still a user and a password
    if want in text:
        return [(labelled.get(want, ""), want)]
    words: dict[str, str] = {}  # the pattern did not convert: the words of the text
    for tok in re.split(r"[\s\"'`<>{}()\[\],;=]+", text):
        for piece in {tok, *tok.split(":")}:
            if len(piece) >= 3 and piece in want:
                words.setdefault(piece, "")
    return _th_split(want, words)


def _th_url_credential(url: str) -> str | None:
    """A URL's credential: the password of its userinfo or `password=` parameter, else the URL itself
    when a token sits in its path or query (a webhook); None for a URL that holds none (`jdbc:mysql://host/db`)."""
    userinfo = re.search(r"//[^/\s:@]*:([^@\s/]+)@", url)
    if userinfo:
        return userinfo.group(1)
    param = re.search(r"(?i)[?&;](?:password|pwd)=([^&;\s]+)", url)
    if param:
        return param.group(1)
    rest = url.split("://", 1)[1] if "://" in url else ""
    pieces = re.split(r"[/?&=:;@]", rest.split("/", 1)[1] if "/" in rest else "")
    token = any(len(p) >= 16 and re.search(r"\d", p) and re.search(r"[A-Za-z]", p) for p in pieces)
    return url if token else None


def _th_credential(parts: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The part a leak exposes: the one not named like an id, user, URL or region (the longest such);
    None when all the scanner reports is an identifier (an e-mail address, a host)."""
    secret = [p for p in parts if not _th_is_identifier(p[0])]
    if len(parts) > 1:  # beside a key, an endpoint, an address or a host is what it is used with
        secret = [p for p in secret if not re.match(r"[a-z][\w+.-]*://|[\w.+-]+@[\w-]+\.|[\w-]+(?:\.[\w-]+)+$", p[1])]
    if not secret:
        return None
    label, value = max(secret, key=lambda p: len(p[1]))
    field = re.search(r"(?i)(?:^|;)\s*(?:secret|password|pwd|accountkey|sharedaccesskey)=([^;]+)", value)
    if field and ";" in value:  # a connection string: its secret field
        return "secret", field.group(1).strip()
    if re.match(r"[a-z][\w+.-]*:(?://|[a-z0-9]+:)", value):
        found = _th_url_credential(value)
        if found is None:
            return None
        return ("password" if found != value else label), found
    if re.fullmatch(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+", value):
        return None  # an e-mail address reported alone: the account, not its password
    return label, value


# Test filler rather than a key: one character repeated (`API-AAAA...`, `shippo_live_1111...`,
# `sk-lf-0000...`) or a counted run (`pgar_1234567890...`, `1234567890abcdef1234...`).
_TH_FILLER_RE = re.compile(r"([A-Za-z0-9])\1{11}|0?123456789|abcdefghijklm|ABCDEFGHIJKLM")


def _dedent(text: str) -> str:
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    return textwrap.dedent("\n".join(lines)).strip()


def trufflehog_samples(root: Path, rng: random.Random) -> list[dict[str, Any]]:
    detectors = root / "pkg" / "detectors"
    out: list[dict[str, Any]] = []
    for test in sorted(detectors.rglob("*_test.go")):
        if test.name.endswith("_integration_test.go") or test.parent == detectors:
            continue
        rel = test.parent.relative_to(detectors)
        name = rel.parts[0]
        rid = "/".join(rel.parts)
        source = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(test.parent.glob("*.go"))
                           if not p.name.endswith("_test.go"))
        patterns = _th_patterns(source)
        keywords = re.search(r"Keywords\(\)\s*\[\]string\s*\{\s*return\s*\[\]string\{([^}]*)\}", source)
        words = re.findall(r'"([^"]+)"', keywords.group(1)) if keywords else []
        ident = re.sub(r"[^a-z0-9]", "", name.lower()) or (words[0] if words else "service")
        family = _family(name + " " + " ".join(words))
        seen: set[str] = set()
        go = _GoExpr(test.read_text(encoding="utf-8", errors="replace"))
        for text, wants in go.cases():
            example = _dedent(text)
            if not wants:
                out.append({"source": "trufflehog", "rule": rid, "family": family, "ident": ident, "secret": "",
                            "origin": "negative", "example": example[:4000]})
                continue
            for want in wants:
                if re.fullmatch(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+", want):
                    continue  # an account's e-mail address reported alone
                parts = _th_parts(want, example, patterns)
                if not parts:
                    continue
                credential = _th_credential(parts)
                if credential is None:
                    continue
                label, secret = credential[0], credential[1].strip()
                if len(secret) < 6 or secret in seen or secret not in example:
                    continue
                seen.add(secret)
                noun = re.sub(r"(?i)pat(tern)?s?$", "", label) or "key"
                origin = "documented_example" if _TH_FILLER_RE.search(secret) else "example"
                out.append({"source": "trufflehog", "rule": f"{rid}:{noun}", "family": family, "ident": ident,
                            "secret": secret, "origin": origin, "example": example[:4000]})
    return out


# ---------------------------------------------------------------------------------------------
# secretlint (the sixth set)

# Rules of secretlint that find no credential value: a file's kind or name (`.env`, a `kind: Secret`
# manifest, a `.p12` or service-account file), a home directory, the user's own patterns, test rules.
_SL_SKIPPED = frozenset({"example", "internal-test-cjs", "internal-test-esm", "pattern", "filter-comments",
                         "no-homedir", "no-dotenv", "no-k8s-kind-secret", "gcp", "preset-recommend",
                         "preset-canary"})
# What a rule reports that accompanies a credential (an account, a tenant, a client id): not credentials.
_SL_IDENTIFIER_MESSAGES = frozenset({"AWSAccountID", "AzureTenantId", "AzureClientId"})
# Rules (or one pattern of a rule) whose regex admits far more than the format: lengths of 1 to 128 in
# every part (SendGrid, Slack, GitHub's installation tokens), any text (npm, PEM bodies), random base64
# where the format is base64 of JSON (1Password's `ops_eyJ...`, Grafana Cloud's `glc_eyJ...`), any-case
# hex (secp256k1). Only the values their tests hold count, as for gitleaks' `_EXAMPLES_ONLY`.
_SL_EXAMPLES_ONLY = frozenset({"privatekey", "npm", "sendgrid", "slack", "1password", "secp256k1-privatekey",
                               "github:GITHUB_APP_INSTALLATION_TOKEN_PATTERN",
                               "grafana:GRAFANA_CLOUD_API_TOKEN_PATTERN"})
_JS_REGEX_RE = re.compile(r"(?:=|\()\s*/((?:\\.|\[(?:\\.|[^\]\\\n])*\]|[^/\\\[\n])+)/([dgimsuvy]*)\s*[;,)]")
_SL_VALUE_KEYS = ("KEY", "TOKEN", "SECRET", "ID", "URI", "CREDENTIAL", "URL")


def _sl_patterns(source: str) -> list[tuple[str, str, int]]:
    """(variable name, Python pattern, flags) of every regex literal in a rule's source (`const X = /.../gu;`);
    patterns built with `new RegExp(...)` from pieces are not read."""
    out = []
    for m in _JS_REGEX_RE.finditer(source):
        body, js_flags = m.group(1), m.group(2)
        name = re.search(r"(\w+)\s*=\s*$", source[max(0, m.start() - 80) : m.start() + 1])
        body = body.replace(r"\p{L}", r"[^\W\d_]").replace(r"\/", "/")
        body = re.sub(r"\(\?<(?![=!])", "(?P<", body)  # a JS named group
        py, flags = to_python(body)
        flags |= re.I if "i" in js_flags else 0
        out.append((name.group(1) if name else "pattern", py, flags))
    return out


def _sl_generated(py: str, flags: int, rng: random.Random) -> list[str]:
    """Values generated from a secretlint pattern: the whole match (its groups only name the prefix or
    kind), or the group it names `password` (a URL's userinfo)."""
    try:
        compiled = re.compile(py, flags)
        parsed = sre_parse.parse(py, flags)
    except (re.error, ValueError, OverflowError):
        return []
    group = compiled.groupindex.get("password")
    out: list[str] = []
    tries = 0
    while len(out) < PER_RULE and tries < PER_RULE * 30:
        tries += 1
        try:
            text = Gen(rng).run(parsed)
        except (ValueError, IndexError, RecursionError):
            return out
        m = compiled.search(" " + text + " ")
        if not m:
            continue
        secret = (m.group(group) or "") if group else m.group(0)
        if len(secret) >= 8 and secret not in out and "\n" not in secret and secret.strip() == secret:
            out.append(secret)
    return out


def _sl_counted_run(secret: str) -> bool:
    """Test filler of a counted run: eight or more letters or digits in order, forwards or backwards, case
    and doubling aside (`aBcDeFgHiJ...`, `aAbBcCdD...`, `zYxWvUtSrQ...`, `FEDCBA9876543210`)."""
    low = secret.lower()
    chars = [ch for i, ch in enumerate(low) if ch.isalnum() and (i == 0 or ch != low[i - 1])]
    for step in (1, -1):
        run = 1
        for i in range(1, len(chars)):
            a, b = chars[i - 1], chars[i]
            same_kind = a.isdigit() == b.isdigit()
            run = run + 1 if same_kind and ord(b) - ord(a) == step else 1
            if run >= 8:
                return True
    return False


def _sl_example(text: str, secret: str) -> str:
    """The test input around `secret`, whole lines, about 4,000 characters at most."""
    if len(text) <= 4000:
        return text
    at = text.index(secret)
    start = text.rfind("\n", 0, max(0, at - 1500)) + 1
    end = text.find("\n", at + len(secret) + 1500)
    return text[start : end if end >= 0 else len(text)]


def _sl_ident(pkg: str) -> str:
    """The name a user calls the secret by: the rule's provider (`hashicorp-vault` -> vault)."""
    return {"hashicorp-vault": "vault", "secp256k1-privatekey": "secp256k1"}.get(pkg, re.sub(r"[^a-z0-9]", "", pkg))


def _sl_kind(pkg: str) -> str:
    """The rule's name as `_family` reads it (`privatekey` is a private key)."""
    return pkg.replace("privatekey", "private-key")


def secretlint_samples(root: Path, rng: random.Random) -> list[dict[str, Any]]:
    """secretlint (`packages/@secretlint/secretlint-rule-*`): every rule's snapshot tests
    (`test/snapshots/<case>/input*` and the `output.json` secretlint writes for it).

    - A case with findings gives the value each finding names (`data.KEY`, `TOKEN`, `SECRET`, `URI`, ...,
      as found in the input; the input is its example text). A URL's or connection string's credential
      is the password of its userinfo (`mongodb+srv://appuser:myR3alP@ssw0rd@cluster0...` gives
      `myR3alP@ssw0rd`); a password of fewer than 6 characters (`user:pass`) is not kept.
    - A case without findings and without options of its own (`ok.valid`, `placeholder-xxx`) is a negative
      example; one that passes only because its `.secretlintrc.json` allows the value is neither.
    - Rules that report no credential value (a `.env` file exists, a home directory, a `kind: Secret`
      manifest, a `.p12` file, the user's own patterns) and identifier findings (AWS account id, Azure
      tenant and client ids) are skipped.
    - Values are also generated from each rule's regex literals (not the `new RegExp(...)` patterns built
      from pieces), except for rules whose regex admits far more than the format (`_SL_EXAMPLES_ONLY`).
    """
    packages = root / "packages" / "@secretlint"
    out: list[dict[str, Any]] = []
    for rule_dir in sorted(packages.glob("secretlint-rule-*")):
        pkg = rule_dir.name.removeprefix("secretlint-rule-")
        if pkg in _SL_SKIPPED:
            continue
        seen: set[str] = set()
        for case in sorted((rule_dir / "test" / "snapshots").glob("*")):
            output = case / "output.json"
            if not output.is_file():
                continue
            result = json.loads(output.read_text(encoding="utf-8"))
            text = result.get("sourceContent")
            if not isinstance(text, str):
                continue
            messages = result.get("messages") or []
            if not messages:
                if not (case / ".secretlintrc.json").exists() and not case.name.startswith("options."):
                    out.append({"source": "secretlint", "rule": f"{pkg}:{case.name}", "family": _family(_sl_kind(pkg)),
                                "ident": _sl_ident(pkg), "secret": "", "origin": "negative",
                                "example": text[:4000]})
                continue
            for message in messages:
                mid = message.get("messageId") or ""
                data = message.get("data") or {}
                if mid in _SL_IDENTIFIER_MESSAGES:
                    continue
                value = next((data[k] for k in _SL_VALUE_KEYS if isinstance(data.get(k), str) and data[k] in text),
                             None)
                if not value:
                    continue
                rid, ident, family = f"{pkg}:{mid}", _sl_ident(pkg), _family(f"{_sl_kind(pkg)} {mid}")
                if re.match(r"(?:jdbc:)?[a-z][\w+.-]*://", value):
                    url = re.sub(r"^jdbc:", "", value.rstrip("\"';)"))
                    password = _url_password(url)
                    if password is None:
                        continue
                    value = password
                    scheme = url.split(":", 1)[0].split("+")[0]
                    rid, family = f"{pkg}:{mid}:password", "url_and_auth"
                    ident = scheme if pkg == "database-connection-string" else ident
                if len(value) < 6 or value in seen:
                    continue
                seen.add(value)
                origin = "filler" if _sl_counted_run(value) else "example"
                out.append({"source": "secretlint", "rule": rid, "family": family, "ident": ident, "secret": value,
                            "origin": origin, "example": _sl_example(text, value)})
        if pkg in _SL_EXAMPLES_ONLY:
            continue
        source = "\n".join(p.read_text(encoding="utf-8") for p in sorted((rule_dir / "src").glob("*.ts")))
        for name, py, flags in _sl_patterns(source):
            if f"{pkg}:{name}" in _SL_EXAMPLES_ONLY:
                continue
            generated = _sl_generated(py, flags, rng)
            password = "?P<password>" in py
            label = re.sub(r"(?i)_?patte?rn$", "", name) or pkg
            for secret in generated:
                if secret in seen:
                    continue
                seen.add(secret)
                out.append({"source": "secretlint", "rule": f"{pkg}:{label}" + (":password" if password else ""),
                            "family": "url_and_auth" if password else _family(f"{_sl_kind(pkg)} {label}"),
                            "ident": _sl_ident(pkg), "secret": secret, "origin": "generated"})
    return out


SECRET_MARK = "<SECRET>"


# ---------------------------------------------------------------------------------------------
# semgrep


def _sg_regexes(node: Any) -> list[str]:
    """Every `pattern-regex` of a semgrep rule, however deep in `patterns` / `pattern-either`."""
    if isinstance(node, dict):
        found = [node["pattern-regex"]] if isinstance(node.get("pattern-regex"), str) else []
        return found + [r for v in node.values() for r in _sg_regexes(v)]
    if isinstance(node, list):
        return [r for v in node for r in _sg_regexes(v)]
    return []


def _sg_cases(text: str, rid: str) -> list[tuple[bool, str]]:
    """(expected, text) of each case of a semgrep test file: the lines after a `ruleid:` (a finding) or `ok:`
    (none) comment, up to the next blank line or comment."""
    cases: list[tuple[bool, str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"\b(ruleid|ok):\s*([\w.\-]+)", line)
        if not m or m.group(2) != rid:
            continue
        body: list[str] = []
        for nxt in lines[i + 1 :]:
            if not nxt.strip() or re.search(r"\b(?:ruleid|ok|todoruleid):", nxt):
                break
            body.append(nxt)
        if body:
            cases.append((m.group(1) == "ruleid", "\n".join(body)))
    return cases


# Rules that find no credential value: a service-account file's `"type"`, a PEM header without its body, an
# /etc/shadow line, a password hash, `sshpass -p` (its test holds a one-character password)
_SG_NO_VALUE = frozenset({"detected-google-gcm-service-account", "detected-pgp-private-key-block",
                          "detected-etc-shadow", "detected-bcrypt-hash", "detected-ssh-password"})
# A match that took the setting's name with it (`HEROKU_API_KEY = <key>`, `hockeyapp_key">`): the value after it
_SG_NAMED_RE = re.compile(r"[A-Za-z_][\w.\-]*[\"']?\s*(?:[=:>]|\s)\s*[\"']?(?P<value>[^\s\"']+)[\"']?")


_SG_URL_SECRET_RE = re.compile(r"[?&][\w]*(?:secret|token|password|key)=(?P<value>[^&\s\"']+)")
# What a sloppy character class (`[\w\-_]`, read as a range from `\` to `_`) lets the generator write: no key holds it
_SG_RANGE_DEBRIS_RE = re.compile(r"[\\\[\]^`]")


def _sg_value(match: str) -> str | None:
    if "://" in match or "?" in match:
        param = _SG_URL_SECRET_RE.search(match)  # `facebook.com/oauth/access_token?…&client_secret=<secret>`
        return param.group("value") if param else _clean(match)
    named = _SG_NAMED_RE.fullmatch(match.strip())
    value = _clean(named.group("value") if named else match)
    return value if len(value) >= 8 and not re.search(r"\s", value) else None


def semgrep_samples(root: Path, rng: random.Random) -> list[dict[str, Any]]:
    """semgrep-rules' own secret rules (`generic/secrets/security/`; `gitleaks/` beside it is a copy of gitleaks'
    rules, not used): the secret each `ruleid:` test case holds (found with the rule's regexes: the `SECRET`
    group where it names one, else the match), the case as its example text; `ok:` cases are negative
    examples; values generated from the regexes."""
    out: list[dict[str, Any]] = []
    for path in sorted((root / "generic" / "secrets" / "security").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for rule in spec.get("rules") or ():
            rid = str(rule.get("id", path.stem))
            if rid in _SG_NO_VALUE:
                continue
            ident = _identifier(rid.removeprefix("detected-"), [])
            base = {"source": "semgrep", "rule": rid, "family": _family(rid), "ident": ident}
            compiled: list[tuple[str, re.Pattern[str]]] = []
            for pattern in _sg_regexes(rule):
                py, flags = to_python(pattern.replace("(?<SECRET>", "(?P<SECRET>"))
                try:
                    compiled.append((pattern, re.compile(py, flags)))
                except re.error:
                    continue
            seen: set[str] = set()
            tests = [p for p in path.parent.glob(path.stem + ".*") if p.suffix != ".yaml"]
            for test in tests:
                for expected, text in _sg_cases(test.read_text(encoding="utf-8", errors="replace"), rid):
                    if not expected:
                        out.append({**base, "secret": "", "origin": "negative", "example": text})
                        continue
                    hits = [m for _, r in compiled if (m := r.search(text))]
                    if not hits:
                        continue
                    m = max(hits, key=lambda h: len(h.group()))
                    raw = m.group("SECRET") if "SECRET" in m.re.groupindex and m.group("SECRET") else m.group()
                    secret = _sg_value(raw)
                    if secret and secret not in seen:
                        seen.add(secret)
                        out.append({**base, "secret": secret, "origin": "literal", "example": text})
            for pattern, r in compiled:
                group = r.groupindex.get("SECRET")
                if group is None and re.search(r"\.[{*]|\\s", pattern):
                    continue  # a value with context around it and no group to say where the value is
                for generated in generate(pattern.replace("(?<SECRET>", "(?P<SECRET>"), group, rng, PER_RULE // 2):
                    secret = _sg_value(generated)
                    if secret and secret not in seen and not _SG_RANGE_DEBRIS_RE.search(secret):
                        seen.add(secret)
                        out.append({**base, "secret": secret, "origin": "generated"})
    return out


def detect_secrets_shapes(root: Path) -> list[dict[str, str]]:
    """The lines detect-secrets' keyword tests expect a secret in, the secret replaced by `SECRET_MARK`.

    Read with `ast`, never run: a case is `('<line {}>'.format(NAME), NAME)`, the line's placeholder
    filled by the very constant the case expects back; a case expecting `None` is no secret and skipped.
    """
    import ast

    tree = ast.parse((root / "tests" / "plugins" / "keyword_test.py").read_text())
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.List)):
            continue
        name = next((t.id for t in node.targets if isinstance(t, ast.Name)), "")
        if not name.endswith("_TEST_CASES"):
            continue
        for case in node.value.elts:
            if not (isinstance(case, ast.Tuple) and len(case.elts) == 2 and isinstance(case.elts[1], ast.Name)):
                continue
            call, expected = case.elts
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "format"
                    and isinstance(call.func.value, ast.Constant) and isinstance(call.func.value.value, str)
                    and len(call.args) == 1 and isinstance(call.args[0], ast.Name)
                    and call.args[0].id == expected.id):
                continue
            template = call.func.value.value.replace("{{", "\0").replace("}}", "\1")
            if template.count("{}") != 1:
                continue
            line = template.replace("{}", SECRET_MARK).replace("\0", "{").replace("\1", "}")
            if line not in seen:
                seen.add(line)
                out.append({"source": "detect-secrets", "list": name.removesuffix("_TEST_CASES").lower(),
                            "template": line})
    return out


# secrets-patterns-db (mazen160/secrets-patterns-db, `db/rules-stable.yml`): a pattern database, no test cases.
# Rules named for what accompanies a credential (an ARN, a bucket, a host name, an id, a URL, an e-mail) and the
# later parts of a multi-part rule (`Autodesk - 2`: in its convention the parts after the first are the id or
# the endpoint the key goes with) find no credential.
_SPDB_NOT_A_CREDENTIAL_RE = re.compile(
    r"(?i)\b(?:arn|bucket|ec2|elb|rds|elasticcache|api gateway|id|ids|url|uri|endpoint|host|hostname|domain|"
    r"e-?mail|username|user|account|region|cred file info|mws id)\b|[_-](?:id|url|host|user|username|email)$|"
    r" - [2-9]$"
)


def spdb_samples(root: Path, rng: random.Random) -> list[dict[str, Any]]:
    """secrets-patterns-db's high-confidence rules (`db/rules-stable.yml`): values generated from each rule's
    regex (its capture group when it has one: the regexes that put a keyword and `.{0,40}` ahead of the value;
    a regex with context around the value and no group is skipped). Values holding an e-mail address or a URL
    without a token in its path are what accompanies a key, not one."""
    spec = yaml.safe_load((root / "db" / "rules-stable.yml").read_text(encoding="utf-8"))
    out: list[dict[str, Any]] = []
    for entry in spec["patterns"]:
        rule = entry["pattern"]
        name, pattern = str(rule["name"]), str(rule["regex"])
        if rule.get("confidence") != "high" or _SPDB_NOT_A_CREDENTIAL_RE.search(name):
            continue
        rid = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        try:
            groups = re.compile(to_python(pattern)[0]).groups
        except re.error:
            continue
        if not groups and re.search(r"\.[{*+]|\\s", pattern):
            continue
        base = {"source": "spdb", "rule": rid, "family": _family(rid), "ident": _identifier(rid, [])}
        seen: set[str] = set()
        for generated in generate(pattern, 1 if groups else None, rng, PER_RULE // 2):
            # a leading `-`/`.` is the generator taking the class's punctuation first, where `\b` let it
            secret = (_sg_value(generated) or "").lstrip("-._")
            if (len(secret) < 8 or secret in seen or _SG_RANGE_DEBRIS_RE.search(secret) or "@" in secret
                    or re.fullmatch(r"[A-Za-z_]+", secret)  # a setting's name (`algolia_api_key`), no value
                    or ("://" in secret and not re.search(r"://[^/\s]+/\S{16,}", secret))):
                continue
            seen.add(secret)
            out.append({**base, "secret": secret, "origin": "generated"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gitleaks", type=Path, help="a gitleaks checkout")
    parser.add_argument("--noseyparker", type=Path, help="a noseyparker checkout")
    parser.add_argument("--trufflehog", type=Path, help="a trufflehog checkout")
    parser.add_argument("--kingfisher", type=Path, help="a kingfisher checkout")
    parser.add_argument("--secretlint", type=Path, help="a secretlint checkout")
    parser.add_argument("--semgrep", type=Path, help="a semgrep-rules checkout (held out: issue 37)")
    parser.add_argument("--spdb", type=Path, help="a secrets-patterns-db checkout (held out: issue 37)")
    parser.add_argument("--detect-secrets", type=Path, help="a detect-secrets checkout (code-line shapes)")
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--out", type=Path, default=OUT,
                        help="where to write (another seed into another directory: a reseeded check set)")
    parser.add_argument("--reclean", action="store_true",
                        help="apply the current secret clean-up (final_secret) to the stored files, no checkout needed")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.detect_secrets is not None:
        shapes = detect_secrets_shapes(args.detect_secrets)
        target = out / "public_shapes_detect_secrets.json"
        target.write_text(json.dumps(shapes, ensure_ascii=False, indent=0) + "\n")
        print(f"detect-secrets: {len(shapes)} code lines -> {target}")
    for name, root, fn in (("gitleaks", args.gitleaks, gitleaks_samples),
                           ("noseyparker", args.noseyparker, noseyparker_samples),
                           ("trufflehog", args.trufflehog, trufflehog_samples),
                           ("kingfisher", args.kingfisher, kingfisher_samples),
                           ("secretlint", args.secretlint, secretlint_samples),
                           ("semgrep", args.semgrep, semgrep_samples),
                           ("spdb", args.spdb, spdb_samples)):
        if args.reclean:
            samples = json.loads(gzip.decompress((out / f"public_rules_{name}.json.gz").read_bytes()))
        elif root is None:
            continue
        else:
            samples = fn(root, random.Random(f"{args.seed}-{name}"))
        finals = (final_secret(sample) for sample in samples)
        samples = [sample for sample in finals if sample is not None]
        for sample in samples:
            kind = placeholder(sample["secret"]) if sample["secret"] else None
            if kind:
                sample["origin"] = kind
        # Compressed: the samples are key-shaped, and a plain file of them trips every secret scanner that
        # reads the repository (push protection included). mtime=0: the same samples give the same bytes.
        target = out / f"public_rules_{name}.json.gz"
        body = (json.dumps(samples, ensure_ascii=False, indent=0, sort_keys=True) + "\n").encode()
        with open(target, "wb") as handle, gzip.GzipFile(fileobj=handle, mode="wb", mtime=0, filename="") as gz:
            gz.write(body)
        positives = [s for s in samples if s["secret"]]
        print(f"{name}: {len({s['rule'] for s in positives})} rules, {len(positives)} secrets, "
              f"{len(samples) - len(positives)} negative examples -> {target}")


if __name__ == "__main__":
    main()
