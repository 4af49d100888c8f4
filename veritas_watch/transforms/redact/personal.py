"""Secrets a person holds rather than a service issues: a wallet's seed phrase, an account's recovery
codes, a payment card's number and security code, a PIN.

None of them looks random to a key scanner (twelve dictionary words, a row of digits), so each is
told by what it is built from: a seed phrase by BIP-39's word lists and checksum (the reference
implementation's lists, `mnemonic`), a card number by its issuer prefix and Luhn check digit, codes
and PINs by the words people put before them.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from dataclasses import dataclass

from veritas_watch.transforms.redact.base import _CUE_SEP_ANY, _TARGET, Rule, _Hit, _is_wordish
from veritas_watch.transforms.redact.names import _service_before

# ---------------------------------------------------------------------------------------------
# Seed phrases (BIP-39)

# A run of at least twelve words, maybe numbered (`1. legal 2. winner`, `1) legal`), one a line or
# comma-separated; Japanese phrases are joined by an ideographic space, Chinese ones are characters apart.
# A run is matched whole from its first word (possessive, never from inside a run: prose is read once);
# the extractor finds the list words in it.
# (a letter, or a combining mark: wallets show their phrase decomposed, NFKD, as BIP-39 says)
_SEED_WORD = r"(?:[^\W\d_]|[\u0300-\u036f\u3099\u309a])++"
_GAP_CHAR = r"[\s,，、;|•·*\-]"
_SEED_GAP = r"(?:" + _GAP_CHAR + r"|\d{1,2}[.):）])++"
_SEED_RUN_RE = (
    r"(?<![^\W\d_])(?<![^\W\d_]" + _GAP_CHAR + r")(?<![^\W\d_], )(?:\d{1,2}[.):）]\s*)?"
    + _SEED_WORD + r"(?:" + _SEED_GAP + _SEED_WORD + r"){11,}"
)
_WORD_RE = re.compile(_SEED_WORD)
# Words that say a phrase is a wallet's: without one, only a phrase whose checksum holds counts
_SEED_CUE_RE = re.compile(
    r"(?i)(?:seed|mnemonic|recovery|secret|backup|wallet)(?:[ \t]+(?:recovery|backup|seed))?[ \t]+"
    r"(?:phrase|words|sentence)|seed|mnemonic|wallet|passphrase|助记词|助記詞|恢复短语|恢復短語|钱包|錢包|ニーモニック|シード|復元フレーズ|"
    r"リカバリーフレーズ|ウォレット|시드|니모닉|복구[ \t]*구문|지갑"
)
_SEED_LENGTHS = (12, 15, 18, 21, 24)  # BIP-39's phrase lengths
_MAX_RUN = 48  # list words in a row beyond which a run is a word list, not a phrase with words beside it


def _nfkd(word: str) -> str:
    return unicodedata.normalize("NFKD", word.lower())


@dataclass(frozen=True, slots=True)
class _Wordlist:
    index: dict[str, int]  # word (NFKD) -> its 11 bits
    delimiter: str


@functools.cache
def _seed_wordlists() -> tuple[dict[str, int], tuple[_Wordlist, ...]]:
    """{word: a bit per language whose list holds it} and each language's list, loaded at the first run of
    twelve words (~0.1 s, a few MB). The lists are the reference implementation's (`mnemonic`); its own
    check is not used: it compares decomposed words with its Russian and Turkish lists, which are composed."""
    from mnemonic import Mnemonic

    lists = []
    languages: dict[str, int] = {}
    for bit, language in enumerate(sorted(Mnemonic.list_languages())):
        reference = Mnemonic(language)
        index = {_nfkd(word): i for i, word in enumerate(reference.wordlist)}
        lists.append(_Wordlist(index, reference.delimiter))
        for word in index:
            languages[word] = languages.get(word, 0) | 1 << bit
    return languages, tuple(lists)


def _checksum_holds(wordlist: _Wordlist, words: list[str]) -> bool:
    """BIP-39: each word gives 11 bits; the last len/3 bits are the first bits of SHA-256 of the rest."""
    bits = 0
    for word in words:
        bits = bits << 11 | wordlist.index[word]
    checksum = len(words) // 3
    entropy = (bits >> checksum).to_bytes(len(words) * 4 // 3, "big")
    return hashlib.sha256(entropy).digest()[0] >> (8 - checksum) == bits & ((1 << checksum) - 1)


def _in_list_order(wordlist: _Wordlist, words: list[str]) -> bool:
    """An excerpt of the list itself (`about above across …`), which a drawn phrase is once in 12!."""
    indexes = [wordlist.index[word] for word in words]
    return indexes == sorted(indexes)


def _extract_seed_phrase(rule: Rule, m: re.Match[str], text: str) -> list[_Hit]:
    known, wordlists = _seed_wordlists()
    words: list[tuple[int, int, str]] = []
    masks: list[int] = []
    longest = streak = 0
    for w in _WORD_RE.finditer(text, m.start(), m.end()):
        key = w.group().lower() if w.group().isascii() else _nfkd(w.group())  # (NFKD leaves ASCII as it is)
        mask = known.get(key, 0)
        words.append((w.start(), w.end(), key))
        masks.append(mask)
        streak = streak + 1 if mask else 0
        longest = max(longest, streak)
    if longest < 12:
        return []  # prose: no twelve words in a row from the lists
    hits: list[_Hit] = []
    for bit, wordlist in enumerate(wordlists):
        flag = 1 << bit
        if sum(1 for mask in masks if mask & flag) < 12:
            continue  # prose: most runs hold fewer than twelve words of any one list
        run: list[tuple[int, int, str]] = []
        for word, mask in zip([*words, (0, 0, "")], [*masks, 0], strict=True):  # a sentinel ends the last run
            if mask & flag:
                run.append(word)
                continue
            if len(run) >= 12:
                hits.extend(_seed_hits(wordlist, run, text))
            run = []
    # BIP-39's published test phrases (`abandon abandon … about`, `zoo zoo … wrong`) are examples, not wallets
    return [hit for hit in hits if len(set((hit.value or "").split())) > 3]


def _seed_hits(wordlist: _Wordlist, run: list[tuple[int, int, str]], text: str) -> list[_Hit]:
    """A run of one list's words: all of it when a wallet word comes shortly before it; else each stretch of a
    BIP-39 length whose checksum holds. Twelve list words in a row are rare outside a phrase (none in the 97,000
    paragraphs of chat, code and docs bench/redact.py reads), and 1 stretch in 16 passes a checksum by chance.
    The value kept is the phrase in BIP-39's own form (NFKD, lower case, the list's delimiter)."""
    # the cue may hold list words itself (`seed phrase`, `wallet`): looked for up to the run's fourth word,
    # and the words it takes are not the phrase's
    cues = list(_SEED_CUE_RE.finditer(text, max(0, run[0][0] - 120), run[min(3, len(run) - 1)][1]))
    if cues:
        run = [w for w in run if w[0] >= cues[-1].end()]
        cued = len(run) >= 12
    else:
        cued = False
    words = [w for _, _, w in run]
    if cued:
        return [_Hit(run[0][0], run[-1][1], value=wordlist.delimiter.join(words))]
    # list words beside the phrase (`… path` then `keep it safe`, `AGE-SECRET-KEY-…`) or a second phrase after it
    # lengthen the run: of the stretches of a phrase's length whose checksum holds, the set that covers the
    # most words (a stretch passing by chance across two phrases covers fewer than the two). A run of more
    # than 48 words is a word list, not a phrase with words beside it.
    if len(run) > _MAX_RUN:
        return []
    valid = {(start, length) for length in _SEED_LENGTHS for start in range(len(run) - length + 1)
             if _checksum_holds(wordlist, words[start : start + length])
             and not _in_list_order(wordlist, words[start : start + length])}
    best: list[tuple[int, list[tuple[int, int]]]] = [(0, [])] * (len(run) + 1)  # from word i on: covered, picks
    for i in range(len(run) - 1, -1, -1):
        best[i] = best[i + 1]
        for length in _SEED_LENGTHS:
            if (i, length) in valid and length + best[i + length][0] > best[i][0]:
                best[i] = (length + best[i + length][0], [(i, length), *best[i + length][1]])
    return [_Hit(run[i][0], run[i + length - 1][1], value=wordlist.delimiter.join(words[i : i + length]))
            for i, length in best[0][1]]


# ---------------------------------------------------------------------------------------------
# Recovery codes: `GitHub recovery codes:` then `3f9a2-b81c4 …`, `backup codes 1234 5678, …`

_RECOVERY_CUE_RE = (
    r"(?i)(?P<cue>(?<![A-Za-z0-9_\-])(?:recovery|backup|back-up|2fa|two[- ]factor|2-step|two-step|mfa|scratch|"
    r"emergency|rescue|single[- ]use|one[- ]time[- ]use)[ \t]+(?:verification[ \t]+|login[ \t]+)?codes?|"
    r"recovery[ \t]+key|恢复码|恢复代码|备用码|备份码|救援码|復原碼|備用碼|還原碼|リカバリーコード|バックアップコード|"
    r"予備コード|復旧コード|복구[ \t]*코드|백업[ \t]*코드)(?![A-Za-z0-9_\-])" + _TARGET + r"[\"']?"
    r"(?:" + _CUE_SEP_ANY + r"|[ \t]*\r?\n|[ \t]+(?=[A-Za-z0-9]*\d))"
)
_CODE_RE = re.compile(
    r"(?:[ \t]*\r?\n){0,2}[ \t]*(?:[-*•]|\d{1,2}[.)])?[ \t]*[`\"']?"
    r"(?P<code>[A-Za-z0-9]{3,12}(?:-[A-Za-z0-9]{3,12}){0,7})(?![\w\-])[`\"']?"
    r"[ \t]*[,;，、]?[ \t]*(?:\r?\n)?"
)
_LETTER_RUN_RE = re.compile(r"[A-Za-z]{4,}")
_DATE_OR_TIME_RE = re.compile(r"(?:19|20)\d\d|\d{1,2}(?:am|pm)|\d+(?:st|nd|rd|th|s|h|m|min|k|mb|gb)", re.IGNORECASE)


def _code_shaped(code: str, first: bool) -> bool:
    """A generated code: digits in it, no word in it (`1Password`, `page4`), and, first in the list, no year or
    count standing as one (`in 2024`, `10min`)."""
    if not any(c.isdigit() for c in code) or sum(c.isalnum() for c in code) < 4:
        return False
    if first and _DATE_OR_TIME_RE.fullmatch(code):
        return False
    return not any(_is_wordish(run.lower()) for run in _LETTER_RUN_RE.findall(code))


def _extract_recovery_codes(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    """The list of codes right after the cue, as one secret (one marker, one index row)."""
    pos, first, last = m.end(), -1, -1
    for _ in range(64):  # GitHub gives 16, Google 10; a list longer than that is no list of codes
        code = _CODE_RE.match(text, pos)
        if code is None or not _code_shaped(code.group("code"), first < 0):
            break
        first = code.start("code") if first < 0 else first
        last = code.end("code")
        pos = code.end()
    if first < 0 or last - first < 6:
        return None
    return _Hit(first, last, service=_service_before(text, m.start("cue")))


# ---------------------------------------------------------------------------------------------
# Payment cards

_CARD_RE = (
    r"(?<![A-Za-z0-9_.\-/:+#$€£¥,])(?:\d{4}(?P<sep>[ \-])\d{4}(?P=sep)\d{4}(?P=sep)\d{4}(?:(?P=sep)\d{1,3})?"
    r"|\d{4}(?P<sep15>[ \-])\d{6}(?P=sep15)\d{4,5}|\d{13,19})(?![A-Za-z0-9_\-/]|[.,][0-9])"
)
# Issuer prefixes and lengths (ISO/IEC 7812 ranges as the networks publish them)
_BRANDS: tuple[tuple[str, tuple[tuple[int, int], ...], tuple[int, ...]], ...] = (
    ("Visa", ((4, 4),), (13, 16, 19)),
    ("Mastercard", ((51, 55), (2221, 2720)), (16,)),
    ("American Express", ((34, 34), (37, 37)), (15,)),
    ("Discover", ((6011, 6011), (644, 649), (65, 65)), (16, 17, 18, 19)),
    ("JCB", ((3528, 3589),), (16, 17, 18, 19)),
    ("UnionPay", ((62, 62),), (16, 17, 18, 19)),
    ("Diners Club", ((300, 305), (36, 36), (38, 39)), (14, 15, 16, 17, 18, 19)),
    ("Mir", ((2200, 2204),), (16, 17, 18, 19)),
    ("Maestro", ((5018, 5018), (5020, 5020), (5038, 5038), (5893, 5893), (6304, 6304), (6759, 6759),
                 (6761, 6763)), (12, 13, 14, 15, 16, 17, 18, 19)),
)
_CARD_CUE_RE = re.compile(
    r"(?i)\b(?:card|visa|master ?card|amex|american express|discover|jcb|unionpay|maestro|diners|credit|debit|"
    r"cc#?)\b|卡号|卡號|信用卡|银行卡|銀行卡|借记卡|储蓄卡|银联|カード|クレジット|카드"
)
# Test numbers the payment providers publish (Stripe, Braintree, Adyen, PayPal): examples, not secrets
_TEST_CARDS = frozenset({
    "4242424242424242", "4000056655665556", "5555555555554444", "2223003122003222", "5200828282828210",
    "5105105105105100", "378282246310005", "371449635398431", "6011111111111117", "6011000990139424",
    "3056930009020004", "36227206271667", "3566002020360505", "6200000000000005", "4111111111111111",
    "4012888888881881", "4222222222222", "5454545454545454", "4000000000000002", "4000000000009995",
    "4000000000000077", "4000000000000093", "378734493671000", "6011601160116611", "3530111333300000",
    "30569309025904", "38520000023237", "5019717010103742", "4917610000000000003",
})


def luhn_valid(digits: str) -> bool:
    """The Luhn check digit every payment card number ends with (ISO/IEC 7812)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def card_brand(digits: str) -> str | None:
    """The network whose issuer prefix and length the number has, if any."""
    for brand, ranges, lengths in _BRANDS:
        if len(digits) in lengths and any(lo <= int(digits[: len(str(lo))]) <= hi for lo, hi in ranges):
            return brand
    return None


