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
`System: [<time>] ...` lines, the queued-messages banner and its `---` / `Queued #N (from <sender>)` separators,
`[media attached: ...]` lines and the "To send an image back" hint, the task-binding block,
`<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>` blocks and the older `OpenClaw runtime context (internal):`
block that carried a sub-agent's `[Internal task completion event]`s (cut where OpenClaw's own
`stripLegacyInternalRuntimeContext` cuts it). Stripped from assistant text: reply tags
(`[[reply_to_current]]`, `[[reply_to:<id>]]`, `[[audio_as_voice]]`), inline `<think>` blocks,
`<final>` tags and `MEDIA:` delivery lines. A `/steer` (`/tell`) line keeps the words after the command.
Images become `[image]` (media placeholders `<media:kind>` become `[kind]`); thinking blocks are
dropped. Assistant text holding a `<tool_call>` (local models print their calls) is tool narration;
assistant text mentioning `NO_REPLY` anywhere is a silent reply or protocol reasoning: both skipped.

External content (`<<<EXTERNAL_UNTRUSTED_CONTENT ...>>>` ... `<<<END_EXTERNAL_UNTRUSTED_CONTENT>>>`,
with its `SECURITY NOTICE` banner) is replaced by `[external content]`, inner text dropped: it is
neither party's words (emails, web pages, attached files fed in by hooks), it can be huge, and
storing it would let an injected instruction come back later through recall as trusted memory.

Sub-agents (`sessions_spawn`): the child run starts with a `[Subagent Context]` / `[Subagent Task]`
brief the parent model wrote, skipped (`subagent_task`) like a cron prompt; the session it opens is a
sub-agent session (`session_kind`), not memory, as OpenClaw's own memory treats it. What the child
found reaches the person through the parent's reply, which is stored in the parent's session.

Agent to agent (`sessions_send`): what another session says to this one arrives as an `[Inter-session
message]` (provenance `inter_session`, source tool `sessions_send`); it is skipped (`agent_to_agent`) and
the reply to it goes back to that session, not to a person: background, like the ping-pong that follows.
The asking agent's answer to its person is memory. Other inter-session messages (an older sub-agent
announce) stay `internal_provenance`, and the reply to them, which carries a result to the person, is kept.

Webhooks: OpenClaw runs a `POST /hooks/agent` payload (an email, an alert) as a cron job: its prompt is
`Job ID: <id> | Received: <time>` and the wrapped payload (or the `[cron:...]` tag when wrapping is off),
ending in the unattended-run preamble; skipped (`cron_prompt`), and its session is a cron session,
whatever its key (`cron:<id>` isolated, `hook:...` persistent). A `POST /hooks/wake` wakes a heartbeat
run that writes `[OpenClaw session event]`: skipped as a `heartbeat_poll`, its reply background.

Turn context: a reply to a heartbeat, cron or other runtime-generated prompt is background traffic
even when it carries no `HEARTBEAT_OK` (status reports, "nothing urgent" notes), unless the heartbeat
arrived while a person's request was still being worked on (see `next_turn`); the reply to the
`/new` / `/reset` start-up prompt is a scripted greeting (`session_greeting`). `clean_message` is per
line, so the caller carries the turn kind: `turn = next_turn(turn, line, result)` after each line,
starting at "conversation" for every session. Without it the per-line rules still apply.

Group chats: the members' messages since the agent's last reply arrive inside the user line, in a
`Chat history since last reply` block (fenced JSON `[{"sender", "timestamp_ms", "body"}]`, or in
the newer marker form one `[#id] [time] sender: body` line each). `clean_message` strips the block
like any metadata; `history_messages` returns its messages, each cleaned like a user message.

Whitespace: line ends trimmed, runs of spaces inside a line collapsed, at most one blank line in a
row (paragraph breaks kept), indentation kept.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from veritas_watch.model import ParsedLine, Role, SessionKind, Skip, TurnKind
from veritas_watch.transforms.parse import epoch_ms_to_iso, replace_surrogates

