"""worker-pickling and worker-crash: DataLoader workers that cannot get their dataset, or die.

Pickling: with spawn/forkserver the Dataset is pickled to every worker, so everything it holds
must pickle (lambdas, local functions, locks and generators do not) and its class must be
importable by name in the worker (not defined in ``python -c`` code). Crashes: a worker dies of
a signal or exits, and the main process reports it; every case has a cause people really meet
(a handle valid only in the parent, a fork-unsafe client, a preemption SIGTERM sent to the
process group, a corrupt sample a native decoder exits on, copy-on-write memory growth, a lock
held while the loader forks) and the fix the catalogue recommends for it.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import scenario

ITEMS = 16


def _iterate(dataset: Any, workers: int = 2, **kw: Any) -> int:
    from torch.utils.data import DataLoader

    return sum(1 for _ in DataLoader(dataset, batch_size=4, num_workers=workers, **kw))


def as_list(batch: list[float]) -> list[float]:
    """Plain floats back to the main process: no shared storage whose transfer a kill could interrupt."""
    return batch


# -- worker-pickling --------------------------------------------------------------------------


class TransformDataset:
    """Samples passed through ``transform`` (or anything else the dataset holds)."""

    def __init__(self, transform: Any = None, source: Any = None) -> None:
        self.transform = transform
        self.source = source

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> Any:
        import torch

        x = torch.full((4,), float(i))
        return self.transform(x) if callable(self.transform) else x


def double(x: Any) -> Any:
    return x * 2


double_lambda = lambda x: x * 2  # noqa: E731 - the point of the scenario


@scenario(
    name="pickle-lambda-attribute",
    family="worker-pickling",
    code="TD550",
    summary="a Dataset holding a lambda defined in a function, DataLoader with spawn workers: "
    "\"Can't pickle local object '…<locals>.<lambda>'\"",
    fix="a module-level function (def double(x): ...) instead of the lambda",
    seconds=2.5,
)
def pickle_lambda_attribute(fixed: bool) -> None:
    transform = double if fixed else (lambda x: x * 2)
    print(f"{_iterate(TransformDataset(transform), 1, multiprocessing_context='spawn')} batches")


@scenario(
    name="pickle-local-function",
    family="worker-pickling",
    code="TD550",
    summary="a Dataset holding a function defined inside another function, forkserver workers: "
    "\"Can't pickle local object '…<locals>.scale'\"",
    fix="define the function at module level",
    seconds=2.5,
)
def pickle_local_function(fixed: bool) -> None:
    def scale(x: Any) -> Any:
        return x * 2

    transform = double if fixed else scale
    print(f"{_iterate(TransformDataset(transform), 1, multiprocessing_context='forkserver')} batches")


@scenario(
    name="pickle-module-lambda",
    family="worker-pickling",
    code="TD551",
    summary="a Dataset holding a module-level lambda, spawn workers: pickle finds no '<lambda>' in the "
    'module: "Can\'t pickle <function <lambda> …>: attribute lookup <lambda> on … failed"',
    fix="def double(x): ... instead of double = lambda x: ...",
    seconds=2.5,
)
def pickle_module_lambda(fixed: bool) -> None:
    transform = double if fixed else double_lambda
    print(f"{_iterate(TransformDataset(transform), 1, multiprocessing_context='spawn')} batches")


class LockedCacheDataset(TransformDataset):
    """Guards a sample cache with a lock; the fixed variant drops the lock from its pickled state."""

    def __init__(self, portable: bool) -> None:
        super().__init__()
        self.portable = portable
        self.lock = threading.Lock()
        self.cache: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.portable:
            state.pop("lock")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()  # a fresh lock in each worker


@scenario(
    name="pickle-thread-lock",
    family="worker-pickling",
    code="TD552",
    summary="a Dataset holding a threading.Lock, spawn workers: \"cannot pickle '_thread.lock' object\"",
    fix="__getstate__ leaves the lock out and __setstate__ creates a new one in the worker",
    seconds=2.5,
)
def pickle_thread_lock(fixed: bool) -> None:
    print(f"{_iterate(LockedCacheDataset(portable=fixed), 1, multiprocessing_context='spawn')} batches")


@scenario(
    name="pickle-generator",
    family="worker-pickling",
    code="TD552",
    summary="a Dataset holding a generator of its file names, forkserver workers: \"cannot pickle 'generator' object\"",
    fix="materialise the generator (a list) or create it inside the worker",
    seconds=2.5,
)
def pickle_generator(fixed: bool) -> None:
    names = (f"sample-{i}.bin" for i in range(ITEMS))
    dataset = TransformDataset(source=list(names) if fixed else names)
    print(f"{_iterate(dataset, 1, multiprocessing_context='forkserver')} batches")


_MAIN_CODE = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([i * i])

"""
_LOOP = (
    'for batch in DataLoader(Squares(), batch_size=4, num_workers=1, multiprocessing_context="spawn"):\n'
    "    print(batch.tolist())\n"
)
_GUARDED = 'if __name__ == "__main__":\n' + "".join("    " + line + "\n" for line in _LOOP.splitlines())


