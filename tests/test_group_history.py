"""Group chats: the members' messages quoted in `Chat history since last reply` blocks become memories.

Pure functions only (`denoise.history_messages`, `pipeline.transform_records`); the real daemon over
the real transcripts is in test_group_history_daemon.py.
"""

from __future__ import annotations

import json
import time
import typing
from pathlib import Path

import pytest

from tests.fixture_paths import shared_dir
from veritas_watch.model import Block, ParsedLine, RawRecord, SessionState, Skip, SourceRef, with_context
from veritas_watch.pipeline import Transformed, member_point_key, transform_records
from veritas_watch.transforms.denoise import MAX_HISTORY_MESSAGES, clean_message, history_messages
from veritas_watch.transforms.parse import parse_line

KEY = b"k" * 32
_SHARED = shared_dir()
SESSIONS = _SHARED / "fixtures" / "openclaw" / "zapabob-main" / "sessions" if _SHARED else None
needs_fixtures = pytest.mark.skipif(SESSIONS is None, reason="../shared fixtures not available")

OLD_LABEL = "Chat history since last reply (untrusted, for context):"
NEW_LABEL = "Chat history since last reply: ⟦openclaw:ctx⟧"
CONVERSATION_INFO = (
    'Conversation info (untrusted metadata):\n```json\n{\n  "message_id": "605058797211484557",\n'
    '  "sender_id": "Uf8fca2a943370a203b6a555346789e7e",\n  "is_group_chat": true,\n  "history_count": 2\n}\n```\n\n'
)


def user(text: str, **fields: typing.Any) -> ParsedLine:
    return ParsedLine(line_type="message", entry_id="u", role="user", blocks=(Block("text", text),), **fields)


def fenced(label: str, items: object, *, indent: int | None = 2) -> str:
    """A history block the way OpenClaw writes it: label, ```json, JSON.stringify(items, null, 2), ```."""
    return f"{label}\n```json\n{json.dumps(items, ensure_ascii=False, indent=indent)}\n```"


def item(sender: object, ms: object, body: object) -> dict[str, object]:
    return {"sender": sender, "timestamp_ms": ms, "body": body}


TWO = [item("user:Ualice", 1773431741343, "the ferry leaves at seven"),
       item("user:Ubob", 1773431756944, "and returns at nine")]


def event(entry_id: str, text: str, *, role: str = "user", ts: str = "2026-03-14T07:47:25.983Z") -> bytes:
    message = {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1773474445975}
    return json.dumps({"type": "message", "id": entry_id, "parentId": None, "timestamp": ts,
                       "message": message}, ensure_ascii=False).encode()


def records(*lines: bytes, kind: typing.Literal["jsonl", "sqlite"] = "jsonl", start: int = 1) -> list[RawRecord]:
    if kind == "jsonl":
        return [RawRecord("main", data, SourceRef("jsonl", "/s/g.jsonl", start + i, 0)) for i, data in enumerate(lines)]
    return [RawRecord("main", data, SourceRef("sqlite", "/a/openclaw-agent.sqlite", session_id="g", seq=start + i))
            for i, data in enumerate(lines)]


def run(recs: list[RawRecord], state: SessionState | None = None) -> Transformed:
    return transform_records(recs, state or SessionState("group-session"), fallback_session="g", redact_key=KEY,
                             max_line_bytes=4 << 20, chunk_chars=1500, chunk_overlap=200)


def members(out: Transformed) -> list[dict[str, object]]:
    return [c.payload() for c in out.chunks if "speaker" in c.payload()]


# ---- the block, both forms ----------------------------------------------------------------------------


def test_old_form_each_message_with_speaker_and_own_time() -> None:
    line = user(CONVERSATION_INFO + fenced(OLD_LABEL, TWO) + "\n\nWhen does it return?")
    found = history_messages(line)
    assert [(m.speaker, m.timestamp, m.text) for m in found] == [
        ("user:Ualice", "2026-03-13T19:55:41.343Z", "the ferry leaves at seven"),
        ("user:Ubob", "2026-03-13T19:55:56.944Z", "and returns at nine"),
    ]
    assert clean_message(line) == ("user", "When does it return?")  # the block is still stripped


