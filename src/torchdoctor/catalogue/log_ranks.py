"""TD469, TD277, TD477: what the ranks of one job (or two runs) report about each other.

``torchdoctor.ranks.sync.check_in_sync`` compares per-tensor checksums of every rank's model (TD469);
``torchdoctor.ranks.memory.MemoryTracker`` gathers every rank's peak memory and names the rank that
holds far more than the others (TD277 host memory, TD366 GPU memory); ``torchdoctor runs diff``
names the step where two recorded runs part (TD477). Each prints the line a signature here
recognises, so ``explain`` reads them back from a job's log.

None has a preflight check: only the running ranks can compare themselves. The signatures were recorded
by the lab (``torchdoctor/lab/scenarios/ranks.py`` and ``runs.py``). TD366, TD277's GPU twin, is in
``ranks_gpu``: no GPU run has recorded its line, so it has no signature yet.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature

TD469 = register(
    Code(
        code="TD469",
        name="rank-parameters-differ",
        family="rank-divergence",
        severity=Severity.ERROR,
        area="distributed",
        title="a parameter or buffer holds another value on some ranks",
        message="{name} differs on rank(s) {ranks} from the reference value (largest checksum difference {diff}).",
        fix="Give every rank the same state before wrapping the model: load checkpoints and (re)initialise layers "
        "before `DistributedDataParallel(model)` (it broadcasts rank 0's parameters and buffers once, at "
        "construction), or broadcast afterwards (`for t in model.state_dict().values(): dist.broadcast(t, 0)`). "
        "Look for rank-dependent code paths that touch {name}: `if rank == ...` around loading or initialisation, "
        "seeds drawn per rank before a layer is created, buffers updated outside forward (DDP broadcasts buffers "
        "only from rank 0's forward).",
        meaning="`check_in_sync` compared a digest of the parameters and buffers across the ranks; they differed, so "
        "it computed a few checksums of every parameter and buffer (sum, sum of squares, two position-weighted "
        "sums, in float64) on every rank and gathered them in a second collective. The named tensor's "
        "checksums on the named ranks differ from the reference: the value most ranks hold, or rank 0's when no "
        "value has a majority. The first line names the first such tensor in module order. `<structure>` means the "
        "ranks do not even hold the same list of tensors (names, shapes, dtypes).",
        why="DDP keeps replicas equal only if they start equal and every rank applies the same averaged update. A "
        "checkpoint loaded after wrapping on some ranks only, a layer re-initialised after wrapping under per-rank "
        "seeds, a buffer changed on one rank (running statistics with `broadcast_buffers=False`), parameters "
        "edited in place outside autograd, or a rank that skipped an optimizer step make them drift apart for good.",
        false_positives="Sharded parameters (FSDP, DTensor) and deliberately rank-local tensors differ by design: "
        "exclude them. Checksums of equal tensors computed on CPUs of another kind may differ in their last bits; "
        "differences below 1e-10 of a checksum's magnitude are therefore ignored.",
        related=("TD466", "TD495", "TD499"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("TD469 rank-divergence: ",),
                pattern=r"TD469 rank-divergence: (?P<name>\S+) differs on rank\(s\) (?P<ranks>\d+(?:, \d+)*) from "
                r"the reference value \(largest checksum difference (?P<diff>[^)\s]+)\)",
                confidence=0.95,
            ),
        ),
    )
)

_IMBALANCE_FIX = (
    "Find what rank {rank} does that the others do not, between steps {first_step} and {last_step}: logging, "
    "evaluation or metrics run on rank 0 only; step outputs or losses kept in a list as tensors (`losses.append("
    "loss)` keeps every step's graph: append `loss.item()` or `loss.detach()`); `torch.save` from rank 0 building a "
    "full CPU copy of the state (save from a `state_dict()` without extra copies, or shard it); caches or "
    "datasets materialised by one rank."
)
_IMBALANCE_WHY = (
    "Work done on one rank only: rank 0 usually logs, evaluates, accumulates metrics and writes checkpoints, and "
    "anything it keeps (a tensor per step, a copy of the model) grows its memory alone, until that rank alone "
    "runs out."
)
_IMBALANCE_MEANING = (
    "`MemoryTracker` sampled each rank's peak {what} every few steps and gathered the samples to every rank; one "
    "rank's peak is at least 1.5 times the median of the others and at least 64 MiB above it. The step range is "
    "where its peak rose from the others' level to its own. It is a warning: the job still runs, but that rank "
    "reaches the limit first."
)

TD277 = register(
    Code(
        code="TD277",
        name="rank-host-memory-imbalance",
        family="host-oom",
        severity=Severity.WARNING,
        area="memory",
        title="one rank uses far more host memory than the others",
        message="rank {rank}'s peak host memory {peak} is {ratio}x the median of the other ranks ({others}); it grew "
        "between steps {first_step} and {last_step}.",
        fix=_IMBALANCE_FIX,
        meaning=_IMBALANCE_MEANING.format(what="host memory (VmHWM, the peak resident set of the process)"),
        why=_IMBALANCE_WHY,
        false_positives="A rank given extra work on purpose (a parameter server, a rank that hosts the data "
        "loader for the others, pipeline stages of different sizes) is imbalanced by design. The peak counts "
        "pages shared with other processes (forked DataLoader workers' parents) as the rank's own.",
        related=("TD366", "TD270"),
        signatures=(
            Signature(
                # evidence for an out-of-memory failure of the same rank (TD270), never a failure in itself
                role=Role.CONFIRMATION,
                triggers=("TD277 host-oom: ",),
                pattern=r"TD277 host-oom: rank (?P<rank>\d+)'s peak host memory (?P<peak>[\d.]+ [KMGT]?i?B) is "
                r"(?P<ratio>[\d.]+)x the median of the other ranks \((?P<others>[\d.]+ [KMGT]?i?B)\); it grew between "
                r"steps (?P<first_step>\d+) and (?P<last_step>\d+)",
                confidence=0.8,
            ),
        ),
    )
)


TD477 = register(
    Code(
        code="TD477",
        name="runs-parted",
        family="rank-divergence",
        severity=Severity.WARNING,
        area="distributed",
        title="two runs that should compute the same thing part at a step",
        message="the runs part at step {step} on rank {rank}: the {cause} differs first ({fields}).",
        fix="Make deterministic what parted first. Data: seed the workers' generators "
        "(`worker_init_fn=torchdoctor.worker_init_fn`, TD471) and the shuffling; start: `torch.manual_seed(SEED)` "
        "before building the model (TD470); computation: `torch.use_deterministic_algorithms(True)` (TD472-TD476). "
        "Here: {advice}",
        meaning="`torchdoctor runs diff` compared two runs recorded with `RunRecorder` step by step and rank "
        "by rank: the batch checksum (taken before the step), the loss and gradients (during it), the "
        "parameters (after the update). What differs first says where to look: the data (the batch differs), "
        "the start (the parameters differ before any data could matter: initialisation or seed) or the "
        "computation (same batch, different results).",
        why="Data: workers' random augmentations from unseeded generators (TD471), shuffling from an unseeded "
        "generator, file listings in directory order. Start: no `torch.manual_seed` before the model is built "
        "(TD470). Computation: non-deterministic operations (TD476, TD472, TD473), a different number of "
        "threads or ranks, another torch or hardware.",
        false_positives="Runs meant to differ (another seed, another configuration); differences below "
        "the compared tolerance matter to nobody (pass `--rtol`/`--atol`).",
        related=("TD470", "TD471", "TD476"),
        signatures=(
            Signature(
                # `torchdoctor runs diff`'s own verdict line (also printed by the lab's runs scenario)
                role=Role.ROOT_CAUSE,
                triggers=("the runs part at step",),
                pattern=r"the runs part at step (?P<step>\d+) on rank (?P<rank>\d+): the "
                r"(?P<cause>data or computation|[^\s(]+)",
                confidence=0.9,
            ),
        ),
    )
)
