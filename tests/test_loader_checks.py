"""Pure parts of `torchdoctor loader`: the loader codes judged on facts dicts (positive and near-miss
cases), the start-method rule, the tuner's search on synthetic throughput curves, TARGET parsing
and the culprit finder on real objects (in this process; nothing is pickled to a worker)."""

from __future__ import annotations

import copy
import functools
import random
import threading
from typing import Any

import pytest

from torchdoctor.facts import Facts
from torchdoctor.model import Severity
from torchdoctor.probes.judge import judge, loader_codes
from torchdoctor.probes.static import default_start_method
from torchdoctor.probes.tune import doubling, search
from torchdoctor.registry import all_codes, lookup

MiB = 1024 * 1024

STATIC: dict[str, Any] = {
    "start_method": {"method": "spawn", "source": "--parent-start-method spawn"},
    "sharing_strategy": {"strategy": "file_system", "source": "set_sharing_strategy() in the target's code"},
    "storages": {
        "count": 70000,
        "bytes": 26880000,
        "nonempty": 70000,
        "tensors": 70000,
        "pickle_bytes": 350317,
        "seconds": 0.25,
        "partial": False,
    },
    "pickling": {"pickled_to_workers": True, "ok": True},
    "owner": {
        "map_count": 349,
        "open_fds": 4,
        "nofile_soft": 20000,
        "nofile_hard": 20000,
        "python_threads": 1,
        "os_threads": 2,
        "cuda_initialized": False,
    },
    "blockers": [],
}


def facts(
    loader: dict[str, Any],
    max_map_count: int | None = 65530,
    shm_free: int | None = 8 * 1024 * MiB,
    cores: int | None = 2,
) -> Facts:
    return Facts.from_dict(
        {
            "meta": {"schema_version": 1},
            "limits": {"sysctl": {"vm": {"max_map_count": max_map_count}}},
            "shm": {"free_bytes": shm_free, "size_bytes": shm_free},
            "cpu": {"usable_cores": cores},
            "loader": loader,
        }
    )


def static(**changes: Any) -> dict[str, Any]:
    st = copy.deepcopy(STATIC)
    for path, value in changes.items():
        node = st
        *parents, last = path.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    return {"static": st, "outcome": {"status": "ok"}}


def codes(f: Facts) -> dict[str, Any]:
    return {x.code: x for x in judge(f)}


def test_loader_codes_are_registered_in_their_range() -> None:
    mine = [c for c in all_codes() if c.area == "loader" and c.check is not None]
    assert {c.code for c in mine} == {c.code for c in loader_codes()}
    assert all(501 <= int(c.code[2:]) <= 549 for c in mine)
    assert {"TD511", "TD512", "TD520", "TD530", "TD531", "TD532"} <= {c.code for c in mine}
    assert lookup("TD511").family == "shm-map-count" and lookup("TD512").family == "fd-exhausted"


def test_checks_yield_nothing_without_a_loader_section() -> None:
    plain = Facts.from_dict({"meta": {"schema_version": 1}, "limits": {"sysctl": {"vm": {"max_map_count": 65530}}}})
    assert judge(plain) == []


# -- TD511 map count -------------------------------------------------------------------------


def test_seed_case_is_an_error_with_count_and_limit() -> None:
    f = codes(facts(static()))["TD511"]
    assert f.severity is Severity.ERROR and f.family == "shm-map-count"
    assert "70,000" in f.message and "65530" in f.message and "70,349" in f.message
    assert f.fix.splitlines()[1].startswith('1. `DataLoader(..., multiprocessing_context="fork")`')
    assert "sysctl -w vm.max_map_count=262144" in f.fix


def test_map_count_near_miss_fits_and_warns_past_half() -> None:
    fits = static(storages__count=10000)
    assert "TD511" not in codes(facts(fits))
    half = codes(facts(static(storages__count=40000)))["TD511"]
    assert half.severity is Severity.WARNING


def test_fork_is_never_a_map_count_problem() -> None:
    assert "TD511" not in codes(facts(static(start_method={"method": "fork", "source": "x"})))


def test_fork_fix_ranked_lower_when_the_owner_has_threads() -> None:
    f = codes(facts(static(owner__python_threads=3)))["TD511"]
    first = f.fix.splitlines()[1]
    assert first.startswith("1. Hold the data in a few large storages")
    assert "3 Python thread(s)" in f.fix


