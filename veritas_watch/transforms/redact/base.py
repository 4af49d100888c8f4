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


# One match is one secret at most, except where a match is a whole structure of them (a table's rows): a list.
Extractor = Callable[["Rule", re.Match[str], str], "_Hit | list[_Hit] | None"]


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
# The commonest shape of a password a person chose: a word, digits, then a mark or two (`Marlboro4736@`, `dragon9053!`)
_CHOSEN_PASSWORD_RE = re.compile(r"[A-Za-z]{4,}\d{2,}[!@#$%^&*?~+=]{1,3}")
_IDENT_PATH_RE = re.compile(r"[A-Za-z_$][\w$]*(?:(?:\.|::|->|\?\.)[A-Za-z_$][\w$]*)+(?:\(\)|\[\d+\])?")
_CALL_RE = re.compile(r"[A-Za-z_$][\w$.]*\(")
# `$password`, `@Value("…")`, `%APPDATA%`, `$this->pw`, `@scope/pkg`: a name after a sigil, then nothing or
# code. A generated password may start with the same sigil (`@qyR6j6$Ul#!AT%_T6…`, `@D9#yM9+U*…`).
_NAME_THEN_CODE = r"[A-Za-z_][\w.]*(?:$|[\[({:/%}\-\\>,;\s\"'])"
_VARIABLE_RE = re.compile(r"(?:\$\$|[$@%])\{?" + _NAME_THEN_CODE)  # (`$$name`: Make's and Compose's escaped `$`)
_REFERENCE_RE = re.compile(
    r"\$\{|\$\(|\{\{|\}\}|%\(|%[sd]\b|^\$\$?[A-Za-z_]\w*$|^<[^>]*>?$|^\[[^\]]*\]?$|^\{[^}]*\}?$|"
    r"^%[A-Za-z_]\w*%$|^@" + _NAME_THEN_CODE + r"|^process\.env|^os\.environ|^env\(|^getenv"
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
# A placeholder's words among the short pieces of a value (`replace-me`, `tp-your-key`); not `key`, `api`,
# `secret`: real formats have them as pieces, `tskey-api-…`, `sk-proj-…`
_PLACEHOLDER_PIECES = frozenset(
    """
    me replace real not here your yours example sample dummy fake placeholder changeme foo bar baz invalid redacted
    """.split()  # noqa: SIM905 - a word list reads better as text
)
# and for a key (not a password: `dev_admin` is one): a local server's stand-in (`vllm-local`, `demo-key-1`)
_STAND_IN_KEY_PIECES = _PLACEHOLDER_PIECES | {"local", "dev", "demo", "test", "testing", "temp", "tmp"}


_CODE_CHARS_RE = re.compile(r"[\"'`()\[\]{}<>\\,]|\s")
# What makes a value with brackets code rather than a password: a quote or a space inside (one lone
# apostrophe is a character of a generated secret: `EAyw:F@vU'i~z@GJ`), a call or subscript as the whole
# value (`Optional[str]`, `getenv("X")`, `cfg['password']`), a leading bracket.
_CODE_EXPR_RE = re.compile(
    r"[\s\"`\\,]|'.*'|^[\[({<]|[\w.$]\((?:[^()]*)\)$|^[A-Za-z_$][\w.$]*[\[(]|[\[(]$|\w<\w[\w, ]*>|=>|->|::|\$\{|"
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


# A cue's separator and its optional target, shared by the cue rules (`rules`) and the personal ones
# (`personal`): "password is", "密钥是", "key:", "令牌记下来：" (a few CJK words may sit between cue and colon;
# Japanese `パスワードは X です` has the topic particle as the separator, and kana may sit before the colon).
# `_CUE_SEP` names the separator proper (`sep`) for the extractors that read it; `_CUE_SEP_ANY` is the same
# pattern unnamed. Either ends with the spaces and the one line break that may follow.
_CUE_SEP_WORDS = (
    r"(?:[\u3040-\u30ff\u4e00-\u9fff]{1,6}?)?"
    r"(?:\s+(?:is|was|are|would\s+be|will\s+be|should\s+be|set\s+to|changed\s+to|to)\b\s*[:：]?|"
    r"\s*(?:是|为|為|は)\s*[:：]?|\s*(?:\*\*?|__?)?[:：=＝](?:(?:\*\*?|__?)(?=\s))?|\s*=>|\s*->|[ \t]+-[ \t]|'s\b)"
)
_CUE_SEP_SPACE = r"[ \t\u3000]*(?:\r?\n[ \t]*)?"
_CUE_SEP = "(?P<sep>" + _CUE_SEP_WORDS + ")" + _CUE_SEP_SPACE
_CUE_SEP_ANY = "(?:" + _CUE_SEP_WORDS + ")" + _CUE_SEP_SPACE
# "password for the NAS is": what the secret is for
_TARGET = r"(?:\s+(?:for|of|to|on)\s+(?P<target>[^\n:=,;。，：]{1,40}?))?"

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
        or (_PATH_RE.fullmatch(value) and not _random_pieces_path(value))
        or "://" in value
    )


def _random_pieces_path(value: str) -> bool:
    """`/QGTddWw2rAgLaiGch-KbEYpi8…`: base64 that happens to start with or hold a `/`, not a path. A path
    names directories and files: some piece of it is a word, or it is short."""
    pieces = [p for p in re.split(r"[/\\]", value) if p]
    longest = max(pieces, key=len, default="")
    return (
        len(longest) >= 20
        and not any(_is_wordish(p) or _DOTTED_FILE_RE.fullmatch(p) for p in pieces)
        and _has_letter_and_digit(longest)
        and shannon_entropy(longest) >= 4.0
    )


_DOTTED_FILE_RE = re.compile(r"[\w\-]*\.[A-Za-z][A-Za-z0-9]{0,4}")  # `notes.txt`, `.bashrc`: a file's name


_ENV_NAME_RE = re.compile(r"[A-Z]{1,12}[0-9]{0,2}(?:_[A-Z]{1,12}[0-9]{0,2})+")
_SLUG_PIECE_RE = re.compile(r"[-_./:]")


def _placeholder_slug(value: str, *, key: bool = False) -> bool:
    """`replace-me`, `example-anthropic-key-not-real`, for a `key` also `vllm-local`: short pieces, one of them
    a placeholder's word, and no long random run (`sk_test_4eC39HqLyjWDarjtT1zdp7dc` has one: a key)."""
    pieces = [p for p in _SLUG_PIECE_RE.split(value.lower()) if p]
    words = _STAND_IN_KEY_PIECES if key else _PLACEHOLDER_PIECES
    return len(pieces) >= 2 and max(map(len, pieces)) < 12 and any(p in words for p in pieces)


def _fake_compound(value: str) -> bool:
    parts = [p for p in re.split(r"[-_.\s]+", value.lower()) if p]
    return bool(parts) and all(p in _FAKE_PARTS or p.isdigit() for p in parts)


# A password built of words or letters joined by symbols (`development#product`, `Prestigitariu$`,
# `mycoin!1`, `` `123QWERasdf ``): given under a password or secret name, a symbol inside makes it a chosen
# secret, not prose.
_SYMBOL_PASSWORD_RE = re.compile(
    r"(?=[^!#$%^&*@+=~`]*[!#$%^&*@+=~`])(?=[^A-Za-z]*[A-Za-z]{2})[A-Za-z0-9!#$%^&*@+=~`_\-]{8,128}"
)


def _symbol_password(value: str) -> bool:
    """A chosen password with a symbol in it, for a value a password or secret name or cue vouches for."""
    return (
        _SYMBOL_PASSWORD_RE.fullmatch(value) is not None
        and not _is_placeholder(value)
        and not _fake_compound(re.sub(r"[!#$%^&*@+=~`]", "-", value))
        and not _backtick_markup(value)
        and not _REFERENCE_RE.search(value)
        and not _VARIABLE_RE.match(value)
        and not _name_and_separator(value)
        and not _word_setting(value)
    )


def _name_and_separator(value: str) -> bool:
    """`Authorization:=`, `Content-Type:`, `=Authorization`, `required=`: a name and a separator, no value."""
    stem = value.strip(":=")
    return stem != value and bool(_is_wordish(stem) or _HEADER_NAME_RE.fullmatch(stem))


def _backtick_markup(value: str) -> bool:
    """A backtick at the edge is markup or a stray quote unless what it wraps is no name or word:
    `` `hunter2` `` and `` `Authorization `` are text, `` `123QWERasdf `` is a password."""
    core = value.strip("`")
    return core != value and (value[0] == value[-1] == "`" or _IDENTIFIER_RE.fullmatch(core) is not None)


_PROTOCOL_WORDS = frozenset({"http", "https", "tcp", "udp", "tls", "ssl", "ftp", "sftp", "ssh", "ws", "wss", "grpc"})


def _word_setting(value: str) -> bool:
    """`ok=Authorization`, `mode:Basic`, `required=Authorization`, `=DefaultEndpointsProtocol=https` (a connection
    string's first field after `key 是`): a name set to a word or a protocol, not a password with a symbol in it."""
    # (after a separator typed twice or an opening quote, `=Name=`, `` `Name= ``, the name is letters only:
    # `=z91on5-n_q8…=aaj` is a key)
    setting = re.fullmatch(r"(?:[A-Za-z_][\w.\-]*|[=:`'\"]+[A-Za-z_.]+)[=:]+([A-Za-z][A-Za-z\-]*)", value)
    return setting is not None and bool(
        _is_wordish(setting.group(1)) or _HEADER_NAME_RE.fullmatch(setting.group(1))
        or setting.group(1).lower() in _PROTOCOL_WORDS
    )


# What a regular expression, a format string or a template is written with: such a value under a
# secret's name is code (`TOKEN_RE = "[A-Za-z0-9]{32}"`), not a random string someone generated.
_PATTERN_SYNTAX_RE = re.compile(
    r"\\[dwsbDWSBpPnrtux]|\[\^?[^\]]{0,20}?(?:[a-z]-[a-z]|[A-Z]-[A-Z]|0-9)|\.[*+?]|\(\?|\{\d+(?:,\d*)?\}|\[\^|%\(\w+\)|"
    r"\$\{|\{\{|\}\}|\$\(|=>|->|::|^[\[({<]|[\w.$]\([^()]*\)$|^[A-Za-z_$][\w.$]*(?:\[[^\]]*\]|\([^)]*\))|"
    r"^[A-Za-z_$][\w.$]{2,}\(|[A-Za-z_]{2}\w*\.[A-Za-z_]{2}|\\0[0-7]{2}|##|"
    r"[A-Za-z0-9]+_[A-Za-z0-9]+_[A-Za-z0-9]+|\w<\w[\w, ]*>|</?[A-Za-z][\w\-]*>|[\"']/?>|[<>=!~]=\d"
)
_LETTER_RUN_RE = re.compile(r"[A-Za-z]{6,}")
_PRINTABLE_SYMBOLS = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _word_run(run: str) -> bool:
    """`handleLineWebhookEvents`, `IGNORECASE`, `Arrows`: a run of letters made of real-length words (a
    random run's pronounceable pieces are short: `QeazZe`)."""
    pieces = _PIECE_RE.findall(run)
    return (
        all(len(p) >= 3 for p in pieces) and sum(map(len, pieces)) / len(pieces) >= 4 and _is_wordish(run)
    )


def _random_printable(value: str, *, min_classes: int = 3) -> bool:
    """A generated secret drawn from all printable characters (`>M(rjkKtmbEAJrm}@$`, `K,FNvI(6sd0-fyDP`):
    for a value a secret's name or cue vouches for. Quotes and brackets are allowed inside; a value
    written in a pattern or template syntax, or with a call or subscript shape, is code."""
    n = len(value)
    if not 8 <= n <= 256 or not value.isascii() or any(c.isspace() or not c.isprintable() for c in value):
        return False
    symbols = sum(c in _PRINTABLE_SYMBOLS for c in value)
    letters = sum(c.isalpha() for c in value)
    if symbols < 1 or letters < 2 or symbols > n // 2 or _char_classes(value) < min_classes:
        return False
    if _PATTERN_SYNTAX_RE.search(value) or _REFERENCE_RE.search(value) or "://" in value:
        return False
    head = re.match(r"[A-Za-z_$][\w.$]{2,}(?=\[(?:[\w'\"$:\-\]]|$))", value)  # not `i_gr[/iK7`: no index
    if head and (_is_wordish(head.group()) or "_" in head.group()):
        return False  # `RaisesGroup[ExcT_1`, `config_map[key`: a subscript
    if any(_word_run(run) for run in _LETTER_RUN_RE.findall(value)) or any(
        len(p) >= 6 and _is_wordish(p) for p in _PIECE_RE.findall(value)
    ):
        return False  # `handleLineWebhookEvents>[1]`, `re.IGNORECASE)`: words, which generators do not make
    if value[0] == value[-1] and not value[0].isalnum():
        return False  # `|Screenshot-Jupyter1|`, `*Bold2*`: markup around a word
    if _PATH_RE.fullmatch(value) or _IDENT_PATH_RE.fullmatch(value) or _is_placeholder(value):
        return False
    if "..." in value or "…" in value or _VARIABLE_RE.match(value):
        return False
    if _fake_compound(re.sub(r"[^A-Za-z0-9]+", "-", value)):
        return False
    if _IDENT_PATH_RE.fullmatch(value.lstrip("!~-&*+")) or _IDENTIFIER_RE.fullmatch(value.lstrip("!~-&*+")):
        return False  # `!surface.channelEnabled`, `-defaultValue`: an expression
    marks = sum(c in _PRINTABLE_SYMBOLS and c not in "._-" for c in value)
    # a random printable string mixes in symbols; one lone mark is how names are written, unless digits
    # or (for a value a name vouches for) letters switching case as no name does come with it (`qaKLal)Idi`)
    random_case = min_classes < 4 and _case_switches(value) >= 2
    if marks < 2 and not (marks and (any(c.isdigit() for c in value) or random_case)):
        return False
    if _ascending_run(value, 6):
        return False  # `abcdef...xyz0123!@#`: an alphabet written out
    # a short draw repeats a character or two by chance (`i_gr[/iK7`): the bar follows log2(n), the most
    # n characters can score
    return shannon_entropy(value) >= min(3.0 if n < 12 else 3.3, math.log2(n) - 0.35)


def _case_switches(value: str) -> int:
    """Case changes inside runs of letters after their first (`qaKLal` 2, `WUQb` 1, `userName` 1,
    `HTTPServer` 1): random letters switch often, words and names at a word's start."""
    switches = 0
    for run in re.findall(r"[A-Za-z]{2,}", value):
        switches += sum(1 for a, b in itertools.pairwise(run[1:]) if a.isupper() != b.isupper())
    return switches


def _ascending_run(value: str, length: int) -> bool:
    """`abcdefgh`, `ABCDEFGH`, `01234567`: an alphabet written out, not a random string."""
    run = 1
    for a, b in itertools.pairwise(value):
        run = run + 1 if ord(b) == ord(a) + 1 and a.isalnum() else 1
        if run >= length:
            return True
    return False


# A word that names the secret rather than being one: `password_input`, `SOME_PASSWORD`, `secretName`.
_NAMING_PIECE_RE = re.compile(
    r"(?i)pass(?:word|wd)?|secret|token|key|pwd|credential|user(?:name)?|login|auth(?:orization)?|bearer|basic"
)


def _chosen_word_password(value: str) -> bool:
    """A word-built password given under an explicit password or secret name, quoted in code or as a
    setting (`password = "centipede"`, `"password": "open_sesame"`, `GENERIC_SECRET=logmein`):
    the name vouches for it; placeholders, names of things, code and paths are still left alone."""
    if not 6 <= len(value) <= 128 or any(c.isspace() for c in value) or not value.isascii():
        return False
    if _is_placeholder(value) or _looks_like_code_or_path(value) or _CODE_CHARS_RE.search(value):
        return False
    if _fake_compound(value) or _NAMING_PIECE_RE.search(value) or _HEADER_NAME_RE.fullmatch(value.rstrip(":=")):
        return False
    if _placeholder_slug(value):
        return False  # `replace-me`
    if _DATE_RE.fullmatch(value) or _VERSION_RE.fullmatch(value) or _UUID_RE.fullmatch(value):
        return False
    if value.startswith(("$", "@", "%", "-", ".", "=", ":")) or value.endswith((".", ":", "-", "=")):
        return False  # `Authorization:=`, `=Authorization`: a name being assigned, or the separator
    if value.isupper() and "_" in value:
        return False  # `SOME_CONSTANT`: a constant's name
    return not value.isdigit() or len(value) >= 6


Strength = Literal["password", "password_env", "token", "token_env", "weak"]


def _mixed_case_random(value: str) -> bool:
    """`suqtdbQyseMaWE`: letters only, but cases switching mid-piece as no identifier does."""
    if len(value) < 12 or not value.isalpha() or not value.isascii() or _is_wordish(value):
        return False
    switches = sum(1 for a, b in itertools.pairwise(value) if a.isupper() != b.isupper())
    return switches >= 4 and shannon_entropy(value) >= 3.2


_B64_PADDED_RE = re.compile(r"[A-Za-z0-9+/]{10,}={1,2}")


def _mixed_case_letters(value: str) -> bool:
    """Letters (maybe joined by `-_.`) with the case switching inside a piece, none of it a word."""
    letters = value.replace("-", "").replace("_", "").replace(".", "")
    if not letters.isalpha() or not letters.isascii() or _is_wordish(value):
        return False
    if len(_PIECE_RE.findall(value)) > 1 and all(re.fullmatch(r"[A-Z]?[a-z]{2,}", p) for p in _PIECE_RE.findall(value)):
        return False  # `SecretStr`, `userName`: camel or Pascal case words, an identifier
    pieces = [p for p in re.split(r"[-_.]", value) if p]
    switches = sum(
        1 for p in pieces for a, b in itertools.pairwise(p[1:]) if a.isupper() != b.isupper()
    )
    return switches >= 2 or (value[0].isupper() and value[1:].islower() and not _is_wordish(value[1:]) and
                              _CONSONANT_RUN_RE.search(value.lower()) is not None)


_CJK_PUNCT_RE = re.compile(r"[\u3000-\u303f\uff00-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]")


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
    if _CJK_PUNCT_RE.match(value) or _CJK_PUNCT_RE.match(value[-1]):
        return False  # `password:，password`: Chinese punctuation and a word, no value
    if _name_and_separator(value) or _word_setting(value):
        return False
    if value.startswith("//") or "://" in value:
        return False  # a URL or what follows its scheme (URL credentials have their own rule)
    if strength != "password_env" and _CODE_CHARS_RE.search(value) and (
        _CODE_EXPR_RE.search(value) or strength == "weak" or shannon_entropy(value) < 3.5
    ):
        return False  # Optional[str], parts['password'], (self.username: code, not a secret
    if strength == "password_env":
        # An explicit PASSWORD-named variable: trust the name, only drop placeholders.
        return not _fake_compound(value) or not _WORDLIKE_RE.fullmatch(value)
    if strength == "password":
        if _ENV_NAME_RE.fullmatch(value):
            return False  # `password: OPENCLAW_GATEWAY_PASSWORD`: the setting that holds it
        if value.isdigit():
            return True  # "密码是 88888888": digit-only passwords are common
        if _WORDLIKE_RE.fullmatch(value) or _IDENTIFIER_RE.fullmatch(value):
            # "password is required" vs "password is `sunshine`": a bare word is prose; letters no word is
            # made of (`jnjgyvun`) are a password
            if value.isalpha() and (value.islower() or value.isupper()) and not _is_wordish(value):
                return True
            if n >= 7 and _mixed_case_letters(value):
                return True  # `Zxcvbnm`, `QH-TyTEdz`: letters in no word's shape, cases mixed mid-piece
            return quoted and not _fake_compound(value) and not _placeholder_slug(value)
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
    if _fake_compound(value) or _placeholder_slug(value, key=True):
        return False  # `llmman-local`, `tp-your-key`
    if _ENV_NAME_RE.fullmatch(value) or value.startswith("file:"):
        return False  # `BWS_SERVER_URL`: another setting's name; a file reference
    min_len = {"token_env": 8, "token": 8, "weak": 20}[strength]
    if n < min_len:
        return False
    if strength == "weak" and (_UUID_RE.search(value) or value.count(":") >= 2):
        return False  # session keys and ids ("agent:main:tui-<uuid>"), not credentials
    entropy = shannon_entropy(value)
    if strength == "token_env":
        return entropy >= 2.5 and not (_is_wordish(value) and not _has_letter_and_digit(value))
    if not (
        _has_letter_and_digit(value)
        or (n >= 20 and _char_classes(value) >= 3)
        or _mixed_case_random(value)
        or (_B64_PADDED_RE.fullmatch(value) and n % 4 == 0 and not value.islower() and not value.isupper())
    ):
        return False
    if strength != "weak" and _CHOSEN_PASSWORD_RE.fullmatch(value):
        return True  # a person's password under a key's name (`apikey = Marlboro4736@`): wordish, yet a secret
    if _is_wordish(value):
        return False
    # a random hex string draws on 16 symbols, so it scores lower than base62 of the same length
    # (`3fea6af1349166ea`: 2.9)
    hexish = all(c in "0123456789abcdefABCDEF" for c in value)
    threshold = 3.5 if strength == "weak" else (3.0 if n >= 16 and not hexish else 2.6)
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


