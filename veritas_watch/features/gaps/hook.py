"""The on_gap hook: argv templates, checked and rendered, and running one (own process group, bounded output)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import string
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

OUTPUT_TAIL_CHARS = 500
KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL delay for a timed-out hook's process group
PIPE_DRAIN_S = 2.0  # how long to keep reading output after the hook exited (escaped children)

HOOK_PLACEHOLDERS = frozenset({"agent", "session_id", "transcript", "ended_at", "workspace", "state_time"})

HookStatus = Literal["running", "ok", "failed", "timeout", "spawn_error", "interrupted"]

def validate_hook_template(argv: object) -> None:
    """Raise ValueError (naming the element) unless `argv` is a usable `gaps.on_gap` template.

    Rules: a non-empty list of strings; placeholders are bare names from `HOOK_PLACEHOLDERS`
    (no attribute, index, conversion or format spec; `{{`/`}}` for literal braces); the program
    (element 0) is literal, so no value can choose what runs.
    """
    if not isinstance(argv, list | tuple) or not argv:
        raise ValueError("gaps.on_gap must be a non-empty list of strings (an argv, run without a shell)")
    formatter = string.Formatter()
    allowed = ", ".join("{" + name + "}" for name in sorted(HOOK_PLACEHOLDERS))
    for index, element in enumerate(argv):
        where = f"gaps.on_gap[{index}]"
        if not isinstance(element, str):
            raise ValueError(f"{where} must be a string, got {type(element).__name__}")
        try:
            pieces = list(formatter.parse(element))
        except ValueError as exc:
            raise ValueError(f"{where} = {element!r}: {exc} (write {{{{ and }}}} for literal braces)") from exc
        for _literal, field, spec, conversion in pieces:
            if field is None:
                continue
            if field not in HOOK_PLACEHOLDERS:
                raise ValueError(f"{where} = {element!r}: unknown placeholder {{{field}}}; allowed: {allowed}")
            if spec or conversion:
                raise ValueError(f"{where} = {element!r}: placeholders take no format spec or conversion")
            if index == 0:
                raise ValueError(f"{where} = {element!r}: the program must be literal, not a placeholder")
    if not argv[0]:
        raise ValueError("gaps.on_gap[0] (the program) is empty")


def render_hook_argv(argv: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Substitute placeholders per element. Values are inserted verbatim and never re-parsed,
    so a value containing spaces, quotes, `;`, `$(...)` or `{agent}` stays one literal argument."""
    formatter = string.Formatter()
    rendered: list[str] = []
    for element in argv:
        parts: list[str] = []
        for literal, field, _spec, _conversion in formatter.parse(element):
            parts.append(literal)
            if field is not None:
                parts.append(values[field])
        rendered.append("".join(parts))
    return rendered


@dataclass(frozen=True, slots=True)
class HookResult:
    status: Literal["ok", "failed", "timeout", "spawn_error"]
    exit_status: int | None  # the return code; negative = killed by that signal
    output_tail: str  # last OUTPUT_TAIL_CHARS characters of stdout+stderr
    duration_s: float


class _Tail:
    """Keeps only the last bytes of a stream, so a chatty hook cannot grow memory."""

    def __init__(self, chars: int) -> None:
        self._chars = chars
        self._limit = chars * 4 + 4  # UTF-8: at most 4 bytes a character
        self._buffer = bytearray()

    def add(self, data: bytes) -> None:
        self._buffer.extend(data)
        if len(self._buffer) > self._limit:
            del self._buffer[: len(self._buffer) - self._limit]

    def text(self) -> str:
        return self._buffer.decode("utf-8", errors="replace")[-self._chars :].strip()


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def run_hook(argv: Sequence[str], timeout: float, *, tail_chars: int = OUTPUT_TAIL_CHARS) -> HookResult:
    """Run `argv` (no shell) in its own process group with stdin closed; never raises on failure.

    On timeout the whole group gets SIGTERM, then SIGKILL after `KILL_GRACE_S`. On
    cancellation the group is killed and CancelledError propagates.
    """
    started = time.monotonic()
    tail = _Tail(tail_chars)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # own process group: a timeout kills the hook's children too
        )
    except (OSError, ValueError) as exc:  # not found, not executable, NUL byte in an argument
        return HookResult("spawn_error", None, f"{type(exc).__name__}: {exc}"[-tail_chars:], time.monotonic() - started)

    async def pump() -> None:
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            tail.add(chunk)

    reader = asyncio.create_task(pump())
    timed_out = False
    try:
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            timed_out = True
            _kill_group(process.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), KILL_GRACE_S)
            _kill_group(process.pid, signal.SIGKILL)  # also stragglers that ignored SIGTERM
            await process.wait()
        # A child that left the group may still hold the pipe open: stop reading after a bound.
        with contextlib.suppress(TimeoutError, OSError):
            await asyncio.wait_for(asyncio.shield(reader), PIPE_DRAIN_S)
    except asyncio.CancelledError:
        _kill_group(process.pid, signal.SIGKILL)
        raise
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
    duration = time.monotonic() - started
    code = process.returncode
    if timed_out:
        return HookResult("timeout", code, tail.text(), duration)
    return HookResult("ok" if code == 0 else "failed", code, tail.text(), duration)
