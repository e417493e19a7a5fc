"""check_in_sync on real gloo process groups (2 and 4 ranks over loopback), and its pure rule ``compare``.

Ranks are forked from the test process with torch.multiprocessing; each writes its report (or the
error it raised) as JSON, and the test reads every rank's: the same report must exist on all of them.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchdoctor.explain import shows
from torchdoctor.ranks.sync import (
    CHECKSUMS,
    STRUCTURE,
    Mismatch,
    RankDivergenceError,
    SyncReport,
    compare,
    structure_mismatch,
)

from .support.ranks import run_ranks

torch = pytest.importorskip("torch")
# imported once here, so forked ranks do not each import DDP's modules (seconds on two cores)
pytest.importorskip("torch.nn.parallel")


# -- running ranks ------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)


def _net(hidden: int = 32, extra: bool = False) -> Any:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, hidden), torch.nn.BatchNorm1d(hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4)]
    if extra:
        layers.append(torch.nn.Linear(4, 4))
    return torch.nn.Sequential(*layers)


def _same_report_everywhere(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The reports of all ranks, which must be equal but for the rank that made them."""
    for r, res in enumerate(results):
        assert res["report"]["rank"] == r
    first = {k: v for k, v in results[0]["report"].items() if k != "rank"}
    for res in results[1:]:
        assert {k: v for k, v in res["report"].items() if k != "rank"} == first
    return first


def _report(report: SyncReport) -> dict[str, Any]:
    return {"report": report.to_dict(), "text": report.render()}


# -- bodies (run in each rank) ---------------------------------------------------------------------------


def _identical(rank: int) -> dict[str, Any]:
    from torchdoctor.ranks.sync import check_in_sync

    return _report(check_in_sync(_net()))


def _perturbed_under_ddp(rank: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torchdoctor.ranks.sync import check_in_sync

    torch.manual_seed(rank)
    ddp = DDP(_net())
    if rank == 1:
        with torch.no_grad():
            ddp.module[3].weight[1, 2] += 0.25  # after wrapping: DDP broadcast only at construction
    return _report(check_in_sync(ddp))


def _perturbed_buffer(rank: int) -> dict[str, Any]:
    from torchdoctor.ranks.sync import check_in_sync

    net = _net()
    if rank == 1:
        net[1].running_mean[5] = 3.0
    return {
        "with": check_in_sync(net).to_dict(),
        "without": check_in_sync(net, buffers=False).to_dict(),
    }


def _raises(rank: int) -> dict[str, Any]:
    from torchdoctor.ranks.sync import check_in_sync

    net = _net()
    if rank == 1:
        with torch.no_grad():
            net[0].bias.mul_(-1)
    try:
        check_in_sync(net, raise_on_mismatch=True)
    except RankDivergenceError as exc:
        return {"raised": True, "message": str(exc), "code": exc.code, "report": exc.report.to_dict()}
    return {"raised": False, "report": {}}


def _other_architecture(rank: int) -> dict[str, Any]:
    from torchdoctor.ranks.sync import check_in_sync

    net = _net(hidden=48) if rank == 1 else _net(extra=(rank == 2))
    return _report(check_in_sync(net))


def _permuted(rank: int) -> dict[str, Any]:
    from torchdoctor.ranks.sync import check_in_sync

    net = _net()
    if rank == 1:
        with torch.no_grad():
            w = net[0].weight
            w[[0, 1]] = w[[1, 0]]  # the same values in another order: equal sum and sum of squares
    return _report(check_in_sync(net))


def _count_all_gathers() -> list[int]:
    """A list that grows by one at each ``all_gather`` this process makes from now on."""
    import torch.distributed as dist

    calls: list[int] = []
    real = dist.all_gather

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    dist.all_gather = counting
    return calls


def _counted(rank: int) -> dict[str, Any]:
    """The collectives check_in_sync makes: identical models, then a last-bit difference on rank 1 (within
    compare's tolerance: the checksums' bytes differ, the report is still ok), then a real one."""
    from torchdoctor.ranks.sync import check_in_sync

    calls = _count_all_gathers()
    net = _net()
    out: dict[str, Any] = {}
    out["equal"] = (check_in_sync(net).ok, len(calls))
    if rank == 1:
        with torch.no_grad():
            w = net[0].weight
            w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(2.0))
    calls.clear()
    out["last_bit"] = (check_in_sync(net).ok, len(calls))
    if rank == 1:
        with torch.no_grad():
            net[0].weight[0, 0] += 0.5
    calls.clear()
    report = check_in_sync(net)
    out["real"] = (report.ok, len(calls), [m.name for m in report.mismatches])
    return out


