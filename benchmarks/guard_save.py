"""What `torchdoctor.save` costs against plain `torch.save`, to the same disk.

Target: within 10% of plain `torch.save(obj, path)`.

A state dict of `--mib` MiB of float32 tensors (a few large, many small, like a model with its
optimizer state) is saved `--runs` times by each of three writers, interleaved (the order rotates
every round) into one temp directory on the disk under test (`--dir`, default the system temp dir):

* ``torch.save``            plain `torch.save(obj, path)`: no fsync, the data may still be in the page cache
* ``torch.save+fsync``      the same, then `os.fsync` of the file: what durability costs by itself
* ``torchdoctor.save``      pre-checks, temp file, `torch.save` into it, fsync, `os.replace`, fsync of the directory
* ``torchdoctor.save(durable=False)``  the same without the fsyncs: still atomic when a process is
  killed at any moment, not when the machine crashes

Medians per writer and the ratios to plain `torch.save`. Each file is deleted before its next write
so every writer allocates fresh blocks. The fsync protects against a crash of the machine soon after
the rename (an empty file under the new name); its cost is the disk's, so the default
`torchdoctor.save` is compared with `torch.save+fsync`, and `durable=False` (what protects against a
killed process, the common case) with plain `torch.save`.

    python benchmarks/guard_save.py [--mib 256] [--runs 9] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def make_state(mib: int) -> dict[str, Any]:
    import torch

    floats = mib * (1 << 20) // 4
    big = floats * 3 // 4
    state: dict[str, Any] = {"embed.weight": torch.rand(big // 2), "head.weight": torch.rand(big - big // 2)}
    small = (floats - big) // 200
    for i in range(200):
        state[f"layers.{i}.weight"] = torch.rand(small)
    return {"model": state, "step": 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--dir", default=None, help="directory on the disk under test (default: the temp dir)")
    args = ap.parse_args()

    import torch

    import torchdoctor

    state = make_state(args.mib)
    with tempfile.TemporaryDirectory(prefix="td-bench-", dir=args.dir) as d:
        base = Path(d)

        def plain(p: Path) -> None:
            torch.save(state, p)

        def plain_fsync(p: Path) -> None:
            with open(p, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

        def guarded(p: Path) -> None:
            torchdoctor.save(state, p)

        def guarded_fast(p: Path) -> None:
            torchdoctor.save(state, p, durable=False)

        writers: dict[str, Callable[[Path], None]] = {
            "torch.save": plain,
            "torch.save+fsync": plain_fsync,
            "torchdoctor.save": guarded,
            "durable=False": guarded_fast,
        }
        times: dict[str, list[float]] = {k: [] for k in writers}
        names = list(writers)
        for name in names:  # warm-up: page cache, allocator, imports
            writers[name](base / f"{name}.pt")
        for r in range(args.runs):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                path = base / f"{name}.pt"
                path.unlink(missing_ok=True)
                os.sync()  # start every write with no other dirty data queued
                t0 = time.perf_counter()
                writers[name](path)
                times[name].append(time.perf_counter() - t0)
        size = (base / "torchdoctor.save.pt").stat().st_size

    print(f"state dict: {size / (1 << 20):.0f} MiB on disk, {args.runs} interleaved runs per writer, dir {base.parent}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, m in med.items():
        v = times[name]
        print(
            f"  {name:18s} median {m * 1000:8.1f} ms  ({size / (1 << 20) / m:7.0f} MiB/s)  "
            f"min {min(v) * 1000:7.1f}  max {max(v) * 1000:7.1f}"
        )
    print(f"ratio torchdoctor.save / torch.save        = {med['torchdoctor.save'] / med['torch.save']:.3f}")
    print(f"ratio torchdoctor.save / torch.save+fsync  = {med['torchdoctor.save'] / med['torch.save+fsync']:.3f}")
    print(f"ratio torch.save+fsync / torch.save        = {med['torch.save+fsync'] / med['torch.save']:.3f}")
    print(
        f"ratio durable=False / torch.save           = {med['durable=False'] / med['torch.save']:.3f}  (target <= 1.10)"
    )


if __name__ == "__main__":
    main()
