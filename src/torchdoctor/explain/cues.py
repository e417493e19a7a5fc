"""Words that point at a family when no signature matched: the last, low-confidence hypothesis.

Some reports hold no line a signature recognises: the error was a screenshot, the paste stops
before the exception, or the report is mostly prose ("training hangs after the first epoch with
num_workers > 0", "each process starts 64 threads"). Silence helps nobody there; a confident
answer would be harmful. This module gives a ranked *family* guess from the report's words, with
its reason (the words) and a confidence that stays at or below :data:`MAX_CONFIDENCE`.

The model is learned, not written by hand: ``cues.json`` beside this module holds two multinomial
logistic regressions whose probabilities are mixed, 0.6 to the words (:data:`WORDS_SHARE`). One reads
the words and word pairs (their presence; these are the words a guess names as its reason), the other
the character 3- to 5-grams of the whitespace-separated words (:func:`char_grams`), which also read what
the word model cannot: other languages (Chinese reports say 多机, 共享内存), identifiers cut or glued to
punctuation (``NCCL_SOCKET_IFNAME=eth0``), numbers inside names. Per code, the words that tell a family's codes
apart (smoothed log-odds) choose the code. ``scripts/train_cues.py`` rebuilds it from the project's
labelled texts (the catalogue's fixtures, ``tests/eval/reports`` and the tuning half of
``tests/eval/world``; never the frozen half) with scikit-learn, records the SHA-256 of those texts,
and a test fails when the texts changed since (the file is stale). Reading the model needs nothing
but the standard library.
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
MIN_CONFIDENCE = 0.05
MIN_SUPPORT = 1.0
"""The summed positive weight of the words that back the named family must reach this: the guess is the
likeliest family the words back this much (a family can rank first on its prior alone), and with none there is
no guess: one weak word is not support. Below it, explain says nothing it cannot stand behind. (Support from the
character model was tried as well, 10-fold CV on the tuning half: it turned 13 abstentions into 6 and 2 answers
right, but it backs a guess on any short traceback, a plain KeyError included: not taken.)"""
MAX_CUES = 6

# training of the per-code cues (which code of a family): a word must occur in at least MIN_DF documents
# of the code, and be at least MIN_RATIO times as frequent there (as a share of documents) as in the
# family's other codes
MIN_DF = 3
MIN_RATIO = 2.5
TOP_PER_CODE = 25
SMOOTH = 1.0

_WORD = re.compile(r"[a-z][a-z_]{2,}")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
_LINKS = re.compile(r"!?\[[^\]\n]{0,300}\]\([^)\s]{0,500}\)|<img[^>\n]{0,500}>|https?://\S+")
"""Markdown images and links, HTML images, bare URLs: screenshot links and host names, not words."""
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


WORDS_SHARE = 0.6
"""The word model's share of a family's probability; the character model has the rest. The words are what a guess
names as its reason, so they weigh more: 10-fold CV on the tuning half gave 638 of 765 right with 0.6 and with
0.5, and with 0.6 Lightning's opposite advice ('does not have many workers', a near miss of TD570) is no longer
guessed as thread oversubscription."""
CHAR_GRAMS = (3, 5)
"""Lengths of the character grams of :func:`char_grams` (sklearn's ``char_wb`` reading: each word padded with
one space on either side)."""
CHAR_BYTES = 64 * 1024
"""The character model reads this much of a text: its grams come from distinct words, so a long log adds little
past its first screens."""
CHAR_WORD = 40
"""Longer words (paths, hashes, base64) are cut to this many characters before their grams are taken."""


def char_grams(text: str) -> set[str]:
    """The distinct character 3- to 5-grams of the distinct lower-cased words of ``text`` (its first and last
    bytes, :data:`CHAR_BYTES` in all), each word padded with a space on either side; links and images dropped."""
    if len(text) > CHAR_BYTES:  # the start of a log and its end (explain appends the error lines it kept)
        text = text[: CHAR_BYTES * 3 // 4] + "\n" + text[-(CHAR_BYTES // 4) :]
    words = set(_LINKS.sub(" ", text).lower().split())
    lo, hi = CHAR_GRAMS
    out: set[str] = set()
    for word in words:
        w = f" {word[:CHAR_WORD]} "
        n = len(w)
        for k in range(lo, hi + 1):
            out.update(w[i : i + k] for i in range(n - k + 1))
    return out


def tokens(text: str) -> set[str]:
    """Lower-cased words (no digits; camel case split, ``DataLoader`` also as ``dataloader``) and
    pairs of adjacent words, as a set: a cue counts once per document. Links and images are dropped."""
    text = _LINKS.sub(" ", text)
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


def family_scores(toks: set[str], m: dict[str, Any]) -> dict[str, tuple[float, list[tuple[float, str]]]]:
    """Per family: its linear score (bias + the weights of the words present) and the words with a
    positive weight for it, strongest first."""
    out: dict[str, tuple[float, list[tuple[float, str]]]] = {}
    for family, entry in m["families"].items():
        weights: dict[str, float] = entry.get("weights", {})
        present = [(weights[t], t) for t in toks if t in weights]
        score = float(entry.get("bias", 0.0)) + sum(w for w, _ in present)
        out[family] = (score, sorted(((w, t) for w, t in present if w > 0), reverse=True))
    return out


def char_probabilities(text: str, m: dict[str, Any]) -> dict[str, float]:
    """The character model's probability of each family for ``text`` (empty without a character model)."""
    chars = m.get("chars")
    if not chars:
        return {}
    order: list[str] = chars["families"]
    weights: dict[str, str] = chars["weights"]  # a gram's weights as one string: parsed only for grams present
    present = [[float(w) for w in weights[g].split()] for g in char_grams(text) if g in weights]
    scale = 1 / math.sqrt(len(present)) if present else 0.0  # binary grams, L2-normalised over the vocabulary
    sums = [0.0] * len(order)
    for row in present:
        for i, w in enumerate(row):
            sums[i] += w
    return probabilities({f: b + scale * s for f, b, s in zip(order, chars["bias"], sums)})


