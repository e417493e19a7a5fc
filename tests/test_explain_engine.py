"""The explain engine on real text: normalisation, inputs, stitching, triage across ranks."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import shutil
from pathlib import Path

import pytest

from torchdoctor.errors import UsageError
from torchdoctor.explain import explain, explain_exception, explain_paths, rank_ranges
from torchdoctor.explain.normalize import SummaryTracker, normalize
from torchdoctor.explain.sources import (
    blocks,
    error_json_text,
    is_log_name,
    rank_from_path,
)
from torchdoctor.model import Severity
from torchdoctor.registry import Code, lookup
from torchdoctor.signature import Role, Signature

from .support.explain import (
    CONSOLE,
    PEER_CLOSED,
    REMOTE_ADVICE,
    SAVE_MISSING,
    TD150_LOG,
    TORCHRUN_LOGS,
    cascade_lines,
    fixture_body,
    interleave,
    rank_lines,
    support_codes,
)
from .support.explain import (
    FIXTURES as FIXTURES_ROOT,
)

CODES = support_codes()
FIXTURES_LOGS = FIXTURES_ROOT / "logs"


# --------------------------------------------------------------------------- normalisation
# Real lines: torchrun console recorded here (tests/fixtures/explain/torchrun-save-enoent); NCCL
# from https://github.com/NVIDIA/nccl/issues/207 and https://github.com/Oneflow-Inc/oneflow/issues/3586;
# srun from https://github.com/facebookresearch/ParlAI/issues/3084.


@pytest.mark.parametrize(
    ("line", "rank", "text"),
    [
        (
            "[default2]:[rank2]: RuntimeError: Parent directory /nonexistent-dir does not exist.",
            2,
            "RuntimeError: Parent directory /nonexistent-dir does not exist.",
        ),
        (
            "[rank2]: RuntimeError: Parent directory /nonexistent-dir does not exist.",
            2,
            "RuntimeError: Parent directory /nonexistent-dir does not exist.",
        ),
        ("[default1]:step 0 loss 1.0000 sum 4", 1, "step 0 loss 1.0000 sum 4"),
        (
            '[default0]:  cpu = _conversion_method_template(device=torch.device("cpu"))',
            0,
            '  cpu = _conversion_method_template(device=torch.device("cpu"))',
        ),
        ("  5: step 0 loss 1.0000 sum 4", 5, "step 0 loss 1.0000 sum 4"),
        ("12: step 0 loss 1.0000 sum 4", 12, "step 0 loss 1.0000 sum 4"),
        ("[rank: 3] step 0 loss 1.0000 sum 4", 3, "step 0 loss 1.0000 sum 4"),
        (
            "srun: error: slurm-job-compute-0-1: task 14: Exited with exit code 1",
            14,
            "srun: error: slurm-job-compute-0-1: task 14: Exited with exit code 1",
        ),
        ("step 0 loss 1.0000 sum 4", None, "step 0 loss 1.0000 sum 4"),
        # accelerate launch workers (torchrun's agent): https://github.com/huggingface/accelerate/issues/3612
        (
            '[rank0]:   File "/A.I_DATA/jbnu/joonseo/gpu_test.py", line 83, in <module>',
            0,
            '  File "/A.I_DATA/jbnu/joonseo/gpu_test.py", line 83, in <module>',
        ),
        # `accelerate test` prefixes the script's output: https://github.com/huggingface/accelerate/issues/2390
        ("stderr:   rank      : 1 (local_rank: 1)", None, "  rank      : 1 (local_rank: 1)"),
        # Lightning's rank_prefixed_message and user prints (tests/fixtures/explain/pastes/SOURCE.md)
        (
            "[rank: 1] Child process with PID 2084751 terminated with code 1. Forcefully terminating all other processes to avoid zombies 🧟",
            1,
            "Child process with PID 2084751 terminated with code 1. Forcefully terminating all other processes to avoid zombies 🧟",
        ),
        ("[Rank 2]: Broadcasting data", 2, "[Rank 2]: Broadcasting data"),
        # a GUI front-end re-logging a trainer: https://github.com/cocktailpeanut/fluxgym/issues/340
        ("[2025-02-18 18:14:57] [INFO] Traceback (most recent call last):", None, "Traceback (most recent call last):"),
    ],
)
def test_rank_prefixes(line: str, rank: int | None, text: str) -> None:
    norm = normalize(line)
    assert (norm.rank, norm.text) == (rank, text)


def test_source_rank_is_the_default_and_a_prefix_wins() -> None:
    assert normalize("step 0 loss 1.0000 sum 4", rank=7).rank == 7
    assert normalize("[rank2]: step 0", rank=7).rank == 2


def test_ansi_codes_and_leading_timestamps_are_stripped() -> None:
    norm = normalize(
        "\x1b[1;31m2026-11-21 23:23:25,122 [rank2]: RuntimeError: Parent directory /x does not exist.\x1b[0m"
    )
    assert norm.text == "RuntimeError: Parent directory /x does not exist."
    assert norm.rank == 2 and norm.time is not None and norm.time[0] == "wall"
    assert "\x1b" not in norm.clean
    iso = normalize("[2026-11-21T23:23:25.5Z] step 1")
    assert iso.text == "step 1" and iso.time is not None


def test_glog_header_gives_time_but_stays_in_the_text() -> None:
    line = "E1121 23:23:25.122000 25700 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 2 (pid: 25721) of binary: /work/main/.venv/bin/python3"
    norm = normalize(line)
    assert norm.text == line and norm.time is not None and norm.time[0] == "glog"
    later = normalize(line.replace("23:23:25.122000", "23:23:26.000000"))
    assert later.time[1] > norm.time[1]  # type: ignore[index]


@pytest.mark.parametrize(
    ("line", "host"),
    [
        ("gpu2:46654:46654 [0] NCCL INFO NET : Using interface ib0:12.12.12.102<0>", "gpu2"),
        ("worker:101542:101934 [0] include/socket.h:403 NCCL WARN Connect to f", "worker"),
        ("srun: error: slurm-job-compute-0-0: tasks 2-7: Exited with exit code 1", "slurm-job-compute-0-0"),
    ],
)
def test_hosts_from_content(line: str, host: str) -> None:
    assert normalize(line).host == host


def test_torchrun_summary_is_read_per_rank() -> None:
    tracker = SummaryTracker()
    lines = CONSOLE.read_text(encoding="utf-8").split("\n")
    owners: dict[int, set[int | None]] = {}
    for i, raw in enumerate(lines, 1):
        norm = normalize(raw)
        tracker.feed(norm, "console.log", i)
        if "Connection closed by peer" in raw and not raw.startswith("[default"):
            owners.setdefault(i, set()).add(norm.rank)
    failures = {f.rank: f for f in tracker.finish() if f.rank is not None}
    assert sorted(failures) == [0, 1, 2, 3]
    assert failures[2].root and failures[2].exitcode == 1 and failures[2].host == "localhost"
    assert failures[0].exitcode == -15 and not failures[0].root
    assert "nonexistent-dir" not in (failures[0].message or "")
    # the summary's traceback lines belong to the rank of their entry (1 and 3 here)
    assert {r for rs in owners.values() for r in rs} == {1, 3}


# --------------------------------------------------------------------------- inputs


def test_blocks_keep_line_numbers_across_any_piece_size() -> None:
    data = CONSOLE.read_bytes()
    expect = data.split(b"\n")
    for size in (1, 7, 64, 4096):
        pieces = [data[i : i + size] for i in range(0, len(data), size)]
        got: list[tuple[int, bytes]] = []
        for b in blocks(pieces):
            for k, line in enumerate(b.data[b.start : b.end].split(b"\n")[:-1]):
                got.append((b.first_line + k, line))
        assert [n for n, _ in got] == list(range(1, len(got) + 1))
        assert [line for _, line in got] == expect[: len(got)]


def test_a_long_line_is_cut_and_numbering_goes_on() -> None:
    long = b"x" * 300_000
    data = b"first\n" + long + b"\nlast Error\n"
    for size in (10, 100_000, 1 << 20):
        pieces = [data[i : i + size] for i in range(0, len(data), size)]
        lines = []
        for b in blocks(pieces, max_line=1000):
            for k, line in enumerate(b.data[b.start : b.end].split(b"\n")[:-1]):
                lines.append((b.first_line + k, line))
        assert lines[0] == (1, b"first") and lines[-1] == (3, b"last Error")
        # a line split over pieces is cut at max_line; one inside a piece is cut when it is read
        assert lines[1][1].startswith(b"xxx") and len(lines[1][1]) <= max(1000, size)


def test_a_ten_megabyte_line_is_read_in_bounded_form() -> None:
    line = rank_lines(2)[-1]
    data = (line + " " + "y" * 10_000_000 + "\n" + line + "\n").encode()
    report = explain(data, codes=CODES)
    d = report.root_cause
    assert d is not None and d.count == 2 and [r.line for r in d.evidence] == [1, 2]
    assert len(d.evidence[0].text) <= 64 * 1024


def test_gzip_is_recognised_by_content(tmp_path: Path) -> None:
    plain = explain(TD150_LOG)
    gz = tmp_path / "rank0.log"  # no .gz suffix: recognised by its magic bytes
    gz.write_bytes(gzip.compress(TD150_LOG.read_bytes()))
    zipped = explain(gz)
    assert zipped.codes() == plain.codes() == ["TD150"]
    assert zipped.diagnoses[0].evidence[0].line == plain.diagnoses[0].evidence[0].line
    assert zipped.diagnoses[0].rank == 0  # from the file name


def test_truncated_gzip_keeps_what_came_before(tmp_path: Path) -> None:
    data = gzip.compress(TD150_LOG.read_bytes() * 3)
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(data[: len(data) - 40])
    report = explain(cut)
    assert "TD150" in report.codes()
    assert any("gzip" in n for n in report.notes)


def test_error_json_message_holds_the_traceback() -> None:
    raw = (TORCHRUN_LOGS / "258bd377-01a9-4202-966b-c86d95baf74a_qdimk6zq/attempt_0/2/error.json").read_bytes()
    text = error_json_text(raw)
    assert text is not None and "Traceback (most recent call last):" in text
    assert text.rstrip().endswith("RuntimeError: Parent directory /nonexistent-dir does not exist.")
    assert error_json_text(b"not json") is None and error_json_text(b"[1, 2]") is None


def test_paths_give_ranks_and_walks_choose_log_files() -> None:
    assert rank_from_path("logs/run/attempt_0/3/stderr.log") == 3
    assert rank_from_path("logs/run/attempt_1/12/error.json") == 12
    assert rank_from_path("out/train_rank7.log") == 7
    assert rank_from_path("out/train.log") is None
    assert is_log_name("stderr.log") and is_log_name("slurm-123.out") and is_log_name("x.log.gz")
    assert is_log_name("error.json") and not is_log_name("metrics.json") and not is_log_name("model.pt")


def test_torchrun_log_dir_names_the_failing_rank() -> None:
    report = explain(TORCHRUN_LOGS, codes=CODES)
    assert len(report.sources) == 11
    root = report.root_cause
    assert root is not None and root.code == "TDT01" and root.rank == 2
    assert root.message == "torch.save: /nonexistent-dir does not exist"
    cascade = next(d for d in report.diagnoses if d.code == "TDT02")
    assert cascade.role == "cascade" and cascade.ranks == [1, 3] and cascade.explained_by == "TDT01"
    assert report.first_failure["rank"] == 2
    assert any(r.file.endswith("2/stderr.log") for r in root.evidence)


def test_torchrun_console_names_the_failing_rank_and_host() -> None:
    report = explain(CONSOLE, codes=CODES)
    root = report.root_cause
    assert root is not None and (root.code, root.rank, root.host) == ("TDT01", 2, "localhost")
    assert report.ranks[0]["signal"] == "SIGTERM" and report.ranks[2]["exitcode"] == 1
    assert report.ranks[2].get("torchrun_root_cause") is True
    assert any("same rank" in n for n in root.notes)
    assert root.traceback and "PyTorchFileWriter" in root.traceback[-1]


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        explain_paths([str(tmp_path / "nope.log")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no log files"):
        explain_paths([str(tmp_path / "empty")])


def test_bytes_lines_and_text_inputs_agree() -> None:
    raw = TD150_LOG.read_bytes()
    by_text = explain(raw.decode())
    by_bytes = explain(raw)
    by_lines = explain(iter(raw.decode().split("\n")))
    assert by_text.codes() == by_bytes.codes() == by_lines.codes() == ["TD150"]
    where = raw.decode().split("\n").index("RuntimeError: received 0 items of ancdata") + 1
    assert by_text.diagnoses[0].evidence[0].line == by_lines.diagnoses[0].evidence[0].line == where


# --------------------------------------------------------------------------- stitching


def test_exception_line_knows_its_traceback() -> None:
    report = explain(TD150_LOG)
    tb = report.diagnoses[0].traceback
    assert tb[0] == "Traceback (most recent call last):"
    assert any("in recvfds" in line for line in tb)


def test_interleaved_rank_tracebacks_are_stitched_per_rank() -> None:
    # rank 5 fails with TD150 while ranks 1 and 3 print real gloo cascades, line by line interleaved
    log = interleave({5: fixture_body(TD150_LOG), 1: cascade_lines(), 3: cascade_lines()})
    report = explain(log, codes=CODES)
    root = report.root_cause
    assert root is not None and root.code == "TD150" and root.rank == 5
    assert any("recvfds" in line for line in root.traceback)
    assert not any("all_reduce" in line for line in root.traceback)  # nothing from the other ranks
    peer = next(d for d in report.diagnoses if d.code == "TDT02")
    assert peer.traceback and any("all_reduce" in line for line in peer.traceback)


def test_traceback_frames_and_source_lines_never_match() -> None:
    # the frame `File ".../reduction.py", line 189, in recv_handle` and the source line under it
    frame = Code(
        code="TDT07",
        name="recv-handle-frame",
        family="fd-exhausted",
        severity=Severity.ERROR,
        area="shm",
        title="t",
        message="m",
        fix="f",
        meaning="-",
        why="-",
        false_positives="-",
        signatures=(Signature(role=Role.ROOT_CAUSE, triggers=("recv_handle",), pattern=r"recv_handle"),),
    )
    body = fixture_body(TD150_LOG)
    assert explain(body, codes=[frame]).codes() == []
    outside = [line.strip() for line in body if "recv_handle" in line]
    assert explain(outside, codes=[frame]).codes() == ["TDT07"]


def test_wrapped_line_is_joined_with_the_next() -> None:
    line = rank_lines(2)[-1]  # RuntimeError: Parent directory /nonexistent-dir does not exist.
    head, tail = line.split(" does ")
    report = explain([head, "does " + tail], codes=[SAVE_MISSING])
    assert report.codes() == ["TDT01"]
    assert [r.line for r in report.diagnoses[0].evidence] == [1]


# --------------------------------------------------------------------------- cut tracebacks (frames=True)
# Real text: the TD450 lab fixtures (recorded here), CUT HERE before their exception line, the way a
# paste that stops at the last frame looks; their own exception line tells which variable to expect.

TD450_LABS = sorted((FIXTURES_LOGS / "TD450").glob("lab-dist-env-missing-*.log"))


def _cut_before_exception(path: Path) -> tuple[list[str], str]:
    """The fixture's lines without its last (exception) line, and that line."""
    body = [line for line in fixture_body(path) if line.strip()]
    return body[:-1], body[-1]


