"""LoCoMo (the development half in ../shared) as every bench script reads it.

One loader for bench/locomo.py, retrieval_study.py, embedders.py and ingest.py: turns in session
order, the scored questions (categories 1-4) with their evidence repaired. The file's known defects
(../shared/fixtures/locomo/README.md) are handled here and only here:
- malformed evidence ids: 'D8:6; D9:17' holds two ids, 'D:11:26' has a stray colon;
- evidence that points to a turn that does not exist is dropped, and a question left without
  evidence (four have none to begin with) is not scored;
- `session_N_date_time` keys can outnumber the real sessions: only `session_N` lists are sessions;
- many evidence turns are image turns whose content is the caption: `turn_text` includes it.

Two splits. "dev": the five conversations of ../shared (conv-26, 30, 41, 42, 43), the only ones any
choice was tuned on. "left-out": the other five of the public file (conv-44, 47, 48, 49, 50), never
tuned on, reported beside dev. The public file (snap-research/LoCoMo `data/locomo10.json`, CC BY-NC
4.0) is not committed: `full_path()` finds it in `$VW_LOCOMO_FULL` or `.test-cache/locomo/`, and
`python bench/locomo_data.py --fetch` downloads it there where GitHub is reachable (its digest is
checked, and its dev half must equal the shared file).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import urllib.request
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixture_paths import shared_dir  # noqa: E402  (after the path set-up above)

LOCOMO = (shared_dir() or REPO.parent / "shared") / "fixtures" / "locomo" / "locomo10-dev.json"
FULL_CACHE = REPO / ".test-cache" / "locomo" / "locomo10.json"
FULL_URL = "https://raw.githubusercontent.com/snap-research/locomo/3eb6f2c/data/locomo10.json"
FULL_SHA256 = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"
DEV_IDS = ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43")
# LoCoMo category numbers as in its data (the paper's code); its README lists them in another order.
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
CATEGORY_ORDER = ("single-hop", "multi-hop", "temporal", "open-domain")
EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")
SESSION_KEY = re.compile(r"session_(\d+)")


@dataclass(frozen=True)
class Turn:
    conversation: str  # the sample_id, e.g. "conv-26"
    session: int
    session_date: str | None  # as LoCoMo writes it, e.g. '1:56 pm on 8 May, 2023'
    position: int  # index of the turn in its session
    dia_id: str  # "D<session>:<turn>", what evidence refers to
    speaker: str
    text: str
    caption: str | None  # the caption of a shared image


@dataclass(frozen=True)
class Question:
    conversation: str
    text: str
    category: int
    evidence: frozenset[str]  # dia_ids, repaired, all of existing turns, never empty


@dataclass(frozen=True)
class Conversation:
    id: str
    speakers: tuple[str, str]  # speaker_a, speaker_b (speaker_a does not always speak first)
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]  # the scored ones, in the file's order


def turn_text(turn: Turn) -> str:
    """What a turn reads as in a transcript: "<speaker>: <text>" + " [shares an image: <caption>]"."""
    text = f"{turn.speaker}: {turn.text}"
    if turn.caption:
        text += f" [shares an image: {turn.caption}]"
    return text


def repair_evidence(items: Iterable[str], known: Collection[str]) -> frozenset[str]:
    """The well-formed dia_ids in a question's evidence list that name turns of `known`."""
    ids = {f"D{s}:{t}" for item in items for s, t in EVIDENCE_ID.findall(item)}
    return frozenset(ids.intersection(known))


def load(path: Path = LOCOMO) -> list[Conversation]:
    """Every conversation of the file, in its order."""
    out: list[Conversation] = []
    for sample in json.loads(path.read_text(encoding="utf-8")):
        conv_id = sample["sample_id"]
        conversation = sample["conversation"]
        sessions = sorted(
            (int(m[1]), value)
            for key, value in conversation.items()
            if (m := SESSION_KEY.fullmatch(key)) and isinstance(value, list)
        )
        turns = tuple(
            Turn(conversation=conv_id, session=number, session_date=conversation.get(f"session_{number}_date_time"),
                 position=position, dia_id=raw["dia_id"], speaker=raw["speaker"], text=raw["text"],
                 caption=raw.get("blip_caption") or None)
            for number, session in sessions
            for position, raw in enumerate(session)
        )  # fmt: skip
        known = {turn.dia_id for turn in turns}
        questions = []
        for qa in sample["qa"]:
            if qa.get("category") not in CATEGORY_NAMES:
                continue
            evidence = repair_evidence(qa.get("evidence", []), known)
            if evidence:
                questions.append(Question(conv_id, str(qa["question"]), int(qa["category"]), evidence))
        speakers = (str(conversation["speaker_a"]), str(conversation["speaker_b"]))
        out.append(Conversation(conv_id, speakers, turns, tuple(questions)))
    return out


def turns_and_questions(conversations: Sequence[Conversation]) -> tuple[list[Turn], list[Question]]:
    """All turns and all scored questions of these conversations, each in order."""
    return [t for c in conversations for t in c.turns], [q for c in conversations for q in c.questions]


def full_path() -> Path:
    """Where the public file with all ten conversations is (it may not exist: see `fetch_full`)."""
    override = os.environ.get("VW_LOCOMO_FULL")
    return Path(override) if override else FULL_CACHE


def fetch_full(path: Path = FULL_CACHE) -> Path:
    """Download the public file into the cache dir (bench time only; never committed) and check it."""
    with urllib.request.urlopen(FULL_URL, timeout=60) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != FULL_SHA256:
        raise SystemExit(f"{FULL_URL}: unexpected content (sha256 differs from {FULL_SHA256})")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def load_split(split: str) -> list[Conversation]:
    """"dev" (../shared), "left-out" (the public file's other five) or "all" (dev first)."""
    if split not in ("dev", "left-out", "all"):
        raise ValueError(f"unknown split {split!r}")
    dev = load(LOCOMO) if split != "left-out" else []
    if split == "dev":
        return dev
    full = full_path()
    if not full.exists():
        raise SystemExit(f"the left-out LoCoMo conversations need {full}: run `python bench/locomo_data.py --fetch`,"
                         " or put snap-research/LoCoMo's data/locomo10.json there (or set VW_LOCOMO_FULL)")
    left = [c for c in load(full) if c.id not in DEV_IDS]
    return dev + left


def split_of(conversation_id: str) -> str:
    return "dev" if conversation_id in DEV_IDS else "left-out"


if __name__ == "__main__":
    if sys.argv[1:] == ["--fetch"]:
        print(fetch_full())
    else:
        print(f"usage: {sys.argv[0]} --fetch   (downloads the public LoCoMo file into {FULL_CACHE})")
