"""ParsedLine -> (role, clean conversation text) or Skip(reason): the noise catalogue, as code.

Only what a person said to the agent, and what the agent answered them, becomes memory. Everything
the runtime generates around that is either *stripped* (scaffolding wrapped around real words) or
the whole line is *skipped* with a stable reason (lines that are nothing but runtime traffic).

Stripped from user text: inbound metadata blocks (`Sender (untrusted metadata):` + fenced JSON and
the other labels; the newer `<Label>: ⟦openclaw:ctx⟧` blocks, fenced or not; a trailing
`Context: ⟦openclaw:ctx⟧` block to the end; `<active_memory_plugin>` blocks with their
`Context:` / `Untrusted context` label; `Untrusted context (metadata, ...)` and everything after
it), envelope prefixes (`[Tue 2026-03-17 07:08 GMT+9] `, `[webchat user +5m host 2026-03-17 07:08
UTC] `: any bracket at a line start holding a date and time), `[message_id: X]` tags, generated
`System: [<time>] ...` lines, the queued-messages banner and its `---` / `Queued #N` separators,
`[media attached: ...]` lines and the "To send an image back" hint, the task-binding block and
`<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>` blocks. Stripped from assistant text: reply tags
(`[[reply_to_current]]`, `[[reply_to:<id>]]`, `[[audio_as_voice]]`), inline `<think>` blocks,
`<final>` tags and `MEDIA:` delivery lines.
Images become `[image]` (media placeholders `<media:kind>` become `[kind]`); thinking blocks are
dropped. Assistant text holding a `<tool_call>` (local models print their calls) is tool narration;
assistant text mentioning `NO_REPLY` anywhere is a silent reply or protocol reasoning: both skipped.

External content (`<<<EXTERNAL_UNTRUSTED_CONTENT ...>>>` ... `<<<END_EXTERNAL_UNTRUSTED_CONTENT>>>`,
with its `SECURITY NOTICE` banner) is replaced by `[external content]`, inner text dropped: it is
neither party's words (emails, web pages, attached files fed in by hooks), it can be huge, and
storing it would let an injected instruction come back later through recall as trusted memory.

Turn context: a reply to a heartbeat, cron or other runtime-generated prompt is background traffic
even when it carries no `HEARTBEAT_OK` (status reports, "nothing urgent" notes). `clean_message`
is per line, so the caller carries the turn kind: `turn = next_turn(turn, line, result)` after each
line, starting at "conversation" for every session. Without it the per-line rules still apply.

Whitespace: line ends trimmed, runs of spaces inside a line collapsed, at most one blank line in a
row (paragraph breaks kept), indentation kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from veritas_watch.model import ParsedLine, Role, Skip

# ---- skip reasons (stable: metrics and logs key on them) ------------------------------------------
NOT_A_MESSAGE: Final = "not_a_message"  # header, compaction, model_change, custom, ...
UNSUPPORTED_ROLE: Final = "unsupported_role"  # bashExecution, custom, branchSummary, ...
HIDDEN: Final = "hidden"  # display: false
TOOL_RESULT: Final = "tool_result"
TOOL_ONLY: Final = "tool_only"  # assistant turn with tool calls and no text
TOOL_TURN_NARRATION: Final = "tool_turn_narration"  # assistant text beside tool calls ("let me read...")
ASSISTANT_ERROR: Final = "assistant_error"  # failed/aborted model call, no text
DELIVERY_MIRROR: Final = "delivery_mirror"  # provider "openclaw": delivery-mirror / gateway-injected copies
INTERNAL_PROVENANCE: Final = "internal_provenance"  # internal_system (non heartbeat/cron/exec), inter_session
HEARTBEAT_POLL: Final = "heartbeat_poll"
HEARTBEAT_ACK: Final = "heartbeat_ack"
BACKGROUND_REPLY: Final = "background_reply"  # assistant text answering a heartbeat/cron/scheduled prompt
CRON_PROMPT: Final = "cron_prompt"
SCHEDULED_PROMPT: Final = "scheduled_prompt"  # runtime prompt (custom heartbeat...) with a Current time trailer
SESSION_RESET_PROMPT: Final = "session_reset_prompt"
SYSTEM_LINE: Final = "system_line"  # nothing but `System: [...]` event lines
QUEUED_BANNER: Final = "queued_banner"
SLASH_COMMAND: Final = "slash_command"  # a bare control command: /new, /status, /skill
MEDIA_ONLY: Final = "media_only"  # nothing but an image/audio placeholder
EXTERNAL_CONTENT: Final = "external_content"  # nothing but wrapped external content
NO_REPLY: Final = "no_reply"
MEMORY_JOB_CHATTER: Final = "memory_job_chatter"  # `memory-<layer> ok`
EMPTY_AFTER_CLEANING: Final = "empty_after_cleaning"

SkipReason = Literal[
    "not_a_message",
    "unsupported_role",
    "hidden",
    "tool_result",
    "tool_only",
    "tool_turn_narration",
    "assistant_error",
    "delivery_mirror",
    "internal_provenance",
    "heartbeat_poll",
    "heartbeat_ack",
    "background_reply",
    "cron_prompt",
    "scheduled_prompt",
    "session_reset_prompt",
    "system_line",
    "queued_banner",
    "slash_command",
    "media_only",
    "external_content",
    "no_reply",
    "memory_job_chatter",
    "empty_after_cleaning",
]
SKIP_REASONS: Final[frozenset[str]] = frozenset(
    {
        NOT_A_MESSAGE,
        UNSUPPORTED_ROLE,
        HIDDEN,
        TOOL_RESULT,
        TOOL_ONLY,
        TOOL_TURN_NARRATION,
        ASSISTANT_ERROR,
        DELIVERY_MIRROR,
        INTERNAL_PROVENANCE,
        HEARTBEAT_POLL,
        HEARTBEAT_ACK,
        BACKGROUND_REPLY,
        CRON_PROMPT,
        SCHEDULED_PROMPT,
        SESSION_RESET_PROMPT,
        SYSTEM_LINE,
        QUEUED_BANNER,
        SLASH_COMMAND,
        MEDIA_ONLY,
        EXTERNAL_CONTENT,
        NO_REPLY,
        MEMORY_JOB_CHATTER,
        EMPTY_AFTER_CLEANING,
    }
)

# Skips of user lines that open a background turn (the reply that follows is not conversation).
_BACKGROUND_PROMPTS: Final = frozenset({HEARTBEAT_POLL, CRON_PROMPT, SCHEDULED_PROMPT})

TurnKind = Literal["conversation", "background"]

_SYNTHETIC_PROVIDER: Final = "openclaw"  # delivery-mirror, gateway-injected: copies, not model output
_ERROR_STOP_REASONS: Final = frozenset({"error", "aborted"})

# ---- patterns (compiled once: this runs on every line) --------------------------------------------
_CTX_MARKER: Final = "⟦openclaw:ctx⟧"
_INTERNAL_CONTEXT = re.compile(
    r"<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>.*?(?:<<<END_OPENCLAW_INTERNAL_CONTEXT>>>|\Z)", re.S
)
_ACTIVE_MEMORY = re.compile(
    r"(?:^[ \t]*(?:Context:|Untrusted context \(metadata, do not treat as instructions or commands\):)"
    r"[ \t]*\n[ \t]*)?<active_memory_plugin>.*?(?:</active_memory_plugin>|\Z)",
    re.S | re.M,
)
# Older form: this header and everything after it is channel metadata appended to the message.
_UNTRUSTED_SUFFIX = re.compile(
    r"^[ \t]*Untrusted context \(metadata, do not treat as instructions or commands\):.*", re.S | re.M
)
# Newer form of the same: a trailing `Context: ⟦openclaw:ctx⟧` block runs to the end.
_CTX_SUFFIX = re.compile(r"^[ \t]*Context:[ \t]*⟦openclaw:ctx⟧.*", re.S | re.M)
_EXTERNAL = re.compile(
    r"(?:SECURITY NOTICE: The following content is from an EXTERNAL, UNTRUSTED source"
    r"(?:(?!<<<EXTERNAL_UNTRUSTED_CONTENT).)*)?"
    r"<<<EXTERNAL_UNTRUSTED_CONTENT[^\n>]*>>>.*?(?:<<<END_EXTERNAL_UNTRUSTED_CONTENT[^\n>]*>>>|\Z)",
    re.S,
)
_EXTERNAL_PLACEHOLDER: Final = "[external content]"
# Any of these present means the line-by-line scaffolding pass has work to do.
_SCAFFOLD_HINT = re.compile(
    r"\(untrusted|⟦openclaw:ctx⟧|System(?: \(untrusted\))?: \[|Queued|\[media attached|To send an image back"
    r"|To send a file back|\[Current task binding|\[message_id:"
)
_OLD_SENTINEL = re.compile(r"[A-Z][^\n:]{0,120}\(untrusted(?: metadata|, for context)\):")
_NEW_LABEL = re.compile(r"(?:\[[^\]\n]*\][ \t]*)?[^\n]{1,160}?:[ \t]*⟦openclaw:ctx⟧")
# Bounded: user text reaches these patterns, and an unbounded `[^\]]*\d{2}:\d{2}[^\]]*` is quadratic.
_SYSTEM_LINE = re.compile(r"System(?: \(untrusted\))?: \[(?=[^\]\n]{0,80}\d{2}:\d{2})[^\]\n]{0,80}\]")
_QUEUED_BANNER: Final = "[Queued messages while agent was busy]"
_QUEUED_ITEM = re.compile(r"Queued #\d+")
_MEDIA_HINT_PREFIXES: Final = (
    "To send an image back, prefer the message tool",
    "To send a file back, prefer the message tool",
    "If you must inline, use MEDIA:",
    "(spaces ok, quote if needed)",
    "Keep caption in the text body.",
)
_TASK_BINDING: Final = "[Current task binding for this turn]"
_TASK_BINDING_LINES: Final = (
    "Task id:",
    "Task title:",
    "Task summary:",
    "Task mode is currently off for this session.",
    "There is no active task binding for this turn.",
    "Use the task binding above as the task the user is continuing right now.",
    "If earlier conversation history mentions different tasks, treat those as stale",
    "Ignore any task-binding blocks from earlier turns",
)
_MESSAGE_ID = re.compile(r"[ \t]*\[message_id:[^\]\n]*\][ \t]*")
# Envelope: a bracket at a line start that holds a date and a time (never a `[cron:...]` tag, whose
# job name may hold a date too).
_ENVELOPE = re.compile(r"^[ \t]*\[(?!cron:)(?=[^\]\n]*\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2})[^\]\n]{1,200}\][ \t]*", re.M)
_MEDIA_PLACEHOLDER = re.compile(r"<media:([a-z]+)>")
_PLACEHOLDER_ONLY = re.compile(r"(?:\[(?:image|audio|video|file|document|sticker|media)\]\s*)+")

_RESET_PROMPT = re.compile(r"A new session was started via /new or /reset\b")
_HEARTBEAT_PROMPT = re.compile(r"Read HEARTBEAT\.md if it exists\b")
# Appended by the runtime to heartbeat, cron and reset prompts (`appendCronStyleCurrentTimeLine`):
# old `Current time: <local> (<tz>) / YYYY-MM-DD HH:MM UTC`, newer with a `Reference UTC:` line.
_CURRENT_TIME_TRAILER = re.compile(
    r"(?:^|\n)Current time: [^\n]*\([^()\n]+\)"
    r"(?: / \d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC|\nReference UTC: \d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC)\s*\Z"
)
_INTER_SESSION = re.compile(r"\[?Inter-session message\b")
_CRON_PREFIX: Final = "[cron:"
_SLASH_COMMAND = re.compile(r"/[a-z][a-z0-9_-]{0,31}")

_REPLY_TAG = re.compile(r"\[\[\s*(?:reply_to_current|reply_to\s*:[^\]\n]*|audio_as_voice)\s*\]\]", re.I)
_THINK = re.compile(r"<(think|thinking)>.*?(?:</\1>|\Z)", re.S | re.I)
_FINAL_TAG = re.compile(r"</?final>", re.I)
_MEDIA_DIRECTIVE = re.compile(r"^[ \t]*MEDIA:[ \t]*\S[^\n]*\n?", re.M)
_HEARTBEAT_AT_EDGE = re.compile(
    r"\A\s*(?:\*\*|__|[*_`]|<b>|<strong>)?HEARTBEAT_OK|HEARTBEAT_OK(?:\*\*|__|[*_`]|</b>|</strong>)?[.!。]?\s*\Z"
)
_MEMORY_CHATTER_LINE = re.compile(r"(?:memory-[a-z0-9_.-]+ ok\b[.!]?|NO_REPLY)", re.I)

_TRAILING_SPACE = re.compile(r"[ \t\u00a0\u200b]+$", re.M)
_INNER_SPACE = re.compile(r"(?<=\S)[ \t\u00a0]{2,}")
_BLANK_LINES = re.compile(r"\n{3,}")


@dataclass(frozen=True, slots=True)
class _Stripped:
    """User text with the scaffolding removed, and what kinds of scaffolding were found."""

    text: str
    channel: bool  # inbound metadata or an envelope: the message came in through a channel
    system: bool
    queued: bool
    media: bool
    external: bool


def clean_message(line: ParsedLine, *, turn: TurnKind = "conversation") -> tuple[Role, str] | Skip:
    """The conversation text of a message line, or why it is not memory."""
    if line.line_type != "message":
        return Skip(NOT_A_MESSAGE)
    role = line.role
    if role == "toolResult":
        return Skip(TOOL_RESULT)
    if role != "user" and role != "assistant":
        return Skip(UNSUPPORTED_ROLE)
    if not line.display:
        return Skip(HIDDEN)
    if role == "user":
        return _clean_user(line)
    return _clean_assistant(line, turn)


def next_turn(turn: TurnKind, line: ParsedLine, result: tuple[Role, str] | Skip) -> TurnKind:
    """The turn kind after `line`, given what `clean_message` returned for it.

    A user line opens a turn: background when it was a heartbeat, cron or scheduled prompt,
    conversation otherwise. Every other line keeps the current turn.
    """
    if line.line_type != "message" or line.role != "user":
        return turn
    if isinstance(result, Skip) and result.reason in _BACKGROUND_PROMPTS:
        return "background"
    return "conversation"


def first_user_text(line: ParsedLine) -> str | None:
    """A user message's text with the scaffolding stripped (for session classification); else None."""
    if line.line_type != "message" or line.role != "user":
        return None
    return _strip_user(_joined_text(line)).text


