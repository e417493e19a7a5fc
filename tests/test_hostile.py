"""Hostile inputs and ways of stopping: encodings, closed pipes, lone surrogates, wrong argument
types, signals while reading stdin. Real processes and real bytes (issue 14, items 8, 10-12, 19)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from torchdoctor.explain import explain, explain_exception
from torchdoctor.options import CheckOptions

from .conftest import FIXTURES, REPO

PY = sys.executable
TD150 = FIXTURES / "logs" / "TD150" / "lab-fd-queue-ancdata.log"
FAILURE = "RuntimeError: received 0 items of ancdata"  # the line TD150's fixture ends in


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LC_ALL", "LANG", "PYTHONIOENCODING")}
    env["PYTHONPATH"] = str(REPO / "src")
    env.update(extra)
    return env


@pytest.mark.parametrize(
    "args",
    [
        ["codes"],
        ["codes", "TD150"],
        ["check", "--no-torch"],
        ["check", "--no-torch", "--format", "markdown"],
        ["lab", "list"],
        ["explain", str(TD150)],
    ],
)
@pytest.mark.parametrize("enc", [{"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "PYTHONIOENCODING": "latin-1"}])
def test_output_degrades_to_what_the_terminal_can_show(args: list[str], enc: dict[str, str]) -> None:
    proc = subprocess.run([PY, "-m", "torchdoctor", *args], capture_output=True, env=_env(**enc), check=False)
    assert proc.returncode in (0, 1), proc.stderr.decode(errors="replace")
    assert b"internal error" not in proc.stderr and b"UnicodeEncodeError" not in proc.stderr
    assert proc.stdout.strip()


def _exit_through_closed_pipe(args: list[str], tmp_path: Path) -> tuple[int, int, bytes]:
    """Exit status without and with ``| head -c1`` (the reader goes away after one byte)."""
    alone = subprocess.run([PY, "-m", "torchdoctor", *args], capture_output=True, env=_env(), check=False)
    script = '"$@" | head -c1 > /dev/null; echo "${PIPESTATUS[0]}"'
    piped = subprocess.run(
        ["bash", "-c", script, "sh", PY, "-m", "torchdoctor", *args], capture_output=True, env=_env(), check=False
    )
    return alone.returncode, int(piped.stdout.decode().strip()), piped.stderr


@pytest.mark.parametrize(
    "args", [["codes", "--format", "json"], ["codes"], ["explain", "LOG"], ["explain", "LOG", "--format", "json"]]
)
def test_a_closed_output_pipe_keeps_the_exit_status(args: list[str], tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text(
        TD150.read_text(encoding="utf-8") + "".join(f"step {i} ok\n" for i in range(20_000)), encoding="utf-8"
    )
    args = [str(log) if a == "LOG" else a for a in args]
    alone, piped, err = _exit_through_closed_pipe(args, tmp_path)
    assert piped == alone, err.decode(errors="replace")
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_lone_surrogates_never_make_explain_raise() -> None:
    report = explain("RuntimeError: boom \ud800 in a message\n" + FAILURE + "\n")
    assert report.codes() == ["TD150"]
    report = explain(["bad \udfff line", FAILURE])
    assert report.codes() == ["TD150"]
    try:
        raise RuntimeError("received 0 items of ancdata \ud800")
    except RuntimeError as exc:
        assert explain_exception(exc).codes() == ["TD150"]


@pytest.mark.parametrize("bad", [None, 5, 3.5, [None], ["ok", 7], object()])
def test_explain_rejects_a_wrong_argument_at_the_call(bad: object) -> None:
    with pytest.raises(TypeError, match="explain\\(\\)"):
        explain(bad)  # type: ignore[arg-type]


def test_explain_exception_rejects_what_is_not_an_exception() -> None:
    with pytest.raises(TypeError, match="takes an exception"):
        explain_exception(None)  # type: ignore[arg-type]


def test_a_str_naming_a_file_is_text_and_warns(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(FAILURE + "\n", encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        as_text = explain(str(log))
    assert any("pathlib.Path" in str(w.message) for w in caught)
    assert as_text.codes() == []  # the file name itself holds no failure
    assert explain(log).codes() == ["TD150"]  # a Path reads the file


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": -1},
        {"prefetch_factor": 0},
        {"batch_bytes": -5},
        {"nproc_per_node": 0},
        {"start_method": "thread"},
    ],
)
def test_check_options_reject_what_the_cli_rejects(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="CheckOptions"):
        CheckOptions(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_while_explain_reads_stdin_exits_by_the_convention(sig: int, code: int) -> None:
    proc = subprocess.Popen(
        [PY, "-m", "torchdoctor", "explain", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    assert proc.stdin is not None
    proc.stdin.write(b"step 1 ok\n" * 1000)
    proc.stdin.flush()
    time.sleep(1.5)  # explain is now blocked reading the open stdin
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err.decode(errors="replace")
    assert b"Fatal Python error" not in err and b"Traceback" not in err


def _bus_error_line() -> str:
    root = FIXTURES / "logs" / "TD157"
    return next(
        line
        for p in sorted(root.glob("*.log"))
        if not p.name.startswith("near-")
        for line in p.read_text(encoding="utf-8").splitlines()
        if "is killed by signal: Bus error" in line
    )


@pytest.mark.parametrize("piece", [None, 4096, 1 << 20])
def test_an_error_at_the_end_of_a_long_carriage_return_line_is_read(tmp_path: Path, piece: int | None) -> None:
    """2,000 progress-bar redraws joined by \\r, then the real worker error: the terminal showed the
    error last, and so does explain (the line's tail is kept, not only its head)."""
    from torchdoctor.explain.sources import blocks

    bar = "\r".join(
        f" {i * 100 // 2000:3d}%|#####     | {i}/2000 [00:{i % 60:02d}<01:00, 33.0it/s]" for i in range(2000)
    )
    text = "epoch 1\n" + bar + "\r" + _bus_error_line() + "\nnext line\n"
    assert len(bar) > 64 * 1024
    if piece is None:
        report = explain(text)
    else:  # the same bytes as a file read in pieces of this size (the long line spans pieces)
        data = text.encode()
        chunks = [data[i : i + piece] for i in range(0, len(data), piece)]
        lines = [ln for b in blocks(chunks) for ln in b.data[b.start : b.end].split(b"\n")[:-1]]
        assert len(lines) == 3 and lines[1].endswith(_bus_error_line().encode())
        if piece < len(data):  # a line spanning pieces is cut here; one inside a piece when it is read
            assert len(lines[1]) <= 64 * 1024 + 1
        log = tmp_path / "bar.log"
        log.write_bytes(data)
        report = explain(log)
    assert "TD157" in report.codes()
    assert any("longer than 64 KiB" in n for n in report.notes)


def test_a_failure_on_a_hundred_thousand_ranks_is_counted_and_listed_in_bounded_memory(tmp_path: Path) -> None:
    from torchdoctor.explain.collect import MAX_GROUP_RANKS

    log = tmp_path / "ranks.log"
    with open(log, "w", encoding="utf-8") as fh:
        fh.writelines(f"[rank{r}]: {FAILURE}\n" for r in range(100_000))
    d = explain(log).diagnoses[0]
    assert d.code == "TD150" and d.count == 100_000
    assert len(d.ranks) == MAX_GROUP_RANKS and d.ranks[:3] == [0, 1, 2]
    assert any(f"{MAX_GROUP_RANKS:,} listed" in n for n in d.notes)


def test_a_million_identical_failure_lines_cost_little(tmp_path: Path) -> None:
    """Read once, then skipped by shape: the count stops growing once the echoes name no new rank."""
    log = tmp_path / "same.log"
    with open(log, "w", encoding="utf-8") as fh:
        fh.writelines(f"{FAILURE}\n" for _ in range(1_000_000))
    report = explain(log)
    assert report.codes() == ["TD150"]
    assert report.skipped_repeats > 990_000


def test_torchdoctor_explain_is_callable_even_after_its_submodules_are_imported() -> None:
    import torchdoctor
    import torchdoctor.explain.model  # noqa: F401  (binds the package to the name on torchdoctor)

    assert torchdoctor.explain(FAILURE + "\n").codes() == ["TD150"]


def test_a_loader_target_raising_with_a_lone_surrogate_is_reported_not_an_internal_error(tmp_path: Path) -> None:
    target = tmp_path / "t.py"
    target.write_text(
        'def make_loader():\n    raise RuntimeError("bad \\ud800 value in the dataset")\n', encoding="utf-8"
    )
    proc = subprocess.run(
        [PY, "-m", "torchdoctor", "loader", f"{target}:make_loader"],
        capture_output=True,
        env=_env(),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr.decode(errors="replace")
    assert b"TD501" in proc.stdout and b"bad ? value" in proc.stdout
    assert b"internal error" not in proc.stderr
