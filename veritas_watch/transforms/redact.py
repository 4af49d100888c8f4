"""Find credentials in chat text and replace them with markers. Pure: no I/O, no clock, no state.

`detect` runs every rule whose keywords occur in the text (a gitleaks-style prefilter), keeps the
candidates that pass the rule's own checks (entropy, character classes, placeholders), merges
overlapping candidates (the most specific rule wins, its value is kept for the vault), and also
catches later verbatim repeats of a found value. `redact` replaces each span with
`[REDACTED:<rule>:<fp8>]`, where fp8 is a keyed hash: the marker never reveals any part of the value.
OpenClaw's own masks (`sk-pro…HNzL`, `KEY=***`) are found first and replaced whole (`masked_*` rules):
a credential was given there, though the text no longer holds it.

Rules are written from the providers' public key formats; the generic rules cover the forms chat
text uses (`NAME_KEY=value`, `Authorization: Bearer ...`, `scheme://user:pass@host`, `password is
...`, `密码是...`). Recall is preferred where the two conflict: a false positive hides one token,
a miss leaks a key into memory forever.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import hmac
import math
import re
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from veritas_watch.model import MaskKind, Redacted, SecretFinding

__all__ = [
    "MASK_ELLIPSIS",
    "OPAQUE_MASK",
    "RULES",
    "Rule",
    "SecretMatch",
    "detect",
    "fingerprint",
    "is_masked_rule",
    "is_opaque_mask",
    "is_secret_name",
    "masked_fingerprint",
    "openclaw_mask",
    "recover_unmasked",
    "redact",
    "redact_with_matches",
    "service_from_name",
    "shannon_entropy",
    "split_mask",
]

RuleKind = Literal["provider", "context", "generic", "cue"]
# Merge order: an exact provider format beats a format recognised by nearby words, which beats
# a generic assignment, which beats a natural-language cue.
_PRIORITY: dict[str, int] = {"provider": 3, "context": 2, "generic": 1, "cue": 0}

MARKER_RE = re.compile(r"\[REDACTED:[a-z0-9_]+:[0-9a-f]{8}\]")
_MARKER_PREFIX = "[redacted:"


@dataclass(frozen=True, slots=True)
class SecretMatch:
    """One secret span in a text. `value` is for the vault only: never log it.

    For an OpenClaw mask (`masked`, rule `masked_*`) `value` is the mask itself: it identifies the
    finding (`recover_unmasked`) but is no credential and must never be vaulted as one.
    """

    rule: str
    service: str
    key_name: str
    start: int
    end: int
    value: str = field(repr=False)
    # An OpenClaw mask (`sk-pro…HNzL`, `***`): `value` is then the mask, the transcript holds no secret.
    masked: bool = False


@dataclass(frozen=True, slots=True)
class _Hit:
    """What a rule's extractor found: the secret span plus names inferred from its context."""

    start: int
    end: int
    key_name: str | None = None
    service: str | None = None
    value: str | None = None  # when the secret is not the span verbatim (a terminal-wrapped value)


Extractor = Callable[["Rule", re.Match[str], str], "_Hit | None"]


@dataclass(frozen=True, slots=True)
class Rule:
    """A detection rule. `keywords` (lowercase) gate the regex: no keyword in the text, no scan."""

    name: str
    service: str
    key_name: str
    kind: RuleKind
    pattern: re.Pattern[str]
    keywords: tuple[str, ...]
    extract: Extractor
    min_entropy: float = 0.0
    # Formats several providers share (`sk-<hex>`, `AIza...`): let nearby words name the service.
    shared_format: bool = False
    # Context rules: one of these words must occur shortly before the value.
    context_words: tuple[str, ...] = ()
    context_window: int = 0

    @property
    def priority(self) -> int:
        return _PRIORITY[self.kind]


# ---------------------------------------------------------------------------------------------
# Value statistics and plausibility checks


def shannon_entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    if not value:
        return 0.0
    total = len(value)
    return -sum(n / total * math.log2(n / total) for n in Counter(value).values())


def _char_classes(value: str) -> int:
    lower = upper = digit = other = False
    for ch in value:
        if "a" <= ch <= "z":
            lower = True
        elif "A" <= ch <= "Z":
            upper = True
        elif "0" <= ch <= "9":
            digit = True
        else:
            other = True
    return lower + upper + digit + other


def _has_letter_and_digit(value: str) -> bool:
    return any(c.isascii() and c.isalpha() for c in value) and any(c.isascii() and c.isdigit() for c in value)


# Pieces a word-built string falls into: "createPostWebhook2" -> create, Post, Webhook, 2.
_PIECE_RE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


_CONSONANT_RUN_RE = re.compile(r"[b-df-hj-np-tv-xz]{4,}")


def _is_wordish(value: str) -> bool:
    """True for identifiers built from words ("win32api.RegOpenKeyEx", "shared-gateway-token-1234").

    Every letter piece must be pronounceable (a vowel, no run of four consonants) and digit pieces
    rare; a random token fails on some piece ("OLVjkQ-FMg8" -> OL, Vjk, Q, FM, g, 8). Measured on
    random base62/hex tokens: under 0.5% at 12 chars, none at 32.
    """
    pieces = _PIECE_RE.findall(value)
    letters = [p for p in pieces if p.isalpha()]
    if not letters or len(pieces) - len(letters) > max(1, len(letters) // 3):
        return False
    for piece in letters:
        low = piece.lower()
        if len(low) < 2 or not any(v in low for v in "aeiouy") or _CONSONANT_RUN_RE.search(low):
            return False
    return sum(map(len, letters)) / len(letters) >= 3


_WORDLIKE_RE = re.compile(r"[A-Za-z]+(?:[-_' .][A-Za-z]+)*")
_IDENT_PATH_RE = re.compile(r"[A-Za-z_$][\w$]*(?:(?:\.|::|->|\?\.)[A-Za-z_$][\w$]*)+(?:\(\)|\[\d+\])?")
_CALL_RE = re.compile(r"[A-Za-z_$][\w$.]*\(")
_REFERENCE_RE = re.compile(
    r"\$\{|\$\(|\{\{|\}\}|%\(|%[sd]\b|^\$[A-Za-z_]\w*$|^<[^>]*>?$|^\[[^\]]*\]?$|^\{[^}]*\}?$|"
    r"^%[A-Za-z_]\w*%$|^@[A-Za-z_]|^process\.env|^os\.environ|^env\(|^getenv"
)
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}[:\-]\d{2}(?:[:\-]\d{2})?(?:[.,]\d+)?Z?)?")
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_VERSION_RE = re.compile(r"v?\d+(?:\.\d+){1,3}(?:[-+][\w.]+)?")
_PATH_RE = re.compile(r"(?:~|\.{1,2})?/[\w.@~-]+(?:/[\w.@~-]*)*|[A-Za-z]:\\.*|[\w.-]+(?:/[\w.-]+)+\.[A-Za-z]{1,5}")

# Values that are names for a secret rather than one (`token: "secret"`, `password=changeme`).
_PLACEHOLDER_WORDS = frozenset(
    """
    password passwd passphrase pass pwd secret secrets token tokens key keys apikey api_key api-key
    changeme change_me change-me none null nil undefined true false yes no on off empty required
    optional todo tbd fixme n/a na test testing example examples sample samples dummy placeholder
    redacted hidden masked default defaults string str int number bool boolean object any value
    values here there this that xxx xxxx yyy zzz abc abcdef abcdefg abc123 123456 foo bar baz qux
    secret123 password123 password1 mypassword mysecret mytoken yourpassword yoursecret yourtoken
    incorrect correct invalid valid wrong right missing unknown unset notset not-set disabled
    enabled bearer basic oauth oauth2 jwt hmac sha256 rsa aes base64 hex utf8 utf-8 ascii env
    environment config configured provided supplied generated random stored saved encrypted
    """.split()  # noqa: SIM905 - a word list reads better as text
)
# Words that mark a code value as a fake (`"test-password"`, `"hook-token"`, `"dummy_key"`).
_FAKE_PARTS = frozenset(
    """
    test tests testing example sample dummy fake mock stub placeholder secret password passwd pass
    token key api hook demo your my changeme default invalid wrong bad good new old valid expired
    revoked missing placeholder fixture local dev temp tmp value foo bar baz qux xxx sk pk
    """.split()  # noqa: SIM905 - a word list reads better as text
)


_CODE_CHARS_RE = re.compile(r"[\"'`()\[\]{}<>\\,]|\s")
_IDENTIFIER_RE = re.compile(r"_*[A-Za-z]+(?:_+[A-Za-z]+)*_*")


def _is_placeholder(value: str) -> bool:
    low = value.lower()
    if low in _PLACEHOLDER_WORDS:
        return True
    stripped = low.strip("xX*._-#•… 0")
    if not stripped:
        return True  # "xxxx", "****", "0000", "...."
    if low.startswith(("your_", "your-", "<your", "my_", "my-", "enter_", "insert_", "replace_", "put_")):
        return True
    if ("your" in low or "here" in low or "xxxx" in low or "****" in low or "..." in low) and _is_wordish(value):
        return True
    # "aaaaaaaa", "abababab"; digit runs like "88888888" are real (Wi-Fi) passwords
    return len(value) >= 8 and len(set(low)) <= 2 and not value.isdigit()


def _looks_like_code_or_path(value: str) -> bool:
    return bool(
        _REFERENCE_RE.search(value)
        or (
            _IDENT_PATH_RE.fullmatch(value)
            and (_is_wordish(value) or not any(c.isdigit() for c in value) or shannon_entropy(value) < 3.5)
        )
        or _CALL_RE.match(value)
        or _PATH_RE.fullmatch(value)
        or "://" in value
    )


def _fake_compound(value: str) -> bool:
    parts = [p for p in re.split(r"[-_.\s]+", value.lower()) if p]
    return bool(parts) and all(p in _FAKE_PARTS or p.isdigit() for p in parts)


Strength = Literal["password", "password_env", "token", "token_env", "weak"]


def _plausible(value: str, strength: Strength, *, quoted: bool = False) -> bool:
    """Does `value`, found after a secret-ish name or cue, look like an actual secret?

    `quoted` means the value was set off in prose (password is `sunshine`), which is what
    lets a plain word count as a password; a quoted word in code (`password='IAmSensitive'`) does not.
    """
    n = len(value)
    if n < 6 or n > 4096:
        return False
    if _is_placeholder(value) or _looks_like_code_or_path(value):
        return False
    if "..." in value or "…" in value:
        return False  # an elided example: "eyJhbGciOi...", "sk-abc..."
    if strength != "password_env" and _CODE_CHARS_RE.search(value):
        return False  # Optional[str], parts['password'], (self.username: code, not a secret
    if strength == "password_env":
        # An explicit PASSWORD-named variable: trust the name, only drop placeholders.
        return not _fake_compound(value) or not _WORDLIKE_RE.fullmatch(value)
    if strength == "password":
        if value.isdigit():
            return True  # "密码是 88888888": digit-only passwords are common
        if _WORDLIKE_RE.fullmatch(value) or _IDENTIFIER_RE.fullmatch(value):
            # "password is required" vs "password is `sunshine`": a bare word is prose
            return quoted and not _fake_compound(value)
        if _DATE_RE.fullmatch(value) or _VERSION_RE.fullmatch(value):
            return False
        if quoted and _fake_compound(value):
            return False
        return _char_classes(value) >= 2
    # token-ish strengths
    if _WORDLIKE_RE.fullmatch(value) or _DATE_RE.fullmatch(value) or _VERSION_RE.fullmatch(value):
        return False
    if _fake_compound(value):
        return False
    min_len = {"token_env": 8, "token": 8, "weak": 20}[strength]
    if n < min_len:
        return False
    if strength == "weak" and (_UUID_RE.search(value) or value.count(":") >= 2):
        return False  # session keys and ids ("agent:main:tui-<uuid>"), not credentials
    entropy = shannon_entropy(value)
    if strength == "token_env":
        return entropy >= 2.5 and not (_is_wordish(value) and not _has_letter_and_digit(value))
    if not _has_letter_and_digit(value) and not (n >= 20 and _char_classes(value) >= 3):
        return False
    if _is_wordish(value):
        return False
    threshold = 3.5 if strength == "weak" else (3.0 if n >= 16 else 2.6)
    return entropy >= threshold