# ---- skip reasons (stable: metrics and logs key on them) ------------------------------------------
NOT_A_MESSAGE: Final = "not_a_message"  # header, compaction, model_change, custom, ...
UNSUPPORTED_ROLE: Final = "unsupported_role"  # bashExecution, custom, branchSummary, ...
HIDDEN: Final = "hidden"  # display: false
TOOL_RESULT: Final = "tool_result"
TOOL_ONLY: Final = "tool_only"  # assistant turn with tool calls and no text
TOOL_TURN_NARRATION: Final = "tool_turn_narration"  # assistant text beside tool calls ("let me read...")
ASSISTANT_ERROR: Final = "assistant_error"  # failed/aborted model call, no text
DELIVERY_MIRROR: Final = "delivery_mirror"  # provider "openclaw": delivery-mirror / gateway-injected copies
INTERNAL_PROVENANCE: Final = "internal_provenance"  # internal_system (not a wake), inter_session
AGENT_TO_AGENT: Final = "agent_to_agent"  # what another session said to this one through `sessions_send`
HEARTBEAT_POLL: Final = "heartbeat_poll"
HEARTBEAT_ACK: Final = "heartbeat_ack"
BACKGROUND_REPLY: Final = "background_reply"  # assistant text answering a heartbeat/cron/scheduled prompt
SESSION_GREETING: Final = "session_greeting"  # the assistant's reply to the `/new` / `/reset` start-up prompt
CRON_PROMPT: Final = "cron_prompt"
SUBAGENT_TASK: Final = "subagent_task"  # the `[Subagent Context]` / `[Subagent Task]` brief a sub-agent run starts with
SCHEDULED_PROMPT: Final = "scheduled_prompt"  # runtime prompt (custom heartbeat...) with a Current time trailer
SESSION_RESET_PROMPT: Final = "session_reset_prompt"
SYSTEM_LINE: Final = "system_line"  # nothing but `System: [...]` event lines
QUEUED_BANNER: Final = "queued_banner"
SLASH_COMMAND: Final = "slash_command"  # a bare command (/new, /status) or a setting one with its arguments
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
    "agent_to_agent",
    "heartbeat_poll",
    "heartbeat_ack",
    "background_reply",
    "session_greeting",
    "cron_prompt",
    "subagent_task",
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
        AGENT_TO_AGENT,
        HEARTBEAT_POLL,
        HEARTBEAT_ACK,
        BACKGROUND_REPLY,
        SESSION_GREETING,
        CRON_PROMPT,
        SUBAGENT_TASK,
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
_BACKGROUND_PROMPTS: Final = frozenset({HEARTBEAT_POLL, CRON_PROMPT, SUBAGENT_TASK, SCHEDULED_PROMPT, AGENT_TO_AGENT})
# Assistant lines that are work towards a reply, not the reply: the person's request is still open.
_TOOL_WORK: Final = frozenset({TOOL_ONLY, TOOL_TURN_NARRATION})
# Assistant lines that say nothing about where the turn stands (a failed call, a copy, a hidden line).
_TURN_NEUTRAL: Final = frozenset({ASSISTANT_ERROR, DELIVERY_MIRROR, HIDDEN, UNSUPPORTED_ROLE, NOT_A_MESSAGE})

