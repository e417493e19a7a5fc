"""`torchdoctor loader` on real DataLoaders with real workers (tests/fixtures/loader/loader_targets.py,
built from the failure lab's datasets): the seed case and its fixes, descriptors under a real lowered
RLIMIT_NOFILE, unpicklable datasets, user code that raises, segfaults or hangs, batches against a
private small /dev/shm, copy-on-write growth and thread pools. Where the real failure is cheap, the
prediction is cross-checked against it (--force-live) and explain's reading of its text."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from torchdoctor.model import Severity
from torchdoctor.probes import LoaderReport, ProbeOptions, probe_loader

from .conftest import FIXTURES, REPO, run_cli

pytest.importorskip("torch")

TARGETS = FIXTURES / "loader" / "loader_targets.py"


def target(name: str) -> str:
    return f"{TARGETS}:{name}"


def probe(name: str, **kw: Any) -> LoaderReport:
    report = probe_loader(target(name), ProbeOptions(**kw))
    assert_nothing_left(report)
    return report


def assert_nothing_left(report: LoaderReport) -> None:
    """Every process the probe started is gone: nothing in the child's session, no child of ours."""
    sid = report.outcome["pid"]
    left = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                left.append(p.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    assert left == [], f"processes left in the probe's session: {left}"
    # multiprocessing's resource tracker, started by an earlier test of this pytest process, is not the probe's
    mine = [p for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(_cmdline(p))]
    assert mine == []


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def torch_segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("torch_")}


def ev(report: LoaderReport, code: str) -> dict[str, Any]:
    f = report.by_code(code)
    assert f is not None, f"{code} not among {report.codes()}"
    return {e.label: e.value for e in f.evidence}


# -- the seed case ---------------------------------------------------------------------------


@pytest.mark.parametrize("parent", ["spawn", "forkserver"])
def test_seed_case_predicted_without_sharing_anything(parent: str) -> None:
    before = torch_segments()
    r = probe("seed", parent_start_method=parent, static=True)
    f = r.by_code("TD511")
    assert f is not None and f.severity is Severity.ERROR and f.family == "shm-map-count"
    st = r.section["static"]
    assert st["storages"]["count"] == 70_000 and st["start_method"]["method"] == parent
    limit = int(Path("/proc/sys/vm/max_map_count").read_text())
    assert f"{70_000:,} tensor storages" in f.message and str(limit) in f.message
    assert ev(r, "TD511")["vm.max_map_count"] == limit
    assert "sharing strategy" in ev(r, "TD511") and ev(r, "TD511")["sharing strategy"] == "file_system"
    assert torch_segments() == before  # counted, not shared
    assert r.outcome["status"] == "ok" and r.outcome["seconds"] < 15


@pytest.mark.parametrize("name", ["seed_fork", "stacked"])
def test_seed_case_fixes_predicted_fine(name: str) -> None:
    r = probe(name, parent_start_method="spawn", static=True)
    assert not {"TD511", "TD512", "TD513"} & set(r.codes())
    st = r.section["static"]
    if name == "seed_fork":
        assert st["start_method"] == {"method": "fork", "source": "DataLoader(multiprocessing_context=…)"}
    else:
        assert st["storages"]["count"] == 1


def test_seed_case_in_a_fork_parent_is_fine() -> None:
    r = probe("seed", static=True)
    assert r.section["static"]["start_method"]["method"] == "fork"
    assert "TD511" not in r.codes()


# -- descriptors under a real lowered RLIMIT_NOFILE --------------------------------------------


