"""Run fingerprints and `torchdoctor runs diff`: real short trainings recorded with RunRecorder (CPU,
DataLoader workers, a 2-rank DDP job on gloo), the attribution of the first parting (data, start,
computation), the CLI's output and exit codes, bad input, and the pure diff on hand-made runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.ranks.diff import diff_runs
from torchdoctor.ranks.runfile import Run, RunError, load_run

from .conftest import REPO, run_cli

pytest.importorskip("torch")

STEPS = 8
PERTURB_STEP = 3
DDP_PERTURB = (1, 2)  # rank, step

#: One process records every run: seeded workers twice (a, b), a loss scaled at PERTURB_STEP (c), unseeded
#: workers twice (u1, u2), and a 2-rank DDP job twice (d1; d2 with rank 1's loss scaled at one step).
TRAIN = textwrap.dedent(f"""
    import os, random, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader, Dataset, DistributedSampler
    import torchdoctor
    from torchdoctor.facts.dist_env import free_port
    from torchdoctor.ranks.fingerprint import RunRecorder

    class Jittered(Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(1)
            self.x, self.y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
            self.rng = None
        def __len__(self):
            return 64
        def __getitem__(self, i):
            if self.rng is None:
                self.rng = random.Random()  # unseeded unless reseed() ran in this worker
            return self.x[i] + torch.tensor([self.rng.gauss(0, 0.1) for _ in range(8)]), self.y[i]

    def reseed(worker_id):
        info = torch.utils.data.get_worker_info()
        info.dataset.rng = random.Random(info.seed)

    def train(out, seed_workers, perturb_step, rank=0, perturb_rank=0, ddp=False):
        torch.manual_seed(0)
        ds = Jittered()
        init = torchdoctor.worker_init_fn.then(reseed) if seed_workers else None
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, seed=0) if ddp else None
        # the ranks are spawned, so their workers would be too (torch imported again in each): none under DDP
        workers = 0 if ddp else 2
        if seed_workers and not workers:
            ds.rng = random.Random(0)  # no worker to reseed it: seeded where it is used
        loader = DataLoader(ds, batch_size=8, shuffle=not ddp, sampler=sampler, num_workers=workers, worker_init_fn=init)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with RunRecorder(out, rank=rank, model=model) as rec:
            for step, (x, y) in enumerate(loader):
                loss = torch.nn.functional.mse_loss(net(x), y)
                if step == perturb_step and rank == perturb_rank:
                    loss = loss * (1 + 1e-3)
                loss.backward()
                opt.step()
                rec.record(step, loss=loss, model=model, batch=(x, y), lr=0.1)
                opt.zero_grad()
                if step + 1 == {STEPS}:
                    break

    def ddp_rank(rank, out, perturb, port):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=2)
        train(out, True, perturb[1], rank=rank, perturb_rank=perturb[0], ddp=True)
        dist.destroy_process_group()
        # done and recorded: end as forked children do, without interpreter teardown, where torch 2.13's gloo
        # now and then aborts a finished rank ("terminate called without an active exception", see
        # tests/support/gloo.py); spawn's parent would report that as the rank failing
        sys.stdout.flush()
        os._exit(0)

    if __name__ == "__main__":
        root = sys.argv[1]
        train(os.path.join(root, "a"), True, -1)
        train(os.path.join(root, "b"), True, -1)
        train(os.path.join(root, "c"), True, {PERTURB_STEP})
        train(os.path.join(root, "u1"), False, -1)
        train(os.path.join(root, "u2"), False, -1)
        for name, perturb in (("d1", (-1, -1)), ("d2", {DDP_PERTURB})):
            mp.start_processes(ddp_rank, args=(os.path.join(root, name), perturb, free_port()), nprocs=2,
                               start_method="spawn")
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    script = root / "train.py"
    script.write_text(TRAIN, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


# -- real runs -----------------------------------------------------------------------------------------


def test_identical_seeds_give_no_difference(runs: Path) -> None:
    diff = diff_runs(load_run(runs / "a"), load_run(runs / "b"))
    assert not diff.parted and diff.first is None and diff.finding() is None
    assert diff.compared == STEPS and [r.rank for r in diff.ranks] == [0]
    a = load_run(runs / "a")
    assert sorted(a.steps[0]) == list(range(STEPS)) and "init" in a.meta[0]
    assert {"batch", "loss", "params", "grads", "extra"} <= set(a.steps[0][0])


def test_unseeded_workers_part_at_the_first_step_on_the_data(runs: Path) -> None:
    diff = diff_runs(load_run(runs / "u1"), load_run(runs / "u2"))
    first = diff.first
    assert first is not None and (first.step, first.rank, first.cause) == (0, 0, "data")
    assert first.differences[0].field == "batch" and first.differences[0].detail == "batch[0]"
    assert first.differences[0].a != first.differences[0].b
    finding = diff.finding()
    assert finding is not None and finding.code == "TD477" and "worker_init_fn" in finding.fix
    assert "step 0 on rank 0: the data (the batch)" in finding.message


def test_a_perturbed_loss_parts_at_its_step_on_the_computation(runs: Path) -> None:
    diff = diff_runs(load_run(runs / "a"), load_run(runs / "c"))
    first = diff.first
    assert first is not None and (first.step, first.cause) == (PERTURB_STEP, "computation")
    assert [d.field for d in first.differences][:1] == ["loss"]
    assert "grads" in [d.field for d in first.differences]  # the scaled loss scaled the gradients
    a, b = first.differences[0].a, first.differences[0].b
    assert b == pytest.approx(a * (1 + 1e-3), rel=1e-6)
    assert first.compared == PERTURB_STEP + 1
    assert "use_deterministic_algorithms" in (diff.finding() or pytest.fail("no finding")).fix


def test_the_perturbed_rank_of_a_ddp_job_is_named(runs: Path) -> None:
    """Rank 1's loss is scaled at step 2; the all-reduce carries its gradients to rank 0 in the same step.
    The diff names rank 1 (its loss differs; rank 0's differs only from its gradients on)."""
    a, b = load_run(runs / "d1"), load_run(runs / "d2")
    assert a.ranks == [0, 1] and a.meta[0]["world_size"] == 2
    assert diff_runs(a, load_run(runs / "d1")).parted is False
    diff = diff_runs(a, b)
    by_rank = {r.rank: r for r in diff.ranks}
    assert (by_rank[1].step, by_rank[1].cause, by_rank[1].differences[0].field) == (2, "computation", "loss")
    assert (by_rank[0].step, by_rank[0].differences[0].field) == (2, "grads")
    assert diff.first is by_rank[1]


# -- the command line --------------------------------------------------------------------------------------


def test_cli_agree_exits_0(runs: Path) -> None:
    proc = run_cli("runs", "diff", str(runs / "a"), str(runs / "b"))
    assert proc.returncode == 0, proc.stderr
    assert "agree" in proc.stdout and f"no difference in {STEPS} step(s)" in proc.stdout


def test_cli_parted_exits_1_with_td477_in_text_json_and_markdown(runs: Path) -> None:
    text = run_cli("runs", "diff", str(runs / "u1"), str(runs / "u2"))
    assert text.returncode == 1, text.stderr
    assert "the runs part at step 0 on rank 0: data" in text.stdout and "TD477" in text.stdout
    js = run_cli("runs", "diff", str(runs / "a"), str(runs / "c"), "--format", "json")
    assert js.returncode == 1
    doc = json.loads(js.stdout)
    assert {"schema_version", "a", "b", "parted", "first", "ranks", "steps_compared", "finding", "notes"} <= set(doc)
    assert doc["parted"] is True and doc["first"]["step"] == PERTURB_STEP and doc["first"]["cause"] == "computation"
    assert doc["first"]["differences"][0]["field"] == "loss"
    assert {"field", "a", "b", "detail"} == set(doc["first"]["differences"][0])
    assert doc["finding"]["code"] == "TD477" and doc["finding"]["family"] == "rank-divergence"
    md = run_cli("runs", "diff", str(runs / "a"), str(runs / "c"), "--format", "markdown")
    assert md.returncode == 1 and "| rank | steps compared |" in md.stdout and "**TD477**" in md.stdout


def test_cli_tolerance_hides_the_perturbation(runs: Path) -> None:
    proc = run_cli("runs", "diff", str(runs / "a"), str(runs / "c"), "--rtol", "0.01", "--format", "json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["parted"] is False


def test_cli_show_lists_each_rank(runs: Path) -> None:
    proc = run_cli("runs", "show", str(runs / "d1"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert all(r["steps"] == 4 and r["first_step"] == 0 and r["initial_params"] for r in doc["ranks"])
    text = run_cli("runs", "show", str(runs / "a"))
    assert text.returncode == 0 and "first loss" in text.stdout and f"{STEPS}" in text.stdout


def test_help_teaches_with_an_example() -> None:
    proc = run_cli("runs", "diff", "--help")
    assert proc.returncode == 0
    assert "torchdoctor runs diff runs/a runs/b" in proc.stdout and "Exit status" in proc.stdout
    assert "RunRecorder" in run_cli("runs", "--help").stdout


def bad_input(tmp_path: Path, *paths: str) -> str:
    proc = run_cli("runs", "diff", *paths)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchdoctor: error: "), proc.stderr
    return lines[0]


def test_bad_inputs_exit_2_with_one_clear_line(runs: Path, tmp_path: Path) -> None:
    good = str(runs / "a")
    assert "no such file or directory" in bad_input(tmp_path, good, str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert "holds no fingerprints-rank*.jsonl" in bad_input(tmp_path, str(tmp_path / "empty"), good)
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "fingerprints-rank0.jsonl").write_bytes(b"\x00\x01 not json at all\n{{{\n")
    line = bad_input(tmp_path, good, str(garbage))
    assert "fingerprints-rank0.jsonl:1: not a RunRecorder fingerprint line" in line
    headless = tmp_path / "headless"
    headless.mkdir()
    (headless / "fingerprints-rank0.jsonl").write_text('{"kind": "step", "step": 0, "loss": 1.0}\n')
    assert "does not start with RunRecorder's header line" in bad_input(tmp_path, good, str(headless))
    other = write_run(tmp_path / "other", {**HEADER, "rank": 3}, {"kind": "step", "step": 0, "loss": 1.0})
    line = bad_input(tmp_path, good, str(other))
    assert "no step in common on any rank" in line and "rank 3 steps 0-0" in line


def test_the_docs_example_records_runs_that_agree(tmp_path: Path) -> None:
    """docs/runs.md's recording example runs as written, twice, and `runs diff` says what the docs show."""
    doc = (REPO / "docs" / "runs.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Run-to-run differences: runs diff") :]
    script = next(b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "RunRecorder(sys.argv[1]" in b)
    (tmp_path / "train.py").write_text(script, encoding="utf-8")
    for name in ("a", "b"):
        proc = subprocess.run(
            [sys.executable, "train.py", f"runs/{name}"], cwd=tmp_path, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
    shown = re.search(r"\$ torchdoctor runs diff runs/a runs/b\n(.*)\n", section)
    assert shown is not None
    proc = run_cli("runs", "diff", "runs/a", "runs/b", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.splitlines()[0].strip() == shown.group(1).strip()


# -- reading files -----------------------------------------------------------------------------------------


def write_run(path: Path, *lines: dict[str, Any], tail: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps(x) + "\n" for x in lines) + tail
    (path / "fingerprints-rank0.jsonl").write_text(body, encoding="utf-8")
    return path


HEADER = {"kind": "header", "schema": 1, "rank": 0, "torch": "2.13.0", "seed": 0}


def test_a_last_line_cut_short_is_left_out_with_a_note(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "r", HEADER, {"kind": "step", "step": 0, "loss": 1.0}, tail='{"kind": "st'))
    assert sorted(run.steps[0]) == [0] and "cut short" in run.notes[0]


def test_a_resumed_run_replaces_the_steps_from_where_it_restarted(tmp_path: Path) -> None:
    step = [{"kind": "step", "step": i, "loss": 1.0 - i / 10} for i in range(4)]
    resumed = load_run(write_run(tmp_path / "r", HEADER, *step, {**HEADER, "seed": 5}, {**step[2], "loss": 0.7}))
    assert {s: r["loss"] for s, r in resumed.steps[0].items()} == {0: 1.0, 1: 0.9, 2: 0.7}
    assert resumed.meta[0]["seed"] == 0 and "2 earlier record(s)" in resumed.notes[0]
    again = load_run(write_run(tmp_path / "a", HEADER, *step, {**HEADER, "seed": 5}, step[0]))
    assert sorted(again.steps[0]) == [0] and again.meta[0]["seed"] == 5  # the same directory, recorded again


def test_a_wrong_schema_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="schema 99"):
        load_run(write_run(tmp_path / "r", {**HEADER, "schema": 99}))


def test_per_tensor_checksums_name_the_tensor_that_differs(tmp_path: Path) -> None:
    import torch

    from torchdoctor.ranks.fingerprint import RunRecorder, fingerprint_batch, fingerprint_tensor

    for name, bump in (("a", 0.0), ("b", 1e-6)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
        with RunRecorder(tmp_path / name, rank=0, model=model, per_tensor=True, every=2) as rec:
            for step in range(4):
                with torch.no_grad():
                    model[1].bias.add_(bump)
                rec.record(step, model=model, batch=torch.ones(2, 4))
    a, b = load_run(tmp_path / "a"), load_run(tmp_path / "b")
    assert sorted(a.steps[0]) == [0, 2]  # every=2
    first = diff_runs(a, b).first
    assert first is not None and first.step == 0 and first.cause == "computation"  # same init, same batch
    assert first.differences[0].detail == "first differing tensor(s): 1.bias"
    x = torch.arange(6.0)
    assert fingerprint_tensor(x) != fingerprint_tensor(x.flip(0)) and fingerprint_tensor(x) == fingerprint_tensor(x)
    assert fingerprint_batch({"x": x, "name": "a"}) != fingerprint_batch({"x": x, "name": "b"})


def test_the_numpy_batch_path_agrees_with_torch_and_still_sees_order() -> None:
    import math

    import torch

    from torchdoctor.ranks.fingerprint import _cpu_dot, fingerprint_batch

    torch.manual_seed(0)
    x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))
    fast = fingerprint_batch((x, y))
    assert isinstance(fast, str) and fast.startswith("[0]=") and ";[1]=" in fast
    values = [float(part.partition("=")[2]) for part in fast.split(";")]
    for value, t in zip(values, (x, y)):
        assert math.isclose(value, _cpu_dot(t), rel_tol=1e-12, abs_tol=1e-9)  # the torch path, to rounding
    assert fingerprint_batch((x.flip(0), y)) != fast and fingerprint_batch((x, y)) == fast
    half = fingerprint_batch((x.bfloat16(), y))  # numpy has no bfloat16: torch's path, same format
    assert isinstance(half, str) and half.count("=") == 2


def test_a_record_with_the_model_carries_the_gradient_norm_in_its_sums(tmp_path: Path) -> None:
    import json
    import math

    import torch

    from torchdoctor.ranks.fingerprint import RunRecorder, grad_norm

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model(torch.randn(4, 8)).sum().backward()
    with RunRecorder(tmp_path, rank=0) as rec:
        rec.record(0, loss=1.0, model=model)
        rec.record(1, loss=1.0)
    steps = [json.loads(line) for line in (tmp_path / "fingerprints-rank0.jsonl").read_text().splitlines()][1:]
    norm = grad_norm(model)
    assert norm is not None
    assert math.isclose(math.sqrt(steps[0]["grads"]["sumsq"]), norm, rel_tol=1e-6)  # float32 norms vs float64 sums
    assert "grads" not in steps[1]


def _lines(path: Path) -> list[dict[str, Any]]:
    """The step records of one file, ``steps`` lines given back as records (header left out); none while RankFile
    still holds the header."""
    from torchdoctor.ranks.runfile import read_records

    return read_records(path)[1:] if path.read_text().strip() else []


def _batches() -> list[Any]:
    """Batches of every kind a loader yields, each a fresh object (as a loader's are)."""
    import torch

    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(4, 3, generator=g), torch.randint(0, 9, (4,), generator=g)),
        [torch.randn(4, 3, generator=g), torch.randint(0, 9, (4,), generator=g)],
        torch.randn(5, generator=g),
        {"x": torch.randn(2, 2, generator=g), "name": "abc", "n": 3},
        (torch.randn(3, generator=g).bfloat16(), torch.randn(3, generator=g)),
        (torch.randn(2, generator=g, dtype=torch.complex64), torch.empty(0)),
        (torch.randn(4, 3, generator=g), torch.randint(0, 9, (4,), generator=g)),
    ]


