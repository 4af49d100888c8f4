"""The on_gap hook: argv templates, checked and rendered; the values checked before they reach it; running one
(own process group, bounded output).

A hook runs values, never code: each value is checked by OpenClaw's own rules first (`refuse_hook_values`), goes
in as one argv element and as an environment variable (`HOOK_ENV`), and a template that would put one inside an
interpreter's code (`sh -c '... {session_id}'`, `python -c`, `node -e`, ...) is refused when the config loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import string
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from veritas_watch.log import echoed
from veritas_watch.openclaw import (
    InvalidAgentId,
    canonical_agent_id,
    is_valid_session_id,
    session_transcript_name,
)

OUTPUT_TAIL_CHARS = 500
KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL delay for a timed-out hook's process group
PIPE_DRAIN_S = 2.0  # how long to keep reading output after the hook exited (escaped children)

HOOK_PLACEHOLDERS = frozenset({"agent", "session_id", "transcript", "ended_at", "workspace", "state_time"})
# Each value also reaches the hook as an environment variable: a script reads "$VERITAS_GAP_SESSION_ID"
# instead of having it pasted into its code.
HOOK_ENV = {name: f"VERITAS_GAP_{name.upper()}" for name in sorted(HOOK_PLACEHOLDERS)}

HookStatus = Literal["running", "ok", "failed", "timeout", "spawn_error", "interrupted", "refused"]

# Programs whose arguments can be code. A family says which arguments: `shell` the first operand (the `-c`
# command string, or the script), `python` `-c CODE` / `-m MODULE` or the script, `code` (node, perl,
# ruby, php, awk) each code option's argument and, when none, the script or program operand; `dash_c`
# (su, runuser, flock, script) the argument of `-c` / `--command`; `all` (watch: runs its arguments through
# `sh -c`) every argument; `env` its `-S` / `--split-string` string (split into more arguments).
_FAMILIES: dict[str, str] = {
    **dict.fromkeys(("sh", "bash", "rbash", "dash", "zsh", "ksh", "mksh", "lksh", "oksh", "pdksh", "ash", "yash",
                     "posh", "fish", "csh", "tcsh"), "shell"),
    **dict.fromkeys(("python", "pypy"), "python"),
    **dict.fromkeys(("node", "nodejs", "bun", "deno", "perl", "ruby", "php", "awk", "gawk", "mawk", "nawk"), "code"),
    **dict.fromkeys(("su", "runuser", "flock", "script"), "dash_c"),
    "watch": "all",
    "env": "env",
}
_CODE_OPTIONS = frozenset({"-e", "-E", "--eval", "-p", "--print", "-r", "--require", "--import", "--loader",
                           "--experimental-loader", "-M", "-m", "-B", "-R", "-F", "-f", "--file", "--source"})
_ARG_OPTIONS = {  # options whose argument is a separate element but not code
    "shell": frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file", "-C", "--init-command"}),
    "python": frozenset({"-W", "-X", "-Q"}),
    "code": frozenset({"-I", "-v", "-d", "-C"}),
}
_PROGRAM_NAME = re.compile(r"([a-z]+?)[0-9.]*(?:\.exe)?", re.ASCII)


def _family(element: str) -> str | None:
    name = _PROGRAM_NAME.fullmatch(os.path.basename(element).lower())
    return _FAMILIES.get(name[1]) if name else None


def _code_elements(argv: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(index, program) of each element an interpreter named in `argv` reads as code (or as the script it
    runs), and the options before it. Any element up to the first interpreter may name one (`env bash -c`,
    `busybox sh -c`, `nice python -c`): scanning them all errs on the side of refusing."""
    for start, program in enumerate(argv):
        family = _family(program)
        if family is None:
            continue
        rest = range(start + 1, len(argv))
        if family == "all":
            yield from ((i, program) for i in rest)
        elif family == "env":
            for i in rest:
                if argv[i] in ("-S", "--split-string") and i + 1 < len(argv):
                    yield i + 1, program
                elif argv[i].startswith(("-S", "--split-string=")):
                    yield i, program
        elif family == "dash_c":
            for i in rest:
                if argv[i] in ("-c", "--command") and i + 1 < len(argv):
                    yield i + 1, program
                elif argv[i].startswith("--command="):
                    yield i, program
        else:
            yield from ((i, program) for i in _options_and_code(argv, start + 1, family))
            return  # what follows its code is the code's data (`sh -c '...' sh "{x}"`: that `sh` is $0)


