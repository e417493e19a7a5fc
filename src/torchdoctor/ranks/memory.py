"""Rank-local memory: each rank's peak, sampled cheaply, gathered rarely, judged by one pure rule.

The classic distributed memory bug is one rank holding more than the others: rank 0 logs,
evaluates, accumulates metrics and saves checkpoints, and whatever it keeps grows on rank 0 alone
until that rank alone runs out (and the others fail with a "connection closed by peer" that hides
why). :class:`MemoryTracker` makes it visible before the crash::

    tracker = MemoryTracker(every=10)                  # host memory; device="cuda" for the GPU's
    for step, batch in enumerate(loader):
        ...
        tracker.sample(step)                           # no collective: reads /proc/self/status
        if step % 500 == 0:
            report = tracker.gather()                  # one collective: the same report on every rank
            if report.finding and rank == 0:
                print(report.render())                 # TD277 host-oom: rank 0's peak host memory ...

:func:`memory_imbalance` is the rule (pure, no torch): one rank's peak at least ``ratio`` times the
median of the others' peaks and at least ``min_excess_bytes`` above it.

Peaks: host memory is the process's peak resident set (``VmHWM`` in ``/proc/self/status``, with
``VmRSS`` as the current value; ``getrusage`` where there is no /proc); GPU memory is
``torch.cuda.max_memory_allocated`` / ``memory_allocated`` of the device (tensors only, not the
caching allocator's reserve). Unique set size (USS, pages only this process holds) would be fairer
to forked DataLoader workers' parents but costs a walk of ``/proc/self/smaps``: not sampled.

Samples stay small: a rank keeps a sample when its peak changed, plus the newest one (a plateau
is its first and last sample), and at most :data:`MAX_SAMPLES` (thinned by halves past that). A
gather sends each rank's kept samples with one ``all_gather_object`` (pickled: ranks may hold
different numbers of samples, which a fixed-size tensor gather would have to pad).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import positive_count
from ..units import human_bytes

HOST_CODE = "TD277"
CUDA_CODE = "TD366"
RATIO = 1.5
"""A rank's peak must be at least this many times the median of the others' peaks..."""
MIN_EXCESS_BYTES = 64 << 20
"""... and at least this far above it: small processes differ by a few MiB without meaning anything."""
EDGE_FRACTION = 0.1
"""The growth is taken to start at the last sample still within this fraction of the excess above the
others' level (a rank a few MiB above the others from the start has not started growing), and to end
at the first sample within this fraction of its highest peak (a few pages more later on are not growth)."""
MAX_SAMPLES = 512
"""Samples a rank keeps; past it every other interior sample is dropped (first and newest kept)."""
STATUS = "/proc/self/status"


@dataclass(frozen=True)
class Imbalance:
    """One rank whose peak memory is far above the others'."""

    rank: int
    peak_bytes: int
    others_median_bytes: int
    ratio: float
    """``peak_bytes / others_median_bytes``."""
    grew_from_step: int
    """The last sampled step at which its peak was still at the others' level (its first sample if never)."""
    grew_to_step: int
    """The first sampled step at which its peak was at its highest (within a tenth of the excess)."""
    code: str
    """TD277 (host memory) or TD366 (GPU memory)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "peak_bytes": self.peak_bytes,
            "others_median_bytes": self.others_median_bytes,
            "ratio": round(self.ratio, 3),
            "grew_from_step": self.grew_from_step,
            "grew_to_step": self.grew_to_step,
            "code": self.code,
        }


@dataclass(frozen=True)
class MemoryReport:
    """Every rank's peak and samples, and the imbalance if there is one; the same on every rank."""

    world_size: int
    kind: str
    """``host`` or ``cuda``."""
    peaks: dict[int, int]
    """rank -> its highest sampled peak, in bytes."""
    samples: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """rank -> ``(step, peak_bytes)`` samples kept by that rank (see the module doc)."""
    finding: Imbalance | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "kind": self.kind,
            "peaks": {str(r): p for r, p in sorted(self.peaks.items())},
            "samples": {str(r): [list(s) for s in ss] for r, ss in sorted(self.samples.items())},
            "finding": self.finding.to_dict() if self.finding else None,
            "code": self.finding.code if self.finding else None,
        }

    def render(self) -> str:
        """``TD277 host-oom: rank R's peak host memory ...`` then the peaks per rank; without a finding,
        one line of peaks."""
        what = "GPU" if self.kind == "cuda" else "host"
        peaks = ", ".join(f"rank {r} {human_bytes(p)}" for r, p in sorted(self.peaks.items()))
        summary = f"peak {what} memory per rank: {peaks}"
        if self.finding is None:
            return f"memory: {summary}; no rank far above the others"
        from ..catalogue.log_ranks import TD277
        from ..catalogue.ranks_gpu import TD366

        f = self.finding
        code = TD366 if f.code == CUDA_CODE else TD277
        text = code.message.format(
            rank=f.rank,
            peak=human_bytes(f.peak_bytes),
            ratio=f"{f.ratio:.1f}",
            others=human_bytes(f.others_median_bytes),
            first_step=f.grew_from_step,
            last_step=f.grew_to_step,
        )
        return f"{code.code} {code.family}: {text}\nmemory: {summary}"