def test_deferred_records_equal_the_immediate_ones(tmp_path: Path) -> None:
    import math

    import torch

    from torchdoctor.ranks.fingerprint import RunRecorder

    def record(out: Path, flush_every: int) -> list[dict[str, Any]]:
        with RunRecorder(out, rank=0, flush_every=flush_every) as rec:
            for step, batch in enumerate(_batches()):
                loss = torch.tensor(0.5 + step, dtype=torch.float16 if step == 4 else torch.float32)
                rec.record(step, loss=loss * 1.5, batch=batch, grad_norm=torch.tensor([2.0 * step]), lr=0.1)
        return _lines(out / "fingerprints-rank0.jsonl")

    now, later = record(tmp_path / "now", 1), record(tmp_path / "later", 3)
    assert len(now) == len(later) == 7
    for a, b in zip(now, later):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] and a["extra"] == b["extra"]
        assert a["t"] <= b["t"]
        if isinstance(a["batch"], float):
            assert math.isclose(a["batch"], b["batch"], rel_tol=1e-12)
            continue
        parts_a, parts_b = (dict(p.split("=", 1) for p in x["batch"].split(";")) for x in (a, b))
        assert parts_a.keys() == parts_b.keys(), (a["batch"], b["batch"])
        for key, va in parts_a.items():
            vb = parts_b[key]
            if va.startswith("#") or va.startswith("<"):
                assert va == vb
            else:  # numpy's dot vs a matrix-vector product: equal to rounding
                assert math.isclose(float(va), float(vb), rel_tol=1e-12, abs_tol=1e-12), (key, va, vb)
    assert load_run(tmp_path / "later").steps[0].keys() == set(range(7))