def _td450_var(exception_line: str) -> str:
    message_sig = lookup("TD450").signatures[0]
    values = message_sig.match(exception_line)
    assert values is not None, exception_line
    return values["var"]


@pytest.mark.parametrize("path", TD450_LABS, ids=lambda p: p.stem)
def test_cut_traceback_is_read_at_its_last_source_line(path: Path) -> None:
    cut, exception_line = _cut_before_exception(path)
    assert cut[-1].strip() == "raise _env_error(env_var)"  # torch 2.x: the name is in the caller's line
    report = explain(cut)
    root = report.root_cause
    assert root is not None and root.code == "TD450"
    assert root.values["var"] == _td450_var(exception_line)
    assert root.evidence[0].line == len(cut) and root.evidence[0].text == cut[-1]
    assert any("cut before its exception line" in note for note in root.notes)
    assert root.traceback[-1] == "raise _env_error(env_var)"


def test_whole_traceback_matches_its_exception_line_not_its_frames() -> None:
    body = [line for line in fixture_body(TD450_LABS[0]) if line.strip()]
    root = explain(body).root_cause
    assert root is not None and root.code == "TD450" and root.evidence[0].line == len(body)
    assert not any("cut before" in note for note in root.notes)


def test_torch_1x_cut_traceback_names_the_variable_in_its_raise() -> None:
    # tunib-ai/large-scale-lm-tutorials (torch 1.x): `raise _env_error("MASTER_ADDR")`, see its header
    path = FIXTURES_LOGS / "TD450" / "large-scale-lm-tutorials-cut-before-valueerror.log"
    body = [line for line in fixture_body(path) if line.strip()]
    root = explain(body).root_cause
    assert root is not None and root.code == "TD450"
    assert f'raise _env_error("{root.values["var"]}")' == body[-1].strip()


