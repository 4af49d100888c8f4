"""structlog set-up: JSON lines to stdout (journald-friendly), console rendering on a TTY.

Event names are stable snake_case identifiers (`entry_stored`, `entry_skipped`, `store_retry`, ...)
so that operators can filter with `jq 'select(.event == "...")'`.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


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
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def set_level(level: str) -> None:
    """Change the level at run time (SIGHUP reload) without touching the rest of the set-up."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)))