# ---------------------------------------------------------------------------------------------
# Names and services

_SERVICES: dict[str, str] = {
    "openai": "OpenAI",
    "chatgpt": "OpenAI",
    "anthropic": "Anthropic",
    "claude": "Anthropic",
    "deepseek": "DeepSeek",
    "gemini": "Gemini",
    "google": "Google",
    "gcp": "Google Cloud",
    "firebase": "Firebase",
    "youtube": "YouTube",
    "aws": "AWS",
    "amazon": "AWS",
    "azure": "Azure",
    "github": "GitHub",
    "gh": "GitHub",
    "gitlab": "GitLab",
    "slack": "Slack",
    "stripe": "Stripe",
    "telegram": "Telegram",
    "tg": "Telegram",
    "discord": "Discord",
    "huggingface": "Hugging Face",
    "hf": "Hugging Face",
    "twilio": "Twilio",
    "sendgrid": "SendGrid",
    "mailgun": "Mailgun",
    "npm": "npm",
    "pypi": "PyPI",
    "docker": "Docker Hub",
    "dockerhub": "Docker Hub",
    "digitalocean": "DigitalOcean",
    "cloudflare": "Cloudflare",
    "cf": "Cloudflare",
    "shopify": "Shopify",
    "groq": "Groq",
    "xai": "xAI",
    "grok": "xAI",
    "openrouter": "OpenRouter",
    "mistral": "Mistral",
    "replicate": "Replicate",
    "linear": "Linear",
    "notion": "Notion",
    "atlassian": "Atlassian",
    "jira": "Atlassian",
    "confluence": "Atlassian",
    "sentry": "Sentry",
    "databricks": "Databricks",
    "supabase": "Supabase",
    "vercel": "Vercel",
    "postman": "Postman",
    "square": "Square",
    "paypal": "PayPal",
    "braintree": "Braintree",
    "heroku": "Heroku",
    "alibaba": "Alibaba Cloud",
    "aliyun": "Alibaba Cloud",
    "阿里云": "Alibaba Cloud",
    "tencent": "Tencent Cloud",
    "腾讯云": "Tencent Cloud",
    "qcloud": "Tencent Cloud",
    "dashscope": "Alibaba DashScope",
    "qwen": "Alibaba DashScope",
    "通义": "Alibaba DashScope",
    "百炼": "Alibaba DashScope",
    "moonshot": "Moonshot",
    "kimi": "Moonshot",
    "siliconflow": "SiliconFlow",
    "硅基流动": "SiliconFlow",
    "zhipu": "Zhipu",
    "智谱": "Zhipu",
    "glm": "Zhipu",
    "baidu": "Baidu",
    "qianfan": "Baidu Qianfan",
    "百度": "Baidu",
    "perplexity": "Perplexity",
    "tavily": "Tavily",
    "langsmith": "LangSmith",
    "langchain": "LangSmith",
    "resend": "Resend",
    "netlify": "Netlify",
    "mapbox": "Mapbox",
    "firecrawl": "Firecrawl",
    "elevenlabs": "ElevenLabs",
    "fireworks": "Fireworks AI",
    "cohere": "Cohere",
    "together": "Together AI",
    "grafana": "Grafana",
    "newrelic": "New Relic",
    "figma": "Figma",
    "airtable": "Airtable",
    "doppler": "Doppler",
    "pulumi": "Pulumi",
    "terraform": "Terraform Cloud",
    "vault": "HashiCorp Vault",
    "hashicorp": "HashiCorp Vault",
    "mailchimp": "Mailchimp",
    "dropbox": "Dropbox",
    "line": "LINE",
    "feishu": "Feishu",
    "飞书": "Feishu",
    "lark": "Feishu",
    "dingtalk": "DingTalk",
    "钉钉": "DingTalk",
    "wechat": "WeChat",
    "微信": "WeChat",
    "openclaw": "OpenClaw",
    "postgres": "PostgreSQL",
    "postgresql": "PostgreSQL",
    "mysql": "MySQL",
    "redis": "Redis",
    "mongodb": "MongoDB",
    "mongo": "MongoDB",
    "amqp": "RabbitMQ",
    "rabbitmq": "RabbitMQ",
    "ftp": "FTP",
    "sftp": "SFTP",
    "smtp": "SMTP",
    "ssh": "SSH",
    "wifi": "Wi-Fi",
    "wi-fi": "Wi-Fi",
}
_NOT_SERVICES = frozenset(
    """
    the my our your his her their its a an this that these those here there is was new old my own
    api app access secret private public personal auth bearer client bot user admin root default
    test prod production dev staging local main primary backup real actual same other full generated
    current previous next following above below one two key token password and or for of to with
    from in on at by it me you we they please use using set get export login username email account
    """.split()  # noqa: SIM905 - a word list reads better as text
) | frozenset(["的", "我的", "你的", "他的", "这个", "那个", "新的", "旧的", "一个", "这是", "以下", "下面"])

_NAME_SPLIT_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_SECRET_SEGMENTS = frozenset(
    """
    key apikey token secret password passwd pwd passphrase pass credential credentials cred creds
    auth privatekey accesskey secretkey
    """.split()  # noqa: SIM905 - a word list reads better as text
)
_SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "apikey", "accesskey", "secretkey", "privatekey")
_NON_SECRET_LAST = frozenset(
    """
    path file files dir dirs url uri urls endpoint host hostname port mode type types name names
    enabled enable disabled env header headers prefix suffix length len ttl expiry expires
    expiration expire timeout count limit limits max min id ids format method algorithm alg provider
    providers source region version size hint label field fields kind policy scope scopes usage
    budget cost rate window index ref refs var variable location store storage backend helper
    command cmd schema regex pattern list map set required optional flag flags check checks status
    state valid rotation rotated hash hashed salt rounds iterations strength mask masked template
    """.split()  # noqa: SIM905 - a word list reads better as text
)
_KEY_ONLY_QUALIFIERS = frozenset(
    """
    public session cache idempotency primary foreign partition sort dedupe dedup object map dict
    lookup row group message event index unique composite routing shard cursor record entry state
    config hot short sub react item list node component table column field storage bucket s3 gpg pgp
    ssh host signing verify verification encryption kms license registry sessions channel
    """.split()  # noqa: SIM905 - a word list reads better as text
)


def _name_segments(name: str) -> list[str]:
    last = re.split(r"[.:]", name)[-1] or name
    return [s.lower() for s in _NAME_SPLIT_RE.findall(last)]


def is_secret_name(name: str) -> bool:
    """True for variable names that hold a credential: DEEPSEEK_API_KEY, apiKey, db_password."""
    segments = _name_segments(name)
    if not segments:
        return False
    if segments[-1] in _NON_SECRET_LAST or "public" in segments:
        return False
    if len(segments) == 1 and segments[0] == "pwd":
        return False  # the shell's current directory
    found = False
    for i, seg in enumerate(segments):
        if seg in _SECRET_SEGMENTS or seg.endswith(_SECRET_SUFFIXES):
            if seg == "key" and i > 0 and segments[i - 1] in _KEY_ONLY_QUALIFIERS:
                continue
            if seg in ("pass", "auth", "cred") and len(segments) == 1:
                continue  # too ambiguous alone
            found = True
    return found


def _secret_word(name: str) -> str:
    segments = _name_segments(name)
    for seg in reversed(segments):
        if seg.startswith(("pass", "pwd")) or seg.endswith(("password", "passwd")):
            return "password"
    if segments == ["key"]:
        return "key"  # a bare `key:` (YAML, JSON) is as often a lookup key as a credential
    return "token"


def service_from_name(name: str, *, known_only: bool = False) -> str | None:
    """The service a variable name points at: DEEPSEEK_API_KEY -> DeepSeek, TOKENMALL_KEY -> Tokenmall."""
    segments = _name_segments(name)
    for seg in segments:
        if seg in _SERVICES:
            return _SERVICES[seg]
    if known_only:
        return None
    for seg in segments:
        if seg in _SECRET_SEGMENTS or seg.endswith(_SECRET_SUFFIXES) or seg in _NOT_SERVICES:
            continue
        if seg.isdigit() or len(seg) < 3:
            continue
        return seg.capitalize()
    return None


_TRAILING_WORD_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*[A-Za-z0-9+]|[\u4e00-\u9fff]{2,8}|[A-Za-z])\W*$")
_CJK_SERVICE_SUFFIX_RE = re.compile(r"(?:的|之)$")


def _service_before(text: str, start: int, *, window: int = 48) -> str | None:
    """The service named just before a cue: 'here is the TokenMall key' -> TokenMall."""
    lo = max(0, start - window)
    before = text[lo:start]
    nl = before.rfind("\n")
    if nl >= 0:
        before = before[nl + 1 :]
    before = _CJK_SERVICE_SUFFIX_RE.sub("", before.rstrip()).rstrip()
    before = re.sub(r"(?i)(?:'s|’s)$", "", before).rstrip()
    # skip qualifiers: "TokenMall API key", "GitHub personal access token"
    for _ in range(3):
        m = _TRAILING_WORD_RE.search(before)
        if not m:
            return None
        word = m.group(1)
        low = word.lower()
        if low in _SERVICES:
            return _SERVICES[low]
        if low in _NOT_SERVICES or low in ("api", "access", "secret", "personal", "bot", "app"):
            before = _CJK_SERVICE_SUFFIX_RE.sub("", before[: m.start()].rstrip()).rstrip()
            continue
        if "\u4e00" <= word[0] <= "\u9fff":
            # a CJK run has no word breaks: only a known name inside it is a service
            return next((svc for cjk, svc in _SERVICES.items() if not cjk.isascii() and cjk in word), None)
        if any(c.isupper() for c in word) or any(c.isdigit() for c in word):
            return word
        return None
    return None


def _service_of_target(target: str | None) -> str | None:
    """'password for the GitLab admin panel' -> GitLab; 'for the router' -> router."""
    if not target:
        return None
    words = [w for w in re.split(r"\s+", target.strip()) if w]
    while words and words[0].lower() in _NOT_SERVICES:
        words.pop(0)
    for word in words:
        if word.lower() in _SERVICES:
            return _SERVICES[word.lower()]
    return " ".join(words[:3]) or None


def _known_service_near(text: str, start: int, *, window: int = 80) -> str | None:
    """A known provider named shortly before a shared-format key ('DeepSeek: sk-...')."""
    before = text[max(0, start - window) : start].lower()
    best: tuple[int, str] | None = None
    for word, svc in _SERVICES.items():
        pos = before.rfind(word)
        if pos < 0:
            continue
        # whole words only for ASCII names ("line" must not match "online")
        if word.isascii():
            left = before[pos - 1] if pos > 0 else " "
            right = before[pos + len(word)] if pos + len(word) < len(before) else " "
            if left.isalnum() or right.isalpha():
                continue
        if best is None or pos > best[0]:
            best = (pos, svc)
    return best[1] if best else None


# ---------------------------------------------------------------------------------------------
# Extractors


def _span_of(m: re.Match[str]) -> tuple[int, int]:
    if "secret" in m.re.groupindex and m.group("secret") is not None:
        return m.span("secret")
    return m.span()


