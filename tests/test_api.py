"""The public façade: a tested __all__, and the model behind every reporter."""

from __future__ import annotations

import torchdoctor
from torchdoctor import CheckOptions, Facts, Severity, run_checks
from torchdoctor.registry import Code, Hit, all_codes, lookup


def test_all_is_exactly_the_public_api() -> None:
    assert sorted(torchdoctor.__all__) == sorted(set(torchdoctor.__all__))
    for name in torchdoctor.__all__:
        assert hasattr(torchdoctor, name), name
    assert {"check", "gather", "run_checks", "Finding", "Severity", "Facts", "lookup", "all_codes"} <= set(
        torchdoctor.__all__
    )


def test_crashing_check_becomes_a_finding_about_itself() -> None:
    def boom(facts, opts):
        raise KeyError("nope")
        yield  # pragma: no cover

    base = all_codes()[0]
    broken = Code(**{**base.__dict__, "check": boom})
    findings = run_checks(Facts.from_dict({"meta": {"schema_version": 1}}), CheckOptions(), codes=[broken])
    assert len(findings) == 1
    f = findings[0]
    assert f.code == base.code and f.check_error and "KeyError" in f.message
    assert f.severity is Severity.WARNING


def test_unknown_facts_yield_no_false_alarm() -> None:
    # An empty snapshot: every check must tolerate missing facts without crashing or accusing.
    findings = run_checks(Facts.from_dict({"meta": {"schema_version": 1}}), CheckOptions())
    assert [f for f in findings if f.check_error] == []
    assert [f for f in findings if f.severity is Severity.ERROR] == []


def test_template_fills_values_and_keeps_unknown_placeholders_visible() -> None:
    # TD102's message and fix have four placeholders; the check gives two of them here.
    code = lookup("TD102")
    assert {"free", "size", "arithmetic", "need_gib"} <= code.placeholders()
    f = code.finding(Hit({"free": "12 MiB", "size": "64 MiB"}))  # never raises on a missing value
    assert "12 MiB free of 64 MiB" in f.message
    assert "{free}" not in f.message and "{size}" not in f.message
    assert "{arithmetic}" in f.message  # missing: left visible, not blanked
    assert "--shm-size={need_gib}g" in f.fix


def test_every_template_survives_a_hit_without_values() -> None:
    for code in all_codes():
        f = code.finding(Hit({}))
        for name in code.placeholders():
            assert "{" + name + "}" in f.message + f.fix, f"{code.code}: {{{name}}} vanished from its message/fix"