def _level_crossing(samples: list[tuple[int, int]], level: float, top: float) -> tuple[int, int]:
    """(last step still at most ``level``, first step at least ``top``) of samples sorted by step."""
    start = samples[0][0]
    for step, peak in samples:
        if peak <= level:
            start = step
        if peak >= top:
            return start, step
    return start, samples[-1][0]


def memory_imbalance(
    samples: Mapping[int, Sequence[tuple[int, int]]],
    *,
    kind: str = "host",
    ratio: float = RATIO,
    min_excess_bytes: int = MIN_EXCESS_BYTES,
) -> Imbalance | None:
    """The rank whose peak is far above the others', or None. Pure: ``samples`` is rank -> ``(step,
    peak_bytes)`` pairs; ranks without samples are left out, and fewer than two ranks never imbalance.

    The rank with the highest peak (the lowest rank on a tie) is named when its peak is at least
    ``ratio`` x the median of the other ranks' peaks and exceeds it by at least ``min_excess_bytes``.
    Its step range runs from the last sample where its peak was still at the others' level to the
    first sample where it was at its highest, both within :data:`EDGE_FRACTION` of the excess.
    """
    peaks = {r: max(p for _, p in ss) for r, ss in samples.items() if ss}
    if len(peaks) < 2:
        return None
    rank = max(sorted(peaks), key=lambda r: peaks[r])
    top = peaks[rank]
    others = statistics.median(p for r, p in peaks.items() if r != rank)
    if top - others < min_excess_bytes or top < ratio * others:
        return None
    edge = EDGE_FRACTION * (top - others)
    first, last = _level_crossing(sorted(samples[rank]), others + edge, top - edge)
    return Imbalance(
        rank=rank,
        peak_bytes=top,
        others_median_bytes=int(others),
        ratio=top / others if others > 0 else float("inf"),
        grew_from_step=first,
        grew_to_step=last,
        code=CUDA_CODE if kind == "cuda" else HOST_CODE,
    )


# -- reading the peak ---------------------------------------------------------------------------------


def _is_cuda(device: Any) -> bool:
    return device is not None and str(device).startswith("cuda")