def _extract_provider(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = _span_of(m)
    value = text[start:end]
    if rule.min_entropy and shannon_entropy(value) < rule.min_entropy:
        return None
    return _Hit(start, end)


def _extract_context(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = _span_of(m)
    value = text[start:end]
    before = text[max(0, start - rule.context_window) : start].lower()
    if not any(w in before for w in rule.context_words):
        return None
    if rule.min_entropy and shannon_entropy(value) < rule.min_entropy:
        return None
    # Random tokens mix classes; hashes, words and identifiers of the same length rarely do.
    if not any(c.isdigit() for c in value) or _is_wordish(value):
        return None
    hexish = all(c in "0123456789abcdef" for c in value.lower())
    if not hexish and _char_classes(value) < 3:
        return None
    return _Hit(start, end)


def _quoted_value(m: re.Match[str]) -> tuple[int, int, bool] | None:
    for group, quoted in (("qv", True), ("v", False)):
        if group in m.re.groupindex and m.group(group) is not None:
            s, e = m.span(group)
            return s, e, quoted
    return None


_TRAIL = ".,;:)]}>\"'`?。，；：）】》"


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while end > start and text[end - 1] in _TRAIL:
        end -= 1
    return start, end


_WRAP_RE = re.compile(r"\r?\n")
_QUERY_NEXT_RE = re.compile(r"&[A-Za-z_][A-Za-z0-9_.\-]*=")


def _extract_assignment(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    name = m.group("name")
    if not is_secret_name(name):
        return None
    qv = _quoted_value(m)
    if qv is None:
        return None
    start, end, quoted = qv
    if not quoted:
        query = _QUERY_NEXT_RE.search(text, start, end)  # ?api_key=...&format=json
        if query:
            end = query.start()
        start, end = _trim(text, start, end)
    value = text[start:end]
    last = re.split(r"[.:]", name)[-1]
    env_style = last.isupper()  # DEEPSEEK_API_KEY: a deliberate variable, trusted more than code names
    word = _secret_word(name)
    strength: Strength
    if word == "password":
        strength = "password_env" if env_style else "password"
    elif word == "key" and not env_style:
        strength = "weak"
    else:
        strength = "token_env" if env_style else "token"
    unwrapped = _WRAP_RE.sub("", value) if quoted else value
    if not _plausible(unwrapped, strength):
        return None
    service = service_from_name(last, known_only=True) or _known_service_near(text, m.start(), window=60)
    return _Hit(
        start,
        end,
        key_name=last,
        service=service or service_from_name(last),
        value=unwrapped if unwrapped != value else None,
    )


def _extract_cli_flag(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    qv = _quoted_value(m)
    if qv is None:
        return None
    start, end, _quoted = qv
    value = text[start:end]
    flag = m.group("name").lower()
    strength: Strength = "password" if "pass" in flag else "token"
    if not _plausible(value, strength, quoted=False):
        return None
    return _Hit(start, end, key_name="--" + flag, service=_service_before(text, m.start()))


def _extract_auth_header(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = m.span("secret")
    value = text[start:end]
    scheme = (m.group("scheme") or "").lower()
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            decoded = ""
        if ":" not in decoded and not _plausible(value, "token"):
            return None
        if len(value) < 8 or _is_placeholder(value):
            return None
    elif not _plausible(value, "token"):
        return None
    return _Hit(start, end, key_name="Authorization", service=_known_service_near(text, m.start()))


def _extract_url_credentials(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = m.span("secret")
    value = text[start:end]
    user = m.group("user")
    if len(value) < 3 or _is_placeholder(value) or _REFERENCE_RE.search(value):
        return None
    if value.lower() in ("pass", "pw", "passwd", "pwd") or (
        user.lower() in ("user", "username") and value.lower() in ("pass", "password", "secret")
    ):
        return None
    if re.match(r"\d{1,5}(?:[,/]|$)", value):
        return None  # host:port lists ("https://a.com:123,b:456@..."), not a password
    decoded = urllib.parse.unquote(value)
    if _WORDLIKE_RE.fullmatch(decoded) and (len(decoded) <= 5 or " " in decoded or _fake_compound(decoded)):
        return None  # documentation URLs: "github://org:repo@", "https://jo:a%20secret@"
    scheme = m.group("scheme").lower().split("+")[0]
    host = m.group("host")
    service = _SERVICES.get(scheme) or _SERVICES.get(scheme.rstrip("s")) or host
    return _Hit(start, end, key_name=f"{user}@{host}", service=service)


def _extract_curl_user(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = m.span("secret")
    value = text[start:end]
    if len(value) < 4 or _is_placeholder(value) or _looks_like_code_or_path(value):
        return None
    return _Hit(start, end, key_name=f"{m.group('user')} (curl -u)", service=_known_service_near(text, m.start()))


_OPEN_QUOTES = {"`": "`", '"': '"', "'": "'", "“": "”", "‘": "’", "「": "」", "『": "』"}


_PROSE_SEP_RE = re.compile(r"(?i)\b(?:is|was|are|be|to)\b|[是为為\u4e00-\u9fff]")


def _cue_value(m: re.Match[str], text: str) -> tuple[int, int, bool]:
    """The value after a cue, and whether it was set off as a value in prose."""
    start, end = m.span("value")
    q = m.group("q") or ""
    prose = bool(_PROSE_SEP_RE.search(m.group("sep")) or not m.group("cue").isascii() or q not in ("'", '"'))
    quoted = False
    if q:
        close = _OPEN_QUOTES.get(q, q)
        idx = text.find(close, start, end + 1) if close.isascii() else -1
        if close.isascii() and idx >= 0:
            end = idx
            quoted = True
        elif not close.isascii():
            quoted = True
    if not quoted:
        start, end = _trim(text, start, end)
    return start, end, quoted and prose


_STRONG_KEY_QUALIFIERS = ("api", "access", "secret", "private", "auth", "app", "client", "bot", "license")


def _extract_password_cue(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end, quoted = _cue_value(m, text)
    value = text[start:end]
    if not _plausible(value, "password", quoted=quoted):
        return None
    service = _service_of_target(m.group("target")) or _service_before(text, m.start("cue"))
    return _Hit(start, end, key_name=m.group("cue").lower(), service=service)


def _extract_token_cue(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end, quoted = _cue_value(m, text)
    value = text[start:end]
    cue = m.group("cue").lower()
    service = _service_of_target(m.group("target")) or _service_before(text, m.start("cue"))
    bare_key = re.fullmatch(r"keys?", cue) is not None
    qualified = any(cue.startswith(q) for q in _STRONG_KEY_QUALIFIERS) or service is not None
    strength: Strength = "weak" if bare_key and not qualified else "token"
    if not _plausible(value, strength, quoted=quoted):
        return None
    return _Hit(start, end, key_name=re.sub(r"[\s_-]+", " ", cue), service=service)


# ---------------------------------------------------------------------------------------------
# Rule table

_L = r"(?<![A-Za-z0-9_\-])"  # left boundary: ASCII only, so CJK text may touch the key
_R = r"(?![A-Za-z0-9_\-])"
_B64L = r"(?<![A-Za-z0-9+/=_\-])"
_B64R = r"(?![A-Za-z0-9+/=_\-])"


def _p(
    name: str,
    service: str,
    key_name: str,
    regex: str,
    keywords: tuple[str, ...],
    *,
    entropy: float = 2.5,
    shared: bool = False,
    flags: int = 0,
) -> Rule:
    return Rule(
        name=name,
        service=service,
        key_name=key_name,
        kind="provider",
        pattern=re.compile(regex, re.ASCII | flags),
        keywords=keywords,
        extract=_extract_provider,
        min_entropy=entropy,
        shared_format=shared,
    )


def _c(
    name: str,
    service: str,
    key_name: str,
    regex: str,
    context_words: tuple[str, ...],
    *,
    window: int = 100,
    entropy: float = 3.0,
) -> Rule:
    return Rule(
        name=name,
        service=service,
        key_name=key_name,
        kind="context",
        pattern=re.compile(regex, re.ASCII),
        keywords=context_words,
        extract=_extract_context,
        min_entropy=entropy,
        context_words=context_words,
        context_window=window,
    )


def _g(name: str, regex: str, keywords: tuple[str, ...], extract: Extractor, kind: RuleKind = "generic") -> Rule:
    return Rule(
        name=name,
        service="Unknown",
        key_name=name,
        kind=kind,
        pattern=re.compile(regex),
        keywords=keywords,
        extract=extract,
    )


def _pem_block(label: str, limit: int = 20000) -> str:
    """A PEM block: BEGIN, a body that crosses no other `-----`, END; or, pasted without its END,
    BEGIN and base64 lines (literal `\\n` too, as in JSON). The tempered body keeps the scan linear
    when a text repeats BEGIN lines without bodies."""
    body = r"(?:(?!-----)[\s\S]){20," + str(limit) + "}?"
    truncated = r"\s*(?:\\n)?[A-Za-z0-9+/=]{40,}[A-Za-z0-9+/=\s\\]{0," + str(limit) + "}"
    return f"-----BEGIN {label}-----(?:{body}-----END {label}-----|{truncated})"


_PROVIDER_RULES: tuple[Rule, ...] = (
    # --- AI model providers
    _p(
        "anthropic_api_key",
        "Anthropic",
        "ANTHROPIC_API_KEY",
        _L + r"sk-ant-(?:api|admin|oat|ort|sid)\d{2}-[A-Za-z0-9_\-]{32,}" + _R,
        ("sk-ant-",),
    ),
    _p(
        "openai_project_key",
        "OpenAI",
        "OPENAI_API_KEY",
        _L + r"sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_\-]{40,}" + _R,
        ("sk-proj-", "sk-svcacct-", "sk-admin-", "sk-none-"),
    ),
    _p(
        "openai_api_key",
        "OpenAI",
        "OPENAI_API_KEY",
        _L + r"sk-[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}" + _R,
        ("t3blbkfj",),
    ),
    _p("openrouter_api_key", "OpenRouter", "OPENROUTER_API_KEY", _L + r"sk-or-v1-[a-f0-9]{64}" + _R, ("sk-or-",)),
    _p("deepseek_api_key", "DeepSeek", "DEEPSEEK_API_KEY", _L + r"sk-[a-f0-9]{32}" + _R, ("sk-",), shared=True),
    _p(
        "sk_api_key",
        "OpenAI-compatible",
        "API_KEY",
        _L + r"sk-(?=[A-Za-z0-9]*[0-9])(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{32,100}" + _R,
        ("sk-",),
        entropy=3.2,
        shared=True,
    ),
    _p("groq_api_key", "Groq", "GROQ_API_KEY", _L + r"gsk_[A-Za-z0-9]{52}" + _R, ("gsk_",)),
    _p("xai_api_key", "xAI", "XAI_API_KEY", _L + r"xai-[A-Za-z0-9]{80}" + _R, ("xai-",)),
    _p("google_api_key", "Google", "GOOGLE_API_KEY", _L + r"AIza[0-9A-Za-z_\-]{35}" + _R, ("aiza",), shared=True),
    _p(
        "google_oauth_client_secret",
        "Google",
        "GOOGLE_CLIENT_SECRET",
        _L + r"GOCSPX-[A-Za-z0-9_\-]{28}" + _R,
        ("gocspx-",),
    ),
    _p("google_oauth_token", "Google", "GOOGLE_ACCESS_TOKEN", _L + r"ya29\.[A-Za-z0-9_\-]{30,}" + _R, ("ya29.",)),
    _p("google_oauth_refresh_token", "Google", "GOOGLE_REFRESH_TOKEN", _L + r"1//0[A-Za-z0-9_\-]{40,}" + _R, ("1//0",)),
    _p(
        "huggingface_token",
        "Hugging Face",
        "HF_TOKEN",
        _L + r"(?:hf_|api_org_)[A-Za-z0-9]{34,40}" + _R,
        ("hf_", "api_org_"),
    ),
    _p("replicate_api_token", "Replicate", "REPLICATE_API_TOKEN", _L + r"r8_[A-Za-z0-9]{37}" + _R, ("r8_",)),
    _p("perplexity_api_key", "Perplexity", "PERPLEXITY_API_KEY", _L + r"pplx-[A-Za-z0-9]{48}" + _R, ("pplx-",)),
    _p("tavily_api_key", "Tavily", "TAVILY_API_KEY", _L + r"tvly-(?:dev-|prod-)?[A-Za-z0-9]{32}" + _R, ("tvly-",)),
    _p(
        "langsmith_api_key",
        "LangSmith",
        "LANGSMITH_API_KEY",
        _L + r"lsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}" + _R,
        ("lsv2_",),
    ),
    _p("elevenlabs_api_key", "ElevenLabs", "ELEVENLABS_API_KEY", _L + r"sk_[a-f0-9]{48}" + _R, ("sk_",)),
    _p(
        "fireworks_api_key", "Fireworks AI", "FIREWORKS_API_KEY", _L + r"fw_[A-Za-z0-9]{24}" + _R, ("fw_",), entropy=3.0
    ),
    _p("firecrawl_api_key", "Firecrawl", "FIRECRAWL_API_KEY", _L + r"fc-[a-f0-9]{32}" + _R, ("fc-",)),
    _p("zhipu_api_key", "Zhipu", "ZHIPUAI_API_KEY", _L + r"[a-f0-9]{32}\.[A-Za-z0-9]{16}" + _R, ()),
    _p(
        "baidu_qianfan_api_key",
        "Baidu Qianfan",
        "QIANFAN_API_KEY",
        _L + r"bce-v3/ALTAK-[A-Za-z0-9]{21}/[a-f0-9]{40}" + _R,
        ("bce-v3/",),
    ),
    # --- cloud
    _p(
        "aws_access_key_id",
        "AWS",
        "AWS_ACCESS_KEY_ID",
        r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])",
        ("akia", "asia", "abia", "acca"),
    ),
    _p(
        "azure_storage_account_key",
        "Azure",
        "AZURE_STORAGE_KEY",
        r"(?i:AccountKey)=(?P<secret>[A-Za-z0-9+/]{86}==)",
        ("accountkey=",),
    ),
    _p(
        "azure_ad_client_secret",
        "Azure",
        "AZURE_CLIENT_SECRET",
        r"(?<![A-Za-z0-9_~.\-])[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}(?![A-Za-z0-9_~.\-])",
        ("q~",),
    ),
    _p(
        "azure_sas_token",
        "Azure",
        "AZURE_SAS_TOKEN",
        r"[?&]sv=\d{4}-\d{2}-\d{2}[^\s\"'<>]{0,300}?[?&]sig=(?P<secret>[A-Za-z0-9%+/=]{30,})",
        ("sig=",),
    ),
    _p(
        "gcp_service_account_key",
        "Google Cloud",
        "GOOGLE_APPLICATION_CREDENTIALS",
        r"\"private_key_id\"\s*:\s*\"(?P<secret>[a-f0-9]{40})\"",
        ("private_key_id",),
    ),
    _p(
        "alibaba_access_key_id",
        "Alibaba Cloud",
        "ALIBABA_CLOUD_ACCESS_KEY_ID",
        _L + r"LTAI[A-Za-z0-9]{12,20}" + _R,
        ("ltai",),
    ),
    _p("tencent_secret_id", "Tencent Cloud", "TENCENTCLOUD_SECRET_ID", _L + r"AKID[A-Za-z0-9]{32}" + _R, ("akid",)),
    _p(
        "digitalocean_token",
        "DigitalOcean",
        "DIGITALOCEAN_TOKEN",
        _L + r"do[opr]_v1_[a-f0-9]{64}" + _R,
        ("dop_v1_", "doo_v1_", "dor_v1_"),
    ),
    _p(
        "cloudflare_origin_ca_key",
        "Cloudflare",
        "CLOUDFLARE_ORIGIN_CA_KEY",
        _L + r"v1\.0-[a-f0-9]{24}-[a-f0-9]{146}" + _R,
        ("v1.0-",),
    ),
    _p("heroku_api_key", "Heroku", "HEROKU_API_KEY", _L + r"HRKU-[A-Za-z0-9_\-]{60}" + _R, ("hrku-",)),
    _p("supabase_access_token", "Supabase", "SUPABASE_ACCESS_TOKEN", _L + r"sbp_[a-f0-9]{40}" + _R, ("sbp_",)),
    _p(
        "supabase_secret_key",
        "Supabase",
        "SUPABASE_SECRET_KEY",
        _L + r"sb_secret_[A-Za-z0-9_\-]{20,}" + _R,
        ("sb_secret_",),
    ),
    _p("databricks_token", "Databricks", "DATABRICKS_TOKEN", _L + r"dapi[a-f0-9]{32}(?:-\d)?" + _R, ("dapi",)),
    _p(
        "firebase_fcm_server_key",
        "Firebase",
        "FCM_SERVER_KEY",
        _L + r"AAAA[A-Za-z0-9_\-]{7}:APA91b[A-Za-z0-9_\-]{100,}" + _R,
        ("apa91b",),
    ),
    _p(
        "hashicorp_vault_token",
        "HashiCorp Vault",
        "VAULT_TOKEN",
        _L + r"hv[sb]\.[A-Za-z0-9_\-]{24,}" + _R,
        ("hvs.", "hvb."),
    ),
    _p(
        "terraform_cloud_token",
        "Terraform Cloud",
        "TFE_TOKEN",
        _L + r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=\-]{60,70}" + _R,
        ("atlasv1",),
    ),
    _p(
        "doppler_token",
        "Doppler",
        "DOPPLER_TOKEN",
        _L + r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,44}" + _R,
        ("dp.",),
    ),
    _p("pulumi_access_token", "Pulumi", "PULUMI_ACCESS_TOKEN", _L + r"pul-[a-f0-9]{40}" + _R, ("pul-",)),
    _p(
        "vercel_token",
        "Vercel",
        "VERCEL_TOKEN",
        _L + r"vc[pkiar]_[A-Za-z0-9]{24,60}" + _R,
        ("vcp_", "vck_", "vci_", "vca_", "vcr_"),
        entropy=3.0,
    ),
    _p("netlify_token", "Netlify", "NETLIFY_AUTH_TOKEN", _L + r"nfp_[A-Za-z0-9]{36}" + _R, ("nfp_",)),
    # --- code hosting, packages, CI
    _p("github_personal_access_token", "GitHub", "GITHUB_TOKEN", _L + r"ghp_[A-Za-z0-9]{36}" + _R, ("ghp_",)),
    _p("github_oauth_token", "GitHub", "GITHUB_OAUTH_TOKEN", _L + r"gho_[A-Za-z0-9]{36}" + _R, ("gho_",)),
    _p("github_user_to_server_token", "GitHub", "GITHUB_TOKEN", _L + r"ghu_[A-Za-z0-9]{36}" + _R, ("ghu_",)),
    _p("github_server_to_server_token", "GitHub", "GITHUB_TOKEN", _L + r"ghs_[A-Za-z0-9]{36}" + _R, ("ghs_",)),
    _p("github_refresh_token", "GitHub", "GITHUB_REFRESH_TOKEN", _L + r"ghr_[A-Za-z0-9]{36,76}" + _R, ("ghr_",)),
    _p(
        "github_fine_grained_pat",
        "GitHub",
        "GITHUB_TOKEN",
        _L + r"github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59}" + _R,
        ("github_pat_",),
    ),
    _p(
        "gitlab_token",
        "GitLab",
        "GITLAB_TOKEN",
        _L + r"gl(?:pat|dt|rt|ptt|cbt|oas|soat|ffct|imt|agent)-[A-Za-z0-9_\-.]{20,}" + _R,
        ("glpat-", "gldt-", "glrt-", "glptt-", "glcbt-", "gloas-", "glsoat-", "glffct-", "glimt-", "glagent-"),
    ),
    _p("npm_token", "npm", "NPM_TOKEN", _L + r"npm_[A-Za-z0-9]{36}" + _R, ("npm_",)),
    _p("pypi_token", "PyPI", "PYPI_TOKEN", _L + r"pypi-AgE[A-Za-z0-9_\-]{60,}" + _R, ("pypi-age",)),
    _p(
        "dockerhub_token",
        "Docker Hub",
        "DOCKERHUB_TOKEN",
        _L + r"dckr_(?:pat|oat)_[A-Za-z0-9_\-]{27,}" + _R,
        ("dckr_",),
    ),
    _p(
        "atlassian_api_token",
        "Atlassian",
        "ATLASSIAN_API_TOKEN",
        _L + r"AT[AC]TT3[A-Za-z0-9_=\-]{100,}" + _R,
        ("atatt3", "atctt3"),
    ),
    _p(
        "linear_api_key",
        "Linear",
        "LINEAR_API_KEY",
        _L + r"lin_(?:api|oauth)_[A-Za-z0-9]{40}" + _R,
        ("lin_api_", "lin_oauth_"),
    ),
    _p(
        "notion_token",
        "Notion",
        "NOTION_TOKEN",
        _L + r"(?:secret_[A-Za-z0-9]{43}|ntn_[A-Za-z0-9]{46})" + _R,
        ("secret_", "ntn_"),
        entropy=3.5,
    ),
    _p(
        "sentry_token",
        "Sentry",
        "SENTRY_AUTH_TOKEN",
        _L + r"(?:sntrys_eyJ[A-Za-z0-9_+/=\-]{40,}|sntryu_[a-f0-9]{64})" + _R,
        ("sntrys_", "sntryu_"),
    ),
    _p("postman_api_key", "Postman", "POSTMAN_API_KEY", _L + r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}" + _R, ("pmak-",)),
    _p(
        "grafana_token",
        "Grafana",
        "GRAFANA_TOKEN",
        _L + r"(?:glsa_[A-Za-z0-9]{32}_[a-f0-9]{8}|glc_[A-Za-z0-9+/]{32,}={0,2})" + _R,
        ("glsa_", "glc_"),
    ),
    _p("newrelic_api_key", "New Relic", "NEW_RELIC_API_KEY", _L + r"NRAK-[A-Z0-9]{27}" + _R, ("nrak-",)),
    _p("figma_token", "Figma", "FIGMA_TOKEN", _L + r"figd_[A-Za-z0-9_\-]{40}" + _R, ("figd_",)),
    _p("airtable_token", "Airtable", "AIRTABLE_TOKEN", _L + r"pat[A-Za-z0-9]{14}\.[a-f0-9]{64}" + _R, ("pat",)),
    # --- messaging, email
    _p(
        "slack_token",
        "Slack",
        "SLACK_TOKEN",
        _L + r"xox[abposre]-(?:\d+-)?[A-Za-z0-9\-]{10,}" + _R,
        ("xox",),
        entropy=3.0,
    ),
    _p("slack_app_token", "Slack", "SLACK_APP_TOKEN", _L + r"xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+" + _R, ("xapp-",)),
    _p(
        "slack_webhook_url",
        "Slack",
        "SLACK_WEBHOOK_URL",
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9+/_\-]{30,})",
        ("hooks.slack.com",),
    ),
    _p(
        "telegram_bot_token",
        "Telegram",
        "TELEGRAM_BOT_TOKEN",
        r"(?<![0-9A-Za-z])[0-9]{8,10}:[A-Za-z0-9_\-]{35}" + _R,
        (),
        entropy=3.5,
    ),
    _p(
        "discord_bot_token",
        "Discord",
        "DISCORD_BOT_TOKEN",
        _L + r"[MNO][A-Za-z0-9_\-]{23,25}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,38}" + _R,
        (),
        entropy=3.5,
    ),
    _p(
        "discord_webhook_url",
        "Discord",
        "DISCORD_WEBHOOK_URL",
        r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/(?P<secret>\d{16,20}/[A-Za-z0-9_\-]{60,68})",
        ("discord",),
    ),
    _p("twilio_api_key", "Twilio", "TWILIO_API_KEY", r"(?<![A-Za-z0-9])SK[0-9a-fA-F]{32}(?![A-Za-z0-9])", ("sk",)),
    _p(
        "sendgrid_api_key",
        "SendGrid",
        "SENDGRID_API_KEY",
        _L + r"SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}" + _R,
        ("sg.",),
    ),
    _p(
        "mailgun_api_key",
        "Mailgun",
        "MAILGUN_API_KEY",
        _L + r"(?:key-[0-9a-f]{32}|[0-9a-f]{32}-[0-9a-f]{8}-[0-9a-f]{8})" + _R,
        (),  # the newer format has no fixed part to filter on
    ),
    _p("mailchimp_api_key", "Mailchimp", "MAILCHIMP_API_KEY", _L + r"[a-f0-9]{32}-us[0-9]{1,2}" + _R, ("-us",)),
    _p("resend_api_key", "Resend", "RESEND_API_KEY", _L + r"re_[A-Za-z0-9]{8}_[A-Za-z0-9]{24}" + _R, ("re_",)),
    # --- payments, commerce
    _p(
        "stripe_secret_key",
        "Stripe",
        "STRIPE_SECRET_KEY",
        _L + r"sk_(?:live|test)_[A-Za-z0-9]{24,99}" + _R,
        ("sk_live_", "sk_test_"),
    ),
    _p(
        "stripe_restricted_key",
        "Stripe",
        "STRIPE_RESTRICTED_KEY",
        _L + r"rk_(?:live|test)_[A-Za-z0-9]{24,99}" + _R,
        ("rk_live_", "rk_test_"),
    ),
    _p("stripe_webhook_secret", "Stripe", "STRIPE_WEBHOOK_SECRET", _L + r"whsec_[A-Za-z0-9+/=]{32,}" + _R, ("whsec_",)),
    _p(
        "shopify_token",
        "Shopify",
        "SHOPIFY_ACCESS_TOKEN",
        _L + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _R,
        ("shpat_", "shpca_", "shppa_", "shpss_"),
    ),
    _p(
        "square_token",
        "Square",
        "SQUARE_ACCESS_TOKEN",
        _L + r"(?:EAAA[A-Za-z0-9_\-]{60}|sq0atp-[A-Za-z0-9_\-]{22})" + _R,
        ("eaaa", "sq0atp-"),
        entropy=3.0,
    ),
    _p("square_oauth_secret", "Square", "SQUARE_OAUTH_SECRET", _L + r"sq0csp-[A-Za-z0-9_\-]{43}" + _R, ("sq0csp-",)),
    _p(
        "braintree_token",
        "PayPal/Braintree",
        "BRAINTREE_ACCESS_TOKEN",
        # the fixed "access_token$" is left in place: it is a common word, not part of the secret
        r"access_token\$(?P<secret>(?:production|sandbox)\$[a-z0-9]{16}\$[a-f0-9]{32})",
        ("access_token$",),
    ),
    # --- generic formats
    _p("jwt", "JWT", "JWT", _L + r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}" + _R, ("eyj",)),
    _p(
        "mapbox_secret_token",
        "Mapbox",
        "MAPBOX_SECRET_TOKEN",
        _L + r"sk\.eyJ[A-Za-z0-9_\-]{50,}\.[A-Za-z0-9_\-]{20,}" + _R,
        ("sk.eyj",),
    ),
    _p("dropbox_token", "Dropbox", "DROPBOX_TOKEN", _L + r"sl\.(?:u\.)?[A-Za-z0-9_\-]{130,}" + _R, ("sl.",)),
    _p(
        "age_secret_key",
        "age",
        "AGE_SECRET_KEY",
        r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}",
        ("age-secret-key-1",),
    ),
    _p(
        "openssh_private_key",
        "SSH",
        "SSH_PRIVATE_KEY",
        _pem_block("OPENSSH PRIVATE KEY"),
        ("-----begin openssh private key",),
    ),
    _p(
        "pgp_private_key",
        "PGP",
        "PGP_PRIVATE_KEY",
        _pem_block("PGP PRIVATE KEY BLOCK", limit=40000),
        ("-----begin pgp private key",),
    ),
    _p(
        "private_key",
        "PEM",
        "PRIVATE_KEY",
        _pem_block("(?:(?:RSA|EC|DSA|ENCRYPTED) )?PRIVATE KEY"),
        ("private key-----",),
        entropy=3.5,
    ),
    _p(
        "putty_private_key",
        "SSH",
        "PUTTY_PRIVATE_KEY",
        r"PuTTY-User-Key-File-[23]:(?:(?!PuTTY-User-Key-File)[\s\S]){10,10000}?Private-MAC: ?[a-f0-9]{40,64}",
        ("putty-user-key-file",),
    ),
)

_CONTEXT_RULES: tuple[Rule, ...] = (
    _c(
        "aws_secret_access_key",
        "AWS",
        "AWS_SECRET_ACCESS_KEY",
        _B64L + r"[A-Za-z0-9/+]{40}" + _B64R,
        ("aws", "secret_access_key", "secretaccesskey", "akia", "asia"),
        window=200,
    ),
    _c(
        "cloudflare_api_token",
        "Cloudflare",
        "CLOUDFLARE_API_TOKEN",
        _L + r"[A-Za-z0-9_\-]{40}" + _R,
        ("cloudflare", "cf_api"),
    ),
    _c(
        "cloudflare_global_api_key",
        "Cloudflare",
        "CLOUDFLARE_API_KEY",
        _L + r"[a-f0-9]{37}" + _R,
        ("cloudflare", "cf_api"),
    ),
    _c(
        "azure_openai_api_key",
        "Azure",
        "AZURE_OPENAI_API_KEY",
        _L + r"(?:[a-f0-9]{32}|[A-Za-z0-9]{84})" + _R,
        ("azure",),
    ),
    _c("mistral_api_key", "Mistral", "MISTRAL_API_KEY", _L + r"[A-Za-z0-9]{32}" + _R, ("mistral",)),
    _c("twilio_auth_token", "Twilio", "TWILIO_AUTH_TOKEN", _L + r"[a-f0-9]{32}" + _R, ("twilio",)),
    _c(
        "alibaba_access_key_secret",
        "Alibaba Cloud",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
        _L + r"[A-Za-z0-9]{30}" + _R,
        ("ltai", "alibaba", "aliyun", "accesskeysecret", "access_key_secret", "阿里"),
    ),
    _c(
        "tencent_secret_key",
        "Tencent Cloud",
        "TENCENTCLOUD_SECRET_KEY",
        _L + r"[A-Za-z0-9]{32}" + _R,
        ("akid", "tencent", "secretkey", "secret_key", "腾讯"),
    ),
    _c(
        "heroku_api_key_uuid",
        "Heroku",
        "HEROKU_API_KEY",
        _L + r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}" + _R,
        ("heroku",),
        window=60,
    ),
    _c("paypal_client_secret", "PayPal", "PAYPAL_CLIENT_SECRET", _L + r"E[A-Za-z0-9_\-]{79}" + _R, ("paypal",)),
    _c("cohere_api_key", "Cohere", "COHERE_API_KEY", _L + r"[A-Za-z0-9]{40}" + _R, ("cohere",)),
)

# Assignments: `export DEEPSEEK_API_KEY=...`, `.env` lines, `"apiKey": "..."`, `password = '...'`.
_ASSIGNMENT_RE = (
    r"(?<![A-Za-z0-9_.$\-])(?P<name>[A-Za-z_][A-Za-z0-9_.\-]{0,80}?"
    r"(?i:key|token|secret|passw(?:or)?d|passphrase|pwd|pass|auth|credentials?|creds?)[A-Za-z0-9_]{0,40})"
    r"(?:\\?[\"'])?[ \t]*(?::=|=>|=|:|：)[ \t]*\\?"
    # a quoted value may be wrapped by a terminal onto following lines of base64
    r"(?:(?P<q>[\"'`])(?P<qv>[^\"'`\n]{1,1024}?(?:\r?\n[A-Za-z0-9+/=_\-.]{1,1024}?)*)\\?(?P=q)|"
    r"[\"'`]?(?P<v>[^\s\"'`,;<>\\]{1,1024}))"
)
_CLI_FLAG_RE = (
    r"(?<![\w\-])--?(?P<name>(?i:api[-_]?key|access[-_]token|auth[-_]token|token|password|passwd|secret|"
    r"client[-_]secret|pat))(?:=|[ \t]+)(?:[\"'](?P<qv>[^\"'\n]{1,512})[\"']|(?P<v>[^\s\"'`]{1,512}))"
)
_AUTH_HEADER_RE = (
    r"(?i)(?<![A-Za-z0-9_\-])(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
    r"(?:(?P<scheme>bearer|token|bot|basic|digest|apikey|sso-key)\s+)?(?P<secret>[A-Za-z0-9._~+/=:\-]{8,4096})"
)
_BEARER_RE = r"(?i)(?<![A-Za-z0-9_\-])(?P<scheme>bearer)\s+(?P<secret>[A-Za-z0-9._~+/\-]{16,4096}=*)"
_URL_CREDENTIALS_RE = (
    r"(?i)(?<![A-Za-z0-9+.\-])(?P<scheme>[a-z][a-z0-9+.\-]{1,20})://(?P<user>[^\s:@/?#\[\]\"'`<>]{0,64}):"
    r"(?P<secret>[^\s@/?#\"'`<>]{1,256})@(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*)"
)
_CURL_USER_RE = r"(?<![\w\-])(?:-u|--user)[ \t]+[\"']?(?P<user>[^\s:\"']{1,64}):(?P<secret>[^\s\"']{1,256})"

# "password is", "密钥是", "key:", "令牌记下来：" (a few CJK words may sit between cue and colon)
_CUE_SEP = (
    r"(?P<sep>(?:[\u4e00-\u9fff]{1,6}?)?"
    r"(?:\s+(?:is|was|are|would\s+be|will\s+be|should\s+be|set\s+to|changed\s+to)\b\s*[:：]?|"
    r"\s*(?:是|为|為)\s*[:：]?|\s*[:：=＝]|\s*=>|\s*->))[ \t\u3000]*(?:\r?\n[ \t]*)?"
)
_CUE_VALUE = r"(?P<q>[`\"'“‘「『]?)(?P<value>[!-~]{1,256})"
_TARGET = r"(?:\s+(?:for|of|to|on)\s+(?P<target>[^\n:=,;。，：]{1,40}?))?"

_PASSWORD_CUE_RE = (
    r"(?i)(?P<cue>(?<![A-Za-z0-9_\-])(?:pass(?:word|wd|phrase|code)s?|pwd|pin\s?code)|"
    r"密码|密碼|口令|密匙|通行码)(?![A-Za-z0-9_\-])" + _TARGET + r"[\"']?" + _CUE_SEP + _CUE_VALUE
)
_TOKEN_CUE_RE = (
    r"(?i)(?P<cue>(?<![A-Za-z0-9_\-])(?:(?:(?:api|access|secret|auth|bearer|bot|refresh|private|app|client|"
    r"personal\s+access|license)[ \t_\-]?)?(?:keys?|tokens?|secrets?)|apikey|credentials?)|"
    r"密钥|秘钥|私钥|令牌|授权码|凭证|凭据)(?![A-Za-z0-9_\-])" + _TARGET + r"[\"']?" + _CUE_SEP + _CUE_VALUE
)

_GENERIC_RULES: tuple[Rule, ...] = (
    _g(
        "env_assignment", _ASSIGNMENT_RE, ("key", "token", "secret", "pass", "pwd", "auth", "cred"), _extract_assignment
    ),
    _g(
        "cli_secret_flag",
        _CLI_FLAG_RE,
        ("-api", "-token", "-access", "-auth", "-pass", "-secret", "-client", "-pat"),
        _extract_cli_flag,
    ),
    _g("authorization_header", _AUTH_HEADER_RE, ("authorization",), _extract_auth_header),
    _g("bearer_token", _BEARER_RE, ("bearer",), _extract_auth_header),
    _g("url_credentials", _URL_CREDENTIALS_RE, ("://",), _extract_url_credentials),
    _g("curl_user_password", _CURL_USER_RE, ("-u", "--user"), _extract_curl_user),
    _g(
        "password_cue",
        _PASSWORD_CUE_RE,
        ("pass", "pwd", "pin", "密码", "密碼", "口令", "密匙", "通行码"),
        _extract_password_cue,
        kind="cue",
    ),
    _g(
        "token_cue",
        _TOKEN_CUE_RE,
        ("key", "token", "secret", "credential", "密钥", "秘钥", "私钥", "令牌", "授权码", "凭"),
        _extract_token_cue,
        kind="cue",
    ),
)

RULES: tuple[Rule, ...] = _PROVIDER_RULES + _CONTEXT_RULES + _GENERIC_RULES
_RULE_ORDER: dict[str, int] = {rule.name: i for i, rule in enumerate(RULES)}
_RULE_KEYWORDS: tuple[tuple[Rule, frozenset[str]], ...] = tuple((r, frozenset(r.keywords)) for r in RULES)
_ALL_KEYWORDS: tuple[str, ...] = tuple(sorted({k for r in RULES for k in r.keywords}))


# ---------------------------------------------------------------------------------------------
# OpenClaw's own masks
#
# OpenClaw 2026.9 masks secrets itself before it writes a transcript: `redactTranscriptMessage`
# (dist/transcript-redact-*.mjs) runs every text field through `redactSensitiveFieldValueWithOptions`
# / `redactText` (dist/redact-*.mjs, src/logging/redact.ts), whose `maskToken` keeps the first 6
# and last 4 UTF-16 units of a value of 18 or more (`sk-pro…HNzL`, U+2026 between) and turns a
# shorter value into `***`. Structured JSON fields, form bodies and overlapping matches also become
# `***`; a PEM private key keeps its BEGIN/END lines around `…redacted…`. A mask means "a credential
# was given here" while its value is gone: each one is replaced whole by a `masked_*` marker (no
# head or tail survives) and indexed with status `masked`. What OpenClaw masks, and the shapes this
# recognises, are listed in tests/test_masked_credentials.py (generated by the real package).

MASK_ELLIPSIS = "\u2026"
OPAQUE_MASK = "***"
PEM_MASK = f"{MASK_ELLIPSIS}redacted{MASK_ELLIPSIS}"
_MASKED_PREFIX = "masked_"
_MAX_MASK_ATOMS = 5000  # masks classified per text: a hostile text costs bounded time, then stops
_MAX_ELLIPSES = 200_000  # ellipses looked at per text (a run "……" costs one: a tail never holds "…")
_MIN_HINTED_UNITS = 18  # OpenClaw's DEFAULT_REDACT_MIN_LENGTH
_LEFT_WINDOW = 240


def is_masked_rule(rule: str) -> bool:
    """True for findings that are OpenClaw masks: the transcript holds no value for them."""
    return rule.startswith(_MASKED_PREFIX)


def is_opaque_mask(mask: str) -> bool:
    """`***` or a PEM `…redacted…` block: nothing of the value is left, so the mask cannot identify it."""
    return mask == OPAQUE_MASK or PEM_MASK in mask


def _utf16_len(text: str) -> int:
    return len(text) + sum(1 for c in text if ord(c) > 0xFFFF)


def _utf16_head(value: str, units: int) -> str:
    """`sliceUtf16Safe(value, 0, units)`: never half a surrogate pair."""
    taken = 0
    for i, ch in enumerate(value):
        taken += 2 if ord(ch) > 0xFFFF else 1
        if taken > units:
            return value[:i]
    return value


def _utf16_tail(value: str, units: int) -> str:
    """`sliceUtf16Safe(value, -units)`: never half a surrogate pair."""
    taken = 0
    for i in range(len(value) - 1, -1, -1):
        taken += 2 if ord(value[i]) > 0xFFFF else 1
        if taken > units:
            return value[i + 1 :]
    return value


def openclaw_mask(value: str) -> str:
    """What OpenClaw's `maskToken` makes of `value`: `***` under 18 UTF-16 units, else first 6 … last 4."""
    if value == OPAQUE_MASK or _utf16_len(value) < _MIN_HINTED_UNITS:
        return OPAQUE_MASK
    return _utf16_head(value, 6) + MASK_ELLIPSIS + _utf16_tail(value, 4)


def split_mask(mask: str) -> tuple[str, str] | None:
    """(head, tail) of a `head…tail` mask `maskToken` can produce; None for `***` or anything else."""
    if "\n" in mask:
        return None
    pos = mask.rfind(MASK_ELLIPSIS)
    while pos >= 0:
        head, tail = mask[:pos], mask[pos + 1 :]
        if _utf16_len(head) in (5, 6) and _utf16_len(tail) in (3, 4) and MASK_ELLIPSIS not in tail:
            return head, tail
        pos = mask.rfind(MASK_ELLIPSIS, 0, pos)
    return None


def masked_fingerprint(rule: str, key_name: str, mask: str, key: bytes) -> str:
    """The marker fingerprint of a mask: keyed like any other, over the mask (never over a value).

    A `head…tail` mask identifies its credential (an echo of the same mask gets the same
    fingerprint); `***` does not, so its fingerprint only says which rule and key name it was.
    """
    if is_opaque_mask(mask):
        material = f"\x00openclaw-mask\x00opaque\x00{rule}\x00{key_name}\x00{mask if mask != OPAQUE_MASK else ''}"
    else:
        material = f"\x00openclaw-mask\x00{mask}"
    return fingerprint(material, key)


# Heads OpenClaw's vendor patterns leave (first 6 characters of the token) -> service, key name.
_MASK_VENDORS: tuple[tuple[str, str, str], ...] = (
    ("sk-ant", "Anthropic", "ANTHROPIC_API_KEY"),
    ("sk-pro", "OpenAI", "OPENAI_API_KEY"),
    ("sk-svc", "OpenAI", "OPENAI_API_KEY"),
    ("sk-adm", "OpenAI", "OPENAI_ADMIN_KEY"),
    ("sk-or-", "OpenRouter", "OPENROUTER_API_KEY"),
    ("sk_liv", "Stripe", "STRIPE_SECRET_KEY"),
    ("sk_tes", "Stripe", "STRIPE_SECRET_KEY"),
    ("rk_liv", "Stripe", "STRIPE_RESTRICTED_KEY"),
    ("rk_tes", "Stripe", "STRIPE_RESTRICTED_KEY"),
    ("sk-", "OpenAI-compatible", "API_KEY"),
    ("github", "GitHub", "GITHUB_TOKEN"),
    ("ghp_", "GitHub", "GITHUB_TOKEN"),
    ("gho_", "GitHub", "GITHUB_OAUTH_TOKEN"),
    ("ghu_", "GitHub", "GITHUB_TOKEN"),
    ("ghs_", "GitHub", "GITHUB_TOKEN"),
    ("ghr_", "GitHub", "GITHUB_REFRESH_TOKEN"),
    ("glpat-", "GitLab", "GITLAB_TOKEN"),
    ("gl", "GitLab", "GITLAB_TOKEN"),
    ("GR1348", "GitLab", "GITLAB_RUNNER_TOKEN"),
    ("_gitla", "GitLab", "GITLAB_SESSION"),
    ("xoxb-", "Slack", "SLACK_BOT_TOKEN"),
    ("xox", "Slack", "SLACK_TOKEN"),
    ("xapp-", "Slack", "SLACK_APP_TOKEN"),
    ("gsk_", "Groq", "GROQ_API_KEY"),
    ("AIza", "Google", "GOOGLE_API_KEY"),
    ("ya29.", "Google", "GOOGLE_ACCESS_TOKEN"),
    ("1//0", "Google", "GOOGLE_REFRESH_TOKEN"),
    ("eyJ", "JWT", "JWT"),
    ("pplx-", "Perplexity", "PERPLEXITY_API_KEY"),
    ("fal_", "fal", "FAL_KEY"),
    ("fc-", "Firecrawl", "FIRECRAWL_API_KEY"),
    ("bb_liv", "Browserbase", "BROWSERBASE_API_KEY"),
    ("SG.", "SendGrid", "SENDGRID_API_KEY"),
    ("npm_", "npm", "NPM_TOKEN"),
    ("pypi-", "PyPI", "PYPI_TOKEN"),
    ("do", "DigitalOcean", "DIGITALOCEAN_TOKEN"),
    ("dp.", "Doppler", "DOPPLER_TOKEN"),
    ("dckr_", "Docker Hub", "DOCKERHUB_TOKEN"),
    ("bkua_", "Buildkite", "BUILDKITE_TOKEN"),
    ("CCIPAT", "CircleCI", "CIRCLECI_TOKEN"),
    ("sbp_", "Supabase", "SUPABASE_ACCESS_TOKEN"),
    ("dapi", "Databricks", "DATABRICKS_TOKEN"),
    ("ddp_", "Datadog", "DATADOG_API_KEY"),
    ("ddw_", "Datadog", "DATADOG_API_KEY"),
    ("glsa_", "Grafana", "GRAFANA_TOKEN"),
    ("glc_", "Grafana", "GRAFANA_TOKEN"),
    ("nfp_", "Netlify", "NETLIFY_AUTH_TOKEN"),
    ("CFPAT-", "Contentful", "CONTENTFUL_TOKEN"),
    ("ATCTT3", "Atlassian", "ATLASSIAN_API_TOKEN"),
    ("ATATT", "Atlassian", "ATLASSIAN_API_TOKEN"),
    ("ATBB", "Bitbucket", "BITBUCKET_TOKEN"),
    ("BBDC-", "Bitbucket", "BITBUCKET_TOKEN"),
    ("HRKU-", "Heroku", "HEROKU_API_KEY"),
    ("pat-eu", "HubSpot", "HUBSPOT_TOKEN"),
    ("pat-na", "HubSpot", "HUBSPOT_TOKEN"),
    ("apify_", "Apify", "APIFY_TOKEN"),
    ("FlyV1 ", "Fly.io", "FLY_API_TOKEN"),
    ("fio-u-", "Fly.io", "FLY_API_TOKEN"),
    ("tvly-", "Tavily", "TAVILY_API_KEY"),
    ("exa_", "Exa", "EXA_API_KEY"),
    ("syt_", "Matrix", "MATRIX_ACCESS_TOKEN"),
    ("mem0_", "Mem0", "MEM0_API_KEY"),
    ("brv_", "Brave", "BRAVE_API_KEY"),
    ("xai-", "xAI", "XAI_API_KEY"),
    ("fw_", "Fireworks AI", "FIREWORKS_API_KEY"),
    ("fw-", "Fireworks AI", "FIREWORKS_API_KEY"),
    ("AKIA", "AWS", "AWS_ACCESS_KEY_ID"),
    ("ASIA", "AWS", "AWS_ACCESS_KEY_ID"),
    ("AKID", "Tencent Cloud", "TENCENTCLOUD_SECRET_ID"),
    ("LTAI", "Alibaba Cloud", "ALIBABA_CLOUD_ACCESS_KEY_ID"),
    ("hf_", "Hugging Face", "HF_TOKEN"),
    ("api_or", "Hugging Face", "HF_TOKEN"),
    ("r8_", "Replicate", "REPLICATE_API_TOKEN"),
    ("https:", "Webhook", "WEBHOOK_URL"),  # whole Slack/Discord webhook URLs are masked as one token
)
# Key names OpenClaw's assignment, JSON, query, form and header patterns mask (normalised: lowercase, `_`).
_OPENCLAW_SECRET_KEYS = frozenset(
    """
    access_token refresh_token id_token auth_token hook_token api_key apikey api_secret client_secret
    app_secret private_key secret_key key_material authorization proxy_authorization jwt token secret
    password pass passwd passphrase credential secret_value raw_secret secret_input bearer_token api_token
    accesstoken refreshtoken idtoken authtoken clientsecret appsecret privatekey keymaterial bearertoken
    apitoken secretvalue rawsecret secretinput aws_secret_access_key awssecretaccesskey secretaccesskey
    card_number cardnumber card_cvc cardcvc card_cvv cardcvv cvc cvv security_code securitycode
    payment_credential paymentcredential shared_payment_token sharedpaymenttoken session code signature
    x_amz_signature x_amz_security_token key auth cookie set_cookie x_api_key x_auth_token x_goog_api_key
    api_key_header x_api_token x_access_token x_openclaw_token x_pomerium_jwt_assertion
    """.split()  # noqa: SIM905 - a word list reads better as text
)
_ENV_SECRET_NAME_RE = re.compile(
    r"[A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CARD_?NUMBER|CVC|CVV|SECURITY_?CODE|PAYMENT_?CREDENTIAL)"
)
_GENERIC_KEY_NAMES = frozenset(
    "key keys token tokens secret password passwd pass apikey api_key credential credentials auth".split()  # noqa: SIM905
)
_TOKEN_CHAR_RE = re.compile(r"[A-Za-z0-9_\-]")
_QUOTE_CHARS = "\"'`"
_OPAQUE_RE = re.compile(r"(?<![*\\])\*\*\*(?!\*)")
# What two overlapping OpenClaw rules leave of a quoted value with spaces: `password="p@ss w0rd ... more"`
# becomes `password=*** w…more"` (the first word went into `***`, the rest of the `head…tail` mask and
# the closing quote stay). The residue belongs to the mask and goes with it.
_MASK_RESIDUE_RE = re.compile(r"[ \t][^\n…\"'`]{0,4}…[^\n…\"'`]{1,4}[\"'`]")
_PEM_MASK_RE = re.compile(
    r"-----BEGIN (?P<label>(?:[A-Z0-9]+ )*)PRIVATE KEY-----[ \t]*\r?\n[ \t]*" + PEM_MASK
    + r"[ \t]*\r?\n[ \t]*-----END (?P=label)PRIVATE KEY-----"
)
# Contexts, matched against the text just before a mask (each ends at the mask: `\Z`).
_CTX_URL_RE = re.compile(
    r"(?i)(?<![A-Za-z0-9+.\-])(?P<scheme>[a-z][a-z0-9+.\-]{1,20})://(?P<user>[^\s:@/?#\[\]\"'`<>]{0,64}):\Z"
)
_URL_HOST_RE = re.compile(r"@(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*)")
_CTX_QUERY_RE = re.compile(r"[?&](?P<name>[A-Za-z_%][\w.%\-]{0,80})=\Z")
_CTX_AUTH_RE = re.compile(
    r"(?i)(?<![\w-])(?P<name>(?:proxy-)?authorization)[\"']?[ \t]*[:=][ \t]*[\"']?(?:[A-Za-z][\w-]{0,20}[ \t]+)?\Z"
)
_CTX_BEARER_RE = re.compile(r"(?i)(?<![\w-])bearer[ \t]+\Z")
_CTX_HEADER_RE = re.compile(
    r"(?i)(?<![\w\-\"'])(?P<name>x-goog-api-key|x-api-key|api-key|apikey|x-api-token|x-access-token|x-auth-token|"
    r"x-openclaw-token|x-pomerium-jwt-assertion)[\"']?[ \t]*[:=][ \t]*[\"']?\Z"
)
_CTX_FLAG_RE = re.compile(r"(?<![\w-])--(?P<name>[A-Za-z][\w-]{0,60})(?:=|[ \t]+)[\"']?\Z")
_CTX_EXPANSION_RE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*):[-=?+]\Z")
_CTX_FIELD_RE = re.compile(r"[\"'](?P<name>[^\"'\\\n]{1,80})[\"'][ \t]*[:=][ \t]*[\"'`]?\Z")
_CTX_ASSIGN_RE = re.compile(
    r"(?<![\w.$\-])(?P<name>[A-Za-z_][\w.\-]{0,80})[\"']?[ \t]*(?::=|=>|=|:|：)[ \t]*[\"'`]?\Z"
)
_CTX_HOST_RE = re.compile(r"://(?:[^\s/@]*@)?(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*)[^\s]*\Z")


