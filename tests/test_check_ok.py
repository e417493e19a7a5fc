"""What `check` found fine is shown too (issue 5): `passed` in JSON, a section in Markdown, one
paragraph in text (one line each with --verbose), and the machine at a glance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdoctor.catalogue import PREFLIGHT_VARIANTS
from torchdoctor.checks import PATH_CODES, SUBJECTS, Passed, audit, preflight_codes
from torchdoctor.facts import Facts, GatherContext, gather
from torchdoctor.options import CheckOptions

from .conftest import FIXTURES, REPO, run_cli, run_json

RECORDED = sorted((FIXTURES / "facts").glob("*.json"))
HEALTHY = FIXTURES / "facts" / "healthy-workstation.json"


def test_every_preflight_code_has_a_subject() -> None:
    """A check that can pass must be able to say so. Only `torchdoctor loader`'s own codes (they judge a
    probed DataLoader, never `check`'s facts) have no subject."""
    covered = {c for s in SUBJECTS for c in s.codes} | set(PATH_CODES)
    loader_probe = {c.code for c in preflight_codes() if c.area == "loader" and c.code not in PREFLIGHT_VARIANTS}
    missing = {c.code for c in preflight_codes()} - covered - loader_probe
    assert not missing, f"preflight codes no 'passed' subject covers: {sorted(missing)}"
    assert covered <= {c.code for c in preflight_codes()}, "a subject names a code that has no check"


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_passed_never_contradicts_a_finding(path: Path) -> None:
    result = audit(Facts.load(path))
    fired = {f.code for f in result.findings}
    assert result.passed, "a recorded machine has something that was checked and fine"
    for p in result.passed:
        if p.area == "storage":  # per path: no finding names it
            assert not any(p.subject in f.message for f in result.findings if f.code in PATH_CODES), p
        else:
            assert not set(p.codes) & fired, p


def test_nothing_is_claimed_fine_without_facts() -> None:
    empty = Facts.from_dict({"meta": {"schema_version": 1}})
    assert audit(empty).passed == []


def test_the_recorded_workstations_tmp_is_listed_as_fine() -> None:
    doc = run_json("check", "--facts", str(HEALTHY.relative_to(REPO)), cwd=REPO)
    tmp = next(p for p in doc["passed"] if p["subject"] == "/tmp")
    assert tmp["area"] == "storage" and tmp["codes"] == list(PATH_CODES) and "writable" in tmp["value"]
    assert set(tmp) == set(Passed("a", "b", "c", "d", ()).to_dict())
    assert {p["subject"] for p in doc["passed"]} >= {"/dev/shm", "vm.max_map_count", "open files", "memory", "CPUs"}
    assert doc["machine"]["python"] and doc["machine"]["os"].startswith("Linux")


def test_check_with_a_fine_and_a_missing_path_mentions_both(tmp_path: Path) -> None:
    """The report of issue 5: `--path GOOD --path /nonexistent/dir` used to mention the missing one only."""
    good, missing = tmp_path / "ckpt", "/nonexistent-torchdoctor-test/dir"
    good.mkdir()
    entry = gather(GatherContext(paths=(str(good),), torch=False), sections=["paths"]).get("paths.entries")[0]
    doc = run_json("check", "--no-torch", "--path", str(good), "--path", missing)
    passed = {p["subject"]: p for p in doc["passed"]}
    concerned = [f for f in doc["findings"] if f["code"] in PATH_CODES and str(good) in f["message"]]
    # the good directory is either fine or named by a finding (e.g. TD612 where /tmp is a tmpfs), never silent
    assert (str(good) in passed) != bool(concerned)
    if entry["fs_kind"] == "local" and entry["writable"]:
        assert str(good) in passed and "created, wrote, synced and removed a file" in passed[str(good)]["detail"]
    assert missing not in passed and any(missing in f["message"] for f in doc["findings"])
    text = run_cli("check", "--no-torch", "--path", str(good), "--path", missing).stdout
    if str(good) in passed:
        assert f"{good}: writable" in text.replace("\n", " ")


def test_text_is_compact_and_verbose_is_one_line_each() -> None:
    rel = str(HEALTHY.relative_to(REPO))
    compact = run_cli("check", "--facts", rel, cwd=REPO, env={"NO_COLOR": "1"}).stdout
    verbose = run_cli("check", "--facts", rel, "--verbose", cwd=REPO, env={"NO_COLOR": "1"}).stdout
    n = len(audit(Facts.load(HEALTHY)).passed)
    assert f"✔ Checked and fine ({n}):" in compact and "--verbose" in compact
    assert compact.count("✔") == 1  # one paragraph
    assert verbose.count("✔ ") == n and "Checked and fine\n" in verbose
    assert "TD601-TD613" in verbose and "a directory; created, wrote, synced and removed a file in it" in verbose
    # the machine line, as collect_env users look for it
    assert "Python 3.11.7 · torch 2.13.0+cpu" in compact.splitlines()[1]


def test_markdown_has_a_checked_and_fine_section() -> None:
    rel = str(HEALTHY.relative_to(REPO))
    md = run_cli("check", "--facts", rel, "--format", "markdown", cwd=REPO).stdout
    assert "### ✅ Checked and fine" in md and "| checked | found | how it was judged | codes |" in md
    assert "| /tmp | writable" in md and md.index("Machine: Linux") < md.index("### ✅ Checked and fine")


def test_json_doc_documents_passed_and_machine() -> None:
    doc = (REPO / "docs" / "json.md").read_text(encoding="utf-8")
    for key in ("`passed[]`", "`machine`", *(f"`passed[].{k}`" for k in Passed("a", "b", "c", "d", ()).to_dict())):
        assert key in doc, key


def test_loader_json_has_no_passed_list() -> None:
    """`passed` belongs to `check`; other commands' JSON is unchanged."""
    from io import StringIO

    from torchdoctor.report import render_findings

    out = StringIO()
    render_findings([], "json", "loader", out, {})
    assert "passed" not in json.loads(out.getvalue())
    out = StringIO()
    render_findings([], "json", "check", out, {}, passed=audit(Facts.load(HEALTHY), CheckOptions()).passed)
    assert json.loads(out.getvalue())["passed"]
