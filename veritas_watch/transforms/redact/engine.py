"""Detection (every rule, merged, repeats) and redaction into `[REDACTED:<rule>:<fp8>]` markers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from veritas_watch.model import MaskKind, Redacted, SecretFinding
from veritas_watch.transforms.redact.base import (
    _MARKER_PREFIX,
    MARKER_RE,
    Rule,
    SecretMatch,
    _is_wordish,
    _Spans,
    fingerprint,
    is_documented_example,
    shannon_entropy,
)
from veritas_watch.transforms.redact.labels import rule_key_name, safe_labels
from veritas_watch.transforms.redact.masks import _detect_masked, is_opaque_mask, masked_fingerprint
from veritas_watch.transforms.redact.names import _known_service_near
from veritas_watch.transforms.redact.rules import (
    _ALL_KEYWORDS,
    _KEYWORDLESS_RULES,
    _RULE_ORDER,
    _RULES_OF_KEYWORD,
    RULES,
    TYPED_PASSWORD_RULES,
)

# ---------------------------------------------------------------------------------------------
# Detection


@dataclass(slots=True)
class _Candidate:
    rule: Rule
    start: int
    end: int
    key_name: str | None
    service: str | None
    value: str


def _merge(text: str, candidates: list[_Candidate]) -> list[SecretMatch]:
    candidates.sort(key=lambda c: (c.start, -c.end))
    clusters: list[list[_Candidate]] = []
    cluster_end = -1
    for cand in candidates:
        if clusters and cand.start < cluster_end:
            clusters[-1].append(cand)
            cluster_end = max(cluster_end, cand.end)
        else:
            clusters.append([cand])
            cluster_end = cand.end
    matches: list[SecretMatch] = []
    for cluster in clusters:
        # ties go to the rule listed first: the table lists narrower formats before wider ones
        best = max(cluster, key=lambda c: (c.rule.priority, c.end - c.start, -_RULE_ORDER[c.rule.name]))
        named = [c for c in cluster if c.key_name]
        # an assignment's variable name beats a rule's default name (DEEPSEEK_API_KEY=sk-...)
        key_name = best.key_name or (named[0].key_name if named else None) or best.rule.key_name
        if best.rule.kind == "provider" and not best.key_name and named:
            key_name = named[0].key_name or best.rule.key_name
        service: str | None
        if best.rule.kind in ("provider", "context") and not best.rule.shared_format:
            service = best.rule.service
        else:
            hinted = [c.service for c in cluster if c.service]
            service = best.service or (hinted[0] if hinted else None)
            if service is None and best.rule.shared_format:
                service = _known_service_near(text, best.start)
            if service is None:
                service = best.rule.service
        start = min(c.start for c in cluster)
        end = max(c.end for c in cluster)
        matches.append(SecretMatch(best.rule.name, service, key_name or best.rule.key_name, start, end, best.value))
    return matches


def _marker_spans(text: str, lowered: str) -> list[tuple[int, int]]:
    if _MARKER_PREFIX not in lowered:
        return []
    return [m.span() for m in MARKER_RE.finditer(text)]


def detect(text: str) -> list[SecretMatch]:
    """Every secret in `text`, in order, with spans in `text`. Never raises on any string.

    Each match's service and key name are checked here (`labels.safe_labels`), against every value
    found in the same text: every finding, and so every writer after it, holds only safe labels."""
    matches = _detect(text)
    if not matches:
        return matches
    values = tuple({m.value for m in matches})  # (once: `safe_labels` takes it per match)
    out = []
    for m in matches:
        service, key_name = safe_labels(m.service, m.key_name, values,
                                        rule_key_name=rule_key_name(m.rule))
        out.append(m if (service, key_name) == (m.service, m.key_name)
                   else dataclasses.replace(m, service=service, key_name=key_name))
    return out


def _detect(text: str) -> list[SecretMatch]:
    if not text:
        return []
    lowered = text.lower()
    blocked = _marker_spans(text, lowered)
    # OpenClaw's masks first: a mask is one finding, and no rule may take a piece of it (the head
    # `sk-pro` of `sk-pro…HNzL` is no key, and its tail must not survive beside a marker).
    masked = _detect_masked(text)
    if masked:
        blocked = blocked + [(m.start, m.end) for m in masked]
    blocked_spans = _Spans(blocked)
    candidates: list[_Candidate] = []
    # each distinct keyword is looked up once; the rules it wakes and those without keywords run, in order
    woken = set(_KEYWORDLESS_RULES)
    for keyword in _ALL_KEYWORDS:
        if keyword in lowered:
            woken.update(_RULES_OF_KEYWORD[keyword])
    for index in sorted(woken):
        rule = RULES[index]
        for m in rule.pattern.finditer(text):
            found = rule.extract(rule, m, text)
            for hit in found if isinstance(found, list) else (found,):
                if hit is None or hit.end <= hit.start:
                    continue
                if blocked and blocked_spans.overlaps(hit.start, hit.end):
                    continue  # our own marker: redacting twice must find nothing new
                value = hit.value if hit.value is not None else text[hit.start : hit.end]
                if is_documented_example(value):
                    continue
                candidates.append(_Candidate(rule, hit.start, hit.end, hit.key_name, hit.service, value))
    if not candidates:
        return masked
    matches = _with_repeats(text, _merge(text, candidates), blocked)
    return sorted(masked + matches, key=lambda m: m.start) if masked else matches


def _whole_word(text: str, start: int, end: int) -> bool:
    return (start == 0 or not text[start - 1].isalnum()) and (end == len(text) or not text[end].isalnum())


def _with_repeats(text: str, matches: list[SecretMatch], blocked: list[tuple[int, int]]) -> list[SecretMatch]:
    """A value found once is hidden everywhere it recurs, even where no rule would fire."""
    taken = _Spans([(m.start, m.end) for m in matches] + blocked)
    extra: list[SecretMatch] = []
    seen: set[str] = set()
    for match in matches:
        value = match.value
        # a password a person typed is short and may be a word: hidden where it recurs as a whole word
        typed = match.rule in TYPED_PASSWORD_RULES and len(value) >= 6 and " " not in value
        if value in seen or (not typed and (len(value) < 10 or shannon_entropy(value) < 3.0 or _is_wordish(value))):
            continue  # each value once; only values that cannot plausibly recur by accident
        seen.add(value)
        pos = text.find(value)
        while pos >= 0:
            end = pos + len(value)
            if not taken.overlaps(pos, end) and (not typed or _whole_word(text, pos, end)):
                extra.append(SecretMatch(match.rule, match.service, match.key_name, pos, end, value))
                taken.add(pos, end)
            pos = text.find(value, pos + 1)
    if not extra:
        return matches
    return sorted(matches + extra, key=lambda m: m.start)


def redact(text: str, key: bytes) -> Redacted:
    """`text` with every secret replaced by `[REDACTED:<rule>:<fp8>]`; findings span the original text."""
    return redact_with_matches(text, key)[0]


def redact_with_matches(text: str, key: bytes) -> tuple[Redacted, tuple[SecretMatch, ...]]:
    """`redact`, plus the matches behind the findings (same order) for a caller that keeps a vault.

    The matches hold the values: hand them to the vault and drop them, never log them.
    """
    matches = detect(text)
    if not matches:
        return Redacted(text=text), ()
    parts: list[str] = []
    findings: list[SecretFinding] = []
    cursor = 0
    for match in matches:
        if match.masked:
            fp = masked_fingerprint(match.rule, match.key_name, match.value, key)
        else:
            fp = fingerprint(match.value, key)
        parts.append(text[cursor : match.start])
        parts.append(f"[REDACTED:{match.rule}:{fp}]")
        cursor = match.end
        kind: MaskKind = ("opaque" if is_opaque_mask(match.value) else "hinted") if match.masked else ""
        findings.append(SecretFinding(match.rule, match.service, match.key_name, fp, match.start, match.end, kind))
    parts.append(text[cursor:])
    return Redacted(text="".join(parts), findings=tuple(findings)), tuple(matches)
