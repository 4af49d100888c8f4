"""Types, value statistics and the plausibility checks every rule's extractor uses."""

from __future__ import annotations

import bisect
import hashlib
import hmac
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

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
# What makes a value with brackets code rather than a password: quotes or spaces inside, a call or
# subscript as the whole value (`Optional[str]`, `getenv("X")`, `cfg['password']`), a leading bracket.
_CODE_EXPR_RE = re.compile(
    r"[\s\"'`\\,]|^[\[({<]|[\w.$]\((?:[^()]*)\)$|^[A-Za-z_$][\w.$]*[\[(]|[\[(]$|\w<\w[\w, ]*>|=>|->|::|\$\{|"
    r"\}\}|\{\{"
)
_IDENTIFIER_RE = re.compile(r"_*[A-Za-z]+(?:_+[A-Za-z]+)*_*")
_HEADER_NAME_RE = re.compile(r"[A-Z][A-Za-z]*(?:-[A-Z][A-Za-z]*)+")


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


# Documented example keys and fillers: `AKIAIOSFODNN7EXAMPLE`, `wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY`,
# `xoxp-1-RANDOMSTRINGHERE`, `ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx`, `sk-...0000000000`. They are
# published in documentation for copying; hiding them would only hide that the user pasted an example.
_DOC_EXAMPLE_RE = re.compile(r"EXAMPLE|RANDOMSTRING|STRINGHERE|[xX]{6}|\*{4}|([^A\s0-9])\1{7}")


def is_documented_example(value: str) -> bool:
    """A published example or filler key (`AKIAIOSFODNN7EXAMPLE`, `xoxp-1-RANDOMSTRINGHERE`), not a secret."""
    return _DOC_EXAMPLE_RE.search(value) is not None


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


# A password built of words or letters joined by symbols (`development#product`, `Prestigitariu$`,
# `mycoin!1`): given under a password or secret name, a symbol inside makes it a chosen secret, not prose.
_SYMBOL_PASSWORD_RE = re.compile(
    r"(?=[^!#$%^&*@+=~]*[!#$%^&*@+=~])(?=[^A-Za-z]*[A-Za-z]{2})[A-Za-z0-9!#$%^&*@+=~_\-]{8,128}"
)


def _symbol_password(value: str) -> bool:
    """A chosen password with a symbol in it, for a value a password or secret name or cue vouches for."""
    return (
        _SYMBOL_PASSWORD_RE.fullmatch(value) is not None
        and not _is_placeholder(value)
        and not _fake_compound(re.sub(r"[!#$%^&*@+=~]", "-", value))
        and not _REFERENCE_RE.search(value)
        and not value.startswith(("$", "@", "%"))
    )


Strength = Literal["password", "password_env", "token", "token_env", "weak"]


def _mixed_case_random(value: str) -> bool:
    """`suqtdbQyseMaWE`: letters only, but cases switching mid-piece as no identifier does."""
    if len(value) < 12 or not value.isalpha() or not value.isascii() or _is_wordish(value):
        return False
    switches = sum(1 for a, b in itertools.pairwise(value) if a.isupper() != b.isupper())
    return switches >= 4 and shannon_entropy(value) >= 3.2


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
    if strength != "password_env" and _CODE_CHARS_RE.search(value) and (
        _CODE_EXPR_RE.search(value) or strength == "weak" or shannon_entropy(value) < 3.5
    ):
        return False  # Optional[str], parts['password'], (self.username: code, not a secret
    if strength == "password_env":
        # An explicit PASSWORD-named variable: trust the name, only drop placeholders.
        return not _fake_compound(value) or not _WORDLIKE_RE.fullmatch(value)
    if strength == "password":
        if value.isdigit():
            return True  # "密码是 88888888": digit-only passwords are common
        if _WORDLIKE_RE.fullmatch(value) or _IDENTIFIER_RE.fullmatch(value):
            # "password is required" vs "password is `sunshine`": a bare word is prose; letters no word is
            # made of (`jnjgyvun`) are a password
            if value.isalpha() and (value.islower() or value.isupper()) and not _is_wordish(value):
                return True
            return quoted and not _fake_compound(value)
        if _DATE_RE.fullmatch(value) or _VERSION_RE.fullmatch(value):
            return False
        if quoted and _fake_compound(value):
            return False
        return _char_classes(value) >= 2
    # token-ish strengths
    if _HEADER_NAME_RE.fullmatch(value):
        return False  # `X-Xet-Access-Token`: an HTTP header's name
    if strength != "weak" and value.isdigit():
        return 15 <= n <= 40 and len(set(value)) >= 6  # numeric ids and keys (Discord, Asana), not counts
    if _WORDLIKE_RE.fullmatch(value) and (_is_wordish(value) or _char_classes(value) < 2):
        return False
    if _DATE_RE.fullmatch(value) or _VERSION_RE.fullmatch(value):
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
    if not (_has_letter_and_digit(value) or (n >= 20 and _char_classes(value) >= 3) or _mixed_case_random(value)):
        return False
    if _is_wordish(value):
        return False
    threshold = 3.5 if strength == "weak" else (3.0 if n >= 16 else 2.6)
    return entropy >= threshold


def fingerprint(value: str, key: bytes) -> str:
    """8 hex chars of HMAC-SHA256(key, value): stable per key, reveals nothing of the value."""
    return hmac.new(key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:8]




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


