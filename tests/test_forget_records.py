"""Forgetting a session's records outside the store: its CREDENTIALS_INDEX.md rows (without losing a human's save made
at the same moment: the index writer's check, one home) and its vault entries (a line that is not UTF-8 or not
JSON never stops the others being forgotten)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from veritas_watch.config import load_config
from veritas_watch.features import credentials
from veritas_watch.features.credentials import INDEX_FILE, CredentialIndex, read_index
from veritas_watch.forget import erase_records, erase_session
from veritas_watch.model import SecretFinding

HUMAN_NOTE = "Note from a person, saved while veritas-watch was forgetting.\n"


def _finding(n: int) -> SecretFinding:
    return SecretFinding("token_cue", "GitHub", "GITHUB_TOKEN", f"{n:08x}", 0, 1)


def _index_with_two_sessions(workspace: Path) -> Path:
    index = CredentialIndex()
    index.record(workspace, [_finding(1)], "/db.sqlite#gone:3", "2026-12-01", None)
    index.record(workspace, [_finding(2)], "/db.sqlite#kept:7", "2026-12-01", None)
    path = workspace / INDEX_FILE
    assert len(read_index(path)) == 2
    return path


def test_a_human_save_while_rows_are_forgotten_is_not_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _index_with_two_sessions(tmp_path)
    find_table = credentials._find_table
    saves: list[int] = []

    def human_saves_once(text: str) -> Any:
        """The person's editor writes the file after veritas-watch read it, before it renames its rewrite."""
        table = find_table(text)
        if not saves:
            saves.append(1)
            with path.open("a", encoding="utf-8") as handle:
                handle.write(HUMAN_NOTE)
        return table

    monkeypatch.setattr(credentials, "_find_table", human_saves_once)
    assert credentials.forget_index_rows(tmp_path, frozenset({"gone"})) == 1
    monkeypatch.undo()
    assert saves and HUMAN_NOTE in path.read_text(encoding="utf-8")
    assert [r.fingerprint for r in read_index(path)] == ["00000002"]


def _vault_line(n: int, location: str, **extra: object) -> bytes:
    return json.dumps({"n": n, "fingerprint": f"{n:08x}", "location": location, "age": "-----BEGIN AGE-----",
                       **extra}).encode()


def test_unreadable_vault_lines_are_said_once_and_the_rest_forgotten(tmp_path: Path) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    workspace = state / "workspace-ops"
    workspace.mkdir(parents=True)
    data.mkdir()
    index = _index_with_two_sessions(workspace)
    index.write_bytes(index.read_bytes() + b"Notiz: caf\xe9 (Latin-1, kept as it is)\n")
    kept_line = _vault_line(5, "/db.sqlite#kept:7")
    not_utf8 = _vault_line(2, "/db.sqlite#gone:4").replace(b'"age"', b'"note": "\xff\xfe", "age"')
    lines = [_vault_line(1, "/db.sqlite#gone:3"), not_utf8,
             _vault_line(3, "/db.sqlite#gone:9")[:70],  # torn after its location
             b"\xffgarbage that is no JSON at all", b"[" * 100_000, kept_line]  # (nested past the parser's depth)
    vault = data / "credentials.vault"
    vault.write_bytes(b"\n".join(lines) + b"\n")
    config = load_config(None, {"OPENCLAW_STATE_DIR": str(state), "VERITAS_WATCH_DATA_DIR": str(data)})

    dry = erase_records(config, "ops", frozenset({"gone"}), dry_run=True)
    assert (dry.index_rows, dry.vault_entries) == (1, 3)
    assert vault.read_bytes() == b"\n".join(lines) + b"\n"  # a dry run writes nothing

    class NoPoints:  # the store's part is not what is under test: it holds nothing
        def scroll(self, *args: object, **kwargs: object) -> list[object]:
            return []

    with capture_logs() as logs:
        erase_session(config, "ops", frozenset({"gone"}))(NoPoints())  # type: ignore[arg-type]
    events = [e["event"] for e in logs]
    assert events.count("vault_lines_unreadable") == 1 and "session_erase_failed" not in events
    [unreadable] = [e for e in logs if e["event"] == "vault_lines_unreadable"]
    assert unreadable["lines"] == [4, 5]
    [erased] = [e for e in logs if e["event"] == "session_erased"]
    assert (erased["index_rows"], erased["vault_entries"]) == (1, 3)
    after = vault.read_bytes().split(b"\n")
    assert [json.loads(line) for line in after[:3]] == [{"n": n, "forgotten": True} for n in (1, 2, 3)]
    assert after[3:] == [lines[3], lines[4], kept_line, b""]  # the others byte for byte
    assert index.read_bytes().endswith(b"Notiz: caf\xe9 (Latin-1, kept as it is)\n")
    assert [r.fingerprint for r in read_index(index)] == ["00000002"]