@dataclass(frozen=True, slots=True)
class _MaskAtom:
    start: int
    end: int
    quote: str  # the quote around it, or ""
    kind: Literal["hinted", "opaque", "pem"]
    label: str = ""  # PEM label ("RSA ", "OPENSSH ", "")


def _units_back(text: str, pos: int, units: int) -> int | None:
    """Index `s` with exactly `units` UTF-16 units in text[s:pos], or None."""
    taken, i = 0, pos
    while i > 0 and taken < units:
        i -= 1
        taken += 2 if ord(text[i]) > 0xFFFF else 1
    return i if taken == units else None


def _units_fwd(text: str, pos: int, units: int) -> int | None:
    taken, i = 0, pos
    while i < len(text) and taken < units:
        taken += 2 if ord(text[i]) > 0xFFFF else 1
        i += 1
    return i if taken == units else None


def _hinted_atom_at(text: str, pos: int) -> _MaskAtom | None:
    """The `head…tail` mask whose ellipsis is at `pos`, if the text there is shaped like one."""
    n = len(text)
    for head_units in (6, 5):
        s = _units_back(text, pos, head_units)
        if s is None:
            continue
        head = text[s:pos]
        for tail_units in (4, 3):
            e = _units_fwd(text, pos + 1, tail_units)
            if e is None:
                continue
            tail = text[pos + 1 : e]
            if MASK_ELLIPSIS in tail or "\n" in head or "\n" in tail or "\r" in head + tail:
                continue
            quote = text[s - 1] if s > 0 else ""
            if quote and quote in _QUOTE_CHARS and e < n and text[e] == quote and quote not in head + tail:
                return _MaskAtom(s, e, quote, "hinted")
            if any(c.isspace() for c in head + tail) and not head.startswith("FlyV1 "):
                continue
            left_ok = s == 0 or not (_TOKEN_CHAR_RE.match(text[s - 1]) or text[s - 1] == MASK_ELLIPSIS)
            telegram = s >= 3 and text[s - 3 : s].lower() == "bot" and head[:1].isdigit()
            right_ok = e == n or not (_TOKEN_CHAR_RE.match(text[e]) or text[e] == MASK_ELLIPSIS)
            if (left_ok or telegram) and right_ok:
                return _MaskAtom(s, e, "", "hinted")
    return None


