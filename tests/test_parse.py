"""parse_line: format v3 and v1, every field the denoiser needs, stable errors, never raises."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from fixture_paths import shared_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from veritas_watch.model import Block, ParsedLine, ParseError
from veritas_watch.transforms.parse import PARSE_ERROR_REASONS, parse_line


def _line(obj: object) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")


def _parsed(data: bytes) -> ParsedLine:
    result = parse_line(data)
    assert isinstance(result, ParsedLine), result
    return result


def _error(data: bytes, **kwargs: int) -> str:
    result = parse_line(data, **kwargs)
    assert isinstance(result, ParseError), result
    assert result.reason in PARSE_ERROR_REASONS
    return result.reason


# ---- shapes -----------------------------------------------------------------------------------------


def test_v3_header_gives_session_id_and_timestamp() -> None:
    line = _parsed(
        b'{"type":"session","version":3,"id":"042acb5f-7ac7-40a1-910f-3e76b908bc25",'
        b'"timestamp":"2026-03-16T22:08:54.585Z","cwd":"C:\\\\Users\\\\downl"}\n'
    )
    assert line.line_type == "session"
    assert line.session_id == "042acb5f-7ac7-40a1-910f-3e76b908bc25"
    assert line.timestamp == "2026-03-16T22:08:54.585Z"


def test_v3_assistant_message_keeps_every_field_the_denoiser_uses() -> None:
    line = _parsed(
        _line(
            {
                "type": "message",
                "id": "f112e0f9",
                "parentId": "29b1b7b8",
                "timestamp": "2026-03-16T22:35:32.116Z",
                "message": {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "plan the read"},
                        {"type": "text", "text": "Let me read HEARTBEAT.md first."},
                        {
                            "type": "toolCall",
                            "id": "call_1",
                            "name": "read",
                            "arguments": {"file_path": "C:/w/HEARTBEAT.md"},
                        },
                    ],
                    "stopReason": "toolUse",
                    "api": "ollama",
                    "provider": "ollama",
                    "model": "qwen3.5:9b",
                    "timestamp": 1773700532105,
                },
            }
        )
    )
    assert (line.line_type, line.entry_id, line.role) == ("message", "f112e0f9", "assistant")
    assert (line.provider, line.model, line.stop_reason) == ("ollama", "qwen3.5:9b", "toolUse")
    assert line.timestamp == "2026-03-16T22:35:32.116Z"  # the entry's ISO stamp wins over message.timestamp
    assert line.blocks == (
        Block("thinking", "plan the read"),
        Block("text", "Let me read HEARTBEAT.md first."),
        Block("toolCall", "read\nfile_path: C:/w/HEARTBEAT.md"),
    )
    assert line.display is True


def test_v1_pi_mono_lines_without_version_id_or_parent_parse() -> None:
    header = _parsed(
        b'{"type":"session","id":"ffae836b-9420-4060-ac13-7745215f90ff","timestamp":"2025-12-09T00:53:29.825Z",'
        b'"cwd":"/Users/badlogic/workspaces/pi-mono","provider":"anthropic","modelId":"claude-opus-4-5"}'
    )
    assert header.session_id == "ffae836b-9420-4060-ac13-7745215f90ff"
    message = _parsed(
        b'{"type":"message","timestamp":"2025-12-08T22:41:05.306Z","message":{"role":"user","content":'
        b'[{"type":"text","text":"alright, read @packages/coding-agent/src/main.ts in full."}],'
        b'"timestamp":1765233665292}}'
    )
    assert message.entry_id is None  # v1 has no ids: the caller derives one from the position
    assert message.role == "user"
    assert message.blocks == (Block("text", "alright, read @packages/coding-agent/src/main.ts in full."),)
    assert message.timestamp == "2025-12-08T22:41:05.306Z"


def test_string_content_is_one_text_block() -> None:
    line = _parsed(_line({"type": "message", "id": "a", "message": {"role": "user", "content": "hi there"}}))
    assert line.blocks == (Block("text", "hi there"),)


def test_tool_result_text_is_kept_as_tool_result_blocks_with_details() -> None:
    line = _parsed(
        _line(
            {
                "type": "message",
                "id": "r1",
                "message": {
                    "role": "toolResult",
                    "toolCallId": "c1",
                    "toolName": "exec",
                    "content": [{"type": "text", "text": "OPENAI_API_KEY=sk-test-not-a-real-key"}, {"type": "image"}],
                    "details": {"status": "completed", "exitCode": 0, "aggregated": "done"},
                    "isError": False,
                },
            }
        )
    )
    assert line.role == "toolResult"
    assert line.blocks[0] == Block("toolResult", "OPENAI_API_KEY=sk-test-not-a-real-key")
    assert line.blocks[1] == Block("image")
    assert line.blocks[2] == Block("details", "status: completed\nexitCode: 0\naggregated: done")


def test_image_blocks_keep_no_data_and_unknown_blocks_keep_their_type() -> None:
    line = _parsed(
        _line(
            {
                "type": "message",
                "id": "u1",
                "message": {
                    "role": "user",
                    "content": [
                        {"type": "image", "data": "iVBORw0KGgo" * 100, "mimeType": "image/png"},
                        {"type": "audio_note", "text": "transcript"},
                        {"no_type": True},
                        "bare string block",
                        42,
                    ],
                },
            }
        )
    )
    assert line.blocks == (
        Block("image"),
        Block("audio_note", "transcript"),
        Block("other"),
        Block("text", "bare string block"),
    )


def test_provenance_display_and_error_message() -> None:
    line = _parsed(
        _line(
            {
                "type": "message",
                "id": "p1",
                "message": {
                    "role": "user",
                    "content": "Read HEARTBEAT.md if it exists.",
                    "provenance": {"kind": "internal_system", "sourceTool": "heartbeat"},
                    "display": False,
                },
            }
        )
    )
    assert (line.provenance_kind, line.provenance_source, line.display) == ("internal_system", "heartbeat", False)
    failed = _parsed(
        _line(
            {
                "type": "message",
                "id": "e1",
                "message": {"role": "assistant", "content": [], "stopReason": "error", "errorMessage": "fetch failed"},
            }
        )
    )
    assert failed.blocks == (Block("error", "fetch failed"),)


def test_compaction_summary_and_unknown_line_types() -> None:
    compaction = _parsed(_line({"type": "compaction", "id": "c", "summary": "We fixed PATH.", "tokensBefore": 9}))
    assert compaction.line_type == "compaction"
    assert compaction.blocks == (Block("summary", "We fixed PATH."),)
    other = _parsed(_line({"type": "thinking_level_change", "id": "t", "thinkingLevel": "off"}))
    assert (other.line_type, other.entry_id, other.blocks) == ("thinking_level_change", "t", ())
    future = _parsed(_line({"type": "hologram", "payload": [1, 2, 3]}))
    assert future.line_type == "hologram"


# ---- timestamps -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry_stamp", "message_stamp", "expected"),
    [
        ("2026-03-16T22:08:54.585Z", None, "2026-03-16T22:08:54.585Z"),
        ("2026-03-17T07:08:54.585+09:00", None, "2026-03-16T22:08:54.585Z"),
        ("2026-03-16T22:08:54", None, "2026-03-16T22:08:54.000Z"),  # naive: UTC
        (None, 1773698934623, "2026-03-16T22:08:54.623Z"),  # epoch ms
        (None, 1773698934, "2026-03-16T22:08:54.000Z"),  # epoch seconds (< 1e11)
        ("not a date", 1773698934623, "2026-03-16T22:08:54.623Z"),  # invalid ISO: fall back
        (None, "2026-03-16T22:08:54.585Z", "2026-03-16T22:08:54.585Z"),
        (None, True, None),
        (None, 10**30, None),
        (None, None, None),
    ],
)
def test_timestamps_normalise_to_iso_utc_z(entry_stamp: object, message_stamp: object, expected: str | None) -> None:
    obj: dict[str, object] = {"type": "message", "id": "x", "message": {"role": "user", "content": "hi"}}
    if entry_stamp is not None:
        obj["timestamp"] = entry_stamp
    if message_stamp is not None:
        obj["message"] = {"role": "user", "content": "hi", "timestamp": message_stamp}
    assert _parsed(_line(obj)).timestamp == expected


def test_non_finite_epoch_is_dropped() -> None:
    line = _parsed(b'{"type":"message","id":"x","message":{"role":"user","content":"hi","timestamp":NaN}}')
    assert line.timestamp is None


# ---- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"", b"\n", b"  \r\n", b"\t"])
def test_empty_lines(data: bytes) -> None:
    assert _error(data) == "empty_line"


def test_line_too_long_is_checked_before_decoding() -> None:
    assert _error(b'{"type":"session"}', max_bytes=10) == "line_too_long"
    assert isinstance(parse_line(b'{"type":"session"}', max_bytes=18), ParsedLine)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"type":"message","message":{"role":"user","content":"\xff\xfe"}}', "invalid_utf8"),
        (b'{"type":"message","message":{"role":"user","content":"half', "invalid_json"),  # torn last line
        (b"[1, 2, 3]", "not_an_object"),
        (b'"a string"', "not_an_object"),
        (b"42", "not_an_object"),
        (b"null", "not_an_object"),
        (b'{"id":"no-type"}', "missing_type"),
        (b'{"type":7}', "wrong_field_type"),
        (b'{"type":"message","message":"text"}', "wrong_field_type"),
        (b'{"type":"message","message":{"role":5,"content":"x"}}', "wrong_field_type"),
        (b'{"type":"message","message":{"role":"user","content":{"text":"x"}}}', "wrong_field_type"),
    ],
)
def test_stable_error_reasons(data: bytes, reason: str) -> None:
    assert _error(data) == reason


def test_wrong_field_type_names_the_field() -> None:
    result = parse_line(b'{"type":"message","message":{"role":"user","content":3}}')
    assert result == ParseError("wrong_field_type", "message.content")


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_deep_nesting_does_not_crash(depth: int) -> None:
    assert _error(b"[" * depth + b"]" * depth) == "too_deep"
    nested = b'{"type":"message","id":"d","message":{"role":"user","content":"x","extra":' + b"[" * depth
    assert _error(nested + b"]" * depth + b"}}") == "too_deep"


def test_moderately_deep_tool_arguments_are_flattened_without_recursion() -> None:
    arguments = "[" * 900 + '"leaf"' + "]" * 900
    data = (
        '{"type":"message","id":"d","message":{"role":"assistant","content":[{"type":"toolCall","name":"t",'
        f'"arguments":{arguments}}}]}}}}'
    ).encode()
    line = _parsed(data)
    assert line.blocks == (Block("toolCall", "t\nleaf"),)


def test_lone_surrogates_become_replacement_characters() -> None:
    line = _parsed(b'{"type":"message","id":"s","message":{"role":"user","content":"a\\ud800b"}}')
    assert line.blocks == (Block("text", "a\ufffdb"),)
    line.blocks[0].text.encode("utf-8")  # what every sink downstream does


def test_utf8_bom_is_ignored() -> None:
    assert _parsed(b'\xef\xbb\xbf{"type":"session","id":"s1"}').session_id == "s1"


# ---- never raises -----------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)
_line_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "session", "compaction", "custom_message", "branch_summary", "x"])},
    optional={
        "id": _json_values,
        "timestamp": _json_values | st.integers(min_value=-(10**20), max_value=10**20),
        "summary": _json_values,
        "content": _json_values,
        "display": _json_values,
        "provenance": _json_values,
        "message": st.fixed_dictionaries(
            {},
            optional={
                "role": st.sampled_from(["user", "assistant", "toolResult", "bashExecution"]) | _json_values,
                "content": _json_values
                | st.lists(
                    st.fixed_dictionaries(
                        {"type": st.sampled_from(["text", "thinking", "toolCall", "image", "toolResult", "zz"])},
                        optional={
                            "text": _json_values,
                            "thinking": _json_values,
                            "name": _json_values,
                            "arguments": _json_values,
                            "content": _json_values,
                        },
                    ),
                    max_size=4,
                ),
                "timestamp": _json_values | st.floats(),
                "provider": _json_values,
                "stopReason": _json_values,
                "provenance": _json_values,
                "details": _json_values,
                "errorMessage": _json_values,
                "command": _json_values,
                "output": _json_values,
            },
        )
        | _json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    result = parse_line(data)
    assert isinstance(result, ParsedLine | ParseError)
    if isinstance(result, ParseError):
        assert result.reason in PARSE_ERROR_REASONS and result.reason != "internal_error"


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_arbitrary_json_values_never_raise(value: object) -> None:
    result = parse_line(_line(value))
    assert not (isinstance(result, ParseError) and result.reason == "internal_error"), result


@settings(max_examples=300, deadline=None)
@given(_line_like)
def test_line_shaped_json_never_raises_and_yields_utf8_safe_text(value: dict[str, object]) -> None:
    result = parse_line(_line(value))
    if isinstance(result, ParseError):
        assert result.reason in {"wrong_field_type", "missing_type"}, result
        return
    for block in result.blocks:
        block.text.encode("utf-8")
    if result.timestamp is not None:
        assert result.timestamp.endswith("Z") and len(result.timestamp) == 24


# ---- the real transcripts ---------------------------------------------------------------------------


def _fixture_sessions() -> Path:
    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared fixtures not available")
    return shared / "fixtures" / "openclaw" / "zapabob-main" / "sessions"


def test_every_real_line_parses_with_the_counts_observed_in_source_txt() -> None:
    line_types: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    for path in sorted(_fixture_sessions().iterdir()):
        with path.open("rb") as handle:
            for raw in handle:
                line = _parsed(raw)
                line_types[line.line_type] += 1
                if line.role:
                    roles[line.role] += 1
                assert line.timestamp is not None and line.timestamp.endswith("Z")
    # Figures recorded independently in the fixture's SOURCE.txt.
    assert line_types == Counter(
        message=770, custom=87, session=33, thinking_level_change=32, compaction=32, model_change=28
    )
    assert roles == Counter(assistant=391, user=192, toolResult=187)
