"""The determinism audit (torchdoctor.ranks.determinism): pure rules on fact dicts, the live report in
fresh processes (seeded or not), real DataLoaders and samplers, and torch's own warnings about the
non-deterministic operations that really ran on the CPU (``put_``, ``MaxUnpool``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import pytest

from torchdoctor.model import Severity
from torchdoctor.ranks.determinism import (
    DeterminismReport,
    NondeterminismRecorder,
    determinism_report,
    determinism_rules,
    ops_from,
)

torch = pytest.importorskip("torch")

#: A real unseeded torch.initial_seed() (64 random bits) and what a clean CPU process reads.
UNSEEDED = 5838453084154559945
CLEAN: dict[str, Any] = {
    "torch": {"version": "2.13.0+cpu", "cuda_built": False, "cuda_initialized": False},
    "seed": {"initial_seed": 1234, "given": None},
    "deterministic_algorithms": {"enabled": True, "warn_only": False},
    "cudnn": {"benchmark": False, "deterministic": False},
    "env": {"CUBLAS_WORKSPACE_CONFIG": None, "PYTHONHASHSEED": "0"},
    "epoch": 3,
    "loader": {
        "type": "torch.utils.data.dataloader.DataLoader",
        "num_workers": 2,
        "worker_init_fn": None,
        "generator_seed": None,
        "sampler": {"type": "DistributedSampler", "epoch": 3, "shuffle": True, "seed": 0},
        "dataset_rngs": [],
    },
    "nondeterministic_ops": None,
}
CUDA = {"version": "2.13.0+cu126", "cuda_built": True, "cuda_initialized": False}


def facts(**changes: Any) -> dict[str, Any]:
    """CLEAN with top-level sections replaced (a section given as a dict is merged into CLEAN's)."""
    out = json.loads(json.dumps(CLEAN))
    for key, value in changes.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def by_code(findings: tuple[Any, ...]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for f in findings:
        out.setdefault(f.code, []).append(f)
    return out


# -- the rules, pure -----------------------------------------------------------------------------------


def test_a_clean_process_has_no_finding() -> None:
    assert determinism_rules(CLEAN) == ()
    assert DeterminismReport((), CLEAN).ok


def test_rules_never_import_torch() -> None:
    code = (
        "import sys, json; from torchdoctor.ranks.determinism import determinism_rules; "
        f"found = determinism_rules(json.loads({json.dumps(json.dumps(facts(seed={'initial_seed': UNSEEDED})))})); "
        "print(len(found), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["1", "False"]


def test_an_unseeded_torch_is_td470_with_its_seed() -> None:
    (f,) = determinism_rules(facts(seed={"initial_seed": UNSEEDED}))
    assert (f.code, f.name, f.severity) == ("TD470", "seed-not-set", Severity.WARNING)
    assert str(UNSEEDED) in f.message and "every run" in f.message
    assert "torch.manual_seed(SEED)" in f.fix and str(UNSEEDED) in f.evidence


def test_a_declared_seed_is_checked_against_torch() -> None:
    assert determinism_rules(facts(seed={"initial_seed": 2**40, "given": 2**40})) == ()
    (f,) = determinism_rules(facts(seed={"initial_seed": 7, "given": 42}))
    assert f.code == "TD470" and "not the declared seed 42" in f.message


@pytest.mark.parametrize("value", [None, "", "random"])
def test_an_unset_hash_seed_is_an_info(value: str | None) -> None:
    (f,) = determinism_rules(facts(env={"PYTHONHASHSEED": value}))
    assert (f.code, f.severity) == ("TD470", Severity.INFO)
    assert "PYTHONHASHSEED" in f.message and "sets" in f.message
    assert DeterminismReport((f,), {}).ok  # an info is a remark


def test_deterministic_algorithms_off_is_info_on_cpu_and_a_warning_with_cuda() -> None:
    off = {"enabled": False, "warn_only": False}
    (cpu,) = determinism_rules(facts(deterministic_algorithms=off))
    (gpu,) = determinism_rules(facts(deterministic_algorithms=off, torch=CUDA))
    assert (cpu.code, cpu.severity) == ("TD472", Severity.INFO) and "CPU" in cpu.message
    assert (gpu.code, gpu.severity) == ("TD472", Severity.WARNING) and "uses CUDA" in gpu.message


def test_cudnn_benchmark_counts_only_where_cuda_can_run() -> None:
    assert determinism_rules(facts(cudnn={"benchmark": True})) == ()
    (f,) = determinism_rules(facts(cudnn={"benchmark": True}, torch=CUDA, env={"CUBLAS_WORKSPACE_CONFIG": ":16:8"}))
    assert f.code == "TD473" and "cudnn.benchmark = False" in f.fix


def test_cublas_workspace_config_is_needed_with_deterministic_algorithms_on_cuda() -> None:
    (f,) = determinism_rules(facts(torch=CUDA))
    assert f.code == "TD474" and "is unset" in f.message and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in f.fix
    (bad,) = determinism_rules(facts(torch=CUDA, env={"CUBLAS_WORKSPACE_CONFIG": ":4096:2"}))
    assert "':4096:2'" in bad.message
    for good in (":4096:8", ":16:8"):
        assert determinism_rules(facts(torch=CUDA, env={"CUBLAS_WORKSPACE_CONFIG": good})) == ()
    assert determinism_rules(facts()) == ()  # no CUDA: nothing to configure


def test_sampler_epoch_behind_the_training_epoch_is_td475() -> None:
    behind = json.loads(json.dumps(CLEAN["loader"]))
    behind["sampler"]["epoch"] = 0
    (f,) = determinism_rules(facts(loader=behind))
    assert f.code == "TD475" and "epoch 0" in f.message and "epoch 3" in f.message and "set_epoch" in f.fix
    assert determinism_rules(facts(loader=behind, epoch=0)) == ()
    assert determinism_rules(facts(loader=behind, epoch=None)) == ()  # no epoch given: nothing to compare
    behind["sampler"]["shuffle"] = False
    assert determinism_rules(facts(loader=behind)) == ()  # the order never changes anyway


def test_a_dataset_generator_is_td471_unless_a_custom_init_may_reseed_it() -> None:
    loader = json.loads(json.dumps(CLEAN["loader"]))
    loader["dataset_rngs"] = [{"where": "dataset.rng", "attr": "rng", "kind": "numpy.random.Generator"}]
    (f,) = determinism_rules(facts(loader=loader))
    assert (f.code, f.severity) == ("TD471", Severity.WARNING)
    assert "`dataset.rng`" in f.message and "2 DataLoader worker(s)" in f.message
    assert "info.dataset.rng = numpy.random.default_rng(info.seed)" in f.fix
    loader["worker_init_fn"] = {"name": "WorkerInit", "globals_only": True}
    (ours,) = determinism_rules(facts(loader=loader))
    assert ours.severity == Severity.WARNING and "reseeds only" in ours.message
    loader["worker_init_fn"] = {"name": "my_init", "globals_only": False}
    (custom,) = determinism_rules(facts(loader=loader))
    assert custom.severity == Severity.INFO and "my_init" in custom.message
    loader["num_workers"] = 0
    assert determinism_rules(facts(loader=loader)) == ()


def test_recorded_ops_are_td476_with_counts_and_where() -> None:
    ops = [{"op": "put_", "count": 3, "where": "train.py:12"}, {"op": "index_add_cuda_", "count": 1, "where": ""}]
    (f,) = determinism_rules(facts(nondeterministic_ops=ops))
    assert f.code == "TD476" and "2 operation(s)" in f.message and "put_ ×3" in f.message
    assert "put_ first at train.py:12" in f.evidence
    assert determinism_rules(facts(nondeterministic_ops=[])) == ()


def test_findings_are_worst_first_and_render_names_each_code() -> None:
    found = determinism_rules(
        facts(
            seed={"initial_seed": UNSEEDED}, env={"PYTHONHASHSEED": None}, deterministic_algorithms={"enabled": False}
        )
    )
    assert [f.severity for f in found] == sorted((f.severity for f in found), reverse=True)
    report = DeterminismReport(found, facts(seed={"initial_seed": UNSEEDED}))
    assert not report.ok
    text = report.render()
    for f in found:
        assert f"{f.code} {f.name}" in text
    assert "read: seed" in text.splitlines()[-1]
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["ok"] is False and {f["code"] for f in doc["findings"]} == {"TD470", "TD472"}


# -- the live report, in fresh processes ---------------------------------------------------------------

LIVE = textwrap.dedent("""
    import json, sys, torch
    if "--seed" in sys.argv:
        torch.manual_seed(1234)
        torch.use_deterministic_algorithms(True)
    from torchdoctor.ranks.determinism import determinism_report
    before = (torch.get_rng_state().clone(), torch.are_deterministic_algorithms_enabled())
    report = determinism_report()
    after = (torch.get_rng_state(), torch.are_deterministic_algorithms_enabled())
    unchanged = bool(torch.equal(before[0], after[0])) and before[1] == after[1]
    print(json.dumps({"report": report.to_dict(), "unchanged": unchanged}))
""")


def live(*args: str, hash_seed: str | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG")}
    if hash_seed is not None:
        env["PYTHONHASHSEED"] = hash_seed
    proc = subprocess.run(
        [sys.executable, "-c", LIVE, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_live_unseeded_process_reports_its_seed_and_the_algorithms() -> None:
    out = live()
    assert out["unchanged"], "the audit changed torch's random state or flags"
    report = out["report"]
    found = sorted((f["code"], f["severity"]) for f in report["findings"])
    assert found == [("TD470", "info"), ("TD470", "warning"), ("TD472", "info")] and report["ok"] is False
    seed = report["facts"]["seed"]["initial_seed"]
    torch_seed = next(f for f in report["findings"] if f["code"] == "TD470" and f["severity"] == "warning")
    assert seed >= 2**32 and str(seed) in torch_seed["message"]
    assert report["facts"]["env"]["PYTHONHASHSEED"] is None


def test_live_seeded_deterministic_process_is_clean() -> None:
    out = live("--seed", hash_seed="0")
    assert out["unchanged"]
    report = out["report"]
    assert report["findings"] == [] and report["ok"] is True
    assert report["facts"]["seed"]["initial_seed"] == 1234
    assert report["facts"]["deterministic_algorithms"] == {"enabled": True, "warn_only": False}


# -- real DataLoaders and samplers -------------------------------------------------------------------------


class Points(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, rng: Any = None) -> None:
        self.rng = rng
        self.x = torch.arange(16.0)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        return self.x[i]


def reseed(worker_id: int) -> None:
    import numpy as np

    info = torch.utils.data.get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


def test_distributed_sampler_without_set_epoch_is_named() -> None:
    from torch.utils.data import DataLoader, DistributedSampler

    ds = Points()
    sampler = DistributedSampler(ds, num_replicas=2, rank=0)  # no process group needed
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    codes = by_code(determinism_report(loader=loader, epoch=1, seed=int(torch.initial_seed())).findings)
    (f,) = codes["TD475"]
    assert "DistributedSampler" in f.message and "epoch 0" in f.message and "epoch 1" in f.message
    sampler.set_epoch(1)
    assert "TD475" not in by_code(determinism_report(loader=loader, epoch=1).findings)


def test_a_numpy_generator_held_by_the_dataset_is_found_through_subset() -> None:
    np = pytest.importorskip("numpy")
    from torch.utils.data import DataLoader, Subset

    import torchdoctor

    ds = Subset(Points(np.random.default_rng()), range(8))
    plain = determinism_report(loader=DataLoader(ds, num_workers=2))
    (f,) = by_code(plain.findings)["TD471"]
    assert "`dataset.rng`" in f.message and "numpy.random.Generator" in f.message
    assert plain.facts["loader"]["dataset_rngs"] == [
        {"where": "dataset.rng", "attr": "rng", "kind": "numpy.random.Generator"}
    ]
    ours = determinism_report(loader=DataLoader(ds, num_workers=2, worker_init_fn=torchdoctor.worker_init_fn))
    assert by_code(ours.findings)["TD471"][0].severity == Severity.WARNING
    chained = determinism_report(
        loader=DataLoader(ds, num_workers=2, worker_init_fn=torchdoctor.worker_init_fn.then(reseed))
    )
    assert by_code(chained.findings)["TD471"][0].severity == Severity.INFO
    assert "TD471" not in by_code(determinism_report(loader=DataLoader(ds, num_workers=0)).findings)


def test_loader_facts_name_the_generator_and_init() -> None:
    import random

    from torch.utils.data import DataLoader

    g = torch.Generator().manual_seed(7)
    report = determinism_report(loader=DataLoader(Points(random.Random()), num_workers=1, generator=g, shuffle=True))
    loader = report.facts["loader"]
    assert loader["generator_seed"] == 7 and loader["num_workers"] == 1 and loader["sampler"] is None
    assert loader["dataset_rngs"][0]["kind"] == "random.Random"


# -- torch's own warnings about non-deterministic operations -----------------------------------------------


def nondeterministic_ops() -> None:
    """Two CPU operations torch 2.x warns about in warn-only mode (put_ twice, MaxUnpool once)."""
    x = torch.zeros(10)
    for _ in range(2):
        x.put_(torch.tensor([1, 1]), torch.tensor([1.0, 2.0]))
    out, idx = torch.nn.MaxPool1d(2, return_indices=True)(torch.randn(1, 1, 8))
    torch.nn.MaxUnpool1d(2)(out, idx)


def test_recorder_catches_real_cpu_ops_and_restores_everything() -> None:
    before = (warnings.showwarning, list(warnings.filters), torch.are_deterministic_algorithms_enabled())
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        with NondeterminismRecorder() as rec:
            assert torch.is_deterministic_algorithms_warn_only_enabled()
            nondeterministic_ops()
    assert (warnings.showwarning, list(warnings.filters), torch.are_deterministic_algorithms_enabled()) == before
    assert "put_" in rec.ops and any("unpool" in op for op in rec.ops), rec.ops
    assert rec.counts["put_"] == 2
    assert rec.where["put_"].startswith(__file__)
    echoed = [str(w.message) for w in shown if "deterministic implementation" in str(w.message)]
    assert len(echoed) == len(rec.ops)  # the first of each op is shown, as Python's default filter would
    report = determinism_report(nondeterministic_warnings=rec)
    (f,) = by_code(report.findings)["TD476"]
    assert "put_ ×2" in f.message and report.facts["nondeterministic_ops"] == rec.to_list()


def test_warnings_caught_by_the_user_count_too() -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            nondeterministic_ops()
    finally:
        torch.use_deterministic_algorithms(False)
    ops = {o["op"]: o["count"] for o in ops_from(caught)}
    assert ops["put_"] == 2 and len(ops) == 2
    assert ops_from(["put_ is slow"]) == []


def test_recorder_never_weakens_strict_deterministic_mode() -> None:
    torch.use_deterministic_algorithms(True)
    try:
        with NondeterminismRecorder() as rec:
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
            with pytest.raises(RuntimeError, match="put_ does not have a deterministic implementation"):
                torch.zeros(4).put_(torch.tensor([0]), torch.tensor([1.0]))
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    assert rec.ops == set()


def test_planned_facts_for_check_name_the_environment_a_reproducible_run_needs() -> None:
    from torchdoctor.ranks.determinism import determinism_rules, planned_facts

    cuda = {f.code for f in determinism_rules(planned_facts({}, cuda_built=True))}
    assert {"TD474", "TD470"} <= cuda  # cuBLAS workspace unset with deterministic algorithms, hash seed unset
    ok = planned_facts({"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0"}, cuda_built=True)
    assert {f.code for f in determinism_rules(ok)} == set()
    assert "TD474" not in {f.code for f in determinism_rules(planned_facts({}, cuda_built=False))}


def test_check_determinism_on_the_command_line() -> None:

    from .conftest import run_cli

    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    proc = run_cli("check", "--determinism", "--no-torch", "--format", "json", env=env)
    assert proc.returncode in (0, 1), proc.stderr
    codes = {f["code"] for f in json.loads(proc.stdout)["findings"]}
    assert "TD470" in codes
    seeded = run_cli("check", "--determinism", "--no-torch", "--format", "json", env={"PYTHONHASHSEED": "0"})
    assert "TD470" not in {f["code"] for f in json.loads(seeded.stdout)["findings"]}
    plain = run_cli("check", "--no-torch", "--format", "json", env=env)
    assert "TD470" not in {f["code"] for f in json.loads(plain.stdout)["findings"]}  # only when asked
    refused = run_cli("check", "--determinism", "--facts", "x.json")
    assert refused.returncode == 2 and "--determinism" in refused.stderr and "Traceback" not in refused.stderr
