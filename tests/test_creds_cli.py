"""`veritas-watch creds` and `creds find`: where a key is, masked, never the value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "VERITAS_WATCH_DATA_DIR": str(tmp_path / "data"),
           "VERITAS_WATCH_CONFIG": str(tmp_path / "c.toml"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "veritas_watch.cli", "creds", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_creds_lists_the_index_and_find_searches_env_files(tmp_path: Path) -> None:
    value = "sk-" + "abcdef0123456789abcdef0123456789"
    (tmp_path / "state" / "agents" / "ops" / "sessions").mkdir(parents=True)
    workspace = tmp_path / "state" / "workspace-ops"
    workspace.mkdir()
    (workspace / "CREDENTIALS_INDEX.md").write_text("| Service | Key Name | Location | Status |\n|---|---|---|---|\n"
                                                    "| DeepSeek | DEEPSEEK_API_KEY | chat | captured |\n")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / ".env").write_text(f"DEEPSEEK_API_KEY={value}\n")
    (tmp_path / "c.toml").write_text(f'[credentials]\nenv_dirs = ["{tmp_path / "proj"}"]\n')

    listing = run(tmp_path)
    assert listing.returncode == 0 and "DEEPSEEK_API_KEY" in listing.stdout and "ops" in listing.stdout
    found = run(tmp_path, "find", "deepseek")
    assert found.returncode == 0
    assert f"{tmp_path / 'proj' / '.env'}:1" in found.stdout
    assert value not in found.stdout and value[:12] not in found.stdout
    revealed = run(tmp_path, "find", "deepseek", "--reveal")  # not a terminal: still masked
    assert value not in revealed.stdout
    assert run(tmp_path, "find", "nosuchservice").returncode == 1


def test_find_names_each_index_rows_agent_and_where_a_vaulted_value_is(tmp_path: Path) -> None:
    import json

    for agent in ("ops", "dev"):
        (tmp_path / "state" / "agents" / agent / "sessions").mkdir(parents=True)
        (tmp_path / "state" / f"workspace-{agent}").mkdir()
    (tmp_path / "state" / "workspace-ops" / "CREDENTIALS_INDEX.md").write_text(
        "| Service | Key Name | Location | Status |\n|---|---|---|---|\n"
        "| Stripe | STRIPE_KEY | chat; vault:/data/credentials.vault#3 | captured |\n")
    (tmp_path / "state" / "workspace-dev" / "CREDENTIALS_INDEX.md").write_text(
        "| Service | Key Name | Location | Status |\n|---|---|---|---|\n"
        "| Stripe | STRIPE_KEY | chat | captured |\n")
    (tmp_path / "c.toml").write_text("")

    found = run(tmp_path, "find", "stripe", "--json")
    assert found.returncode == 0, found.stderr
    rows = {row["agent"]: row for row in json.loads(found.stdout)}
    assert rows["ops"]["masked"] == "(in the vault)"
    assert rows["dev"]["masked"] == "(not stored)"
    text = run(tmp_path, "find", "stripe").stdout
    assert "index:ops\t" in text and "index:dev\t" in text
    only = json.loads(run(tmp_path, "--agent", "dev", "find", "stripe", "--json").stdout)
    assert [row["agent"] for row in only] == ["dev"]