# Where a session stands, as far as the next assistant text is concerned:
# - conversation: a person spoke; what the assistant says now is memory;
# - working: the same, and the last thing the assistant did was tool work (the reply is still owed);
# - background: a runtime prompt (heartbeat, cron, scheduled) is being answered: not memory;
# - greeting: the start-up prompt of `/new` / `/reset` is being answered: boilerplate, not memory.

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
# `Queued #N`, and since 2026.9 with who sent it: `Queued #N (from <sender>)` (`buildCollectItemPrefix`).
_QUEUED_ITEM = re.compile(r"Queued #\d+(?: \(from [^\n]{1,200}\))?")
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
# The tool of one agent (or session) talking to another: its reply goes back to that session, not to a person.
_AGENT_TO_AGENT_TOOL: Final = "sessions_send"
_CRON_PREFIX: Final = "[cron:"
# A cron run fed by a webhook (`POST /hooks/agent`, the Gmail preset): OpenClaw's `buildSafeExternalPrompt`
# puts `Job ID: <id> | Received: <time>` before the wrapped content instead of the `[cron:...]` tag (the
# content is replaced by the external-content placeholder before this is matched).
_HOOK_PROMPT = re.compile(r"Job ID: [^\n]{1,200}\n\n\[external content\]")
# Appended by OpenClaw 2026.9 to every cron run's prompt, webhook runs included (`appendCronUnattendedRunPreamble`).
_UNATTENDED_RUN = re.compile(
    r"\n\nThis is an unattended scheduled run\. Nobody is present to clarify or approve\b[^\n]*\Z"
)
# What a heartbeat run woken by an event (a `POST /hooks/wake`, other wake sources) writes for its prompt;
# heartbeat, cron and exec wakes have their own source tools, handled before.
_WAKE_EVENT_PROMPT: Final = "[OpenClaw session event]"
# OpenClaw's sub-agent brief: `[Subagent Context] You are running as a subagent (depth 1/5) ...` then
# `[Subagent Task]` and the task (2026.9); older builds `[Subagent Task]: <task>`.
_SUBAGENT_PREFIXES: Final = ("[Subagent Context]", "[Subagent Task]")
# OpenClaw's older runtime-context block (`internal-runtime-context.ts`, LEGACY_*): a header, then one or more
# completion events, each `[Internal task completion event]` ... the child's result between delimiters ...
# `Action:` and one paragraph, separated by `---`.
_LEGACY_CONTEXT_HEADER: Final = ("OpenClaw runtime context (internal):\nThis context is runtime-generated, "
                                 "not user-authored. Keep internal details private.\n\n")
_LEGACY_EVENT: Final = "[Internal task completion event]"
_LEGACY_EVENT_SEPARATOR: Final = "\n\n---\n\n"
_LEGACY_RESULT_BEGIN: Final = "<<<BEGIN_UNTRUSTED_CHILD_RESULT>>>"
_LEGACY_RESULT_END: Final = "<<<END_UNTRUSTED_CHILD_RESULT>>>"
_SLASH_COMMAND = re.compile(r"/[a-z][a-z0-9_-]{0,31}")
# OpenClaw's built-in commands that set, show or manage something (its command registry, 2026.9.6: the
# options, status, session and management categories and the host tools, aliases included): with arguments
# (`/think high`, `/model gpt-5`, `/compact <instructions>`) they are still commands, never conversation.
# Left out: those whose arguments are a request of the person's (`/skill`, `/btw`, `/steer`, `/goal`,
# `/loop`, `/learn`), and `/new` / `/reset` with a note, which OpenClaw writes without the command.
_CONTROL_COMMANDS: Final = frozenset({
    "help", "commands", "tools", "status", "diagnostics", "tasks", "context", "export-session", "export",
    "export-trajectory", "trajectory", "whoami", "id", "login", "openclaw", "allowlist", "approve", "subagents",
    "acp", "agents", "config", "mcp", "plugins", "plugin", "debug", "activation", "send", "usage", "session",
    "stop", "name", "compact", "think", "thinking", "t", "verbose", "v", "trace", "fast", "reasoning", "reason",
    "elevated", "elev", "exec", "model", "models", "queue", "tts", "dashboard", "restart", "update", "bash",
    "new", "reset",
})
# How OpenClaw reads a command (`normalizeCommandBody`): `/name`, an optional `@bot`, then `:`, blank or the end.
_COMMAND_HEAD = re.compile(r"/([A-Za-z][A-Za-z0-9_-]{0,31})(?:@[^\s:]+)?(?=\s|:|\Z)")
# `/steer <message>` and its alias `/tell` (2026.9.6, `parseSteerMessage`): OpenClaw writes the line as typed
# (once, while a run is active or not) and hands the model only the message, injected into the running turn or,
# with none running, as a turn of its own. The command is delivery, not meaning: the person's words are the rest.
# The other commands whose argument is a request keep their name, which says what was asked: `/goal <objective>`,
# `/loop [interval] <prompt>`, `/learn <sources>`, `/skill <name> <input>` (`/btw` / `/side` writes nothing).
_STEER_COMMANDS: Final = frozenset({"steer", "tell"})
# ... but their control forms are commands (`parseGoalCommand`, the `/loop` handler): `/goal pause`, `/goal status`,
# `/loop status`, `/loop stop [name]` (an action word alone; `/goal edit <objective>` is a request).
_GOAL_ACTIONS: Final = frozenset({"block", "blocked", "clear", "complete", "create", "done", "edit", "pause", "resume",
                                  "set", "start", "status"})