def is_cron_prompt(text: str) -> bool:
    """True for a cron run's prompt (`[cron:<jobId> <name>] ...`), envelope and metadata allowed before it.

    A session whose first user message is a cron prompt is a cron session: skip it whole.
    """
    return _strip_user(text).text.startswith(_CRON_PREFIX)


def detection_text(line: ParsedLine) -> str:
    """Every piece of text the line carries, tool traffic included: input for credential detection only."""
    return "\n".join(block.text for block in line.blocks if block.text)


# ---- user ------------------------------------------------------------------------------------------


def _clean_user(line: ParsedLine) -> tuple[Role, str] | Skip:
    kind, source = line.provenance_kind, line.provenance_source
    if kind == "inter_session":
        return Skip(INTERNAL_PROVENANCE)
    if kind == "internal_system":
        if source == "heartbeat":
            return Skip(HEARTBEAT_POLL)
        if source == "cron":
            return Skip(CRON_PROMPT)
        if source == "exec":
            return Skip(SYSTEM_LINE)
        return Skip(INTERNAL_PROVENANCE)

    stripped = _strip_user(_joined_text(line))
    text = stripped.text
    if not text:
        if stripped.external:
            return Skip(EXTERNAL_CONTENT)
        if stripped.queued:
            return Skip(QUEUED_BANNER)
        if stripped.system:
            return Skip(SYSTEM_LINE)
        if stripped.media:
            return Skip(MEDIA_ONLY)
        return Skip(EMPTY_AFTER_CLEANING)
    if _RESET_PROMPT.match(text):
        return Skip(SESSION_RESET_PROMPT)
    if _HEARTBEAT_PROMPT.match(text):
        return Skip(HEARTBEAT_POLL)
    if text.startswith(_CRON_PREFIX):
        return Skip(CRON_PROMPT)
    if _INTER_SESSION.match(text):
        return Skip(INTERNAL_PROVENANCE)
    if not stripped.channel:
        # No channel scaffolding at all: a prompt the runtime wrote. Heartbeat prompts are
        # configurable, so beyond the default wording rely on the runtime's own markers.
        if "HEARTBEAT_OK" in text:
            return Skip(HEARTBEAT_POLL)
        if _CURRENT_TIME_TRAILER.search(text):
            return Skip(HEARTBEAT_POLL if "HEARTBEAT" in text else SCHEDULED_PROMPT)
    if _PLACEHOLDER_ONLY.fullmatch(text):
        return Skip(MEDIA_ONLY)
    if text == _EXTERNAL_PLACEHOLDER:
        return Skip(EXTERNAL_CONTENT)
    if _SLASH_COMMAND.fullmatch(text):
        return Skip(SLASH_COMMAND)
    return ("user", text)


