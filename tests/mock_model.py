"""A small OpenAI-compatible chat-completions server for driving the real OpenClaw offline.

OpenClaw (custom provider, `api: "openai-completions"`) calls `POST /v1/chat/completions` with
`stream: true`. This server answers deterministically from the conversation it is sent:

- a turn whose last message is a tool result gets the final answer planned for that turn;
- a user message with a plan (`MockModel.plan(text, ...)`) gets the planned tool call or reply;
- a heartbeat poll gets the acknowledgement its prompt asks for (`NO_REPLY` in 2026.9.6, `HEARTBEAT_OK`
  in older prompts), or the alert planned for a system event it carries (`MockModel.alert(text, reply)`);
- anything else gets a default reply derived from the user's text, unique per message.

Streaming is real SSE (`data: {...}` chunks, `data: [DONE]`), tool calls are streamed in pieces the
way OpenAI does. Every request is kept in `requests` so tests can assert what OpenClaw sent.
It runs in a thread on 127.0.0.1 and needs nothing but the standard library.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HEARTBEAT_OK = "HEARTBEAT_OK"
NO_REPLY = "NO_REPLY"


@dataclass(frozen=True)
class Plan:
    """What the model does for one user message: optionally call a tool first, then reply."""

    reply: str
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    narration: str = ""  # text streamed beside the tool call (OpenClaw marks it as commentary)
    delay: float = 0.0  # seconds before the reply: a run still going when the next message arrives


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


INTERNAL_CONTEXT = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"


def last_user_turn(messages: list[dict[str, Any]]) -> tuple[str, bool]:
    """The user's own words of this turn, and whether a tool already answered in this turn.

    OpenClaw adds an internal-context user message after the user's own, and may repeat it after
    tool results, so "the last message" is not the user's text.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") != "user":
            continue
        text = _text_of(message.get("content"))
        if not text.lstrip().startswith(INTERNAL_CONTEXT):
            return text, any(m.get("role") == "tool" for m in messages[index + 1:])
    return "", False


# OpenClaw's compaction asks the model for a summary under these headings, and (safeguard mode, quality guard on
# by default) cancels the compaction when one is missing or the conversation's asks and identifiers are not kept.
SUMMARIZER_PROMPT = "You are a context summarization assistant"
SUMMARY_SECTIONS = ("## Decisions", "## Open TODOs", "## Constraints/Rules", "## Pending user asks",
                    "## Exact identifiers")


SPLIT_TURN_PROMPT = "This is the PREFIX of a turn"  # summarised into OpenClaw's own sections: answered as a turn


def is_summary_request(messages: list[dict[str, Any]], user_text: str) -> bool:
    """A request for a history summary (not the prefix of a split turn, which OpenClaw frames itself)."""
    return SPLIT_TURN_PROMPT not in user_text and any(
        m.get("role") == "system" and SUMMARIZER_PROMPT in _text_of(m.get("content")) for m in messages)


def summary_reply(user_text: str) -> str:
    """A summary a careful model would write: every required section, the conversation's lines kept verbatim
    where asks and identifiers must survive."""
    match = re.search(r"<conversation>\n?(.*?)</conversation>", user_text, re.S)
    lines = "\n".join(f"- {line.strip()}" for line in (match.group(1) if match else "").splitlines() if line.strip())
    kept = lines or "None."
    body = {"## Decisions": kept, "## Pending user asks": kept, "## Exact identifiers": kept}
    return "\n\n".join(f"{heading}\n{body.get(heading, 'None.')}" for heading in SUMMARY_SECTIONS)


def default_reply(user_text: str) -> str:
    digest = hashlib.sha1(user_text.encode()).hexdigest()[:8]
    return f"Understood, noted ({digest})."


class MockModel:
    def __init__(self, model_id: str = "mock-1", port: int = 0) -> None:
        self.model_id = model_id
        self._plans: dict[str, Plan] = {}
        self._alerts: dict[str, str] = {}
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="mock-model", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> MockModel:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def plan(self, user_text_contains: str, plan: Plan) -> None:
        """The next turn whose last user message contains this text follows `plan`."""
        with self._lock:
            self._plans[user_text_contains] = plan

    def alert(self, event_text_contains: str, reply: str) -> None:
        """A heartbeat run whose system events hold this text answers `reply` (an alert for the person)."""
        with self._lock:
            self._alerts[event_text_contains] = reply

    # -- answering ---------------------------------------------------------------------------------

    def _find_plan(self, user_text: str) -> Plan | None:
        with self._lock:
            for key, plan in self._plans.items():
                if key in user_text:
                    return plan
        return None

    def _alert_for(self, messages: list[dict[str, Any]]) -> str | None:
        """The planned alert for a system event in this turn (OpenClaw puts events in its internal context)."""
        turn: list[str] = []
        for message in reversed(messages):
            if message.get("role") == "assistant":
                break
            if message.get("role") == "user":
                turn.append(_text_of(message.get("content")))
        with self._lock:
            return next((reply for key, reply in self._alerts.items() if any(key in text for text in turn)), None)

    def answer(self, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """(text, tool calls) for one request."""
        messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
        user_text, tool_answered = last_user_turn(messages)
        if is_summary_request(messages, user_text):
            return summary_reply(user_text), []
        plan = self._find_plan(user_text)
        if tool_answered:
            return (plan.reply if plan else "Done."), []
        if "heartbeat" in user_text.lower():  # a heartbeat poll: nothing needs attention, unless an event asks
            return self._alert_for(messages) or (NO_REPLY if NO_REPLY in user_text else HEARTBEAT_OK), []
        if plan is not None and plan.tool and body.get("tools"):
            call = {"id": f"call_{hashlib.sha1(user_text.encode()).hexdigest()[:12]}", "type": "function",
                    "function": {"name": plan.tool, "arguments": json.dumps(plan.arguments or {})}}
            return plan.narration, [call]
        if plan is not None:
            time.sleep(plan.delay)
            return plan.reply, []
        return default_reply(user_text), []

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._json({"object": "list", "data": [{"id": model.model_id, "object": "model"}]})
                else:
                    self._json({"error": "not found"}, 404)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._json({"error": "bad json"}, 400)
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._json({"error": "not found"}, 404)
                    return
                with model._lock:
                    model.requests.append(body)
                text, calls = model.answer(body)
                if body.get("stream"):
                    self._stream(text, calls)
                else:
                    message: dict[str, Any] = {"role": "assistant", "content": text or None}
                    if calls:
                        message["tool_calls"] = calls
                    self._json({"id": "chatcmpl-mock", "object": "chat.completion", "created": int(time.time()),
                                "model": model.model_id,
                                "choices": [{"index": 0, "message": message,
                                             "finish_reason": "tool_calls" if calls else "stop"}],
                                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

            def _json(self, value: object, status: int = 200) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, text: str, calls: list[dict[str, Any]]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                base = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": model.model_id}

                def send(delta: dict[str, Any], finish: str | None = None, usage: bool = False) -> None:
                    chunk: dict[str, Any] = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                    if usage:
                        chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()

                send({"role": "assistant", "content": ""})
                for start in range(0, len(text), 16):  # several deltas, as a real model streams
                    send({"content": text[start:start + 16]})
                for index, call in enumerate(calls):
                    fn = call["function"]
                    send({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                          "function": {"name": fn["name"], "arguments": ""}}]})
                    args = fn["arguments"]
                    for start in range(0, len(args), 24):
                        send({"tool_calls": [{"index": index, "function": {"arguments": args[start:start + 24]}}]})
                send({}, "tool_calls" if calls else "stop", usage=True)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler
