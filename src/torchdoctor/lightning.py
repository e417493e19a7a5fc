"""``DoctorCallback``: torchdoctor inside a PyTorch Lightning ``Trainer`` (``pip install torchdoctor[lightning]``).

    from torchdoctor.lightning import DoctorCallback

    doctor = DoctorCallback(sync_every=100, fingerprints="runs/a")
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", callbacks=[doctor])

What it does, on every rank (each part can be switched off):

* **setup** (``preflight=True``): the host checks of ``torchdoctor check`` on every rank; rank 0 prints
  once the warnings and errors of every rank, each with its code (one collective).
* **fit start** (``determinism=True``): the determinism audit (seeds, deterministic algorithms, cuDNN,
  cuBLAS, the sampler's epoch), printed once by rank 0.
* **every** ``sync_every`` **steps**: :func:`torchdoctor.ranks.sync.check_in_sync` on the module's
  parameters (and buffers); a mismatch is printed by rank 0 with its code (TD469), the family
  ``rank-divergence``, the tensor and the ranks, then raised on every rank
  (:class:`~torchdoctor.ranks.sync.RankDivergenceError`, ``on_mismatch="raise"``) or warned
  (``"warn"``). Raising on every rank at the same step stops the job together instead of leaving the
  others hanging in the next collective.
* **each epoch** (``memory=True``): every rank's peak memory (CUDA allocator or RSS) sampled every
  ``memory_every`` steps (10; the peak is a high-water mark, so none is missed in between),
  gathered in one collective at the epoch's end; a rank far above the others is printed by rank 0
  (TD277 host, TD366 GPU) with the step range where its peak grew.
* **each step** (``fingerprints=DIR``): loss and batch checksum into
  ``DIR/fingerprints-rank{R}.jsonl`` for ``torchdoctor runs diff``; parameter and gradient checksums
  every ``params_every`` steps (100; and the initial parameters in the header; the gradient norm is
  ``sqrt(grads.sumsq)``).
  A parting is still found at its step: a different update shows in the next step's loss.
  ``fingerprint_every=N`` records every N-th step only (a parting is then found to within N steps).
  The loss and batch checksums are kept as references and computed, and the lines written, every
  ``flush_every`` records (100; one transfer and one product for all of them, no CUDA sync per step),
  at the end of training and on an exception; a hard kill (SIGKILL, the OOM killer) loses at most the
  last ``flush_every`` records. ``flush_every=1`` writes each step as it ends.
* **on an exception** (``guard=True``): the per-rank JSON error report of :func:`torchdoctor.guard`
  (``report_dir``), with the diagnosis; the exception goes on unchanged.
* :meth:`DoctorCallback.open`: a :class:`~torchdoctor.RankFile` for other callbacks that append to one
  file from every rank (whole lines, never glued), closed at teardown. At the end of training every
  rank's lines are written, and the ranks meet at a barrier, before any rank returns from ``fit``.

Works with ``lightning`` (``lightning.pytorch``) or the older ``pytorch_lightning`` package, whichever
is installed (``lightning`` first).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UsageError, positive_count

if TYPE_CHECKING:
    from .guards.rankfile import RankFile
    from .ranks.memory import MemoryReport, MemoryTracker
    from .ranks.sync import SyncCheck, SyncReport


def _callback_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            raise ImportError(
                "torchdoctor.lightning needs PyTorch Lightning: pip install 'torchdoctor[lightning]' "
                "(or pip install lightning)"
            ) from None
    return Callback


_Base: Any = _callback_base()

ON_MISMATCH = ("raise", "warn")
RENDEZVOUS_FAMILIES = ("dist-env", "dist-port", "dist-connect")


def _dist() -> Any:
    """torch.distributed when a process group is up, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _echo(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class DoctorCallback(_Base):
    """torchdoctor's checks at the moments a Lightning ``Trainer`` offers (see the module's docs)."""

    def __init__(
        self,
        *,
        sync_every: int | None = 100,
        on_mismatch: str = "raise",
        buffers: bool = True,
        memory: bool = True,
        memory_ratio: float = 1.5,
        preflight: bool = True,
        determinism: bool = True,
        fingerprints: str | os.PathLike[str] | None = None,
        fingerprint_every: int = 1,
        params_every: int = 100,
        memory_every: int = 10,
        flush_every: int = 100,
        guard: bool = True,
        report_dir: str | os.PathLike[str] = "torchdoctor-reports",
    ) -> None:
        super().__init__()
        if sync_every is not None:
            positive_count("sync_every", sync_every, "steps or None (off)", UsageError)
        if on_mismatch not in ON_MISMATCH:
            raise UsageError(f"on_mismatch must be one of {', '.join(ON_MISMATCH)}; got {on_mismatch!r}")
        for name, value in (
            ("fingerprint_every", fingerprint_every),
            ("params_every", params_every),
            ("memory_every", memory_every),
            ("flush_every", flush_every),
        ):
            positive_count(name, value, error=UsageError)
        if not memory_ratio > 1:
            raise UsageError(f"memory_ratio must be above 1 (a rank's peak against the others'); got {memory_ratio!r}")
        self.sync_every = sync_every
        self.on_mismatch = on_mismatch
        self.buffers = buffers
        self.memory = memory
        self.memory_ratio = float(memory_ratio)
        self.preflight = preflight
        self.determinism = determinism
        self.fingerprints = Path(fingerprints) if fingerprints is not None else None
        self.fingerprint_every = fingerprint_every
        self.params_every = params_every
        self.memory_every = memory_every
        self.flush_every = flush_every
        self.guard = guard
        self.report_dir = Path(report_dir)
        # what the last checks found, for the training script and for tests
        self.preflight_findings: dict[int, list[dict[str, Any]]] = {}
        self.determinism_findings: list[Any] = []
        self.sync_reports: list[tuple[int, SyncReport]] = []
        self.memory_reports: list[tuple[int, MemoryReport]] = []
        self._tracker: MemoryTracker | None = None
        self._recorder: Any = None
        self._sync_started: tuple[int, SyncCheck] | None = None
        self._files: list[RankFile] = []
        self._step: Any = None

    # --- for other callbacks -------------------------------------------------------------------------

    def open(self, path: str | os.PathLike[str], *, prefix: str = "", **kwargs: Any) -> RankFile:
        """A :class:`~torchdoctor.RankFile` every rank can append to (``print(..., file=f)``): whole lines,
        never glued or cut; closed at teardown. ``prefix="[rank {rank}] "`` names the rank on every line."""
        from .guards.rankfile import RankFile

        f = RankFile(path, prefix=prefix, **kwargs)
        self._files.append(f)
        return f

    # --- Lightning hooks -----------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.preflight and stage == "fit":
            self._preflight(trainer)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self.memory:
            from .ranks.memory import MemoryTracker

            self._tracker = MemoryTracker(every=self.memory_every, device=_device(pl_module), ratio=self.memory_ratio)
        if self.fingerprints is not None:
            from .ranks.fingerprint import RunRecorder

            self._recorder = RunRecorder(
                self.fingerprints,
                rank=trainer.global_rank,
                model=pl_module,
                meta={
                    "world_size": trainer.world_size,
                    "source": "torchdoctor.lightning.DoctorCallback",
                    "params_every": self.params_every,
                },
                flush_every=self.flush_every,
            )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._step = _global_step_reader(trainer)
        if self.determinism:
            self._determinism(trainer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = self._step() if self._step is not None else int(trainer.global_step)
        if self._recorder is not None and step % self.fingerprint_every == 0:
            model = pl_module if step % self.params_every == 0 else None
            # the gradients are this step's until the next step zeroes them; their norm is not taken each step
            # (it cost more than the rest of the record together): sqrt(grads.sumsq) every params_every steps
            self._recorder.record(step, loss=_loss_of(outputs), model=model, batch=batch)
        tracker = self._tracker
        if tracker is not None and step % tracker.every == 0:
            tracker.sample(step)
        if self._sync_started is not None:
            self._sync_report(trainer)
        if self.sync_every is not None and step % self.sync_every == 0:
            from .ranks.sync import start_check

            # the parameters' totals of a fingerprint record of this very step are the check's digest too
            last = self._recorder.last_params if self._recorder is not None else None
            totals = last[1] if last is not None and last[0] == step else None
            self._sync_started = (step, start_check(pl_module, buffers=self.buffers, params_totals=totals))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._sync_started is not None:  # before the memory gather, in the same order on every rank
            self._sync_report(trainer)
        if self._tracker is None:
            return
        report = self._tracker.gather()
        self.memory_reports.append((int(trainer.current_epoch), report))
        if report.finding is not None and trainer.global_rank == 0:
            _echo(f"torchdoctor (epoch {trainer.current_epoch}): {report.render()}")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        # what every rank wrote through open() is in the files before any rank goes past fit() (a rank
        # reading them right after would otherwise miss the others' last batch of lines); every rank
        # comes here, whether or not it opened a file, so the barrier is always matched
        if self._recorder is not None:
            self._recorder.flush()
        for f in self._files:
            f.flush()
        if self._sync_started is not None:
            self._sync_report(trainer)
        if int(getattr(trainer, "world_size", 1)) > 1:
            trainer.strategy.barrier("torchdoctor-files")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._sync_started = None  # never waited for: another rank may not be there to finish it
        if self._recorder is not None:
            try:  # the steps up to the failure are what `runs diff` needs most
                self._recorder.flush()
            except Exception as exc:
                warnings.warn(f"torchdoctor: the last fingerprints could not be written: {exc!r}", stacklevel=1)
        if self.guard:
            from .guards.report import report_failure

            report_failure(exception, self.report_dir)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._recorder is not None:
            self._recorder.close()
            self._recorder = None
        for f in self._files:
            f.close()
        self._files.clear()

    # --- the checks ----------------------------------------------------------------------------------

    def _preflight(self, trainer: Any) -> None:
        from .checks import run_checks
        from .facts import gather
        from .model import Severity

        dist = _dist()
        # the process group is up: whatever the environment checks say about the rendezvous is moot (Lightning's
        # launcher, for one, sets LOCAL_RANK and WORLD_SIZE but not RANK)
        moot = RENDEZVOUS_FAMILIES if dist is not None else ()
        try:
            found = [
                {"code": f.code, "severity": f.severity.label, "title": f.title, "message": f.message, "fix": f.fix}
                for f in run_checks(gather())
                if f.severity >= Severity.WARNING and f.family not in moot
            ]
        except Exception as exc:  # a check must never stop training
            found = [{"code": "", "severity": "warning", "title": "preflight failed", "message": repr(exc), "fix": ""}]
        per_rank: list[Any] = [found]
        if dist is not None:
            per_rank = [None] * dist.get_world_size()
            dist.all_gather_object(per_rank, found)
        self.preflight_findings = {rank: list(items or []) for rank, items in enumerate(per_rank)}
        if trainer.global_rank == 0:
            _echo(render_preflight(self.preflight_findings))

    def _determinism(self, trainer: Any) -> None:
        from .ranks.determinism import determinism_report

        try:
            loader = trainer.train_dataloader
            report = determinism_report(loader=loader, epoch=int(trainer.current_epoch))
        except Exception as exc:
            warnings.warn(f"torchdoctor: the determinism audit failed: {exc!r}", stacklevel=1)
            return
        self.determinism_findings = list(report.findings)
        if trainer.global_rank == 0 and report.findings:
            _echo(f"torchdoctor determinism audit:\n{report.render()}")

    def _sync_report(self, trainer: Any) -> None:
        """The report of the check started at the last check step, read one step later on every rank (its
        gather ran in the background meanwhile)."""
        from .ranks.sync import RankDivergenceError

        assert self._sync_started is not None
        (step, check), self._sync_started = self._sync_started, None
        report = check.report()
        self.sync_reports.append((step, report))
        if report.ok:
            return
        text = f"torchdoctor (step {step}): {report.render()}"
        if trainer.global_rank == 0:
            _echo(text)
        if self.on_mismatch == "raise":
            raise RankDivergenceError(report)
        if trainer.global_rank == 0:
            warnings.warn(text, stacklevel=1)


def render_preflight(per_rank: dict[int, list[dict[str, Any]]]) -> str:
    """Every rank's preflight warnings and errors in one block; ranks with the same findings share a line."""
    if not any(per_rank.values()):
        return f"torchdoctor preflight: {len(per_rank)} rank(s) checked, no warnings or errors."
    by_code: dict[str, tuple[dict[str, Any], list[int]]] = {}
    for rank, items in sorted(per_rank.items()):
        for item in items:
            key = f"{item['code']} {item['message']}"
            by_code.setdefault(key, (item, []))[1].append(rank)
    lines = [f"torchdoctor preflight: {len(by_code)} problem(s) over {len(per_rank)} rank(s):"]
    for item, ranks in by_code.values():
        where = "every rank" if len(ranks) == len(per_rank) > 1 else "rank " + ",".join(map(str, ranks))
        lines.append(f"  {item['code']} {item['severity']} ({where}): {item['message']}")
        if item.get("fix"):
            lines.append(f"      fix: {item['fix']}")
    return "\n".join(lines)


def _device(pl_module: Any) -> Any:
    try:
        return pl_module.device
    except Exception:
        return None


def _global_step_reader(trainer: Any) -> Any:
    """A function giving ``trainer.global_step`` without the property's walk through the trainer and the module each
    step: the counter Lightning increments itself (automatic optimization: optimizer steps completed; manual:
    ``optimizer.step()`` calls completed), checked once against ``global_step``; the property itself where that
    counter is not found (another Lightning version)."""
    try:
        loop = trainer.fit_loop.epoch_loop
        if trainer.lightning_module.automatic_optimization:
            total = loop.automatic_optimization.optim_progress.optimizer.step.total
        else:
            total = loop.manual_optimization.optim_step_progress.total
        if int(total.completed) == int(trainer.global_step):
            return lambda: total.completed
    except (AttributeError, TypeError, ValueError):
        pass
    return lambda: int(trainer.global_step)


def _loss_of(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return outputs
