"""How `torchdoctor loader` counts samples and measures throughput: the batch-size finder over every
nesting a collate function makes (property tests), the one measurement the live run and the tuner
share, on real DataLoaders with real workers, checked against a plain timed loop over the same
loader, and the tuner's figure for a setting against the live run's figure for that setting."""

from __future__ import annotations

import collections
import dataclasses
import json
import sys
import time
import warnings
from typing import Any

import pytest

from torchdoctor.probes import ProbeOptions, probe_loader

from .conftest import FIXTURES, run_cli

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from torchdoctor.probes.rate import batch_size_of, measure_rate, prefetched  # noqa: E402

RATE = FIXTURES / "loader" / "rate_targets.py"
sys.path.insert(0, str(RATE.parent))
import rate_targets  # type: ignore[import-not-found]  # noqa: E402

# -- the batch-size finder -------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "x y")


@dataclasses.dataclass
class Batch:
    inputs: Any
    labels: Any


def test_tuple_dataset_batch_is_its_batch_size_not_two() -> None:
    loader = rate_targets.pairs()
    batch = next(iter(DataLoader(loader.dataset, batch_size=16)))
    assert isinstance(batch, list) and len(batch) == 2  # what default_collate makes of (x, y)
    assert batch_size_of(batch) == 16


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (["a", "b", "c"], 3),  # a collated list of strings
        ([["a"] * 5, ["b"] * 5], 5),  # (str, str) samples, collated
        ({"ids": 7, "names": ["n"] * 6}, 6),
        ("just one", 1),
        (3.5, 1),
        ([], 0),
        ({"a": {}}, 1),
    ],
)
def test_batch_size_without_tensors(batch: Any, expected: int) -> None:
    assert batch_size_of(batch) == expected


def test_zero_dim_tensor_and_numpy_arrays() -> None:
    np = pytest.importorskip("numpy")
    assert batch_size_of(torch.tensor(3.0)) == 1
    assert batch_size_of({"x": np.zeros((9, 2)), "y": ["s"] * 9}) == 9


def _collated(n: int) -> st.SearchStrategy[Any]:
    """What a collate function makes of n samples: tensors (and numpy arrays) with leading dimension n,
    lists of n strings, nested in tuples, lists, dicts, dataclasses and namedtuples."""
    tensor = st.lists(st.integers(1, 4), max_size=3).map(lambda rest: torch.zeros((n, *rest)))
    strings = st.just(["s"] * n)
    leaf = st.one_of(tensor, tensor, strings)

    def nest(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.lists(inner, min_size=1, max_size=3).map(tuple),
            st.lists(inner, min_size=1, max_size=3),
            st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), inner, min_size=1, max_size=3),
            st.builds(Batch, inner, inner),
            st.builds(Pair, inner, inner),
        )

    return st.recursive(leaf, nest, max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), _collated(n))))
def test_batch_size_of_any_collated_nesting(case: tuple[int, Any]) -> None:
    n, batch = case
    assert batch_size_of(batch) == n
    assert batch_size_of(batch, hint=n) == n


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 32), st.integers(1, 8), st.sampled_from(["tensor", "pair", "dict"]))
def test_list_of_samples_is_counted_with_the_batch_size_hint(n: int, c: int, kind: str) -> None:
    """``collate_fn=lambda b: b``: a list of n per-sample items; their tensors lead with c, not n."""
    sample: Any = {"tensor": torch.zeros(c, 3), "pair": (torch.zeros(c), 1), "dict": {"img": torch.zeros(c, 2)}}[kind]
    batch = [sample] * n
    assert batch_size_of(batch, hint=n) == n
    assert batch_size_of(batch) == c  # without a hint: the first tensor's leading dimension


# -- the shared measurement, on real workers ---------------------------------------------------


def plain_loop(loader: Any, seconds: float) -> float:
    """What a user times: samples per second of a for loop over the loader, after the first batch,
    epochs restarted as in training."""
    it = iter(loader)
    next(it)
    samples, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        try:
            x, _y = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        samples += x.shape[0]
    return samples / (time.perf_counter() - t0)


def test_window_starts_after_the_prefetched_batches_and_spans_epochs() -> None:
    loader = rate_targets.pairs()  # 12 batches an epoch, 2 workers × prefetch 2
    assert prefetched(loader) == 4
    r = measure_rate(loader, 0.6)
    assert r.samples_per_s is not None and r.steady and r.window_seconds >= 0.6
    assert r.epochs >= 1 and r.restart_seconds is not None  # several epochs of 12 batches in the window
    assert r.window_samples == 16 * r.window_batches  # batches counted by their samples
    assert len(r.parts) == 3 and all(p > 0 for p in r.parts)
    assert r.batches > r.window_batches + 4