def test_marker_form_fenced_compact_json() -> None:
    line = user(f"{NEW_LABEL}\n```json\n{json.dumps(TWO)}\n```\n\nWhen does it return?")
    assert [m.text for m in history_messages(line)] == ["the ferry leaves at seven", "and returns at nine"]
    assert clean_message(line) == ("user", "When does it return?")
    with_envelope = user(f"[Wed 2026-09-09 23:19 GMT+8] {NEW_LABEL}\n```json\n{json.dumps(TWO)}\n```\n\nok?")
    assert len(history_messages(with_envelope)) == 2


def test_marker_form_one_line_per_message() -> None:
    block = "\n".join([
        NEW_LABEL,
        "#1 Alice: hi",
        "#m2 2026-03-14 16:47:05 GMT+9 Bob: the ferry leaves at seven [image/jpeg media://inbound/x.jpg]",
        "#m3 2026-08-30 17:48:06 UTC [reply target] ->#m2 {\"id\":\"3036\",\"name\":\"Eric\"}: @Vast what is it",
        "2026-09-24 15:59:56 EDT Carol: see you",
        "unknown sender: [image/png media://inbound/y.png]",
        "no separator on this line",
    ])
    line = user(block + "\n\nWhat did Bob say?")
    found = history_messages(line)
    assert [(m.speaker, m.timestamp, m.text) for m in found] == [
        ("Alice", None, "hi"),
        ("Bob", "2026-03-14T07:47:05.000Z", "the ferry leaves at seven [image]"),
        ('{"id":"3036","name":"Eric"}', "2026-08-30T17:48:06.000Z", "@Vast what is it"),
        ("Carol", None, "see you"),  # a zone abbreviation: no time of its own (the caller falls back)
    ]
    assert clean_message(line) == ("user", "What did Bob say?")
    # The existing stripping expectation is unchanged.
    assert clean_message(user(f"{NEW_LABEL}\n#1 Alice: hi\n#2 Bob: yo\n\nWhat did Bob say?")) == (
        "user", "What did Bob say?")


def test_member_bodies_are_cleaned_like_user_messages() -> None:
    items = [
        item("user:U1", 1, "[Sat 2026-03-14 16:47 GMT+9] hello there"),
        item("user:U1", 2, "look [message_id: 42]"),
        item("user:U2", 3, "<media:image>"),  # nothing but a placeholder: not memory
        item("user:U2", 4, "`\u200b``python\nprint(1)\n`\u200b``"),  # OpenClaw's neutralised fences, restored
        item("user:U3", 5, "   "),
        item("user:U3", 6, ""),
        item("user:U4", 7, f"{OLD_LABEL}\n```json\n[{{\"body\": \"nested\"}}]\n```\n\nouter words"),
    ]
    texts = [m.text for m in history_messages(user(fenced(OLD_LABEL, items)))]
    assert texts == ["hello there", "look", "```python\nprint(1)\n```", "outer words"]


def test_blocks_the_cleaner_does_not_strip_are_not_history() -> None:
    block = fenced(OLD_LABEL, TWO)
    for text in (
        f"<<<EXTERNAL_UNTRUSTED_CONTENT id=\"1\">>>\n{block}\n<<<END_EXTERNAL_UNTRUSTED_CONTENT id=\"1\">>>\nhi",
        f"<active_memory_plugin>\n{block}\n</active_memory_plugin>\nhi",
        f"<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\n{block}\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>\nhi",
        f"hi\n\nContext: ⟦openclaw:ctx⟧\n{block}",
        f"Please explain this label: {OLD_LABEL}",  # mid-line: not a label
    ):
        assert history_messages(user(text)) == [], text
    assert history_messages(user(block, display=False)) == []
    assert history_messages(user(block, provenance_kind="inter_session")) == []
    assistant = ParsedLine(line_type="message", role="assistant", blocks=(Block("text", block),))
    assert history_messages(assistant) == []


