"""CPU and threads: counts against psutil and the kernel, the torch thread estimate against the real
torch.get_num_threads(), the OpenCV probe, and the TD25x checks both ways."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from torchdoctor.checks import run_checks
from torchdoctor.facts import Facts, GatherContext, cpu
from torchdoctor.options import CheckOptions

from .conftest import FIXTURES, REPO

CG = FIXTURES / "cgroups"
HAS_TORCH = importlib.util.find_spec("torch") is not None


# -- parsing and the estimate rule -------------------------------------------------------------
@pytest.mark.parametrize(
    "value, expected",
    [
        ("4", 4),
        (" 8 ", 8),
        ("4,2", 4),
        ("0", None),
        ("abc", None),
        ("", None),
        ("-1", None),
        (None, None),
    ],
)
def test_env_threads(value: str | None, expected: int | None) -> None:
    assert cpu.env_threads(value) == expected


@pytest.mark.parametrize(
    "env, physical, affinity, machine, expected",
    [
        ({}, 32, 64, "x86_64", 32),
        ({}, 32, 4, "x86_64", 4),
        ({"OMP_NUM_THREADS": "3"}, 2, 2, "x86_64", 2),
        ({"OMP_NUM_THREADS": "3", "MKL_DYNAMIC": "FALSE"}, 2, 2, "x86_64", 3),
        ({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "1"}, 8, 8, "x86_64", 1),
        ({"OMP_NUM_THREADS": "0"}, 8, 8, "x86_64", 8),
        ({}, 16, 4, "aarch64", 16),
        ({"OMP_NUM_THREADS": "6"}, 16, 4, "aarch64", 6),
    ],
)
def test_estimate_rule(env: dict[str, str], physical: int, affinity: int, machine: str, expected: int) -> None:
    value, rule = cpu.estimate_torch_threads(env, physical, affinity, machine)
    assert value == expected and rule


# -- gatherer on a fixture root and on this host -----------------------------------------------
def test_k8s_root_counts_and_quota() -> None:
    ctx = GatherContext(root=CG / "k8s-pod", env={"OMP_NUM_THREADS": "2", "PATH": "/bin"})
    out = cpu.gather(ctx)
    assert (out["logical_cores"], out["physical_cores"], out["affinity_cores"]) == (64, 32, 64)
    assert out["cgroup_quota_cpus"] == 2.0 and out["cgroup_quota_source"] == "/sys/fs/cgroup/cpu.max"
    assert (out["usable_cores"], out["usable_threads"], out["usable_limited_by"]) == (2, 2, "cgroup-quota")
    assert out["thread_env"] == {"OMP_NUM_THREADS": "2"}


def test_fractional_quota_rounds_threads_up() -> None:
    out = cpu.gather(GatherContext(root=CG / "v1-docker", env={}))
    assert out["cgroup_quota_cpus"] == 1.5 and out["usable_cores"] == 1.5 and out["usable_threads"] == 2


def test_live_counts_match_psutil_and_os() -> None:
    out = cpu.gather(GatherContext())
    assert out["logical_cores"] == psutil.cpu_count()
    assert out["physical_cores"] == psutil.cpu_count(logical=False)
    assert out["affinity_cores"] == len(os.sched_getaffinity(0))
    assert out["usable_cores"] <= out["affinity_cores"]


def _in_child(code: str, env: dict[str, str] | None = None, cpus: set[int] | None = None) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if k not in cpu.THREAD_ENV}
    full.update(env or {})

    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=180,
        env=full,
        preexec_fn=pin,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


ESTIMATE_THEN_TORCH = """
    import json, sys, warnings
    from torchdoctor.facts import GatherContext
    from torchdoctor.facts import cpu
    facts = cpu.gather(GatherContext())
    assert "torch" not in sys.modules
    warnings.filterwarnings("ignore")
    import torch
    print(json.dumps({"estimate": facts["torch_threads_estimate"], "rule": facts["torch_threads_rule"],
                      "affinity": facts["affinity_cores"], "real": torch.get_num_threads()}))
