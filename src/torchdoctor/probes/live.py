"""Run the loader for real, briefly, and measure it (probe child only).

* one batch made in this process (no workers, nothing shared): its bytes and the time it takes;
* then the real workers: time to start them and to the first batch, a few batches, throughput,
  and for each worker its memory (USS/PSS from ``/proc/PID/smaps_rollup``) and thread count at the
  first and the last batch, so copy-on-write growth and thread pools show up.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import Any

from .target import in_process

Emit = Callable[[str, dict[str, Any]], None]


def tensor_bytes(batch: Any, depth: int = 0) -> tuple[int, int]:
    """(bytes in tensors, number of tensors) of a batch: what workers hand over through shared memory."""
    import torch

    if depth > 8:
        return 0, 0
    if isinstance(batch, torch.Tensor):
        return batch.untyped_storage().nbytes() if batch.layout == torch.strided else batch.element_size() * \
            batch.numel(), 1
    items: Any
    if isinstance(batch, dict):
        items = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return 0, 0
    total = count = 0
    for item in items:
        b, c = tensor_bytes(item, depth + 1)
        total += b
        count += c
    return total, count


def batch_len(batch: Any) -> int:
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict) and batch:
        return batch_len(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, (torch.Tensor, list, tuple, dict)) and not isinstance(batch, list):
            return batch_len(first)
        return len(batch)
    return 1


def sample_in_process(loader: Any, batches: int = 2) -> dict[str, Any]:
    """Make a couple of batches without workers: bytes per batch and seconds per batch."""
    it = iter(in_process(loader))
    sizes, counts, times, lens = [], [], [], []
    for _ in range(batches):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        times.append(time.perf_counter() - t0)
        b, c = tensor_bytes(batch)
        sizes.append(b)
        counts.append(c)
        lens.append(batch_len(batch))
    del it
    if not sizes:
        return {"bytes": 0, "tensors": 0, "samples": 0, "seconds": None}
    return {"bytes": max(sizes), "tensors": max(counts), "samples": max(lens),
            "seconds": round(sum(times) / len(times), 5)}


class SampleFailed(Exception):
    """The dataset raised while making a batch; carries the user's traceback text."""

    def __init__(self, info: dict[str, Any]) -> None:
        super().__init__(info.get("message", ""))
        self.info = info


class SampleCrashed(Exception):
    """The forked process making a batch died (a signal or a hard exit)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"exit code {exitcode}")
        self.exitcode = exitcode


def _sample_to(loader: Any, conn: Any, batches: int) -> None:
    from .child import user_traceback

    try:
        conn.send({"ok": sample_in_process(loader, batches)})
    except BaseException as exc:  # noqa: BLE001 - the user's error, sent to the probe
        conn.send({"error": {"type": type(exc).__name__, "message": str(exc)[:2000],
                             "traceback": user_traceback(exc)[-8000:]}})


def sample_isolated(loader: Any, batches: int = 2) -> dict[str, Any]:
    """:func:`sample_in_process` in a forked copy of this process, so that whatever the dataset
    initialises on first use (thread pools, handles, caches) is not there when the real workers
    fork, just as in the user's run. Raises :class:`SampleFailed` / :class:`SampleCrashed`."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_sample_to, args=(loader, send, batches), daemon=True)
    proc.start()
    send.close()
    try:
        msg = recv.recv()
    except EOFError:
        msg = None
    proc.join()
    if msg is None:
        raise SampleCrashed(proc.exitcode)
    if "error" in msg:
        raise SampleFailed(msg["error"])
    return dict(msg["ok"])


def bare_worker_threads(loader: Any) -> int | None:
    """Threads of a worker that does nothing, started like this loader's (its start method, the
    current sharing strategy): main thread, queue feeder, descriptor sharer, torch's own."""
    import torch
    from torch.utils.data import DataLoader

    bare: Any = DataLoader([torch.zeros(1)] * 4, batch_size=1, num_workers=1,  # type: ignore[arg-type]
                      multiprocessing_context=loader.multiprocessing_context)
    it = iter(bare)
    try:
        next(it)
        next(it)
        pid = it._workers[0].pid
        return proc_threads(pid)
    finally:
        it._shutdown_workers()


def proc_memory(pid: int) -> dict[str, int] | None:
    """RSS, PSS and USS (private clean + dirty) of a process, in bytes, from smaps_rollup."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if rest.strip().endswith("kB"):
                    fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return {"rss": fields.get("Rss", 0), "pss": fields.get("Pss", 0), "uss": uss}


def proc_threads(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


class _Workers:
    """Per-worker memory and thread samples over the run."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.first: dict[int, dict[str, int]] = {}
        self.last: dict[int, dict[str, int]] = {}
        self.threads: dict[int, int] = {}
        self.samples = 0

    def sample(self) -> None:
        self.samples += 1
        for pid in self.pids:
            mem = proc_memory(pid)
            if mem is not None:
                self.first.setdefault(pid, mem)
                self.last[pid] = mem
            n = proc_threads(pid)
            if n is not None:
                self.threads[pid] = max(self.threads.get(pid, 0), n)

    def report(self) -> list[dict[str, Any]]:
        out = []
        for pid in self.pids:
            a, b = self.first.get(pid), self.last.get(pid)
            out.append({"pid": pid, "threads": self.threads.get(pid),
                        "uss_first": a and a["uss"], "uss_last": b and b["uss"],
                        "pss_first": a and a["pss"], "pss_last": b and b["pss"],
                        "rss_last": b and b["rss"]})
        return out


def run_workers(loader: Any, batches: int, emit: Emit | None = None) -> dict[str, Any]:
    """Start the real workers, fetch up to ``batches`` batches, measure; the workers are shut down after."""
    t0 = time.perf_counter()
    it = iter(loader)
    started = time.perf_counter() - t0
    pids = [int(w.pid) for w in getattr(it, "_workers", []) if w.pid]
    workers = _Workers(pids)
    stamps: list[float] = []
    samples = 0
    try:
        for i in range(max(1, batches)):
            try:
                batch = next(it)
            except StopIteration:
                break
            stamps.append(time.perf_counter() - t0)
            samples += batch_len(batch)
            del batch
            workers.sample()
            if emit is not None:
                emit("progress", {"phase": "live", "batch": i + 1, "of": batches})
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del it
        gc.collect()
    steady = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 and stamps[-1] > stamps[0] else None
    return {
        "ran": True,
        "start_seconds": round(started, 4),
        "first_batch_seconds": round(stamps[0], 4) if stamps else None,
        "batches": len(stamps),
        "samples": samples,
        "seconds": round(stamps[-1], 4) if stamps else None,
        "batches_per_s": round(steady, 3) if steady else None,
        "samples_per_s": round(steady * samples / len(stamps), 2) if steady else None,
        "memory_samples": workers.samples,
        "workers": workers.report(),
    }