def test_cut_traceback_ends_at_a_new_traceback_or_another_line() -> None:
    cut, _ = _cut_before_exception(TD450_LABS[0])
    port = [
        line for line in fixture_body(FIXTURES_LOGS / "TD450" / "near-env-rendezvous-port-in-use.log") if line.strip()
    ]
    # the cut traceback, then another run's whole traceback (a new header closes the cut one)
    report = explain(cut + port)
    assert report.codes()[:2] == ["TD450", "TD451"] and report.root_cause.evidence[0].line == len(cut)  # type: ignore[union-attr]
    # the cut traceback, then a log line that is not an exception line (the NumPy warning's source line)
    after = [line for line in port if line.startswith("  cpu = ")]
    assert explain(cut + [after[0].strip()]).codes() == ["TD450"]


def test_frames_signatures_try_only_the_last_source_line() -> None:
    cut, _ = _cut_before_exception(TD450_LABS[0])
    first_frame = next(line for line in cut if line.startswith("  File "))
    frame_source = cut[cut.index(first_frame) + 1]
    # the raise is no longer the last source line: another frame (real lines, repeated) follows it
    assert explain(cut + [first_frame, frame_source]).codes() == []
    # a traceback cut elsewhere (the port-in-use run, at `store = _create_c10d_store(`) is no TD450
    port_cut, _ = _cut_before_exception(FIXTURES_LOGS / "TD450" / "near-env-rendezvous-port-in-use.log")
    assert "TD450" not in explain(port_cut).codes()
    # the raise as a line of its own, outside any traceback, is source code, not a failure
    assert explain([cut[-1].strip()]).codes() == []


