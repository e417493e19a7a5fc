"""Deferred step records: what :class:`~torchdoctor.ranks.fingerprint.RunRecorder` keeps between flushes.

A record's loss and batch checksum cost little to compute but much to compute *each step*: a loss's
``.item()`` waits for the device (a CUDA sync per step), and a batch's checksum is a few small
operations whose fixed cost (dispatch, cold caches) is many times their arithmetic. With
``flush_every=N`` the recorder keeps, per step, only references: the loss as a detached 0-d tensor,
the batch's CPU tensors as they are (with their version counters), the batch checksums of device
tensors as 0-d tensors already computed on the device (no sync). Every ``N`` steps it turns them
into numbers at once: one transfer for all the scalars, one matrix-vector product for all the batches
of one shape. Parameters and gradients are never deferred: they change with the next step.

A CPU batch tensor changed in place between its step and the flush (its version counter moved: a
loader that refills one buffer) cannot be checksummed any more; the record then carries no ``batch``
and says so in ``batch_unknown``, rather than a wrong checksum.

The common step (a scalar loss, a tuple or list of CPU tensors, nothing else) takes a shorter road:
:func:`quick_capture` keeps one tuple, and :func:`finish_quick` turns a run of them into records with
one stack per batch position. A step recorded every step pays once per step in a real training loop,
where every Python operation runs with cold caches and costs several times what it costs in a loop
of its own: the fewer operations per step, the better.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Any

#: Bytes of CPU batch tensors held between flushes at most; past it, the pending records are flushed.
HELD_LIMIT = 64 << 20
_PATHS = tuple(f"[{i}]" for i in range(16))
_TENSOR: Any = None


def _tensor_type() -> Any:
    global _TENSOR
    if _TENSOR is None:
        import torch

        _TENSOR = torch.Tensor
    return _TENSOR


Quick = tuple[int, float, Any, Any, tuple[int, ...], int]
"""A quick record: ``(step, time, loss or None, batch leaves, their versions, their bytes)``."""


def quick_capture(step: int, loss: Any, batch: Any) -> Quick | None:
    """The step as one tuple when it is the common one: a one-element loss tensor (or none) and a tuple or
    list of 1 to 16 CPU tensors that do not require grad. None otherwise (the caller takes the long road)."""
    tensor = _TENSOR or _tensor_type()
    if type(batch) not in (tuple, list) or not 0 < len(batch) <= 16:
        return None
    versions = []
    held = 0
    for v in batch:
        if not isinstance(v, tensor) or not v.is_cpu or v.requires_grad:
            return None
        versions.append(v._version)
        held += v.nbytes
    if loss is not None:
        if not isinstance(loss, tensor) or loss.numel() != 1:
            return None
        if loss.requires_grad:  # Lightning hands its hooks a detached copy already: no second one
            loss = loss.detach()
    return (step, time.time(), loss, tuple(batch), tuple(versions), held)


@dataclass(slots=True)
class Pending:
    """One step's record before its flush: the known fields in ``rec``, the rest as references."""

    rec: dict[str, Any]
    scalars: dict[str, Any] = field(default_factory=dict)
    """Field name -> a 0-d tensor (``loss``, ``grad_norm``) turned into a float at the flush."""
    leaves: list[tuple[str, Any, int]] | None = None
    """The batch's leaves as ``(path, tensor, version)`` (CPU tensors, read at the flush)."""
    device_sums: list[tuple[str, Any]] | None = None
    """The batch's leaves as ``(path, 0-d checksum tensor)`` computed on their device."""
    held_bytes: int = 0


def deferrable_scalar(value: Any) -> bool:
    """A one-element tensor: kept as a reference, read at the flush."""
    return hasattr(value, "detach") and hasattr(value, "numel") and value.numel() == 1


def capture_batch(batch: Any, pending: Pending) -> bool:
    """Keep the batch in ``pending`` for the flush; False when it is not a batch of tensors only (then the
    caller checksums it now). Per leaf only what cannot wait: is it on the CPU, its version, its size."""
    import torch

    from .fingerprint import _leaves, _tensor_sum

    tensor = torch.Tensor
    items: Any
    if isinstance(batch, tensor):
        items = (("", batch),)
    elif type(batch) in (tuple, list) and 0 < len(batch) <= len(_PATHS):
        items = zip(_PATHS, batch)  # the usual (inputs, targets): what _leaves would say, quicker
    else:
        items = []
        _leaves(batch, "", items)
    kept: list[tuple[str, Any, int]] = []
    held = 0
    on_device = False
    for path, v in items:
        if not isinstance(v, tensor):
            return False  # numbers, strings, arrays among the leaves: checksummed now, as they are
        on_device = on_device or not v.is_cpu
        kept.append((path, v.detach() if v.requires_grad else v, v._version))
        held += v.nbytes
    if not kept:
        return False
    if not on_device:
        pending.leaves, pending.held_bytes = kept, held
        return True
    # on a device: the checksums are launched now (asynchronous, nothing waits) and read at the flush
    pending.device_sums = [(path, _tensor_sum(v)) for path, v, _ in kept]
    return True


