"""shm-map-count and shm-exhausted: memory maps and /dev/shm space spent on shared tensors.

The seed case (``map-count-spawn``): a DataLoader created in a process that was itself started
with spawn (or forkserver) inherits that start method, so iterating it pickles the whole dataset
to each worker; under the ``file_system`` strategy (set inside that process: it is not inherited)
every tensor storage costs one memory mapping there, and 70,000 small tensors pass
``vm.max_map_count`` (65530): ``unable to mmap N bytes from file </torch_…>: Cannot allocate
memory (12)``. The fast variants first use up most of that process's own mapping slots (one
anonymous region split into single-page mappings by ``mprotect``; nothing outside the process
changes) and then share 2,000 tensors. Counts near the threshold are avoided on purpose: just
below it the loader hangs or its workers die with unrelated-looking errors.

The /dev/shm cases run on a private 16 MiB tmpfs mounted over /dev/shm in the child's own
mount namespace; their fixed variants grow that private mount (``--shm-size`` in Docker terms).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
from typing import Any

from .. import scenario
from ..predict import Prediction

SEED_TENSORS = 70_000
FAST_TENSORS = 2_000
#: Mapping slots left free in the fast variants: far fewer than the storages shared, far more
#: than a fork loader needs for the batches in flight.
FAST_LEAVE = 500
#: Above this vm.max_map_count the fast variants refuse to use the slots up (time, kernel memory).
MAX_CONSUMABLE = 4_200_000
ELEMENTS = 96
SHM_GROWN = "512m"
PROT_NONE = 0  # not exported by the mmap module


# -- helpers (run in the child only) ----------------------------------------------------------


def _map_count() -> int:
    with open("/proc/self/maps", "rb") as f:
        return sum(1 for _ in f)


def _use_up_map_slots(leave: int) -> int:
    """Split one anonymous PROT_NONE region into single-page mappings until ``leave`` slots are left.

    Alternate pages get PROT_READ, so the kernel keeps each page as its own mapping. Nothing is
    touched (no memory is committed) and the region dies with this process.
    """
    with open("/proc/sys/vm/max_map_count") as f:
        limit = int(f.read())
    if limit > MAX_CONSUMABLE:
        sys.exit(f"torchdoctor lab: vm.max_map_count is {limit} here; too many slots to use up in a lab child")
    pages = limit - _map_count() - leave
    if pages <= 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    addr = libc.mmap(None, pages * page, PROT_NONE, flags, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        sys.exit(f"torchdoctor lab: mmap of {pages} pages failed (errno {ctypes.get_errno()})")
    for i in range(1, pages, 2):
        if libc.mprotect(addr + i * page, page, mmap.PROT_READ) != 0:
            break  # the limit came early (another thread mapped something): close enough
    return pages


def _owner(fixed: bool, tensors: int, leave: int | None) -> None:
    """The process that owns the DataLoader: started by spawn/forkserver, so its loader is too."""
    import multiprocessing

    import torch
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader

    mp.set_sharing_strategy("file_system")  # set here: a spawned process starts with torch's default
    data = [torch.full((ELEMENTS,), float(i)) for i in range(tensors)]
    if leave is not None:
        _use_up_map_slots(leave)
    loader: Any = DataLoader(
        data,  # type: ignore[arg-type]
        batch_size=256,
        num_workers=2,
        multiprocessing_context="fork" if fixed else None,
    )
    seen = sum(len(batch) for batch in loader)
    method = "fork" if fixed else multiprocessing.get_start_method()
    print(f"iterated {seen} samples; workers started with {method}")


def _run_owner(method: str, fixed: bool, tensors: int, leave: int | None) -> None:
    import multiprocessing

    ctx: Any = multiprocessing.get_context(method)
    proc = ctx.Process(target=_owner, args=(fixed, tensors, leave))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise SystemExit(1)


# -- shm-map-count ----------------------------------------------------------------------------

_MC = dict(
    family="shm-map-count",
    code="TD155",
    private_shm=True,
    fix="DataLoader(..., multiprocessing_context='fork'): only batches are shared, not the dataset",
)


@scenario(
    name="map-count-spawn",
    predict=Prediction("check", ("--sharing-strategy", "file_system", "--start-method", "spawn")),
    **_MC,
    summary=f"the seed case: a DataLoader with 2 workers in a spawn child, file_system strategy, "
    f"{SEED_TENSORS:,} small tensors pickled to the workers: 'unable to mmap … Cannot allocate memory (12)'",
    seconds=15.0,
    timeout=120.0,
    memory_mb=2048,
    slow=True,
)
def map_count_spawn(fixed: bool) -> None:
    _run_owner("spawn", fixed, SEED_TENSORS, None)


@scenario(
    name="map-count-forkserver",
    predict=Prediction("check", ("--sharing-strategy", "file_system", "--start-method", "forkserver")),
    **_MC,
    summary=f"the seed case in a forkserver child: {SEED_TENSORS:,} small tensors, file_system strategy",
    seconds=15.0,
    timeout=120.0,
    memory_mb=2048,
    slow=True,
)
def map_count_forkserver(fixed: bool) -> None:
    _run_owner("forkserver", fixed, SEED_TENSORS, None)


@scenario(
    name="map-count-fast-spawn",
    predict=Prediction("check", ("--sharing-strategy", "file_system", "--start-method", "spawn")),
    **_MC,
    summary=f"a spawn child uses up its own memory-map slots (all but {FAST_LEAVE}), then its DataLoader "
    f"shares {FAST_TENSORS:,} tensors under file_system: the seed case's error in seconds",
    seconds=5.0,
    timeout=90.0,
    memory_mb=1536,
)
def map_count_fast_spawn(fixed: bool) -> None:
    _run_owner("spawn", fixed, FAST_TENSORS, FAST_LEAVE)


@scenario(
    name="map-count-fast-forkserver",
    predict=Prediction("check", ("--sharing-strategy", "file_system", "--start-method", "forkserver")),
    **_MC,
    summary=f"the fast variant in a forkserver child: map slots used up, {FAST_TENSORS:,} tensors shared",
    seconds=4.0,
    timeout=90.0,
    memory_mb=1536,
)
def map_count_fast_forkserver(fixed: bool) -> None:
    _run_owner("forkserver", fixed, FAST_TENSORS, FAST_LEAVE)


# -- shm-exhausted ----------------------------------------------------------------------------


def _grow_private_shm() -> None:
    """The fix, applied where it is safe: only to the private /dev/shm of this mount namespace."""
    try:
        private = os.readlink("/proc/self/ns/mnt") != os.readlink(f"/proc/{os.getppid()}/ns/mnt")
    except OSError:
        private = False
    if not private:  # the lab runner starts this process in a new mount namespace; anything else is refused
        sys.exit("torchdoctor lab: /dev/shm is not private to this process; refusing to remount it")
    subprocess.run(["mount", "-o", f"remount,size={SHM_GROWN}", "/dev/shm"], check=True)


def _count_batches(dataset: Any, batch_size: int) -> int:
    from torch.utils.data import DataLoader

    return sum(1 for _ in DataLoader(dataset, batch_size=batch_size, num_workers=2))


class FrameDataset:
    """Samples of 4 MiB each (one 1024×1024 float32 frame)."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.full((1024, 1024), float(i))


