"""What may name a credential: the Service and Key Name every writer shows (CREDENTIALS_INDEX.md, the
vault's clear metadata, log lines, `veritas-watch creds`) come from allow-listed shapes only, and never
hold a piece of a secret.

Allowed: a provider or service the rule table knows; a word or two of letters (`TokenMall`, `router`), a
host name, a plausible identifier (`OPENAI_API_KEY`, `--password`, `X-Auth-Token`, a user name such as
`deploy`), a cue word (`password`, `密码`, `api key`) and the `user@host` / `user (curl -u)` shapes built of
those. Refused: anything a rule would take for a key, a run of prompt words (`IGNORE_ALL_PREVIOUS_…_TOKEN`),
and any label holding 8 or more consecutive characters of a secret of the same message (case-insensitive).
A refused name falls back to the rule's own name from the table, a refused service to `Unknown`.

`safe_labels` is the one check: `engine.detect` applies it to every match (so every finding, and every
writer after it, holds only checked labels) and credential capture applies it again with a value it
recovered from behind an OpenClaw mask.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from veritas_watch.transforms.redact.base import _plausible, _random_printable
from veritas_watch.transforms.redact.extract import token_like
from veritas_watch.transforms.redact.names import _SERVICES, is_secret_name
from veritas_watch.transforms.redact.rules import _KEYWORDLESS_RULES, _RULES_OF_KEYWORD, RULES

UNKNOWN_SERVICE = "Unknown"  # the rule table's service for rules that name none
LEAK_RUN = 8  # this many consecutive characters of a secret in a label is a leak

_KNOWN_SERVICES = frozenset(_SERVICES.values()) | frozenset(r.service for r in RULES)
_RULE_KEY_NAMES = {r.name: r.key_name for r in RULES}
_TABLE_KEY_NAMES = frozenset(_RULE_KEY_NAMES.values())


def rule_key_name(rule: str) -> str:
    """The name the rule table gives a rule's credential (`password`, `STRIPE_SECRET_KEY`): always safe."""
    return _RULE_KEY_NAMES.get(rule, "unknown")
# Words of a prompt injection, not of a credential's name: more than one in a name makes it text, not a name.
_PROMPT_WORDS = frozenset(
    """
    ignore disregard forget previous prior instructions instruction print reveal output repeat override
    bypass pretend execute tell say show send the and then now please all above below you your me assistant
    """.split()  # noqa: SIM905 - a word list reads better as text
)
_WORD_RE = re.compile(r"[^\W\d_]+(?:['’.\-][^\W\d_]+)*")  # letters only (any script), joined by ' . -
_HOST_RE = re.compile(r"(?=.{3,80}$)[A-Za-z0-9](?:[A-Za-z0-9\-]{0,62}\.)+[A-Za-z]{2,24}|\[[0-9A-Fa-f:.]{2,45}\]")
_IDENT_RE = re.compile(r"-{0,2}[A-Za-z_$][A-Za-z0-9_.\-$]{0,63}")
_USER_RE = re.compile(r"[A-Za-z0-9._+\-]{1,32}")
_PIECE_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_MAX_PIECES = 6
_CJK_CUE_RE = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uff66-\uff9f]{1,8}")  # kana, ideographs, hangul
_AT_RE = re.compile(r"(?P<user>[^@\s]{1,64})@(?P<host>[^@\s]{1,80})")
_TOOL_RE = re.compile(r"(?P<user>\S{1,64}) \((?P<tool>curl -u)\)")


def leaks(label: str, secrets: Iterable[str]) -> bool:
    """True when `label` holds LEAK_RUN or more consecutive characters of any secret (case-insensitive)."""
    if len(label) < LEAK_RUN:
        return False
    low = label.lower()
    windows = {low[i : i + LEAK_RUN] for i in range(len(low) - LEAK_RUN + 1)}
    for secret in secrets:
        if len(secret) >= LEAK_RUN:
            text = secret.lower()
            if any(w in text for w in windows):
                return True
    return False


