"""``check_in_sync``: do all ranks hold the same parameters and buffers? Checksums in one collective.

Every rank reduces its parameters and buffers to a digest (``n``, sum, sum of squares and a
position-weighted sum of each group, from one float64 copy: :func:`~.fingerprint.tensor_totals`) and
all_gathers a header of three numbers: the tensor count, a 52-bit hash of names, shapes and dtypes,
and a 52-bit hash of the digest. Equal headers: the ranks agree, one collective. Otherwise every
rank reduces each tensor to :data:`CHECKSUMS` float64 numbers on the tensor's own device (no copy
leaves the device but the result) and all_gathers them; every rank then runs the same pure rule,
:func:`compare`, on the same rank x tensor matrix (with a tolerance for last bits), so the same
:class:`SyncReport` exists on every rank (and ``raise_on_mismatch`` raises on all of them, never
leaving one rank waiting in a collective).

The checksums of a flattened tensor ``x`` viewed as rows of :data:`ROW` elements:

* ``sum``: catches most changes;
* ``sum of squares``: catches changes that keep the sum (a value moved between elements with a sign flip);
* two position-weighted sums, one over the position inside a row and one over the row number, with
  weights ``1 + frac(i * c)`` for two irrational ``c`` (distinct for every ``i``): values that trade
  places meet other weights, so a permutation changes one of them.

The structure in the header comes first: ranks that built different models would otherwise call the
second gather with tensors of other sizes. A structure that differs is reported as the tensor
``<structure>`` (the per-rank lists are then gathered with ``all_gather_object``, so the report says
where they part).

Cost, measured on this repository's development machine (2 cores shared by both ranks, no GPU,
torch 2.13.0 CPU, gloo over loopback, 2 ranks forked with one thread each, DDP-wrapped MLPs of 6
tensors, median of 20 calls after 5 warm-up calls, two runs, before the digest below):
330 k parameters 3.2-3.6 ms per call (training step on a batch of 256: 10 ms), 4.0 M parameters
15-17 ms (step 85-143 ms), 21 M parameters 29-30 ms (step 447-484 ms). Every 100 steps that is
0.06-0.35 % of the step time. The checksums grow with the parameter count (one float64 conversion and
three passes per element, in 4 MiB chunks), the gathers with the number of tensors (4 floats each).
Since session 9 the ranks first compare a digest (see above), and the per-tensor checksums are taken
only when the digests differ. Inside the Lightning benchmark's training loop
(``benchmarks/ranks_overhead.py``, a 74 k-parameter MLP, its digest taken from the fingerprint record
of the same step) a check costs about 0.4-0.5 ms, of which the start of the asynchronous gather is
about 65 us; it was 1.2 ms.

Not for sharded models (FSDP, DTensor): each rank holds another shard by design.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import TorchDoctorError

CODE = "TD469"
FAMILY = "rank-divergence"
STRUCTURE = "<structure>"
"""The name of the mismatch reported when ranks do not hold the same list of tensors."""
CHECKSUMS = ("sum", "sum_of_squares", "position_in_row", "row")
"""The numbers computed per tensor, in the order of each tensor's columns in the gathered matrix."""
ROW = 4093
"""Elements per row for the position-weighted sums (a prime: a shift by whole rows rarely aliases)."""
REL_TOL = 1e-10
"""Checksums closer than this, relative to the larger magnitude, count as equal: float64 sums of the same
float32 values may differ in their last bits between CPUs of another kind (vector width, thread count)."""
CHUNK_ROWS = 128
"""Rows of :data:`ROW` elements converted to float64 at a time (4 MiB): bounded memory, cache-sized passes."""
MAX_LINES = 20
"""Mismatch lines a report renders; the others are counted on one more line."""
_C1 = (math.sqrt(5) - 1) / 2  # weights 1 + frac(i * c): distinct for every i, spread over [1, 2)
_C2 = math.sqrt(2) - 1