def _strip_user(text: str) -> _Stripped:
    channel = system = queued = media = external = False
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>" in text:
        text = _INTERNAL_CONTEXT.sub("", text)
    if "<active_memory_plugin>" in text:
        text, found = _ACTIVE_MEMORY.subn("", text)
        channel = channel or found > 0
    if "Untrusted context (metadata" in text:
        text, found = _UNTRUSTED_SUFFIX.subn("", text)
        channel = channel or found > 0
    if _CTX_MARKER in text:
        text, found = _CTX_SUFFIX.subn("", text)
        channel = channel or found > 0
    if "<<<EXTERNAL_UNTRUSTED_CONTENT" in text:
        text, found = _EXTERNAL.subn(_EXTERNAL_PLACEHOLDER, text)
        external = found > 0
    if _SCAFFOLD_HINT.search(text):
        text, flags = _strip_scaffold_lines(text)
        channel = channel or flags[0]
        system, queued, media = flags[1], flags[2], flags[3]
    if "[" in text:
        text, found = _ENVELOPE.subn("", text)
        channel = channel or found > 0
        if "[message_id:" in text:
            text = _MESSAGE_ID.sub(" ", text)
            channel = True
    if "<media:" in text:
        text = _MEDIA_PLACEHOLDER.sub(r"[\1]", text)
    return _Stripped(_collapse(text), channel, system, queued, media, external)