def _given_totals(rank: int) -> dict[str, Any]:
    """The digest taken from a fingerprint record's parameter totals (what DoctorCallback passes at a step that
    records them): equal models pass in one collective, a weight changed on rank 1 is named, and totals of another
    size (another module's) are not used."""
    from torchdoctor.ranks.fingerprint import fingerprint_module
    from torchdoctor.ranks.sync import start_check

    calls = _count_all_gathers()
    net = _net()
    out: dict[str, Any] = {}
    out["equal"] = (start_check(net, params_totals=fingerprint_module(net)["params"]).report().ok, len(calls))
    if rank == 1:
        with torch.no_grad():
            net[3].weight[0, 1] += 0.25
    calls.clear()
    report = start_check(net, params_totals=fingerprint_module(net)["params"]).report()
    out["changed"] = (report.ok, len(calls), [(m.name, list(m.ranks)) for m in report.mismatches])
    other = fingerprint_module(_net(hidden=8))["params"]  # rank 1's change is still there: seen without them
    out["other_size"] = [m.name for m in start_check(net, params_totals=other).report().mismatches]
    return out


# -- real process groups ----------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
def test_identical_models_pass_on_every_rank(world: int, tmp_path: Path) -> None:
    results = run_ranks(world, _identical, tmp_path)
    report = _same_report_everywhere(results)
    n = len(list(_net().parameters())) + len(list(_net().buffers()))
    assert report == {"ok": True, "world_size": world, "checked": n, "mismatches": [], "code": None}
    assert results[0]["text"] == f"check_in_sync: {n} tensors identical on {world} ranks"


@pytest.mark.parametrize("world", [2, 4])
def test_a_parameter_changed_on_rank_1_after_ddp_is_named_on_every_rank(world: int, tmp_path: Path) -> None:
    results = run_ranks(world, _perturbed_under_ddp, tmp_path)
    report = _same_report_everywhere(results)
    assert not report["ok"] and report["code"] == "TD469"
    assert [m["name"] for m in report["mismatches"]] == ["3.weight"]
    (m,) = report["mismatches"]
    assert m["ranks"] == [1]
    assert m["max_abs_diff"] >= 0.25 * 0.999  # the sum changed by the perturbation itself
    for res in results:  # every rank can print it
        first = res["text"].splitlines()[0]
        assert first.startswith("TD469 rank-divergence: 3.weight differs on rank(s) 1 ")


def test_a_buffer_changed_on_one_rank_is_seen_only_with_buffers(tmp_path: Path) -> None:
    results = run_ranks(2, _perturbed_buffer, tmp_path)
    for res in results:
        assert [(m["name"], m["ranks"]) for m in res["with"]["mismatches"]] == [("buffer:1.running_mean", [1])]
        assert res["without"]["ok"] and res["without"]["checked"] == len(list(_net().parameters()))


def test_raise_on_mismatch_raises_the_report_on_every_rank(tmp_path: Path) -> None:
    results = run_ranks(2, _raises, tmp_path)
    assert all(res["raised"] for res in results)
    assert results[0]["message"] == results[1]["message"]
    message = results[0]["message"]
    assert message.startswith("TD469 rank-divergence: 0.bias differs on rank(s) 1 from the reference value")
    assert results[0]["code"] == "TD469" and results[0]["report"]["mismatches"][0]["name"] == "0.bias"
    # the message is what a log shows; explain reads it back as TD469 with the tensor and ranks
    (hit,) = shows(f"torchdoctor.ranks.sync.RankDivergenceError: {message}", "TD469")
    assert hit.values["name"] == "0.bias" and hit.values["ranks"] == "1"


@pytest.mark.parametrize("world", [2, 3])
def test_different_architectures_are_reported_not_a_shape_error(world: int, tmp_path: Path) -> None:
    results = run_ranks(world, _other_architecture, tmp_path)
    report = _same_report_everywhere(results)
    assert not report["ok"] and report["checked"] == 0
    (m,) = report["mismatches"]
    assert m["name"] == STRUCTURE
    # world 2: a tie, rank 0 is the reference; world 3: rank 2 has an extra layer, so no majority either
    assert m["ranks"] == ([1] if world == 2 else [1, 2])
    assert (
        "rank 1: " in m["detail"]
        and "0.weight [48, 8] float32 where rank 0 has 0.weight [32, 8] float32" in (m["detail"])
    )
    if world == 3:
        assert "rank 2: 11 tensors where rank 0 has 9" in m["detail"]
        assert m["max_abs_diff"] == 2.0
    assert results[0]["text"].startswith("TD469 rank-divergence: <structure> differs on rank(s) ")