def _right_boundary(text: str, end: int) -> bool:
    """A mask ends here: end of text, space, quote, closing punctuation, or sentence punctuation + space."""
    if end >= len(text):
        return True
    ch = text[end]
    if ch.isspace() or ch in "\"'`,;)]}>&#@<|":
        return True
    if ch in ".!?:。，；：）":
        return end + 1 >= len(text) or text[end + 1].isspace() or ch in "。，；：）"
    return False


def _masked_name_ok(name: str) -> bool:
    """A name OpenClaw masks the value of (or one we call secret): DB_PASSWORD, apiKey, client_secret."""
    last = re.split(r"[.:]", name)[-1] or name
    if is_secret_name(last) or _ENV_SECRET_NAME_RE.fullmatch(last):
        return True
    return last.lower().replace("-", "_") in _OPENCLAW_SECRET_KEYS


def _mask_vendor(mask: str) -> tuple[str, str] | None:
    parts = split_mask(mask)
    if parts is None:
        return None
    head = parts[0]
    for prefix, service, key_name in _MASK_VENDORS:
        if head.startswith(prefix):
            return service, key_name
    return None


# OpenClaw masks Apple app-specific passwords (`abcd-efgh-ijkl-mnop`) wherever they appear.
_APP_PASSWORD_MASK_RE = re.compile(r"[a-z]{4}-[a-z]…[a-z]{4}")


