"""Words that point at a family when no signature matched: the last, low-confidence hypothesis.

Some reports hold no line a signature recognises: the error was a screenshot, the paste stops
before the exception, or the report is mostly prose ("training hangs after the first epoch with
num_workers > 0", "each process starts 64 threads"). Silence helps nobody there; a confident
answer would be harmful. This module gives a ranked *family* guess from the report's words, with
its reason (the words) and a confidence that stays at or below :data:`MAX_CONFIDENCE`.

The model is counted, not written by hand: ``cues.json`` beside this module holds, per family,
the words and word pairs that are much more frequent in that family's real reports and fixtures
than in the others' (smoothed log-odds, presence per document), and per code the words that tell
a family's codes apart. ``scripts/train_cues.py`` rebuilds it from the project's labelled texts
(the catalogue's fixtures, ``tests/eval/reports`` and the tuning half of ``tests/eval/world``;
never the frozen half), and a test fails when the file is stale.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

MODEL = Path(__file__).with_name("cues.json")
MAX_CONFIDENCE = 0.7
"""A guess from words never claims more: sure answers (>= 0.8) come from signatures only."""
MIN_CONFIDENCE = 0.15
MIN_CUES = 3
"""Distinct cue words a guess needs; one or two words are a coincidence."""
MIN_SCORE = 10.0
"""Summed log-odds a family's cues must reach before it is named at all. With :data:`MIN_CUES`,
chosen on the tuning half (leave-one-out): it gave the most right guesses net of wrong ones
(98 right, 24 wrong of 177; 2.5 and 2 cues gave 116 and 53)."""
MARGIN_SCALE = 4.0
"""How fast confidence grows with the lead over the runner-up family (log-odds units)."""

# training: a word must occur in at least MIN_DF documents of the family, and be at least
# MIN_RATIO times as frequent there (as a share of documents) as in the other families
MIN_DF = 3
MIN_RATIO = 2.5
TOP_PER_FAMILY = 120
TOP_PER_CODE = 25
SMOOTH = 1.0

_WORD = re.compile(r"[a-z][a-z_]{2,}")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
STOP = frozenset(
    "the and for with that this from are was were have has had not but you your can when what which will would "
    "there their they then than into also just only some any all one two out use used using get got set its it's "
    "our ours his her him she how why where here been being did does doing each other more most such very same "
    "after before again about over under while these those them see seems seem like try tried trying run running "
    "ran code issue issues question thanks thank please help hello anyone problem error errors line file files "
    "torchdoctor lab scenarios work main src tmp pytest home user users python site_packages packages lib local "
    "usr opt conda anaconda envs env venv dist_packages module string recent call last most traceback".split()
)
"""Words that say nothing of a family, and the project's own paths in recorded fixtures."""


def tokens(text: str) -> set[str]:
    """Lower-cased words (no digits; camel case split, ``DataLoader`` also as ``dataloader``) and
    pairs of adjacent words, as a set: a cue counts once per document."""
    spaced = _CAMEL.sub(" ", text)
    words = [w for w in _WORD.findall(spaced.lower()) if w not in STOP]
    out = set(words)
    out.update(w for w in _WORD.findall(text.lower()) if w not in STOP)
    out.update(f"{a} {b}" for a, b in zip(words, words[1:]))
    return out


@dataclass(frozen=True)
class Guess:
    family: str
    code: str
    confidence: float
    cues: tuple[str, ...]
    """The words behind the guess, strongest first."""


@lru_cache(maxsize=1)
def model() -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = json.loads(MODEL.read_text(encoding="utf-8"))
        return loaded
    except (OSError, ValueError):
        return {"families": {}, "codes": {}}


def guess(text: str, allowed_codes: Iterable[str] | None = None, m: dict[str, Any] | None = None) -> Guess | None:
    """The family the words of ``text`` point at, or None when no family's cues are strong enough."""
    m = model() if m is None else m
    toks = tokens(text[:1_000_000])
    allowed = set(allowed_codes) if allowed_codes is not None else None
    scored = []
    for family, cues in m["families"].items():
        hit = sorted(((w, t) for t, w in cues.items() if t in toks), reverse=True)
        score = sum(w for w, _ in hit)
        scored.append((score, family, hit))
    scored.sort(key=lambda s: -s[0])
    if not scored:
        return None
    score, family, hit = scored[0]
    runner_up = scored[1][0] if len(scored) > 1 else 0.0
    if score < MIN_SCORE or len(hit) < MIN_CUES:
        return None
    code = _code(m, family, toks, allowed)
    if code is None:
        return None
    lead = 1 - math.exp(-(score - runner_up) / MARGIN_SCALE)
    confidence = round(MIN_CONFIDENCE + (MAX_CONFIDENCE - MIN_CONFIDENCE) * lead, 2)
    return Guess(family, code, confidence, tuple(t for _, t in hit[:6]))


def _code(m: dict[str, Any], family: str, toks: set[str], allowed: set[str] | None) -> str | None:
    codes = m["codes"].get(family, {})
    best: tuple[float, int, str] | None = None
    for code, entry in codes.items():
        if allowed is not None and code not in allowed:
            continue
        score = sum(w for t, w in entry["cues"].items() if t in toks)
        key = (score, entry["docs"], code)
        if best is None or key > best:
            best = key
    return best[2] if best else None


# --------------------------------------------------------------------------- training


def _log_odds(docs: list[tuple[set[str], str]], label: str) -> dict[str, float]:
    inside = [t for t, lab in docs if lab == label]
    outside = [t for t, lab in docs if lab != label]
    if not inside or not outside:
        return {}
    df_in: Counter[str] = Counter()
    df_out: Counter[str] = Counter()
    for t in inside:
        df_in.update(t)
    for t in outside:
        df_out.update(t)
    out = {}
    for tok, n in df_in.items():
        if n < MIN_DF:
            continue
        p_in = (n + SMOOTH) / (len(inside) + 2 * SMOOTH)
        p_out = (df_out.get(tok, 0) + SMOOTH) / (len(outside) + 2 * SMOOTH)
        if p_in >= MIN_RATIO * p_out:
            out[tok] = round(math.log(p_in / p_out), 3)
    return out


def train(docs: Iterable[tuple[str, str, str | None]]) -> dict[str, Any]:
    """A model from ``(text, family, code or None)`` documents: per family its strongest cues,
    per code (documents that name one) the cues that tell it from its family's other codes."""
    rows = [(tokens(text), family, code) for text, family, code in docs]
    fam_docs = [(t, f) for t, f, _ in rows]
    families = sorted({f for _, f in fam_docs})
    out: dict[str, Any] = {"version": 1, "families": {}, "codes": {}, "documents": len(rows)}
    for family in families:
        odds = _log_odds(fam_docs, family)
        top = sorted(odds.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_PER_FAMILY]
        out["families"][family] = dict(sorted(top))
        coded = [(t, c) for t, f, c in rows if f == family and c]
        per_code: dict[str, Any] = {}
        for code in sorted({c for _, c in coded}):
            odds = _log_odds(coded, code) if len({c for _, c in coded}) > 1 else {}
            top = sorted(odds.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_PER_CODE]
            per_code[code] = {"docs": sum(1 for _, c in coded if c == code), "cues": dict(sorted(top))}
        out["codes"][family] = per_code
    return out
