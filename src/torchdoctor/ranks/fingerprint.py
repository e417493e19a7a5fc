"""Per-step run fingerprints: a few float64 checksums per step and rank, for ``torchdoctor runs diff``.

    from torchdoctor.ranks.fingerprint import RunRecorder

    with RunRecorder("runs/a", model=model) as rec:        # model: the initial parameters go in the header
        for step, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            rec.record(step, loss=loss, model=model, batch=(x, y))   # after the update, before zero_grad
            opt.zero_grad()

What one step's record means (``diff`` attributes a parting by it): ``batch`` is the step's input,
fixed before the step computes anything; ``loss`` and ``grads`` were computed during the step from the
parameters the previous step left; ``params`` are the parameters after this step's update. Record after
``optimizer.step()`` and before ``zero_grad()`` so that ``grads`` are this step's gradients.

Files: ``RUN_DIR/fingerprints-rank{R}.jsonl``, one JSON object per line, appended whole with one
``O_APPEND`` write per batch of lines (:class:`torchdoctor.RankFile`): a header
``{"kind": "header", "schema": 2, "rank", "world_size", "torch", "seed", "initial_seed", "started",
"pid", "host", "meta", "init"?}``, then per step ``{"kind": "step", "step", "batch"?, "loss"?,
"grad_norm"?, "params"?, "grads"?, "extra"?, "t"}``; with ``flush_every`` > 1, runs of plain steps (a loss and a
tuple/list batch, nothing else) share one ``{"kind": "steps"}`` line, their numbers as float64 hexadecimal
(:func:`~torchdoctor.ranks.deferred.finish_quick`; :mod:`.runfile` reads them back as step records, bit for
bit). Recording again into the same directory appends a new header: from its first step on, the new recording replaces the old one (a
run resumed from a checkpoint at that step, or the same directory recorded again from step 0).

Checksums (float64, on the tensor's device, a few host transfers per record): a tensor's is
``Σ x_i·w_i`` with position weights ``w_i = 1 + frac(i·0.618...)``, so reordering samples or pixels
changes it; a module's ``params``/``grads`` are ``n``, ``sum``, ``sumsq`` and ``wsum``, a position-weighted
sum (over the elements of all tensors, concatenated, up to :data:`FLAT_LIMIT` elements; above it and with
``per_tensor``, each tensor's sum weighted by its position in the module). Equal values give equal
checksums bit for bit when the same code runs on the same hardware and thread count.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import threading
import time
from collections.abc import Mapping
from itertools import groupby
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import positive_count
from .deferred import (
    HELD_LIMIT,
    Pending,
    Quick,
    capture_batch,
    deferrable_scalar,
    finish,
    finish_quick,
    quick_capture,
)
from .runfile import FILE_RE as FILE_RE  # the reading side: re-exported, it used to live here
from .runfile import READABLE as READABLE
from .runfile import SCHEMA as SCHEMA
from .runfile import Run as Run
from .runfile import RunError as RunError
from .runfile import finite as finite
from .runfile import load_run as load_run
from .runfile import read_records as read_records

_ENCODER = json.JSONEncoder(default=str)
#: The golden ratio's fractional part: position weights that never repeat in a useful period.
_PHI = 0.6180339887498949
#: Position weights and float64 scratch vectors are kept per (length, device) up to this many elements,
#: at most :data:`_CACHED` of each: a run's shapes repeat, and a fresh large float64 vector per step costs
#: more than the reductions (page faults). Longer vectors are made per call.
CACHE_LIMIT = 1 << 21
_CACHED = 4
_weights: dict[tuple[int, str], Any] = {}
_np_cache: dict[tuple[int, str], Any] = {}
_local = threading.local()  # the scratch vectors: one set per thread, so recorders in threads never share one
#: Up to this many elements a module's tensors are checksummed as one float64 vector (fewer, larger
#: reductions: what keeps a small model's record cheap); above it, tensor by tensor (no big copy).
FLAT_LIMIT = 1 << 20


# -- checksums -------------------------------------------------------------------------------------------


def _cached(cache: dict[tuple[int, str], Any], n: int, device: Any, make: Any) -> Any:
    if n > CACHE_LIMIT:
        return make()
    key = (n, str(device))
    value = cache.get(key)
    if value is None:
        if len(cache) >= _CACHED:
            try:  # the oldest goes; another thread may be doing the same
                cache.pop(next(iter(cache)), None)
            except (RuntimeError, StopIteration):
                pass
        value = cache[key] = make()
    return value


def _scratch() -> dict[tuple[int, str], Any]:
    cache: dict[tuple[int, str], Any] = _local.__dict__.setdefault("scratch", {})
    return cache


def _position_weights(n: int, device: Any) -> Any:
    import torch

    return _cached(
        _weights, n, device, lambda: torch.arange(n, dtype=torch.float64, device=device).mul_(_PHI).frac_().add_(1.0)
    )


def _flat64(tensors: list[Any]) -> Any:
    """The tensors' values, flattened one after the other into a float64 scratch vector (overwritten by the
    next call of the same length: reduce it before asking again). One ``cat`` into it, which converts."""
    import torch

    xs = []
    for t in tensors:
        x = t.detach()
        if x.is_complex():
            x = torch.view_as_real(x)
        xs.append((x.cpu() if x.device.type == "mps" else x).reshape(-1))  # no float64 on MPS
    n = sum(x.numel() for x in xs)
    device = xs[0].device if xs else torch.device("cpu")
    out = _cached(_scratch(), n, device, lambda: torch.empty(n, dtype=torch.float64, device=device))
    try:
        torch.cat(xs, out=out)
    except RuntimeError:  # a dtype cat will not convert: one copy each
        offset = 0
        for x in xs:
            out[offset : offset + x.numel()].copy_(x)
            offset += x.numel()
    return out


def _tensor_sum(t: Any) -> Any:
    """The order-sensitive checksum of one tensor, as a 0-d float64 tensor on its device (no sync)."""
    import torch

    x = _flat64([t])
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=x.device)
    return torch.dot(x, _position_weights(x.numel(), x.device))


def fingerprint_tensor(t: Any) -> float:
    """``Σ x_i·w_i`` over the tensor's elements in float64, ``w_i = 1 + frac(i·0.618...)``: any change of
    a value or of the order of values changes it (a flip of an image, samples in another order)."""
    return float(_tensor_sum(t).item())


def _leaves(obj: Any, path: str, out: list[tuple[str, Any]], depth: int = 0) -> None:
    if depth > 32:
        out.append((path, f"<{type(obj).__name__}>"))
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _leaves(v, f"{path}.{k}" if path else str(k), out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _leaves(v, f"{path}[{i}]", out, depth + 1)
    else:
        out.append((path, obj))


def _is_tensor(obj: Any) -> bool:
    return hasattr(obj, "detach") and hasattr(obj, "reshape")


def _leaf_value(obj: Any) -> str:
    """A non-tensor leaf: a number as itself, text as a short hash, anything else as its type."""
    if isinstance(obj, bool) or obj is None:
        return str(obj)
    if isinstance(obj, (int, float)):
        return repr(float(obj))
    if isinstance(obj, (str, bytes)):
        data = obj.encode("utf-8", "surrogatepass") if isinstance(obj, str) else obj
        return "#" + hashlib.sha1(data).hexdigest()[:16]
    return f"<{type(obj).__name__}>"  # never a repr: it may hold a memory address that differs per run


def _plain_cpu(t: Any) -> bool:
    return t.device.type == "cpu" and not t.is_complex() and t.numel() > 0


def _cpu_dot(t: Any) -> float:
    """:func:`_tensor_sum` of a real CPU tensor, as a float: ``dot(float64(x), w)``."""
    import torch

    x = t.detach().reshape(-1).to(torch.float64)
    return float(torch.dot(x, _position_weights(x.numel(), x.device)).item())


def _np_weights(n: int) -> Any:
    """:func:`_position_weights` as a numpy array, in its own cache (the batch's sizes never push the
    parameters' weights out of torch's)."""
    import numpy as np

    def make() -> Any:
        return np.modf(np.arange(n, dtype=np.float64) * _PHI)[0] + 1.0

    return _cached(_np_cache, n, "numpy", make)


def _numpy_dots(tensors: list[Any]) -> list[float] | None:
    """:func:`_tensor_sum` of real CPU tensors through numpy (a third of the time of torch's small ops on a
    batch of a few small tensors), or None when numpy or a dtype cannot (bfloat16): then torch does it. The
    sums agree with torch's to rounding (another summation order), which ``runs diff`` tolerates."""
    try:
        import numpy as np

        out = []
        for t in tensors:
            a = t.detach().numpy().reshape(-1)
            out.append(float(np.dot(a.astype(np.float64), _np_weights(a.size))))
        return out
    except (ImportError, TypeError, RuntimeError, ValueError):
        return None