def _extract_card(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    """A number with a card network's prefix and length and a valid check digit, grouped as cards are
    printed (`4539 1488 0343 6467`) or named as a card nearby: an order or user id rarely has both."""
    digits = re.sub(r"\D", "", m.group())
    brand = card_brand(digits)
    if brand is None or not luhn_valid(digits) or digits in _TEST_CARDS or len(set(digits)) <= 3:
        return None
    grouped = m.group("sep") is not None or m.group("sep15") is not None
    line_start = text.rfind("\n", 0, m.start()) + 1
    near = text[max(line_start, m.start() - 60) : m.start()] + " " + text[m.end() : m.end() + 30].split("\n")[0]
    if not grouped and not _CARD_CUE_RE.search(near):
        return None
    return _Hit(m.start(), m.end(), service=brand)


# ---------------------------------------------------------------------------------------------
# Card security codes and PINs: a few digits, told by the word before them

_CVV_RE = (
    r"(?i)(?P<cue>(?<![A-Za-z0-9_\-])(?:cvv2?|cvc2?|csc|(?:card[ \t]+)?security[ \t]+code)|安全码|安全碼|"
    r"セキュリティコード|보안[ \t]*코드)(?![A-Za-z0-9_\-])" + _TARGET + r"(?:" + _CUE_SEP_ANY + r"|[ \t]+(?=[0-9]))"
)
_PIN_RE = (
    r"(?P<cue>(?<![A-Za-z0-9_\-])(?:PIN(?:[ \t\-]?(?:[Cc]ode|[Nn]umber))?|[Pp]in[ \t\-]?(?:code|number)|"
    r"[Pp]in(?=[ \t]*(?:[:：=]|is\b|was\b)))(?![A-Za-z0-9_\-])|PIN[码碼号]|暗証番号)" + _TARGET
    + r"(?:" + _CUE_SEP_ANY + r"|[ \t]+(?=[0-9]))"
)
_DIGITS_RE = re.compile(r"[`\"'“‘「『(]?(?P<digits>[0-9]{3,8})(?![A-Za-z0-9_\-/]|[:.,][0-9])")


def _digits_after(m: re.Match[str], text: str, sizes: tuple[int, int]) -> _Hit | None:
    found = _DIGITS_RE.match(text, m.end())
    if found is None or not sizes[0] <= len(found.group("digits")) <= sizes[1]:
        return None
    return _Hit(*found.span("digits"))


def _extract_cvv(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    return _digits_after(m, text, (3, 4))


def _extract_pin(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    return _digits_after(m, text, (4, 8))


PERSONAL_RULES: tuple[Rule, ...] = (
    Rule(name="seed_phrase", service="Crypto wallet", key_name="SEED_PHRASE", kind="provider",
         pattern=re.compile(_SEED_RUN_RE), keywords=(), extract=_extract_seed_phrase),
    # (a shared format: the hit names the network)
    Rule(name="payment_card", service="Payment card", key_name="CARD_NUMBER", kind="provider",
         pattern=re.compile(_CARD_RE), keywords=(), extract=_extract_card, shared_format=True),
    Rule(name="recovery_codes", service="Unknown", key_name="RECOVERY_CODES", kind="cue",
         pattern=re.compile(_RECOVERY_CUE_RE),
         keywords=("code", "recovery", "码", "碼", "コード", "코드"), extract=_extract_recovery_codes),
    Rule(name="card_security_code", service="Payment card", key_name="CARD_CVV", kind="cue",
         pattern=re.compile(_CVV_RE),
         keywords=("cvv", "cvc", "csc", "security code", "安全码", "安全碼", "セキュリティコード", "보안"),
         extract=_extract_cvv),
    Rule(name="pin_code", service="Unknown", key_name="PIN", kind="cue", pattern=re.compile(_PIN_RE),
         keywords=("pin", "暗証番号"), extract=_extract_pin),
)