_REPLY_TAG = re.compile(r"\[\[\s*(?:reply_to_current|reply_to\s*:[^\]\n]*|audio_as_voice)\s*\]\]", re.I)
_THINK = re.compile(r"<(think|thinking)>.*?(?:</\1>|\Z)", re.S | re.I)
_FINAL_TAG = re.compile(r"</?final>", re.I)
_MEDIA_DIRECTIVE = re.compile(r"^[ \t]*MEDIA:[ \t]*\S[^\n]*\n?", re.M)
_HEARTBEAT_AT_EDGE = re.compile(
    r"\A\s*(?:\*\*|__|[*_`]|<b>|<strong>)?HEARTBEAT_OK|HEARTBEAT_OK(?:\*\*|__|[*_`]|</b>|</strong>)?[.!。]?\s*\Z"
)
_MEMORY_CHATTER_LINE = re.compile(r"(?:memory-[a-z0-9_.-]+ ok\b[.!]?|NO_REPLY)", re.I)

# Group chat history (see `history_messages`). The label is one of the metadata labels above, so the
# block it opens is stripped from the carrying message either way.
_HISTORY_HINT: Final = "Chat history since last reply"
_HISTORY_LABEL = re.compile(
    r"Chat history since last reply \(untrusted, for context\):"
    r"|(?:\[[^\]\n]*\][ \t]*)?Chat history since last reply:[ \t]*⟦openclaw:ctx⟧"
)
MAX_HISTORY_MESSAGES: Final = 200  # per user line; OpenClaw itself sends at most 20 (older builds: its history limit)
_MAX_SPEAKER_CHARS: Final = 200
_NEUTRALIZED_FENCE: Final = "`\u200b``"  # OpenClaw breaks ``` inside quoted bodies so they cannot close the fence
# Marker form, one message a line: `[#<message id> ][<time> ][[reply target] ][->#<id> ]<sender>: <body>`.
_HISTORY_LINE = re.compile(
    r"(?:#\S{1,200} )?"
    r"(?:(?P<time>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?"
    r"(?: ?(?:Z|UTC|GMT|[A-Z]{2,5})(?:[+-]\d{1,2}(?::?\d{2})?)?| ?[+-]\d{2}:?\d{2})?) )?"
    r"(?:\[reply target\] )?(?:->#\S{1,200} )?"
    r"(?P<sender>[^\n]{1,500}?): (?P<body>[^\n]+)"
)
_HISTORY_TIME = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<clock>\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)"
    r" ?(?:(?P<utc>Z|UTC|GMT)(?:(?P<sign>[+-])(?P<hours>\d{1,2})(?::?(?P<minutes>\d{2}))?)?"
    r"|(?P<sign2>[+-])(?P<hours2>\d{2}):?(?P<minutes2>\d{2}))"
)
_MEDIA_NOTE = re.compile(r"\[(image|audio|video|application|text)/[^\]\n]{0,300}\]")
_UNKNOWN_SENDER: Final = "unknown sender"

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
    internal: bool  # a runtime-context block (a sub-agent's completion event) was there


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

    A user line opens a turn: `greeting` after the `/new` / `/reset` start-up prompt, `background`
    after a heartbeat, cron or scheduled prompt, `conversation` otherwise. One exception: a heartbeat
    poll that arrives while a person's request is still being worked on (`working`: the assistant's
    last act in that turn was tool work, no reply yet) does not take the turn over. The model carries
    on with the request (a heartbeat is how OpenClaw lets it), so the reply that follows is the
    person's answer; an ack is still an ack (`HEARTBEAT_OK` at the start or end of it).
    In a person's turn, tool work makes it `working` and a reply (or a silent or ack reply) makes it
    `conversation` again; failed calls, copies and hidden lines change nothing. Other turns keep
    their kind until the next user line.
    """
    if line.line_type != "message":
        return turn
    if line.role == "user":
        if isinstance(result, Skip):
            if result.reason == SESSION_RESET_PROMPT:
                return "greeting"
            if result.reason == HEARTBEAT_POLL and turn == "working":
                return "working"
            if result.reason in _BACKGROUND_PROMPTS:
                return "background"
        return "conversation"
    if line.role != "assistant" or turn not in ("conversation", "working"):
        return turn
    if isinstance(result, Skip):
        if result.reason in _TOOL_WORK:
            return "working"
        if result.reason in _TURN_NEUTRAL:
            return turn
        return "conversation"
    if line.stop_reason in _ERROR_STOP_REASONS:
        return turn  # the partial text of a failed call: the reply may still be owed
    return "conversation"


def first_user_text(line: ParsedLine) -> str | None:
    """A user message's text with the scaffolding stripped (for session classification); else None."""
    if line.line_type != "message" or line.role != "user":
        return None
    return _strip_user(_joined_text(line)).text