def _python(args: list[str]) -> None:
    """Run a grandchild Python with this process's output; fail as it fails."""
    sys.stdout.flush()
    code = subprocess.run([sys.executable, *args], stdin=subprocess.DEVNULL, timeout=120).returncode
    if code != 0:
        raise SystemExit(1)


def _script(text: str, run: Callable[[Path], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="torchdoctor-lab-") as tmp:
        path = Path(tmp) / "train.py"
        path.write_text(text)
        run(path)


@scenario(
    name="pickle-main-class",
    family="worker-pickling",
    code="TD553",
    summary="a Dataset class defined in `python -c` code, spawn workers: the worker cannot find it "
    "(\"Can't get attribute 'Squares' on <module '__main__' (built-in)>\")",
    fix='put the code in a file run as a script under `if __name__ == "__main__":` (or the class in a module)',
    seconds=9.0,
    timeout=90.0,
)
def pickle_main_class(fixed: bool) -> None:
    if fixed:
        _script(_MAIN_CODE + _GUARDED, lambda p: _python([str(p)]))
    else:
        _python(["-c", _MAIN_CODE + _LOOP])


@scenario(
    name="main-guard-missing",
    family="worker-pickling",
    code="TD554",
    summary='a training script without `if __name__ == "__main__":` starts spawn workers: each worker '
    "re-runs the script and Python stops it ('An attempt has been made to start a new process …')",
    fix='put the training code under `if __name__ == "__main__":`',
    seconds=9.0,
    timeout=90.0,
)
def main_guard_missing(fixed: bool) -> None:
    _script(_MAIN_CODE + (_GUARDED if fixed else _LOOP), lambda p: _python([str(p)]))


# -- worker-crash -----------------------------------------------------------------------------

#: Where the stand-in native library maps its table: far from where Linux puts anything by itself,
#: so in a process that did not map it the address is certainly invalid.
TABLE_ADDR = 0x2A0000000000
MAP_FIXED_NOREPLACE = 0x100000


def _map_table() -> int:
    """Map a small table the way a native library would, and return its address (the "handle")."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED_NOREPLACE
    addr = libc.mmap(TABLE_ADDR, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap of the table failed")
    values = (ctypes.c_double * ITEMS)(*[float(i) for i in range(ITEMS)])
    ctypes.memmove(addr, values, ctypes.sizeof(values))
    return int(addr)


class NativeTableDataset:
    """Reads rows through a raw address, as datasets wrapping C libraries (via ctypes/cffi) do."""

    def __init__(self, open_now: bool) -> None:
        self.addr = _map_table() if open_now else None

    def open(self) -> None:
        self.addr = _map_table()

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.tensor(ctypes.c_double.from_address(self.addr + 8 * i).value)  # type: ignore[operator]


def open_table_in_worker(worker_id: int) -> None:
    from torch.utils.data import get_worker_info

    get_worker_info().dataset.open()  # type: ignore[union-attr]


@scenario(
    name="worker-sigsegv",
    family="worker-crash",
    code="TD560",
    summary="a Dataset keeps the address of a table a native library mapped in the main process; spawn "
    "workers get the number, not the memory, and die of SIGSEGV reading it",
    fix="open native resources in the worker (worker_init_fn), never pass handles or addresses to it",
    seconds=4.0,
)
def worker_sigsegv(fixed: bool) -> None:
    dataset = NativeTableDataset(open_now=not fixed)
    init = open_table_in_worker if fixed else None
    print(f"{_iterate(dataset, multiprocessing_context='spawn', worker_init_fn=init)} batches")


class ForkUnsafeClient:
    """Stands in for a native client library that must not be used in a forked child: like several RPC
    and database clients, it checks the pid it was created in and calls abort() when used elsewhere."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def fetch(self, i: int) -> float:
        if os.getpid() != self.pid:
            ctypes.CDLL(None).abort()
        return float(i)


class ClientDataset:
    def __init__(self, connect_now: bool) -> None:
        self.client = ForkUnsafeClient() if connect_now else None

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> Any:
        import torch

        if self.client is None:
            self.client = ForkUnsafeClient()  # created lazily, in the worker that uses it
        return torch.tensor(self.client.fetch(i))


@scenario(
    name="worker-sigabrt",
    family="worker-crash",
    code="TD560",
    summary="a Dataset opens a fork-unsafe native client in the main process; forked workers use it and "
    "the library aborts (SIGABRT)",
    fix="create the client lazily in the worker (first __getitem__ or worker_init_fn)",
    seconds=2.5,
)
def worker_sigabrt(fixed: bool) -> None:
    print(f"{_iterate(ClientDataset(connect_now=not fixed))} batches")


class SlowDataset(TransformDataset):
    def __getitem__(self, i: int) -> Any:
        time.sleep(0.05)
        return float(i)  # a plain float: see as_list


#: The launcher's preemption notice: SIGTERM to every process of the job's process group.
_KILLPG = "import os, signal, sys; os.killpg(int(sys.argv[1]), signal.SIGTERM)"


def ignore_sigterm(worker_id: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@scenario(
    name="worker-sigterm",
    family="worker-crash",
    code="TD560",
    summary="a launcher sends SIGTERM to the job's process group (preemption); the training process "
    "catches it to finish the epoch and checkpoint, but its workers die of it",
    fix="worker_init_fn ignores SIGTERM, so only the main process handles the preemption notice",
    seconds=3.0,
)
def worker_sigterm(fixed: bool) -> None:
    if os.getpgid(0) != os.getpid():
        sys.exit(
            "torchdoctor lab: worker-sigterm signals its own process group and must lead it (run it through "
            "`torchdoctor lab run`)"
        )
    preempted = []
    signal.signal(signal.SIGTERM, lambda signum, frame: preempted.append(signum))
    from torch.utils.data import DataLoader

    dataset: Any = SlowDataset()
    # as_list keeps batches as Python objects: no tensor travels by descriptor, so the main process never
    # races a dying worker's resource sharer (that race prints ConnectionResetError instead of the loader's error)
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, collate_fn=as_list, worker_init_fn=ignore_sigterm if fixed else None
    )
    seen = 0
    for seen, _ in enumerate(loader, 1):
        if seen == 1:  # the launcher's notice goes to every process in the group
            subprocess.run([sys.executable, "-c", _KILLPG, str(os.getpid())], check=False)
    print(f"preempted={bool(preempted)}: finished the epoch ({seen} batches), checkpoint saved")


class CorpusDataset:
    """Encoded samples handed to a decoder that, like libjpeg's default error handler, exits the
    process on data it cannot decode. The fixed variant validates samples before decoding."""

    MAGIC = b"TDS1"

    def __init__(self, validate: bool) -> None:
        samples = [self.MAGIC + bytes([i]) for i in range(ITEMS)]
        samples[9] = b"\x00\x00" + samples[9][2:]  # one corrupt sample
        self.samples = [s for s in samples if s.startswith(self.MAGIC)] if validate else samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> float:
        sample = self.samples[i]
        if not sample.startswith(self.MAGIC):
            os._exit(1)  # the decoder's exit(EXIT_FAILURE)
        return float(sample[-1])


@scenario(
    name="worker-exit",
    family="worker-crash",
    code="TD563",
    summary="a native decoder exits the worker process (exit status 1) on a corrupt sample: "
    "'DataLoader worker (pid N) exited unexpectedly with exit code 1'",
    fix="validate samples before decoding (skip or repair corrupt ones); num_workers=0 shows where it stops",
    seconds=7.0,
)
def worker_exit(fixed: bool) -> None:
    print(f"{_iterate(CorpusDataset(validate=fixed), collate_fn=as_list)} batches")


#: Module-level state, as libraries keep it: a lock held by a thread of the main process while the
#: loader forks stays locked forever in the workers.
_INDEX_LOCK = threading.Lock()
LOADER_TIMEOUT = 5.0


class IndexedDataset(TransformDataset):
    def __getitem__(self, i: int) -> Any:
        with _INDEX_LOCK:
            return super().__getitem__(i)


def fresh_index_lock(worker_id: int) -> None:
    """What a fork-safe library does with os.register_at_fork(after_in_child=...): a new, unheld lock."""
    global _INDEX_LOCK
    _INDEX_LOCK = threading.Lock()


def _refresh_index(held: threading.Event, release: threading.Event) -> None:
    with _INDEX_LOCK:
        held.set()
        release.wait(60)


@scenario(
    name="worker-hang-timeout",
    family="worker-crash",
    code="TD565",
    summary="a background thread of the main process holds a module-level lock while the DataLoader forks; "
    f"workers wait on the copied lock forever; the loader's timeout={LOADER_TIMEOUT:g} turns the hang "
    "into 'DataLoader timed out'",
    fix="re-create fork-inherited locks in the worker (worker_init_fn; in a library os.register_at_fork), "
    "or start workers with multiprocessing_context='spawn'",
    seconds=8.0,
)
def worker_hang_timeout(fixed: bool) -> None:
    held, release = threading.Event(), threading.Event()
    refresher = threading.Thread(target=_refresh_index, args=(held, release), daemon=True)
    refresher.start()
    held.wait(10)
    try:
        init = fresh_index_lock if fixed else None
        print(f"{_iterate(IndexedDataset(), worker_init_fn=init, timeout=LOADER_TIMEOUT)} batches")
    finally:
        release.set()


# -- host-oom seen from the loader -------------------------------------------------------------

COW_FLOATS = 4_000_000
COW_CHUNK = 200_000
#: Private memory at which the stand-in for the OOM killer kills a worker.
WORKER_BOUND_MB = 40


class FeatureDataset:
    """Samples are slices of one big feature store: a Python list of floats, or (fixed) a tensor."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __len__(self) -> int:
        return COW_FLOATS // COW_CHUNK

    def __getitem__(self, i: int) -> float:
        part = self.store[i * COW_CHUNK : (i + 1) * COW_CHUNK]
        value = float(part.sum()) if hasattr(part, "sum") else float(sum(part))
        time.sleep(0.1)  # the rest of a sample's work: the workers live long enough to be seen growing
        return value


def _oom_stand_in(stop: threading.Event) -> None:
    """Kill any child whose private memory passes the bound, as the OOM killer would in a tight cgroup."""
    import psutil

    me = psutil.Process()
    while not stop.wait(0.05):
        for child in me.children():
            try:
                if child.memory_full_info().uss > WORKER_BOUND_MB * 2**20:
                    child.send_signal(signal.SIGKILL)
            except psutil.Error:
                continue


@scenario(
    name="worker-sigkill",
    family="host-oom",
    code="TD562",
    summary=f"forked workers read a feature store held as a Python list of {COW_FLOATS:,} floats; touching "
    "each object's refcount copies its page, so each worker's private memory grows; a memory "
    f"watchdog standing in for the OOM killer SIGKILLs a worker past {WORKER_BOUND_MB} MiB",
    fix="hold the data in one tensor / numpy array (no per-object refcounts to write), not Python objects, and "
    "gc.freeze() before the workers start (a full garbage collection in a worker copies every page holding a "
    "Python object: measured 10 -> 47 MiB private per worker with torch imported)",
    seconds=3.0,
    memory_mb=1536,
)
def worker_sigkill(fixed: bool) -> None:
    import torch

    store: Any = torch.arange(COW_FLOATS, dtype=torch.float64) if fixed else [float(i) for i in range(COW_FLOATS)]
    if fixed:
        # objects alive now move to a permanent generation that no collection in a worker walks
        gc.freeze()
    stop = threading.Event()
    threading.Thread(target=_oom_stand_in, args=(stop,), daemon=True).start()
    try:
        print(f"{_iterate(FeatureDataset(store), collate_fn=as_list)} batches")
    finally:
        stop.set()