@dataclass(frozen=True)
class Mismatch:
    """One tensor whose checksums are not the same on every rank."""

    name: str
    """``layer.0.weight``, ``buffer:bn.running_mean``, or :data:`STRUCTURE`."""
    ranks: tuple[int, ...]
    """Ranks whose value differs from the reference (the majority value; rank 0's on a tie)."""
    max_abs_diff: float
    """Largest |checksum difference| against the reference, over those ranks and the checksums. For a
    single element changed by ``d`` it is at least ``|d|``; for :data:`STRUCTURE` the difference in the
    number of tensors."""
    detail: str = ""
    """For :data:`STRUCTURE`: where the ranks' tensor lists first part."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "ranks": list(self.ranks), "max_abs_diff": self.max_abs_diff}
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass(frozen=True)
class SyncReport:
    """What :func:`check_in_sync` found; the same on every rank."""

    ok: bool
    world_size: int
    rank: int
    """The rank this report was made on (global rank)."""
    checked: int
    """Tensors compared (0 when the ranks hold different lists of tensors)."""
    mismatches: tuple[Mismatch, ...] = field(default_factory=tuple)
    """In module order: the first is the first tensor that differs."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "world_size": self.world_size,
            "rank": self.rank,
            "checked": self.checked,
            "mismatches": [m.to_dict() for m in self.mismatches],
            "code": None if self.ok else CODE,
        }

    def render(self) -> str:
        """One line per mismatch (``TD469 rank-divergence: NAME differs on rank(s) R ...``), at most
        :data:`MAX_LINES`; an ``ok`` report is one line without a code."""
        if self.ok:
            return f"check_in_sync: {self.checked} tensors identical on {self.world_size} ranks"
        from ..catalogue.log_ranks import TD469

        lines = []
        for m in self.mismatches[:MAX_LINES]:
            text = TD469.message.format(name=m.name, ranks=", ".join(map(str, m.ranks)), diff=f"{m.max_abs_diff:.3g}")
            lines.append(f"{TD469.code} {TD469.family}: {text}" + (f" {m.detail}" if m.detail else ""))
        more = len(self.mismatches) - MAX_LINES
        if more > 0:
            lines.append(f"check_in_sync: {more} more tensors differ")
        if self.checked:
            lines.append(
                f"check_in_sync: {len(self.mismatches)} of {self.checked} tensors differ between the "
                f"{self.world_size} ranks (reference: the value most ranks hold, rank 0's on a tie)"
            )
        return "\n".join(lines)


class RankDivergenceError(TorchDoctorError):
    """Raised on every rank by ``check_in_sync(..., raise_on_mismatch=True)``; the message is the report."""

    code = CODE

    def __init__(self, report: SyncReport) -> None:
        self.report = report
        super().__init__(report.render())


# -- the rule: pure, no torch ------------------------------------------------------------------------


def _same(a: float, b: float, rel_tol: float) -> bool:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return True
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return False
    return abs(a - b) <= rel_tol * max(abs(a), abs(b))


def _diff(a: float, b: float) -> float:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if math.isnan(a) or math.isnan(b):
        return math.inf
    return abs(a - b)


def _groups(values: Sequence[Sequence[float]], rel_tol: float) -> list[list[int]]:
    """Ranks grouped by equal values (each compared with its group's first rank), in order of first rank."""
    groups: list[list[int]] = []
    for r, v in enumerate(values):
        for g in groups:
            ref = values[g[0]]
            if all(_same(a, b, rel_tol) for a, b in zip(v, ref)):
                g.append(r)
                break
        else:
            groups.append([r])
    return groups


def _reference(groups: list[list[int]]) -> list[int]:
    """The largest group; when several are largest, rank 0's group."""
    size = max(len(g) for g in groups)
    largest = [g for g in groups if len(g) == size]
    return largest[0] if len(largest) == 1 else next(g for g in groups if 0 in g)


def compare(checksums: list[list[float]], names: list[str], *, rel_tol: float = REL_TOL) -> tuple[Mismatch, ...]:
    """The tensors whose checksums differ between ranks, in ``names`` order.

    ``checksums[r]`` is rank ``r``'s row: ``k`` numbers per name, name after name (``k =
    len(row) // len(names)``; :func:`check_in_sync` uses ``k = 4``). Per tensor, ranks whose numbers are
    all equal (within ``rel_tol`` of their magnitude; NaN equals NaN) share a value; the reference is the
    value most ranks share, or rank 0's when no value has a majority. Every other rank is named.
    """
    if not checksums or not names:
        return ()
    width = len(checksums[0])
    if any(len(row) != width for row in checksums):
        raise ValueError("every rank's row must hold the same number of checksums")
    if width % len(names):
        raise ValueError(f"{width} checksums per rank do not split evenly over {len(names)} names")
    k = width // len(names)
    out: list[Mismatch] = []
    for i, name in enumerate(names):
        values = [row[i * k : (i + 1) * k] for row in checksums]
        groups = _groups(values, rel_tol)
        if len(groups) == 1:
            continue
        ref_group = _reference(groups)
        ref = values[ref_group[0]]
        others = tuple(r for r in range(len(values)) if r not in ref_group)
        diff = max(_diff(a, b) for r in others for a, b in zip(values[r], ref))
        out.append(Mismatch(name, others, diff))
    return tuple(out)