def _options_and_code(argv: Sequence[str], first: int, family: str) -> Iterator[int]:
    """An interpreter's options (and their arguments) up to and including its code: what must not hold a value.
    After that come the code's own arguments (`sh -c '...' sh ARG`, `python -c '...' ARG`): values may go there."""
    takes = _ARG_OPTIONS.get(family, frozenset())
    code_seen = False
    i = first
    while i < len(argv):
        element = argv[i]
        if element == "--":
            yield i
            if i + 1 < len(argv) and not code_seen:
                yield i + 1  # the script
            return
        if not (len(element) > 1 and (element[0] == "-" or (element[0] == "+" and family == "shell"))):
            if not code_seen:
                yield i  # the shell's command string or script, the python script, the program operand
            return
        yield i
        short = "" if element.startswith("--") else element[1:]  # a cluster such as `-ec` ends with its last flag
        code = ((family == "python" and short[-1:] in ("c", "m"))
                or (family == "code" and (element in _CODE_OPTIONS or f"-{short[-1:]}" in _CODE_OPTIONS)))
        if not (code or element in takes):
            i += 1
            continue
        if i + 1 < len(argv):
            yield i + 1
        if family == "python" and code:
            return  # `-c CODE`, `-m MODULE`: what follows is the code's argv
        code_seen = code_seen or code
        i += 2


def _placeholders(where: str, element: str) -> list[str]:
    try:
        pieces = list(string.Formatter().parse(element))
    except ValueError as exc:
        raise ValueError(f"{where} = {element!r}: {exc} (write {{{{ and }}}} for literal braces)") from exc
    return [field for _literal, field, _spec, _conversion in pieces if field is not None]


def validate_hook_template(argv: object) -> None:
    """Raise ValueError (naming the element) unless `argv` is a usable `gaps.on_gap` template.

    Rules: a non-empty list of strings; placeholders are bare names from `HOOK_PLACEHOLDERS`
    (no attribute, index, conversion or format spec; `{{`/`}}` for literal braces); the program
    (element 0) is literal, so no value can choose what runs; and no placeholder where an interpreter
    reads code (a shell's `-c` string or script, `python -c`, `node -e`, `perl -e`, `env -S`, ...): a
    value there would run as code. A script reads the values from its environment (`HOOK_ENV`) instead.
    """
    if not isinstance(argv, list | tuple) or not argv:
        raise ValueError("gaps.on_gap must be a non-empty list of strings (an argv, run without a shell)")
    formatter = string.Formatter()
    allowed = ", ".join("{" + name + "}" for name in sorted(HOOK_PLACEHOLDERS))
    for index, element in enumerate(argv):
        where = f"gaps.on_gap[{index}]"
        if not isinstance(element, str):
            raise ValueError(f"{where} must be a string, got {type(element).__name__}")
        _placeholders(where, element)
        for _literal, field, spec, conversion in formatter.parse(element):
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
    for index, program in _code_elements(argv):
        if fields := _placeholders(f"gaps.on_gap[{index}]", argv[index]):
            names = ", ".join(f"${HOOK_ENV[f]}" for f in dict.fromkeys(fields))
            raise ValueError(
                f"gaps.on_gap[{index}] = {argv[index]!r}: {os.path.basename(program)} reads this argument as code "
                f"(or the options before it), so a value in it would run as code. Read the value from the "
                f"environment instead ({names}: the hook gets each value as VERITAS_GAP_*), or pass it as a "
                "separate argument the program does not run")


# -- the values, checked before they reach a hook

_INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z", re.ASCII)  # zones.format_instant's form
_SEQ = re.compile(r"[0-9]{1,19}", re.ASCII)


def _normal(path: str | Path) -> Path:
    return Path(os.path.normpath(path))  # lexical (`..` collapsed), no symlink followed: as the sources name paths


