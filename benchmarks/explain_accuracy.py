"""Accuracy and calibration of `torchdoctor explain` on real failure reports, against a keyword grep.

Three sets of real reports from public threads (``--set``, default ``all``):

* ``frozen``: ``tests/eval/world/frozen/``, the test half of the world set, split off before any
  signature changed. **Only totals are ever printed for it** (per family, calibration, overall),
  whatever the flags: nobody reads its misses one by one.
* ``tune``: ``tests/eval/world/tune/``, the other half; signature authors read its misses.
* ``old``: ``tests/eval/reports/``, the first held-out set (issue 4), since tuned to.

Each file is a header of ``# `` lines closed
by a line that is exactly ``# ---``, then the user's pasted log text, verbatim::

    # source: https://github.com/OWNER/REPO/issues/N (who posted the text)
    # family: shm-exhausted            <- the root cause as settled in the thread
    # settled-by: docker run --shm-size=3G
    # fix-keywords: shm-size; ipc=host  <- any of these in the top diagnosis' fix = "fix named"
    # ---
    <log text>

For every report this runs ``torchdoctor.explain.explain(text)`` in-process and records:

- **right family first**: the top diagnosis' family is the expected family;
- **fix named**: the family is right *and* the top diagnosis' fix text contains one of the
  report's fix keywords (case-insensitive);
- where the expected family ranks, if anywhere, among all diagnoses.

Then it prints, per set: a table (report, expected family, top code+family, hit/miss, fix hit;
not for ``frozen``), accuracy per family, the overall "right family first" and "fix named" rates,
the same rate for a one-minute keyword grep (:data:`GREP_RULES`), a calibration table (the top
diagnosis' confidence bucket → how often it is right), and every miss with the top three
diagnoses (not for ``frozen``). Last, the calibration over all held-out sets together: answers
given with confidence >= 0.8 should be right >= 95% of the time. It is a measurement: the exit code
is 0 whatever the accuracy.

    python benchmarks/explain_accuracy.py [--set all|frozen|tune|old] [--json] [--summary] [--family SLUG]
    python benchmarks/explain_accuracy.py --set tune --cv    # word model refitted in 10 folds (about 4 min)
    python benchmarks/explain_accuracy.py --seen URL [URL ...]   # gathering: is this thread already used?
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "tests" / "eval" / "reports"
WORLD = REPO / "tests" / "eval" / "world"
SETS = {"frozen": WORLD / "frozen", "tune": WORLD / "tune", "old": REPORTS}
BUCKETS = ((0.0, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 1.01))
GREP_RULES = (
    # the one-minute grep a person would write from the failure families' usual texts: the first rule
    # (in this order) whose pattern occurs anywhere in the report names its family
    (r"unable to mmap|max_map_count", "shm-map-count"),
    (r"Bus error|shared memory|/dev/shm|shm-size", "shm-exhausted"),
    (r"Too many open files|ancdata", "fd-exhausted"),
    (r"(?i)pickl|Can't get attribute|bootstrapping phase", "worker-pickling"),
    (r"CUDA out of memory|out of memory", "cuda-oom"),
    (r"(?i)NCCL", "nccl"),
    (r"CUDA-capable|invalid device ordinal|NVIDIA driver|CUDA_VISIBLE_DEVICES", "gpu-unavailable"),
    (r"Address already in use|EADDRINUSE", "dist-port"),
    (r"Connection refused|timed out|Connection reset", "dist-connect"),
    (r"expected, but not set|MASTER_ADDR|local_rank|WORLD_SIZE", "dist-env"),
    (r"(?i)timeout|hang|stuck", "dist-hang"),
    (r"mismatch|find_unused_parameters|different on each rank", "rank-divergence"),
    (r"Killed|SIGKILL|can't allocate memory|-9", "host-oom"),
    (r"DataLoader worker|Segmentation fault|segfault", "worker-crash"),
    (r"No space left|Permission denied|No such file|zip archive|PytorchStreamReader", "checkpoint-io"),
    (r"(?i)FileExistsError|corrupt|interleav", "concurrent-write"),
    (r"(?i)OMP_NUM_THREADS|threads|slow", "thread-oversubscription"),
)
HEADER_END = "# ---"
REQUIRED = ("source", "family", "settled-by")
TARGET = 0.90


@dataclass
class Report:
    """One held-out report: its header fields and the pasted log text."""

    path: Path
    header: dict[str, list[str]]
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.parent.name}/{self.path.stem}"

    def field(self, name: str) -> str:
        values = self.header.get(name)
        return values[0].strip() if values else ""

    @property
    def family(self) -> str:
        return self.field("family")

    @property
    def source_url(self) -> str:
        m = re.search(r"https?://\S+", self.field("source"))
        return m.group(0).rstrip(").,;") if m else ""

    @property
    def fix_keywords(self) -> list[str]:
        return [k.strip() for k in self.field("fix-keywords").split(";") if k.strip()]


@dataclass
class Seen:
    """One diagnosis as the harness reports it."""

    code: str
    family: str
    role: str
    confidence: float
    line: str


@dataclass
class Result:
    """What explain said about one report, judged against the settled family and fix."""

    id: str
    source: str
    expected: str
    top_code: str | None
    top_family: str | None
    top_role: str | None
    hit: bool
    fix_named: bool
    expected_rank: int | None
    """1-based position of the first diagnosis of the expected family, None when absent."""
    top3: list[Seen] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    seconds: float = 0.0
    confidence: float | None = None
    """The top diagnosis' confidence (None: no diagnosis, an abstention)."""
    grep_family: str | None = None
    """What the keyword grep (:data:`GREP_RULES`) says."""