"""

CASES = [
    ({}, None),
    ({"OMP_NUM_THREADS": "1"}, None),
    ({"OMP_NUM_THREADS": "3"}, None),
    ({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "1"}, None),
    ({"OMP_NUM_THREADS": "3", "MKL_DYNAMIC": "FALSE"}, None),
    ({"OMP_NUM_THREADS": "abc"}, None),
    ({}, {0}),
]


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("env, cpus", CASES, ids=[f"{e or 'no-env'}-{c or 'all-cpus'}" for e, c in CASES])
def test_estimate_equals_real_torch_get_num_threads(env: dict[str, str], cpus: set[int] | None) -> None:
    got = _in_child(ESTIMATE_THEN_TORCH, env, cpus)
    assert got["estimate"] == got["real"], got
    if cpus is not None:
        assert got["affinity"] == len(cpus)


def test_real_affinity_is_read_in_a_pinned_child() -> None:
    got = _in_child(
        """
        import json
        from torchdoctor.facts import GatherContext
        from torchdoctor.facts import cpu
        print(json.dumps(cpu.gather(GatherContext())))
    """,
        cpus={0},
    )
    assert got["affinity_cores"] == 1 and got["affinity_list"] == "0" and got["usable_cores"] == 1


# -- OpenCV ------------------------------------------------------------------------------------
def test_cv2_absent_is_reported_as_not_installed() -> None:
    if importlib.util.find_spec("cv2") is not None:
        pytest.skip("cv2 is installed here")
    assert cpu.cv2_threads(GatherContext()) == {"installed": False}


def test_cv2_probe_runs_in_a_child_never_in_process(tmp_path: Path) -> None:
    # A stand-in module named cv2 (OpenCV is not installed here): tests the probe's plumbing, i.e.
    # that the count comes from a child interpreter and cv2 is never imported by torchdoctor.
    (tmp_path / "cv2.py").write_text(
        "import os\n__version__ = 'stub'\n"
        "def getNumThreads(): return int(os.environ['STUB_CV2_THREADS'])\n"
        "def getNumberOfCPUs(): return os.cpu_count()\n"
    )
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "STUB_CV2_THREADS": "7"}
    got = _in_child(
        """
        import json, sys
        from torchdoctor.facts import GatherContext
        from torchdoctor.facts import cpu
        out = cpu.cv2_threads(GatherContext())
        out["imported_here"] = "cv2" in sys.modules
        print(json.dumps(out))
    """,
        env,
    )
    assert got["installed"] is True and got["threads"] == 7 and got["imported_here"] is False
    skipped = _in_child(
        """
        import json
        from torchdoctor.facts import GatherContext
        from torchdoctor.facts import cpu
        print(json.dumps(cpu.cv2_threads(GatherContext(torch=False))))
    """,
        env,
    )
    assert skipped == {"installed": True, "threads": None}


# -- pure checks -------------------------------------------------------------------------------
def facts(**cpu_fields: Any) -> Facts:
    base: dict[str, Any] = {
        "logical_cores": 16,
        "physical_cores": 8,
        "affinity_cores": 16,
        "cgroup_quota_cpus": None,
        "usable_cores": 16,
        "usable_threads": 16,
        "usable_limited_by": "logical",
        "thread_env": {"OMP_NUM_THREADS": "4"},
        "torch_threads_estimate": 4,
        "torch_threads_rule": "OMP_NUM_THREADS=4",
        "cv2": {"installed": False},
    }
    base.update(cpu_fields)
    return Facts.from_dict({"meta": {"schema_version": 1}, "host": {"env": {}}, "cpu": copy.deepcopy(base)})


def found(f: Facts, opts: CheckOptions | None = None) -> dict[str, Any]:
    return {x.code: x for x in run_checks(f, opts) if x.code.startswith("TD25")}


def test_healthy_cpu_facts_raise_nothing() -> None:
    assert found(facts()) == {}


def test_td250_ranks_times_pool() -> None:
    hit = found(facts(torch_threads_estimate=8), CheckOptions(nproc_per_node=4))
    assert "TD250" in hit and "32 busy threads on 16 CPUs" in hit["TD250"].message
    assert "OMP_NUM_THREADS=4" in hit["TD250"].fix
    assert "TD250" not in found(facts(torch_threads_estimate=4), CheckOptions(nproc_per_node=4))


def test_td251_quota_below_visible() -> None:
    quota = dict(
        cgroup_quota_cpus=2.0,
        usable_cores=2,
        usable_threads=2,
        usable_limited_by="cgroup-quota",
        torch_threads_estimate=8,
    )
    hit = found(facts(**quota))
    assert "TD251" in hit and "2 CPUs of run time but 16" in hit["TD251"].message
    assert "OMP_NUM_THREADS=2" in hit["TD251"].fix
    assert "TD251" not in found(facts(**dict(quota, torch_threads_estimate=2)))  # pools already sized
    assert "TD251" not in found(facts(cgroup_quota_cpus=16.0))
    cv2 = found(facts(**dict(quota, torch_threads_estimate=2, cv2={"installed": True, "threads": 16})))
    assert "OpenCV 16 threads" in cv2["TD251"].message


def test_td252_cv2_pools_in_workers() -> None:
    with_cv2 = facts(cv2={"installed": True, "threads": 16, "source": "child"})
    hit = found(with_cv2, CheckOptions(num_workers=4))
    assert "TD252" in hit and "64 threads" in hit["TD252"].message
    assert "TD252" not in found(with_cv2, CheckOptions(num_workers=0))
    assert "TD252" not in found(facts(cv2={"installed": True, "threads": 1}), CheckOptions(num_workers=4))


def test_td253_env_unset_with_workers() -> None:
    unset = facts(thread_env={})
    hit = found(unset, CheckOptions(num_workers=4))
    assert "TD253" in hit and "4 workers" in hit["TD253"].message and hit["TD253"].severity.label == "info"
    assert "TD253" not in found(unset, CheckOptions(num_workers=1))
    assert "TD253" not in found(facts(thread_env={"OPENBLAS_NUM_THREADS": "1"}), CheckOptions(num_workers=4))


def test_td254_invalid_values() -> None:
    hit = found(facts(thread_env={"OMP_NUM_THREADS": "0", "MKL_DYNAMIC": "FALSE"}))
    assert "TD254" in hit and "OMP_NUM_THREADS='0'" in hit["TD254"].message
    assert "TD254" not in found(facts(thread_env={"OMP_NUM_THREADS": "4,2"}))


def test_unknown_cpu_yields_nothing() -> None:
    bare = Facts.from_dict({"meta": {"schema_version": 1}, "cpu": None})
    assert found(bare, CheckOptions(num_workers=8, nproc_per_node=8)) == {}