def test_the_quick_road_gives_the_records_of_the_long_one(tmp_path: Path) -> None:
    """A loss tensor and a tuple/list of CPU tensors take the quick road (deferred.quick_capture); mixed with steps
    that carry a model (the long road), varying shapes, bfloat16, complex and empty leaves and a NaN loss, the
    records equal those written at once, lines in step order, each line what the JSON encoder writes."""
    import json
    import math

    import torch

    from torchdoctor.ranks import deferred
    from torchdoctor.ranks.fingerprint import RunRecorder

    g = torch.Generator().manual_seed(3)
    model = torch.nn.Linear(3, 2)
    batches: list[Any] = [(torch.randn(4, 3, generator=g), torch.randint(0, 9, (4,), generator=g)) for _ in range(5)]
    batches += [[torch.randn(2, 3, generator=g), torch.randint(0, 9, (2,), generator=g)]]  # a shorter last batch
    batches += [(torch.randn(3, generator=g).bfloat16(),), (torch.randn(2, generator=g, dtype=torch.complex64),)]
    batches += [(torch.empty(0), torch.randn(2, generator=g))]
    losses = [torch.tensor(0.25 * i) for i in range(len(batches))]
    losses[7] = torch.tensor(float("nan"))
    assert all(deferred.quick_capture(0, loss, b) is not None for loss, b in zip(losses, batches))

    def record(out: Path, flush_every: int) -> tuple[list[str], list[dict[str, Any]]]:
        with RunRecorder(out, rank=0, flush_every=flush_every) as rec:
            for step, (loss, batch) in enumerate(zip(losses, batches)):
                rec.record(step, loss=loss, batch=batch, model=model if step % 3 == 0 else None)
        raw = (out / "fingerprints-rank0.jsonl").read_text().splitlines()[1:]
        return raw, _lines(out / "fingerprints-rank0.jsonl")

    (_, now), (raw, later) = record(tmp_path / "now", 1), record(tmp_path / "later", 4)
    assert [r["step"] for r in later] == list(range(len(batches)))
    encode = json.JSONEncoder(default=str).encode
    for line in raw:
        assert line == encode(json.loads(line))
    kinds = [json.loads(line)["kind"] for line in raw]
    assert "steps" in kinds and len(raw) < len(batches)  # plain steps share a line
    for a, b in zip(now, later):
        assert a.keys() == b.keys(), (a, b)
        assert (math.isnan(a["loss"]) and math.isnan(b["loss"])) or a["loss"] == b["loss"]
        assert a.get("params") == b.get("params")
        parts_a, parts_b = (dict(p.split("=", 1) for p in x["batch"].split(";")) for x in (a, b))
        assert parts_a.keys() == parts_b.keys()
        for key, va in parts_a.items():
            assert math.isclose(float(va), float(parts_b[key]), rel_tol=1e-12, abs_tol=1e-12), (key, va)


