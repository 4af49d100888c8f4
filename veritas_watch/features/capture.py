"""Credential capture in the write path: every secret found is indexed in the agent's workspace
in the same pass that redacts it (before the store sees the message), and, with a vault
configured, its value is encrypted to the operator's key. Runs in the sources' worker thread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import structlog

from veritas_watch.config import Config
from veritas_watch.features.credentials import CredentialIndex, Vault
from veritas_watch.openclaw import agent_workspace
from veritas_watch.pipeline import Found

log = structlog.get_logger()


class CredentialCapture:
    def __init__(self, config: Config) -> None:
        creds = config.credentials
        self._state_dir = config.state_dir
        self._index = CredentialIndex()
        self._vault = (Vault(creds.vault_recipient, Path(creds.vault_path or config.data_dir / "credentials.vault"))
                       if creds.vault_recipient else None)
        self.captured: Counter[str] = Counter()  # per agent: index rows added since start

    @property
    def keeps_values(self) -> bool:
        return self._vault is not None

    def workspace(self, agent_id: str) -> Path:
        return agent_workspace(self._state_dir, agent_id)

    def capture(self, found: Sequence[Found]) -> None:
        for item in found:
            location = item.location.render()
            seen_at = item.seen_at or datetime.now(UTC).isoformat().replace("+00:00", "Z")
            try:
                ref = None
                if self._vault is not None and item.value is not None:
                    f = item.finding
                    ref = self._vault.append(item.value, fingerprint=f.fingerprint, rule=f.rule, service=f.service,
                                             key_name=f.key_name, location=location, seen_at=seen_at)
                added = self._index.record(self.workspace(item.agent_id), [item.finding], location, seen_at, ref)
            except OSError as exc:
                # The index is a convenience; memory must keep flowing (the secret is redacted either way).
                log.error("credential_index_failed", agent=item.agent_id, fingerprint=item.finding.fingerprint,
                          error=f"{type(exc).__name__}: {exc}"[:300])
                continue
            if added:
                self.captured[item.agent_id] += added
                log.info("credential_indexed", agent=item.agent_id, session=item.session_id, rule=item.finding.rule,
                         service=item.finding.service, fingerprint=item.finding.fingerprint, location=location,
                         vault=ref is not None)
            item.value = None  # drop the value as soon as the vault has it
