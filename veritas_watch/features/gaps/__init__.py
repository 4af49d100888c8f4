"""Gap detection (`features/gaps/`): notice when an agent's file memory (STATE.md) missed a finished session.

The Veritas Memory rule: conversation is ground truth, files are cache. When a session ends,
`<workspace>/STATE.md` must carry an event at or after that session's end; if its last event
is older, the end-of-session sync was missed. A *gap* is recorded durably, logged once
(`gap_detected`), and the optional `on_gap` hook (an argv template, never a shell) is run to
repair it. The gap *closes* (`gap_closed`) once STATE.md holds an event at or after the end.

STATE.md time
-------------
The newest timestamp anywhere in the file (every line is scanned: the protocol fixes no
section names), falling back to the file's mtime when it holds none. A missing or unreadable
STATE.md is a gap.

Accepted timestamp forms (a date, optionally a time, optionally a zone after the time):

- date: ``YYYY-MM-DD`` or ``YYYY/MM/DD`` (same separator twice; must be a real date).
- date and time joined by ``T``/``t`` or 1-8 spaces/tabs: ``HH:MM``, ``HH:MM:SS`` or
  ``HH:MM:SS.fff`` (``,`` also accepted before the fraction; the hour may have one digit).
- zone, right after the time: ``Z``; ``+09:00``, ``+0900``, ``+09`` attached; ``+09:00`` or
  ``+0900`` after one space; ``UTC``/``GMT`` alone or with an offset (``UTC+9``, ``GMT+9``,
  ``UTC+05:30``, ``GMT-0500``; ``GMT+9`` means UTC+09:00 as in OpenClaw's envelopes, not
  the inverted POSIX ``Etc/GMT+9``); and these unambiguous abbreviations, upper case, with
  or without a space: JST KST HKT SGT AWST ACST AEST AEDT NZST NZDT WET WEST CET CEST EET
  EEST MSK HST AKST AKDT PST PDT MST MDT CDT EST EDT. Others (CST, IST, BST, ...) are
  ambiguous and not recognised: such a time is read as naive.
- naive times are read in the configured host zone (``default_tz``; default: the local zone).
- in ``2026-03-17 10:00-11:00`` (space separator, no seconds) ``-11:00`` is a time range,
  not an offset; write ``2026-03-17T10:00-11:00`` or include seconds to mean an offset.

Ignored as not-an-event:

- anything that fails validation (``2026-02-30``, ``25:00``) and identifier forms such as the
  reset-archive suffix ``2026-03-17T19-10-15.753Z`` (a date followed by ``T`` and a non-time);
- timestamps later than the file's mtime plus `FUTURE_SLACK` (5 min): a line cannot record an
  event that had not happened when the file was written, so these are plans and deadlines
  ("next review 2026-04-01"). With a mis-set host zone whole timelines can fall in this class;
  STATE.md then degrades to its mtime.
- not supported: week/ordinal dates, compact ``20260317T1000``, kanji dates (``2026年3月17日``).

Date-only stamps mean "some time that day" (in the host zone). One counts as the START of
that day, except that when the file was last modified on that same day it counts as the
modification time: a sync that wrote "2026-03-17 fixed X" at 10:05 covers a session that
ended at 10:00, but a date written at 09:00 does not cover a session that ended at 15:00.
The other reading (end of day) would hide exactly the incident this module exists for.

Comparison: a session is in gap when ``state_time < ended_at - tolerance`` (default 2 min).
The tolerance absorbs the normal in-session sync: the agent writes STATE.md, then sends its
final reply a little later, and minute-precision stamps truncate up to 59 s. The gap closes
when the same comparison flips (checked on every `tick`).

The on_gap hook
---------------
An argv list, run without a shell, its own process group, stdin closed, the daemon's cwd and
environment. Placeholders, substituted inside each element (a value never becomes a second
argument and is never re-parsed): ``{agent}``, ``{session_id}``, ``{transcript}``,
``{ended_at}`` (ISO UTC, ms, ``Z``), ``{workspace}``, ``{state_time}`` (STATE.md's last event
when the gap was found, ISO UTC; empty when STATE.md is missing). ``{{``/``}}`` are literal
braces. The program (element 0) must be literal. Exit 0 is success; a non-zero exit, a
timeout (the group gets SIGTERM, then SIGKILL) or a failure to start is retried with capped
exponential backoff until the gap closes. A successful hook is not run again for that gap.
Each value also reaches the hook in its environment (``VERITAS_GAP_AGENT``, ``VERITAS_GAP_SESSION_ID``,
``VERITAS_GAP_TRANSCRIPT``, ``VERITAS_GAP_ENDED_AT``, ``VERITAS_GAP_WORKSPACE``, ``VERITAS_GAP_STATE_TIME``).

A hook runs values, never code. Before each run every value is checked by OpenClaw's own rules
(``refuse_hook_values``): the agent id, the session id (``validateSessionId``), the transcript (a name
OpenClaw gives, in the agent's sessions dir or one of its databases), the workspace (as resolved now),
the instants (our ISO form); none can start with ``-``. A value that fails: the gap stays recorded,
the hook is not run for it (``last_hook_status`` ``refused``, not retried) and one ``gap_hook_refused``
line names the field and why. A template that puts a placeholder where an interpreter reads code
(``sh -c``, ``python -c``, ``node -e``, ``perl -e``, ``env -S``, a shell's script, ...) is refused
at load: such a script reads the environment instead.

The package, by section: `zones.py` (host zone, instants), `state_md.py` (STATE.md's time),
`hook.py` (the on_gap hook), `store.py` (gap records, `gaps.sqlite3`), `detector.py` (the
detector), `service.py` (the daemon's wiring: session ends in, gaps and hooks out).
"""

from veritas_watch.features.gaps.detector import DEFAULT_TOLERANCE, GapDetector
from veritas_watch.features.gaps.hook import (
    HOOK_ENV,
    HOOK_PLACEHOLDERS,
    HookPlaces,
    HookRefusal,
    HookResult,
    HookStatus,
    refuse_hook_values,
    render_hook_argv,
    run_hook,
    validate_hook_template,
)
from veritas_watch.features.gaps.state_md import STATE_FILE, state_last_event, state_time
from veritas_watch.features.gaps.store import EndedSession, Gap, GapKey, GapStore
from veritas_watch.features.gaps.zones import format_instant, local_zone, resolve_zone

__all__ = [
    "DEFAULT_TOLERANCE", "HOOK_ENV", "HOOK_PLACEHOLDERS", "STATE_FILE", "EndedSession", "Gap", "GapDetector",
    "GapKey", "GapStore", "HookPlaces", "HookRefusal", "HookResult", "HookStatus", "format_instant", "local_zone",
    "refuse_hook_values", "render_hook_argv", "resolve_zone", "run_hook", "state_last_event", "state_time",
    "validate_hook_template",
]