def fingerprint_batch(batch: Any) -> str | float:
    """A tensor's checksum (a float), or for a tuple/list/dict of tensors (and arrays, numbers, strings)
    one ``path=value`` per leaf, in order, joined by ``;`` (``[0]=12.5;[1]=3.0``)."""
    import torch

    if _is_tensor(batch):
        return fingerprint_tensor(batch)
    leaves: list[tuple[str, Any]] = []
    _leaves(batch, "", leaves)
    if leaves and all(_is_tensor(v) and _plain_cpu(v) for _, v in leaves):
        # the common batch, a few real CPU tensors: one dot each, the same sums as below with less around them
        dots = _numpy_dots([v for _, v in leaves])
        if dots is not None:
            return ";".join(f"{path}={d!r}" for (path, _), d in zip(leaves, dots))
        return ";".join(f"{path}={_cpu_dot(v)!r}" for path, v in leaves)
    sums: dict[int, Any] = {}  # leaf index -> its checksum, all moved to the host at once
    for i, (_, v) in enumerate(leaves):
        if not _is_tensor(v) and (type(v).__module__ == "numpy" or hasattr(v, "__array_interface__")):
            v = torch.as_tensor(v)
        if _is_tensor(v):
            sums[i] = _tensor_sum(v)
    if sums:
        device = next(iter(sums.values())).device
        values = dict(zip(sums, torch.stack([x.to(device) for x in sums.values()]).tolist()))
    return ";".join(f"{path}={repr(values[i]) if i in sums else _leaf_value(v)}" for i, (path, v) in enumerate(leaves))


