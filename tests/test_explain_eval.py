"""Held-out evaluation of `torchdoctor explain` (issue 4, "Quality target").

The corpus under ``tests/eval/reports/<family>/`` holds real failure reports copied verbatim from
public threads that the signature authors have not used: no report may share a thread with a
fixture under ``tests/fixtures/``. ``benchmarks/explain_accuracy.py`` measures how often the top
diagnosis has the family the thread settled on, and whether its fix names the fix that settled it.
These tests keep the corpus honest and guard the measured accuracy against regressions.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from torchdoctor.families import FAMILIES

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "benchmarks" / "explain_accuracy.py"
FIXTURES = REPO / "tests" / "fixtures"

# Regression floors: the measured values rounded DOWN to the nearest 5%.
# First measured 58.0% / 55.7% (51/88, 49/88); after widening the signatures from other public
# reports (the miss categories, not these files): 93.2% / 93.2% (82/88) on 2026-11-22.
# Raise these when signatures improve; never lower them to make a change pass.
RIGHT_FAMILY_FLOOR = 0.90
FIX_NAMED_FLOOR = 0.90
MIN_REPORTS = 80
# The world set (issue 9), measured 2026-11-24: frozen half 58.3% (56/96; 39.6% before any change,
# keyword grep 52.1%), tune half 94.3% (82/87; tuned to). Session 3: the word guess for reports
# nothing recognises (explain/cues.py, trained on the tune half, never the frozen one): frozen
# 70.8% (68/96). The tune half grew to 177 reports (90 gathered after the split, not tuned to):
# 88.7%, so its floor is 85% for the larger set. The guess then got stricter thresholds (3 cues,
# score 10: chosen on the tune half, leave-one-out, as the most right guesses net of wrong ones,
# which also keeps guesses off plain tracebacks and near misses): frozen 67.7% (65/96), floor 65%.
# Session 6: the word guess became a logistic regression over word presence (abstaining only
# without support), a sure answer the words rule out is demoted, and the tune half grew to 255 (66
# not tuned to): frozen 77.1% (74/96), tune 96.1% (the word model has read it; 85.1% with the word
# model cross-validated in 10 folds). With 55 more tune reports (310): frozen 77.1% again, tune 94.8%
# (82.6% cross-validated).
# Session 10: words may overrule a symptom that leads (rule 10): frozen 83.3% (80/96), tune 97.8% (80.0%
# cross-validated); with 43 more tune reports (669; 81.4% of them right before the word model read them):
# frozen 83.3%, tune 97.5% (80.7% cross-validated; rule 10 then limited to leading hypotheses).
# Session 11: one sentence read by several symptoms counts once, TD498/TD451 prose, rule 11 (generic NCCL errors
# on several nodes read as dist-connect), TD356 no longer sure, rank-divergence behind a hang (rule 10), 96 more
# tune reports (765; 59.4% of them right before anything was written from them): frozen 86.5% (83/96), tune 97.3%
# (79.7% cross-validated).
# Session 12: a character-gram model beside the word model: frozen 86.5%, tune 97.6% (83.4% cross-validated).
# Session 13: 125 more tune reports (890; 74.1% and 84.1% of the two batches right before anything was written
# from them), families weighed evenly, TD448/TD449: frozen 85.4% (82/96), tune 96.9% (82.8% cross-validated).
# Floors rounded down to 5%; never lowered for the same code and set.
WORLD_FROZEN_FLOOR = 0.85
WORLD_TUNE_FLOOR = 0.90
MIN_FAMILIES = 14


def _load_harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("explain_accuracy", HARNESS)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


H = _load_harness()
REPORTS = H.load_reports()
FROZEN = H.load_reports(H.SETS["frozen"])
TUNE = H.load_reports(H.SETS["tune"])
WORLD = FROZEN + TUNE
EVERY = REPORTS + WORLD


thread_key = H.thread_key


def fixture_threads() -> set[str]:
    """Every GitHub thread any fixture file under tests/fixtures cites, anywhere in its text."""
    return {k for k in H.used_threads((FIXTURES,)) if "github.com/" in k}


def test_corpus_size_and_breadth() -> None:
    families = {r.family for r in REPORTS}
    assert len(REPORTS) >= MIN_REPORTS, f"only {len(REPORTS)} held-out reports"
    assert len(families) >= MIN_FAMILIES, f"only {len(families)} families covered: {sorted(families)}"


@pytest.mark.parametrize("report", EVERY, ids=lambda r: f"{r.path.parent.parent.name}/{r.id}")
def test_report_is_well_formed(report) -> None:
    for key in H.REQUIRED:
        assert report.field(key), f"{report.path}: header lacks '# {key}:'"
    assert report.family in FAMILIES, f"{report.path}: unknown family {report.family!r}"
    assert report.path.parent.name == report.family, f"{report.path}: filed under the wrong family directory"
    assert report.source_url.startswith("https://"), f"{report.path}: the source must be a public URL"
    assert report.fix_keywords, f"{report.path}: no '# fix-keywords:' to judge the fix against"
    assert report.text.strip(), f"{report.path}: no log text after '# ---'"


def test_sources_are_unique() -> None:
    seen: dict[str, str] = {}
    for r in EVERY:
        key = thread_key(r.source_url)
        assert key not in seen, f"{r.id} and {seen[key]} come from the same thread {key}"
        seen[key] = r.id


def test_no_report_shares_a_thread_with_a_fixture() -> None:
    used = fixture_threads()
    assert used, "found no fixture URLs at all; is tests/fixtures where it should be?"
    overlap = sorted(f"{r.id}: {r.source_url}" for r in EVERY if thread_key(r.source_url) in used)
    assert not overlap, "held-out reports must be unseen; these threads are already fixtures:\n" + "\n".join(overlap)


def test_world_set_covers_every_family_in_both_halves() -> None:
    assert len(WORLD) >= 150 and len(FROZEN) >= 75
    assert {r.family for r in FROZEN} == {r.family for r in TUNE} == set(FAMILIES)


def test_frozen_half_is_unchanged() -> None:
    """The frozen half is pinned by its manifest: no file edited, added or removed since the split."""
    import hashlib

    root = H.SETS["frozen"]
    pinned = dict(line.split("  ", 1)[::-1] for line in (root / "MANIFEST.sha256").read_text().splitlines() if line)
    present = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.glob("*/*.log")}
    assert present == pinned


def test_frozen_half_never_shows_a_report(tmp_path: Path) -> None:
    """Whatever the flags, the harness prints only totals for the frozen half."""
    for flags, totals in (([], "right family first: "), (["--json"], '"right_family_first": ')):
        proc = subprocess.run(
            [sys.executable, str(HARNESS), "--set", "frozen", "--family", "nccl", *flags],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        assert not any(r.path.stem in proc.stdout for r in FROZEN)
        assert totals in proc.stdout, (flags, proc.stdout[-500:])


def test_thread_key_normalises() -> None:
    assert thread_key("https://github.com/NVIDIA/nccl/issues/473#issuecomment-1)") == "github.com/nvidia/nccl/473"
    assert thread_key("https://github.com/openai/CLIP/pull/151") == thread_key(
        "https://github.com/openai/clip/issues/151"
    )
    assert thread_key("https://github.com/a/b/issues/1") != thread_key("https://github.com/a/b/issues/10")


def test_fix_keyword_matching() -> None:
    assert H.fix_names_keyword("Run the container with --shm-size=8g or --ipc=host.", ["shm-size"])
    assert H.fix_names_keyword("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", ["EXPANDABLE_SEGMENTS"])
    assert not H.fix_names_keyword("Lower num_workers.", ["shm-size", "ipc=host"])


@pytest.fixture(scope="module")
def measured():
    return H.run()


def test_accuracy_does_not_regress(measured) -> None:
    results, summary = measured
    assert summary["reports"] == len(REPORTS)
    assert len(results) == len(REPORTS)
    misses = "\n".join(
        f"  {r.id}: expected {r.expected}, top {r.top_code} {r.top_family}" for r in results if not r.hit
    )
    assert summary["right_family_first"] >= RIGHT_FAMILY_FLOOR, (
        f"right family first fell to {summary['right_family_first']:.1%} (floor {RIGHT_FAMILY_FLOOR:.0%}); misses:\n{misses}"
    )
    assert summary["fix_named"] >= FIX_NAMED_FLOOR, (
        f"fix named fell to {summary['fix_named']:.1%} (floor {FIX_NAMED_FLOOR:.0%})"
    )


def test_world_accuracy_does_not_regress() -> None:
    """Totals only (the frozen half's misses are never listed, not even here)."""
    for root, floor in ((H.SETS["frozen"], WORLD_FROZEN_FLOOR), (H.SETS["tune"], WORLD_TUNE_FLOOR)):
        _, summary = H.run(root)
        assert summary["right_family_first"] >= floor, f"{root.name}: {summary['right_family_first']:.1%} < {floor:.0%}"


def test_harness_judges_hits_and_misses(measured) -> None:
    results, _ = measured
    for r in results:
        assert r.hit == (r.top_family == r.expected)
        assert not r.fix_named or r.hit, f"{r.id}: a fix cannot be named under the wrong family"
        if r.hit:
            assert r.expected_rank == 1


def test_cli_json_exits_zero() -> None:
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "--set", "old", "--json", "--family", "cuda-oom"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["summary"]["reports"] == sum(r.family == "cuda-oom" for r in REPORTS)
    assert {r["expected"] for r in data["results"]} == {"cuda-oom"}


def test_seen_answers_new_or_used_and_never_names_a_file() -> None:
    """What people gathering reports ask (`--seen URL ...`): a thread a fixture or a frozen report cites is USED,
    a thread nobody cites is NEW, and the answer never says which file cites it."""
    fixture_url = "https://github.com/pytorch/examples/issues/540#issuecomment-1"  # TD449's fixture
    frozen_url = FROZEN[0].source_url
    unused = "https://github.com/torchdoctor-nobody/no-such-repo/issues/999999"
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "--seen", fixture_url, frozen_url, unused],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    answers = proc.stdout.splitlines()
    assert [a.split()[0] for a in answers] == ["USED", "USED", "NEW"]
    assert "tests/" not in proc.stdout and ".log" not in proc.stdout and FROZEN[0].id not in proc.stdout