def test_a_permutation_of_values_is_seen(tmp_path: Path) -> None:
    results = run_ranks(2, _permuted, tmp_path)
    report = _same_report_everywhere(results)
    assert [(m["name"], m["ranks"]) for m in report["mismatches"]] == [("0.weight", [1])]


def test_the_digest_can_come_from_a_fingerprint_record_of_the_same_step(tmp_path: Path) -> None:
    for r in run_ranks(2, _given_totals, tmp_path):
        assert r["equal"] == [True, 1]  # one collective when the ranks agree
        assert r["changed"] == [False, 2, [["3.weight", [1]]]]  # the checksums gathered only on a difference
        assert r["other_size"] == ["3.weight"]


def test_outside_a_process_group_it_is_world_1_and_ok() -> None:
    from torchdoctor.ranks.sync import check_in_sync

    net = _net()
    report = check_in_sync(net, raise_on_mismatch=True)
    assert (report.ok, report.world_size, report.rank) == (True, 1, 0)
    assert report.checked == len(list(net.parameters())) + len(list(net.buffers()))
    assert check_in_sync(net, buffers=False).checked == len(list(net.parameters()))


# -- checksums (torch, one process) --------------------------------------------------------------------


def test_checksums_are_exact_for_a_small_tensor_and_change_with_position() -> None:
    from torchdoctor.ranks.sync import checksums

    a = checksums(torch.tensor([1.0, 2.0, 3.0])).tolist()
    b = checksums(torch.tensor([3.0, 2.0, 1.0])).tolist()
    assert len(a) == len(CHECKSUMS)
    assert a[:2] == b[:2] == [6.0, 14.0]  # sum and sum of squares cannot see the order
    assert a[2] != b[2]


def test_checksums_see_swapped_rows_of_a_large_tensor_and_are_deterministic() -> None:
    from torchdoctor.ranks.sync import ROW, checksums

    torch.manual_seed(3)
    x = torch.randn(3 * ROW + 17, 5)  # several chunks' worth of rows and a partial row
    y = x.clone()
    y[[0, ROW]] = y[[ROW, 0]]  # rows a whole ROW apart: the same position inside a row
    cx, cy = checksums(x).tolist(), checksums(y).tolist()
    assert cx == checksums(x.clone()).tolist()
    assert math.isclose(cx[0], cy[0], rel_tol=1e-12) and math.isclose(cx[1], cy[1], rel_tol=1e-12)
    assert not math.isclose(cx[3], cy[3], rel_tol=1e-9)
    assert checksums(torch.zeros(0)).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert checksums(torch.arange(6, dtype=torch.int64)).tolist()[:2] == [15.0, 55.0]


def test_the_stacked_checksums_are_each_tensors_own() -> None:
    """The checksums the ranks gather when their digests differ are each tensor's own (up to the order of summation),
    whatever sits beside it, in the order of the tensors, for every dtype a module holds."""
    from torchdoctor.ranks.sync import CHUNK_ROWS, ROW, _stack, checksums

    torch.manual_seed(5)
    tensors = [
        torch.randn(300, 40),
        torch.tensor([True, False, True]),  # a bool buffer
        torch.arange(7, dtype=torch.int64),  # num_batches_tracked and the like
        torch.randn(CHUNK_ROWS * ROW + 5),  # larger than a chunk: its own road
        torch.randn(17, dtype=torch.complex64),
        torch.zeros(0),
        torch.randn(2 * ROW + 3, dtype=torch.float16),
    ]
    got = _stack([(str(i), t) for i, t in enumerate(tensors)], torch.device("cpu")).view(-1, len(CHECKSUMS)).tolist()
    for row, t in zip(got, tensors):
        want = checksums(t).tolist()
        assert all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12) for a, b in zip(row, want)), (t.dtype, row, want)
    # the same tensor next to other neighbours: the same bits
    alone = _stack([("a", tensors[0])], torch.device("cpu")).tolist()
    assert alone == got[0]


# -- compare: the rule, pure ---------------------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
any_float = st.floats(width=64)


