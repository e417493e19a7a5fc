"""TD366: one rank's peak GPU memory far above the others' (``torchdoctor.ranks.memory.MemoryTracker``).

TD277's twin for CUDA memory. No signature yet: its line is TD277's with "GPU memory", and no GPU run
has recorded it here (this machine has no GPU); explain's log signatures need a recorded fixture.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from .log_ranks import _IMBALANCE_FIX, _IMBALANCE_MEANING, _IMBALANCE_WHY

TD366 = register(
    Code(
        code="TD366",
        name="rank-gpu-memory-imbalance",
        family="cuda-oom",
        severity=Severity.WARNING,
        area="gpu",
        title="one rank uses far more GPU memory than the others",
        message="rank {rank}'s peak GPU memory {peak} is {ratio}x the median of the other ranks ({others}); it grew "
        "between steps {first_step} and {last_step}.",
        fix=_IMBALANCE_FIX,
        meaning=_IMBALANCE_MEANING.format(what="GPU memory (`torch.cuda.max_memory_allocated` of its device)"),
        why=_IMBALANCE_WHY + " On GPUs also: rank 0 gathering every rank's outputs or a full state dict to its own "
        "device, and evaluation batches larger than the training batches.",
        false_positives="Pipeline or tensor-parallel stages of different sizes; a rank that also runs a model kept "
        "only there (an EMA copy, a teacher). `max_memory_allocated` counts tensors, not the caching allocator's "
        "reserve or other processes on the device.",
        related=("TD277", "TD350"),
    )
)