def test_cut_traceback_on_one_rank_among_others() -> None:
    cut, exception_line = _cut_before_exception(TD450_LABS[0])
    log = interleave({3: cut, 1: cascade_lines(), 2: cascade_lines()})
    report = explain(log, codes=[*CODES, lookup("TD450")])
    root = report.root_cause
    assert root is not None and (root.code, root.rank) == ("TD450", 3)
    assert root.values["var"] == _td450_var(exception_line)


# --------------------------------------------------------------------------- traceback context (context=...)
# TD661's signature needs one of shutil.rmtree's walk operations in the traceback its line closes.

TD661_LAB = FIXTURES_LOGS / "TD661" / "lab-writes-ranks-rmtree-checkpoint.log"


def _exception_line(lines: list[str]) -> str:
    return next(line for line in reversed(lines) if line.startswith("FileNotFoundError:"))


def test_context_is_read_from_the_traceback_the_line_closes() -> None:
    body = fixture_body(TD661_LAB)
    root = explain(body).root_cause
    assert root is not None and root.code == "TD661"
    line = _exception_line(body)
    assert f"'{root.values['path']}'" in line and "/" not in root.values["path"]  # a name inside the tree
    assert any("in _rmtree_safe_fd" in frame for frame in root.traceback)


def test_context_signature_never_matches_without_its_traceback() -> None:
    body = fixture_body(TD661_LAB)
    assert "TD661" not in explain([_exception_line(body)]).codes()
    # the same exception line closing a traceback that fails outside the walk (rmtree of a missing
    # directory, recorded here): no TD661 either
    missing = fixture_body(FIXTURES_LOGS / "TD661" / "near-rmtree-missing-directory.log")
    swapped = [line for line in missing if not line.startswith("FileNotFoundError:")] + [_exception_line(body)]
    assert "TD661" not in explain(swapped).codes()


def test_signature_context_and_frames_helpers() -> None:
    sig = lookup("TD661").signatures[0]
    assert sig.in_context(
        ['File "/usr/lib/python3.10/shutil.py", line 679, in _rmtree_safe_fd', "os.unlink(entry.name, dir_fd=topfd)"]
    )
    assert not sig.in_context(
        ['File "/usr/lib/python3.11/shutil.py", line 720, in rmtree', "orig_st = os.lstat(path, dir_fd=dir_fd)"]
    )
    assert not sig.in_context([])
    with pytest.raises(ValueError):
        Signature(role=Role.ROOT_CAUSE, triggers=("x",), pattern="x", context="in rmtree")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Signature(role=Role.ROOT_CAUSE, triggers=("x",), pattern="x", frames=True, context=("y",))
    frames = next(s for s in lookup("TD450").signatures if s.frames and "get_env_or_raise" in s.pattern)
    cut, _ = _cut_before_exception(TD450_LABS[0])
    tail = [line.strip() for line in cut if line.strip() and not set(line.strip()) <= {"^", "~"}]
    assert frames.match_frames(tail) is not None
    assert frames.match_frames(tail[:-1]) is None  # the match must reach into the last line
    assert frames.match(tail[-1]) is None  # never on a log line