def session_kind(first_user_text: str) -> SessionKind:
    """What a session is, from its first user message (scaffolding stripped, as `first_user_text` gives it):
    a cron run's (`[cron:<jobId> <name>] ...`), a sub-agent run's (its brief), or a person's conversation.
    A cron or sub-agent session is skipped whole (until a person speaks in it)."""
    if _is_cron_prompt(first_user_text):
        return "cron"
    if first_user_text.startswith(_SUBAGENT_PREFIXES):
        return "subagent"
    return "conversation"


def _is_cron_prompt(text: str) -> bool:
    """A cron run's prompt: tagged `[cron:<jobId> <name>]`, a webhook's wrapped payload, or a prompt ending
    in the unattended-run preamble (the first two start any cron run; the last ends one in 2026.9)."""
    return text.startswith(_CRON_PREFIX) or bool(_HOOK_PROMPT.match(text) or _UNATTENDED_RUN.search(text))


def detection_text(line: ParsedLine) -> str:
    """Every piece of text the line carries, tool traffic included: input for credential detection only."""
    return "\n".join(block.text for block in line.blocks if block.text)


# Lines that are not memory are still where a key may first reach an agent (a tool's output, a sub-agent's brief,
# a cron job's prompt, another agent's message, `/config set ...`): credential capture reads them (never stored).
# Not read: lines that are not messages, and delivery mirrors (copies of a line read already).
_NOT_CAPTURED: Final = frozenset({NOT_A_MESSAGE, DELIVERY_MIRROR})
_TOOL_LINES: Final = frozenset({TOOL_RESULT, TOOL_ONLY, TOOL_TURN_NARRATION})


def capture_text(line: ParsedLine, result: tuple[Role, str] | Skip) -> str | None:
    """What credential capture reads of a line that is not memory (`result`: what `clean_message` made of it, or
    memory text in a session that is not memory); None: nothing.

    Tool traffic is read whole. Elsewhere wrapped external content is left out: a webhook's email or page is
    third-party text, and its unsubscribe and tracking tokens are no credential given to the agent. A line quoting
    a group's chat history gives its own text only: the members' messages are read as entries of their own
    (`history_messages`), and a `***` mask read twice would be two credentials."""
    if isinstance(result, Skip) and result.reason in _NOT_CAPTURED:
        return None
    text = detection_text(line)
    if _HISTORY_HINT in text and history_messages(line):
        return _strip_user(text).text
    if (isinstance(result, Skip) and result.reason in _TOOL_LINES) or "<<<EXTERNAL_UNTRUSTED_CONTENT" not in text:
        return text
    return _EXTERNAL.sub(_EXTERNAL_PLACEHOLDER, text)


@dataclass(frozen=True, slots=True)
class HistoryMessage:
    """One message of a group chat's `Chat history since last reply` block, as its own memory.

    `text` is cleaned like any user message (not yet redacted); `speaker` is who said it, as the
    channel names them (`user:<id>`, a display name), None when unnamed. `sender_key`, `stamp` and
    `body` are the message as written: what identifies it when the same block comes again.
    """

    speaker: str | None
    timestamp: str | None  # ISO-8601 UTC from `timestamp_ms` (or the marker form's time), None if unknown
    text: str
    sender_key: str
    stamp: str  # `timestamp_ms` as digits, the marker form's time as written, or "" when there is none
    body: str


