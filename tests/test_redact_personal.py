"""Secrets a person holds: wallet seed phrases, recovery codes, card numbers and security codes, PINs.

Each is found where people write it and left alone where the same shape is no secret (prose made of
dictionary words, order numbers, test cards, a PIN-less "pin").
"""

from __future__ import annotations

import random
import unicodedata

import pytest
from mnemonic import Mnemonic

from veritas_watch.transforms.redact import detect, redact_with_matches
from veritas_watch.transforms.redact.personal import card_brand, luhn_valid

KEY = b"test-fingerprint-key-0123456789ab"


def phrase(language: str, seed: int, strength: int = 128) -> str:
    rng = random.Random(seed)
    return str(Mnemonic(language).to_mnemonic(bytes(rng.randrange(256) for _ in range(strength // 8))))


def found(text: str) -> list[tuple[str, str]]:
    return [(m.rule, text[m.start : m.end]) for m in detect(text)]


def redacted(text: str) -> str:
    return redact_with_matches(text, KEY)[0].text


# ---------------------------------------------------------------------------------------------
# Seed phrases


@pytest.mark.parametrize("language", sorted(Mnemonic.list_languages()))
def test_a_seed_phrase_in_every_bip39_language_is_found_whole(language: str) -> None:
    words = phrase(language, seed=7)
    text = f"here it is {words} ok"
    matches = detect(text)
    assert [m.rule for m in matches] == ["seed_phrase"], (language, found(text))
    assert text[matches[0].start : matches[0].end] == words
    # the vault keeps BIP-39's own form: decomposed, in the list's delimiter
    delimiter = Mnemonic(language).delimiter
    assert matches[0].value == delimiter.join(unicodedata.normalize("NFKD", w) for w in words.split(delimiter))
    assert matches[0].service == "Crypto wallet"


def test_a_24_word_phrase_typed_in_composed_unicode_and_capitalised_is_found() -> None:
    words = phrase("spanish", seed=3, strength=256)
    typed = unicodedata.normalize("NFC", words).capitalize()
    text = f"Mi frase: {typed}."
    matches = detect(text)
    assert [m.rule for m in matches] == ["seed_phrase"]
    assert text[matches[0].start : matches[0].end] == typed
    assert matches[0].value == words


@pytest.mark.parametrize("layout", ["numbered", "lines", "commas"])
def test_a_phrase_laid_out_as_a_wallet_shows_it_is_found(layout: str) -> None:
    words = phrase("english", seed=11).split()
    if layout == "numbered":
        body = " ".join(f"{i}. {w}" for i, w in enumerate(words, 1))
    elif layout == "lines":
        body = "\n".join(f"{i}) {w}" for i, w in enumerate(words, 1))
    else:
        body = ", ".join(words)
    text = f"backup of my keys:\n{body}\nkeep it safe"
    out = redacted(text)
    assert "[REDACTED:seed_phrase:" in out
    assert not any(f" {w}" in out or f"){w}" in out for w in words[1:]), out


def test_a_cue_takes_a_phrase_whose_checksum_does_not_hold_and_none_without_it() -> None:
    words = phrase("english", seed=5).split()
    last = next(w for w in ("zoo", "abandon", "ability") if not Mnemonic("english").check(" ".join([*words[:-1], w])))
    broken = " ".join([*words[:-1], last])
    assert found(f"my seed phrase is {broken}") == [("seed_phrase", broken)]
    assert found(f"助记词：{broken}") == [("seed_phrase", broken)]
    assert found(f"ok {broken} ok") == []  # twelve list words and no wallet word: the checksum decides


def test_a_phrase_between_other_list_words_is_found_by_its_checksum() -> None:
    """Found by test_planted_secrets_never_leak: an age key after the phrase, `AGE-SECRET-KEY-…`, adds three list
    words (`age`, `secret`, `key`) to the run."""
    words = phrase("english", seed=13, strength=256)
    for text in (f"{words} AGE-SECRET-KEY-1C6ZSLEN7KDGJGXSFNXY47XKM5D7USRQ9EQL405YVW0FU995LXNJ84DJU9C",
                 f"oh and also about that: {words} later today", f"ok ok，{words} "):
        assert [value for rule, value in found(text) if rule == "seed_phrase"] == [words], found(text)


def test_two_phrases_in_a_row_are_two_phrases() -> None:
    """Found by test_planted_secrets_never_leak: 24 list words from two phrases, where a 15-word stretch across
    both passed its checksum by chance and, taken first, left the ends of both phrases in the text."""
    first = "ripple chicken seminar outer day erode material capable net vehicle reunion position"
    second = "collect enroll enforce juice chef frame urge nuclear inmate help plug route"
    assert [value for _, value in found(f"{first} {second} ")] == [first, second]


def test_a_cue_word_that_is_a_list_word_is_not_part_of_the_phrase() -> None:
    words = phrase("english", seed=9)
    text = f"seed phrase {words}"
    assert found(text) == [("seed_phrase", words)]  # `seed` and `phrase` are BIP-39 words too


def test_prose_of_list_words_and_published_test_phrases_are_left_alone() -> None:
    prose = ("about above across action actor actress actual adapt add addict address adjust admit adult "
             "advance advice")
    assert not Mnemonic("english").check(" ".join(prose.split()[:12]))
    assert found(f"word list: {prose}") == []
    for example in ("abandon " * 11 + "about", "zoo " * 11 + "wrong", "legal winner thank year wave sausage "
                    "worth useful legal winner thank yellow"):
        assert Mnemonic("english").check(example.strip())
    assert found("seed: " + "abandon " * 11 + "about") == []
    assert found("zoo " * 11 + "wrong") == []
    # a Chinese sentence of common characters is no phrase: they are not written apart
    assert found("我们今天在公园里看到了很多人和他们的孩子一起玩，这是一个很好的周末。" * 2) == []


# ---------------------------------------------------------------------------------------------
# Payment cards and security codes


def test_luhn_and_brands() -> None:
    assert luhn_valid("4539148803436467") and not luhn_valid("4539148803436468")
    assert card_brand("4539148803436467") == "Visa"
    assert card_brand("5425233430109903") == "Mastercard"
    assert card_brand("2223000048410010") == "Mastercard"
    assert card_brand("374245455400126") == "American Express"
    assert card_brand("6011000991300009") == "Discover"
    assert card_brand("1234567812345670") is None


@pytest.mark.parametrize("text,number,brand", [
    ("my card number is 4539 1488 0343 6467 exp 09/27", "4539 1488 0343 6467", "Visa"),
    ("charge 5425-2334-3010-9903 please", "5425-2334-3010-9903", "Mastercard"),
    ("amex 3742 454554 00126", "3742 454554 00126", "American Express"),
    ("card: 4539148803436467", "4539148803436467", "Visa"),
    ("信用卡号 4539148803436467，下个月到期", "4539148803436467", "Visa"),
    ("カード番号は4539148803436467です", "4539148803436467", "Visa"),
    ("4539148803436467 is my debit", "4539148803436467", "Visa"),
])
def test_a_card_number_is_found(text: str, number: str, brand: str) -> None:
    matches = [m for m in detect(text) if m.rule == "payment_card"]
    assert [(text[m.start : m.end], m.service) for m in matches] == [(number, brand)]


@pytest.mark.parametrize("text", [
    "order 4539148803436467 shipped",  # no card word, not grouped
    "my card number is 4539 1488 0343 6468",  # check digit wrong
    "use card 4242 4242 4242 4242 for tests",  # Stripe's published test card
    "card 4111 1111 1111 1111 works in the sandbox",
    "call me at +86 138 0013 8000",
    "timestamp 1733240000000 on card events",  # a 13-digit epoch: no network starts with 1
    "tracking 9400 1000 0000 0000 0000 00",
    "the card costs 4539.14 dollars",
])
def test_numbers_that_are_no_card_are_left_alone(text: str) -> None:
    assert [r for r, _ in found(text) if r == "payment_card"] == []


@pytest.mark.parametrize("text,code", [
    ("card 4539 1488 0343 6467 cvv 123", "123"),
    ("CVC: 4321", "4321"),
    ("the security code is 987", "987"),
    ("安全码：123", "123"),
])
def test_a_card_security_code_is_found(text: str, code: str) -> None:
    assert ("card_security_code", code) in found(text)


def test_what_is_no_security_code_is_left_alone() -> None:
    assert [r for r, _ in found("the cvv field is required; security code is 12") if r == "card_security_code"] == []


# ---------------------------------------------------------------------------------------------
# PINs


@pytest.mark.parametrize("text,pin", [
    ("the PIN for my bank card is 4821", "4821"),
    ("PIN: 4821", "4821"),
    ("my pin code is 482193", "482193"),
    ("PIN码是 4821", "4821"),
    ("暗証番号は4821です", "4821"),
    ("phone pin is 0000", "0000"),
    ("SIM PIN 1357", "1357"),
])
def test_a_pin_is_found(text: str, pin: str) -> None:
    assert [value for _, value in found(text)] == [pin], found(text)


@pytest.mark.parametrize("text", [
    "the pin is 19",  # too short for a PIN
    "pin the message 4821 to the channel",
    "shopping list: 4 apples",
    "spinning 1500 rpm",
    "PIN: 4821-99-12",  # a reference, not digits alone
])
def test_what_is_no_pin_is_left_alone(text: str) -> None:
    assert found(text) == []


# ---------------------------------------------------------------------------------------------
# Recovery codes


def test_github_recovery_codes_are_one_secret_named_by_their_service() -> None:
    rng = random.Random(1)
    codes = [f"{rng.randrange(16**5):05x}-{rng.randrange(16**5):05x}" for _ in range(16)]
    text = "GitHub recovery codes:\n" + "\n".join(codes) + "\n\nkeep them somewhere safe"
    matches = detect(text)
    assert [(m.rule, m.service) for m in matches] == [("recovery_codes", "GitHub")]
    assert text[matches[0].start : matches[0].end] == "\n".join(codes)


@pytest.mark.parametrize("text,codes", [
    ("my Google backup codes are 8492 0173, 1928 3746, 5647 3829", "8492 0173, 1928 3746, 5647 3829"),
    ("The 2FA backup codes are 8492-0173, 1928-3746", "8492-0173, 1928-3746"),
    ("备用码：84920173 19283746", "84920173 19283746"),
    ("recovery key: 1A2B-3C4D-5E6F-7G8H-9J0K-1L2M-3N4P", "1A2B-3C4D-5E6F-7G8H-9J0K-1L2M-3N4P"),
    ("- 1. 3f9a2-b81c4\n", None),  # no cue: left alone
])
def test_recovery_codes_after_their_cue_are_found(text: str, codes: str | None) -> None:
    got = [value for rule, value in found(text) if rule == "recovery_codes"]
    assert got == ([codes] if codes else [])


@pytest.mark.parametrize("text", [
    "I saved my recovery codes in 1Password",
    "backup codes: 10 left",
    "recovery codes are 2fa related, see page 4",
    "generate new backup codes in 2024 settings",
])
def test_talk_about_recovery_codes_is_left_alone(text: str) -> None:
    assert [r for r, _ in found(text) if r == "recovery_codes"] == []


def test_the_redacted_text_holds_no_part_of_any_of_them() -> None:
    words = phrase("english", seed=21)
    text = (f"wallet: {words}\ncard 4539 1488 0343 6467 cvv 321, PIN 8642\n"
            "GitHub recovery codes: 3f9a2-b81c4 77d0e-1a2b3")
    out, matches = redact_with_matches(text, KEY)
    assert {m.rule for m in matches} == {"seed_phrase", "payment_card", "card_security_code", "pin_code",
                                         "recovery_codes"}
    for secret in [*words.split(), "4539", "6467", "321", "8642", "3f9a2", "1a2b3"]:
        assert secret not in out.text.replace("[REDACTED:", " ").split(), (secret, out.text)