def test_empty_loader_measures_nothing() -> None:
    r = measure_rate(DataLoader([], batch_size=4), 0.2)  # type: ignore[arg-type]
    assert r.samples_per_s is None and r.batches == 0


def test_probe_samples_per_s_matches_a_plain_loop_for_a_tuple_dataset() -> None:
    """The reported bug: (x, y) batches were counted as 2 samples, an 8x error at batch_size 16."""
    loader = rate_targets.pairs()
    plain = plain_loop(loader, 2.0)
    report = probe_loader(f"{RATE}:pairs", ProbeOptions(tune=True, max_workers=2, tune_seconds=1.0))
    live = report.section["live"]
    tune = report.section["tune"]
    two = next(x for x in tune["settings"] if x["num_workers"] == 2 and x["prefetch_factor"] == 2)
    for figure in (live["samples_per_s"], two["samples_per_s"]):
        assert 0.5 * plain <= figure <= 2.0 * plain, (figure, plain)
    # the plain loop pays a worker restart every epoch (not persistent): so does the per-epoch figure
    assert live["epoch_restart_seconds"] > 0 and 0.67 * plain <= live["epoch_samples_per_s"] <= 1.5 * plain, (
        live["epoch_samples_per_s"],
        plain,
    )
    assert report.section["batch"]["samples"] == 16
    # epoch_seconds (which drives the persistent_workers advice) is the dataset over the measured rate
    chosen = tune["chosen"]
    if chosen["num_workers"] > 0:
        epoch = len(loader.dataset) / plain
        assert 0.5 * epoch <= tune["epoch_seconds"] <= 2.0 * epoch, (tune["epoch_seconds"], epoch)


def test_tuner_and_live_run_agree_on_the_same_setting() -> None:
    """The reported bug: 2 spawn workers, 28.4 samples/s in the tuner and 78.7 in the live run, and the
    tuner then recommended num_workers=0. Both now measure through one function."""
    opts = ProbeOptions(tune=True, max_workers=2, tune_seconds=1.0)
    report = probe_loader(f"{RATE}:pairs_spawn", opts)
    first = report.outcome
    if first["status"] == "error":
        # once in a fresh-clone CI run (of many) the probe's child raised here after 9 s, exit 3, and the
        # message was cut from the log; run it again, and show the first error in full if that fails too
        warnings.warn(f"loader probe raised, retried once: {first.get('error')}", stacklevel=1)
        report = probe_loader(f"{RATE}:pairs_spawn", opts)
    assert report.outcome["status"] == "ok", {"first": first.get("error"), "then": report.outcome.get("error")}
    live = report.section["live"]["samples_per_s"]
    tune = report.section["tune"]
    same = next(x for x in tune["settings"] if x["num_workers"] == 2 and x["prefetch_factor"] == 2)
    assert 0.67 <= same["samples_per_s"] / live <= 1.5, (same, live)
    zero = next(x for x in tune["settings"] if x["num_workers"] == 0)
    assert same["samples_per_s"] > 1.3 * zero["samples_per_s"]  # 2 ms waits overlap in 2 workers
    assert tune["chosen"]["num_workers"] == 2
    # spawn start-up is a second or more against an epoch of a fraction of one: keep the workers
    assert tune["chosen"]["persistent_workers"] is True


def test_cli_text_shows_the_steady_window_and_the_settings() -> None:
    proc = run_cli("loader", f"{RATE}:pairs", "--tune", "--max-workers", "2", "--tune-seconds", "0.4", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "steady over" in proc.stdout and "samples/s" in proc.stdout
    assert "tuning (settings in the order first measured)" in proc.stdout and "★" in proc.stdout
    assert "repeated because their readings disagreed" in proc.stdout


def test_tune_budget_needs_tune() -> None:
    proc = run_cli("loader", f"{RATE}:pairs", "--tune-budget", "5")
    assert proc.returncode == 2 and "--tune-budget limits the --tune search" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_json_live_section_carries_the_rate() -> None:
    proc = run_cli("loader", f"{RATE}:pairs", "--format", "json", "--tune-seconds", "0.5", timeout=120)
    assert proc.returncode == 0, proc.stderr
    live = json.loads(proc.stdout)["probe"]["live"]
    rate = live["rate"]
    assert rate["window_seconds"] >= 0.5 and rate["window_samples"] == 16 * rate["window_batches"]
    assert live["samples_per_s"] == rate["samples_per_s"] and live["memory_samples"] >= 2