def test_several_blocks_in_queued_messages() -> None:
    first = CONVERSATION_INFO + fenced(OLD_LABEL, TWO[:1]) + "\n\n<media:image>"
    second = CONVERSATION_INFO + fenced(OLD_LABEL, TWO) + "\n\n<media:image>"
    text = f"[Queued messages while agent was busy]\n\n---\nQueued #1\n{first}\n\n---\nQueued #2\n{second}"
    line = user(text)
    assert [m.text for m in history_messages(line)] == [
        "the ferry leaves at seven", "the ferry leaves at seven", "and returns at nine"]
    assert isinstance(clean_message(line), Skip)


# ---- hostile input ------------------------------------------------------------------------------------


def test_truncated_array_keeps_the_complete_items() -> None:
    text = json.dumps([*TWO, item("user:U3", 3, "cut off mid-sentence")], indent=2)
    cut = text[: text.index("mid-sentence")]
    for body in (f"```json\n{cut}\n```", f"```json\n{cut}"):  # closed fence, and a fence that never closes
        found = history_messages(user(f"{OLD_LABEL}\n{body}"))
        assert [m.text for m in found] == ["the ferry leaves at seven", "and returns at nine"]
    for broken in ("[", "[,,,", "[{", "]", "not json at all", '{"body": "an object, not an array"}', ""):
        assert history_messages(user(f"{OLD_LABEL}\n```json\n{broken}\n```\n\nhi")) == [], broken


def test_wrong_types_and_missing_fields() -> None:
    items: list[object] = [
        item("user:U1", 1773431741343, 42),
        item("user:U1", 1773431741343, ["a", "list"]),
        item("user:U1", 1773431741343, {"text": "an object"}),
        item("user:U1", 1773431741343, None),
        item("user:U1", 1773431741343, True),
        "a bare string",
        17,
        None,
        ["nested", ["junk"]],
        {"sender": "user:U1"},  # no body
        {"body": "no sender, no time"},
        item(12345, "1773431741343", "numeric sender, time as a string"),
        item(True, True, "bool sender and time"),
        item({"name": "Dana", "id": "U9"}, float("nan"), "sender object, NaN time"),
        item(["a", "list"], 10**30, "list sender, far-future time"),
        item("user:U1", -1, "before the epoch"),
        item("user:U1", 1773431741343.5, "fractional ms"),
        item("x" * 5000, 1, "long sender"),
        item("user:U1", 2, "nul\x00 byte and a lone \ud800 surrogate"),
    ]
    found = history_messages(user(fenced(OLD_LABEL, items)))
    assert [(m.speaker, m.timestamp, m.text) for m in found][:7] == [
        (None, None, "no sender, no time"),
        ("12345", None, "numeric sender, time as a string"),
        (None, None, "bool sender and time"),
        ("Dana", None, "sender object, NaN time"),
        (None, None, "list sender, far-future time"),
        ("user:U1", "1969-12-31T23:59:59.999Z", "before the epoch"),
        ("user:U1", "2026-03-13T19:55:41.343Z", "fractional ms"),
    ]
    long_sender, surrogate = found[7], found[8]
    assert long_sender.speaker == "x" * 200 and long_sender.sender_key == "x" * 5000
    assert surrogate.text == "nul byte and a lone \ufffd surrogate"
    surrogate.text.encode("utf-8")  # storable


def test_deep_nesting_does_not_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert history_messages(user(f"{OLD_LABEL}\n```json\n{deep}\n```\n\nhi")) == []
    deep_item = "[" + json.dumps(TWO[0]) + ", " + "[" * 100_000
    assert [m.text for m in history_messages(user(f"{OLD_LABEL}\n```json\n{deep_item}\n```"))] == [
        "the ferry leaves at seven"]
    deep_body = '[{"sender": "u", "timestamp_ms": 1, "body": ' + "[" * 50_000 + "]" * 50_000 + "}]"
    assert history_messages(user(f"{OLD_LABEL}\n```json\n{deep_body}\n```")) == []


def test_huge_arrays_are_bounded_newest_kept() -> None:
    items = [item(f"user:U{i % 7}", 1773431741343 + i, f"message number {i}") for i in range(20_000)]
    started = time.perf_counter()
    found = history_messages(user(fenced(OLD_LABEL, items, indent=None)))
    assert time.perf_counter() - started < 10
    assert len(found) == MAX_HISTORY_MESSAGES
    assert found[0].text == f"message number {20_000 - MAX_HISTORY_MESSAGES}"
    assert found[-1].text == "message number 19999"
    many_lines = NEW_LABEL + "\n" + "\n".join(f"#{i} U{i}: line {i}" for i in range(5000))
    assert len(history_messages(user(many_lines))) == MAX_HISTORY_MESSAGES