def parse_report(path: Path) -> Report:
    """Split a report into header fields (``# key: value``) and the text after ``# ---``."""
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    if HEADER_END not in lines:
        raise ValueError(f"{path}: no '{HEADER_END}' line closing the header")
    end = lines.index(HEADER_END)
    header: dict[str, list[str]] = {}
    for line in lines[:end]:
        if not line.startswith("# "):
            raise ValueError(f"{path}: header line does not start with '# ': {line!r}")
        m = re.match(r"# ([\w-]+):\s*(.*)$", line)
        if m:
            header.setdefault(m.group(1).lower(), []).append(m.group(2))
    return Report(path, header, "\n".join(lines[end + 1 :]))


def load_reports(root: Path = REPORTS, family: str | None = None) -> list[Report]:
    paths = sorted(root.glob("*/*.log"))
    reports = [parse_report(p) for p in paths]
    return [r for r in reports if family is None or r.family == family]


def _first_line(diag: Any) -> str:
    return diag.evidence[0].text.strip() if diag.evidence else ""


def fix_names_keyword(fix: str, keywords: list[str]) -> bool:
    low = fix.lower()
    return any(k.lower() in low for k in keywords)


def grep_family(text: str) -> str | None:
    for pattern, family in GREP_RULES:
        if re.search(pattern, text):
            return family
    return None


def evaluate(report: Report) -> Result:
    """Run the real engine on one report and judge the top diagnosis."""
    from torchdoctor.explain import explain

    start = time.perf_counter()
    out = explain(report.text)
    seconds = time.perf_counter() - start
    diags = out.diagnoses
    top = diags[0] if diags else None
    hit = top is not None and top.family == report.family
    fix_named = bool(hit and top is not None and fix_names_keyword(top.fix, report.fix_keywords))
    rank = next((i + 1 for i, d in enumerate(diags) if d.family == report.family), None)
    return Result(
        id=report.id,
        source=report.source_url,
        expected=report.family,
        top_code=top.code if top else None,
        top_family=top.family if top else None,
        top_role=top.role if top else None,
        hit=hit,
        fix_named=fix_named,
        expected_rank=rank,
        top3=[Seen(d.code, d.family, d.role, round(d.confidence, 2), _first_line(d)) for d in diags[:3]],
        unmatched=[u.ref.text.strip() for u in out.unmatched_errors[:3]],
        seconds=seconds,
        confidence=round(top.confidence, 3) if top else None,
        grep_family=grep_family(report.text),
    )


def summarize(results: list[Result]) -> dict[str, Any]:
    """Overall and per-family rates."""
    per: dict[str, dict[str, int]] = defaultdict(lambda: {"n": 0, "hit": 0, "fix": 0})
    for r in results:
        per[r.expected]["n"] += 1
        per[r.expected]["hit"] += int(r.hit)
        per[r.expected]["fix"] += int(r.fix_named)
    n = len(results)
    return {
        "reports": n,
        "grep_right_family": sum(r.grep_family == r.expected for r in results) / n if n else 0.0,
        "calibration": calibration(results),
        "families": len(per),
        "right_family_first": sum(r.hit for r in results) / n if n else 0.0,
        "fix_named": sum(r.fix_named for r in results) / n if n else 0.0,
        "family_anywhere": sum(r.expected_rank is not None for r in results) / n if n else 0.0,
        "no_diagnosis": sum(r.top_code is None for r in results),
        "target": TARGET,
        "per_family": {
            fam: {"n": v["n"], "right_family_first": v["hit"] / v["n"], "fix_named": v["fix"] / v["n"]}
            for fam, v in sorted(per.items())
        },
    }