def _bare_mask_ok(text: str, atom: _MaskAtom, mask: str) -> bool:
    """A mask with no key beside it (a vendor token, a registered secret): only if it looks like a token."""
    parts = split_mask(mask)
    if parts is None or not _right_boundary(text, atom.end + (1 if atom.quote else 0)):
        return False
    if _mask_vendor(mask) is not None or _APP_PASSWORD_MASK_RE.fullmatch(mask):
        return True
    if atom.start >= 3 and text[atom.start - 3 : atom.start].lower() == "bot" and mask[:1].isdigit():
        return True  # Telegram: bot<digits>:<secret>
    head, tail = parts
    if _utf16_len(head) != 6 or _utf16_len(tail) != 4:
        return False  # the astral-split 5/3 shapes only with a key beside them
    if not any(c.isalnum() for c in head) or not any(c.isalnum() for c in tail):
        return False  # "of 24011)…\")." is prose
    sample = head + tail
    if sample.isascii() and sample.isdigit():
        return True  # Telegram's `<bot id>:<secret>` without the "bot": 6 digits of the id, 4 of the secret
    if any(c.isspace() for c in sample) or not any(c.isascii() and c.isalpha() for c in sample):
        return False
    return _char_classes(sample) >= 2 and not _is_wordish(sample)


