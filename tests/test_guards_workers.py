"""``torchdoctor.worker_init_fn`` in a real DataLoader (3 workers, fork and spawn): threads capped,
every worker seeded distinctly and reproducibly, the user's own init function called."""

from __future__ import annotations

import os
import pickle
import random
import sys
import types
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

import torchdoctor
from torchdoctor.guards.workers import THREAD_VARIABLES, WorkerInit, cap_worker_threads, make_worker_init_fn

WORKERS = 3
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


class Probe(Dataset):  # type: ignore[type-arg]
    """One item per worker's first draw: what the worker looks like right after its init function."""

    def __len__(self) -> int:
        return WORKERS * 2

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = get_worker_info()
        assert info is not None
        return {
            "worker": info.id,
            "seed": info.seed,
            "threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in THREAD_VARIABLES},
            "user": os.environ.get("TD_TEST_USER_INIT"),
            "random": random.random(),
            "numpy": float(np.random.rand()),
            "torch": float(torch.rand(1)),
        }


def mark_user(worker_id: int) -> None:
    os.environ["TD_TEST_USER_INIT"] = f"called-{worker_id}"


def first_draws(init: Any, method: str, seed: int = 1234) -> dict[int, dict[str, Any]]:
    """The first item each worker produced (items are dealt round-robin: item w is worker w's first)."""
    torch.manual_seed(seed)
    loader = DataLoader(
        Probe(),
        batch_size=None,
        num_workers=WORKERS,
        worker_init_fn=init,
        multiprocessing_context=method,
    )
    items = list(loader)
    return {it["worker"]: it for it in items[:WORKERS]}


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_init_fn_caps_and_seeds(method: str) -> None:
    draws = first_draws(torchdoctor.worker_init_fn, method)
    assert sorted(draws) == list(range(WORKERS))
    for w, d in draws.items():
        assert d["threads"] == 1, (w, d)
        assert set(d["env"].values()) == {"1"}
        # seeded from the worker's own seed: Python's random and NumPy's global generator
        assert d["random"] == random.Random(d["seed"]).random()
        assert d["numpy"] == np.random.RandomState(d["seed"] % 2**32).rand()
        assert d["torch"] == _torch_first(d["seed"])
    for key in ("random", "numpy", "torch"):
        assert len({d[key] for d in draws.values()}) == WORKERS, key  # distinct per worker
    again = first_draws(torchdoctor.worker_init_fn, method)
    assert {w: (d["random"], d["numpy"], d["torch"]) for w, d in draws.items()} == {
        w: (d["random"], d["numpy"], d["torch"]) for w, d in again.items()
    }
    other = first_draws(torchdoctor.worker_init_fn, method, seed=99)
    assert {d["numpy"] for d in other.values()}.isdisjoint({d["numpy"] for d in draws.values()})


def _torch_first(seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    return float(torch.rand(1, generator=g))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_composed_with_a_user_function(method: str) -> None:
    for init in (torchdoctor.worker_init_fn.then(mark_user), make_worker_init_fn(threads=2, then=mark_user)):
        draws = first_draws(init, method)
        want = init.threads
        for w, d in draws.items():
            assert d["user"] == f"called-{w}"
            assert d["threads"] == want and set(d["env"].values()) == {str(want)}
            assert d["numpy"] == np.random.RandomState(d["seed"] % 2**32).rand()


def test_helpers_outside_a_worker_and_pickling(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    try:
        calls: list[int] = []
        fake_cv2 = types.SimpleNamespace(setNumThreads=calls.append)
        monkeypatch.setitem(sys.modules, "cv2", fake_cv2)
        cap_worker_threads(1)
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        assert calls == [0]  # OpenCV's own pool off
    finally:
        torch.set_num_threads(before)
        for name, value in saved.items():  # cap_worker_threads set them: later tests' children must not inherit them
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    torch.manual_seed(5)
    assert torchdoctor.seed_worker(0) == 5 and random.random() == random.Random(5).random()
    init = pickle.loads(pickle.dumps(torchdoctor.worker_init_fn.then(mark_user)))
    assert isinstance(init, WorkerInit) and init.after == (mark_user,) and init.threads == 1
    with pytest.raises(ValueError):
        make_worker_init_fn(threads=0)
    with pytest.raises(TypeError):
        make_worker_init_fn(then="not callable")  # type: ignore[arg-type]
