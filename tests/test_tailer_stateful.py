"""Scenario 25: random sequences of file operations against a model of the expected entry set.

A hypothesis state machine drives the real daemon (in-process, so that a restart is cheap; the
data dir is kept across restarts) through append / partial append / rename to `.reset` /
truncate / atomic rewrite (compaction) / delete / create / daemon restart, and checks that the
store holds exactly the model's entries: no missing id, no extra id, no changed text.

The model: memory is append-only history. Every entry written whole is expected, and stays
expected after its line is truncated away, rewritten or deleted. To keep that deterministic, the
machine waits until the daemon is idle (every complete line on disk committed) before each
destructive step; an entry that is written and destroyed before any reader could see it is
therefore never generated. A half-written line is not expected until its end is written; one
destroyed unfinished is never expected. Sessions are files whose header id equals their stem, so
an entry's session is the same whether or not the daemon saw the header (after a truncation).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from tests.daemon_harness import InProcessDaemon, Ledger, append, assert_store_matches, line

# watchdog warns when `mkdir -p` races its own recursive walk (it adds one watch twice): harmless.
pytestmark = [pytest.mark.long, pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")]

SESSIONS = ("s1", "s2", "s3")


@dataclass
class FileModel:
    """What one transcript holds: its complete lines, and an unfinished last line if any."""

    session: str
    lines: list[bytes] = field(default_factory=list)  # each with its newline
    partial: bytes = b""  # the whole unfinished line ...
    partial_rest: bytes = b""  # ... and its bytes still to write
    partial_key: tuple[str, str] | None = None


class TailerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="vw-stateful-"))
        (self.root / "state" / "agents").mkdir(parents=True)
        self.daemon = InProcessDaemon(self.root / "state", self.root / "data")
        self.daemon.start()
        self.book = Ledger(self.daemon.state_dir, "model")
        self.files: dict[str, FileModel] = {}
        self.archives = 0

    # -- helpers ---------------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return self.book.sessions / name

    def _pick(self, pick: int, live_only: bool = False) -> str:
        names = sorted(n for n in self.files if not live_only or n.endswith(".jsonl"))
        return names[pick % len(names)]

    def _write(self, name: str, data: bytes) -> None:
        append(self._path(name), data)

    def _finish_partial(self, name: str) -> None:
        model = self.files[name]
        if model.partial_key is not None:
            self._write(name, model.partial_rest)
            model.lines.append(model.partial)
            self.book.release(*model.partial_key)
            self._drop_partial(model, lost=False)

    def _drop_partial(self, model: FileModel, *, lost: bool = True) -> None:
        if lost and model.partial_key is not None:
            self.book.held.pop(model.partial_key)  # destroyed unfinished: never expected
        model.partial_key, model.partial, model.partial_rest = None, b"", b""

    def _settle(self) -> None:
        """Wait until everything written is stored, and check the store against the model."""
        self.daemon.wait_idle()
        assert_store_matches(self.daemon, self.book)

    # -- rules -----------------------------------------------------------------------------------

    @initialize(session=st.sampled_from(SESSIONS), entries=st.integers(0, 3))
    def first_file(self, session: str, entries: int) -> None:
        self.create(session, entries)

    @rule(session=st.sampled_from(SESSIONS), entries=st.integers(0, 2))
    def create(self, session: str, entries: int) -> None:
        name = f"{session}.jsonl"
        if name in self.files:
            return
        model = self.files[name] = FileModel(session)
        data = [self.book.header(session)] + [self.book.entry(session) for _ in range(entries)]
        model.lines.extend(data)
        self._write(name, b"".join(data))

    @precondition(lambda self: self.files)
    @rule(pick=st.integers(0, 99), count=st.integers(1, 3), role=st.sampled_from(["user", "assistant"]))
    def append_entries(self, pick: int, count: int, role: str) -> None:
        name = self._pick(pick)
        self._finish_partial(name)
        model = self.files[name]
        data = [self.book.entry(model.session, role=role) for _ in range(count)]
        model.lines.extend(data)
        self._write(name, b"".join(data))

    @precondition(lambda self: self.files)
    @rule(pick=st.integers(0, 99), cut=st.floats(0.05, 0.95))
    def partial_append(self, pick: int, cut: float) -> None:
        name = self._pick(pick)
        self._finish_partial(name)
        model = self.files[name]
        data = self.book.entry(model.session, expect=False)
        split = max(1, min(len(data) - 1, int(len(data) * cut)))
        model.partial_key = (model.session, json.loads(data)["id"])
        model.partial, model.partial_rest = data, data[split:]
        self._write(name, data[:split])

    @precondition(lambda self: any(n.endswith(".jsonl") for n in self.files))
    @rule(pick=st.integers(0, 99), kind=st.sampled_from(["reset", "deleted"]))
    def rename_to_reset(self, pick: int, kind: str) -> None:
        """/new, /reset or a session delete: the live file becomes an archive; its writer may still append."""
        name = self._pick(pick, live_only=True)
        self.archives += 1
        archived = f"{name}.{kind}.2026-03-20T10-{self.archives // 60:02d}-{self.archives % 60:02d}.000Z"
        self._path(name).rename(self._path(archived))
        self.files[archived] = self.files.pop(name)

    @precondition(lambda self: self.files)
    @rule(pick=st.integers(0, 99), keep=st.floats(0, 1))
    def truncate(self, pick: int, keep: float) -> None:
        """Heartbeat pruning: back to an earlier line boundary, in place."""
        self._settle()
        name = self._pick(pick)
        model = self.files[name]
        kept = int(len(model.lines) * keep)
        model.lines = model.lines[:kept]
        with self._path(name).open("r+b") as handle:
            handle.truncate(len(b"".join(model.lines)))
        self._drop_partial(model)

    @precondition(lambda self: any(n.endswith(".jsonl") for n in self.files))
    @rule(pick=st.integers(0, 99), keep=st.lists(st.booleans(), max_size=12), added=st.integers(0, 2))
    def atomic_rewrite(self, pick: int, keep: list[bool], added: int) -> None:
        """Compaction: a temp file (kept entries with their ids, a summary, new ones) renamed over."""
        self._settle()
        name = self._pick(pick, live_only=True)
        model = self.files[name]
        entries = [raw for raw in model.lines if b'"type": "message"' in raw]
        kept = [raw for raw, flag in zip(entries, keep + [True] * len(entries), strict=False) if flag]
        summary = line({"type": "compaction", "id": f"c{self.archives}-{len(kept)}", "parentId": None,
                        "timestamp": "2026-03-20T12:00:00.000Z", "summary": "Earlier notes, condensed."})
        new = [self.book.entry(model.session) for _ in range(added)]
        content = [self.book.header(model.session), summary, *kept, *new]
        temp = self._path(name + ".manual-compaction-tmp")
        temp.write_bytes(b"".join(content))
        temp.replace(self._path(name))
        self._drop_partial(model)
        self.files[name] = FileModel(model.session, content)

    @precondition(lambda self: self.files)
    @rule(pick=st.integers(0, 99))
    def delete(self, pick: int) -> None:
        self._settle()
        name = self._pick(pick)
        self._path(name).unlink()
        self._drop_partial(self.files.pop(name))

    @rule()
    def restart(self) -> None:
        """Stop the daemon and start a new one on the same data dir, whatever is in flight."""
        self.daemon.stop()
        self.daemon = InProcessDaemon(self.root / "state", self.root / "data")
        self.daemon.start()

    @rule()
    def settle(self) -> None:
        self._settle()

    def teardown(self) -> None:
        try:
            self._settle()
        finally:
            self.daemon.stop()
            shutil.rmtree(self.root, ignore_errors=True)


TailerMachine.TestCase.settings = settings(
    max_examples=20, stateful_step_count=15, deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],  # shrinking restarts daemons: slow
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_s25_random_sequences_match_model = TailerMachine.TestCase


def test_s25_found_truncate_to_nothing_then_half_line_across_restart() -> None:
    """A sequence the machine found: a file truncated to nothing, a half line written, a restart.
    The committed cursor used to stay at the old content's offset, so the backlog never cleared."""
    state = TailerMachine()
    try:
        state.first_file(entries=0, session="s1")
        state.partial_append(cut=0.33, pick=0)
        state.atomic_rewrite(added=2, keep=[], pick=0)
        state.create(entries=0, session="s2")
        state.truncate(keep=0.0, pick=1)
        state.delete(pick=0)
        state.partial_append(cut=0.46, pick=0)
        state.restart()
        state.truncate(keep=0.7, pick=0)
        state.append_entries(count=2, pick=0, role="user")
    finally:
        state.teardown()
