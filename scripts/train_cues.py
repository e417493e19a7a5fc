"""Rebuild ``src/torchdoctor/explain/cues.json``: the words that point at each family (see
:mod:`torchdoctor.explain.cues`), counted from the project's labelled texts:

* the catalogue's positive fixtures ``tests/fixtures/logs/TDnnn/*.log`` (not ``near-*``): family and code;
* ``tests/eval/reports/<family>/*.log`` and ``tests/eval/world/tune/<family>/*.log``: family only.

Never ``tests/eval/world/frozen``: that half measures what the model was not built from.

    python scripts/train_cues.py            # write the model
    python scripts/train_cues.py --check    # exit 1 when the committed model is stale (a test runs this)
    python scripts/train_cues.py --cv       # leave-one-out accuracy of the guess on the tuning half
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

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


def render(model: dict[str, object]) -> str:
    return json.dumps(model, indent=1, sort_keys=True) + "\n"


def leave_one_out() -> int:
    """Each tuning report guessed by a model trained without it; only the guess, not explain."""
    tune = sorted(LABELLED[1].glob("*/*.log"))
    base = list(documents())
    right = wrong = silent = 0
    buckets: dict[float, list[int]] = {}
    for path in tune:
        text = body(path)
        docs = [d for d in base if not (d[2] is None and d[0] == text and d[1] == path.parent.name)]
        g = cues.guess(text, m=cues.train(docs))
        if g is None:
            silent += 1
            continue
        ok = g.family == path.parent.name
        right += ok
        wrong += not ok
        b = buckets.setdefault(round(g.confidence, 1), [0, 0])
        b[0] += ok
        b[1] += 1
    n = len(tune)
    print(
        f"tuning half, leave-one-out, the word guess alone: right {right}/{n} ({right / n:.1%}), "
        f"wrong {wrong}, silent {silent}"
    )
    for conf, (ok, total) in sorted(buckets.items()):
        print(f"  confidence ~{conf:.1f}: {ok}/{total} right")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when cues.json is not what the data gives")
    parser.add_argument("--cv", action="store_true", help="leave-one-out accuracy on the tuning half")
    args = parser.parse_args(argv)
    if args.cv:
        return leave_one_out()
    text = render(cues.train(documents()))
    if args.check:
        current = cues.MODEL.read_text(encoding="utf-8") if cues.MODEL.exists() else ""
        if current != text:
            print(f"{cues.MODEL.relative_to(REPO)} is stale: run python scripts/train_cues.py", file=sys.stderr)
            return 1
        return 0
    cues.MODEL.write_text(text, encoding="utf-8")
    print(f"wrote {cues.MODEL.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