def structure_mismatch(
    headers: list[tuple[int, int]], lists: list[list[str]] | None = None, labels: Sequence[int] | None = None
) -> Mismatch | None:
    """The :data:`STRUCTURE` mismatch when ranks' headers ``(tensor count, structure hash)`` differ, else
    None. ``lists`` (each rank's ``name shape dtype`` entries) let the detail say where they part;
    ``labels`` are the ranks' numbers (global ranks of a subgroup), positions by default."""
    as_rows = [[float(c), float(h)] for c, h in headers]
    found = compare(as_rows, [STRUCTURE], rel_tol=0.0)
    if not found:
        return None
    groups = _groups(as_rows, 0.0)
    ref_rank = _reference(groups)[0]
    m = found[0]
    label = list(labels) if labels is not None else list(range(len(headers)))
    count_diff = max(abs(headers[r][0] - headers[ref_rank][0]) for r in m.ranks)
    detail = ""
    if lists is not None:
        ref = lists[ref_rank]
        parts = []
        for r in m.ranks:
            mine = lists[r]
            at = next((i for i, (a, b) in enumerate(zip(mine, ref)) if a != b), min(len(mine), len(ref)))
            here = mine[at] if at < len(mine) else "nothing"
            there = ref[at] if at < len(ref) else "nothing"
            parts.append(
                f"rank {label[r]}: {len(mine)} tensors where rank {label[ref_rank]} has {len(ref)}; "
                f"tensor {at} is {here} where rank {label[ref_rank]} has {there}"
            )
        detail = "(" + "; ".join(parts) + ")"
    return Mismatch(STRUCTURE, tuple(label[r] for r in m.ranks), float(count_diff), detail)


# -- the collective: torch, imported here only --------------------------------------------------------


def _unwrap(module: Any) -> Any:
    """The user's module inside DDP/DataParallel (``.module``) and torch.compile (``._orig_mod``)."""
    while True:
        kind = type(module).__name__
        if kind in ("DistributedDataParallel", "DataParallel") and hasattr(module, "module"):
            module = module.module
        elif kind == "OptimizedModule" and hasattr(module, "_orig_mod"):
            module = module._orig_mod
        else:
            return module


def _tensors(module: Any, buffers: bool) -> list[tuple[str, Any]]:
    out = [(name, p) for name, p in module.named_parameters()]
    if buffers:
        out += [(f"buffer:{name}", b) for name, b in module.named_buffers()]
    return out


def _structure_entries(tensors: list[tuple[str, Any]]) -> list[str]:
    return [f"{name} {list(t.shape)} {str(t.dtype).replace('torch.', '')}" for name, t in tensors]