def _proc_status(path: str = STATUS) -> tuple[int, int] | None:
    """(VmHWM, VmRSS) in bytes from a ``/proc/<pid>/status`` file, or None without one."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(rest.split()[0]) * 1024  # "VmHWM:   123456 kB"
    if "VmHWM" not in values or "VmRSS" not in values:
        return None
    return values["VmHWM"], values["VmRSS"]


def peak_memory(device: Any = None) -> dict[str, Any]:
    """This process's peak and current memory: ``{"kind", "peak_bytes", "current_bytes", "source"}``.

    ``device`` None or a CPU device: host memory (``VmHWM``/``VmRSS``, else ``getrusage`` and psutil).
    A CUDA device (``"cuda"``, ``"cuda:1"``, a ``torch.device``): ``torch.cuda.max_memory_allocated``
    and ``memory_allocated`` of it. Never initialises CUDA for a host reading.
    """
    if _is_cuda(device):
        import torch

        return {
            "kind": "cuda",
            "peak_bytes": int(torch.cuda.max_memory_allocated(device)),
            "current_bytes": int(torch.cuda.memory_allocated(device)),
            "source": f"torch.cuda.max_memory_allocated/memory_allocated({device})",
        }
    status = _proc_status()
    if status is not None:
        return {"kind": "host", "peak_bytes": status[0], "current_bytes": status[1], "source": f"{STATUS} VmHWM/VmRSS"}
    import resource
    import sys

    import psutil

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, KiB elsewhere
    return {
        "kind": "host",
        "peak_bytes": int(peak),
        "current_bytes": int(psutil.Process(os.getpid()).memory_info().rss),
        "source": "getrusage ru_maxrss / psutil rss",
    }


_status_fd: tuple[int, int] | None = None  # (pid, descriptor of that process's /proc/self/status)
_statm_fd: tuple[int, int] | None = None  # (pid, descriptor of /proc/self/statm)
_rusage_trusted: int | None = None  # the pid whose getrusage high-water mark was found to be its own
RUSAGE_SLACK = 4 << 20
"""How far ``getrusage``'s high-water mark may be above ``VmHWM`` and still count as this process's own (the
kernel's RSS counters are per CPU and lag a little)."""


def _reopen(held: tuple[int, int] | None, path: str) -> tuple[int, int]:
    pid = os.getpid()
    if held is None or held[0] != pid:
        held = (pid, os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
    return held


def _status_sample() -> tuple[int, int] | None:
    """(VmHWM, VmRSS) in bytes from ``/proc/self/status``, read through a descriptor kept open (reopened after a
    fork), its two fields found without parsing the rest."""
    global _status_fd
    try:
        _status_fd = _reopen(_status_fd, STATUS)
        text = os.pread(_status_fd[1], 4096, 0)
        hwm = text.index(b"VmHWM:")
        rss = text.index(b"VmRSS:")
        return int(text[hwm + 6 : text.index(b"kB", hwm)]) * 1024, int(text[rss + 6 : text.index(b"kB", rss)]) * 1024
    except (OSError, ValueError):
        return None


def _host_sample() -> tuple[int, int] | None:
    """This process's (peak, current) resident bytes, cheaply enough for every few steps; None without /proc.

    ``/proc/self/status`` costs about 9 us a read (the kernel formats some fifty fields); ``getrusage``'s high-water
    mark and ``/proc/self/statm``'s resident pages cost about 3.5 us together. But after a fork and exec,
    ``getrusage`` can report the parent's size (the kernel carries the old image's mark across exec), so it is
    trusted only once it has been seen at most :data:`RUSAGE_SLACK` above ``VmHWM``: from then on the mark is this
    process's own (it only grows, and so does the inherited value it overtook). Until then, and after each fork,
    ``/proc/self/status`` is read."""
    global _rusage_trusted, _statm_fd
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows: no /proc either
        return None

    pid = os.getpid()
    if _rusage_trusted == pid:
        try:
            _statm_fd = _reopen(_statm_fd, "/proc/self/statm")
            resident = int(os.pread(_statm_fd[1], 128, 0).split()[1]) * _PAGE
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
            return max(peak, resident), resident
        except (OSError, ValueError, IndexError):
            return _status_sample()
    status = _status_sample()
    if status is not None and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 <= status[0] + RUSAGE_SLACK:
        _rusage_trusted = pid
    return status


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


# -- sampling and gathering ---------------------------------------------------------------------------


def _thin(samples: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Every other interior sample dropped; the first and the newest kept."""
    return [samples[0]] + samples[1:-1][1::2] + [samples[-1]]


class MemoryTracker:
    """Samples this rank's peak memory every ``every`` steps; :meth:`gather` judges all ranks at once."""

    def __init__(
        self,
        *,
        every: int = 1,
        device: Any = None,
        ratio: float = RATIO,
        min_excess_bytes: int = MIN_EXCESS_BYTES,
    ) -> None:
        positive_count("every", every)
        self.every = every
        self.device = device
        self.ratio = ratio
        self.min_excess_bytes = min_excess_bytes
        """The thresholds :meth:`gather` passes to :func:`memory_imbalance`."""
        self.kind = "cuda" if _is_cuda(device) else "host"
        self.samples: list[tuple[int, int, int]] = []
        """Kept ``(step, peak_bytes, current_bytes)`` samples of this rank (see the module doc)."""

    def sample(self, step: int) -> None:
        """Record ``(step, peak, current)`` when ``step % every == 0``. No collective; a file read."""
        if step % self.every:
            return
        fast = _host_sample() if self.kind == "host" else None
        if fast is not None:
            new = (step, *fast)
        else:
            reading = peak_memory(self.device)
            new = (step, reading["peak_bytes"], reading["current_bytes"])
        kept = self.samples
        if len(kept) >= 2 and kept[-1][1] == new[1] and kept[-2][1] == new[1]:
            kept[-1] = new  # the same plateau: move its end
        else:
            kept.append(new)
        if len(kept) > MAX_SAMPLES:
            self.samples = _thin(kept)

    def gather(self, group: Any = None) -> MemoryReport:
        """Every rank's samples to every rank (one ``all_gather_object``), judged by :func:`memory_imbalance`.
        Call it on every rank of ``group`` at the same step. Outside a process group: this rank alone."""
        mine = [(step, peak) for step, peak, _ in self.samples]
        world, ranks, gathered = 1, [0], [mine]
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch without distributed
            dist = None  # type: ignore[assignment]
        if dist is not None and dist.is_available() and (group is not None or dist.is_initialized()):
            world = dist.get_world_size(group)
            ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
            gathered = [None] * world  # type: ignore[list-item]
            dist.all_gather_object(gathered, mine, group=group)
        samples = {ranks[i]: [(int(s), int(p)) for s, p in ss] for i, ss in enumerate(gathered)}
        peaks = {r: max((p for _, p in ss), default=0) for r, ss in samples.items()}
        finding = memory_imbalance(samples, kind=self.kind, ratio=self.ratio, min_excess_bytes=self.min_excess_bytes)
        return MemoryReport(world_size=world, kind=self.kind, peaks=peaks, samples=samples, finding=finding)
