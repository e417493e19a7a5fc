"""Whatever the input, explain never crashes and `--format json` is always valid JSON."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdoctor.explain import explain

from .conftest import run_cli
from .test_explain_support import CONSOLE, TD150_LOG, fixture_body, test_codes

CODES = test_codes()
TD150_LINE = "RuntimeError: received 0 items of ancdata"
REAL_LINES = fixture_body(TD150_LOG) + CONSOLE.read_text(encoding="utf-8").split("\n")


def _check(report) -> dict:
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["schema_version"] == 1
    for d in doc["diagnoses"]:
        assert 0 < d["confidence"] <= 1 and d["evidence"]
    return doc


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=4096))
def test_arbitrary_bytes(data: bytes) -> None:
    _check(explain(data, codes=CODES))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(REAL_LINES), max_size=60), st.data())
def test_shuffled_and_truncated_real_lines(lines: list[str], data: st.DataObject) -> None:
    text = "\n".join(lines)
    cut = data.draw(st.integers(0, len(text)))
    _check(explain(text[:cut], codes=CODES))


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["", "[rank{r}]: ", "[default{r}]:", "[default{r}]:[rank{r}]: ", "{r}: ", "[rank: {r}] "]),
    st.integers(0, 99_999),
    st.sampled_from(["", "2026-11-21 23:23:25,122 ", "[2026-11-21T23:23:25.5Z] "]),
    st.booleans(),
    st.booleans(),
)
def test_prefixes_never_hide_a_signature(prefix: str, rank: int, stamp: str, ansi: bool, stamp_first: bool) -> None:
    line = f"\x1b[31m{TD150_LINE}\x1b[0m" if ansi else TD150_LINE
    # srun --label is always outermost; the others may sit inside or outside a logger's timestamp
    if stamp_first and not prefix.startswith("{r}"):
        text = stamp + prefix.format(r=rank) + line
    else:
        text = prefix.format(r=rank) + stamp + line
    report = explain(text, codes=CODES)
    assert report.codes()[0] == "TD150"
    if prefix:
        assert report.root_cause.rank == rank  # type: ignore[union-attr]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=1, max_size=2048))
def test_gzip_of_garbage_and_garbage_after_gzip(data: bytes) -> None:
    _check(explain(gzip.compress(data), codes=CODES))
    _check(explain(gzip.compress(TD150_LOG.read_bytes()) + data, codes=CODES))
    _check(explain(b"\x1f\x8b" + data, codes=CODES))


def test_truncated_tracebacks_everywhere() -> None:
    body = "\n".join(fixture_body(TD150_LOG))
    for cut in range(0, len(body), 37):
        doc = _check(explain(body[:cut], codes=CODES))
        if TD150_LINE in body[:cut]:
            assert doc["diagnoses"][0]["code"] == "TD150"


# --------------------------------------------------------------------------- through the CLI


def _cli_json(*args: str, **kw) -> tuple[int, dict]:
    proc = run_cli("explain", *args, "--format", "json", **kw)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_cli_empty_input(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    code, doc = _cli_json(str(empty))
    assert code == 1 and doc["diagnoses"] == [] and doc["lines"] == 0
    code, doc = _cli_json("-", input="")
    assert code == 1 and doc["unmatched_errors"] == []


def test_cli_binary_garbage(tmp_path: Path) -> None:
    garbage = tmp_path / "core.log"
    garbage.write_bytes(os.urandom(3 * 1024 * 1024) + b"\n" + TD150_LINE.encode() + b"\n" + os.urandom(1024))
    code, doc = _cli_json(str(garbage))
    assert code == 0 and "TD150" in [d["code"] for d in doc["diagnoses"]]


def test_cli_ten_megabyte_line(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    with open(big, "wb") as fh:
        fh.write(b"[rank3]: " + b"Error " * (10 * 1024 * 1024 // 6) + b"\n")
        fh.write(f"[rank3]: {TD150_LINE}\n".encode())
    code, doc = _cli_json(str(big))
    assert code == 0
    td150 = next(d for d in doc["diagnoses"] if d["code"] == "TD150")
    assert td150["rank"] == 3 and td150["evidence"][0]["line"] == 2
    assert all(len(u["text"]) <= 64 * 1024 for u in doc["unmatched_errors"])


def test_cli_hundred_thousand_ranks(tmp_path: Path) -> None:
    many = tmp_path / "many.log"
    with open(many, "w", encoding="utf-8") as fh:
        for r in range(100_000):
            fh.write(f"[rank{r}]: step 0 loss 1.0000 sum 4\n")
        for r in range(0, 100_000, 7):
            fh.write(f"[rank{r}]: {TD150_LINE}\n")
    code, doc = _cli_json(str(many))
    assert code == 0
    td150 = doc["diagnoses"][0]
    assert td150["code"] == "TD150" and td150["rank"] == 0 and len(td150["ranks"]) == len(range(0, 100_000, 7))
    assert td150["ranks_text"].startswith("0,7,14,")