def _stack_sums(tensors: list[Any]) -> tuple[Any, Any]:
    """Per-tensor float64 sums and sums of squares, each tensor copied into one shared float64 scratch."""
    import torch

    xs = [t.detach().cpu() if t.device.type == "mps" else t.detach() for t in tensors]  # no float64 on MPS
    device = xs[0].device
    longest = max(x.numel() for x in xs)
    scratch = _cached(_scratch(), longest, device, lambda: torch.empty(longest, dtype=torch.float64, device=device))
    sums, squares = [], []
    for x in xs:
        view = scratch[: x.numel()]
        view.copy_(x.reshape(-1))
        sums.append(view.sum().to(device))
        squares.append(view.dot(view).to(device))
    return torch.stack(sums), torch.stack(squares)


def _flat_eligible(tensors: list[Any]) -> bool:
    devices = {t.device for t in tensors}
    return sum(t.numel() for t in tensors) <= FLAT_LIMIT and len(devices) == 1 and next(iter(devices)).type != "mps"


def _flat_totals(groups: list[list[Any]]) -> list[dict[str, Any]]:
    """Small models: each group (parameters, gradients) as one float64 vector, three reductions each,
    and one transfer to the host for all of them."""
    import torch

    parts, sizes = [], []
    for tensors in groups:
        flat = _flat64(tensors)
        parts += [flat.sum(), flat.dot(flat), flat.dot(_position_weights(flat.numel(), flat.device))]
        sizes.append(flat.numel())
    values = torch.stack(parts).tolist()
    return [
        {"n": n, "sum": values[3 * i], "sumsq": values[3 * i + 1], "wsum": values[3 * i + 2]}
        for i, n in enumerate(sizes)
    ]


def _per_tensor_totals(tensors: list[Any], names: list[str], per_tensor: bool) -> dict[str, Any]:
    import torch

    sums, squares = _stack_sums(tensors)
    positions = torch.arange(1, len(tensors) + 1, dtype=torch.float64, device=sums.device)
    totals = torch.stack([sums.sum(), squares.sum(), torch.dot(sums, positions)]).tolist()
    n = int(sum(t.numel() for t in tensors))
    out: dict[str, Any] = {"n": n, "sum": totals[0], "sumsq": totals[1], "wsum": totals[2]}
    if per_tensor:
        out["tensors"] = {name: list(v) for name, v in zip(names, torch.stack([sums, squares], 1).tolist())}
    return out