def test_hostile_line_form() -> None:
    lines = [NEW_LABEL, ": no sender", "x" * 100_000 + ": a sender too long to be one", "#" * 300 + " A: b",
             "Alice:no space after the colon", "Alice: " + "y" * 10_000, "2026-13-45 99:99 UTC Bob: bad date"]
    found = history_messages(user("\n".join(lines)))
    assert [(m.speaker, m.text[:5]) for m in found] == [("#" * 200, "b"), ("Alice", "yyyyy"), ("Bob", "bad d")]
    assert found[2].timestamp is None and found[2].stamp == "2026-13-45 99:99 UTC"


# ---- into entries: ids, payload, redaction, both sources ----------------------------------------------


def test_members_become_entries_before_the_carrier_and_carry_its_location() -> None:
    carrier = event("c1", CONVERSATION_INFO + fenced(OLD_LABEL, TWO) + "\n\nWhen does it return?")
    out = run(records(event("q0", "Anyone going to the island?"), carrier))
    payloads = [c.payload() for c in out.chunks]
    assert [(p["data"], p.get("speaker"), p["entry_id"], p["role"]) for p in payloads] == [
        ("Anyone going to the island?", None, "q0", "user"),
        ("the ferry leaves at seven", "user:Ualice", "c1", "user"),
        ("and returns at nine", "user:Ubob", "c1", "user"),
        ("When does it return?", None, "c1", "user"),
    ]
    assert "speaker" not in payloads[0] and "speaker" not in payloads[3]  # other payloads unchanged
    assert payloads[1]["timestamp"] == "2026-03-13T19:55:41.343Z" and payloads[1]["ts"] == 1773431741.343
    assert payloads[1]["source"] == payloads[3]["source"] == "/s/g.jsonl:2"
    assert len({c.point_id for c in out.chunks}) == 4
    # The dense vector of a member is read with the turn before it, as for every turn.
    assert out.chunks[1].context == "Anyone going to the island?"
    assert out.chunks[3].context == "and returns at nine"


def test_a_repeated_block_is_the_same_points() -> None:
    first = event("c1", fenced(OLD_LABEL, TWO[:1]) + "\n\n<media:image>")
    again = event("c2", fenced(OLD_LABEL, TWO) + "\n\n<media:image>", ts="2026-03-14T08:00:00.000Z")
    together = run(records(first, again))
    assert [(p["data"], p["entry_id"]) for p in members(together)] == [
        ("the ferry leaves at seven", "c2"), ("and returns at nine", "c2")]  # once, the last carrier's
    apart_first, apart_again = run(records(first)), run(records(again, start=2))
    ids_together = {c.point_id for c in together.chunks}
    assert {c.point_id for c in apart_first.chunks} < ids_together
    assert {c.point_id for c in apart_again.chunks} == ids_together
    # Not from the carrier: another carrier id, line or source kind gives the same ids ...
    other = run(records(event("zz", fenced(OLD_LABEL, TWO)), kind="sqlite", start=40))
    assert {c.point_id for c in other.chunks} == ids_together
    # ... but another session, sender, time or body is another message.
    assert not {c.point_id for c in run(records(again), SessionState("other-session")).chunks} & ids_together
    for changed in (item("user:Ucarol", 1773431741343, "the ferry leaves at seven"),
                    item("user:Ualice", 1773431741344, "the ferry leaves at seven"),
                    item("user:Ualice", 1773431741343, "the ferry leaves at eight")):
        assert not {c.point_id for c in run(records(event("c3", fenced(OLD_LABEL, [changed])))).chunks} & ids_together


