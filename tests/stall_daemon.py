"""Test entry point: the real daemon (`veritas-watch run`), but every store write blocks while a flag file exists.

A stall honestly placed where a hung store hangs the pipeline: inside `Store.upsert`, in the store
thread, after the sink has taken a batch. Run as `python -m tests.stall_daemon` with
VERITAS_TEST_STALL_FLAG=<path>; everything else is configured as for `veritas-watch run`. With
VERITAS_TEST_SLOW_UPSERT=<seconds>, every write also takes that long (a store that answers, slowly: a loaded machine).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from veritas_watch import log as logsetup
from veritas_watch.config import load_config
from veritas_watch.daemon import Daemon
from veritas_watch.sinks.store import Store, StoredPoint

MAX_STALL_SECONDS = 120  # a forgotten flag must not hang a test run forever


class BlockingStore:
    def __init__(self, inner: Store, flag: Path, slow: float = 0.0) -> None:
        self._inner = inner
        self._flag = flag
        self._slow = slow

    def upsert(self, points: Sequence[StoredPoint]) -> None:
        deadline = time.monotonic() + MAX_STALL_SECONDS
        while self._flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(self._slow)
        self._inner.upsert(points)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def main() -> int:
    flag = Path(os.environ["VERITAS_TEST_STALL_FLAG"])
    slow = float(os.environ.get("VERITAS_TEST_SLOW_UPSERT", "0"))
    config = load_config()
    logsetup.configure_logging(config.log.level, config.log.format, stream=sys.stdout)
    daemon = Daemon(config, wrap_store=lambda store: BlockingStore(store, flag, slow),  # type: ignore[arg-type,return-value]
                    owns_process=True)
    return asyncio.run(daemon.run())


if __name__ == "__main__":
    sys.exit(main())