def history_messages(line: ParsedLine) -> list[HistoryMessage]:
    """The group members' messages quoted in a user line's chat-history blocks, oldest first.

    OpenClaw prepends the messages a group sent since the agent last replied (the agent was not
    addressed by them) to the next message that does address it. They are what people said, so each
    becomes a memory of its own; the block itself is stripped from the carrying message by
    `clean_message`. Both forms: a `Chat history since last reply (untrusted, for context):` label or
    a `Chat history since last reply: ⟦openclaw:ctx⟧` label, then a fenced JSON array of
    `{"sender", "timestamp_ms", "body"}` (a truncated array keeps its complete items), or (newest
    marker form) one `[#id] [time] sender: body` line per message. Items without a string body, or
    whose body is nothing but scaffolding or a media placeholder once cleaned, are left out. Only
    blocks the cleaner would strip count: not ones inside external content, recalled memory or the
    runtime's internal context. At most `MAX_HISTORY_MESSAGES` (the newest) per line.
    """
    if line.line_type != "message" or line.role != "user" or not line.display:
        return []
    if line.provenance_kind in ("internal_system", "inter_session"):
        return []
    text = _joined_text(line)
    if _HISTORY_HINT not in text:
        return []
    blocks: list[list[str]] = []
    _strip_user(text, history=blocks)
    found: list[HistoryMessage] = []
    for block in blocks:
        found.extend(_history_block(block))
    return found[-MAX_HISTORY_MESSAGES:]


# ---- user ------------------------------------------------------------------------------------------


def _clean_user(line: ParsedLine) -> tuple[Role, str] | Skip:
    kind, source = line.provenance_kind, line.provenance_source
    if kind == "inter_session":
        return Skip(AGENT_TO_AGENT if source == _AGENT_TO_AGENT_TOOL else INTERNAL_PROVENANCE)
    if kind == "internal_system":
        if source == "heartbeat":
            return Skip(HEARTBEAT_POLL)
        if source == "cron":
            return Skip(CRON_PROMPT)
        if source == "exec":
            return Skip(SYSTEM_LINE)
        if _joined_text(line).strip() == _WAKE_EVENT_PROMPT:
            return Skip(HEARTBEAT_POLL)  # a heartbeat run all the same: its reply is an alert or NO_REPLY
        return Skip(INTERNAL_PROVENANCE)

    stripped = _strip_user(_joined_text(line))
    text = stripped.text
    if not text:
        if stripped.internal:
            return Skip(INTERNAL_PROVENANCE)
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
    if _is_cron_prompt(text):
        return Skip(CRON_PROMPT)
    if text.startswith(_SUBAGENT_PREFIXES):
        return Skip(SUBAGENT_TASK)
    if _INTER_SESSION.match(text):
        header = text.partition("\n")[0]
        return Skip(AGENT_TO_AGENT if f"sourceTool={_AGENT_TO_AGENT_TOOL}" in header else INTERNAL_PROVENANCE)
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
    command = _command(text)
    if _SLASH_COMMAND.fullmatch(text) or (command is not None and _is_control_command(*command)):
        return Skip(SLASH_COMMAND)
    if command is not None and command[0] in _STEER_COMMANDS:
        return ("user", command[1]) if command[1] else Skip(SLASH_COMMAND)
    return ("user", text)


def _command(text: str) -> tuple[str, str] | None:
    """(name in lower case, argument) of text OpenClaw reads as a command; None for other text."""
    head = _COMMAND_HEAD.match(text)
    return None if head is None else (head.group(1).lower(), text[head.end():].removeprefix(":").strip())


def _is_control_command(name: str, argument: str) -> bool:
    if name in _CONTROL_COMMANDS:
        return True
    action = argument.lower()
    if name == "goal":
        return action in _GOAL_ACTIONS  # the action alone; with text (an objective, a note) it is a request
    return name == "loop" and (action in ("help", "status") or action.partition(" ")[0] == "stop")


def _strip_user(text: str, history: list[list[str]] | None = None) -> _Stripped:
    """Strip the scaffolding; with `history`, also collect the lines of each chat-history block stripped."""
    channel = system = queued = media = external = internal = False
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>" in text:
        text = _INTERNAL_CONTEXT.sub("", text)
    if _LEGACY_CONTEXT_HEADER in text:
        text, internal = _strip_legacy_runtime_context(text)
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
        text, flags = _strip_scaffold_lines(text, history)
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
    return _Stripped(_collapse(text), channel, system, queued, media, external, internal)