# -- TD512 descriptors -----------------------------------------------------------------------


def test_file_descriptor_strategy_against_a_low_nofile() -> None:
    st = static(
        sharing_strategy={"strategy": "file_descriptor", "source": "torch's default"},
        storages__count=2000,
        storages__nonempty=2000,
        owner__nofile_soft=256,
    )
    found = codes(facts(st))
    assert found["TD512"].severity is Severity.ERROR and found["TD512"].family == "fd-exhausted"
    assert "2,004" in found["TD512"].message and "256" in found["TD512"].message
    assert "file_system" in found["TD512"].fix  # 2000 mappings fit: the strategy switch is offered
    ok = static(
        sharing_strategy={"strategy": "file_descriptor", "source": "torch's default"},
        storages__count=2000,
        storages__nonempty=2000,
        owner__nofile_soft=65536,
    )
    assert "TD512" not in codes(facts(ok))


# -- TD513 dataset bytes in /dev/shm ---------------------------------------------------------


def test_dataset_bytes_against_shm() -> None:
    assert codes(facts(static(), shm_free=16 * MiB))["TD513"].severity is Severity.ERROR
    assert "TD513" not in codes(facts(static(), shm_free=64 * MiB))


# -- TD520 pickling --------------------------------------------------------------------------


def _unpicklable(method: str) -> dict[str, Any]:
    return static(
        start_method={"method": method, "source": "x"},
        pickling={
            "pickled_to_workers": method != "fork",
            "ok": False,
            "path": "dataset.transform.fn",
            "error": "AttributeError: Can't pickle local object 'f.<locals>.<lambda>'",
            "culprit": {
                "kind": "lambda",
                "qualname": "f.<locals>.<lambda>",
                "type": "function",
                "repr": "<function>",
                "defined_at": "data.py:3",
            },
        },
    )


def test_unpicklable_is_an_error_under_spawn_and_info_under_fork() -> None:
    err = codes(facts(_unpicklable("spawn")))["TD520"]
    assert err.severity is Severity.ERROR and err.family == "worker-pickling"
    assert "`dataset.transform.fn` is a lambda" in err.message
    assert codes(facts(_unpicklable("fork")))["TD520"].severity is Severity.INFO
    assert "TD520" not in codes(facts(static()))


# -- TD530-532 live --------------------------------------------------------------------------


def _live(batch_bytes: int, workers: int = 2, prefetch: int = 2, **live: Any) -> dict[str, Any]:
    d = static(start_method={"method": "fork", "source": "x"})
    d["loader"] = {"num_workers": workers, "prefetch_factor": prefetch, "batches_per_epoch": 100}
    d["batch"] = {"bytes": batch_bytes, "tensors": 1, "samples": 4}
    d["live"] = {"ran": True, "batches": 8, "workers": [], **live}
    return d


def test_batches_in_flight_against_shm() -> None:
    f = codes(facts(_live(16 * MiB), shm_free=16 * MiB))["TD530"]
    assert f.severity is Severity.ERROR and "64 MiB" in f.message and f.family == "shm-exhausted"
    assert "num_workers=1, prefetch_factor=1" in f.fix
    assert "TD530" not in codes(facts(_live(1 * MiB), shm_free=16 * MiB))


def _workers(threads: list[int], growth: list[int]) -> list[dict[str, Any]]:
    return [
        {"pid": 1 + i, "threads": t, "uss_first": 10 * MiB, "uss_last": 10 * MiB + g, "pss_last": 50 * MiB}
        for i, (t, g) in enumerate(zip(threads, growth))
    ]


def test_threads_beyond_a_bare_worker() -> None:
    pooled = _live(1024, workers=[], bare_worker_threads=3)
    pooled["live"]["workers"] = _workers([7, 7], [0, 0])
    f = codes(facts(pooled))["TD531"]
    assert f.family == "thread-oversubscription" and "4 more than a bare worker (3)" in f.message
    bare = _live(1024, bare_worker_threads=3)
    bare["live"]["workers"] = _workers([3, 3], [0, 0])
    assert "TD531" not in codes(facts(bare))


def test_memory_growth_flagged_only_when_large() -> None:
    grows = _live(1024)
    grows["live"]["workers"] = _workers([3, 3], [22 * MiB, 24 * MiB])
    f = codes(facts(grows))["TD532"]
    assert f.family == "host-oom" and "23 MiB" in f.message
    flat = _live(1024)
    flat["live"]["workers"] = _workers([3, 3], [1 * MiB, 0])
    assert "TD532" not in codes(facts(flat))


