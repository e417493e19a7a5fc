"""Throughput of a DataLoader, measured one way for the live run and for every setting the tuner tries.

:func:`measure_rate` iterates a loader and times a *steady window*: the clock starts after the
first batch (worker start-up, the first batch's latency) and after the batches the workers
prefetched while that first batch was awaited (``num_workers × prefetch_factor``: they arrive
at once and would inflate the rate), and runs for at least ``seconds``. When an epoch ends inside
the window the loader is iterated again, as in training, but the restart (new workers, their first
batch and prefetched batches again) is kept out of the window and reported apart
(``restart_seconds``): the rate is the loader's, the restart its own cost. So that a short epoch
does not cost a restart each time, a loader whose workers are not persistent continues on a twin
with ``persistent_workers=True`` (same dataset, sampler, collate_fn, …): one restart in all.

Samples are counted with :func:`batch_size_of`, which finds the batch size in any collated
structure (``(x, y)`` tuples collate to a list ``[x_batch, y_batch]``: two items, sixteen samples).

The window is also cut into :data:`PARTS` consecutive parts with a rate each, so that one run says
whether its own readings agree (the tuner repeats a setting whose readings do not).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import Any

#: The window is cut into this many consecutive parts, each with its own rate …
PARTS = 3
#: … when it holds at least this many batches per part (else one part: the whole window).
MIN_PART_BATCHES = 5
#: Depth to which a batch's structure is searched for its size.
MAX_DEPTH = 16

OnBatch = Callable[[int, Any], None]


# -- batch size --------------------------------------------------------------------------------


def _children(obj: Any) -> list[Any] | None:
    """The items of a container a collate function returns, or None for a leaf."""
    if isinstance(obj, Mapping):
        return list(obj.values())
    if isinstance(obj, (list, tuple)):  # namedtuples included
        return list(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    return None


def _leading(obj: Any) -> int | None:
    """The leading dimension of a tensor or an array (numpy, …): 1 for a 0-d one; None for anything else."""
    shape = getattr(obj, "shape", None)
    if shape is None or isinstance(obj, type) or not hasattr(obj, "dtype"):
        return None
    try:
        dims = tuple(shape)
        return int(dims[0]) if dims else 1
    except Exception:  # noqa: BLE001 - e.g. a nested tensor, whose shape is not a plain tuple
        return None


def _is_leaf(obj: Any) -> bool:
    return _leading(obj) is None and _children(obj) is None


def _path_to(batch: Any, want_array: bool) -> tuple[list[int], int | None] | None:
    """Depth-first, in order: the lengths of the sequences (list/tuple) on the path to the first array
    and that array's leading dimension (``want_array``), or to the first sequence that directly holds
    plain values (strings, numbers), that sequence included."""
    stack: list[tuple[Any, list[int], int]] = [(batch, [], 0)]
    while stack:
        obj, lens, depth = stack.pop()
        lead = _leading(obj)
        if lead is not None:
            if want_array:
                return lens, lead
            continue
        kids = _children(obj) if depth < MAX_DEPTH else None
        if kids is None:
            continue
        here = lens + [len(kids)] if isinstance(obj, (list, tuple)) else lens
        if not want_array and here is not lens and any(_is_leaf(k) for k in kids):
            return here, None
        stack.extend((k, here, depth + 1) for k in reversed(kids))
    return None


def batch_size_of(batch: Any, hint: int | None = None) -> int:
    """Samples in a batch, for any nesting of tuples, lists, dicts, dataclasses and namedtuples.

    The leading dimension of the first tensor (or array) found, depth-first: what default_collate
    makes of ``(x, y)`` samples (``[x_batch, y_batch]``), of dicts and of nested structures. Without
    a tensor, the length of the first list or tuple that holds plain values (a collated list of
    strings). ``hint`` (the loader's ``batch_size``) settles a custom collate's ambiguity: when a
    sequence on the path to that tensor has exactly ``hint`` items and the tensor's leading dimension
    is not ``hint`` (a list of per-sample tensors, ``collate_fn=lambda b: b``), the sequence is the
    batch. A bare value (a string, a number) is one sample; an empty container none.
    """
    candidates: list[int]
    found = _path_to(batch, want_array=True)
    if found is not None:
        lens, lead = found
        candidates = [lead or 0] + lens[::-1]
    else:
        found = _path_to(batch, want_array=False)
        if found is None:  # nothing but containers (or a bare value): a sequence's items, else one sample
            return len(batch) if isinstance(batch, (list, tuple)) else 1
        lens, _ = found
        candidates = lens[::-1]
    if hint is not None and candidates[0] != hint and hint in candidates:
        return hint
    return candidates[0]


def tensor_bytes(batch: Any, depth: int = 0) -> tuple[int, int]:
    """(bytes in tensors, number of tensors) of a batch: what workers hand over through shared memory."""
    import torch

    if depth > MAX_DEPTH:
        return 0, 0
    if isinstance(batch, torch.Tensor):
        return (
            batch.untyped_storage().nbytes() if batch.layout == torch.strided else batch.element_size() * batch.numel(),
            1,
        )
    kids = _children(batch)
    if kids is None:
        return 0, 0
    total = count = 0
    for item in kids:
        b, c = tensor_bytes(item, depth + 1)
        total += b
        count += c
    return total, count


# -- the measurement -----------------------------------------------------------------------------


@dataclass
class Rate:
    """One run of :func:`measure_rate`."""

    samples_per_s: float | None = None
    """Samples per second over the steady window (None: the loader yielded nothing)."""
    batches_per_s: float | None = None
    parts: list[float] = field(default_factory=list)
    """Samples per second of each consecutive part of the window (one part when it is short)."""
    start_seconds: float = 0.0
    """``iter(loader)``: creating the iterator, which starts the workers."""
    first_batch_seconds: float | None = None
    """From ``iter(loader)`` to the first batch."""
    batches: int = 0
    """Batches fetched in all (warm-up, window, restarts)."""
    samples: int = 0
    window_batches: int = 0
    window_samples: int = 0
    window_seconds: float = 0.0
    wall_seconds: float = 0.0
    epochs: int = 0
    """Epoch ends met: each restarted the iterator (and the workers unless persistent)."""
    restart_seconds: float | None = None
    """Median time from a restart's ``iter()`` to its first batch."""
    steady: bool = True
    """False when no batch was left for a steady window: the rate then counts from the first batch."""
    shutdown_error: str | None = None
    """A worker that died while being shut down, after the measurement (torch's message)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples_per_s": self.samples_per_s,
            "batches_per_s": self.batches_per_s,
            "parts": self.parts,
            "start_seconds": round(self.start_seconds, 4),
            "first_batch_seconds": None if self.first_batch_seconds is None else round(self.first_batch_seconds, 4),
            "batches_fetched": self.batches,
            "samples_fetched": self.samples,
            "window_batches": self.window_batches,
            "window_samples": self.window_samples,
            "window_seconds": round(self.window_seconds, 4),
            "wall_seconds": round(self.wall_seconds, 3),
            "epoch_restarts": self.epochs,
            "restart_seconds": None if self.restart_seconds is None else round(self.restart_seconds, 4),
            "steady": self.steady,
            "shutdown_error": self.shutdown_error,
        }


def prefetched(loader: Any) -> int:
    """Batches the workers have in flight when the first one arrives (``num_workers × prefetch_factor``),
    kept to half an epoch so that a short epoch still leaves batches to time."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    n = workers * int(getattr(loader, "prefetch_factor", None) or 0) if workers else 0
    try:
        n = min(n, max(0, (len(loader) - 1) // 2))
    except TypeError:  # an IterableDataset without __len__
        pass
    return n


def _shutdown(loader: Any, it: Any) -> str | None:
    """Shut the workers down; a worker that dies on its way out (after the last batch was measured) is
    returned as text, not raised: the measurement stands."""
    if getattr(loader, "_iterator", None) is it:  # a persistent loader keeps its iterator: not a shut one
        loader._iterator = None
    stop = getattr(it, "_shutdown_workers", None)
    if stop is None:
        return None
    try:
        stop()
    except RuntimeError as exc:  # torch's SIGCHLD handler: "DataLoader worker (pid N) is killed by signal: …"
        if "DataLoader worker" not in str(exc):
            raise
        return str(exc).strip()
    return None


def measure_rate(
    loader: Any,
    seconds: float,
    *,
    min_batches: int = 1,
    follow: int = 0,
    hint: int | None = None,
    max_seconds: float | None = None,
    on_batch: OnBatch | None = None,
    at_end: OnBatch | None = None,
) -> Rate:
    """Iterate ``loader`` and measure its steady throughput over at least ``seconds`` and ``min_batches``.

    ``follow``: batches of the first epoch to hand to ``on_batch(n, iterator)`` (``n`` counts from 1),
    all before the window (they extend the warm-up), so that what the caller does with them (reading
    the workers' memory) is not timed. ``at_end(n, iterator)`` is called after the window, before the
    workers are shut down. ``hint``: the batch size for :func:`batch_size_of` (default: the loader's).
    ``max_seconds`` (default ``max(10, 10 × seconds)``) bounds the run after the first batch, restarts
    (waits for a new epoch's first batch) excepted.
    """
    clock = time.perf_counter
    if hint is None:
        hint = getattr(loader, "batch_size", None)
    limit = max_seconds if max_seconds is not None else max(10.0, 10 * seconds)
    warm = prefetched(loader)
    first_warm = warm
    if follow > 1:
        try:
            room = max(0, len(loader) - 2)
        except TypeError:
            room = follow
        first_warm = max(warm, min(follow - 1, room))
    r = Rate()
    steps: list[tuple[float, int]] = []
    restarts: list[float] = []
    t0 = clock()
    it = iter(loader)
    first_it = it
    r.start_seconds = clock() - t0
    try:
        try:
            batch = next(it)
        except StopIteration:
            r.wall_seconds = clock() - t0
            return r
        t_first = clock()
        r.first_batch_seconds = t_first - t0
        r.batches, r.samples = 1, batch_size_of(batch, hint)
        first_samples = r.samples
        del batch
        if on_batch is not None and follow > 0:
            on_batch(1, it)
        skip, window, last, idle = first_warm, 0.0, clock(), 0
        in_epoch = 0
        while True:
            try:
                batch = next(it)
            except StopIteration:
                r.epochs += 1
                idle = idle + 1 if in_epoch == 0 else 0
                if idle >= 2:  # epochs too short for the warm-up: time them whole
                    warm = 0
                if idle >= 4:  # epochs of a single batch: nothing steady to time (counted from the first)
                    break
                in_epoch = 0  # (the finished iterator has shut its workers down, unless they are persistent)
                t_restart = clock()
                if getattr(loader, "num_workers", 0) and not getattr(loader, "persistent_workers", True):
                    from .target import rebuild

                    loader = rebuild(loader, persistent_workers=True)  # one restart, not one per epoch
                it = iter(loader)
                try:
                    batch = next(it)
                except StopIteration:
                    break
                restarts.append(clock() - t_restart)
                n = batch_size_of(batch, hint)
                del batch
                r.batches += 1
                r.samples += n
                skip, last = warm, clock()
                if clock() - t_first - sum(restarts) >= limit:
                    break
                continue
            now = clock()
            n = batch_size_of(batch, hint)
            del batch
            r.batches += 1
            r.samples += n
            if skip > 0:
                skip -= 1
                if on_batch is not None and it is first_it and r.batches <= follow:
                    on_batch(r.batches, it)
                last = clock()  # the window starts after the last warm-up batch (and the caller's work)
                if now - t_first - sum(restarts) >= limit:
                    break
                continue
            steps.append((now - last, n))
            window += now - last
            last = now
            in_epoch += 1
            if (window >= seconds and len(steps) >= min_batches) or now - t_first - sum(restarts) >= limit:
                break
        if at_end is not None:
            at_end(r.batches, it)
    finally:
        r.shutdown_error = _shutdown(loader, it)
        r.wall_seconds = clock() - t0
    r.restart_seconds = median(restarts) if restarts else None
    if steps and window > 0:
        r.window_batches, r.window_samples, r.window_seconds = len(steps), sum(n for _, n in steps), window
        r.samples_per_s = round(r.window_samples / window, 2)
        r.batches_per_s = round(len(steps) / window, 3)
        r.parts = _parts(steps)
    elif r.batches > 1 and r.first_batch_seconds is not None:  # nothing after the warm-up: count from the first
        r.steady = False
        span = r.wall_seconds - r.first_batch_seconds
        if span > 0:
            r.samples_per_s = round((r.samples - first_samples) / span, 2)
            r.batches_per_s = round((r.batches - 1) / span, 3)
            r.parts = [r.samples_per_s]
    return r


def _parts(steps: list[tuple[float, int]]) -> list[float]:
    k = PARTS if len(steps) >= PARTS * MIN_PART_BATCHES else 1
    size, out = len(steps) / k, []
    for i in range(k):
        chunk = steps[round(i * size) : round((i + 1) * size)]
        dt = sum(d for d, _ in chunk)
        out.append(round(sum(n for _, n in chunk) / dt, 2) if dt > 0 else 0.0)
    return out
