"""structlog set-up: JSON lines to stdout (journald-friendly), console rendering on a TTY.

Event names are stable snake_case identifiers (`entry_stored`, `entry_skipped`, `store_retry`, ...)
so that operators can filter with `jq 'select(.event == "...")'`.
"""

from __future__ import annotations

import functools
import logging
import secrets
import sys
import time
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


# Fields that are ours, never a caller's or a transcript's: not scanned.
_TRUSTED_FIELDS = frozenset({"event", "level", "timestamp", "rule", "fingerprint", "fingerprints", "logger"})
_redact_key = secrets.token_bytes(32)  # until the daemon sets the install's key: fingerprints still keyed


def set_redact_key(key: bytes) -> None:
    """The install's fingerprint key, so that a secret in a log line gets the same marker as in the store."""
    global _redact_key
    _redact_key = key


@functools.lru_cache(maxsize=8192)
def _redacted(text: str, key: bytes) -> str:
    from veritas_watch.transforms.redact import redact

    return redact(text, key).text


ECHO_MAX_CHARS = 16  # a refused value longer than this is described, never shown (not even a cut of it)


def echoed(value: object) -> str:
    """A refused value (an agent id, a session id, a hook's placeholder value) as an error or a log line may
    show it: the repr (control characters escaped) of its redacted form when it is short, else only what it
    is. A long one may be a key pasted in the wrong place, and any cut of a key is a piece of it."""
    if not isinstance(value, str):
        return f"a {type(value).__name__}"
    if len(value) > ECHO_MAX_CHARS:
        return f"a string of {len(value)} characters"
    return repr(_redacted(value, _redact_key))


def _clean(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return _redacted(value, _redact_key) if len(value) < 100_000 else _redacted(value[:100_000], _redact_key)
    if depth < 4 and isinstance(value, (list, tuple)):
        return [_clean(v, depth + 1) for v in value]
    if depth < 4 and isinstance(value, dict):
        return {_clean(k, depth + 1): _clean(v, depth + 1) for k, v in value.items()}
    return value


def redact_event(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Every field a caller or a transcript can fill (session ids, paths, errors, tracebacks) goes through
    the same redaction as message text: no log line carries a secret, whatever field it came in."""
    for name, value in event.items():
        if name not in _TRUSTED_FIELDS:
            event[name] = _clean(value)
    return event


_live_line: TextIO | None = None  # a terminal line being redrawn in place (the backfill progress bar)


def set_live_line(stream: TextIO | None) -> None:
    """While set, each log line first clears `stream`'s current line, so a progress bar drawn there with
    `\\r` is never printed over (the bar redraws itself after the log line)."""
    global _live_line
    _live_line = stream


def _clear_live_line(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    if _live_line is not None:
        _live_line.write("\r\033[K")
        _live_line.flush()
    return event


LIBRARY_LOG_EVERY_S = 10.0  # one line per library message (its template) at most this often
_LIBRARY_LOG_KEYS = 256  # templates remembered; past that the table starts again (bounded memory)


class LibraryRecords(logging.Handler):
    """Other libraries' log records (aiohttp's server on a malformed request, asyncio's unretrieved task
    errors) as one structured line each, redacted like ours, instead of Python's multi-line default; the
    same message at most once per LIBRARY_LOG_EVERY_S, with the count of those it stood for (asyncio logs
    `socket.accept() out of system resource` thousands of times a second when file descriptors run out)."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # (logger, template) -> (logged at, held back)
        self.clock = time.monotonic

    def emit(self, record: logging.LogRecord) -> None:
        try:
            key = (record.name, str(record.msg)[:200])
            now = self.clock()
            logged_at, held = self._last.get(key, (-LIBRARY_LOG_EVERY_S, 0))
            if now - logged_at < LIBRARY_LOG_EVERY_S:
                self._last[key] = (logged_at, held + 1)
                return
            if len(self._last) >= _LIBRARY_LOG_KEYS:
                self._last.clear()
            self._last[key] = (now, 0)
            fields: dict[str, Any] = {"logger": record.name, "message": record.getMessage()[:500]}
            if held:
                fields["repeated"] = held  # lines held back since the last one
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                fields["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            structlog.get_logger().log(record.levelno, "library_log", **fields)
        except Exception:  # a log line must never take the daemon down
            self.handleError(record)


def _route_library_logs() -> None:
    root = logging.getLogger()
    if not any(isinstance(h, LibraryRecords) for h in root.handlers):
        root.addHandler(LibraryRecords(logging.WARNING))
    # A library's `warnings.warn` too (watchdog warns when a directory it is adding a watch for is added
    # twice in a race): through logging, so one JSON line, not Python's two lines on stderr (a full suite run
    # caught one among the daemon's JSON).
    logging.captureWarnings(True)


def configure_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    use_console = fmt == "console" or (fmt == "auto" and out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer(ensure_ascii=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_event,
            _clear_live_line,  # last before rendering: only lines that are printed clear the bar
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    _route_library_logs()


def set_level(level: str) -> None:
    """Change the level at run time (SIGHUP reload) without touching the rest of the set-up."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)))