# --------------------------------------------------------------------------- wrapped lines without a prefix
# Real text: https://github.com/huggingface/open-r1/issues/620 (tests/fixtures/explain/pastes/SOURCE.md)

PASTES = FIXTURES_ROOT / "explain" / "pastes"
WRAPPED = PASTES / "open-r1-620-wrapped-watchdog.log"
THREE_PIECES = PASTES / "open-r1-620-wrapped-three-pieces.log"


def test_continuation_without_prefix_joins_the_rank_line_above() -> None:
    lines = WRAPPED.read_text(encoding="utf-8").splitlines()
    prefixed = [(i, int(line[5 : line.index("]")])) for i, line in enumerate(lines, 1) if line.startswith("[rank")]
    assert all(not lines[i].startswith("[") for i, _ in prefixed)  # each continuation has no prefix
    report = explain(lines)
    d = next(d for d in report.diagnoses if d.code == "TD490")
    assert sorted(d.ranks) == sorted(r for _, r in prefixed) and d.count == len(prefixed)
    assert d.values["op"] == "BROADCAST"  # "OpTy" + "pe=BROADCAST": joined exactly, as the terminal cut it
    assert d.values["ran_ms"] in lines[prefixed[0][0]]  # read from the continuation
    assert [(e.line, e.rank) for e in d.evidence] == prefixed  # each rank's own line, not the continuation
    assert any(f":{prefixed[0][0] + 1}," in note and "no rank prefix" in note for note in d.notes)


def test_three_piece_wrap_joins_the_last_piece() -> None:
    lines = THREE_PIECES.read_text(encoding="utf-8").splitlines()
    second = next(i for i, line in enumerate(lines, 1) if line.startswith("ed with exception"))
    d = next(d for d in explain(lines).diagnoses if d.code == "TD490")
    assert (d.rank, d.evidence[0].line, d.values["op"]) == (1, second, "BROADCAST")
    assert d.values["timeout_ms"] in lines[second]  # the third piece


def _td490_values(lines: list[str]) -> dict[str, str]:
    return next(d for d in explain(lines).diagnoses if d.code == "TD490").values


def test_continuation_is_joined_only_with_the_line_just_above() -> None:
    lines = WRAPPED.read_text(encoding="utf-8").splitlines()[:2]
    assert _td490_values(lines)["op"] == "BROADCAST"  # joined: every value
    # the head alone is recognised as a line cut short: the values past the cut are unknown
    head = explain(lines[:1]).diagnoses[0]
    assert head.code == "TD490" and head.values["op"] == "?" and any("cut short" in n for n in head.notes)
    # another rank's prefix on the continuation: a line of that rank, not a continuation
    assert _td490_values([lines[0], "[rank7]:" + lines[1]])["op"] == "?"
    # a real line in between (the three-piece paste's stack line): not adjacent, not joined
    between = next(
        line for line in THREE_PIECES.read_text(encoding="utf-8").splitlines() if line.startswith("frame #0")
    )
    assert _td490_values([lines[0], between, lines[1]])["op"] == "?"


# --------------------------------------------------------------------------- triage


def test_root_cause_wins_over_cascades_printed_before_it() -> None:
    streams = {r: cascade_lines() for r in (0, 1, 2, 3, 4, 6, 7)}
    log = interleave(streams) + [f"[rank5]: {line}" for line in fixture_body(TD150_LOG)]
    report = explain(log, codes=CODES)
    assert report.codes()[0] == "TD150" and report.root_cause.rank == 5  # type: ignore[union-attr]
    peer = next(d for d in report.diagnoses if d.code == "TDT02")
    assert peer.ranks_text == "0-4,6-7" and peer.explained_by == "TD150" and peer.count == 7
    assert report.first_failure["rank"] == 5


def test_earliest_root_cause_by_time_across_files(tmp_path: Path) -> None:
    # two real root causes in per-rank files; the file read first holds the later failure
    (tmp_path / "rank0.log").write_text("".join(f"2026-11-21 10:05:00,000 {line}\n" for line in rank_lines(2)[-3:]))
    (tmp_path / "rank7.log").write_text(
        "".join(f"2026-11-21 10:01:00,000 {line}\n" for line in fixture_body(TD150_LOG))
    )
    report = explain(tmp_path, codes=CODES)
    assert [d.code for d in report.diagnoses[:2]] == ["TD150", "TDT01"]
    assert report.root_cause.rank == 7  # type: ignore[union-attr]
    (tmp_path / "rank7.log").write_text(
        "".join(f"2026-11-21 10:09:00,000 {line}\n" for line in fixture_body(TD150_LOG))
    )
    assert explain(tmp_path, codes=CODES).root_cause.code == "TDT01"  # type: ignore[union-attr]


def test_without_times_reading_order_decides(tmp_path: Path) -> None:
    log = [f"[rank4]: {line}" for line in rank_lines(2)[-3:]] + [f"[rank6]: {line}" for line in fixture_body(TD150_LOG)]
    report = explain(log, codes=CODES)
    assert report.root_cause.code == "TDT01" and report.root_cause.rank == 4  # type: ignore[union-attr]
    later = next(d for d in report.diagnoses if d.code == "TD150")
    assert later.role == "root-cause" and "after the root cause" in later.notes[0]


