"""What every route shares: the running daemon (`served_of`), JSON in (checked: UTF-8, depth, the caller's
agent) and JSON out (UTF-8 as written), and the 400 a bad body gets. A leaf of the `http` package: routes
import it, it imports no route."""

from __future__ import annotations

import asyncio
import json
import math
import re
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from aiohttp import web

from veritas_watch.http.access import agent_param, request_access

if TYPE_CHECKING:
    from veritas_watch.http.port import Served

MAX_JSON_DEPTH = 64  # request JSON nested deeper is refused (400) before it is parsed
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in "[]{}"))
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_INLINE_PARSE_BYTES = 64 * 1024  # bigger bodies are checked and parsed off the event loop


def json_answer(data: Any, status: int = 200) -> web.Response:
    """A JSON answer in UTF-8 as written: Chinese and Japanese memories stay readable, not `\\uXXXX`."""
    return web.json_response(data, status=status, dumps=_dumps_utf8)


def _dumps_utf8(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False)


class BadRequest(web.HTTPBadRequest):
    """A 400 with a JSON message; `reason` names it in the (rate-limited) `request_refused` log line."""

    def __init__(self, message: str, reason: str = "bad_request") -> None:
        super().__init__(text=json.dumps({"error": message}), content_type="application/json")
        self.refusal_reason = reason


@dataclass
class Gate:
    """What the app knows of the daemon: the port it listens on once bound, and the running daemon once
    start-up finished (`http.app.HttpApi.serve`); before that every route but /health answers 503."""

    port: int | None = None
    served: Served | None = None


GATE_KEY = web.AppKey("gate", Gate)


def served_of(request: web.Request) -> Served:
    """The running daemon; 503 "daemon starting" while it starts (the port is bound first)."""
    served = request.app[GATE_KEY].served
    if served is None:
        raise web.HTTPServiceUnavailable(text=json.dumps({"error": "daemon starting"}), content_type="application/json",
                                         headers={"Retry-After": "2"})
    return served


def json_depth(text: str, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep `text`'s brackets nest (outside strings), counted up to just past `limit`."""
    brackets = _JSON_STRING.sub("", text).translate(_NOT_BRACKET)
    deepest = 0
    for depth in accumulate(_DEPTH_STEP.get(c, 0) for c in brackets):
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
    return deepest


class _NotFinite(ValueError):
    pass


def _not_json(name: str) -> float:
    """Python's parser reads NaN and Infinity; JSON has no such values (and the store cannot compare them)."""
    raise _NotFinite(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400
        raise _NotFinite(f"number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    """An integer a double holds (every number field is compared as one: epoch seconds, floor, limit): up to
    300 digits, which every double can (its range ends near 10**308); longer is refused before it is parsed."""
    if len(text.lstrip("-")) > 300:
        raise _NotFinite(f"number {text[:40]}… is out of range")
    return int(text)


def _check_unicode(value: Any) -> None:
    """JSON's `\ud800` escapes decode to lone surrogates, which are no text: nothing can store or log them."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("body holds a lone surrogate escape (\\ud800-\\udfff): not Unicode text") from None


def parse_json_body(raw: bytes) -> Any:
    """A request body as JSON: UTF-8, at most MAX_JSON_DEPTH deep; BadRequest (400) otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("body must be UTF-8 JSON") from None
    too_deep = BadRequest(f"body nests deeper than {MAX_JSON_DEPTH} levels", "json_too_deep")
    if json_depth(text) > MAX_JSON_DEPTH:
        raise too_deep
    try:
        value = json.loads(text, parse_constant=_not_json, parse_float=_finite, parse_int=_bounded_int)
    except _NotFinite as exc:
        raise BadRequest(str(exc), "number_out_of_range") from None
    except RecursionError:  # brackets hidden from the count by a malformed string: still too deep
        raise too_deep from None
    except ValueError:
        raise BadRequest("body must be a JSON object", "not_json") from None
    _check_unicode(value)
    return value


async def json_body(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object. Its `agent_id`, when given, is checked by OpenClaw's rule (400 otherwise),
    made canonical, and must be one the caller may use (403); a per-agent token's caller gets its agent."""
    raw = await request.read()
    body = parse_json_body(raw) if len(raw) <= _INLINE_PARSE_BYTES else await asyncio.to_thread(parse_json_body, raw)
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    access = request_access(request)
    if body.get("agent_id") is not None:
        body["agent_id"] = agent_param(body["agent_id"])
        access.require(body["agent_id"])
    elif access.agent is not None:
        body["agent_id"] = access.agent  # a per-agent token speaks for its agent (never a cross-agent search)
    return body


def field(body: dict[str, Any], name: str, kind: type, *, required: bool = True, default: Any = None) -> Any:
    if name not in body or body[name] is None:
        if required:
            raise BadRequest(f"missing field: {name}")
        return default
    value = body[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise BadRequest(f"field {name} must be an integer")
    if kind is str and (not isinstance(value, str) or not value.strip()):
        raise BadRequest(f"field {name} must be a non-empty string")
    return value