def test_members_are_redacted_like_any_message() -> None:
    secret = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" * 2
    items = [item("user:Ualice", 1773431741343, f"the deploy key is {secret}")]
    out = run(records(event("c1", fenced(OLD_LABEL, items) + "\n\nthanks")))
    (member,) = members(out)
    assert secret not in str(member["data"]) and "[REDACTED:" in str(member["data"])
    assert all(secret not in c.point_id and secret not in with_context(c.text, c.context) for c in out.chunks)
    assert [(f.finding.rule, f.location.render()) for f in out.found] == [("openai_project_key", "/s/g.jsonl:1")]
    assert out.found[0].seen_at == "2026-03-13T19:55:41.343Z"
    # The id hashes the redacted body (the secret's keyed fingerprint), never the secret: with another
    # install key the same secret gives another id, while a message without one keeps its id.
    line = user(fenced(OLD_LABEL, [*items, TWO[0]]))
    with_secret, plain = history_messages(line)
    assert member_point_key(with_secret, KEY) != member_point_key(with_secret, b"o" * 32)
    assert member_point_key(plain, KEY) == member_point_key(plain, b"o" * 32)


def test_jsonl_and_sqlite_sources_give_the_same_memories() -> None:
    lines = [event("c1", CONVERSATION_INFO + fenced(OLD_LABEL, TWO) + "\n\nWhen does it return?"),
             event("a1", "At nine.", role="assistant")]
    from_jsonl, from_sqlite = run(records(*lines)), run(records(*lines, kind="sqlite"))

    def identity(out: Transformed) -> list[tuple[object, ...]]:
        where = ("source", "position", "session_order")
        return [(c.point_id, c.text, c.context, {k: v for k, v in c.payload().items() if k not in where})
                for c in out.chunks]

    assert identity(from_jsonl) == identity(from_sqlite)
    assert len(members(from_sqlite)) == 2


def test_a_cron_session_quotes_nothing() -> None:
    out = run(records(event("c0", "[cron:job-1 nightly] go"), event("c1", fenced(OLD_LABEL, TWO))))
    assert out.chunks == [] and out.skipped["cron_session"] == 2


# ---- the real transcripts -----------------------------------------------------------------------------


def fixture_history_bodies(sessions: Path) -> dict[tuple[str, str, int], str]:
    """Every member message in the fixtures, read straight from the JSON (not through the code under test)."""
    found: dict[tuple[str, str, int], str] = {}
    for path in sorted(sessions.iterdir()):
        for raw in path.read_text(encoding="utf-8").splitlines():
            obj = json.loads(raw)
            content = obj.get("message", {}).get("content") if obj.get("type") == "message" else None
            for block in content if isinstance(content, list) else []:
                parts = str(block.get("text", "")).split(OLD_LABEL + "\n```json\n")
                for part in parts[1:]:
                    for entry in json.loads(part.split("\n```")[0]):
                        found[(path.name, entry["sender"], entry["timestamp_ms"])] = entry["body"]
    return found


@needs_fixtures
def test_the_real_group_chat_fixture() -> None:
    assert SESSIONS is not None
    expected = fixture_history_bodies(SESSIONS)
    assert len(expected) == 33
    stored: list[dict[str, object]] = []
    carriers = 0
    for path in sorted(SESSIONS.iterdir()):
        recs = [RawRecord("main", data, SourceRef("jsonl", str(path), n))
                for n, data in enumerate(path.read_bytes().splitlines(), 1)]
        out = run(recs, SessionState(None))
        stored.extend(c.payload() for c in out.chunks)
        lines = [parse_line(r.data) for r in recs]
        carriers += sum(1 for line in lines if isinstance(line, ParsedLine) and history_messages(line))
    assert carriers == 7
    quoted = [p for p in stored if "speaker" in p]
    assert len(quoted) == 33
    by_key = {(p["speaker"], p["ts"]): p["data"] for p in quoted}
    for (_, sender, ms), body in expected.items():
        assert " ".join(str(by_key[(sender, ms / 1000)]).split()) == " ".join(body.split())
    assert all(p["role"] == "user" for p in quoted)
    texts = [" ".join(str(p["data"]).split()) for p in stored]
    for body in expected.values():
        assert texts.count(" ".join(body.split())) == 1, body
    assert {p["session_id"] for p in quoted} == {"b7383b91-a40c-4397-87f0-9c8de05ac0d4",
                                                 "df18cf05-d86e-46b5-aa16-1c385f01dc8f"}