def tensor_totals(tensors: list[Any]) -> dict[str, Any]:
    """``{n, sum, sumsq, wsum}`` of some tensors taken as one (a module's ``params`` in a record): one float64 copy
    of them all and three reductions when they are small enough (:data:`FLAT_LIMIT`), else per tensor. The same
    tensors give the same bits on the same hardware; ``check_in_sync`` compares ranks by them."""
    if _flat_eligible(tensors):
        return _flat_totals([tensors])[0]
    return _per_tensor_totals(tensors, [""] * len(tensors), False)


def fingerprint_module(m: Any, *, per_tensor: bool = False) -> dict[str, Any]:
    """``{"params": {n, sum, sumsq, wsum}, "grads": {...} | None}`` of a module's parameters (and their
    gradients, when any exist); ``per_tensor``: also ``{"tensors": {name: [sum, sumsq]}}`` under each."""
    named = [(n, p) for n, p in m.named_parameters()]
    out: dict[str, Any] = {"params": None, "grads": None}
    if not named:
        return out
    params = [p for _, p in named]
    with_grad = [(n, p.grad) for n, p in named if p.grad is not None]
    grads = [g for _, g in with_grad]
    if not per_tensor and _flat_eligible(params) and (not grads or _flat_eligible(grads)):
        totals = _flat_totals([params, grads] if grads else [params])
        out["params"] = totals[0]
        out["grads"] = totals[1] if grads else None
        return out
    out["params"] = _per_tensor_totals(params, [n for n, _ in named], per_tensor)
    if grads:
        out["grads"] = _per_tensor_totals(grads, [n for n, _ in with_grad], per_tensor)
    return out


def grad_norm(module: Any) -> float | None:
    """The global L2 norm of a module's gradients (None without any), accumulated in float64: one fused
    ``_foreach_norm``, then the norm of those norms (per device when the gradients live on several)."""
    import torch

    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return None
    norms = torch._foreach_norm(grads)
    devices = {n.device for n in norms}
    if len(devices) == 1:
        return float(torch.linalg.vector_norm(torch.stack(norms), dtype=torch.float64).item())
    values = torch.stack([n.to("cpu") for n in norms]).double().tolist()
    return math.fsum(v * v for v in values) ** 0.5


def _scalar(value: Any) -> float:
    if hasattr(value, "detach"):
        value = value.detach()
        if value.numel() != 1:
            return fingerprint_tensor(value)
        return float(value.item())
    return float(value)


# -- recording -------------------------------------------------------------------------------------------


def _world_size() -> int | None:
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:  # a half-torn-down group: fall back to the environment
        pass
    value = os.environ.get("WORLD_SIZE", "").strip()
    return int(value) if value.isdigit() else None


