"""Find credentials in chat text and replace them with markers. Pure: no I/O, no clock, no state.

The package: `base` (types, value checks), `names` (secret-like names, services), `extract` (the
rules' extractors), `rules` (the rule table), `personal` (secrets a person holds: seed phrases, cards,
PINs, recovery codes; rules and extractors together), `masks` (OpenClaw's own masks), `engine` (detect,
merge, redact). Everything callers use is importable from here.

`detect` runs every rule whose keywords occur in the text (a gitleaks-style prefilter), keeps the
candidates that pass the rule's own checks (entropy, character classes, placeholders), merges
overlapping candidates (the most specific rule wins, its value is kept for the vault), and also
catches later verbatim repeats of a found value. `redact` replaces each span with
`[REDACTED:<rule>:<fp8>]`, where fp8 is a keyed hash: the marker never reveals any part of the value.
OpenClaw's own masks (`sk-pro…HNzL`, `KEY=***`) are found first and replaced whole (`masked_*` rules):
a credential was given there, though the text no longer holds it.

Rules are written from the providers' public key formats; the generic rules cover the forms chat
text uses (`NAME_KEY=value`, `Authorization: Bearer ...`, `scheme://user:pass@host`, `password is
...`, `密码是...`). Recall is preferred where the two conflict: a false positive hides one token,
a miss leaks a key into memory forever.
"""

from __future__ import annotations

from veritas_watch.transforms.redact.base import Rule, SecretMatch, fingerprint, is_documented_example, shannon_entropy
from veritas_watch.transforms.redact.engine import detect, redact, redact_with_matches
from veritas_watch.transforms.redact.labels import (
    UNKNOWN_SERVICE,
    leaks,
    rule_key_name,
    safe_labels,
    written_before,
)
from veritas_watch.transforms.redact.masks import (
    _MAX_MASK_ATOMS,  # noqa: F401 - tests bound hostile inputs by it
    MASK_ELLIPSIS,
    OPAQUE_MASK,
    is_masked_rule,
    is_opaque_mask,
    masked_fingerprint,
    openclaw_mask,
    recover_unmasked,
    split_mask,
)
from veritas_watch.transforms.redact.names import is_secret_name, service_from_name
from veritas_watch.transforms.redact.rules import RULES

__all__ = [
    "MASK_ELLIPSIS",
    "OPAQUE_MASK",
    "RULES",
    "UNKNOWN_SERVICE",
    "Rule",
    "SecretMatch",
    "detect",
    "fingerprint",
    "is_documented_example",
    "is_masked_rule",
    "is_opaque_mask",
    "is_secret_name",
    "leaks",
    "masked_fingerprint",
    "openclaw_mask",
    "recover_unmasked",
    "redact",
    "redact_with_matches",
    "rule_key_name",
    "safe_labels",
    "service_from_name",
    "shannon_entropy",
    "split_mask",
    "written_before",
]