@given(row=st.lists(any_float, min_size=2, max_size=12), world=st.integers(1, 6))
def test_identical_rows_never_mismatch(row: list[float], world: int) -> None:
    names = [f"t{i}" for i in range(len(row) // 2)]
    row = row[: 2 * len(names)]
    assert compare([list(row) for _ in range(world)], names) == ()


@given(
    row=st.lists(finite.filter(lambda v: abs(v) < 1e12), min_size=4, max_size=4),
    odd=st.integers(0, 4),
    delta=st.floats(1e-3, 1e3),
)
def test_one_rank_off_of_five_is_the_one_named(row: list[float], odd: int, delta: float) -> None:
    rows = [list(row) for _ in range(5)]
    rows[odd][1] += delta + abs(row[1]) * 1e-6
    (m,) = compare(rows, ["a", "b"])
    assert m.name == "a" and m.ranks == (odd,)
    assert m.max_abs_diff == pytest.approx(abs(rows[odd][1] - row[1]))


def test_a_tie_takes_rank_0_as_the_reference() -> None:
    assert compare([[1.0], [2.0]], ["w"]) == (Mismatch("w", (1,), 1.0),)
    assert compare([[1.0], [2.0], [2.0], [1.0]], ["w"]) == (Mismatch("w", (1, 2), 1.0),)
    # a majority outvotes rank 0
    assert compare([[1.0], [2.0], [2.0]], ["w"]) == (Mismatch("w", (0,), 1.0),)


def test_compare_keeps_module_order_and_handles_nan_and_rounding() -> None:
    rows = [[0.0, 5.0, math.nan, 1.0], [1.0, 5.0, math.nan, 1.0 + 1e-14], [0.0, 5.0, 7.0, 1.0]]
    found = compare(rows, ["a", "b", "c", "d"], rel_tol=1e-10)
    assert [(m.name, m.ranks) for m in found] == [("a", (1,)), ("c", (2,))]
    assert found[1].max_abs_diff == math.inf  # NaN against a number
    assert compare(rows, ["a", "b", "c", "d"], rel_tol=0.0)[-1].name == "d"


def test_compare_rejects_rows_that_do_not_fit_the_names() -> None:
    with pytest.raises(ValueError, match="same number"):
        compare([[1.0, 2.0], [1.0]], ["a"])
    with pytest.raises(ValueError, match="split evenly"):
        compare([[1.0, 2.0, 3.0]], ["a", "b"])
    assert compare([], ["a"]) == ()


def test_structure_mismatch_names_where_the_lists_part() -> None:
    assert structure_mismatch([(3, 7), (3, 7)]) is None
    lists = [["a [2] float32", "b [3] float32"], ["a [2] float32", "b [4] float32"], ["a [2] float32"]]
    m = structure_mismatch([(2, 7), (2, 9), (1, 5)], lists, labels=[4, 5, 6])
    assert m is not None and m.name == STRUCTURE and m.ranks == (5, 6)
    assert m.max_abs_diff == 1.0
    assert "rank 5: 2 tensors where rank 4 has 2; tensor 1 is b [4] float32 where rank 4 has b [3] float32" in m.detail
    assert "rank 6: 1 tensors where rank 4 has 2; tensor 1 is nothing where rank 4 has b [3] float32" in m.detail


def test_report_json_and_render_caps_long_lists() -> None:
    many = tuple(Mismatch(f"layer.{i}.weight", (1,), 0.5) for i in range(25))
    report = SyncReport(ok=False, world_size=2, rank=0, checked=30, mismatches=many)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["code"] == "TD469" and len(data["mismatches"]) == 25
    assert data["mismatches"][0] == {"name": "layer.0.weight", "ranks": [1], "max_abs_diff": 0.5}
    lines = report.render().splitlines()
    assert len(lines) == 22 and lines[20] == "check_in_sync: 5 more tensors differ"
    assert [h.values["name"] for h in shows(report.render(), "TD469")][:2] == ["layer.0.weight", "layer.1.weight"]


def test_importing_the_module_does_not_import_torch() -> None:
    code = "import sys, torchdoctor.ranks.sync, torchdoctor.ranks.memory; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_agreeing_ranks_cost_one_collective_and_a_difference_two(tmp_path: Path) -> None:
    results = run_ranks(2, _counted, tmp_path)
    for res in results:
        assert res["equal"] == [True, 1]  # structure and a hash of the checksums, in one all_gather
        assert res["last_bit"] == [True, 2]  # the hashes differ; the checksums agree within tolerance
        assert res["real"] == [False, 2, ["0.weight"]]