def test_a_steps_line_is_read_back_bit_for_bit_and_a_damaged_one_is_named(tmp_path: Path) -> None:
    """A flush of plain steps is one ``steps`` line whose numbers come back exactly (hexadecimal float64, NaN included)
    as the records flush_every=1 writes; a damaged one is a RunError naming the file and line, not a traceback."""
    import math
    import struct

    import torch

    from torchdoctor.ranks import deferred
    from torchdoctor.ranks.fingerprint import RunRecorder

    g = torch.Generator().manual_seed(11)
    batches = [(torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(6)]
    losses = [torch.tensor(v) for v in (0.1, 1 / 3, float("nan"), 1e-300, -2.5, 7.0)]

    def record(out: Path, flush_every: int) -> list[dict[str, Any]]:
        with RunRecorder(out, rank=0, flush_every=flush_every) as rec:
            for step, (loss, batch) in enumerate(zip(losses, batches)):
                rec.record(step, loss=loss, batch=batch)
        return _lines(out / "fingerprints-rank0.jsonl")

    now, later = record(tmp_path / "now", 1), record(tmp_path / "later", 6)
    raw = (tmp_path / "later" / "fingerprints-rank0.jsonl").read_text().splitlines()
    assert len(raw) == 2 and json.loads(raw[1])["kind"] == "steps"
    for a, b in zip(now, later, strict=True):
        assert a["step"] == b["step"] and abs(a["t"] - b["t"]) < 1
        assert (math.isnan(a["loss"]) and math.isnan(b["loss"])) or a["loss"] == b["loss"]
        parts_a, parts_b = (dict(p.split("=", 1) for p in x["batch"].split(";")) for x in (a, b))
        assert parts_a.keys() == parts_b.keys() == {"[0]", "[1]"}
        for key, va in parts_a.items():  # one dot per step vs one product per flush: equal to rounding
            assert math.isclose(float(va), float(parts_b[key]), rel_tol=1e-12, abs_tol=1e-12), (key, va)
    block = json.loads(raw[1])
    again = deferred.block_records(block)
    assert struct.pack("<6d", *(r["loss"] for r in again)).hex() == block["loss"]  # bit for bit, NaN included
    assert [float(r["batch"].split(";")[1][4:]) for r in again] == list(
        struct.unpack("<6d", bytes.fromhex(block["batch"][1]))
    )
    damaged = json.loads(raw[1])
    damaged["loss"] = damaged["loss"][:-2]
    (tmp_path / "later" / "fingerprints-rank0.jsonl").write_text(raw[0] + "\n" + json.dumps(damaged) + "\n")
    with pytest.raises(RunError, match=r"fingerprints-rank0\.jsonl:2: not a RunRecorder fingerprint line"):
        load_run(tmp_path / "later")


def test_the_quick_road_marks_a_batch_changed_in_place_unknown(tmp_path: Path) -> None:
    import torch

    from torchdoctor.ranks.fingerprint import RunRecorder

    buffer, labels = torch.zeros(4), torch.arange(4)
    with RunRecorder(tmp_path, rank=0, flush_every=8) as rec:
        for step in range(3):
            buffer.fill_(float(step))
            rec.record(step, loss=torch.tensor(float(step)), batch=[buffer, labels])
    steps = _lines(tmp_path / "fingerprints-rank0.jsonl")
    assert ["batch" in r for r in steps] == [False, False, True]
    assert all("changed in place" in r["batch_unknown"] for r in steps[:2])
    assert [r["loss"] for r in steps] == [0.0, 1.0, 2.0]


def test_deferred_records_are_written_at_each_flush_and_at_close(tmp_path: Path) -> None:
    import torch

    from torchdoctor.ranks.fingerprint import RunRecorder

    path = tmp_path / "fingerprints-rank0.jsonl"
    rec = RunRecorder(tmp_path, rank=0, flush_every=4)
    for step in range(6):
        rec.record(step, loss=torch.tensor(float(step)), batch=torch.arange(3.0))
        assert len(_lines(path)) == (4 if step >= 3 else 0)
    rec.flush()
    assert [r["step"] for r in _lines(path)] == list(range(6))
    rec.record(6, loss=torch.tensor(6.0))
    rec.close()
    assert [r["loss"] for r in _lines(path)] == [float(s) for s in range(7)]


def test_a_batch_changed_in_place_before_the_flush_is_unknown_not_wrong(tmp_path: Path) -> None:
    import torch

    from torchdoctor.ranks.fingerprint import RunRecorder

    buffer = torch.zeros(4)  # a loader that refills one buffer
    with RunRecorder(tmp_path, rank=0, flush_every=8) as rec:
        for step in range(3):
            buffer.fill_(float(step))
            rec.record(step, loss=float(step), batch=(buffer,))
    steps = _lines(tmp_path / "fingerprints-rank0.jsonl")
    assert ["batch" in r for r in steps] == [False, False, True]
    assert all("changed in place" in r["batch_unknown"] for r in steps[:2])


def test_large_batches_are_not_held_past_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import torchdoctor.ranks.fingerprint as fingerprint

    monkeypatch.setattr(fingerprint, "HELD_LIMIT", 1000)
    path = tmp_path / "fingerprints-rank0.jsonl"
    with fingerprint.RunRecorder(tmp_path, rank=0, flush_every=100) as rec:
        rec.record(0, batch=torch.zeros(100))  # 400 bytes: held
        assert _lines(path) == []
        rec.record(1, batch=torch.zeros(200))  # 1200 bytes held: flushed at once
        assert [r["step"] for r in _lines(path)] == [0, 1]


def test_flush_every_must_be_a_positive_count(tmp_path: Path) -> None:
    from torchdoctor.ranks.fingerprint import RunRecorder

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="flush_every must be a positive"):
            RunRecorder(tmp_path, rank=0, flush_every=bad)  # type: ignore[arg-type]


