"""CREDENTIALS_INDEX.md, the age vault and the multi-source credential lookup, on real files."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

import pyrage
import pytest

from veritas_watch.features import credentials
from veritas_watch.features.credentials import (
    INDEX_FILE,
    CredentialIndex,
    Vault,
    VaultError,
    find_credential,
    followed,
    mask,
    read_index,
    workspace_for,
)
from veritas_watch.model import SecretFinding
from veritas_watch.transforms.redact import fingerprint, redact

KEY = b"test-fingerprint-key-0123456789ab"


def finding(n: int, service: str = "DeepSeek", key_name: str = "DEEPSEEK_API_KEY") -> SecretFinding:
    return SecretFinding("deepseek_api_key", service, key_name, f"{n:08x}", 0, 10)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---------------------------------------------------------------------------------------------
# Workspace resolution


def test_workspace_defaults(tmp_path: Path) -> None:
    state = tmp_path / ".openclaw"
    assert workspace_for(state, "main", None) == state / "workspace"
    assert workspace_for(state, "Main", {}) == state / "workspace"
    assert workspace_for(state, "ops", None) == state / "workspace-ops"


def test_workspace_from_openclaw_json(tmp_path: Path) -> None:
    state = tmp_path / ".openclaw"
    home = tmp_path / "home"
    config = {
        "agents": {
            "defaults": {"workspace": "~/agents"},
            "list": [
                {"id": "ops", "default": True},
                {"id": "writer", "workspace": "~/writing"},
                {"id": "coder", "workspace": "/srv/code-ws"},
                {"id": "rel", "workspace": "rel-ws"},
                {"id": "main"},
            ],
        }
    }
    assert workspace_for(state, "writer", config, home=home) == home / "writing"
    assert workspace_for(state, "coder", config, home=home) == Path("/srv/code-ws")
    assert workspace_for(state, "rel", config, home=home) == state / "rel-ws"
    # the default agent (marked default, not necessarily "main") takes defaults.workspace itself
    assert workspace_for(state, "ops", config, home=home) == home / "agents"
    # other agents get <defaults.workspace>/<id>
    assert workspace_for(state, "main", config, home=home) == home / "agents" / "main"
    without_defaults = {"agents": {"list": [{"id": "ops", "default": True}, {"id": "main"}]}}
    assert workspace_for(state, "ops", without_defaults) == state / "workspace"
    assert workspace_for(state, "main", without_defaults) == state / "workspace-main"


def test_workspace_with_profile(tmp_path: Path) -> None:
    home = tmp_path / "home"
    state = home / ".openclaw-desktop"
    # 2026.9: `~/.openclaw-<profile>/workspace` (earlier versions: `~/.openclaw/workspace-<profile>`, which
    # `openclaw doctor` moves there).
    assert workspace_for(state, "main", None, profile="desktop") == home / ".openclaw-desktop" / "workspace"
    assert workspace_for(state, "main", None, profile="desktop", home=home) == home / ".openclaw-desktop" / "workspace"
    assert workspace_for(state, "main", None, profile="default", home=home) == home / ".openclaw" / "workspace"
    assert workspace_for(state, "ops", None, profile="desktop") == state / "workspace-ops"


# ---------------------------------------------------------------------------------------------
# The index


def test_index_created_with_table_mode_0600_and_no_values(tmp_path: Path) -> None:
    deepseek = "sk-3f9a1c2e8b7d6a5f4e3d2c1b0a9f8e7d"
    text = f"here is the TokenMall key: tm-8f7a9c2b4d6e1f3a5b7c9d0e2f4a6b8c and export DEEPSEEK_API_KEY={deepseek}"
    result = redact(text, KEY)
    workspace = tmp_path / "workspace"
    workspace.mkdir()  # OpenClaw creates the workspace; the index never does
    added = CredentialIndex().record(
        workspace, result.findings, "agents/main/sessions/s1.jsonl:12", "2026-03-17T07:08:00Z", None
    )
    assert added == 2
    path = workspace / INDEX_FILE
    assert mode_of(path) == 0o600
    content = path.read_text(encoding="utf-8")
    assert "| Service | Key Name | Location | Status | First Seen | Fingerprint |" in content
    assert "tm-8f7a9c2b" not in content and deepseek[:12] not in content
    rows = read_index(path)
    assert [(r.service, r.key_name, r.status, r.fingerprint) for r in rows] == [
        (f.service, f.key_name, "captured", f.fingerprint) for f in result.findings
    ]
    assert rows[0].service == "TokenMall"
    assert all(
        r.location == "agents/main/sessions/s1.jsonl:12" and r.first_seen == "2026-03-17T07:08:00Z" for r in rows
    )
    assert [p.name for p in workspace.iterdir()] == [INDEX_FILE]  # no temp or lock files left behind


def test_index_dedups_by_fingerprint_and_leaves_the_file_alone(tmp_path: Path) -> None:
    index = CredentialIndex()
    assert index.record(tmp_path, [finding(1), finding(1), finding(2)], "a.jsonl:1", "t1", None) == 2
    path = tmp_path / INDEX_FILE
    inode = path.stat().st_ino
    assert index.record(tmp_path, [finding(2), finding(1)], "b.jsonl:9", "t2", None) == 0
    assert path.stat().st_ino == inode  # nothing new: not rewritten
    assert index.record(tmp_path, [finding(3), finding(1)], "c.jsonl:3", "t3", "vault:/v#3") == 1
    rows = read_index(path)
    assert [r.fingerprint for r in rows] == ["00000001", "00000002", "00000003"]
    assert rows[2].location == "c.jsonl:3; vault:/v#3"


HUMAN_FILE = """# My credentials