def family_probabilities(
    text: str, m: dict[str, Any], toks: set[str] | None = None
) -> tuple[dict[str, float], dict[str, list[tuple[float, str]]]]:
    """Every family's probability for ``text`` (the word and the character model mixed) and, per family, the
    words with a positive weight for it, strongest first (the reason a guess names, and its support)."""
    toks = tokens(text) if toks is None else toks
    scored = family_scores(toks, m)
    probs = probabilities({f: sc for f, (sc, _) in scored.items()})
    by_chars = char_probabilities(text, m)
    if by_chars:
        probs = {f: WORDS_SHARE * p + (1 - WORDS_SHARE) * by_chars.get(f, 0.0) for f, p in probs.items()}
    return probs, {f: words for f, (_, words) in scored.items()}


def probabilities(scores: dict[str, float]) -> dict[str, float]:
    """Softmax of the families' scores: the model's probability of each family."""
    if not scores:
        return {}
    top = max(scores.values())
    exp = {f: math.exp(s - top) for f, s in scores.items()}
    total = sum(exp.values())
    return {f: e / total for f, e in exp.items()}


def guess(
    text: str,
    allowed_codes: Iterable[str] | None = None,
    m: dict[str, Any] | None = None,
    family: str | None = None,
) -> Guess | None:
    """The family the words of ``text`` point at (or, with ``family``, the guess for that family),
    or None when no family has support in them.

    The family model is a multinomial logistic regression over the words (``scripts/train_cues.py``);
    its probability, capped at :data:`MAX_CONFIDENCE`, is the guess's confidence (cross-validated on
    the tuning half, the probability is about as often right as it says)."""
    m = model() if m is None else m
    if not m.get("families"):
        return None
    text = text[:1_000_000]
    toks = tokens(text)
    probs, supports = family_probabilities(text, m, toks)
    allowed = set(allowed_codes) if allowed_codes is not None else None
    ranked = sorted(probs, key=lambda f: -probs[f]) if family is None else [family] if family in probs else []
    for name in ranked:  # the likeliest family that the words back: none backed, no guess
        support = supports[name]
        if sum(w for w, _ in support) < MIN_SUPPORT:
            continue
        code = _code(m, name, toks, allowed)
        if code is None:
            continue
        confidence = round(max(MIN_CONFIDENCE, min(MAX_CONFIDENCE, probs[name])), 2)
        return Guess(name, code, confidence, tuple(t for _, t in support[:MAX_CUES]))
    return None


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


def train_codes(docs: Iterable[tuple[str, str, str | None]]) -> dict[str, Any]:
    """Per family, per code (documents that name one): the words that tell the code from the family's
    other codes (smoothed log-odds, presence per document)."""
    rows = [(tokens(text), family, code) for text, family, code in docs]
    out: dict[str, Any] = {}
    for family in sorted({f for _, f, _ in rows}):
        coded = [(t, c) for t, f, c in rows if f == family and c]
        per_code: dict[str, Any] = {}
        for code in sorted({c for _, c in coded}):
            odds = _log_odds(coded, code) if len({c for _, c in coded}) > 1 else {}
            top = sorted(odds.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_PER_CODE]
            per_code[code] = {"docs": sum(1 for _, c in coded if c == code), "cues": dict(sorted(top))}
        out[family] = per_code
    return out
