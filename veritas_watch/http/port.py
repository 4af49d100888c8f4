"""What the HTTP routes ask of the daemon, as small typed protocols: the http package imports nothing of
the daemon, and the daemon side (`daemon.Running`, the started daemon) implements them. A leaf.

- `Served`: the running daemon as the routes see it: its config, its one `Snapshot` (status, /health,
  /metrics, the STATUS line and the progress bar all render it), the status JSON, the metrics text, its
  memory and the credential capture;
- `Memory`: the store and the model, each used on its own thread (`pipeline.Sink` is one);
- `Capture`: where a credential told to `/memory/add` is indexed (`features.capture`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from veritas_watch.config import Config
    from veritas_watch.embedding import Embedder
    from veritas_watch.pipeline import Found
    from veritas_watch.sinks.store import Store
    from veritas_watch.snapshot import Snapshot

T = TypeVar("T")


class Memory(Protocol):
    """The store and the model. Searches embed on the query thread and read on a read thread (the write
    path's store thread never waits for them); `/memory/add` embeds on the write path's embed thread and
    writes through the store thread."""

    @property
    def store(self) -> Store: ...

    @property
    def embedder(self) -> Embedder: ...

    async def in_embed_thread(self, fn: Callable[[], T]) -> T: ...

    async def in_query_thread(self, fn: Callable[[], T]) -> T: ...

    async def in_read_thread(self, fn: Callable[[], T]) -> T: ...

    async def in_store_thread(self, fn: Callable[[], T]) -> T: ...


class Capture(Protocol):
    """Credentials found in what a caller adds: indexed before anything is stored."""

    @property
    def keeps_values(self) -> bool: ...

    def capture(self, found: Sequence[Found]) -> None: ...


class Served(Protocol):
    """The running daemon (start-up finished: the store and the model are open). Until the app has one,
    every route but /health answers 503 "daemon starting"."""

    @property
    def config(self) -> Config: ...

    @property
    def memory(self) -> Memory: ...

    @property
    def capture(self) -> Capture: ...

    @property
    def redact_key(self) -> bytes: ...

    def snapshot(self) -> Snapshot: ...

    async def status(self) -> dict[str, Any]: ...

    def metrics_text(self) -> bytes: ...