@dataclass(frozen=True, slots=True)
class HookPlaces:
    """Where an agent's hook values may point, as OpenClaw's config says now (`HookPlaces.of` normalizes)."""

    workspace: Path  # the agent's workspace, resolved (openclaw.agent_workspace)
    transcript_dirs: frozenset[Path]  # its sessions dir and its databases' archive dirs
    databases: frozenset[Path]  # its transcript databases (openclaw.transcript_dbs)

    @classmethod
    def of(cls, workspace: Path, transcript_dirs: Iterable[Path], databases: Iterable[Path]) -> HookPlaces:
        return cls(_normal(workspace), frozenset(map(_normal, transcript_dirs)), frozenset(map(_normal, databases)))


@dataclass(frozen=True, slots=True)
class HookRefusal:
    field: str  # the placeholder whose value was refused
    reason: str  # why, with the value shown only as `log.echoed` shows one (short, redacted)


def _transcript_refusal(value: str, places: HookPlaces | None) -> str | None:
    """A transcript is a file OpenClaw named (`<sessions>/<id>.jsonl[.reset.<ts>][.zst]`) or a session of a
    transcript database (`<db>#<session id>[:<seq>]`); with `places`, one of this agent's."""
    if not os.path.isabs(value):
        return "not an absolute path"
    database, mark, where = value.rpartition("#")
    if mark and database.endswith(".sqlite"):
        session, colon, seq = where.partition(":")
        if not is_valid_session_id(session) or (colon and not _SEQ.fullmatch(seq)):
            return "not <database>#<OpenClaw session id>[:<seq>]"
        if places is not None and _normal(database) not in places.databases:
            return "not one of the agent's transcript databases"
        return None
    path = Path(value)
    if session_transcript_name(path.name) is None:
        return "not a transcript name OpenClaw gives (<session id>.jsonl, archived or compressed)"
    if places is not None and _normal(path.parent) not in places.transcript_dirs:
        return "not in the agent's sessions directory"
    return None


def refuse_hook_values(values: Mapping[str, str], places: HookPlaces | None = None) -> HookRefusal | None:
    """The first value that may not reach a hook, and why; None if all may. Checked by OpenClaw's rules:
    the agent id (`canonical_agent_id`: already canonical), the session id (`validateSessionId`), the
    transcript (a name OpenClaw gives; with `places` inside the agent's sessions dir or one of its
    databases), the workspace (absolute; with `places` the one OpenClaw resolves now), the instants (the
    ISO 8601 form we write). None of those can start with `-` (an option to the hook): checked last anyway."""

    def refusal(name: str, reason: str) -> HookRefusal:
        return HookRefusal(name, f"{echoed(values[name])}: {reason}")

    agent = values["agent"]
    try:
        if canonical_agent_id(agent) != agent:
            return refusal("agent", "not an agent id in OpenClaw's normal form")
    except InvalidAgentId:
        return refusal("agent", "not an OpenClaw agent id")
    if not is_valid_session_id(values["session_id"]):
        return refusal("session_id", "not an OpenClaw session id (validateSessionId)")
    if reason := _transcript_refusal(values["transcript"], places):
        return refusal("transcript", reason)
    workspace = values["workspace"]
    if not os.path.isabs(workspace) or (places is not None and _normal(workspace) != places.workspace):
        return refusal("workspace", "not the agent's workspace as OpenClaw resolves it")
    if not _INSTANT.fullmatch(values["ended_at"]):
        return refusal("ended_at", "not an ISO 8601 instant")
    if values["state_time"] and not _INSTANT.fullmatch(values["state_time"]):
        return refusal("state_time", "not an ISO 8601 instant")
    for name in sorted(HOOK_PLACEHOLDERS):  # never reached by the rules above: the last line of defence
        if values[name].startswith("-") or "\0" in values[name]:
            return refusal(name, "starts with '-' (would be read as an option) or holds a NUL")
    return None


def hook_environment(values: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The hook's environment: the daemon's (`base`, default ours), plus each value as `HOOK_ENV` names it."""
    env = dict(os.environ if base is None else base)
    env.update({HOOK_ENV[name]: values[name] for name in HOOK_PLACEHOLDERS})
    return env


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


async def run_hook(argv: Sequence[str], timeout: float, *, tail_chars: int = OUTPUT_TAIL_CHARS,
                   env: Mapping[str, str] | None = None) -> HookResult:
    """Run `argv` (no shell) in its own process group with stdin closed, in `env` (default: ours); never
    raises on failure.

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
            env=None if env is None else dict(env),
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