def calibration(results: list[Result]) -> list[dict[str, Any]]:
    """Per confidence bucket of the top diagnosis: answers, right ones, accuracy; then abstentions."""
    rows = []
    for lo, hi in BUCKETS:
        got = [r for r in results if r.confidence is not None and lo <= r.confidence < hi]
        rows.append(
            {
                "bucket": f"{lo:.1f}-{min(hi, 1.0):.1f}",
                "n": len(got),
                "right": sum(r.hit for r in got),
                "accuracy": sum(r.hit for r in got) / len(got) if got else None,
            }
        )
    none = [r for r in results if r.confidence is None]
    rows.append({"bucket": "no answer", "n": len(none), "right": 0, "accuracy": None})
    return rows


def run(root: Path = REPORTS, family: str | None = None) -> tuple[list[Result], dict[str, Any]]:
    results = [evaluate(r) for r in load_reports(root, family)]
    return results, summarize(results)


def run_cross_validated(root: Path, family: str | None = None) -> tuple[list[Result], dict[str, Any]]:
    """The tune half with explain's word model (its word and character regressions) refitted in folds
    (``scripts/train_cues.py``): each report is explained by a word model that never read it. The signatures have still been tuned on
    this half; this only takes out the word model's memory of it. Needs scikit-learn."""
    sys.path.insert(0, str(REPO / "scripts"))
    import train_cues  # type: ignore[import-not-found]
    from torchdoctor.explain import cues

    reports = load_reports(root, family)
    order = sorted(root.glob("*/*.log"))
    fold_of = {p: i % train_cues.FOLDS for i, p in enumerate(order)}
    base = list(train_cues.documents())
    results: list[Result] = []
    saved = cues.model
    try:
        for k in range(train_cues.FOLDS):
            held = [r for r in reports if fold_of[r.path] == k]
            texts = {train_cues.body(r.path) for r in held}
            fitted = train_cues.fit([d for d in base if not (d[2] is None and d[0] in texts)])
            cues.model = lambda fitted=fitted: fitted  # type: ignore[assignment]
            results += [evaluate(r) for r in held]
    finally:
        cues.model = saved
    results.sort(key=lambda r: (r.expected, r.id))
    return results, summarize(results)


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_text(results: list[Result], summary: dict[str, Any], details: bool = True) -> str:
    """Per-report table and misses (``details``), per-family table and totals.

    Signature authors must not tune to the held-out reports: they run with ``--summary``, which
    prints only the per-family table and the totals.
    """
    out: list[str] = []
    if details:
        out.append(f"{'report':<44} {'expected':<24} {'top diagnosis':<34} {'family':<5} fix")
        for r in results:
            top = f"{r.top_code} {r.top_family}" if r.top_code else "no diagnosis"
            out.append(
                f"{_clip(r.id, 44):<44} {r.expected:<24} {_clip(top, 34):<34} "
                f"{'hit' if r.hit else 'MISS':<5} {'yes' if r.fix_named else '-'}"
            )
        out.append("")
    out.append(f"{'family':<24} {'n':>3} {'first':>7} {'fix':>7}")
    for fam, v in summary["per_family"].items():
        out.append(f"{fam:<24} {v['n']:>3} {v['right_family_first']:>7.0%} {v['fix_named']:>7.0%}")
    out.append("")
    out.append(f"reports: {summary['reports']} over {summary['families']} families")
    out.append(f"right family first: {summary['right_family_first']:.1%} (target {summary['target']:.0%})")
    out.append(f"fix named:          {summary['fix_named']:.1%}")
    out.append(f"family anywhere:    {summary['family_anywhere']:.1%}   no diagnosis at all: {summary['no_diagnosis']}")
    out.append(f"keyword grep:       {summary['grep_right_family']:.1%} right family (the baseline)")
    out.append(render_calibration(summary["calibration"]))
    misses = [r for r in results if not r.hit] if details else []
    if misses:
        out.append("")
        out.append(f"misses ({len(misses)}):")
    for r in misses:
        where = f"expected family at #{r.expected_rank}" if r.expected_rank else "expected family absent"
        out.append(f"- {r.id} (expected {r.expected}; {where}) {r.source}")
        if not r.top3:
            out.append("    no diagnosis")
            for u in r.unmatched:
                out.append(f"    unmatched: {_clip(u, 110)}")
        for s in r.top3:
            out.append(f"    {s.code} {s.family} [{s.role} {s.confidence}] {_clip(s.line, 90)}")
    return "\n".join(out)