def test_weak_root_cause_yields_to_a_strong_one() -> None:
    # the NumPy warning comes first in the real console but is a weak (0.3) root cause
    report = explain(CONSOLE, codes=CODES)
    assert report.codes()[0] == "TDT01"
    assert "TDT05" in report.codes()


def test_confirmation_raises_a_compatible_root_cause() -> None:
    with_conf = explain(TD150_LOG, codes=CODES)
    without = explain(TD150_LOG, codes=[c for c in CODES if c.code != "TDT04"])
    root = with_conf.root_cause
    assert root is not None and root.confidence > without.root_cause.confidence  # type: ignore[union-attr]
    conf = next(d for d in with_conf.diagnoses if d.code == "TDT04")
    assert conf.role == "confirmation" and conf.explained_by == "TD150"


def test_advice_is_never_the_cause() -> None:
    report = explain(cascade_lines(), codes=[PEER_CLOSED, REMOTE_ADVICE])
    assert report.codes() == ["TDT02", "TDT03"]
    assert report.root_cause is None and report.explained
    assert "no root cause" in report.diagnoses[0].notes[0]
    only_advice = explain(cascade_lines(), codes=[REMOTE_ADVICE])
    assert only_advice.diagnoses[0].role == "advice" and not only_advice.explained


def test_a_cascade_without_a_root_cause_is_never_a_sure_answer() -> None:
    """A line that says where a failure showed (a peer closed its connection) leads when nothing else was found,
    at CASCADE_AS_ANSWER of its line's confidence: below SURE, whatever the line's own confidence."""
    from torchdoctor.explain.triage import CASCADE_AS_ANSWER, SURE

    report = explain(cascade_lines(), codes=[PEER_CLOSED])
    lead = report.diagnoses[0]
    assert lead.role == "cascade" and lead.code == "TDT02"
    line_confidence = max(sig.confidence for sig in PEER_CLOSED.signatures)
    assert line_confidence >= SURE
    assert lead.confidence == round(line_confidence * CASCADE_AS_ANSWER, 2) < SURE
    # with the root cause present, the cascade keeps its own confidence and is explained by it
    both = explain(interleave({5: fixture_body(TD150_LOG), 1: cascade_lines()}), codes=CODES)
    cascade = next(d for d in both.diagnoses if d.code == "TDT02")
    assert cascade.explained_by == "TD150" and cascade.confidence == line_confidence


def test_no_match_shows_the_most_relevant_error_lines() -> None:
    report = explain(CONSOLE, codes=[])
    assert report.diagnoses == [] and int(report.exit_code) == 1
    top = report.unmatched_errors[0]
    assert top.ref.text.endswith("Parent directory /nonexistent-dir does not exist.") and top.ref.rank == 2
    assert top.traceback and top.traceback[0].startswith("Traceback")
    assert len(report.unmatched_errors) <= 8
    assert report.first_failure["source"] == "torchrun-summary" and report.first_failure["rank"] == 2


def test_empty_input_is_a_clean_report() -> None:
    report = explain("")
    assert report.diagnoses == [] and report.unmatched_errors == [] and report.lines == 0
    json.dumps(report.to_dict())


def test_rank_ranges() -> None:
    assert rank_ranges([0, 1, 2, 3, 4, 6, 7]) == "0-4,6-7"
    assert rank_ranges([5]) == "5" and rank_ranges([]) == ""


def test_explain_exception_formats_the_live_traceback() -> None:
    pickling = Code(
        code="TDT06",
        name="lambda-pickling",
        family="worker-pickling",
        severity=Severity.ERROR,
        area="loader",
        title="t",
        message="cannot pickle {what}",
        fix="f",
        meaning="-",
        why="-",
        false_positives="-",
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE, triggers=("Can't pickle",), pattern=r"Can't pickle local object '(?P<what>[^']+)'"
            ),
        ),
    )
    try:
        pickle.dumps(lambda: 0)  # Python's own error text, produced live
    except Exception as exc:  # noqa: BLE001
        report = explain_exception(exc, codes=[pickling])
    root = report.root_cause
    assert (
        root is not None
        and root.code == "TDT06"
        and root.message == "cannot pickle test_explain_exception_formats_the_live_traceback.<locals>.<lambda>"
    )
    assert any("test_explain_engine.py" in line for line in root.traceback)


def test_json_document_has_the_documented_keys() -> None:
    doc = explain(TORCHRUN_LOGS, codes=CODES).to_dict()
    assert {"schema_version", "command", "diagnoses", "first_failure", "ranks", "unmatched_errors"} <= set(doc)
    assert doc["schema_version"] == 1 and doc["command"] == "explain"
    d = doc["diagnoses"][0]
    assert {"code", "name", "family", "role", "confidence", "rank", "host", "message", "fix", "evidence"} <= set(d)
    assert {"file", "line", "rank", "text"} <= set(d["evidence"][0])
    assert set(doc["ranks"]) == {"0", "1", "2", "3"}
    json.loads(json.dumps(doc))


def test_render_formats(tmp_path: Path) -> None:
    from torchdoctor.explain.render import render

    report = explain(TORCHRUN_LOGS, codes=CODES)
    for fmt in ("text", "markdown", "json"):
        out = io.StringIO()
        render(report, fmt, out)
        text = out.getvalue()
        assert "TDT01" in text and "rank" in text
        if fmt != "json":
            assert "torchdoctor codes TDT01" in text or "More: `torchdoctor codes TDT01`" in text
    shutil.copy(CONSOLE, tmp_path / "c.log")