def _strip_legacy_runtime_context(text: str) -> tuple[str, bool]:
    """Cut every older runtime-context block with its completion events, as OpenClaw's own
    `stripLegacyInternalRuntimeContext` does (the same ends, so the same text is left); True if one was cut.

    One pass: the kept pieces are collected (OpenClaw rebuilds the string at each cut, and a line made of
    thousands of blocks would cost quadratic time here, on the ingest path)."""
    finder = _Finder(text)
    kept: list[str] = []
    pos = search_from = 0  # pos: where the text not yet kept or cut starts
    while (start := finder.find(_LEGACY_CONTEXT_HEADER, search_from)) != -1:
        event = start + len(_LEGACY_CONTEXT_HEADER)
        if not text.startswith(_LEGACY_EVENT, event):
            search_from = event
            continue
        end = _legacy_event_end(finder, event)
        if end is None:
            paragraph = finder.find("\n\n", event + len(_LEGACY_EVENT))
            end = len(text) if paragraph == -1 else paragraph
        else:
            while text.startswith(_LEGACY_EVENT_SEPARATOR + _LEGACY_EVENT, end):
                following = _legacy_event_end(finder, end + len(_LEGACY_EVENT_SEPARATOR))
                if following is None:
                    break
                end = following
        kept.append(text[pos:start])
        while kept and not (last := kept[-1].rstrip()):  # what comes before the block, trailing space cut
            kept.pop()
        if kept:
            kept[-1] = last
        pos = end
        while pos < len(text) and text[pos].isspace():  # and the space after it
            pos += 1
        search_from = pos
        if kept and pos < len(text):
            kept.append("\n\n")
    if pos == 0:
        return text, False
    kept.append(text[pos:])
    return "".join(kept), True


def _legacy_event_end(finder: _Finder, start: int) -> int | None:
    """Where one completion event ends: the paragraph after its `Action:` line (None: not that shape)."""
    text = finder.text
    if not text.startswith(_LEGACY_EVENT, start):
        return None
    begin = finder.find(_LEGACY_RESULT_BEGIN, start + len(_LEGACY_EVENT))
    end = finder.find(_LEGACY_RESULT_END, begin + len(_LEGACY_RESULT_BEGIN)) if begin != -1 else -1
    action = finder.find("\n\nAction:\n", end + len(_LEGACY_RESULT_END)) if end != -1 else -1
    if action == -1:
        return None
    after_action = action + len("\n\nAction:\n")
    following = finder.find(_LEGACY_EVENT_SEPARATOR + _LEGACY_EVENT, after_action)
    if following != -1:
        return following
    paragraph = finder.find("\n\n", after_action)
    return len(text) if paragraph == -1 else paragraph