def _nofile_256() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_file_descriptor_strategy_predicted_and_then_seen() -> None:
    args = ["loader", target("few_tensors"), "--parent-start-method", "spawn", "--format", "json"]
    pred = subprocess.run(
        [sys.executable, "-m", "torchdoctor", *args, "--static"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_nofile_256,
    )
    assert pred.returncode == 1, pred.stderr
    doc = json.loads(pred.stdout)
    f = next(x for x in doc["findings"] if x["code"] == "TD512")
    assert f["family"] == "fd-exhausted" and f["severity"] == "error"
    assert "RLIMIT_NOFILE 256" in f["message"] and "2,000 storages" in f["message"]
    assert doc["probe"]["static"]["owner"]["nofile_soft"] == 256
    real = subprocess.run(
        [sys.executable, "-m", "torchdoctor", *args, "--force-live"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_nofile_256,
    )
    outcome = json.loads(real.stdout)["probe"]["outcome"]
    assert outcome["status"] == "error" and "Too many open files" in outcome["error"]["message"]
    assert outcome["explained"]["family"] == "fd-exhausted"


# -- pickling --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "method", "path", "kind"),
    [
        ("lambda_transform", "spawn", "dataset.transform.fn", "lambda"),
        ("module_lambda", "spawn", "dataset.transform", "lambda"),
        ("thread_lock", "forkserver", "dataset.lock", "lock"),
        ("open_file", "spawn", "dataset.source['index']", "open file"),
        ("generator", "spawn", "dataset.source", "generator"),
    ],
)
def test_unpicklable_names_the_attribute_path(name: str, method: str, path: str, kind: str) -> None:
    r = probe(name, multiprocessing_context=method, static=True)
    f = r.by_code("TD520")
    assert f is not None and f.severity is Severity.ERROR and f.family == "worker-pickling"
    assert f.message.startswith(f"`{path}` is a") and r.section["static"]["pickling"]["culprit"]["kind"] == kind
    assert f"At `{path}`" in f.fix


def test_unpicklable_prediction_matches_the_real_failure() -> None:
    r = probe("lambda_transform", multiprocessing_context="spawn", force_live=True)
    assert "TD520" in r.codes() and "TD505" in r.codes()
    assert r.outcome["explained"]["family"] == "worker-pickling"
    assert "Can't pickle local object" in r.outcome["error"]["message"]


def test_unpicklable_under_fork_is_only_a_note() -> None:
    r = probe("lambda_transform")
    assert r.by_code("TD520").severity is Severity.INFO  # type: ignore[union-attr]
    assert r.section["live"]["ran"] is True


# -- the target's own code fails ---------------------------------------------------------------


def test_raising_dataset_gives_the_childs_traceback() -> None:
    r = probe("corrupt")
    f = r.by_code("TD501")
    assert f is not None and "ValueError" in f.message and "sample 3 is corrupt: bad header" in f.message
    tb = ev(r, "TD501")["traceback"]
    assert str(TARGETS) in tb and "torchdoctor/probes" not in tb and tb.rstrip().endswith("bad header")
    assert "loader_targets.py:" in f.fix


def test_segfaulting_dataset_is_a_crash_with_its_stack() -> None:
    r = probe("segfault")
    f = r.by_code("TD503")
    assert f is not None and "SIGSEGV" in f.message and "__getitem__" in f.message
    assert "Segmentation fault" in ev(r, "TD503")["fatal error and stack"]


def test_hanging_dataset_is_killed_at_the_timeout() -> None:
    r = probe("hangs", timeout=6)
    f = r.by_code("TD502")
    assert f is not None and r.outcome["status"] == "timeout"
    assert 6 <= r.outcome["seconds"] < 15
    assert "HangingDataset" not in f.message and "__getitem__" in f.message and "loader_targets.py" in f.message


def test_worker_crash_in_the_live_run_is_explained() -> None:
    r = probe("native_table")
    assert r.codes()[0] == "TD505"
    assert r.outcome["explained"]["code"] == "TD560"


def test_import_error_of_the_users_module_is_a_finding() -> None:
    r = probe_loader(f"{FIXTURES / 'loader' / 'broken_import.py'}:build")
    assert_nothing_left(r)
    f = r.by_code("TD501")
    assert f is not None and "ModuleNotFoundError" in f.message and "importing" in f.message
    assert "torchdoctor_no_such_dependency" in ev(r, "TD501")["traceback"]


@pytest.mark.parametrize(
    ("target_arg", "text"),
    [
        ("no_such_package_xyz.data:build", "no module named 'no_such_package_xyz'"),
        (f"{TARGETS}:no_such_function", "has no attribute 'no_such_function'"),
        (f"{TARGETS}:not_a_loader", "not a torch DataLoader or Dataset"),
        ("/nonexistent/train.py:build", "does not exist"),
        ("/usr/bin/ls:main", "TARGET file '/usr/bin/ls' is not a Python file"),
        (f"{FIXTURES / 'loader'}:build", "is a directory, not a Python file"),
        ("tests.fixtures.loader.no_such_module:build", "no module named 'tests.fixtures.loader.no_such_module'"),
    ],
)
def test_usage_errors_are_one_line(target_arg: str, text: str) -> None:
    proc = run_cli("loader", target_arg, "--static")
    assert proc.returncode == 2 and text in proc.stderr, (proc.returncode, proc.stdout[-2000:], proc.stderr)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    if "Python file" in text:  # names the fix too
        assert "TARGET is path/to/file.py:function or package.module:function" in proc.stderr


@pytest.mark.parametrize("beside", [None, "package"])
def test_a_text_file_target_is_a_usage_error(tmp_path: Path, beside: str | None) -> None:
    """`torchdoctor loader notes.txt:make_loader` was reported as TD501 "your code raised"; also when a
    `notes/` directory beside it makes `notes` importable (then the child finds out)."""
    (tmp_path / "notes.txt").write_text("make_loader is in train.py\n")
    if beside:
        (tmp_path / "notes").mkdir()
    proc = run_cli("loader", "notes.txt:make_loader", cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr)
    assert proc.stderr.strip() == (
        "torchdoctor: error: TARGET file 'notes.txt' is not a Python file (it does not "
        "end in .py); TARGET is path/to/file.py:function or package.module:function"
    )
    assert "TD501" not in proc.stdout


def test_a_dataset_is_built_into_a_loader_from_the_flags() -> None:
    r = probe("dataset_only", batch_size=4, num_workers=1)
    assert r.section["loader"]["batch_size"] == 4 and r.section["loader"]["num_workers"] == 1
    assert r.section["batch"]["samples"] == 4  # one batch of the built loader: batch_size 4
    live = r.section["live"]
    assert live["ran"] and live["samples_per_s"] > 0 and live["rate"]["window_samples"] % 4 == 0
    assert len(live["workers"]) == 1  # num_workers 1


def test_api_accepts_the_factory_itself() -> None:
    from tests.fixtures.loader import loader_targets  # type: ignore[import-not-found]

    r = probe_loader(loader_targets.plain, ProbeOptions(static=True))
    assert r.target == "tests.fixtures.loader.loader_targets:plain" and r.outcome["status"] == "ok"


# -- /dev/shm: a private small tmpfs ------------------------------------------------------------


def _in_small_shm(*args: str) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare -m for a private /dev/shm")
    script = 'mount -t tmpfs -o size=16m,mode=1777 tmpfs /dev/shm && exec "$@"'
    return subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            sys.executable,
            "-m",
            "torchdoctor",
            "loader",
            target("frames"),
            "--format",
            "json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_batches_larger_than_shm_predicted_before_they_fail() -> None:
    doc = json.loads(_in_small_shm().stdout)
    f = next(x for x in doc["findings"] if x["code"] == "TD530")
    assert f["family"] == "shm-exhausted" and f["severity"] == "error"
    assert "16 MiB per batch × 2 workers × prefetch 2 = 64 MiB" in f["message"] and "16 MiB free" in f["message"]
    assert doc["probe"]["live"]["ran"] is False  # predicted, not run
    real = json.loads(_in_small_shm("--force-live").stdout)["probe"]["outcome"]
    assert real["explained"]["family"] == "shm-exhausted", real


# -- memory growth and threads -------------------------------------------------------------------


def test_copy_on_write_growth_flagged_for_python_objects_not_numpy() -> None:
    pytest.importorskip("numpy")
    grows = probe("features_list")
    f = grows.by_code("TD532")
    assert f is not None and f.family == "host-oom"
    flat = probe("features_numpy")
    assert "TD532" not in flat.codes() and flat.section["live"]["ran"]


def test_thread_pools_in_workers_flagged() -> None:
    pooled = probe("pooled")
    assert "TD531" in pooled.codes(), pooled.section["live"]
    plain = probe("plain")
    assert "TD531" not in plain.codes()
    assert plain.section["live"]["bare_worker_threads"] == max(w["threads"] for w in plain.section["live"]["workers"])


def test_api_probes_a_loader_object_in_a_fork() -> None:
    from tests.fixtures.loader import loader_targets  # type: ignore[import-not-found]

    r = probe_loader(loader_targets.lambda_transform(), ProbeOptions(parent_start_method="spawn"))
    assert_nothing_left(r)
    assert r.target == "<torch.utils.data.dataloader.DataLoader object>"
    assert r.section["static"]["pickling"]["path"] == "dataset.transform.fn" and "TD520" in r.codes()
    crash = probe_loader(loader_targets.segfault())
    assert_nothing_left(crash)
    assert crash.codes()[0] == "TD503" and crash.outcome["signal"] == "SIGSEGV"


def test_memory_cap_kills_the_whole_probe() -> None:
    r = probe("features_list", memory_cap=96 * 1024 * 1024)
    f = r.by_code("TD504")
    assert f is not None and f.family == "host-oom" and r.outcome["status"] == "memory"
    assert r.outcome["peak_memory"] > 96 * 1024 * 1024 and "96 MiB" in f.message