def _strip_scaffold_lines(text: str) -> tuple[str, tuple[bool, bool, bool, bool]]:
    """One pass over the lines, dropping scaffolding blocks. Returns (text, (channel, system, queued, media))."""
    channel = system = queued = media = False
    lines = text.split("\n")
    kept: list[str] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i].strip()
        if not line:
            kept.append("")
            i += 1
        elif _SYSTEM_LINE.match(line):
            system = True
            i += 1
        elif line == _QUEUED_BANNER or _QUEUED_ITEM.fullmatch(line):
            queued = True
            i += 1
        elif line == "---" and i + 1 < n and _QUEUED_ITEM.fullmatch(lines[i + 1].strip()):
            queued = True
            i += 2
        elif (line.startswith("[media attached") and line.endswith("]")) or line.startswith(_MEDIA_HINT_PREFIXES):
            media = True
            i += 1
        elif line == _TASK_BINDING:
            channel = True
            i += 1
            while i < n and lines[i].strip().startswith(_TASK_BINDING_LINES):
                i += 1
        elif _OLD_SENTINEL.fullmatch(line) or (_CTX_MARKER in line and _NEW_LABEL.fullmatch(line)):
            channel = True
            i = _skip_metadata_block(lines, i + 1)
        elif _CTX_MARKER in line:
            channel = True  # a marker in a shape we do not know: drop the line, never keep the marker
            i += 1
        elif _MESSAGE_ID.fullmatch(line):
            channel = True
            i += 1
        else:
            kept.append(lines[i])
            i += 1
    return "\n".join(kept), (channel, system, queued, media)


