"""Run the loader for real, briefly, and measure it (probe child only).

* one batch made in this process (no workers, nothing shared): its bytes and the time it takes;
* then the real workers: time to start them and to the first batch, each worker's memory
  (USS/PSS from ``/proc/PID/smaps_rollup``) and thread count over the first batches and again
  after the throughput window (so copy-on-write growth and thread pools show up), and the
  throughput measured by :func:`.rate.measure_rate`, exactly as the tuner measures each setting.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import Any

from ..facts.procs import proc_memory
from .rate import Rate, batch_size_of, measure_rate, tensor_bytes
from .target import in_process

Emit = Callable[[str, dict[str, Any]], None]


def sample_in_process(loader: Any, batches: int = 2) -> dict[str, Any]:
    """Make a couple of batches without workers: bytes per batch and seconds per batch."""
    hint = getattr(loader, "batch_size", None)
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
        lens.append(batch_size_of(batch, hint))
    del it
    if not sizes:
        return {"bytes": 0, "tensors": 0, "samples": 0, "seconds": None}
    return {
        "bytes": max(sizes),
        "tensors": max(counts),
        "samples": max(lens),
        "seconds": round(sum(times) / len(times), 5),
    }


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
        conn.send(
            {
                "error": {
                    "type": type(exc).__name__,
                    "message": str(exc)[:2000],
                    "traceback": user_traceback(exc)[-8000:],
                }
            }
        )


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

    bare: Any = DataLoader(
        [torch.zeros(1)] * 4,  # type: ignore[arg-type]
        batch_size=1,
        num_workers=1,
        multiprocessing_context=loader.multiprocessing_context,
    )
    it = iter(bare)
    try:
        next(it)
        next(it)
        pid = it._workers[0].pid
        return proc_threads(pid)
    finally:
        it._shutdown_workers()


def proc_threads(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


class _Workers:
    """Per-worker memory and thread samples: the workers the run started, followed while they live."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.first: dict[int, dict[str, int]] = {}
        self.last: dict[int, dict[str, int]] = {}
        self.threads: dict[int, int] = {}
        self.samples = 0
        self.followed = 0
        """Batches fetched from the first memory sample to the last (TD532's growth is over these)."""

    def sample(self, n: int, it: Any) -> None:
        if not self.pids:
            self.pids = [int(w.pid) for w in getattr(it, "_workers", []) if w.pid]
        seen = False
        for pid in self.pids:
            mem = proc_memory(pid)
            if mem is not None:
                seen = True
                self.first.setdefault(pid, mem)
                self.last[pid] = mem
            threads = proc_threads(pid)
            if threads is not None:
                self.threads[pid] = max(self.threads.get(pid, 0), threads)
        if seen:
            self.samples += 1
            self.followed = n

    def report(self) -> list[dict[str, Any]]:
        out = []
        for pid in self.pids:
            a, b = self.first.get(pid), self.last.get(pid)
            out.append(
                {
                    "pid": pid,
                    "threads": self.threads.get(pid),
                    "uss_first": a and a["uss"],
                    "uss_last": b and b["uss"],
                    "pss_first": a and a["pss"],
                    "pss_last": b and b["pss"],
                    "rss_last": b and b["rss"],
                }
            )
        return out


def _epoch(loader: Any, rate: Rate) -> dict[str, Any]:
    """An epoch as a training loop sees it: the dataset at the steady rate, plus, when the workers are not
    persistent, their restart (start-up and first batch, paid again every epoch)."""
    try:
        n = len(loader.dataset)
    except TypeError:
        return {}
    if not n or not rate.samples_per_s:
        return {}
    restart = 0.0 if loader.persistent_workers else float(rate.first_batch_seconds or 0.0)
    epoch = n / rate.samples_per_s + restart
    return {
        "epoch_seconds": round(epoch, 3),
        "epoch_restart_seconds": round(restart, 4),
        "epoch_samples_per_s": round(n / epoch, 2),
    }


def run_workers(loader: Any, batches: int, seconds: float = 1.0, emit: Emit | None = None) -> dict[str, Any]:
    """Start the real workers and measure them: memory and threads over the first ``batches`` batches
    (and again after the window if the same workers still run), throughput with
    :func:`~.rate.measure_rate`, the tuner's own measure, over ``seconds``; the workers are shut down after."""
    workers = _Workers()
    first_it: list[Any] = []

    def on_batch(n: int, it: Any) -> None:
        if not first_it:
            first_it.append(it)
        workers.sample(n, it)
        if emit is not None:
            emit("progress", {"phase": "live", "batch": n, "of": batches})

    def at_end(n: int, it: Any) -> None:
        if first_it and it is first_it[0]:  # the same workers (same epoch, or persistent): their memory now
            workers.sample(n, it)

    try:
        rate: Rate = measure_rate(
            loader, seconds, min_batches=2, follow=max(1, batches), on_batch=on_batch, at_end=at_end
        )
    finally:
        gc.collect()
    return {
        **_epoch(loader, rate),
        "ran": True,
        "start_seconds": round(rate.start_seconds, 4),
        "first_batch_seconds": None if rate.first_batch_seconds is None else round(rate.first_batch_seconds, 4),
        "batches": workers.followed or rate.batches,
        "samples": rate.samples,
        "seconds": round(rate.wall_seconds, 4),
        "batches_per_s": rate.batches_per_s,
        "samples_per_s": rate.samples_per_s,
        "rate": rate.to_dict(),
        "memory_samples": workers.samples,
        "workers": workers.report(),
    }