def key_like(word: str) -> bool:
    """Would the redactor take `word` alone for a key: a provider's format, or a random token."""
    if token_like(word):
        return True
    lowered = word.lower()
    woken = set(_KEYWORDLESS_RULES)
    for keyword, rules in _RULES_OF_KEYWORD.items():
        if keyword in lowered:
            woken.update(rules)
    return any(RULES[i].kind == "provider" and RULES[i].pattern.search(word) for i in woken)


def _prompt_like(pieces: list[str]) -> bool:
    return len(pieces) > _MAX_PIECES or sum(p.lower() in _PROMPT_WORDS for p in pieces) > 1


def _words_ok(text: str, *, max_words: int, prompt_words: int) -> bool:
    """A few words of letters, fewer than `prompt_words` of them prompt words."""
    words = text.split()
    return (0 < len(words) <= max_words and len(text) <= 40 and all(_WORD_RE.fullmatch(w) for w in words)
            and sum(w.lower() in _PROMPT_WORDS for w in words) < prompt_words
            and not any(_random_printable(w) for w in words))


def _identifier_ok(name: str) -> bool:
    if not _IDENT_RE.fullmatch(name):
        return False
    pieces = _PIECE_RE.findall(name)
    if not pieces or _prompt_like(pieces):
        return False
    # a secret's name may be long (`TF_VAR_cloudflare_api_token`); any other identifier stays short
    return (is_secret_name(name) or len(pieces) <= 3) and not key_like(name.lstrip("-"))


def _user_ok(user: str) -> bool:
    return user == "-" or (_USER_RE.fullmatch(user) is not None and not key_like(user) and _identifier_ok(user))


@functools.lru_cache(maxsize=4096)  # (names recur: the same few per agent; pure, so cached)
def service_ok(service: str) -> bool:
    """An allow-listed shape for a Service column (before the leak check)."""
    return (service in _KNOWN_SERVICES or _words_ok(service, max_words=3, prompt_words=1)
            or (_HOST_RE.fullmatch(service) is not None and not key_like(service.split(".")[0])))


@functools.lru_cache(maxsize=4096)
def key_name_ok(name: str) -> bool:
    """An allow-listed shape for a Key Name column (before the leak check)."""
    if name in _TABLE_KEY_NAMES or _CJK_CUE_RE.fullmatch(name):
        return True
    if m := _TOOL_RE.fullmatch(name):
        return _user_ok(m["user"])
    if m := _AT_RE.fullmatch(name):
        return _user_ok(m["user"]) and _HOST_RE.fullmatch(m["host"]) is not None
    return _identifier_ok(name) or _words_ok(name, max_words=4, prompt_words=2)


def safe_labels(service: str, key_name: str, secrets: Iterable[str], *, rule_key_name: str) -> tuple[str, str]:
    """(service, key name) as they may be written: each checked for its shape and against every secret of
    the message; a refused name becomes the rule's own (`rule_key_name`), a refused service `Unknown`."""
    values = tuple(secrets)
    if not service_ok(service) or leaks(service, values):
        service = UNKNOWN_SERVICE
    if not key_name_ok(key_name) or leaks(key_name, values):
        key_name = rule_key_name if not leaks(rule_key_name, values) else "unknown"
    return service, key_name


def written_before(service: str, key_name: str, *, rule_key_name: str = "unknown") -> tuple[str, str]:
    """Labels a version before these checks wrote (an index row, a row waiting in the data dir), whose secrets
    are not known any more: a label in no allowed shape that holds a word the redactor takes for a secret
    (`Sapphire-Kettle-4417`, `sk_live_… (curl -u)`) is replaced as `safe_labels` would; anything else stays as
    written (a person may have typed it)."""
    if not service_ok(service) and _secret_word_in(service):
        service = UNKNOWN_SERVICE
    if not key_name_ok(key_name) and _secret_word_in(key_name):
        key_name = rule_key_name
    return service, key_name


def _secret_word_in(label: str) -> bool:
    return any(key_like(w) or _password_like(w) for w in re.split(r"[\s@()]+", label) if len(w) >= LEAK_RUN)


def _password_like(word: str) -> bool:
    """Letters and digits mixed as a chosen password mixes them (`Sapphire-Kettle-4417`), in no name's shape."""
    return (any(c.isdigit() for c in word) and any(c.isalpha() for c in word) and _plausible(word, "password")
            and not is_secret_name(word))