# -- the pure diff on hand-made runs ------------------------------------------------------------------------


def made(steps: dict[int, dict[int, dict[str, Any]]], init: dict[int, Any] | None = None, name: str = "x") -> Run:
    meta = {rank: {"kind": "header", "rank": rank, **({"init": init[rank]} if init else {})} for rank in steps}
    return Run(name, meta, {r: {s: {"kind": "step", "step": s, **v} for s, v in st.items()} for r, st in steps.items()})


def losses(*values: float, batch: float | None = 1.0) -> dict[int, dict[str, Any]]:
    return {i: {"loss": v, **({"batch": batch} if batch is not None else {})} for i, v in enumerate(values)}


def test_reading_and_comparing_runs_never_imports_torch(runs: Path) -> None:
    code = (
        "import sys; from torchdoctor.ranks.fingerprint import load_run; from torchdoctor.ranks.diff import diff_runs; "
        f"d = diff_runs(load_run({str(runs / 'a')!r}), load_run({str(runs / 'c')!r})); "
        "print(d.first.step, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == [str(PERTURB_STEP), "False"]


def test_rtol_and_atol_decide_what_counts_as_equal() -> None:
    a, b = made({0: losses(1.0, 2.0)}), made({0: losses(1.0, 2.0 + 2e-7)})
    assert diff_runs(a, b).first.step == 1  # type: ignore[union-attr]  # bit for bit by default
    assert not diff_runs(a, b, rtol=1e-6).parted
    assert diff_runs(a, b, rtol=1e-8).parted
    assert not diff_runs(a, b, atol=1e-6).parted
    nan = made({0: losses(float("nan"))})
    assert not diff_runs(nan, made({0: losses(float("nan"))})).parted
    with pytest.raises(ValueError, match="rtol and atol must be >= 0"):
        diff_runs(a, b, rtol=-1)


def test_attribution_start_data_computation_unknown() -> None:
    same = {0: {"n": 3, "sum": 1.0, "sumsq": 1.0, "wsum": 1.0}}
    other = {0: {"n": 3, "sum": 1.5, "sumsq": 1.0, "wsum": 1.0}}
    base = {0: losses(1.0, 2.0)}
    assert diff_runs(made(base, same), made(base, other)).first.cause == "start"  # type: ignore[union-attr]
    first_step = {0: losses(1.5, 2.0)}
    # no initial parameters recorded: a first step that differs on the same batch reads as the start
    assert diff_runs(made(base), made(first_step)).first.cause == "start"  # type: ignore[union-attr]
    assert diff_runs(made(base, same), made(first_step, same)).first.cause == "computation"  # type: ignore[union-attr]
    later = {0: losses(1.0, 2.5)}
    assert diff_runs(made(base), made(later)).first.cause == "computation"  # type: ignore[union-attr]
    data = {0: {0: {"loss": 1.0, "batch": 1.0}, 1: {"loss": 2.5, "batch": 7.0}}}
    d = diff_runs(made(base), made(data)).first
    assert d is not None and (d.step, d.cause, [x.field for x in d.differences]) == (1, "data", ["batch", "loss"])
    blind = diff_runs(made({0: losses(1.0, 2.0, batch=None)}), made({0: losses(1.0, 3.0, batch=None)})).first
    assert blind is not None and blind.cause == "unknown"


def test_structured_batches_name_the_leaf_that_differs() -> None:
    a = made({0: {0: {"batch": "[0]=1.0;[1]=#ab12"}}})
    b = made({0: {0: {"batch": "[0]=1.0;[1]=#cd34"}}})
    d = diff_runs(a, b).first
    assert d is not None and d.differences[0].detail == "batch[1]" and d.differences[0].a == "#ab12"
    assert not diff_runs(a, made({0: {0: {"batch": "[0]=1.0000001;[1]=#ab12"}}}), rtol=1e-6).parted


def test_the_earliest_parting_wins_by_step_then_field_then_rank() -> None:
    a = made({0: losses(1.0, 2.0, 3.0), 1: losses(1.0, 2.0, 3.0)})
    b = made({0: losses(1.0, 2.0, 3.5), 1: losses(1.0, 2.5, 3.5)})
    assert diff_runs(a, b).first.rank == 1  # type: ignore[union-attr]
    g = {"n": 1, "sum": 1.0, "sumsq": 1.0, "wsum": 1.0}
    g2 = {**g, "sum": 2.0}
    a = made({0: {0: {"loss": 1.0, "batch": 1.0, "grads": g}}, 1: {0: {"loss": 1.0, "batch": 1.0, "grads": g}}})
    b = made({0: {0: {"loss": 1.0, "batch": 1.0, "grads": g2}}, 1: {0: {"loss": 1.5, "batch": 1.0, "grads": g2}}})
    diff = diff_runs(a, b)
    first = diff.first
    assert first is not None and first.rank == 1 and first.differences[0].field == "loss"
    # rank 0's loss is the same: its gradients differ from the all-reduce, not from its own start
    assert [r.cause for r in diff.ranks] == ["computation", "start"]


def test_runs_of_other_lengths_and_ranks_are_compared_where_both_recorded() -> None:
    a = made({0: losses(1.0, 2.0, 3.0), 1: losses(1.0)})
    b = made({0: losses(1.0, 2.0)})
    diff = diff_runs(a, b)
    assert not diff.parted and diff.compared == 2
    assert any("rank(s) 1 recorded in A only" in n for n in diff.notes)
    assert any("1 step(s) only in A" in n for n in diff.notes)
    nothing = diff_runs(made({0: losses(1.0)}), made({1: losses(1.0)}))
    assert not nothing.parted and any("no rank in common" in n for n in nothing.notes)


def test_batch_fingerprint_fast_path_gives_the_generic_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from torchdoctor.ranks import fingerprint as fp

    batch = (torch.randn(8, 3), {"y": torch.randn(8, 1), "ids": torch.arange(8)})
    fast = fp.fingerprint_batch(batch)
    monkeypatch.setattr(fp, "_plain_cpu", lambda t: False)  # force the generic path
    generic = fp.fingerprint_batch(batch)
    assert isinstance(fast, str) and isinstance(generic, str)
    # numpy sums in another order than torch: the same values to rounding (a batch's structure decides the
    # path, so two runs of one job always take the same one)
    for a, b in zip(fast.split(";"), generic.split(";")):
        assert a.partition("=")[0] == b.partition("=")[0]
        assert float(a.partition("=")[2]) == pytest.approx(float(b.partition("=")[2]), rel=1e-12, abs=1e-9)
    assert fast.startswith("[0]=") and ";[1].y=" in fast and ";[1].ids=" in fast


def test_the_quick_road_keeps_no_autograd_graph() -> None:
    """A loss that still requires grad is kept detached (its graph is not held until the flush); one that is already
    detached (Lightning hands its hooks such a copy) is kept as it is, without a second copy."""
    import torch

    from torchdoctor.ranks import deferred

    w = torch.ones(3, requires_grad=True)
    batch = (torch.randn(2, 3),)
    live = (w * 2).sum()
    kept = deferred.quick_capture(0, live, batch)
    assert kept is not None and not kept[2].requires_grad and kept[2].grad_fn is None
    assert kept[2].data_ptr() == live.data_ptr()  # a view, not a copy
    plain = live.detach().clone()
    kept = deferred.quick_capture(1, plain, batch)
    assert kept is not None and kept[2] is plain
