"""TD467, TD468: what only a live process group can show (``torchdoctor dist`` finds these).

Neither has a preflight check over one host's facts or a log signature: they compare what several
ranks reported to each other, or what a collective returned with what it must return.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register

TD467 = register(
    Code(
        code="TD467",
        name="collective-wrong-result",
        family="rank-divergence",
        severity=Severity.ERROR,
        area="distributed",
        title="a collective completed but returned wrong data",
        message="{op} on rank {rank} returned {got} where {expected} was expected; the data from rank(s) {sources} "
        "arrived wrong.",
        fix="Rerun `torchdoctor dist` to see whether it repeats; check the named ranks' host (its network interface, "
        "`NCCL_P2P_DISABLE=1` / `NCCL_IB_DISABLE=1` to rule out a transport), and that every rank runs the same "
        "torch and NCCL (TD468).",
        meaning="Every rank contributed a known value and checked the result; a collective that finishes with "
        "another result corrupts training silently (gradients averaged wrongly).",
        why="A rank that computed its input differently (diverged state), a faulty transport (GPU peer-to-peer, "
        "InfiniBand, a NIC offload bug), or mismatched library versions between ranks.",
        false_positives="None known: the test values are exact in float32.",
        related=("TD466", "TD468"),
    )
)

TD468 = register(
    Code(
        code="TD468",
        name="dist-ranks-differ",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="ranks of one job run different software or limits",
        message="{what} differs between ranks: {values}.",
        fix="Install the same versions on every node (one container image, or `pip install torch=={reference}` on "
        "{hosts}); for limits and /dev/shm, give every node the same settings (`ulimit -n`, `--shm-size`).",
        meaning="`torchdoctor dist` gathered each rank's torch, CUDA, NCCL and Python versions, open-file limit, "
        "vm.max_map_count and /dev/shm size to rank 0 and they are not the same everywhere.",
        why="A node that was not upgraded with the others, a second virtual environment on some hosts, a container "
        "image pulled at another time, or nodes set up by different administrators. Different NCCL or torch "
        "versions can deadlock or corrupt collectives; different limits make a failure appear on one node only.",
        false_positives="Versions that differ only in a local build suffix; limits that differ but are all large "
        "enough (reported as a warning).",
        related=("TD412",),
    )
)
