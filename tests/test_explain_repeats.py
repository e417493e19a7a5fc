"""Repeated line shapes are skipped across blocks, without changing what explain concludes."""

from __future__ import annotations

import sys
from pathlib import Path

from torchdoctor.explain import explain
from torchdoctor.explain.repeats import PER_BLOCK, RepeatFilter
from torchdoctor.explain.sources import PIECE

from .conftest import FIXTURES, REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import explain_throughput as bench  # noqa: E402  (the benchmark's world-like log generator)


def _fixture(code_file: str) -> list[str]:
    return bench.fixture_body(FIXTURES / "logs" / code_file)


def test_a_block_of_known_shapes_is_skipped_and_new_shapes_are_read() -> None:
    rf = RepeatFilter()
    first = b"".join(b"[rank%d]: step %d loss 0.%d MeanSquaredError\n" % (i % 8, i, i) for i in range(PER_BLOCK))
    assert rf.runs(first, 0, len(first))[:2] == (None, PER_BLOCK)  # all new, within the per-block budget: read whole
    again = b"".join(b"[rank%d]: step %d loss 0.%d MeanSquaredError\n" % (i % 8, i + 7, i) for i in range(100))
    assert rf.runs(again, 0, len(again))[:2] == ([], 100)
    assert rf.skipped == 100
    cut = again.index(b"\n", 200) + 1
    mixed = again[:cut] + b"RuntimeError: received 0 items of ancdata\n" + again[cut:]
    runs, newlines, *_ = rf.runs(mixed, 0, len(mixed))
    assert newlines == 101
    assert runs is not None and len(runs) == 1
    s, e = runs[0]
    assert mixed[s:e] == b"RuntimeError: received 0 items of ancdata\n"


def test_one_new_shape_is_read_at_most_per_block_times() -> None:
    rf = RepeatFilter()
    rf.runs(b"seed line\n", 0, 10)
    block = b"".join(b"W%04d warning about thing\n" % i for i in range(PER_BLOCK * 3))
    runs, *_ = rf.runs(block, 0, len(block))
    assert runs is not None
    read = sum(block.count(b"\n", s, e) for s, e in runs)
    assert read == PER_BLOCK


def test_traceback_lines_are_never_learned() -> None:
    rf = RepeatFilter()
    tb = b"Traceback (most recent call last):\n"
    rf.runs(tb + b"x\n", 0, len(tb) + 2)
    runs, *_ = rf.runs(tb, 0, len(tb))
    assert runs is None


def test_world_noise_log_gives_the_same_diagnosis_as_the_failure_alone(tmp_path: Path) -> None:
    failure = _fixture("TD661/lab-writes-ranks-rmtree-checkpoint.log")
    alone = explain("\n".join(failure) + "\n")
    assert alone.root_cause is not None
    log = tmp_path / "train.log"
    bench.build_log(log, 3 * PIECE, failure)  # several blocks of repeated warnings, bars and metrics
    noisy = explain(log)
    assert noisy.root_cause is not None
    assert noisy.root_cause.code == alone.root_cause.code == "TD661"
    assert noisy.root_cause.rank == bench.FAILING_RANK
    assert noisy.skipped_repeats > 10_000  # the noise was skipped, not read line by line


def test_a_second_traceback_through_known_frames_keeps_its_context(tmp_path: Path) -> None:
    """Frames of a traceback already seen blocks earlier are read again inside the new traceback's
    window: a ``context=`` signature still sees them."""
    failure = _fixture("TD661/lab-writes-ranks-rmtree-checkpoint.log")
    noise = bench.world_block(__import__("random").Random(1), 0, 4000)
    text = "\n".join(failure) + "\n" + noise * (PIECE // len(noise) + 2) + "\n".join(failure) + "\n"
    log = tmp_path / "two.log"
    log.write_text(text, encoding="utf-8")
    report = explain(log)
    group = next(d for d in report.diagnoses if d.code == "TD661")
    assert group.count >= 2


def test_a_repeated_line_that_opens_a_window_does_not_chain_windows_over_the_log(tmp_path: Path) -> None:
    """A warning whose signature reads the lines after it (a window), printed on every line: the
    lines a window covers are read, but being repeats they open no window of their own, so the
    log is not read line by line from the first warning to the end."""
    warning, echo = bench.WARNINGS[1]  # the DataLoader's worker-count warning (a windowed symptom)
    log = tmp_path / "warned.log"
    with open(log, "w", encoding="utf-8") as fh:
        written = 0
        while written < 3 * PIECE:
            chunk = "".join(f"[rank{i % 8}]:{warning}\n[rank{i % 8}]:{echo}\n" for i in range(2000))
            fh.write(chunk)
            written += len(chunk)
    report = explain(log)
    assert report.lines > 20_000
    assert report.skipped_repeats > report.lines - 500


def test_a_failure_every_rank_prints_is_listed_on_every_rank_without_reading_each_line(tmp_path: Path) -> None:
    """The same failure line from 2,000 ranks, spread over several blocks of noise: each rank is
    listed (its line is an *echo* of the first: same shape, only its prefix parsed), and the lines
    are counted as skipped repeats, not matched one by one."""
    failure = next(
        line for line in _fixture("TD150/lab-fd-queue-ancdata.log") if line.startswith("RuntimeError: received")
    )
    noise = bench.world_block(__import__("random").Random(2), 0, 4000)
    log = tmp_path / "ranks.log"
    with open(log, "w", encoding="utf-8") as fh:
        for part in range(4):
            fh.write(noise * (PIECE // len(noise) + 1))
            fh.writelines(f"[rank{r}]:{failure}\n" for r in range(part * 500, part * 500 + 500))
    report = explain(log)
    d = next(d for d in report.diagnoses if d.code == "TD150")
    assert d.ranks == list(range(2000))
    assert d.count == 2000
    assert report.skipped_repeats > 1900
