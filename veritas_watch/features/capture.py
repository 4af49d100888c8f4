"""Credential capture in the write path: every secret found is indexed in the agent's workspace
in the same pass that redacts it (before the store sees the message), and, with a vault
configured, its value is encrypted to the operator's key. Runs in the sources' worker thread.

- A value found in a message: indexed with where it can be recovered (its transcript line), and
  vaulted when a vault is configured.
- An OpenClaw mask (`sk-pro…HNzL`, `***`): indexed with status `masked`, its Location saying the
  transcript holds only a mask. With a vault, the value is looked for in OpenClaw's `task_runs`
  (`TaskRunValues`, read-only) and vaulted when found exactly; without one nothing reads it.
- The agent's workspace is never created: rows wait in `<data_dir>/credentials-index.json` until
  it exists (`flush_pending`, `pending_counts`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import structlog

from veritas_watch.config import Config
from veritas_watch.features.credentials import (
    INDEX_FILE,
    OPENCLAW_STATE_DB,
    CredentialIndex,
    IndexEntry,
    IndexStateStore,
    MaskProbe,
    PendingRow,
    TaskRunValues,
    Vault,
    WorkspaceMissing,
    given_at_of,
    number_occurrences,
    pending_counts,
    read_index,
)
from veritas_watch.openclaw import InvalidAgentId, agent_workspace
from veritas_watch.pipeline import Found
from veritas_watch.transforms.redact import fingerprint, rule_key_name, safe_labels

log = structlog.get_logger()

MASK_NOTE = "transcript holds only a mask"
_NOT_RECOVERED = {
    "not_found": f"{MASK_NOTE}; no unmasked copy found",
    "ambiguous": f"{MASK_NOTE}; several values could match, none kept",
    "unavailable": f"{MASK_NOTE}; OpenClaw's state could not be read",
}
RETRY_ATTEMPTS = 20  # a masked value whose lookup failed (database locked) is retried by flush_pending ...
RETRY_SECONDS = 3600.0  # ... for at most this long; then its row is written without the value


@dataclass(frozen=True, slots=True)
class PendingAgent:
    """Rows of one agent not in its index yet: `workspace` does not exist, or `resolving` masks wait for
    their value (OpenClaw's database was busy)."""

    agent_id: str
    workspace: Path
    rows: int
    resolving: int
    workspace_exists: bool


class CredentialCapture:
    def __init__(self, config: Config, *, redact_key: bytes | None = None,
                 task_runs: TaskRunValues | None = None) -> None:
        creds = config.credentials
        self._state_dir = config.state_dir
        self._data_dir = config.data_dir
        self._index = CredentialIndex()
        self._state = IndexStateStore(config.data_dir)
        self._vault = (Vault(creds.vault_recipient, Path(creds.vault_path or config.data_dir / "credentials.vault"))
                       if creds.vault_recipient else None)
        # Without a vault nothing reads task_runs: there would be nowhere to keep what it finds.
        self._task_runs = (task_runs or TaskRunValues(config.state_dir / OPENCLAW_STATE_DB)) if self._vault else None
        self._redact_key = redact_key
        self._lock = threading.Lock()  # pending rows and aliases: capture and flush may run in two threads
        self.captured: Counter[str] = Counter()  # per agent: index rows added since start
        self._waiting_logged: set[str] = set()  # agents whose missing workspace was logged once

    @property
    def keeps_values(self) -> bool:
        return self._vault is not None

    def workspace(self, agent_id: str) -> Path:
        return agent_workspace(self._state_dir, agent_id)

    # -- the write path

    def capture(self, found: Sequence[Found]) -> None:
        """Index (and vault) what one transform pass found. Never raises for an unwritable index:
        memory must keep flowing, the secret is redacted either way."""
        entries: list[tuple[Found, IndexEntry]] = []
        for item in found:
            f = item.finding
            seen_at = item.seen_at or datetime.now(UTC).isoformat().replace("+00:00", "Z")
            status, note = ("masked", MASK_NOTE) if f.masked else (None, None)
            entries.append((item, IndexEntry(f, item.location.render(), seen_at, status=status, note=note,
                                             fingerprint_identifies=f.masked != "opaque",
                                             given_at=given_at_of(item.location))))
        numbered = number_occurrences([e for _, e in entries])
        for (item, _), entry in zip(entries, numbered, strict=True):
            try:
                self._capture_one(item, entry)
            except (OSError, InvalidAgentId) as exc:  # unwritable, outside the workspace, or no agent id
                log.error("credential_index_failed", agent=item.agent_id, fingerprint=item.finding.fingerprint,
                          error=f"{type(exc).__name__}: {exc}"[:300])
            finally:
                item.value = None  # drop the value (or mask) as soon as the vault has it

    def _capture_one(self, item: Found, entry: IndexEntry) -> None:
        f = item.finding
        if f.masked:
            outcome = self._resolve(item.agent_id, entry, item.value)
            if isinstance(outcome, PendingRow):
                self._queue([outcome])
                return
            entry = outcome
        elif self._vault is not None and item.value is not None:
            ref = self._vault.append(item.value, fingerprint=f.fingerprint, rule=f.rule, service=f.service,
                                     key_name=f.key_name, location=entry.location, seen_at=entry.seen_at)
            entry = dataclasses.replace(entry, vault_ref=ref)
        added = self._write(item.agent_id, [entry])
        if added:
            self.captured[item.agent_id] += added
            log.info("credential_indexed", agent=item.agent_id, session=item.session_id, rule=f.rule,
                     service=entry.finding.service, fingerprint=f.fingerprint, location=entry.location,
                     masked=f.masked or None, vault=entry.vault_ref is not None)

    # -- masks: the value from OpenClaw's task_runs, into the vault

    def _resolve(self, agent_id: str, entry: IndexEntry, mask: str | None, *, attempts: int = 0,
                 since: float | None = None) -> IndexEntry | PendingRow:
        """The entry with its vault ref when the value behind the mask was found; a PendingRow to
        retry when OpenClaw's database could not be read; else the entry saying it was not recovered."""
        if self._vault is None or self._task_runs is None or mask is None:
            return entry
        f = entry.finding
        recovery = self._task_runs.recover(MaskProbe(agent_id, f.rule, f.key_name, mask, entry.seen_at))
        if recovery.status == "found" and recovery.value is not None:
            # the names came from the masked text: checked again against the value now known (labels.safe_labels)
            service, key_name = safe_labels(f.service, f.key_name, [recovery.value],
                                            rule_key_name=rule_key_name(f.rule))
            if (service, key_name) != (f.service, f.key_name):
                f = dataclasses.replace(f, service=service, key_name=key_name)
                entry = dataclasses.replace(entry, finding=f)
            key = self._fingerprint_key()
            value_fp = fingerprint(recovery.value, key) if key is not None else None
            if value_fp is None and f.masked == "opaque":
                # a `***` fingerprint names no value: the vault would take two values for one
                log.warning("credential_mask_not_vaulted", agent=agent_id, fingerprint=f.fingerprint,
                            reason="no fingerprint key")
                return dataclasses.replace(entry, note=_NOT_RECOVERED["unavailable"])
            ref = self._vault.append(recovery.value, fingerprint=value_fp or f.fingerprint, rule=f.rule,
                                     service=f.service, key_name=f.key_name, location=entry.location,
                                     seen_at=entry.seen_at)
            log.info("credential_mask_recovered", agent=agent_id, rule=f.rule, fingerprint=f.fingerprint,
                     task=recovery.task_id, vault=ref)
            extra = (value_fp,) if value_fp and value_fp != f.fingerprint else ()
            return dataclasses.replace(entry, vault_ref=ref, extra_fingerprints=extra)
        queued = time.time() if since is None else since
        if recovery.status == "unavailable" and attempts < RETRY_ATTEMPTS and time.time() - queued < RETRY_SECONDS:
            log.warning("credential_mask_lookup_deferred", agent=agent_id, fingerprint=f.fingerprint,
                        detail=recovery.detail, attempts=attempts)
            return PendingRow(agent_id, entry, mask, attempts + 1, queued)
        log.info("credential_mask_not_recovered", agent=agent_id, rule=f.rule, fingerprint=f.fingerprint,
                 status=recovery.status, detail=recovery.detail)
        return dataclasses.replace(entry, note=_NOT_RECOVERED[recovery.status])

    def _fingerprint_key(self) -> bytes | None:
        """The data dir's fingerprint key (the daemon creates it before capture starts); read, never made."""
        if self._redact_key is None:
            try:
                self._redact_key = bytes.fromhex((self._data_dir / "fingerprint.key").read_text().strip())
            except (OSError, ValueError):
                return None
        return self._redact_key

    # -- the index, or the data dir while the workspace does not exist

    def _write(self, agent_id: str, entries: Sequence[IndexEntry]) -> int:
        workspace = self.workspace(agent_id)
        if not workspace.is_dir():
            self._queue([PendingRow(agent_id, e, since=time.time()) for e in entries], workspace)
            return 0
        if any(r.agent_id == agent_id and r.mask is None for r in self._state.load().pending):
            self.flush_pending()  # rows that waited for this workspace go in first
        key = str(workspace)
        with self._lock:
            aliases = dict(self._state.load().aliases.get(key, {}))
        try:
            update = self._index.add(workspace, entries, aliases=aliases)
        except WorkspaceMissing:
            self._queue([PendingRow(agent_id, e, since=time.time()) for e in entries], workspace)
            return 0
        except OSError:
            # Refused (the index links out of the workspace) or failed (disk full): the rows wait in the data
            # dir like rows whose workspace is missing, and flush_pending writes them once it can.
            self._queue([PendingRow(agent_id, e, since=time.time()) for e in entries])
            raise
        if update.matched:
            # Another data dir wrote these rows: remember our fingerprints for them, so the same
            # value seen again elsewhere in the transcript is not a new row either.
            with self._lock, self._state.update() as state:
                state.aliases.setdefault(key, {}).update(update.matched)
        return update.added

    def _queue(self, rows: Sequence[PendingRow], workspace: Path | None = None) -> None:
        with self._lock, self._state.update() as state:
            for row in rows:
                if not any(row.same_as(old) or row.repeats(old) for old in state.pending):
                    state.pending.append(row)
        if workspace is not None and rows:
            agent_id = rows[0].agent_id
            first = agent_id not in self._waiting_logged
            self._waiting_logged.add(agent_id)
            (log.warning if first else log.debug)("credential_index_waiting_for_workspace", agent=agent_id,
                                                  workspace=str(workspace), rows=len(rows))

    def flush_pending(self) -> int:
        """Write the rows that waited (their workspace now exists), retry masks whose value lookup
        could not read OpenClaw's database. Returns rows written. For the daemon to call periodically."""
        with self._lock:
            pending = list(self._state.load().pending)
        if not pending:
            return 0
        done: list[PendingRow] = []  # rows handled: written, or known to be in the index already
        replaced: list[tuple[PendingRow, PendingRow]] = []
        ready: dict[str, list[tuple[PendingRow, IndexEntry]]] = {}
        for row in pending:
            entry = row.entry
            if row.mask is not None:
                outcome = self._resolve(row.agent_id, row.entry, row.mask, attempts=row.attempts, since=row.since)
                if isinstance(outcome, PendingRow):
                    replaced.append((row, outcome))
                    continue
                entry = outcome  # resolved (or given up): from now on an ordinary pending row
                replaced.append((row, PendingRow(row.agent_id, entry, since=row.since)))
            ready.setdefault(row.agent_id, []).append((row, entry))
        written = 0
        for agent_id, rows in ready.items():
            try:
                workspace = self.workspace(agent_id)
            except InvalidAgentId:
                continue  # rows of an id OpenClaw would not accept (an older version queued them): never written
            if not workspace.is_dir():
                continue
            key = str(workspace)
            with self._lock:
                aliases = dict(self._state.load().aliases.get(key, {}))
            try:
                update = self._index.add(workspace, [e for _, e in rows], aliases=aliases)
            except OSError as exc:
                log.error("credential_index_flush_failed", agent=agent_id, error=f"{type(exc).__name__}: {exc}"[:300])
                continue
            written += update.added
            self.captured[agent_id] += update.added
            done.extend(r for r, _ in rows)
            if update.matched:
                with self._lock, self._state.update() as state:
                    state.aliases.setdefault(key, {}).update(update.matched)
            log.info("credential_index_flushed", agent=agent_id, workspace=key, rows_added=update.added,
                     rows=len(rows))
        with self._lock, self._state.update() as state:
            swap = [(old, new) for old, new in replaced if not any(old is d for d in done)]
            kept: list[PendingRow] = []
            for row in state.pending:
                if any(row.same_as(d) for d in done):
                    continue
                new = next((n for o, n in swap if row.same_as(o)), None)
                kept.append(new if new is not None else row)
            state.pending[:] = kept
        return written

    # -- for status and doctor

    def pending_counts(self) -> dict[str, int]:
        """Rows per agent not in its index yet (waiting for the workspace, or for a masked value)."""
        with self._lock:
            return dict(Counter(row.agent_id for row in self._state.load().pending))

    def pending_report(self) -> list[PendingAgent]:
        """Per agent: how many rows wait, for which workspace, and whether it exists now ("index
        waiting for workspace X")."""
        with self._lock:
            pending = self._state.load().pending
        report = []
        for agent_id in sorted({r.agent_id for r in pending}):
            rows = [r for r in pending if r.agent_id == agent_id]
            try:
                workspace = self.workspace(agent_id)
            except InvalidAgentId:
                continue
            report.append(PendingAgent(agent_id, workspace, len(rows), sum(r.mask is not None for r in rows),
                                       workspace.is_dir()))
        return report


def credentials_per_agent(state_dir: Path, data_dir: Path, agent_ids: Iterable[str]) -> dict[str, int]:
    """Credentials indexed for each agent: rows of its CREDENTIALS_INDEX.md that carry a fingerprint
    (veritas-watch writes one on every row; a row typed by hand may have none) plus rows still waiting
    to be written there. Read from the files, so it holds across restarts and in any process."""
    waiting = pending_counts(data_dir)
    counts = {}
    for agent_id in agent_ids:
        try:
            index = agent_workspace(state_dir, agent_id) / INDEX_FILE
            rows = sum(1 for row in read_index(index) if row.fingerprint.strip())
        except (OSError, ValueError):
            rows = 0
        counts[agent_id] = rows + waiting.get(agent_id, 0)
    return counts


class NoCapture:
    """Credential capture switched off (`credentials.enabled = false`), or not started yet: the same calls,
    doing nothing (the secrets are still redacted; only the index and the vault are not written)."""

    keeps_values = False

    def capture(self, found: Sequence[Found]) -> None:
        return None

    def flush_pending(self) -> None:
        return None