def render_calibration(rows: list[dict[str, Any]]) -> str:
    out = [f"{'confidence':<12} {'answers':>7} {'right':>6} {'accuracy':>9}"]
    for row in rows:
        acc = f"{row['accuracy']:.0%}" if row["accuracy"] is not None else "-"
        out.append(f"{row['bucket']:<12} {row['n']:>7} {row['right']:>6} {acc:>9}")
    return "\n".join(out)


def thread_key(url: str) -> str:
    """``https://github.com/Owner/Repo/issues/12#x`` -> ``github.com/owner/repo/12`` (issues and
    pull requests share one number space); other URLs without scheme, query or fragment."""
    url = url.strip().rstrip(").,;'\"`>").lower()
    url = re.sub(r"^https?://(www\.)?", "", url).split("#")[0].split("?")[0].rstrip("/")
    m = re.match(r"github\.com/([^/]+)/([^/]+)/(?:issues|pull|discussions)/(\d+)", url)
    return f"github.com/{m.group(1)}/{m.group(2)}/{m.group(3)}" if m else url


def used_threads(roots: tuple[Path, ...] = (REPO / "tests" / "fixtures", REPO / "tests" / "eval")) -> set[str]:
    """Every thread a file under ``roots`` cites anywhere in its text (fixtures, both halves, the old set)."""
    keys: set[str] = set()
    for root in roots:
        for path in root.rglob("*"):
            if not path.is_file():
                continue
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            keys.update(thread_key(u) for u in re.findall(r"https?://[^\s)\"'>`\]]+", text))
    return keys


def is_frozen(root: Path) -> bool:
    """The frozen half (or anything inside it): only totals may be shown."""
    try:
        root.resolve().relative_to(SETS["frozen"].resolve())
    except ValueError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument(
        "--set",
        choices=(*SETS, "all"),
        default=None,
        help="which corpus: frozen (totals only), tune, old, or all (default)",
    )
    ap.add_argument("--reports", type=Path, help="another corpus root (a frozen one still shows totals only)")
    ap.add_argument("--family", help="only the reports of this family")
    ap.add_argument(
        "--summary",
        action="store_true",
        help="only the per-family table and totals (what signature authors may look at)",
    )
    ap.add_argument(
        "--cv",
        action="store_true",
        help="tune half only: refit explain's word model in 10 folds so no report is explained by a word model "
        "that read it (needs scikit-learn)",
    )
    ap.add_argument(
        "--seen",
        nargs="+",
        metavar="URL",
        help="for people gathering reports: print NEW or USED for each thread (cited by a fixture or any report of "
        "any set), never which file cites it, and exit",
    )
    args = ap.parse_args(argv)
    if args.seen:
        used = used_threads()
        for url in args.seen:
            print(f"{'USED' if thread_key(url) in used else 'NEW '} {url}")
        return 0
    sys.path.insert(0, str(REPO / "src"))
    if args.cv and args.set != "tune":
        ap.error("--cv needs --set tune (the frozen half was never read by the word model; the old set is in it)")
    if args.reports is not None:
        roots = {str(args.reports): args.reports}
    elif args.set in (None, "all"):
        roots = {name: SETS[name] for name in ("frozen", "tune", "old")}
    else:
        roots = {args.set: SETS[args.set]}
    doc: dict[str, Any] = {}
    everything: list[Result] = []
    for name, root in roots.items():
        results, summary = run_cross_validated(root, args.family) if args.cv else run(root, args.family)
        everything += results
        details = not args.summary and not is_frozen(root)
        if args.json:
            doc[name] = {"summary": summary, **({"results": [asdict(r) for r in results]} if details else {})}
        else:
            print(f"== {name}: {root.relative_to(REPO) if root.is_relative_to(REPO) else root}")
            print(render_text(results, summary, details=details))
            print()
    overall = calibration(everything)
    sure = overall[-2]
    if args.json:
        doc["calibration_all"] = overall
        print(json.dumps(doc if len(roots) > 1 else doc[next(iter(roots))] | {"calibration_all": overall}, indent=2))
    elif len(roots) > 1:
        print(f"== calibration over {', '.join(roots)} ({len(everything)} reports)")
        print(render_calibration(overall))
        if sure["n"]:
            print(
                f"answers with confidence >= 0.8: {sure['right']}/{sure['n']} right = {sure['accuracy']:.1%} (target >= 95%)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