def _structure_hash(entries: list[str]) -> int:
    """52 bits of a hash of the entries: exact in a float64, so it travels in the gathered tensor."""
    digest = hashlib.blake2b("\n".join(entries).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 12


def _weights(start: int, stop: int, c: float, device: Any) -> Any:
    """Weights ``1 + frac(i * c)`` for ``i`` in ``[start, stop)``, float64 on ``device``."""
    import torch

    return torch.arange(start, stop, dtype=torch.float64, device=device).mul_(c).frac_().add_(1.0)


_first: dict[tuple[int, float, str], Any] = {}


def _first_weights(n: int, c: float, device: Any) -> Any:
    """``_weights(0, n, c, device)``, made once per device: the same values, without four small ops per
    tensor and check (what the check of a small model costs is mostly such ops, not arithmetic)."""
    key = (n, c, str(device))
    w = _first.get(key)
    if w is None:
        if len(_first) >= 8:
            _first.clear()
        w = _first[key] = _weights(0, n, c, device)
    return w


def checksums(t: Any) -> Any:
    """The :data:`CHECKSUMS` of one tensor, as a float64 tensor of 4 on its own device (MPS: on the CPU,
    which has float64).

    The tensor is read in chunks of :data:`CHUNK_ROWS` rows, each converted to float64 on its own, so
    the extra memory is one chunk (4 MiB), never a float64 copy of a large tensor, and each chunk is
    still in cache for the three passes over it. The chunk order is fixed: equal tensors give equal sums.
    """
    import torch

    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if x.device.type == "mps":
        x = x.cpu()
    x = x.reshape(-1)
    n, device = x.numel(), x.device
    in_row = _first_weights(ROW, _C1, device)
    col_sums = torch.zeros(ROW, dtype=torch.float64, device=device)
    acc = torch.zeros(2, dtype=torch.float64, device=device)  # the partial row's sum, the sum of squares
    weighted = torch.zeros(2, dtype=torch.float64, device=device)  # the two position-weighted sums
    chunk = CHUNK_ROWS * ROW
    for a in range(0, max(n, 1), chunk):
        xc = x[a : a + chunk].to(torch.float64)
        rows = xc.numel() // ROW
        first_row = a // ROW
        head, tail = xc[: rows * ROW].view(rows, ROW), xc[rows * ROW :]
        col_sums += head.sum(0)
        row_w = (
            _first_weights(CHUNK_ROWS + 1, _C2, device)
            if first_row == 0
            else _weights(first_row, first_row + rows + 1, _C2, device)
        )
        tail_sum = tail.sum()
        acc[0] += tail_sum
        acc[1] += torch.dot(xc, xc)
        weighted[0] += torch.dot(tail, in_row[: tail.numel()])
        weighted[1] += torch.dot(head.sum(1), row_w[:rows]) + tail_sum * row_w[rows]
    return torch.stack([col_sums.sum() + acc[0], acc[1], torch.dot(col_sums, in_row) + weighted[0], weighted[1]])


def _gather_device(group: Any, tensors: list[tuple[str, Any]]) -> Any:
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend(group))
    if "gloo" in backend or backend == "mpi":
        return torch.device("cpu")
    gpu = next((t.device for _, t in tensors if t.device.type != "cpu"), None)
    if gpu is not None:
        return gpu
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _all_gather(values: Any, group: Any, world: int) -> list[list[float]]:
    """One ``all_gather`` of a 1-D float64 tensor of the same length on every rank: rows of floats per rank."""
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(values) for _ in range(world)]
    dist.all_gather(parts, values, group=group)
    return torch.stack(parts).cpu().tolist()


def _stack(tensors: list[tuple[str, Any]], device: Any) -> Any:
    """Every tensor's checksums, concatenated on ``device`` with one transfer per source device."""
    import torch

    if not tensors:
        return torch.empty(0, dtype=torch.float64, device=device)
    by_device: dict[Any, list[Any]] = {}
    order: list[tuple[Any, int]] = []
    for _, t in tensors:
        sums = checksums(t)
        bucket = by_device.setdefault(sums.device, [])
        order.append((sums.device, len(bucket)))
        bucket.append(sums)
    moved = {d: torch.stack(ts).to(device) for d, ts in by_device.items()}
    return torch.cat([moved[d][i] for d, i in order])


def check_in_sync(
    module: Any, *, group: Any = None, buffers: bool = True, raise_on_mismatch: bool = False
) -> SyncReport:
    """Compare every parameter (and buffer) of ``module`` across the ranks of ``group``.

    Call it on every rank of the group at the same point (it is a collective), e.g. every N steps
    after ``optimizer.step()``. ``module`` may be wrapped in ``DistributedDataParallel`` (its
    ``.module`` is read). Outside a process group it checks nothing and reports world size 1, ok.
    With ``raise_on_mismatch`` a divergence raises :class:`RankDivergenceError` on every rank.
    """
    return start_check(module, group=group, buffers=buffers).report(raise_on_mismatch=raise_on_mismatch)


