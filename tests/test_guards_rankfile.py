"""RankFile: many processes print into one file, every line arrives whole and exactly once."""

from __future__ import annotations

import io
import logging
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import torchdoctor
from torchdoctor.guards.rankfile import RankFile, RankFileHandler, rank0_only

PROCS = 8
LINES = 5000
LINE_RE = re.compile(r"rank (\d+) line (\d+) (x*)\|")


def _line(rank: int, i: int) -> str:
    # lengths vary from ~20 to ~320 bytes so buffer boundaries fall everywhere
    return f"rank {rank} line {i} " + "x" * ((i * 37 + rank * 11) % 300) + "|"


def _printer(path: str, rank: int, plain: bool, lock: bool, barrier: Any) -> None:
    f: Any = open(path, "a") if plain else RankFile(path, lock=lock)
    barrier.wait()  # all start at the same instant
    for i in range(LINES):
        print(_line(rank, i), file=f)  # print writes the text, then "\n": two write() calls
    f.close()


def _run(path: Path, *, plain: bool = False, lock: bool = False) -> list[str]:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(PROCS)
    procs = [ctx.Process(target=_printer, args=(str(path), r, plain, lock, barrier)) for r in range(PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return path.read_text().split("\n")


def _problems(lines: list[str]) -> tuple[int, Counter[tuple[int, int]]]:
    assert lines[-1] == ""  # the file ends with a newline
    bad = 0
    seen: Counter[tuple[int, int]] = Counter()
    for text in lines[:-1]:
        m = LINE_RE.fullmatch(text)
        if not m or text != _line(int(m[1]), int(m[2])):
            bad += 1
            continue
        seen[int(m[1]), int(m[2])] += 1
    return bad, seen


@pytest.mark.parametrize("lock", [False, True], ids=["o_append", "lockf"])
def test_eight_processes_print_whole_lines_exactly_once(tmp_path: Path, lock: bool) -> None:
    lines = _run(tmp_path / "log.txt", lock=lock)
    bad, seen = _problems(lines)
    assert bad == 0
    assert len(lines) - 1 == PROCS * LINES
    assert set(seen) == {(r, i) for r in range(PROCS) for i in range(LINES)}
    assert set(seen.values()) == {1}


def test_plain_append_mode_cuts_lines_under_the_same_load(tmp_path: Path) -> None:
    # open(path, "a") flushes its 8 KiB buffer wherever it is full, mid-line, and other processes'
    # flushes can land between the two halves. On this 2-core machine only about half of the runs
    # cut a line (2-6 cut lines out of 40,000 when they do): processes often finish within their
    # time slice. Not reliable enough to assert on one run, so up to 5 runs are tried and the test
    # skips (never fails) if none cut a line. RankFile's guarantee is asserted above, under this load.
    for attempt in range(5):
        bad, seen = _problems(_run(tmp_path / f"plain-{attempt}.txt", plain=True))
        if bad:
            assert len(seen) < PROCS * LINES  # the cut lines are lost as lines
            return
    pytest.skip("plain open(..., 'a') happened not to cut a line in 5 runs")


def test_close_writes_a_trailing_partial_line_and_flush_keeps_lines_whole(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "log.txt"
    with RankFile(path) as f:
        f.write("first ")
        f.flush()
        assert path.read_text() == ""  # a partial line waits for its newline
        f.write("line\nsecond")
        f.flush()  # complete lines are batched until flush_every passes, or flush()
        assert path.read_text() == "first line\n"
    assert path.read_text() == "first line\nsecond\n"
    assert f.closed
    with pytest.raises(ValueError):
        f.write("x")


def test_batched_lines_reach_the_file_within_flush_every_without_more_writes(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    with RankFile(path, flush_every=0.2) as f:
        print("one", file=f)
        print("two", file=f)
        assert path.read_text() == ""  # waiting in the batch
        deadline = time.monotonic() + 5
        while path.read_text() != "one\ntwo\n" and time.monotonic() < deadline:
            time.sleep(0.02)
        waited = 5 - (deadline - time.monotonic())
        assert path.read_text() == "one\ntwo\n"  # the background thread wrote them, with one append
        assert waited < 2


def test_the_flush_thread_ends_when_every_rankfile_is_closed(tmp_path: Path) -> None:
    import threading

    def flushers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "torchdoctor-rankfile-flush"]

    with RankFile(tmp_path / "a.log") as a, RankFile(tmp_path / "b.log"):
        print("x", file=a)
        assert len(flushers()) == 1  # one thread for every file of the process
    deadline = time.monotonic() + 5
    while flushers() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert flushers() == []
    with RankFile(tmp_path / "c.log") as c:  # a new file starts it again
        print("y", file=c)
        assert len(flushers()) == 1
    assert (tmp_path / "a.log").read_text() == "x\n" and (tmp_path / "c.log").read_text() == "y\n"


def test_flush_every_zero_writes_each_line_as_it_completes(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    with RankFile(path, flush_every=0) as f:
        f.write("a")
        assert path.read_text() == ""
        f.write("\n")
        assert path.read_text() == "a\n"
    with pytest.raises(ValueError, match="flush_every"):
        RankFile(path, flush_every=-1)


def test_lines_waiting_at_exit_are_written(tmp_path: Path) -> None:
    # the process ends (normally, or by an uncaught exception) right after printing: atexit writes the batch
    path = tmp_path / "log.txt"
    code = (
        "import sys, torchdoctor\n"
        f"f = torchdoctor.RankFile({str(path)!r}, flush_every=60)\n"
        "print('last words', file=f)\n"
        "raise SystemExit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert path.read_text() == "last words\n"


def test_handler_writes_errors_at_once_and_guard_flushes_waiting_lines(tmp_path: Path) -> None:
    logger = logging.getLogger("td-test-flush")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = RankFileHandler(tmp_path / "h.log", flush_every=60)
    logger.addHandler(handler)
    plain = RankFile(tmp_path / "p.log", flush_every=60)
    try:
        logger.info("routine")
        assert (tmp_path / "h.log").read_text() == ""
        logger.error("broken")  # an error is written at once, with what waited before it
        assert (tmp_path / "h.log").read_text() == "routine\nbroken\n"
        print("before the failure", file=plain)
        with pytest.raises(ZeroDivisionError), torchdoctor.guard(report_dir=tmp_path / "reports"):
            1 / 0  # noqa: B018
        assert (tmp_path / "p.log").read_text() == "before the failure\n"
    finally:
        logger.removeHandler(handler)
        handler.close()
        plain.close()


def test_prefix_names_rank_on_every_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    with RankFile(tmp_path / "log.txt", prefix="[rank {rank}] ") as f:
        print("a\nb", file=f)
    assert (tmp_path / "log.txt").read_text() == "[rank 3] a\n[rank 3] b\n"


def test_forked_child_does_not_repeat_the_parents_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    f = RankFile(path)
    f.write("parent whole line\nparent partial ")  # a complete line waits in the batch, then a partial one
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            f.write("child line\n")
            f.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    f.write("end\n")
    f.close()
    assert sorted(path.read_text().splitlines()) == ["child line", "parent partial end", "parent whole line"]


def _logger_proc(path: str, rank: int, barrier: Any) -> None:
    logger = logging.getLogger(f"td-test-{rank}")
    logger.propagate = False
    handler = RankFileHandler(path)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logger.addHandler(handler)
    barrier.wait()
    for i in range(300):
        try:
            raise ValueError(f"boom {rank} {i}")
        except ValueError:
            logger.exception("failed %d", i)
    handler.close()


def test_handler_keeps_multiline_records_together(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(4)
    path = tmp_path / "log.txt"
    procs = [ctx.Process(target=_logger_proc, args=(str(path), r, barrier)) for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records = re.split(r"\n(?=td-test-)", path.read_text().rstrip("\n"))
    assert len(records) == 4 * 300
    for rec in records:
        m = re.match(r"td-test-(\d) failed (\d+)\nTraceback", rec)
        assert m, rec[:200]
        assert rec.endswith(f"ValueError: boom {m[1]} {m[2]}"), rec[-200:]


def test_rank0_only_decorator_and_context(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[int] = []

    @rank0_only
    def report(x: int) -> int:
        calls.append(x)
        return x * 2

    @rank0_only()
    def report2() -> str:
        return "ok"

    monkeypatch.setenv("RANK", "1")
    assert report(2) is None and report2() is None and calls == []
    with rank0_only() as is_zero:
        print("hidden")
    assert is_zero is False
    monkeypatch.setenv("RANK", "0")
    assert report(2) == 4 and report2() == "ok" and calls == [2]
    with rank0_only() as is_zero:
        print("shown")
    assert is_zero is True
    assert capsys.readouterr().out == "shown\n"
    assert torchdoctor.rank0_only is rank0_only and torchdoctor.RankFile is RankFile


def test_rankfile_is_a_text_stream(tmp_path: Path) -> None:
    with RankFile(tmp_path / "log.txt") as f:
        assert isinstance(f, io.TextIOBase) and f.writable() and f.encoding == "utf-8"
        f.writelines(["a\n", "b\n"])
        with pytest.raises(TypeError):
            f.write(b"bytes")  # type: ignore[arg-type]
    assert (tmp_path / "log.txt").read_text() == "a\nb\n"