# -- TD501-505 outcomes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "code"),
    [
        (
            {"status": "error", "error": {"phase": "batch", "type": "ValueError", "message": "bad", "traceback": "T"}},
            "TD501",
        ),
        ({"status": "timeout", "timeout": 5, "phase": "batch", "stacks": "S"}, "TD502"),
        ({"status": "crashed", "signal": "SIGSEGV", "phase": "batch"}, "TD503"),
        ({"status": "memory", "memory_cap": MiB, "peak_memory": 2 * MiB, "phase": "build"}, "TD504"),
        (
            {"status": "error", "error": {"phase": "live", "type": "RuntimeError", "message": "x", "traceback": "T"}},
            "TD505",
        ),
    ],
)
def test_each_outcome_has_its_code(outcome: dict[str, Any], code: str) -> None:
    found = [f.code for f in judge(facts({"outcome": outcome}))]
    assert found == [code]
    assert [f.code for f in judge(facts({"outcome": {"status": "ok"}}))] == []


# -- start method, search, targets, culprits -------------------------------------------------


@pytest.mark.parametrize(
    ("version", "platform", "method"),
    [
        ((3, 11), "linux", "fork"),
        ((3, 13), "linux", "fork"),
        ((3, 14), "linux", "forkserver"),
        ((3, 11), "darwin", "spawn"),
        ((3, 14), "win32", "spawn"),
    ],
)
def test_default_start_method(version: tuple[int, int], platform: str, method: str) -> None:
    assert default_start_method(version, platform) == method


def test_doubling_grid() -> None:
    assert doubling(16) == [0, 1, 2, 4, 8, 16] and doubling(12) == [0, 1, 2, 4, 8, 12] and doubling(1) == [0, 1]


@pytest.mark.parametrize(
    "curve",
    [
        lambda w: min(w, 2) * 100 + 100 - 3 * w,  # CPU-bound on 2 cores
        lambda w: 50 * w + 20,  # I/O-bound: linear to the end
        lambda w: 400 - (w - 6) ** 2 * 5,  # a peak in the middle
    ],
)
def test_search_finds_near_best_with_few_points(curve: Any) -> None:
    s = search(lambda w: [float(curve(w))] * 3, 16)  # one run: three agreeing readings, settled at once
    best = max(curve(w) for w in range(17))
    assert s.chosen is not None and curve(s.chosen) >= 0.95 * best
    assert len(s.points) <= 17 // 2 + 1 and s.repeats <= 2  # second runs only where the search turns
    single = search(lambda w: float(curve(w)), 16)  # one reading a run: each setting needs a second to agree
    assert single.chosen == s.chosen and single.tally.count(single.chosen) >= 2


def _busy(curve: Any, seed: int, hit: float = 0.3, whole: bool = False) -> Any:
    """``curve`` measured on a busy machine: each run gives three readings (the parts of its window),
    ±2% apart; with probability ``hit`` another process runs a burst that slows a stretch of
    consecutive parts (or, ``whole``, the whole run) to 35-80%. Interference only slows a run down."""
    rng = random.Random(seed)

    def measure(w: int) -> list[float]:
        factor, hit_run = rng.uniform(0.35, 0.8), rng.random() < hit
        lo = 0 if whole else rng.randrange(3)
        hi = 2 if whole else rng.randrange(lo, 3)
        return [curve(w) * rng.uniform(0.98, 1.02) * (factor if hit_run and lo <= k <= hi else 1.0) for k in range(3)]

    return measure


CURVES = [
    lambda w: min(w, 2) * 100 + 100 - 3 * w,  # CPU-bound on 2 cores
    lambda w: 50 * w + 20,  # I/O-bound: linear to the end
    lambda w: 400 - (w - 6) ** 2 * 5,  # a peak in the middle
]


@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("curve", CURVES)
def test_repeats_make_the_choice_robust_to_interference(curve: Any, whole: bool) -> None:
    best = max(curve(w) for w in range(17))

    def hits(max_runs: int) -> int:
        good = 0
        for seed in range(100):
            s = search(_busy(curve, seed, whole=whole), 16, max_runs=max_runs)
            good += curve(s.chosen) >= 0.95 * best
        return good

    repeated, single = hits(4), hits(1)
    assert repeated >= (85 if whole else 97), (repeated, single)
    assert repeated >= single


