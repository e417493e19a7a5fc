"""Whatever the input, explain never crashes and `--format json` is always valid JSON."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdoctor.explain import explain
from torchdoctor.explain.model import LineRef
from torchdoctor.explain.relevance import UnmatchedStore, relevance
from torchdoctor.registry import lookup

from .conftest import run_cli
from .support.explain import (
    CONSOLE,
    FIXTURES,
    TD150_LOG,
    fixture_body,
    rank_lines,
    support_codes,
)

CODES = support_codes()
TD150_LINE = "RuntimeError: received 0 items of ancdata"
REAL_LINES = fixture_body(TD150_LOG) + CONSOLE.read_text(encoding="utf-8").split("\n")


def check_report(report) -> dict:
    """The report survives a JSON round trip, with a schema version and well-formed diagnoses; its dict."""
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["schema_version"] == 1
    for d in doc["diagnoses"]:
        assert 0 < d["confidence"] <= 1 and d["evidence"]
    return doc


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=4096))
def test_arbitrary_bytes(data: bytes) -> None:
    check_report(explain(data, codes=CODES))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(REAL_LINES), max_size=60), st.data())
def test_shuffled_and_truncated_real_lines(lines: list[str], data: st.DataObject) -> None:
    text = "\n".join(lines)
    cut = data.draw(st.integers(0, len(text)))
    check_report(explain(text[:cut], codes=CODES))


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
    check_report(explain(gzip.compress(data), codes=CODES))
    check_report(explain(gzip.compress(TD150_LOG.read_bytes()) + data, codes=CODES))
    check_report(explain(b"\x1f\x8b" + data, codes=CODES))


def test_truncated_tracebacks_everywhere() -> None:
    body = "\n".join(fixture_body(TD150_LOG))
    cuts = list(range(0, len(body), 37)) + [len(body)]
    named = 0
    for cut in cuts:
        doc = check_report(explain(body[:cut], codes=CODES))
        if TD150_LINE in body[:cut]:
            assert doc["diagnoses"][0]["code"] == "TD150", cut
            named += 1
    assert named, "no cut reached the TD150 line: the loop above checked nothing"


TD450_LAB = FIXTURES / "logs" / "TD450" / "lab-dist-env-missing-rank.log"
WRAPPED = FIXTURES / "explain" / "pastes" / "open-r1-620-wrapped-watchdog.log"


def test_a_recorded_traceback_cut_at_every_line() -> None:
    # TD450 is named from the moment the raise line is the last line (cut traceback) to the whole text,
    # never before it: a cut higher up leaves only frames that name no variable
    body = [line for line in fixture_body(TD450_LAB) if line.strip()]
    raise_at = next(i for i, line in enumerate(body, 1) if line.strip().startswith("raise _env_error("))
    for n in range(len(body) + 1):
        doc = check_report(explain(body[:n]))
        assert ("TD450" in [d["code"] for d in doc["diagnoses"] if d["role"] != "guess"]) == (n >= raise_at), n


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_terminal_wrap_at_any_column_is_joined_back(data: st.DataObject) -> None:
    # each rank's real watchdog line (head + continuation, joined back here) re-wrapped at another
    # column between the trigger and the end of WorkNCCL(...) (so that the head alone cannot match),
    # as a narrower or wider terminal would: the same values every time
    raw = WRAPPED.read_text(encoding="utf-8").splitlines()
    whole = [raw[i] + raw[i + 1] for i in range(0, len(raw), 2)]
    expected = explain(whole).diagnoses[0]
    rewrapped: list[str] = []
    for line in whole:
        at = data.draw(st.integers(line.index("operation timeout") + len("operation timeout"), line.index(") ran for")))
        rewrapped += [line[:at], line[at:]]
    got = next(d for d in explain(rewrapped).diagnoses if d.code == expected.code)
    assert (got.values, got.ranks, got.count) == (expected.values, expected.ranks, expected.count)


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
    # garbage inside a log (its first block is text): read through, the line after it still found
    head = "".join(f"[rank0]: step {i} loss 1.0000\n" for i in range(400)).encode()
    assert len(head) > 8192
    garbage = tmp_path / "core.log"
    garbage.write_bytes(head + os.urandom(3 * 1024 * 1024) + b"\n" + TD150_LINE.encode() + b"\n" + os.urandom(1024))
    code, doc = _cli_json(str(garbage))
    assert code == 0 and "TD150" in [d["code"] for d in doc["diagnoses"]]
    # binary from its first byte is not a log: refused as a usage error (tests/test_explain_sources_binary.py)
    binary = tmp_path / "core.bin.log"
    binary.write_bytes(os.urandom(3 * 1024 * 1024) + b"\n" + TD150_LINE.encode() + b"\n")
    proc = run_cli("explain", str(binary))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "not a log" in proc.stderr


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
        fh.writelines(f"[rank{r}]: step 0 loss 1.0000 sum 4\n" for r in range(100_000))
        fh.writelines(f"[rank{r}]: {TD150_LINE}\n" for r in range(0, 100_000, 7))
    code, doc = _cli_json(str(many))
    assert code == 0
    td150 = doc["diagnoses"][0]
    assert td150["code"] == "TD150" and td150["rank"] == 0 and len(td150["ranks"]) == len(range(0, 100_000, 7))
    assert td150["ranks_text"].startswith("0,7,14,")


# --------------------------------------------------------------------------- honesty: unmatched errors
# Issue 4: "when nothing matches, say so and show the few most relevant error lines". Real text only:
# lines cut from recorded fixtures, and the public pastes in tests/fixtures/explain/pastes (SOURCE.md).

PASTES = FIXTURES / "explain" / "pastes"
WATCHDOG = next(
    line
    for line in fixture_body(FIXTURES / "logs" / "TD490" / "open-clip-1024-torch-2.5.1.log")
    if "Watchdog caught" in line
)
USER_WARNING = next(
    line for line in fixture_body(FIXTURES / "logs" / "TD655" / "lab-ckpt-save-disk-full.log") if "UserWarning" in line
)


def test_a_line_cut_inside_its_pattern_is_recognised_without_the_lost_values() -> None:
    # the watchdog line cut short (as a paste or an excerpt cuts it): TD490's trigger is there, the
    # values after the cut ("Timeout(ms)=...") are not; recognition must not depend on them
    cut = WATCHDOG[: WATCHDOG.index("Timeout(ms)")]
    report = explain(cut, codes=[lookup("TD490")])
    assert report.codes() == ["TD490"] and report.diagnoses[0].rank == 5
    assert report.diagnoses[0].values["timeout_ms"] == "?"
    assert not report.unmatched_errors  # explained, not left over
    full = explain(WATCHDOG, codes=[lookup("TD490")])
    assert full.codes() == ["TD490"] and full.diagnoses[0].values["timeout_ms"] != "?"
    # cut before the core phrase is complete: the trigger is not held in full, so no match
    early = WATCHDOG[: WATCHDOG.index("operation timeout") + len("operation")]
    assert explain(early, codes=[lookup("TD490")]).codes() == []


def test_a_warning_is_shown_when_it_is_all_there_is() -> None:
    report = explain(USER_WARNING, codes=[])
    assert [(u.ref.text, u.score) for u in report.unmatched_errors] == [(USER_WARNING, 1)]


def test_nccl_tests_failure_line_is_shown() -> None:
    # no signature at all: the error words alone must surface the line
    report = explain(PASTES / "nccl-tests-166-failure.log", codes=[])
    assert report.unmatched_errors[0].ref.text.startswith(
        "ubuntu: Test NCCL failure common.cu:958 'unhandled system error"
    )
    assert report.first_failure is None  # no exception line: nothing to call the first failure


def test_flattened_rank_paste_is_split_back_into_lines() -> None:
    report = explain(PASTES / "vllm-5503-flattened.txt", codes=[])
    top = report.unmatched_errors[0]
    assert top.ref.text == "[rank0]: ModuleNotFoundError: No module named 'bitsandbytes'"
    assert (top.ref.rank, top.ref.line, top.score) == (0, 1, 4)
    assert top.traceback[0] == "Traceback (most recent call last):" and top.traceback[-1] == "import bitsandbytes"
    assert report.first_failure["rank"] == 0 and report.first_failure["source"] == "unmatched-error"


def test_flattened_bare_traceback_is_split_back_into_lines() -> None:
    report = explain(PASTES / "pysilon-322-flattened.txt", codes=[])
    top = report.unmatched_errors[0]
    assert top.ref.text.startswith("FileNotFoundError: [Errno 2] No such file or directory:") and top.score == 4
    assert top.traceback[-1] == 'File "shutil.py", line 258, in copyfile'


def test_a_flattened_paste_is_diagnosed_like_the_original() -> None:
    # rank 2's real traceback from the torchrun console, its newlines lost as in a web-form paste
    lines = [line for line in CONSOLE.read_text(encoding="utf-8").split("\n") if line.startswith("[default2]:[rank2]:")]
    whole = explain(lines, codes=CODES)
    flat = explain(" ".join(lines), codes=CODES)
    assert whole.root_cause is not None and flat.root_cause is not None
    assert (
        (flat.root_cause.code, flat.root_cause.rank) == (whole.root_cause.code, whole.root_cause.rank) == ("TDT01", 2)
    )
    assert flat.root_cause.traceback == whole.root_cause.traceback
    assert flat.root_cause.evidence[0].line == 1
    assert flat.root_cause.evidence[0].text == lines[-1]


def test_a_second_independent_failure_stays_visible() -> None:
    # rank 5's real TD150 failure, then rank 2's real torch.save failure that TD150 does not explain
    rank5 = [f"[rank5]: {line}" for line in fixture_body(TD150_LOG)]
    rank2 = [f"[rank2]: {line}" for line in rank_lines(2)]
    report = explain(rank5 + rank2, codes=[lookup("TD150")])
    assert report.root_cause is not None and (report.root_cause.code, report.root_cause.rank) == ("TD150", 5)
    assert [(u.ref.rank, u.score) for u in report.unmatched_errors] == [(2, 4)]
    assert report.unmatched_errors[0].ref.text.endswith("Parent directory /nonexistent-dir does not exist.")
    alone = explain(rank5, codes=[lookup("TD150")])
    assert alone.root_cause is not None and alone.unmatched_errors == []  # nothing TD150 leaves unexplained


def test_chained_tracebacks_belong_to_their_match() -> None:
    # TD156's lab output: "Caught RuntimeError in DataLoader worker process 0." + "Original Traceback",
    # ending in the shm error TD156 names; the wrapper exception is part of the same failure
    body = fixture_body(FIXTURES / "logs" / "TD156" / "lab-shm-no-space.log")
    report = explain(body, codes=[lookup("TD156")])
    assert report.root_cause is not None and report.unmatched_errors == []
    assert any(
        "Caught RuntimeError in DataLoader worker" in u.ref.text for u in explain(body, codes=[]).unmatched_errors
    )


def test_relevance_tiers_on_real_lines() -> None:
    killed = next(line for line in CONSOLE.read_text(encoding="utf-8").split("\n") if "exitcode  : -15" in line)
    assert relevance(rank_lines(2)[-1], closes_traceback=True) == (4, False)
    assert relevance(rank_lines(2)[-1])[0] == 3  # RuntimeError: Parent directory ...
    assert relevance(killed.strip()) == (3, False)  # exitcode  : -15 (pid: ...)  (SIGTERM)
    assert relevance(USER_WARNING)[0] == 1  # a warning, though it says "Failed"
    assert relevance("step 0 loss 1.0000 sum 4") == (0, False)  # progress
    assert relevance(fixture_body(TD150_LOG)[3]) == (0, False)  # a frame
    assert relevance("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ") == (2, True)


def test_metric_names_are_not_error_lines() -> None:
    # the throughput benchmark's progress-line shape, with metric names that contain error words
    line = "[rank3]:2026-11-21 10:00:01,037 INFO train.py:211 epoch 0 step 12 loss 1.2345 val_error: 0.1234 MeanSquaredError=0.5"
    assert relevance(line) == (0, False)
    assert explain([line] * 50, codes=[]).unmatched_errors == []


def test_the_unmatched_store_keeps_the_most_relevant_when_full() -> None:
    store = UnmatchedStore(limit=2)
    ref = LineRef("x.log", 1, USER_WARNING)
    for i, text in enumerate([USER_WARNING, "step 0 loss 1.0000 sum 4"]):
        store.add(LineRef("x.log", i + 1, text), text, 1, False, (), (0, i + 1), tied=False)
    assert store.add(ref, rank_lines(2)[-1], 4, False, (), (0, 9), tied=False) is not None
    assert store.add(ref, "another warning shape", 1, False, (), (0, 10), tied=False) is None
    assert [u.score for u in store.ranked(named_cause=False)] == [4, 1]