def _service_for_mask(text: str, start: int, mask: str, name: str | None) -> str:
    if name and (svc := service_from_name(name, known_only=True)):
        return svc
    vendor = _mask_vendor(mask)
    if vendor is not None and vendor[0] != "Webhook":
        return vendor[0]
    near = _known_service_near(text, start)
    if near:
        return near
    if name and (svc := service_from_name(name)):
        return svc
    return vendor[0] if vendor else "Unknown"


def _classify_mask(text: str, atom: _MaskAtom) -> tuple[str, str, str] | None:
    """(rule, service, key name) for a mask, from what stands before it; None when it is no credential."""
    mask = text[atom.start : atom.end]
    if atom.kind == "pem":
        label = atom.label.strip()
        ssh = label == "OPENSSH"
        return ("masked_private_key", "SSH" if ssh else "PEM",
                "SSH_PRIVATE_KEY" if ssh else (f"{label.replace(' ', '_')}_PRIVATE_KEY" if label else "PRIVATE_KEY"))
    hinted = atom.kind == "hinted"
    left = text[max(0, atom.start - _LEFT_WINDOW) : atom.start]
    after = atom.end + (1 if atom.quote else 0)
    if not atom.quote and (m := _CTX_URL_RE.search(left)) and (h := _URL_HOST_RE.match(text, atom.end)):
        scheme = m.group("scheme").lower().split("+")[0]
        host = h.group("host")
        service = _SERVICES.get(scheme) or _SERVICES.get(scheme.rstrip("s")) or host
        return "masked_url_credentials", service, f"{m.group('user')}@{host}"
    if not hinted and not _right_boundary(text, after):
        return None  # `***bold***`, `***` glued to more text: markdown, not a mask
    if (m := _CTX_QUERY_RE.search(left)) and _masked_name_ok(m.group("name")):
        host = _CTX_HOST_RE.search(left)
        service = _service_for_mask(text, atom.start, mask, None)
        if service == "Unknown" and host:
            service = host.group("host")
        return "masked_query_param", service, m.group("name")
    if (m := _CTX_AUTH_RE.search(left)) or (m := _CTX_BEARER_RE.search(left)):
        name = m.groupdict().get("name") or "Authorization"
        key_name = "Proxy-Authorization" if name.lower().startswith("proxy") else "Authorization"
        return "masked_authorization", _service_for_mask(text, atom.start, mask, None), key_name
    if m := _CTX_HEADER_RE.search(left):
        return "masked_header", _service_for_mask(text, atom.start, mask, None), m.group("name")
    if (m := _CTX_FLAG_RE.search(left)) and _masked_name_ok(m.group("name")):
        return ("masked_cli_flag", _service_for_mask(text, atom.start, mask, m.group("name")),
                "--" + m.group("name"))
    if not hinted and (m := _CTX_EXPANSION_RE.search(left)) and text.startswith("}", atom.end):
        return "masked_assignment", _service_for_mask(text, atom.start, mask, m.group("name")), m.group("name")
    if (m := _CTX_FIELD_RE.search(left)) and _masked_name_ok(m.group("name")):
        name = m.group("name")
        return "masked_json_field", _service_for_mask(text, atom.start, mask, name), name
    if (m := _CTX_ASSIGN_RE.search(left)) and _masked_name_ok(m.group("name")):
        last = re.split(r"[.:]", m.group("name"))[-1] or m.group("name")
        service = _service_for_mask(text, atom.start, mask, last)
        vendor = _mask_vendor(mask)
        if last.lower().replace("-", "_") in _GENERIC_KEY_NAMES and vendor is not None and vendor[0] != "Webhook":
            last = vendor[1]  # "my API key: sk-pro…HNzL" -> OPENAI_API_KEY rather than "key"
        return "masked_assignment", service, last
    if hinted and _bare_mask_ok(text, atom, mask):
        vendor = _mask_vendor(mask)
        if vendor is None and _APP_PASSWORD_MASK_RE.fullmatch(mask):
            vendor = ("Apple", "APP_SPECIFIC_PASSWORD")
        if atom.start >= 3 and text[atom.start - 3 : atom.start].lower() == "bot":
            vendor = ("Telegram", "TELEGRAM_BOT_TOKEN")
        if vendor is None or vendor[0] == "Webhook":
            return "masked_token", _service_for_mask(text, atom.start, mask, None), vendor[1] if vendor else "token"
        return "masked_token", vendor[0], vendor[1]
    return None


def _mask_atoms(text: str) -> list[_MaskAtom]:
    atoms: list[_MaskAtom] = []
    if PEM_MASK in text:
        atoms.extend(_MaskAtom(m.start(), m.end(), "", "pem", m.group("label")) for m in _PEM_MASK_RE.finditer(text))
    pem = _Spans([(a.start, a.end) for a in atoms])
    budget, looked = _MAX_MASK_ATOMS, _MAX_ELLIPSES
    covered = -1
    pos = text.find(MASK_ELLIPSIS)
    while pos >= 0 and budget > 0 and looked > 0:
        looked -= 1
        if pos >= covered and text[pos + 1 : pos + 2] != MASK_ELLIPSIS and not pem.overlaps(pos, pos + 1):
            atom = _hinted_atom_at(text, pos)
            if atom is not None and atom.start >= covered:
                budget -= 1
                atoms.append(atom)
                covered = atom.end
        pos = text.find(MASK_ELLIPSIS, pos + 1)
    if OPAQUE_MASK in text:
        for m in _OPAQUE_RE.finditer(text):
            if budget <= 0:
                break
            budget -= 1
            s, e = m.span()
            quote = text[s - 1] if s > 0 and text[s - 1] in _QUOTE_CHARS and text[e : e + 1] == text[s - 1] else ""
            atoms.append(_MaskAtom(s, e, quote, "opaque"))
    return sorted(atoms, key=lambda a: a.start)