def test_repeats_stop_on_agreement_not_on_a_count() -> None:
    calls: list[int] = []

    def quiet(w: int) -> list[float]:
        calls.append(w)
        return [100.0 + w] * 3

    s = search(quiet, 8)  # a plateau: the search stops after 2 and 4 workers do not beat 1
    assert all(s.tally.settled(w) for w in s.tally.keys()) and s.settled()  # every run agreed with itself
    assert s.repeats == 1 and calls.count(4) == 2  # the one second run: of the setting it stopped on
    flip: dict[int, int] = {}

    def disagrees_once(w: int) -> list[float]:  # the first run of 2 workers is hit in one part
        flip[w] = flip.get(w, 0) + 1
        v = float(min(w, 2) * 100 + 100)
        return [v, v * 0.5, v] if w == 2 and flip[w] == 1 else [v, v, v]

    s = search(disagrees_once, 8)
    assert flip[2] == 2 and s.tally.value(2) == 300.0  # measured again; the steady second run is trusted

    n = [0]

    def always_apart(w: int) -> list[float]:  # never two readings within 10%: up to max_runs, no further
        n[0] += 3
        return [100.0 * (1 + w) * 1.5 ** (n[0] + k) for k in range(3)]

    s = search(always_apart, 4, max_runs=3)
    assert all(s.tally.count(w) <= 3 for w in s.tally.keys()) and not s.settled()


@pytest.mark.parametrize(("slowed", "again"), [({4: 0.5, 8: 0.27}, 8), ({8: 0.5, 16: 0.5}, 16), ({16: 0.5}, 16)])
def test_a_run_slowed_as_a_whole_is_measured_again(slowed: dict[int, float], again: int) -> None:
    """I/O-bound (best at 16 workers); the first runs of ``slowed`` are slowed as a whole (their parts
    agree), so that the search would stop early (4 and 8 look no better than 2) or take a neighbour
    of the best for worse than it is."""

    def slowed_first() -> tuple[dict[int, int], Any]:
        runs: dict[int, int] = {}

        def measure(w: int) -> list[float]:
            runs[w] = runs.get(w, 0) + 1
            v = 50.0 * w + 20
            return [v * (slowed.get(w, 1.0) if runs[w] == 1 else 1.0)] * 3

        return runs, measure

    runs, measure = slowed_first()
    s = search(measure, 16)
    assert runs[again] >= 2 and s.chosen == 16, (s.order, s.measured())
    _, measure = slowed_first()
    assert search(measure, 16, max_runs=1).chosen != 16  # one run per setting trusts the slowed runs


def test_repeats_stop_when_the_budget_is_spent() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def noisy(w: int) -> list[float]:
        now[0] += 1.0  # each run takes a second
        return [100.0 * (1 + w), 60.0 * (1 + w), 30.0 * (1 + w)]  # never agree: would repeat to max_runs

    s = search(noisy, 16, budget=5.0, clock=clock)
    first_runs = len(s.tally.keys())
    assert s.out_of_budget and len(s.points) - first_runs == s.repeats
    assert s.repeats <= 5 and not s.settled()  # repeats only while the budget lasted; first runs always made


def test_parse_target() -> None:
    from torchdoctor.probes.target import TargetNotFound, parse

    assert parse("pkg.mod:fn") == ("pkg.mod", "fn")
    assert parse("dir/file.py:Cls.make") == ("dir/file.py", "Cls.make")
    with pytest.raises(TargetNotFound):
        parse("pkg.mod")


class _Holder:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def test_culprit_path_through_attributes_items_and_partials() -> None:
    pytest.importorskip("torch")
    from torchdoctor.probes.static import describe_culprit, find_culprit

    lock = threading.Lock()
    obj = _Holder(transform=_Holder(steps=[abs, functools.partial(max, lock)]), name="x")
    path, culprit = find_culprit("dataset", obj)
    assert path == "dataset.transform.steps[1].args[0]" and culprit is lock
    assert describe_culprit(culprit)["kind"] == "lock"
    big = list(range(5000)) + [lambda x: x]
    path, culprit = find_culprit("dataset", _Holder(items=big))
    assert path == "dataset.items[5000]" and describe_culprit(culprit)["kind"] == "lambda"