Keep this list current. Rotate quarterly.

| Service | Key Name | Location | Status |
|---------|----------|----------|--------|
| GitHub | GITHUB_TOKEN | 1Password: Dev vault | active, rotated 2026-01 |
| Stripe | STRIPE_SECRET_KEY | /etc/stripe.env | revoked |

## Notes
Ask Ana before touching the Stripe key.
"""


def test_index_preserves_human_rows_and_text(tmp_path: Path) -> None:
    path = tmp_path / INDEX_FILE
    path.write_text(HUMAN_FILE, encoding="utf-8")
    index = CredentialIndex()
    assert index.record(tmp_path, [finding(7)], "s.jsonl:4", "t", None) == 1
    content = path.read_text(encoding="utf-8")
    lines = content.splitlines()
    human = HUMAN_FILE.splitlines()
    assert lines[:4] == human[:4]  # text before the table
    assert lines[6:8] == human[6:8]  # the human's rows, byte for byte
    assert lines[4] == "| Service | Key Name | Location | Status | First Seen | Fingerprint |"
    assert lines[8].startswith("| DeepSeek | DEEPSEEK_API_KEY | s.jsonl:4 | captured | t | 00000007 |")
    assert lines[9:] == human[8:]  # text after the table
    assert mode_of(path) == 0o600
    # a human edits our row (status) and adds their own; the next update keeps both
    edited = content.replace("| captured | t | 00000007 |", "| rotated | t | 00000007 |")
    edited = edited.replace("| Stripe |", "| AWS | AWS_ACCESS_KEY_ID | ~/.aws/credentials | active | | |\n| Stripe |")
    path.write_text(edited, encoding="utf-8")
    assert index.record(tmp_path, [finding(7), finding(8)], "s.jsonl:5", "t2", None) == 1
    new_row = "| DeepSeek | DEEPSEEK_API_KEY | s.jsonl:5 | captured | t2 | 00000008 |\n"
    assert path.read_text(encoding="utf-8") == edited.replace("|\n\n## Notes", "|\n" + new_row + "\n## Notes")


class RacingHumanIndex(CredentialIndex):
    """Saves a human edit to the file after the index read it, before it renames its update."""

    edits = 0

    def _with_rows(self, text: str, findings: Sequence[SecretFinding], where: str, seen_at: str) -> tuple[str, int]:
        result = super()._with_rows(text, findings, where, seen_at)
        if self.edits == 0:
            self.edits += 1
            path = self.workspace / INDEX_FILE
            path.write_text(path.read_text(encoding="utf-8") + "human note written mid-update\n", encoding="utf-8")
        return result

    workspace = Path()


def test_a_human_save_during_an_update_is_not_lost(tmp_path: Path) -> None:
    CredentialIndex().record(tmp_path, [finding(1)], "a:1", "t", None)
    racing = RacingHumanIndex()
    racing.workspace = tmp_path
    assert racing.record(tmp_path, [finding(2)], "a:2", "t", None) == 1
    content = (tmp_path / INDEX_FILE).read_text(encoding="utf-8")
    assert "human note written mid-update" in content
    assert [r.fingerprint for r in read_index(tmp_path / INDEX_FILE)] == ["00000001", "00000002"]


def test_index_appends_a_table_to_a_file_without_one(tmp_path: Path) -> None:
    path = tmp_path / INDEX_FILE
    path.write_text("Just some notes, no table yet.", encoding="utf-8")
    CredentialIndex().record(tmp_path, [finding(1)], "x:1", "t", None)
    content = path.read_text(encoding="utf-8")
    assert content.startswith("Just some notes, no table yet.\n\n| Service | Key Name |")
    assert len(read_index(path)) == 1


def test_index_cells_escape_pipes_and_newlines(tmp_path: Path) -> None:
    odd = SecretFinding("token_cue", "Weird|Svc\nName", "key", "0000abcd", 0, 1)
    CredentialIndex().record(tmp_path, [odd], "file|with|pipes.jsonl:1", "t", None)
    (row,) = read_index(tmp_path / INDEX_FILE)
    assert row.service == "Weird|Svc Name"
    assert row.location == "file|with|pipes.jsonl:1"
    assert row.fingerprint == "0000abcd"


def test_failed_write_leaves_the_old_index_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = CredentialIndex()
    index.record(tmp_path, [finding(1)], "a:1", "t", None)
    path = tmp_path / INDEX_FILE
    before = path.read_bytes()

    def failing_replace(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        index.record(tmp_path, [finding(2)], "a:2", "t", None)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [INDEX_FILE]


def _record_many(workspace: str, start: int, count: int) -> None:
    index = CredentialIndex()
    for n in range(start, start + count):
        # overlapping ranges across workers: every fingerprint must still end up exactly once
        index.record(Path(workspace), [finding(n), finding(n + 1)], f"w{start}.jsonl:{n}", "t", None)


def test_concurrent_processes_and_threads_lose_nothing_and_duplicate_nothing(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), start, 20)) for start in (0, 10, 20, 30)]
    threads = [threading.Thread(target=_record_many, args=(str(tmp_path), start, 20)) for start in (5, 25)]
    for proc in procs:
        proc.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    fps = [r.fingerprint for r in read_index(tmp_path / INDEX_FILE)]
    assert sorted(fps) == [f"{n:08x}" for n in range(0, 51)]


def _reader(path: str, stop: threading.Event, errors: list[str]) -> None:
    while not stop.is_set():
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        lines = text.splitlines()
        if not text.endswith("\n") or any(line.startswith("|") and not line.endswith("|") for line in lines):
            errors.append(text[-80:])


def test_readers_never_see_a_half_written_index(tmp_path: Path) -> None:
    stop = threading.Event()
    errors: list[str] = []
    reader = threading.Thread(target=_reader, args=(str(tmp_path / INDEX_FILE), stop, errors))
    reader.start()
    try:
        index = CredentialIndex()
        for n in range(60):
            index.record(tmp_path, [SecretFinding("r", "S" * 300, "K", f"{n:08x}", 0, 1)], "loc:1", "t", None)
    finally:
        stop.set()
        reader.join()
    assert errors == []
    assert len(read_index(tmp_path / INDEX_FILE)) == 60


# ---------------------------------------------------------------------------------------------
# The vault


def test_vault_round_trip_with_a_test_identity(tmp_path: Path) -> None:
    identity = pyrage.x25519.Identity.generate()
    path = tmp_path / "vault" / "secrets.age.jsonl"
    vault = Vault(str(identity.to_public()), path)
    value_a = "sk-" + "0123456789abcdef" * 2
    value_b = "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    ref_a = vault.append(value_a, fingerprint=fingerprint(value_a, KEY), rule="deepseek_api_key", service="DeepSeek")
    ref_b = vault.append(value_b, fingerprint=fingerprint(value_b, KEY), rule="github_personal_access_token")
    assert ref_a == f"vault:{path}#1" and ref_b == f"vault:{path}#2"
    # the same value again keeps its entry
    assert vault.append(value_a, fingerprint=fingerprint(value_a, KEY)) == ref_a
    assert mode_of(path) == 0o600
    raw = path.read_text(encoding="utf-8")
    for value in (value_a, value_b):
        assert not any(value[i : i + 12] in raw for i in range(len(value) - 11))
    entries = [json.loads(line) for line in raw.splitlines()]
    assert [e["n"] for e in entries] == [1, 2]
    decrypted = [json.loads(pyrage.decrypt(e["age"].encode(), [identity])) for e in entries]
    assert [d["value"] for d in decrypted] == [value_a, value_b]
    assert decrypted[0]["service"] == "DeepSeek"
    with pytest.raises(pyrage.DecryptError):
        pyrage.decrypt(entries[0]["age"].encode(), [pyrage.x25519.Identity.generate()])


def test_vault_rejects_a_bad_recipient(tmp_path: Path) -> None:
    with pytest.raises(VaultError):
        Vault("age1notavalidrecipient", tmp_path / "v")
    with pytest.raises(VaultError):
        Vault("hunter2", tmp_path / "v")


# ---------------------------------------------------------------------------------------------
# Lookup


def test_mask_shows_no_character_of_the_value() -> None:
    value = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH"
    plain = mask(value)
    assert plain == f"****({len(value)} chars)"
    keyed = mask(value, KEY)
    assert keyed == f"****({len(value)} chars, fp {fingerprint(value, KEY)})"
    assert "sk" not in keyed and value[-4:] not in keyed


def test_find_credential_in_protocol_order(tmp_path: Path) -> None:
    value_env = "sk-" + "11aa" * 8
    value_nested = "sk-" + "22bb" * 8
    value_etc = "dk-33cc33cc33cc33cc"
    value_proc = "sk-" + "44dd" * 8
    workspace = tmp_path / "workspace"
    workspace.mkdir()  # OpenClaw creates the workspace; the index never does
    CredentialIndex().record(workspace, [finding(9)], "agents/main/sessions/s.jsonl:3", "t", None)
    project = tmp_path / "proj"
    (project / "svc" / "api").mkdir(parents=True)
    (project / "node_modules" / "pkg").mkdir(parents=True)
    (project / ".env").write_text(
        f"# keys\nexport DEEPSEEK_API_KEY={value_env}\nDEEPSEEK_BASE_URL=https://api.deepseek.com\n"
        "OPENAI_API_KEY=sk-other\n",
        encoding="utf-8",
    )
    (project / "svc" / "api" / ".env.local").write_text(f'DEEPSEEK_KEY="{value_nested}"\n', encoding="utf-8")
    (project / ".env.example").write_text("DEEPSEEK_API_KEY=your_key_here\n", encoding="utf-8")
    (project / "node_modules" / "pkg" / ".env").write_text("DEEPSEEK_API_KEY=sk-vendored\n", encoding="utf-8")
    etc = tmp_path / "environment"
    etc.write_text(f'PATH="/usr/bin"\nDEEPSEEK_TOKEN="{value_etc}"\n', encoding="utf-8")
    found = find_credential(
        "deepseek",
        index_paths=[workspace / INDEX_FILE, tmp_path / "missing" / INDEX_FILE],
        env_dirs=[project],
        units=["veritas-watch-test-no-such-unit.service"],
        environ={"DEEPSEEK_API_KEY": value_proc, "HOME": "/root"},
        etc_environment=etc,
        fingerprint_key=KEY,
    )
    assert [(c.source, c.key_name) for c in found] == [
        ("index", "DEEPSEEK_API_KEY"),
        ("env_file", "DEEPSEEK_API_KEY"),
        ("env_file", "DEEPSEEK_KEY"),
        ("etc_environment", "DEEPSEEK_TOKEN"),
        ("process_env", "DEEPSEEK_API_KEY"),
    ]
    assert found[0].where == "agents/main/sessions/s.jsonl:3" and found[0].fingerprint == "00000009"
    assert found[1].where == f"{project / '.env'}:2"
    assert found[2].where == f"{project / 'svc' / 'api' / '.env.local'}:1"
    for location, value in zip(found[1:], (value_env, value_nested, value_etc, value_proc), strict=True):
        assert location.masked == mask(value, KEY)
        assert location.fingerprint == fingerprint(value, KEY)
        assert location.value is None
        assert value[:4] not in repr(location)
    revealed = find_credential("DeepSeek", environ={"DEEPSEEK_API_KEY": value_proc}, etc_environment=etc, reveal=True)
    assert [c.value for c in revealed] == [value_etc, value_proc]
    assert value_proc not in repr(revealed)


def test_find_credential_reads_systemd_units_when_systemctl_exists(tmp_path: Path) -> None:
    # No unit can be installed from a test; what is checked is that a missing systemctl or a
    # missing unit is skipped quietly and the other sources still answer.
    found = find_credential(
        "github",
        units=["no-such-unit-for-veritas-tests.service"],
        environ={"GITHUB_TOKEN": "ghp_x1y2z3"},
        etc_environment=tmp_path / "none",
    )
    assert [(c.source, c.key_name) for c in found] == [("process_env", "GITHUB_TOKEN")]


def test_unit_environment_lines_are_parsed(tmp_path: Path) -> None:
    env_file = tmp_path / "unit.env"
    env_file.write_text("STRIPE_SECRET_KEY=sk_live_abc123def456\n", encoding="utf-8")
    fake = tmp_path / "systemctl"
    fake.write_text(
        "#!/bin/sh\ncat <<'EOF'\n# /etc/systemd/system/app.service\n[Service]\n"
        'Environment="STRIPE_API_KEY=rk_live_zzz999yyy888" LOG_LEVEL=info\n'
        f"EnvironmentFile=-{env_file}\nEOF\n",
        encoding="utf-8",
    )
    fake.chmod(0o755)
    found = list(credentials._unit_environment(str(fake), "app.service"))
    assert [(name, value) for _where, name, value in found] == [
        ("STRIPE_API_KEY", "rk_live_zzz999yyy888"),
        ("LOG_LEVEL", "info"),
        ("STRIPE_SECRET_KEY", "sk_live_abc123def456"),
    ]
    assert found[2][0] == f"systemd:app.service EnvironmentFile={env_file}:1"


def test_process_environment_default_is_os_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VERITASTEST_API_KEY", "vt-0a1b2c3d4e5f")
    found = find_credential("veritastest", etc_environment=tmp_path / "none")
    assert [(c.source, c.key_name) for c in found] == [("process_env", "VERITASTEST_API_KEY")]
    assert os.environ["VERITASTEST_API_KEY"] not in found[0].masked


def test_a_location_follows_its_transcript_into_the_archive(tmp_path: Path) -> None:
    """OpenClaw renames a JSONL transcript at `/new` (`.reset.<ts>`): the index row, written before, says the
    old path; `creds` and `creds find` show where that line is now."""
    live = tmp_path / "sessions" / "s-1.jsonl"
    live.parent.mkdir()
    live.write_text("{}\n")
    location = f"{live}:18"
    assert followed(location) == location and followed(f"{location} (transcript holds only a mask)") == (
        f"{location} (transcript holds only a mask)")
    archived = live.with_name("s-1.jsonl.reset.2026-03-12T05-00-00.000Z")
    live.rename(archived)
    assert followed(location) == f"{archived}:18 (archived since)"
    assert followed(f"{location} (transcript holds only a mask)") == (
        f"{archived}:18 (transcript holds only a mask) (archived since)")
    gone = f"{tmp_path / 'sessions' / 'other.jsonl'}:3"
    assert followed(gone) == gone  # nothing to follow: as written
    sqlite = "/state/agents/ops/agent/openclaw-agent.sqlite#s-1:21"
    assert followed(sqlite) == sqlite