def _detect_masked(text: str) -> list[SecretMatch]:
    """OpenClaw's masks in `text`, each as one match whose value is the mask itself (never a secret)."""
    if MASK_ELLIPSIS not in text and OPAQUE_MASK not in text:
        return []
    found: list[SecretMatch] = []
    taken = _Spans([])
    for atom in _mask_atoms(text):
        if taken.overlaps(atom.start, atom.end):
            continue
        named = _classify_mask(text, atom)
        if named is None:
            continue
        rule, service, key_name = named
        end = atom.end
        if atom.kind == "opaque" and not atom.quote and (residue := _MASK_RESIDUE_RE.match(text, end)):
            end = residue.end()
        taken.add(atom.start, end)
        found.append(SecretMatch(rule, service, key_name, atom.start, end, text[atom.start : atom.end], masked=True))
    return found


# -- Finding the unmasked value again (OpenClaw keeps some unmasked text: see features/credentials.py)

_RECOVER_MAX_HITS = 256
_VALUE_STOP = "\"'`,;)}]"


def _is_reference(value: str) -> bool:
    return bool(re.fullmatch(r"\$\{?[A-Za-z_][A-Za-z0-9_]*(?::[-=?+][^}]*)?\}?", value))


def _usable(value: str) -> bool:
    return bool(value) and value != OPAQUE_MASK and split_mask(value) is None and not _is_reference(value)


def _hinted_candidates(text: str, mask: str) -> list[str]:
    parts = split_mask(mask)
    if parts is None:
        return []
    head, tail = parts
    out: list[str] = []
    start, hits = 0, 0
    while hits < _RECOVER_MAX_HITS and (i := text.find(head, start)) >= 0:
        hits += 1
        start = i + 1
        quote = text[i - 1] if i > 0 and text[i - 1] in _QUOTE_CHARS else ""
        j = text.find(tail, i + len(head))
        tries = 0
        while j >= 0 and tries < 64 and j - i <= 8192:
            tries += 1
            end = j + len(tail)
            value = text[i:end]
            bounded = end >= len(text) or not _TOKEN_CHAR_RE.match(text[end])
            spaced = any(c.isspace() for c in value)
            if "\n" in value or (spaced and not (quote and text[end : end + 1] == quote)):
                break
            if bounded and openclaw_mask(value) == mask and _usable(value):
                out.append(value)
                break
            j = text.find(tail, j + 1)
    return out


def _opaque_patterns(rule: str, key_name: str, mask: str) -> list[re.Pattern[str]]:
    name = re.escape(key_name)
    value = r"(?:\"(?P<dq>[^\"\n]+)\"|'(?P<sq>[^'\n]+)'|`(?P<bq>[^`\n]+)`|(?P<v>[^\s\"'`\\<>]+))"
    if rule == "masked_url_credentials":
        user, _, host = key_name.rpartition("@")
        return [re.compile(r"://" + re.escape(user) + r":(?P<v>[^\s@]+)@" + re.escape(host) + r"(?![A-Za-z0-9.\-])")]
    if rule == "masked_private_key":
        label = re.escape(mask.split("-----BEGIN ", 1)[-1].split("PRIVATE KEY-----", 1)[0]) if "BEGIN" in mask else ""
        return [re.compile(r"(?P<v>-----BEGIN " + label + r"PRIVATE KEY-----[\s\S]{1,20000}?-----END " + label
                           + r"PRIVATE KEY-----)")]
    if rule == "masked_authorization":
        return [re.compile(r"(?i)(?<![\w-])(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
                           r"(?:(?:bearer|basic|bot|token|digest|apikey|sso-key)[ \t]+)?(?P<v>[^\s\"',;]+)"),
                re.compile(r"(?i)(?<![\w-])bearer[ \t]+(?P<v>[^\s\"',;]+)")]
    if rule == "masked_header":
        return [re.compile(r"(?i)(?<![\w-])" + name + r"[\"']?[ \t]*[:=][ \t]*[\"']?(?P<v>[^\s\"',;\\]+)")]
    if rule == "masked_cli_flag":
        return [re.compile(r"(?<![\w-])" + name + r"(?:=|[ \t]+)" + value)]
    if rule == "masked_query_param":
        return [re.compile(r"(?:[?&]|(?<![^\s,;]))" + name + r"=(?P<v>[^&#\s<>]+)")]
    # masked_assignment, masked_json_field
    return [
        re.compile(r"[\"']" + name + r"[\"'][ \t]*:[ \t]*\"(?P<dq>[^\"]+)\""),
        re.compile(r"\$\{" + name + r":[-=?+](?P<v>[^}\n]+)\}"),
        re.compile(r"(?<![\w-])(?:[\w\-]*\.)?" + name + r"[\"']?[ \t]*(?::=|=>|=|:|：)[ \t]*" + value),
    ]


def recover_unmasked(text: str, *, rule: str, key_name: str, mask: str) -> list[str]:
    """Values in `text` (an unmasked copy of a message) that OpenClaw would have turned into `mask`
    for this finding, distinct, in order of appearance. The caller decides what to do with several.

    A `head…tail` mask is matched exactly (OpenClaw's masking is recomputed on each candidate); `***`
    says nothing of the value, so the key name and shape must match instead. The values returned are
    secrets: hand them to the vault, never log them.
    """
    if not text or not is_masked_rule(rule):
        return []
    values: list[str] = []
    if split_mask(mask) is not None:
        values = _hinted_candidates(text, mask)
    elif is_opaque_mask(mask):
        for pattern in _opaque_patterns(rule, key_name, mask):
            for hit, m in enumerate(pattern.finditer(text)):
                if hit >= _RECOVER_MAX_HITS:
                    break
                groups = m.groupdict()
                raw = next((groups[g] for g in ("dq", "sq", "bq", "v") if groups.get(g)), "")
                value = raw if groups.get("dq") or groups.get("sq") or groups.get("bq") else raw.rstrip(_VALUE_STOP)
                values.append(value)
    distinct: list[str] = []
    for value in values:
        if _usable(value) and value not in distinct:
            distinct.append(value)
    return distinct


# ---------------------------------------------------------------------------------------------
# Detection


@dataclass(slots=True)
class _Candidate:
    rule: Rule
    start: int
    end: int
    key_name: str | None
    service: str | None
    value: str


def _merge(text: str, candidates: list[_Candidate]) -> list[SecretMatch]:
    candidates.sort(key=lambda c: (c.start, -c.end))
    clusters: list[list[_Candidate]] = []
    cluster_end = -1
    for cand in candidates:
        if clusters and cand.start < cluster_end:
            clusters[-1].append(cand)
            cluster_end = max(cluster_end, cand.end)
        else:
            clusters.append([cand])
            cluster_end = cand.end
    matches: list[SecretMatch] = []
    for cluster in clusters:
        # ties go to the rule listed first: the table lists narrower formats before wider ones
        best = max(cluster, key=lambda c: (c.rule.priority, c.end - c.start, -_RULE_ORDER[c.rule.name]))
        named = [c for c in cluster if c.key_name]
        # an assignment's variable name beats a rule's default name (DEEPSEEK_API_KEY=sk-...)
        key_name = best.key_name or (named[0].key_name if named else None) or best.rule.key_name
        if best.rule.kind == "provider" and not best.key_name and named:
            key_name = named[0].key_name or best.rule.key_name
        service: str | None
        if best.rule.kind in ("provider", "context") and not best.rule.shared_format:
            service = best.rule.service
        else:
            hinted = [c.service for c in cluster if c.service]
            service = best.service or (hinted[0] if hinted else None)
            if service is None and best.rule.shared_format:
                service = _known_service_near(text, best.start)
            if service is None:
                service = best.rule.service
        start = min(c.start for c in cluster)
        end = max(c.end for c in cluster)
        matches.append(SecretMatch(best.rule.name, service, key_name or best.rule.key_name, start, end, best.value))
    return matches


def _marker_spans(text: str, lowered: str) -> list[tuple[int, int]]:
    if _MARKER_PREFIX not in lowered:
        return []
    return [m.span() for m in MARKER_RE.finditer(text)]


def detect(text: str) -> list[SecretMatch]:
    """Every secret in `text`, in order, with spans in `text`. Never raises on any string."""
    if not text:
        return []
    lowered = text.lower()
    blocked = _marker_spans(text, lowered)
    # OpenClaw's masks first: a mask is one finding, and no rule may take a piece of it (the head
    # `sk-pro` of `sk-pro…HNzL` is no key, and its tail must not survive beside a marker).
    masked = _detect_masked(text)
    if masked:
        blocked = blocked + [(m.start, m.end) for m in masked]
    blocked_spans = _Spans(blocked)
    candidates: list[_Candidate] = []
    # each distinct keyword is looked up once, then a rule runs if any of its keywords is present
    present = {k for k in _ALL_KEYWORDS if k in lowered}
    for rule, keywords in _RULE_KEYWORDS:
        if keywords and keywords.isdisjoint(present):
            continue
        for m in rule.pattern.finditer(text):
            hit = rule.extract(rule, m, text)
            if hit is None or hit.end <= hit.start:
                continue
            if blocked and blocked_spans.overlaps(hit.start, hit.end):
                continue  # our own marker: redacting twice must find nothing new
            value = hit.value if hit.value is not None else text[hit.start : hit.end]
            candidates.append(_Candidate(rule, hit.start, hit.end, hit.key_name, hit.service, value))
    if not candidates:
        return masked
    matches = _with_repeats(text, _merge(text, candidates), blocked)
    return sorted(masked + matches, key=lambda m: m.start) if masked else matches


class _Spans:
    """Sorted, non-overlapping spans with an O(log n) overlap test."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self._spans = sorted(spans)
        self._starts = [s for s, _ in self._spans]

    def overlaps(self, start: int, end: int) -> bool:
        i = bisect.bisect_left(self._starts, end) - 1  # the last span starting before `end`
        return i >= 0 and self._spans[i][1] > start

    def add(self, start: int, end: int) -> None:
        i = bisect.bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._spans.insert(i, (start, end))


def _with_repeats(text: str, matches: list[SecretMatch], blocked: list[tuple[int, int]]) -> list[SecretMatch]:
    """A value found once is hidden everywhere it recurs, even where no rule would fire."""
    taken = _Spans([(m.start, m.end) for m in matches] + blocked)
    extra: list[SecretMatch] = []
    seen: set[str] = set()
    for match in matches:
        value = match.value
        if value in seen or len(value) < 10 or shannon_entropy(value) < 3.0 or _is_wordish(value):
            continue  # each value once; only values that cannot plausibly recur by accident
        seen.add(value)
        pos = text.find(value)
        while pos >= 0:
            end = pos + len(value)
            if not taken.overlaps(pos, end):
                extra.append(SecretMatch(match.rule, match.service, match.key_name, pos, end, value))
                taken.add(pos, end)
            pos = text.find(value, pos + 1)
    if not extra:
        return matches
    return sorted(matches + extra, key=lambda m: m.start)


def fingerprint(value: str, key: bytes) -> str:
    """8 hex chars of HMAC-SHA256(key, value): stable per key, reveals nothing of the value."""
    return hmac.new(key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:8]


def redact(text: str, key: bytes) -> Redacted:
    """`text` with every secret replaced by `[REDACTED:<rule>:<fp8>]`; findings span the original text."""
    return redact_with_matches(text, key)[0]


def redact_with_matches(text: str, key: bytes) -> tuple[Redacted, tuple[SecretMatch, ...]]:
    """`redact`, plus the matches behind the findings (same order) for a caller that keeps a vault.

    The matches hold the values: hand them to the vault and drop them, never log them.
    """
    matches = detect(text)
    if not matches:
        return Redacted(text=text), ()
    parts: list[str] = []
    findings: list[SecretFinding] = []
    cursor = 0
    for match in matches:
        if match.masked:
            fp = masked_fingerprint(match.rule, match.key_name, match.value, key)
        else:
            fp = fingerprint(match.value, key)
        parts.append(text[cursor : match.start])
        parts.append(f"[REDACTED:{match.rule}:{fp}]")
        cursor = match.end
        kind: MaskKind = ("opaque" if is_opaque_mask(match.value) else "hinted") if match.masked else ""
        findings.append(SecretFinding(match.rule, match.service, match.key_name, fp, match.start, match.end, kind))
    parts.append(text[cursor:])
    return Redacted(text="".join(parts), findings=tuple(findings)), tuple(matches)