def _stack(tensors: list[Any]) -> Any:
    import torch

    return torch.stack(tensors)


def _read_scalars(items: list[Any]) -> list[float]:
    """Floats of 0-d tensors, one transfer per (device, dtype) group."""
    import torch

    out: list[float] = [0.0] * len(items)
    groups: dict[tuple[Any, Any, Any], list[int]] = {}
    for i, t in enumerate(items):
        groups.setdefault((t.device, t.dtype, t.shape), []).append(i)
    for idx in groups.values():
        values = torch.stack([items[i] for i in idx]).reshape(-1).tolist()
        for i, v in zip(idx, values):
            out[i] = float(v)
    return out


def _cpu_sums(rows: list[Any]) -> list[float]:
    """Position-weighted float64 sums of CPU tensors of one shape and dtype: one ``stack``, then one
    matrix-vector product through numpy (torch when numpy cannot take the dtype: bfloat16)."""
    import torch

    from .fingerprint import _np_weights, _position_weights

    n = int(rows[0].numel())
    matrix = torch.stack(rows).reshape(len(rows), n)
    try:
        import numpy as np

        return (matrix.numpy().astype(np.float64, copy=False) @ _np_weights(n)).tolist()
    except (ImportError, TypeError, RuntimeError, ValueError):
        matrix64 = matrix.to(torch.float64)
        return [float(v) for v in (matrix64 @ _position_weights(n, matrix64.device)).tolist()]


def finish(pending: list[Pending]) -> list[dict[str, Any]]:
    """The records of ``pending``, their deferred fields filled in, in order."""
    from .fingerprint import _tensor_sum

    scalar_refs: list[tuple[int, str, Any]] = []
    for i, p in enumerate(pending):
        p.rec["t"] = round(p.rec["t"], 3)
        scalar_refs += [(i, name, t) for name, t in p.scalars.items()]
        if p.device_sums:
            scalar_refs += [(i, f"batch:{path}", t) for path, t in p.device_sums]
    values = _read_scalars([t for _, _, t in scalar_refs]) if scalar_refs else []
    batch_values: dict[int, dict[str, float]] = {}
    for (i, name, _), v in zip(scalar_refs, values):
        if name.startswith("batch:"):
            batch_values.setdefault(i, {})[name[6:]] = v
        else:
            pending[i].rec[name] = v
    # CPU leaves: grouped by (shape, dtype) over all pending steps, one product per group
    groups: dict[tuple[Any, Any], list[tuple[int, str, Any]]] = {}
    for i, p in enumerate(pending):
        if p.leaves is None:
            continue
        if any(t._version != version for _, t, version in p.leaves):
            p.rec["batch_unknown"] = "a batch tensor was changed in place before its checksum was read"
            continue
        for path, t, _ in p.leaves:
            groups.setdefault((t.shape, t.dtype), []).append((i, path, t))
    for (shape, dtype), members in groups.items():
        if dtype.is_complex or 0 in shape:  # rare: one by one, as fingerprint_batch does
            sums = [float(_tensor_sum(t).item()) for _, _, t in members]
        else:
            sums = _cpu_sums([t for _, _, t in members])
        for (i, path, _), v in zip(members, sums):
            batch_values.setdefault(i, {})[path] = v
    for i, p in enumerate(pending):
        if i in batch_values and "batch_unknown" not in p.rec:
            got = batch_values[i]
            order = [path for path, _, _ in p.leaves] if p.leaves else [path for path, _ in p.device_sums or []]
            p.rec["batch"] = got[""] if order == [""] else ";".join(f"{path}={got[path]!r}" for path in order)
    return [p.rec for p in pending]


def batch_text(values: tuple[float, ...] | list[float]) -> str:
    """A tuple/list batch's ``batch`` field from its leaves' checksums: ``[0]=...;[1]=...`` (as the long road writes
    it for such a batch)."""
    return ";".join(f"{_PATHS[j]}={v!r}" for j, v in enumerate(values))


def _hex(values: list[float]) -> str:
    return struct.pack(f"<{len(values)}d", *values).hex()


def _unhex(text: str, n: int) -> list[float]:
    raw = bytes.fromhex(text)
    if len(raw) != 8 * n:
        raise ValueError(f"{len(raw)} bytes where {n} float64 values were expected")
    return list(struct.unpack(f"<{n}d", raw))


def block_records(block: dict[str, Any]) -> list[dict[str, Any]]:
    """The step records a ``{"kind": "steps"}`` line holds (see :func:`finish_quick`), as the one-line-a-step
    records would be; ``ValueError`` when the line is not well formed."""
    steps, t_ms, batch = block["step"], block["t_ms"], block["batch"]
    n = len(steps)
    if not isinstance(steps, list) or not all(type(s) is int for s in steps) or len(t_ms) != n:
        raise ValueError("a steps block without integer steps and one time per step")
    if not isinstance(batch, list) or not batch:
        raise ValueError("a steps block without batch columns")
    losses = _unhex(block["loss"], n)
    columns = [_unhex(column, n) for column in batch]
    return [
        {"kind": "step", "step": steps[i], "t": t_ms[i] / 1000, "loss": losses[i], "batch": batch_text(row)}
        for i, row in enumerate(zip(*columns))
    ]