class _Finder:
    """`str.find` over one text that remembers each needle's last answer: the legacy strip's searches move
    forward, so each needle scans the text about once however many blocks a hostile line holds."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._last: dict[str, tuple[int, int]] = {}  # needle -> (searched from, found at or -1)

    def find(self, needle: str, start: int) -> int:
        last = self._last.get(needle)
        if last is not None and last[0] <= start and (last[1] == -1 or last[1] >= start):
            return last[1]  # nothing between the last search's start and its answer, so none from `start` either
        found = self.text.find(needle, start)
        self._last[needle] = (start, found)
        return found


def _strip_scaffold_lines(
    text: str, history: list[list[str]] | None = None
) -> tuple[str, tuple[bool, bool, bool, bool]]:
    """One pass over the lines, dropping scaffolding blocks. Returns (text, (channel, system, queued, media)).

    With `history`, the lines of every chat-history block dropped (fence lines included) are appended to it.
    """
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
            end = _skip_metadata_block(lines, i + 1)
            if history is not None and _HISTORY_LABEL.fullmatch(line):
                history.append(lines[i + 1 : end])
            i = end
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


# ---- group chat history ----------------------------------------------------------------------------


def _history_block(lines: list[str]) -> list[HistoryMessage]:
    if lines and lines[0].strip().startswith("```"):
        inner = lines[1:]
        if inner and inner[-1].strip() == "```":
            inner = inner[:-1]
        items = _json_items("\n".join(inner))
        return [m for item in items if (m := _history_item(item)) is not None]
    return [m for raw in lines if (m := _history_line(raw.strip())) is not None]


def _json_items(payload: str) -> list[object]:
    """The items of a JSON array; of a truncated or broken one, the complete items before the damage."""
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return _salvage_items(payload)
    return value if isinstance(value, list) else []


def _salvage_items(payload: str) -> list[object]:
    start = payload.find("[")
    if start < 0:
        return []
    decoder = json.JSONDecoder()
    items: list[object] = []
    i, n = start + 1, len(payload)
    while True:
        while i < n and payload[i] in " \t\r\n,":
            i += 1
        if i >= n or payload[i] == "]":
            return items
        try:
            item, i = decoder.raw_decode(payload, i)
        except (ValueError, RecursionError):
            return items
        items.append(item)


def _history_item(item: object) -> HistoryMessage | None:
    if not isinstance(item, dict):
        return None
    body = item.get("body")
    if not isinstance(body, str):
        return None
    speaker, sender_key = _speaker(item.get("sender"))
    ms = item.get("timestamp_ms")
    timestamp = epoch_ms_to_iso(ms)
    stamp = ""
    if timestamp is not None and isinstance(ms, int | float):
        stamp = str(int(ms)) if float(ms).is_integer() else repr(float(ms))
    return _history_message(speaker, sender_key, stamp, timestamp, body)


def _history_line(raw: str) -> HistoryMessage | None:
    match = _HISTORY_LINE.fullmatch(raw)
    if match is None:
        return None
    speaker, sender_key = _speaker(match["sender"])
    stamp = match["time"] or ""
    body = _MEDIA_NOTE.sub(lambda m: f"[{'file' if m[1] in ('application', 'text') else m[1]}]", match["body"])
    return _history_message(speaker, sender_key, stamp, _history_time(stamp), body)


def _history_message(
    speaker: str | None, sender_key: str, stamp: str, timestamp: str | None, body: str
) -> HistoryMessage | None:
    body = replace_surrogates(body.replace("\x00", ""))
    text = _strip_user(body.replace(_NEUTRALIZED_FENCE, "```")).text
    if not text or _PLACEHOLDER_ONLY.fullmatch(text) or text == _EXTERNAL_PLACEHOLDER:
        return None
    return HistoryMessage(speaker, timestamp, text, sender_key, stamp, body)


def _speaker(sender: object) -> tuple[str | None, str]:
    """(who, as stored; the sender as written, for identity). Newer builds may send an object."""
    if isinstance(sender, dict):
        names = (sender.get(key) for key in ("name", "label", "username", "id"))
        sender = next((name for name in names if isinstance(name, str) and name.strip()), None)
    if isinstance(sender, int) and not isinstance(sender, bool):
        sender = str(sender)
    if not isinstance(sender, str):
        return None, ""
    key = replace_surrogates(sender.replace("\x00", ""))
    speaker = " ".join(key.split())[:_MAX_SPEAKER_CHARS]
    return (speaker if speaker and speaker != _UNKNOWN_SENDER else None), key


def _history_time(stamp: str) -> str | None:
    """The marker form's time (`2026-03-14 16:47:05 GMT+9`, `... UTC`, `... +09:00`) as ISO-8601 UTC.

    None for a time without an offset or with a zone abbreviation (`EDT`): the caller falls back.
    """
    match = _HISTORY_TIME.fullmatch(stamp) if stamp else None
    if match is None:
        return None
    sign = match["sign"] or match["sign2"]
    hours = match["hours"] or match["hours2"]
    minutes = match["minutes"] or match["minutes2"]
    try:
        moment = datetime.fromisoformat(f"{match['date']}T{match['clock']}").replace(tzinfo=UTC)
        if sign:
            offset = timedelta(hours=int(hours), minutes=int(minutes or 0))
            moment = moment - offset if sign == "+" else moment + offset
    except (ValueError, OverflowError):
        return None
    return epoch_ms_to_iso(moment.timestamp() * 1000)


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
    if turn == "greeting":
        # The start-up prompt asks for a greeting "in your configured persona" and a question about
        # what to do: boilerplate the runtime asked for, whatever words the model chose.
        return Skip(SESSION_GREETING)
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