def test_per_rank_timeline_in_reading_order() -> None:
    report = explain(CONSOLE, codes=CODES)
    timeline = report.ranks[3]["timeline"]
    assert [e["line"] for e in timeline] == sorted(e["line"] for e in timeline)
    assert timeline[0]["code"] == "TDT05" and "TDT02" in [e["code"] for e in timeline]


def test_real_catalogue_watchdog_cascades_attach_to_the_real_root_cause() -> None:
    # real NCCL watchdog lines (TD490's open_clip fixture) from every rank but 5, and the real
    # TD150 lab output on rank 5: the earlier-printed watchdog timeouts are the cascade.
    watchdog = FIXTURES_LOGS / "TD490" / "open-clip-1024-torch-2.5.1.log"
    if not watchdog.exists():
        pytest.skip("TD490's fixture is not there yet")
    others = [line for line in fixture_body(watchdog) if line.strip() and not line.startswith("[rank5]")]
    log = others + [f"[rank5]: {line}" for line in fixture_body(TD150_LOG)]
    report = explain(log)
    root = report.root_cause
    assert root is not None and (root.code, root.rank) == ("TD150", 5)
    cascade = next(d for d in report.diagnoses if d.code == "TD490")
    assert cascade.role == "cascade" and cascade.explained_by == "TD150" and 5 not in cascade.ranks
    assert report.first_failure["rank"] == 5


# --------------------------------------------------------------------------- Accelerate and Lightning
# Real output (tests/fixtures/explain/pastes/SOURCE.md).

PASTES = FIXTURES_ROOT / "explain" / "pastes"


def test_accelerate_stderr_prefixed_summary_gives_ranks_and_hosts() -> None:
    report = explain(PASTES / "accelerate-2390-stderr-summary.log", codes=[])
    assert {r: (v["exitcode"], v["host"]) for r, v in report.ranks.items()} == {
        1: (1, "name-test"),
        2: (1, "name-test"),
        3: (1, "name-test"),
    }
    root = explain(PASTES / "accelerate-1473-stderr-root-cause.log", codes=[])
    assert root.first_failure is not None and root.first_failure["source"] == "torchrun-summary"
    assert (root.first_failure["rank"], root.first_failure["host"]) == (1, "dgx-a100-02.cse.iith.ac.in")


def test_rich_boxed_tracebacks_are_frames() -> None:
    # accelerate's rich tracebacks: box lines are source and frames, never errors or matches
    prepare = Code(
        code="TDT08",
        name="prepare-frame",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="t",
        message="m",
        fix="f",
        meaning="-",
        why="-",
        false_positives="-",
        signatures=(
            Signature(role=Role.ROOT_CAUSE, triggers=("accelerator.prepare",), pattern=r"accelerator\.prepare"),
        ),
    )
    start = explain(PASTES / "accelerate-882-rich-box-start.log", codes=[prepare])
    assert start.codes() == [] and start.unmatched_errors == []
    end = explain(PASTES / "kohya-897-rich-box-end.log", codes=[])
    texts = [u.ref.text for u in end.unmatched_errors]
    assert "ChildFailedError:" in texts and not any(t.startswith(("│", "╰")) for t in texts)


def test_lightning_fabric_ranks_and_child_process_line() -> None:
    report = explain(PASTES / "lightning-fabric-keys-values.log", codes=[])
    top, child = report.unmatched_errors[:2]
    assert top.ref.text.endswith("Parent communicator missing in eager initialization mode.")
    assert (top.ranks, top.count, top.score) == ([1, 2], 2, 4)
    assert top.traceback[0] == "Traceback (most recent call last):" and "isend" in top.traceback[-2]
    assert child.ref.rank == 1 and "terminated with code 1" in child.ref.text
    assert report.first_failure["rank"] == 1


# Real text: tests/fixtures/logs/TD478/mambatree-14-last-error.log (NCCL's 'Last error:' after torch's NCCL error)
def test_a_wrapper_error_gives_the_lead_to_the_reason_printed_after_it() -> None:
    report = explain("\n".join(fixture_body(FIXTURES_LOGS / "TD478" / "mambatree-14-last-error.log")) + "\n")
    assert report.root_cause is not None and report.root_cause.code == "TD478"
    assert any("TD481" in n for n in report.root_cause.notes)
    wrapper = next(d for d in report.diagnoses if d.code == "TD481")
    assert wrapper.explained_by == "TD478"
    # the reason alone, without the wrapper above it, is still the root cause; the wrapper alone stays TD481
    alone = explain("Last error:\nBootstrap : no socket interface found\n")
    assert alone.root_cause is not None and alone.root_cause.code == "TD478"
    body = [line for line in fixture_body(FIXTURES_LOGS / "TD478" / "mambatree-14-last-error.log") if line.strip()]
    wrapper_only = explain("\n".join(body[:-1]) + "\n")
    assert wrapper_only.root_cause is not None and wrapper_only.root_cause.code == "TD481"


# Real text: tests/fixtures/logs/TD459/*.log (torchrun's summary of a worker killed by SIGKILL, no error of its own)
def test_a_confirmation_alone_leads_as_a_hypothesis() -> None:
    path = next(p for p in sorted((FIXTURES_LOGS / "TD459").glob("*.log")) if not p.name.startswith("near-"))
    report = explain("\n".join(fixture_body(path)) + "\n")
    top = report.diagnoses[0]
    assert report.root_cause is None
    assert (top.code, top.role) == ("TD459", "hypothesis") and top.confidence < 0.8
    assert top.confirm and any("no failure line to confirm" in n for n in top.notes)
    assert all(d.role != "confirmation" for d in report.diagnoses if d.code == "TD459")


