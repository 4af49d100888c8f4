"""OpenClaw's memory admission policy, restated: which sessions a person keeps out of memory.

OpenClaw 2026.9.6 (`extensions/memory-core/src/session-ingestion.ts`, `dist/session-ingestion-*.mjs`):
`plugins.entries.memory-core.config.memoryPolicy.excludeSessions` holds three lists,
`hookExternalContentSources`, `channels` and `chatTypes` (`resolveAdmissionPolicy`). Strings are
trimmed, empties dropped (`normalizeStringEntries`), non-strings ignored; a value matches exactly and
case-sensitively; the lists combine with OR; metadata a session does not record matches nothing; the
reason is `hookExternalContentSource:<s>`, `channel:<id>` or `chatType:<t>`, checked in that order
(`sessionExclusionReason`). veritas-watch's own `[memory_policy.exclude_sessions]` adds to it (OR).

The metadata is what OpenClaw reads (`listTranscriptInstancesFromDatabase`, session-accessor.sqlite-entry):
the session's `session_windows` row (`channel`, `chat_type`, `hook_external_content_source` once its
`session_entry_provenance` is 1) and, while the key's current entry is that session, the entry's own
`hookExternalContentSource` (the exact source: the column only tells `gmail` from a coarse `webhook`).
The policy is prospective: it keeps a session from being read, it erases nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from veritas_watch.openclaw import UNREADABLE, ConfigWatch

log = structlog.get_logger()

# OpenClaw's config keys (`excludeSessions`).
KEYS = ("hookExternalContentSources", "channels", "chatTypes")
FORGOTTEN = "forgotten"  # the reason of a session the person had forgotten (OpenClaw's or `veritas-watch forget`)
_CHAT_TYPES = ("direct", "group", "channel")  # the only chat_type values OpenClaw reads back


def _values(raw: object) -> frozenset[str]:
    """`normalizeStringEntries` over the strings of a list: trimmed, empties dropped."""
    if not isinstance(raw, list | tuple):
        return frozenset()
    return frozenset(s for v in raw if isinstance(v, str) and (s := v.strip()))


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """Sessions excluded from memory: any one list matching excludes the whole session."""

    hook_sources: frozenset[str] = frozenset()
    channels: frozenset[str] = frozenset()
    chat_types: frozenset[str] = frozenset()

    @classmethod
    def from_lists(cls, lists: Mapping[str, object] | None) -> AdmissionPolicy:
        """From an `excludeSessions` table (OpenClaw's keys); anything else in it is ignored."""
        if not isinstance(lists, Mapping):
            return cls()
        return cls(_values(lists.get("hookExternalContentSources")), _values(lists.get("channels")),
                   _values(lists.get("chatTypes")))

    def __or__(self, other: AdmissionPolicy) -> AdmissionPolicy:
        return AdmissionPolicy(self.hook_sources | other.hook_sources, self.channels | other.channels,
                               self.chat_types | other.chat_types)

    def __bool__(self) -> bool:
        return bool(self.hook_sources or self.channels or self.chat_types)


@dataclass(frozen=True, slots=True)
class SessionMetadata:
    """What OpenClaw recorded of a session for admission (None: not recorded)."""

    hook_source: str | None = None
    channel: str | None = None
    chat_type: str | None = None


def session_metadata(*, channel: object, chat_type: object, hook_column: object, provenance: object,
                     entry_hook_source: object) -> SessionMetadata:
    """A session's metadata from its `session_windows` row and, when the key's current entry is this session,
    that entry's `hookExternalContentSource` (else None), read as `listTranscriptInstancesFromDatabase` reads
    them: the exact source from the entry, else `gmail` from the column once provenance is known (a coarse
    `webhook` column is never taken for `webhook` or `email`)."""
    exact = entry_hook_source if isinstance(entry_hook_source, str) and entry_hook_source else None
    if exact is None and provenance == 1 and hook_column == "gmail":
        exact = "gmail"
    return SessionMetadata(
        hook_source=exact,
        channel=channel if isinstance(channel, str) and channel else None,
        chat_type=chat_type if chat_type in _CHAT_TYPES and isinstance(chat_type, str) else None,
    )


def exclusion_reason(meta: SessionMetadata | None, policy: AdmissionPolicy) -> str | None:
    """Why `policy` keeps the session out (`sessionExclusionReason`'s reasons and order), or None."""
    if meta is None or not policy:
        return None
    if meta.hook_source is not None and meta.hook_source in policy.hook_sources:
        return f"hookExternalContentSource:{meta.hook_source}"
    if meta.channel is not None and meta.channel in policy.channels:
        return f"channel:{meta.channel}"
    if meta.chat_type is not None and meta.chat_type in policy.chat_types:
        return f"chatType:{meta.chat_type}"
    return None


def still_excluded(reason: str, policy: AdmissionPolicy) -> bool:
    """Whether `policy` still names what an earlier `exclusion_reason` gave `reason` for (a session whose metadata
    is gone with its window, deleted since)."""
    kind, _, value = reason.partition(":")
    lists = {"hookExternalContentSource": policy.hook_sources, "channel": policy.channels,
             "chatType": policy.chat_types}
    return value in lists.get(kind, frozenset())


def openclaw_policy(config: Mapping[str, object]) -> AdmissionPolicy:
    """The policy written in openclaw.json (`plugins.entries.memory-core.config.memoryPolicy.excludeSessions`).
    It is memory-core's config, read whether or not memory-core is enabled: with veritas-watch in the memory
    slot memory-core is off, and its config is still where people write what may become memory."""
    node: object = config
    for key in ("plugins", "entries", "memory-core", "config", "memoryPolicy", "excludeSessions"):
        node = node.get(key) if isinstance(node, Mapping) else None
    return AdmissionPolicy.from_lists(node if isinstance(node, Mapping) else None)


class PolicyReader:
    """openclaw.json's policy OR veritas-watch's own, read again only when the config file changed (a sweep
    runs every few seconds; parsing JSON5 each time would be idle work). A rule added or removed in
    openclaw.json, a file it `$include`s or a global .env file applies from the next sweep (`ConfigWatch`).
    A file that cannot be parsed (caught half-written, a typo) keeps the last policy read: dropping it would
    read, for good, what the person keeps out. No file at all is no policy."""

    def __init__(self, state_dir: Path, own: AdmissionPolicy, environ: Mapping[str, str] | None = None) -> None:
        self._own = own
        self._seen: object = None
        self._policy = own
        self._told: object = None  # the unreadable version already logged
        # OpenClaw's own resolution (OPENCLAW_CONFIG_PATH, `~`, its .env files, legacy names): a stat a sweep
        self._config = ConfigWatch(state_dir, environ)

    def current(self) -> AdmissionPolicy:
        stamp = self._config.stamp()
        if stamp != self._seen:
            issues: list[str] = []
            config = self._config.read(issues).config
            unreadable = [i for i in issues if UNREADABLE in i]
            if unreadable:
                if self._told != stamp:
                    self._told = stamp
                    log.warning("admission_policy_unreadable", detail=unreadable[0][:300],
                                hint="the last policy read stays in force until openclaw.json parses again")
                return self._policy  # its stamp not kept: read again at the next sweep
            self._seen = self._config.kept(stamp)
            self._policy = openclaw_policy(config) | self._own
        return self._policy


def reason_counts(reasons: Iterable[str]) -> dict[str, int]:
    """Exclusions counted by reason, in a stable order (for `status`)."""
    return dict(sorted(Counter(reasons).items()))