class RunRecorder:
    """Appends one fingerprint line per :meth:`record` to ``run_dir/fingerprints-rank{R}.jsonl``.

    ``rank``: this process's rank (default: the process group's, else ``RANK``, else 0). ``meta``:
    anything JSON-serialisable to keep in the header (configuration, git commit). ``model``: its
    initial parameters go into the header, so that ``runs diff`` can tell a different start from a
    different first step. ``per_tensor``: also keep each parameter's checksums (names the first tensor
    that differs; larger files). ``every``: record only steps divisible by it (the cost of a record is a
    few float64 passes over the parameters and gradients; ``runs diff`` then finds a parting to within
    ``every`` steps). ``flush_every``: compute the loss and batch checksums and write the lines every
    that many records, not at each (see :mod:`.deferred`: a CUDA loss is then not waited for each step,
    and the batches' checksums are one product per flush); the last records before a hard kill (SIGKILL,
    the OOM killer) are then not in the file; :meth:`flush` and :meth:`close` write them."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        rank: int | None = None,
        meta: dict[str, Any] | None = None,
        model: Any = None,
        per_tensor: bool = False,
        every: int = 1,
        flush_every: int = 1,
    ) -> None:
        import torch

        from ..guards.checkpoint import current_rank
        from ..guards.rankfile import RankFile
        from .determinism import seed_is_set

        positive_count("every", every)
        positive_count("flush_every", flush_every, "records")
        self.flush_every = flush_every
        self.last_params: tuple[int, dict[str, Any] | None] | None = None
        """``(step, params)`` of the last record with a model: a sync check of the same step reuses them."""
        self._pending: list[Pending | Quick] = []
        self._held = 0
        self.rank = current_rank() if rank is None else int(rank)
        self.per_tensor = per_tensor
        self.every = every
        self.path = Path(os.fspath(run_dir)) / f"fingerprints-rank{self.rank}.jsonl"
        initial = int(torch.initial_seed())
        header: dict[str, Any] = {
            "kind": "header",
            "schema": SCHEMA,
            "rank": self.rank,
            "world_size": (meta or {}).get("world_size") or _world_size(),
            "torch": str(torch.__version__),
            "seed": initial if seed_is_set({"initial_seed": initial}) else None,
            "initial_seed": initial,
            "started": round(time.time(), 3),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "meta": dict(meta or {}),
        }
        if model is not None:
            header["init"] = fingerprint_module(model, per_tensor=per_tensor)["params"]
        self._file: RankFile | None = RankFile(self.path)
        self._write(header)

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            raise ValueError(f"RunRecorder for {self.path} is closed")
        self._file.write(_ENCODER.encode(record) + "\n")

    def record(
        self, step: int, *, loss: Any = None, model: Any = None, batch: Any = None, grad_norm: Any = None, **extra: Any
    ) -> None:
        """One step's fingerprints (see the module's docs for when to call it). ``extra``: more scalars
        (learning rate, a metric), compared like the loss. ``grad_norm``: what ``clip_grad_norm_`` returned,
        or :func:`grad_norm` (with ``model``, the gradients' norm is already there: ``sqrt(grads.sumsq)``)."""
        if step % self.every:
            return
        if self.flush_every > 1 and model is None and grad_norm is None and not extra and batch is not None:
            quick = quick_capture(step, loss, batch)  # the common step: one tuple, nothing computed now
            if quick is not None:
                self._pending.append(quick)
                self._held += quick[5]
                if len(self._pending) >= self.flush_every or self._held > HELD_LIMIT:
                    self.flush()
                return
        rec: dict[str, Any] = {"kind": "step", "step": int(step)}
        later = Pending(rec) if self.flush_every > 1 else None
        if batch is not None and (later is None or not capture_batch(batch, later)):
            rec["batch"] = fingerprint_batch(batch)
        for name, value in (("loss", loss), ("grad_norm", grad_norm)):
            if value is None:
                continue
            if later is not None and deferrable_scalar(value):
                later.scalars[name] = value.detach()
            else:
                rec[name] = _scalar(value)
        if model is not None:
            fp = fingerprint_module(model, per_tensor=self.per_tensor)
            rec["params"] = fp["params"]
            self.last_params = (int(step), fp["params"])
            if fp["grads"] is not None:
                rec["grads"] = fp["grads"]  # their norm is sqrt(sumsq)
        if extra:
            rec["extra"] = {k: _scalar(v) for k, v in extra.items()}
        if later is None:
            rec["t"] = round(time.time(), 3)
            self._write(rec)
            return
        rec["t"] = time.time()  # rounded at the flush
        self._pending.append(later)
        self._held += later.held_bytes
        if len(self._pending) >= self.flush_every or self._held > HELD_LIMIT:
            self.flush()

    def flush(self) -> None:
        """Compute and write the records kept since the last flush (``flush_every``)."""
        if not self._pending:
            return
        pending, self._pending, self._held = self._pending, [], 0
        if self._file is None:
            raise ValueError(f"RunRecorder for {self.path} is closed")
        encode = _ENCODER.encode
        lines: list[str] = []
        for quick, group in groupby(pending, key=lambda p: type(p) is tuple):  # runs of each road, in step order
            run = list(group)
            if quick:
                lines += finish_quick(run, encode)  # type: ignore[arg-type]
            else:
                lines += [encode(rec) for rec in finish(run)]  # type: ignore[arg-type]
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            try:
                self.flush()
            finally:
                self._file.close()
                self._file = None

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
