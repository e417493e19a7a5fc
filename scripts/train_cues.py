"""Rebuild ``src/torchdoctor/explain/cues.json``: the words that point at each family (see
:mod:`torchdoctor.explain.cues`), counted from the project's labelled texts:

* the catalogue's positive fixtures ``tests/fixtures/logs/TDnnn/*.log`` (not ``near-*``): family and code;
* ``tests/eval/reports/<family>/*.log`` and ``tests/eval/world/tune/<family>/*.log``: family only.

Never ``tests/eval/world/frozen``: that half measures what the model was not built from.

The family model is two multinomial logistic regressions, one over word presence and one over the
presence of the words' character 3- to 5-grams (L2-normalised, refitted on the CHAR_TOP grams of largest
weight per family), whose probabilities explain mixes, 0.6 to the words (scikit-learn, a dev dependency;
reading the model needs nothing but the standard library). The guess alone in 10-fold CV on the tuning half
(``--cv``, 765 reports): 77.5% right with both models (593; 20 silent), 74.5% with the words alone.
``--check`` compares the SHA-256 of the labelled texts with the one the model records, so it needs no scikit-learn and
does not depend on floating-point details of a BLAS.

    python scripts/train_cues.py            # write the model
    python scripts/train_cues.py --check    # exit 1 when the labelled texts changed (a test runs this)
    python scripts/train_cues.py --cv       # 10-fold accuracy and calibration of the guess on the tuning half
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from torchdoctor.explain import cues  # noqa: E402
from torchdoctor.registry import lookup  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "logs"
LABELLED = (REPO / "tests" / "eval" / "reports", REPO / "tests" / "eval" / "world" / "tune")
HEADER_END = "# ---"


def body(path: Path) -> str:
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    return "\n".join(lines[lines.index(HEADER_END) + 1 :]) if HEADER_END in lines else "\n".join(lines)


def documents(skip: Path | None = None) -> Iterator[tuple[str, str, str | None]]:
    for path in sorted(FIXTURES.glob("TD*/*.log")):
        if path.name.startswith("near-"):
            continue
        code = path.parent.name
        yield body(path), lookup(code).family, code
    for root in LABELLED:
        for path in sorted(root.glob("*/*.log")):
            if path != skip:
                yield body(path), path.parent.name, None


C = 1.0
"""Inverse regularisation of the logistic regression (scikit-learn's default; 10 was worse in 10-fold CV)."""
MIN_DOCS = 2
"""A word is a feature when at least this many training texts have it."""
TOP_WEIGHTS = 1000
"""Per family, the words with the largest absolute weight kept (10-fold CV: 2000 kept gave the same
right answers as all, 1000 one fewer of 255)."""
FOLDS = 10
CHAR_C = 20.0
"""Inverse regularisation of the character model (grams L2-normalised per text want a weaker penalty)."""
CHAR_MIN_DOCS = 3
CHAR_TOP = 500
"""Per family, the character grams of largest absolute weight kept for the refit."""
CLASS_WEIGHT = "balanced"
"""Both regressions weigh each family's texts by the inverse of its share, so every family counts alike (the
tuning half is uneven: 102 host-oom reports, 2 shm-map-count; the frozen half and the per-family targets are
even). 10-fold CV on the tuning half (846 reports): 697 right against 693 unweighted, per-family mean 84.8%
against 84.2%."""
VERSION = 3


def data_digest(docs: list[tuple[str, str, str | None]]) -> str:
    h = hashlib.sha256()
    for text, family, code in docs:
        h.update(f"{family}\0{code or ''}\0{len(text)}\0".encode())
        h.update(text.encode("utf-8", errors="replace"))
    return h.hexdigest()


def fit(docs: list[tuple[str, str, str | None]]) -> dict[str, Any]:
    """A model from ``(text, family, code or None)`` documents: per family a logistic regression's bias
    and word weights, per code the words that tell it from its family's other codes."""
    try:
        from sklearn.feature_extraction.text import CountVectorizer
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise SystemExit("training the word model needs scikit-learn: pip install -e '.[dev]'") from None
    import numpy as np

    rows = [sorted(cues.tokens(text)) for text, _, _ in docs]
    labels = [family for _, family, _ in docs]
    vec = CountVectorizer(analyzer=lambda toks: toks, binary=True, min_df=MIN_DOCS)
    x = vec.fit_transform(rows)
    clf = LogisticRegression(C=C, max_iter=2000, class_weight=CLASS_WEIGHT).fit(x, labels)
    vocab = vec.get_feature_names_out()
    families: dict[str, object] = {}
    for i, family in enumerate(clf.classes_):
        w = clf.coef_[i]
        keep = sorted(np.argsort(-np.abs(w), kind="stable")[:TOP_WEIGHTS], key=lambda j: vocab[j])
        families[str(family)] = {
            "bias": round(float(clf.intercept_[i]), 4),
            "weights": {str(vocab[j]): round(float(w[j]), 4) for j in keep if round(float(w[j]), 4) != 0},
        }
    return {
        "version": VERSION,
        "documents": len(docs),
        "data_sha256": data_digest(docs),
        "families": families,
        "chars": fit_chars(docs),
        "codes": cues.train_codes(docs),
    }


def fit_chars(docs: list[tuple[str, str, str | None]]) -> dict[str, object]:
    """The character model: a logistic regression over the presence of the texts' character grams
    (:func:`torchdoctor.explain.cues.char_grams`, L2-normalised), refitted on the CHAR_TOP grams of largest weight
    per family so the model stays small; weights per gram, one per family in ``families`` order."""
    import numpy as np
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    labels = [family for _, family, _ in docs]
    grams = [cues.char_grams(text) for text, _, _ in docs]

    def vectorizer(vocabulary: object = None) -> TfidfVectorizer:
        return TfidfVectorizer(
            analyzer=lambda g: g,
            binary=True,
            use_idf=False,
            min_df=1 if vocabulary is not None else CHAR_MIN_DOCS,
            vocabulary=vocabulary,
        )

    vec = vectorizer()
    clf = LogisticRegression(C=CHAR_C, max_iter=3000, class_weight=CLASS_WEIGHT).fit(vec.fit_transform(grams), labels)
    keep = sorted(set(np.argsort(-np.abs(clf.coef_), axis=1, kind="stable")[:, :CHAR_TOP].ravel().tolist()))
    vocab = [str(g) for g in vec.get_feature_names_out()[keep]]
    vec = vectorizer(vocab)
    clf = LogisticRegression(C=CHAR_C, max_iter=3000, class_weight=CLASS_WEIGHT).fit(vec.fit_transform(grams), labels)
    names = vec.get_feature_names_out()
    return {
        "families": [str(f) for f in clf.classes_],
        "bias": [round(float(b), 4) for b in clf.intercept_],
        # one string per gram (a line of cues.json): loading the model parses 5k strings, not 80k numbers
        "weights": {str(g): " ".join(f"{float(w):.3f}" for w in clf.coef_[:, j]) for j, g in enumerate(names)},
    }


def render(model: dict[str, Any]) -> str:
    """The model as JSON, one entry a line; a character gram and its weights on one line."""
    chars = model["chars"]
    rest = {**model, "chars": {**chars, "weights": "@WEIGHTS@"}}
    rows = ",\n".join(f"{json.dumps(g)}:{json.dumps(w)}" for g, w in sorted(chars["weights"].items()))
    return json.dumps(rest, indent=0, sort_keys=True).replace('"@WEIGHTS@"', "{\n" + rows + "\n}") + "\n"


def cross_validate() -> int:
    """The tuning half in FOLDS folds: each report guessed by a model trained without its fold; only the
    word guess (what explain says when no line is recognised), with its calibration."""
    tune = sorted(LABELLED[1].glob("*/*.log"))
    base = list(documents())
    right = wrong = silent = 0
    buckets: dict[tuple[float, float], list[int]] = {b: [0, 0] for b in ((0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 1.01))}
    for k in range(FOLDS):
        held = [p for i, p in enumerate(tune) if i % FOLDS == k]
        texts = {body(p) for p in held}
        m = fit([d for d in base if not (d[2] is None and d[0] in texts)])
        for path in held:
            g = cues.guess(body(path), m=m)
            if g is None:
                silent += 1
                continue
            ok = g.family == path.parent.name
            right += ok
            wrong += not ok
            for (lo, hi), b in buckets.items():
                if lo <= g.confidence < hi:
                    b[0] += ok
                    b[1] += 1
    n = len(tune)
    print(
        f"tuning half, {FOLDS}-fold, the word guess alone: right {right}/{n} ({right / n:.1%}), "
        f"wrong {wrong}, silent {silent}"
    )
    for (lo, hi), (ok, total) in buckets.items():
        print(f"  confidence {lo:.1f}-{min(hi, 1):.1f}: {ok}/{total} right")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when the labelled texts changed since cues.json")
    parser.add_argument("--cv", action="store_true", help=f"{FOLDS}-fold accuracy of the guess on the tuning half")
    args = parser.parse_args(argv)
    if args.cv:
        return cross_validate()
    docs = list(documents())
    if args.check:
        current = cues.model() if cues.MODEL.exists() else {}
        if current.get("data_sha256") != data_digest(docs) or current.get("version") != VERSION:
            print(f"{cues.MODEL.relative_to(REPO)} is stale: run python scripts/train_cues.py", file=sys.stderr)
            return 1
        return 0
    cues.MODEL.write_text(render(fit(docs)), encoding="utf-8")
    print(f"wrote {cues.MODEL.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