def _steps_line(encode: Any, quick: list[Quick], losses: list[float], columns: list[list[float]]) -> str:
    """One ``{"kind": "steps"}`` line: the records' steps and times, their losses and one column per batch position."""
    return str(
        encode(
            {
                "kind": "steps",
                "step": [q[0] for q in quick],
                "t_ms": [int(q[1] * 1000 + 0.5) for q in quick],
                "loss": _hex(losses),
                "batch": [_hex(column) for column in columns],
            }
        )
    )


def finish_quick(quick: list[Quick], encode: Any) -> list[str]:
    """The JSON lines of a run of quick captures, in step order: the losses read in one transfer, each batch position
    checksummed with one stack and one product. Consecutive records with a loss and a known batch of one width go on
    one ``{"kind": "steps", "step": [...], "t_ms": [...], "loss": HEX, "batch": [HEX per position]}`` line (HEX:
    the float64 values, little-endian, as hexadecimal: written without a ``repr`` per number, read back bit for
    bit by :func:`block_records`); the others on a line each, as the long road writes them."""
    n = len(quick)
    losses = [(i, q[2]) for i, q in enumerate(quick) if q[2] is not None]
    loss: list[float | None] = [None] * n
    if losses:
        tensors = [t for _, t in losses]
        first = tensors[0]
        if [(t.dtype, t.device) for t in tensors] == [(first.dtype, first.device)] * len(tensors):
            values = [float(v) for v in _stack(tensors).reshape(-1).tolist()]  # one transfer
        else:
            values = _read_scalars(tensors)
        for (i, _), v in zip(losses, values):
            loss[i] = v
    sums: list[tuple[float, ...] | None] = [None] * n
    unknown = [False] * n
    if [t._version for q in quick for t in q[3]] != [v for q in quick for v in q[4]]:
        for i, q in enumerate(quick):
            unknown[i] = any(t._version != v for t, v in zip(q[3], q[4]))
    valid = [i for i in range(n) if not unknown[i]]
    grouped = _checksum_columns(quick, valid)
    if len(grouped) == 1 and len(grouped[0][0]) == n and None not in loss:  # the usual flush: one line, no loop
        return [_steps_line(encode, quick, loss, grouped[0][1])]  # type: ignore[arg-type]
    for members, columns in grouped:
        for i, sums_of_row in zip(members, zip(*columns)):
            sums[i] = sums_of_row
    lines: list[str] = []
    block: list[int] = []

    def close_block() -> None:
        if block:
            columns = [list(column) for column in zip(*(sums[i] or () for i in block))]
            lines.append(_steps_line(encode, [quick[i] for i in block], [loss[i] for i in block], columns))  # type: ignore[misc]
            block.clear()

    for i, q in enumerate(quick):
        row = sums[i]
        if loss[i] is not None and row is not None:
            if block and len(sums[block[0]]) != len(row):  # type: ignore[arg-type]
                close_block()
            block.append(i)
            continue
        close_block()
        rec: dict[str, Any] = {"kind": "step", "step": int(q[0]), "t": round(q[1], 3)}
        if loss[i] is not None:
            rec["loss"] = loss[i]
        if unknown[i]:
            rec["batch_unknown"] = "a batch tensor was changed in place before its checksum was read"
        elif row is not None:
            rec["batch"] = batch_text(row)
        lines.append(encode(rec))
    close_block()
    return lines


def _checksum_columns(quick: list[Quick], rows: list[int]) -> list[tuple[list[int], list[list[float]]]]:
    """``rows`` grouped by the shapes and dtypes of their batch leaves (usually one group), each group with the
    checksums of its leaves, one column per batch position. The common case costs one stack per position:
    ``torch.stack`` itself refuses leaves of different shapes, and only then are the shapes read one by one."""
    if not rows:
        return []
    first = quick[rows[0]][3]
    width, dtypes = len(first), [t.dtype for t in first]
    if [len(quick[i][3]) for i in rows] == [width] * len(rows) and [
        t.dtype for i in rows for t in quick[i][3]
    ] == dtypes * len(rows):
        try:
            return [(rows, [_column([quick[i][3][j] for i in rows]) for j in range(width)])]
        except RuntimeError:  # "stack expects each tensor to be equal size": group by shape below
            pass
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i in rows:
        groups.setdefault(tuple((t.shape, t.dtype) for t in quick[i][3]), []).append(i)
    return [
        (members, [_column([quick[i][3][j] for i in members]) for j in range(len(quick[members[0]][3]))])
        for members in groups.values()
    ]


def _column(tensors: list[Any]) -> list[float]:
    """Checksums of same-dtype CPU tensors (one batch position over several steps); ``RuntimeError`` when
    their shapes differ."""
    t0 = tensors[0]
    # an empty first tensor: one by one; an empty one later has another shape, and the stack refuses it
    if t0.dtype.is_complex or t0.numel() == 0:
        from .fingerprint import _tensor_sum

        return [float(_tensor_sum(t).item()) for t in tensors]
    return _cpu_sums(tensors)