# Real text: tests/fixtures/logs/TD498/pytorch-14870-gloo-works-nccl-deadlock.log (a title that two weak hang
# symptoms of dist-hang also match): two signatures reading one sentence are one piece of evidence, so dist-hang
# stays at its strongest single symptom instead of adding up to the cap, and the comparison with gloo leads
def test_one_sentence_read_by_two_symptoms_of_a_family_counts_once() -> None:
    from torchdoctor.signature import SYMPTOM_MAX

    body = fixture_body(FIXTURES_LOGS / "TD498" / "pytorch-14870-gloo-works-nccl-deadlock.log")
    report = explain("\n".join(body) + "\n")
    top = report.diagnoses[0]
    assert (top.code, top.confidence) == ("TD498", SYMPTOM_MAX)
    hang = [d for d in report.diagnoses if d.family == "dist-hang"]
    assert len(hang) >= 2 and len({d.evidence[0].line for d in hang}) == 1  # several codes, one sentence
    assert max(d.confidence for d in hang) == 0.5


# Real text: tests/fixtures/logs/TD489/nccl-1016-two-h100-nodes.log (NCCL's 'unhandled system error', then the report
# says it runs "multi node ... between 2 H100 nodes"): rule 11 reads the generic NCCL error as the network between
# the nodes; the same error line alone stays NCCL's own
def test_a_generic_nccl_error_on_several_nodes_is_read_as_the_network_between_them() -> None:
    body = [line for line in fixture_body(FIXTURES_LOGS / "TD489" / "nccl-1016-two-h100-nodes.log") if line.strip()]
    report = explain("\n".join(body) + "\n")
    top = report.diagnoses[0]
    assert (top.code, top.family, top.role) == ("TD489", "dist-connect", "root-cause")
    assert report.root_cause is not None and report.root_cause.code == "TD489"
    assert top.confidence < 0.8 and any("multi node" in n for n in top.notes)
    nccl = next(d for d in report.diagnoses if d.code == "TD480")
    assert nccl.explained_by == "TD489"
    alone = explain(body[0] + "\n")
    assert alone.diagnoses[0].code == "TD480" and all(d.code != "TD489" for d in alone.diagnoses)


def test_several_nodes_are_seen_from_the_hosts_of_the_ranks_or_from_the_words() -> None:
    """Rule 11's test of a multi-node run: ranks that failed on two hosts, or the words of such a run in the
    log's head; one host and no such words is one node."""
    from torchdoctor.explain.collect import Collector, RankRecord
    from torchdoctor.explain.triage import _several_nodes

    col = Collector()
    col.ranks = {0: RankRecord(host="node-1"), 1: RankRecord(host="node-1")}
    assert _several_nodes(col) is None
    col.ranks[8] = RankRecord(host="node-2")
    assert _several_nodes(col) == "ranks on 2 hosts (node-1, node-2)"
    one = Collector()
    one.head = [("train.log", 1, "torchrun --nnodes=2 --node_rank=1 train.py")]
    assert _several_nodes(one) == "the log says '--nnodes=2'"


# Phrases from real reports (the tune half's pytorch-68893, lmcache-1988, rhkb-463024, milabench-183) and a
# few single-machine phrasings: rule 11 needs the words of a run over several machines, not any number near "node"
@pytest.mark.parametrize(
    ("phrase", "several"),
    [
        ("a simple distributed PyTorch job across 2 `g4dn.xlarge` nodes", True),
        ("When using lmcache with sglang in a two-node deployment", True),
        ("单机多卡可以正常训练模型,多机多卡数据加载完成后卡住不动", True),
        ("Running on 3 nodes, each node has 2 A10 GPUs.", True),
        ("multi-machine training with torchrun", True),
        ("I run it on a 2-GPU machine", False),
        ("Failed to find reverse path from remNode 0/5f000 nlinks 4 to node 0/cb000", False),
        ("2 GPUs on one node", False),
        ("torchrun --standalone --nproc_per_node=8 train.py", False),
    ],
)
def test_the_words_of_a_multi_node_run(phrase: str, several: bool) -> None:
    from torchdoctor.explain.collect import Collector
    from torchdoctor.explain.triage import _several_nodes

    col = Collector()
    col.head = [("report.txt", 1, phrase)]
    assert (_several_nodes(col) is not None) is several


# Real text: tests/fixtures/logs/TD479/sglang-3470-two-nodes-tp16.log ('invalid device ordinal' in the title,
# '--nnodes 2' in the launch command on the next line): rule 11 reads TD356 as the global rank used as the device
def test_an_invalid_device_ordinal_on_several_nodes_is_read_as_the_global_rank() -> None:
    body = [line for line in fixture_body(FIXTURES_LOGS / "TD479" / "sglang-3470-two-nodes-tp16.log") if line.strip()]
    report = explain("\n".join(body) + "\n")
    top = report.diagnoses[0]
    assert (top.code, top.family, top.role) == ("TD479", "dist-env", "root-cause")
    assert top.confidence < 0.8 and any("--nnodes 2" in n for n in top.notes)
    assert "TD356's line on a run over several nodes" in top.message
    ordinal = next(d for d in report.diagnoses if d.code == "TD356")
    assert ordinal.explained_by == "TD479"
    alone = explain(body[0] + "\n")
    assert alone.diagnoses[0].code == "TD356" and all(d.code != "TD479" for d in alone.diagnoses)
