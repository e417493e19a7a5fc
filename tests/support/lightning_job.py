"""A tiny real Lightning job (CPU, ``ddp`` on gloo, 2 processes) for DoctorCallback's tests and benchmark.

    python tests/support/lightning_job.py --out DIR [--doctor] [--sync-every N] [--perturb RANK:STEP]
        [--leak RANK:MIB] [--records N] [--safe-log] [--fingerprints DIR] [--steps N] [--epochs N]

Lightning's ``ddp`` strategy starts rank 1 by running this same command again (its subprocess launcher),
so everything the job does is decided by the command line. Results: ``DIR/result-rank{R}.json`` (what
the callback saw), the log files the user callback wrote, and ``torchdoctor-reports`` under DIR.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchdoctor.lab.scenarios.lightning import cpu_trainer, tiny_module


class Perturb(L.Callback):
    """The bug: one rank changes a parameter on its own (a rank-dependent code path after DDP's broadcast)."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.net[2].weight.add_(1e-3)


class Leak(L.Callback):
    """The bug: one rank keeps something every step (here MIB MiB of outputs it means to log later)."""

    def __init__(self, rank: int, mib: int) -> None:
        self.rank, self.mib = rank, mib
        self.kept: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_rank == self.rank:
            self.kept.append(torch.ones(self.mib << 18))  # float32: MIB MiB, touched


class Records(L.Callback):
    """A user's callback appending per-sample records from every rank to one file: unbuffered print() (two
    write() calls per record, as PYTHONUNBUFFERED=1 gives), or through DoctorCallback.open (--safe-log)."""

    def __init__(self, path: Path, per_step: int, doctor: Any) -> None:
        self.path, self.per_step, self.doctor = path, per_step, doctor
        self.f: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.doctor is not None:
            self.f = self.doctor.open(self.path)
        else:
            import io

            self.f = io.TextIOWrapper(open(self.path, "ab", buffering=0), write_through=True)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        rank, step = trainer.global_rank, trainer.global_step
        for i in range(self.per_step):
            print(json.dumps({"rank": rank, "step": step, "sample": i, "loss": 0.5}), file=self.f)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.doctor is None and self.f is not None:
            self.f.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--doctor", action="store_true")
    ap.add_argument("--sync-every", type=int, default=5)
    ap.add_argument("--on-mismatch", default="raise")
    ap.add_argument("--perturb", default=None)
    ap.add_argument("--leak", default=None)
    ap.add_argument("--records", type=int, default=0)
    ap.add_argument("--safe-log", action="store_true")
    ap.add_argument("--fingerprints", default=None)
    ap.add_argument("--params-every", type=int, default=100)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    n = args.steps * args.batch * args.devices
    ds = TensorDataset(torch.randn(n, 16), torch.randn(n, 1))
    callbacks: list[Any] = []
    doctor = None
    if args.doctor:
        from torchdoctor.lightning import DoctorCallback

        doctor = DoctorCallback(
            sync_every=args.sync_every,
            on_mismatch=args.on_mismatch,
            fingerprints=args.fingerprints,
            params_every=args.params_every,
            report_dir=out / "torchdoctor-reports",
        )
        callbacks.append(doctor)
    if args.perturb:
        rank, step = map(int, args.perturb.split(":"))
        callbacks.append(Perturb(rank, step))
    if args.leak:
        rank, mib = map(int, args.leak.split(":"))
        callbacks.append(Leak(rank, mib))
    if args.records:
        callbacks.append(Records(out / "records.jsonl", args.records, doctor if args.safe_log else None))
    trainer = cpu_trainer(callbacks, devices=args.devices, max_epochs=args.epochs)
    started = time.perf_counter()
    error = None
    try:
        trainer.fit(tiny_module(), DataLoader(ds, batch_size=args.batch))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        result: dict[str, Any] = {
            "rank": trainer.global_rank,
            "seconds": time.perf_counter() - started,
            "steps": int(trainer.global_step),
            "error": error,
        }
        if doctor is not None:
            result["sync"] = [(step, r.ok) for step, r in doctor.sync_reports]
            result["memory"] = [(epoch, r.to_dict()) for epoch, r in doctor.memory_reports]
            result["preflight"] = {str(k): v for k, v in doctor.preflight_findings.items()}
        (out / f"result-rank{trainer.global_rank}.json").write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