@scenario(
    name="shm-no-space",
    predict=Prediction(
        "check", ("--num-workers", "2", "--batch-bytes", "16MiB", "--prefetch-factor", "2"), shm_size="16m"
    ),
    family="shm-exhausted",
    code="TD156",
    shm_size="16m",
    summary="2 workers hand 16 MiB batches (prefetch 2) to the main process through a 16 MiB /dev/shm: "
    "'unable to allocate shared memory(shm) … No space left on device (28)'",
    fix="a larger /dev/shm (here: the private mount grown to 512 MiB; Docker --shm-size, k8s emptyDir Memory)",
    needs=("torch", "root", "unshare"),
    seconds=4.0,
    timeout=60.0,
    memory_mb=1536,
)
def shm_no_space(fixed: bool) -> None:
    if fixed:
        _grow_private_shm()
    batches = _count_batches(FrameDataset(), batch_size=4)
    print(f"received {batches} batches of 16 MiB")


class ShmCacheDataset:
    """Decodes into a 32 MiB cache file mapped from /dev/shm (``torch.from_file(..., shared=True)``).

    The file is created sparse, so its pages are only allocated when written: on a full tmpfs
    the write faults with SIGBUS instead of returning an error.
    """

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        import torch

        path = f"/dev/shm/torchdoctor-lab-cache-{os.getpid()}.bin"
        cache = torch.from_file(path, shared=True, size=8 * 1024 * 1024, dtype=torch.float32)
        cache.fill_(float(i))
        return cache[:4].clone()


@scenario(
    name="shm-sigbus",
    predict=Prediction(
        "check", ("--num-workers", "2", "--batch-bytes", "32MiB", "--prefetch-factor", "1"), shm_size="16m"
    ),
    family="shm-exhausted",
    code="TD157",
    shm_size="16m",
    summary="each worker fills a 32 MiB cache file mapped from a 16 MiB /dev/shm "
    "(torch.from_file(..., shared=True)): the worker dies of SIGBUS, torch prints its shm hint",
    fix="a larger /dev/shm (here: the private mount grown to 512 MiB; Docker --shm-size, k8s emptyDir Memory)",
    needs=("torch", "root", "unshare"),
    seconds=4.0,
    timeout=60.0,
    memory_mb=1536,
)
def shm_sigbus(fixed: bool) -> None:
    if fixed:
        _grow_private_shm()
    batches = _count_batches(ShmCacheDataset(), batch_size=2)
    print(f"received {batches} batches")


# -- /dev/shm filling over time: batches kept by the main process --------------------------------------

#: Each batch is 1 MiB of shared memory; a worker makes one every SLOW_SAMPLE_S.
SMALL_FRAME = 256 * 1024  # float32 elements: 1 MiB
SLOW_SAMPLE_S = 0.12


class SlowFrameDataset:
    """1 MiB samples, each taking :data:`SLOW_SAMPLE_S` to "decode"."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        import time

        import torch

        time.sleep(SLOW_SAMPLE_S)
        return torch.full((SMALL_FRAME,), float(i))


@scenario(
    name="shm-fill-kept-batches",
    family="shm-exhausted",
    code="TD156",
    shm_size="16m",
    summary="the main process keeps every 1 MiB batch a worker hands over through a 16 MiB /dev/shm (one batch "
    f"every {SLOW_SAMPLE_S:g} s): /dev/shm fills over seconds until 'unable to allocate shared memory(shm) "
    "… No space left on device (28)'",
    fix="do not keep batches (keep `.item()`/`.clone()`d results), or a larger /dev/shm",
    needs=("torch", "root", "unshare"),
    seconds=4.0,
    timeout=60.0,
    memory_mb=1536,
)
def shm_fill_kept_batches(fixed: bool) -> None:
    from torch.utils.data import DataLoader

    kept = []
    for batch in DataLoader(SlowFrameDataset(), batch_size=1, num_workers=1):  # type: ignore[arg-type]
        kept.append(batch.clone() if fixed else batch)  # a clone lives in private memory, not /dev/shm
    print(f"kept {len(kept)} batches of 1 MiB")