class SyncCheck:
    """A check started by :func:`start_check`: the ranks' digests are taken and their gather is on its way;
    :meth:`report` waits for it (and, only when the digests differ, takes and gathers every tensor's
    checksums to name the tensors). Every rank must call :meth:`report` at the same point, as for any
    collective.

    The digest: the parameters' and the buffers' ``{n, sum, sumsq, wsum}`` (:func:`~.fingerprint.tensor_totals`:
    one float64 copy and three reductions, cheaper than four reductions per tensor), hashed into the header
    with the structure. ``params_totals``: the parameters' totals already taken at this point (a
    :class:`~.fingerprint.RunRecorder` record of the same step), so they are not taken twice. When the digests
    differ, the per-tensor checksums are taken at :meth:`report`: a check read a step later (``DoctorCallback``)
    names the tensors that differ one step after the one whose digest differed (a divergence stays)."""

    def __init__(
        self, module: Any, *, group: Any = None, buffers: bool = True, params_totals: dict[str, Any] | None = None
    ) -> None:
        import torch

        inner = _unwrap(module)
        tensors = _tensors(inner, buffers)
        self.names = [name for name, _ in tensors]
        self.group = group
        self._tensors = tensors
        self._work: Any = None
        self._result: SyncReport | None = None
        dist = _distributed()
        if dist is None or (group is None and not dist.is_initialized()):
            self._result = SyncReport(ok=True, world_size=1, rank=0, checked=len(tensors))
            return
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank()
        self.ranks = dist.get_process_group_ranks(group) if group is not None else list(range(self.world))
        if self.world == 1:
            self._result = SyncReport(ok=True, world_size=1, rank=self.rank, checked=len(tensors))
            return
        self.device = _gather_device(group, tensors)
        self.entries = _structure_entries(tensors)
        with torch.no_grad():
            digest = _digest(tensors, params_totals)
        # one collective when the ranks agree (the usual case): the structure, and a hash of the digest; only
        # when the hashes differ are the per-tensor checksums taken and gathered, to name the tensors
        header = torch.tensor(
            [float(len(tensors)), float(_structure_hash(self.entries)), float(_values_hash(digest))],
            dtype=torch.float64,
            device=self.device,
        )
        self._parts = [torch.empty_like(header) for _ in range(self.world)]
        self._work = dist.all_gather(self._parts, header, group=group, async_op=True)

    def report(self, *, raise_on_mismatch: bool = False) -> SyncReport:
        """The report (the same on every rank); waits for the gather when it is still on its way."""
        if self._result is None:
            self._result = self._finish()
        if raise_on_mismatch and not self._result.ok:
            raise RankDivergenceError(self._result)
        return self._result

    def _finish(self) -> SyncReport:
        import torch

        dist = _distributed()
        assert dist is not None and self._work is not None
        self._work.wait()
        gathered = torch.stack(self._parts).cpu().tolist()
        headers = [(int(c), int(h)) for c, h, _ in gathered]
        world, rank, ranks, checked = self.world, self.rank, self.ranks, len(self.names)
        if len(set(headers)) > 1:
            lists: list[Any] = [None] * world
            dist.all_gather_object(lists, self.entries, group=self.group)
            found = structure_mismatch(headers, lists, ranks)
            assert found is not None  # the headers differ
            return SyncReport(ok=False, world_size=world, rank=rank, checked=0, mismatches=(found,))
        if len({d for _, _, d in gathered}) == 1:
            return SyncReport(ok=True, world_size=world, rank=rank, checked=checked)
        with torch.no_grad():
            local = _stack(self._tensors, self.device)
        rows = _all_gather(local, self.group, world)
        found_all = compare(rows, self.names)
        mismatches = tuple(Mismatch(m.name, tuple(ranks[r] for r in m.ranks), m.max_abs_diff) for m in found_all)
        return SyncReport(ok=not mismatches, world_size=world, rank=rank, checked=checked, mismatches=mismatches)


def _digest(tensors: list[tuple[str, Any]], params_totals: dict[str, Any] | None) -> list[float]:
    """The parameters' and the buffers' totals (``n, sum, sumsq, wsum`` each) as one list of floats; the given
    parameters' totals are used when they are of as many elements as the parameters here."""
    from .fingerprint import tensor_totals

    params = [t for name, t in tensors if not name.startswith("buffer:")]
    buffers = [t for name, t in tensors if name.startswith("buffer:")]
    out: list[float] = []
    for group, given in ((params, params_totals), (buffers, None)):
        if not group:
            out += [0.0] * 4
            continue
        n = sum(t.numel() for t in group)
        totals = given if given is not None and given.get("n") == n else tensor_totals(group)
        out += [float(totals["n"]), float(totals["sum"]), float(totals["sumsq"]), float(totals["wsum"])]
    return out


def _values_hash(values: list[float]) -> int:
    """52 bits of a hash of floats' bytes (equal values, equal hash; NaN included), exact in a float64."""
    digest = hashlib.blake2b(struct.pack(f"<{len(values)}d", *values), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 12


def start_check(
    module: Any, *, group: Any = None, buffers: bool = True, params_totals: dict[str, Any] | None = None
) -> SyncCheck:
    """:func:`check_in_sync` in two halves: this takes the digest and starts its gather (no wait);
    ``.report()`` later, at the same point on every rank, gives the report. The training loop goes on
    in between (a step, say), so the check costs no wait for the slower rank or the network.
    ``params_totals``: see :class:`SyncCheck`."""
    return SyncCheck(module, group=group, buffers=buffers, params_totals=params_totals)


def _distributed() -> Any:
    """``torch.distributed`` when it is built in, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() else None