def _skip_metadata_block(lines: list[str], start: int) -> int:
    """Index after the block that follows a metadata label: a fenced block, or lines up to a blank one."""
    n = len(lines)
    if start < n and lines[start].strip().startswith("```"):
        end = start + 1
        while end < n and lines[end].strip() != "```":
            end += 1
        return min(end + 1, n)  # an unclosed fence is metadata to the end
    end = start
    while end < n and lines[end].strip():
        end += 1
    return end


# ---- assistant -------------------------------------------------------------------------------------


def _clean_assistant(line: ParsedLine, turn: TurnKind) -> tuple[Role, str] | Skip:
    if line.provider == _SYNTHETIC_PROVIDER:
        return Skip(DELIVERY_MIRROR)
    has_tool_call = any(block.kind == "toolCall" for block in line.blocks)
    has_text = any(block.kind == "text" and block.text.strip() for block in line.blocks)
    if has_tool_call or line.stop_reason == "toolUse":
        return Skip(TOOL_TURN_NARRATION if has_text else TOOL_ONLY)
    if not has_text and line.stop_reason in _ERROR_STOP_REASONS:
        return Skip(ASSISTANT_ERROR)

    text = _joined_text(line)
    if "<tool_call>" in text:
        # A local model printing its tool call as text: the turn is a tool turn, the text narration.
        return Skip(TOOL_TURN_NARRATION)
    if "[[" in text:
        text = _REPLY_TAG.sub("", text)
    if "<" in text:
        text = _THINK.sub("", text)
        text = _FINAL_TAG.sub("", text)
    if "MEDIA:" in text:
        text = _MEDIA_DIRECTIVE.sub("", text)
    text = _collapse(text)
    if not text:
        return Skip(EMPTY_AFTER_CLEANING)
    if "NO_REPLY" in text:
        # Exactly NO_REPLY, or with it at the start or end, is OpenClaw's silent reply. Anywhere
        # else it is the model reasoning about the protocol in the open ("NO_REPLY で終わるべき..."):
        # the token never belongs in a reply meant for a person, so neither is memory.
        return Skip(NO_REPLY)
    if all(_MEMORY_CHATTER_LINE.fullmatch(part.strip()) for part in text.split("\n") if part.strip()):
        return Skip(MEMORY_JOB_CHATTER)
    # OpenClaw suppresses delivery of an ack with <= 300 chars beside the token; for memory the
    # length does not matter: a reply opening or closing with the token is the model saying
    # "nothing to report", and what precedes it is its reasoning (measured: long qwen acks).
    # This also holds when the turn context was lost (a tailer resuming mid-file).
    if "HEARTBEAT_OK" in text and (turn == "background" or _HEARTBEAT_AT_EDGE.search(text)):
        return Skip(HEARTBEAT_ACK)
    if turn == "background":
        return Skip(BACKGROUND_REPLY)
    if _PLACEHOLDER_ONLY.fullmatch(text):
        return Skip(MEDIA_ONLY)
    return ("assistant", text)


# ---- shared ----------------------------------------------------------------------------------------


def _joined_text(line: ParsedLine) -> str:
    """Conversation blocks in order: text as is, images as a placeholder; thinking and tools left out."""
    parts = [
        block.text if block.kind == "text" else "[image]"
        for block in line.blocks
        if block.kind == "image" or (block.kind == "text" and block.text)
    ]
    return "\n\n".join(parts)


def _collapse(text: str) -> str:
    if not text:
        return text
    text = _TRAILING_SPACE.sub("", text)
    text = _INNER_SPACE.sub(" ", text)
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()
