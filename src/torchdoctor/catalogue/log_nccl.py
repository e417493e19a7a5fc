"""TD480-TD489, TD494-TD499: NCCL failures as they show up in logs (``explain``).

NCCL errors reach the log twice: NCCL's own ``NCCL WARN`` lines (with ``NCCL_DEBUG=WARN`` or ``INFO``)
and torch's ``NCCL error in: <file>:<line>, <result>, NCCL version X`` exception (torch < 1.5: ``NCCL
error in <file>:<line>, <result>``; ``NCCL Error <n>: <result>`` from older NCCL bindings; nccl-tests:
``NCCL failure <file>:<line> '<result>'``) followed by the ``ncclXxxError: ...`` explanation.
ProcessGroupNCCL's watchdog then times out or aborts the *other* ranks: those cascades live in
``log_nccl_hang.py``. Positive and near-miss fixtures (real text, with the public report they come
from) live in ``tests/fixtures/logs/<CODE>/``.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import SYMPTOM_MAX, Role, Signature

_NOT_PRINTED = "version not printed on this line"
LAST_ERROR_LINES = 6
"""Lines after torch's "NCCL error ..." in which NCCL's own reason follows (``ncclXxxError: ...``, ``Last error:``,
the reason): :attr:`torchdoctor.registry.Code.cause_follows` of the wrapper codes."""


def _nccl_error(result: str) -> str:
    """A NCCL result as torch, NCCL's bindings and nccl-tests print it, with the NCCL version when it is there.

    ``NCCL error in: <where>, <result>, NCCL version X`` (``in`` without a colon before torch 1.5),
    ``NCCL error: <result>``, ``NCCL Error 2: <result>``, nccl-tests' ``NCCL failure <where> '<result>'``.
    """
    return (
        rf"NCCL (?:[Ee]rror(?: in:? (?P<where>[^,\s]+),| \d+:|:)|failure (?P<test_where>[^\s']+) ') ?{result}"
        rf"(?:.*?NCCL version (?P<nccl_version>\d+(?:\.\d+)+))?"
    )


_ISOLATE = (
    "Rerun with `NCCL_DEBUG=INFO` (add `NCCL_DEBUG_SUBSYS=INIT,NET`): the `NCCL WARN` lines before the "
    "error name the failing call. Isolate the transport one switch at a time: `NCCL_SOCKET_IFNAME=<iface>` "
    "(the interface the nodes reach each other on), `NCCL_IB_DISABLE=1` (skip InfiniBand), "
    "`NCCL_P2P_DISABLE=1` (skip GPU peer-to-peer), `NCCL_SHM_DISABLE=1` (skip /dev/shm)."
)

TD480 = register(
    Code(
        code="TD480",
        name="nccl-unhandled-system-error",
        family="nccl",
        severity=Severity.ERROR,
        area="distributed",
        title="NCCL failed with 'unhandled system error' (ncclSystemError)",
        message="NCCL failed with 'unhandled system error' (NCCL {nccl_version}): a system call or external library "
        "inside NCCL (sockets, shared memory, InfiniBand verbs) failed.",
        fix=_ISOLATE + " Multi-node jobs most often need the right interface (pytorch#17349 was settled by "
        "`NCCL_SOCKET_IFNAME` plus `NCCL_IB_DISABLE=1`); containers need a large /dev/shm (`--shm-size`, "
        "`--ipc=host`). Use the same NCCL version on every node.",
        meaning="ncclSystemError: NCCL got an error from the operating system or a library it calls; the reason is in "
        "the 'Last error:' line or the NCCL WARN lines, not in this one.",
        why="Wrong or unreachable network interface, a firewall between nodes, too little /dev/shm in a container, "
        "InfiniBand devices that are present but unusable, or memory-lock limits (ulimit -l) for RDMA.",
        false_positives="None for the message; the cause needs the NCCL WARN lines.",
        across_nodes="TD489",
        related=("TD486", "TD483", "TD411", "TD103"),
        cause_follows=LAST_ERROR_LINES,
        signatures=(
            Signature(  # not a sure answer: the cause (network, /dev/shm, InfiniBand) is in the lines around it
                role=Role.ROOT_CAUSE,
                triggers=("unhandled system error",),
                pattern=_nccl_error("unhandled system error"),
                confidence=0.75,
                values={"nccl_version": _NOT_PRINTED},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("ncclSystemError",),
                pattern=r"ncclSystemError: System call",
                confidence=0.75,
                values={"nccl_version": _NOT_PRINTED},
            ),
        ),
    )
)

TD481 = register(
    Code(
        code="TD481",
        name="nccl-internal-error",
        family="nccl",
        severity=Severity.ERROR,
        area="distributed",
        title="NCCL failed with 'internal error' (ncclInternalError)",
        message="NCCL failed with 'internal error' (NCCL {nccl_version}): an internal check failed, usually because a "
        "socket to a peer broke during setup.",
        fix="Read the 'Last error:' line after it (e.g. 'Socket recv failed while polling') and look for a peer that "
        "died or was unreachable at the same time. " + _ISOLATE + " If it persists with healthy peers, update NCCL "
        "and report it to the NCCL developers with the NCCL_DEBUG=INFO log.",
        meaning="ncclInternalError: NCCL hit a state it does not expect; in practice it often wraps a remote or "
        "network failure (see nccl#795).",
        why="A peer process exiting during communicator setup, network resets, mismatched NCCL versions between nodes, "
        "rarely a real NCCL bug or memory corruption.",
        false_positives="None for the message itself.",
        across_nodes="TD489",
        related=("TD482", "TD480", "TD490"),
        cause_follows=LAST_ERROR_LINES,
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("internal error",),
                pattern=_nccl_error("internal error"),
                confidence=0.75,
                values={"nccl_version": _NOT_PRINTED},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("ncclInternalError",),
                pattern=r"ncclInternalError: Internal check failed",
                confidence=0.7,
                values={"nccl_version": _NOT_PRINTED},
            ),
        ),
    )
)

TD482 = register(
    Code(
        code="TD482",
        name="nccl-remote-error",
        family="nccl",
        severity=Severity.ERROR,
        area="distributed",
        title="NCCL lost a peer: remote process exited or network error (ncclRemoteError)",
        message="NCCL lost contact with a peer (NCCL {nccl_version}): 'remote process exited or there was a network "
        "error'.",
        fix="First look for an earlier failure on another rank (a crash, CUDA OOM or a killed process makes its peers "
        "report exactly this). If every rank was healthy, it is the network: check the peer named in the 'Last "
        "error:' line, the links and InfiniBand ports on both nodes (`ibstat`; nccl#2076 was settled by repairing "
        "InfiniBand on some nodes), then " + _ISOLATE,
        meaning="ncclRemoteError: a send/receive failed because the other side went away or the connection broke.",
        why="A peer rank died (its own log has the reason), a node rebooted or lost its link, or a flaky NIC/cable.",
        false_positives="On the surviving ranks this is a consequence of the first rank's failure, not a network fault.",
        across_nodes="TD489",
        related=("TD483", "TD481", "TD490", "TD350"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("remote process exited",),
                pattern=_nccl_error("remote process exited or there was a network error"),
                confidence=0.6,
                values={"nccl_version": _NOT_PRINTED},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("ncclRemoteError",),
                pattern=r"ncclRemoteError: A call failed possibly due to a network error or a remote process",
                confidence=0.55,
                values={"nccl_version": _NOT_PRINTED},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Call to recv from",),  # NCCL's socket layer: the peer went away
                pattern=r"NCCL WARN (?:Net|socketProgressOpt) ?: Call to recv from (?P<peer>\S+) failed ?: "
                r"(?P<error>Connection reset by peer|Connection refused|Broken pipe)",
                confidence=0.55,
                values={"nccl_version": _NOT_PRINTED},
            ),
        ),
    )
)

TD483 = register(
    Code(
        code="TD483",
        name="nccl-ib-completion-error",
        family="nccl",
        severity=Severity.ERROR,
        area="distributed",
        title="an InfiniBand transfer failed (NET/IB completion error)",
        message="An InfiniBand transfer to peer {peer} failed with completion status {status} (vendor error "
        "{vendor_err}); status 12 means the link retries were exhausted, 5 that work was flushed after an "
        "earlier error.",
        fix="Check the InfiniBand fabric between this node and the peer: `ibstat` / `ibv_devinfo` (port State: Active), "
        "link error counters, the HCAs and GID index NCCL uses (`NCCL_IB_HCA`, `NCCL_IB_GID_INDEX` for RoCE). "
        "`NCCL_IB_DISABLE=1` confirms it by running over TCP (slower). Exclude the faulty node from the job.",
        meaning="The ibverbs work completion for one of NCCL's RDMA operations reported an error instead of success.",
        why="A bad cable or port, a switch problem, a peer node that rebooted or hung, RoCE misconfiguration.",
        false_positives="Status 5 (flushed) lines follow the first real error; the first completion error is the one "
        "to read.",
        related=("TD482", "TD480"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Got completion from peer",),
                pattern=r"NET/IB\w*\s?:\s?Got completion from peer (?P<peer>\S+) with (?:error |status=)"
                r"(?P<status>\d+),? opcode[ =]\d+,? len[ =]\d+,? vendor err (?P<vendor_err>\d+)",
                confidence=0.85,
            ),
            # older NCCL 2 releases (2.8.3 in NVIDIA/nccl#426) named no peer: "NET/IB : Got completion with error 12,
            # opcode 0, len 0, vendor err 129"; the first NCCL 2 releases printed no len
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Got completion with error",),
                pattern=r"NET/IB\w*\s?:\s?Got completion with error (?P<status>\d+), opcode \d+,(?: len \d+,)? "
                r"vendor err (?P<vendor_err>\d+)",
                confidence=0.85,
            ),
        ),
    )
)

TD484 = register(
    Code(
        code="TD484",
        name="nccl-unhandled-cuda-error",
        family="nccl",
        severity=Severity.ERROR,
        area="distributed",
        title="a CUDA call inside NCCL failed (ncclUnhandledCudaError)",
        message="A CUDA call inside NCCL failed ({cuda_error}); NCCL {nccl_version}.",
        fix="The CUDA error in 'Last error: Cuda failure ...' is the cause. 'out of memory': see TD485. 'invalid "
        "argument' or 'unknown error' during setup: GPU peer-to-peer or host-memory registration is failing; test "
        "with `NCCL_P2P_DISABLE=1` and `NCCL_SHM_DISABLE=1` (consumer GPUs, VMs with IOMMU/ACS), check "
        "`nvidia-smi topo -m`, and update the driver / NCCL (nccl#1024 was a bug fixed in NCCL 2.18.6).",
        meaning="ncclUnhandledCudaError: NCCL called the CUDA runtime or driver and got an error back.",
        why="GPU memory exhausted, peer access not supported between the GPUs, a driver/NCCL bug, or a GPU in a bad "
        "state after an earlier error.",
        false_positives="After an earlier CUDA error in the same process (e.g. an illegal memory access), every later "
        "CUDA call fails too; the first error is the cause.",
        related=("TD485", "TD351", "TD310"),
        cause_follows=LAST_ERROR_LINES,
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("unhandled cuda error",),
                pattern=_nccl_error("unhandled cuda error"),
                confidence=0.75,
                values={"nccl_version": _NOT_PRINTED, "cuda_error": "see the 'Last error' line"},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("ncclUnhandledCudaError",),
                pattern=r"ncclUnhandledCudaError: Call to CUDA function failed",
                confidence=0.7,
                values={"nccl_version": _NOT_PRINTED, "cuda_error": "see the 'Last error' line"},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Cuda failure",),
                pattern=r"Cuda failure (?:(?P<cuda_code>\d+) )?'(?P<cuda_error>[^']+)'",
                exclude=(r"Cuda failure (?:\d+ )?'out of memory'",),
                confidence=0.6,
                values={"nccl_version": _NOT_PRINTED},
            ),
        ),
    )
)

TD485 = register(
    Code(
        code="TD485",
        name="nccl-cuda-out-of-memory",
        family="cuda-oom",
        severity=Severity.ERROR,
        area="distributed",
        title="NCCL could not allocate GPU memory for its buffers",
        message="NCCL ran out of GPU memory while setting up or running a collective ({detail}).",
        fix="Leave GPU memory for NCCL: its buffers are allocated per peer and channel when a communicator first "
        "connects, often after the model has filled the GPU. Lower the step's memory (smaller batch, activation "
        "checkpointing), run the first collective (or `init_process_group(..., device_id=...)`) before allocating "
        "the model, try `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, and make sure no other process or "
        "second rank shares the GPU.",
        meaning="NCCL's own cudaMalloc/cudaCalloc failed; torch usually reports it afterwards as ncclUnhandledCudaError.",
        why="The caching allocator (or another process) holds nearly all GPU memory when NCCL needs buffers for a new "
        "peer connection, a new communicator or a larger number of channels.",
        false_positives="None for the message.",
        related=("TD350", "TD484", "TD305"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Cuda failure",),
                pattern=r"(?:NCCL WARN )?(?P<detail>Cuda failure (?:\d+ )?'out of memory')",
                confidence=0.85,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Failed to CUDA calloc",),
                pattern=r"NCCL WARN (?P<detail>Failed to CUDA calloc (?P<bytes>\d+) bytes)",
                confidence=0.85,
            ),
        ),
    )
)

TD486 = register(
    Code(
        code="TD486",
        name="nccl-shm-segment-failed",
        family="nccl",
        severity=Severity.ERROR,
        area="distributed",
        title="NCCL could not create its shared-memory segment in /dev/shm",
        message="NCCL could not create {segment} (size {size}) in /dev/shm: {error}.",
        fix="Give the container a larger /dev/shm: `docker run --shm-size=8g ...` or `--ipc=host`; in Kubernetes mount "
        "an `emptyDir` with `medium: Memory` at /dev/shm (pytorch/ci-infra#490 did exactly that). Remove leftover "
        "`/dev/shm/nccl-*` files of dead jobs. `NCCL_SHM_DISABLE=1` confirms the diagnosis (NCCL then uses P2P or "
        "the network, slower).",
        meaning="NCCL's SHM transport (ranks on one node talking through host memory) creates one file per connection "
        "in /dev/shm (`nccl-*`; `nccl-shm-recv-*` before NCCL 2.8) and extends it with fallocate; that failed.",
        why="Docker's default /dev/shm is 64 MB and several ranks each need a few MB per peer and channel; also a "
        "/dev/shm filled by DataLoader workers or stale segments.",
        false_positives="A 'Cuda failure' just before it (cudaHostRegister failing) points at the CUDA side instead "
        "(nccl#1518); 'Call to shm_open failed : Permission denied' before it means /dev/shm lost its "
        "mode (`chmod 1777 /dev/shm`), not its size.",
        related=("TD487", "TD102", "TD103", "TD104", "TD480"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Error while creating shared memory segment",),
                pattern=r"Error while creating shared memory segment (?P<segment>(?:/dev/shm/)?nccl-\S*) \(size "
                r"(?P<size>\d+)\)(?:, error: (?P<error>[^(]+?) \((?P<errno>\d+)\))?",
                confidence=0.9,
                values={"error": "the segment could not be created or extended"},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Call to posix_fallocate failed",),  # NCCL 2.4-2.7 (include/shm.h)
                pattern=r"NCCL WARN Call to posix_fallocate failed ?: (?P<error>No space left on device)",
                confidence=0.85,
                values={"segment": "a /dev/shm/nccl-* segment", "size": "not printed"},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("failed to extend /dev/shm/nccl-",),
                pattern=r"failed to extend (?P<segment>/dev/shm/nccl-\S+) to (?P<size>\d+) bytes"
                r"(?:, error: (?P<error>[^(]+?) \((?P<errno>\d+)\))?",
                confidence=0.9,
                values={"error": "the segment could not be extended"},
            ),
        ),
    )
)

TD487 = register(
    Code(
        code="TD487",
        name="nccl-shm-attach-failed",
        family="nccl",
        severity=Severity.ERROR,
        area="distributed",
        title="NCCL could not open a peer's shared-memory segment",
        message="NCCL could not attach to {segment} ({size} bytes) that a peer created: {error}.",
        fix="All ranks of a node must see the same /dev/shm: run them in one container or start containers with "
        "`--ipc=host`; make sure nothing removes /dev/shm files while the job runs (systemd-logind `RemoveIPC=yes` "
        "deletes a user's segments at logout; set `RemoveIPC=no`). `NCCL_SHM_DISABLE=1` works around it. nccl#1589 "
        "was settled by going back to NCCL 2.21.5.",
        meaning="The receiving rank opens the /dev/shm/nccl-* file created by the sending rank; it was not there.",
        why="Ranks in different IPC namespaces (separate containers), a cleaner deleting the file, or an NCCL version "
        "regression.",
        false_positives="None known.",
        related=("TD486", "TD104"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Error while attaching to shared memory segment",),
                pattern=r"Error while attaching to shared memory segment (?P<segment>/dev/shm/nccl-\S*) \(size "
                r"(?P<size>\d+)\)(?:, error: (?P<error>[^(]+?) \((?P<errno>\d+)\))?",
                confidence=0.85,
                values={"error": "the segment could not be opened"},
            ),
        ),
    )
)

TD488 = register(
    Code(
        code="TD488",
        name="nccl-duplicate-gpu",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="distributed",
        title="two ranks of one NCCL communicator are on the same GPU",
        message="NCCL refused to build a communicator: {duplicate}.",
        fix="Give each rank its own GPU before the process group is created: "
        "`torch.cuda.set_device(int(os.environ['LOCAL_RANK']))` (or `device_id=` in `init_process_group`), no "
        "hard-coded `cuda:0` / default GPU in the training script (D-FINE#289), `--nproc-per-node` no larger than "
        "the GPUs per node, and CUDA_VISIBLE_DEVICES listing distinct GPUs.",
        meaning="ncclInvalidUsage: NCCL needs every rank of a communicator on a distinct device.",
        why="Every process uses the default device 0, more processes than GPUs, or per-process CUDA_VISIBLE_DEVICES "
        "that overlap.",
        false_positives="None known.",
        related=("TD310", "TD309", "TD356"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Duplicate GPU detected",),
                pattern=r"Duplicate GPU detected : (?P<duplicate>rank (?P<rank>\d+) and rank (?P<other_rank>\d+) "
                r"both on CUDA device (?P<device>\w+))",
                confidence=0.95,
            ),
            Signature(
                role=Role.CONFIRMATION,
                triggers=("invalid usage",),
                pattern=_nccl_error("invalid usage"),
                confidence=0.5,
                values={"duplicate": "invalid usage (the 'Last error' line names the cause)"},
            ),
        ),
    )
)

TD497 = register(
    Code(
        code="TD497",
        name="nccl-socket-family-unsupported",
        family="nccl",
        severity=Severity.ERROR,
        area="distributed",
        title="NCCL could not create a socket: the address family (IPv6 or IPv4) is not supported here",
        message="NCCL could not create its bootstrap/network socket: '{error}'. It picked an address family (usually "
        "IPv6) that this host's kernel or container does not support.",
        fix="Pin NCCL to IPv4 and to an interface that has an IPv4 address: `export NCCL_SOCKET_FAMILY=AF_INET` and "
        "`NCCL_SOCKET_IFNAME=<iface>` (see `ip -br addr`; the same on every node), and make MASTER_ADDR an IPv4 "
        "address. Check that every node has an IP interface at all (`ip -br addr` must show more than `lo`), since "
        "NCCL needs one for its bootstrap even on a single node. Mixed IPv4/IPv6 nodes need the same family "
        "everywhere.",
        meaning="socket() failed with EAFNOSUPPORT: the address NCCL chose (from NCCL_SOCKET_IFNAME, the interface scan or "
        "NCCL_COMM_ID) belongs to a family the kernel has disabled (`ipv6.disable=1`, containers without IPv6).",
        why="IPv6 disabled on the host or in the container while an interface or host name still yields an IPv6 "
        "address, nodes configured differently, or no usable IP interface found at all.",
        false_positives="None known.",
        related=("TD480", "TD411", "TD460"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Socket creation failed",),
                pattern=r"Socket creation failed ?: (?P<error>Address family not supported by protocol)",
                confidence=0.8,
            ),
        ),
    )
)

TD494 = register(
    Code(
        code="TD494",
        name="ddp-unused-parameters",
        family="rank-divergence",
        severity=Severity.ERROR,
        area="distributed",
        title="DDP's gradient reduction never finished: parameters without gradients",
        message="DistributedDataParallel's reduction of the previous iteration never finished: {unused}.",
        fix="Name the parameters: rerun with `TORCH_DISTRIBUTED_DEBUG=DETAIL`. Then make them take part in the loss, "
        "freeze or delete the modules that are not used (`requires_grad_(False)`), or construct "
        "`DistributedDataParallel(model, find_unused_parameters=True)` (costs a graph traversal per step; the "
        "threads this comes from were settled that way).",
        meaning="DDP waits for a gradient of every parameter before it all-reduces a bucket; parameters that got no "
        "gradient keep the reduction open, and the next forward pass detects it.",
        why="Layers defined in `__init__` but not used in `forward`, outputs that do not contribute to the loss, "
        "branches that skip modules on some iterations, or frozen parts that still require grad.",
        false_positives="None known.",
        related=("TD495",),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Expected to have finished reduction in the prior iteration",),
                pattern=r"Expected to have finished reduction in the prior iteration before starting a new one",
                confidence=0.9,
                values={"unused": "some parameters received no gradient"},
            ),
            Signature(
                role=Role.CONFIRMATION,
                triggers=("did not receive grad for rank",),
                pattern=r"Parameter indices which did not receive grad for rank (?P<rank>\d+): "
                r"(?P<indices>\d+(?:[ ,]+\d+)*)",
                confidence=0.6,
                values={"unused": "parameters without gradient are listed by index"},
            ),
            Signature(  # a question about the flag: "how to set the find_unused_parameters", "where ... find_unused_parameters?"
                role=Role.SYMPTOM,
                triggers=("find_unused_parameters",),
                pattern=r"(?i)\b(?:how|where)\b[^.\n?]{0,30}\bfind_unused_parameters\b|\bfind_unused_parameters\b[^.\n]{0,40}\?",
                exclude=(r"Expected to have finished reduction", r"(?i)find_unused_parameters=True was specified"),
                confidence=0.5,
                values={"unused": "the report is about parameters without gradients (find_unused_parameters)"},
                confirm="Rerun with `TORCH_DISTRIBUTED_DEBUG=DETAIL`: DDP then names the parameters that got no "
                "gradient; 'Expected to have finished reduction in the prior iteration' confirms it.",
            ),
        ),
    )
)

TD495 = register(
    Code(
        code="TD495",
        name="ddp-model-mismatch-across-ranks",
        family="rank-divergence",
        severity=Severity.ERROR,
        area="distributed",
        title="ranks built different models, so DDP refuses to start",
        message="DDP needs the same model on every rank, but rank {rank} has {params} parameters while rank "
        "{other_rank} has {other_params}.",
        fix="Build and prepare the model identically on every rank before wrapping it: no rank-0-only branches (loading "
        "adapters / LoRA, freezing, `requires_grad` changes), the same config and checkpoint on every node, "
        "`num_processes` in the accelerate config equal to the processes launched (flow_grpo#245), and do not wrap "
        "a model in DDP twice (kronfluence#41). A count of 0 usually means that rank has no trainable parameters.",
        meaning="DDP compares the number and shapes of trainable parameters across ranks at construction time.",
        why="Code paths that differ by rank, different files or versions on different nodes, or a library that wraps "
        "the model again.",
        false_positives="None known.",
        related=("TD494",),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("DDP expects same model across all ranks",),
                pattern=r"DDP expects same model across all ranks, but Rank (?P<rank>\d+) has (?P<params>\d+) "
                r"params, while rank (?P<other_rank>\d+) has inconsistent (?P<other_params>\d+) params",
                confidence=0.95,
            ),
        ),
    )
)


_HANG = r"(?:hangs?|hung|hanging|stuck|freez\w*|frozen|deadlock\w*)"
_PCIE_CARD = r"(?:RTX ?)?(?:[2345]0[5-9]0(?: ?Ti)?|A[2-6]000|A4500|A5500|A40)"
"""GeForce RTX 20xx-50xx and PCIe workstation cards (A2000-A6000, A40): P2P missing or behind ACS/IOMMU."""
_HANG_WORDS = (
    " hang",
    "Hang",
    " hung",
    "stuck",
    "Stuck",
    "freez",
    "Freez",
    "frozen",
    "Frozen",
    "deadlock",
    "Deadlock",
    "HANG",
)
"""Triggers for a hang word (' hang': not 'change', 'exchange')."""
_P2P_CONFIRM = (
    "Rerun with `NCCL_P2P_DISABLE=1`: if the hang goes away, P2P is broken on this node "
    "(`nvidia-smi topo -m`, CUDA's `p2pBandwidthLatencyTest`)."
)

_GLOO_CONFIRM = (
    'Run the same script once with `backend="gloo"` and once with NCCL and `NCCL_DEBUG=INFO`: gloo finishing where NCCL '
    "stops rules out the application's collectives; then `NCCL_P2P_DISABLE=1` (and `NCCL_SHM_DISABLE=1`, "
    "`NCCL_IB_DISABLE=1`) one at a time names the transport."
)

TD498 = register(
    Code(
        code="TD498",
        name="nccl-p2p-hang",
        family="nccl",
        severity=Severity.ERROR,
        area="distributed",
        title="NCCL collectives hang inside one node: GPU peer-to-peer (P2P) transfers do not work",
        message="NCCL hangs (or only works with NCCL_P2P_DISABLE=1): GPU peer-to-peer transfers between the GPUs of "
        "this node most likely never complete.",
        fix="Confirm with `NCCL_P2P_DISABLE=1` (slower, but the hang goes away) or run CUDA's `p2pBandwidthLatencyTest` / "
        "nccl-tests' `all_reduce_perf -g <n>`. The usual cause is PCIe ACS or the IOMMU redirecting P2P traffic: "
        "disable ACS on the PCI switches, disable VT-d in the BIOS or boot with `iommu=pt` (`intel_iommu=off`); in "
        "VMs, P2P often needs the hypervisor's support. Consumer GPUs (GeForce RTX 40xx) have no P2P: keep "
        "`NCCL_P2P_DISABLE=1` there, or update driver and NCCL. `nvidia-smi topo -m` shows how the GPUs are "
        "connected (PIX/PXB/PHB/SYS).",
        meaning="Within a node NCCL moves data directly between GPUs (P2P over PCIe or NVLink) when the topology "
        "says it can; if the platform silently drops or reroutes those writes, the receiving GPU spins forever.",
        why="ACS enabled on PCIe switches, IOMMU/VT-d on bare metal, virtualisation, or GPUs/drivers whose P2P is broken "
        "or unsupported; it often shows only with more than two GPUs (when a ring crosses a PCIe switch).",
        false_positives="A hang in one rank's code (a collective only some ranks call) looks the same; that one does not "
        "go away with NCCL_P2P_DISABLE=1 and also hangs with the gloo backend.",
        related=("TD480", "TD484", "TD490"),
        # Prose. Each signature's triggers are its *last* words: a line cut inside the pattern must reach them.
        signatures=(
            Signature(
                role=Role.SYMPTOM,
                triggers=("work", "Work", "fix", "Fix", "solv", "Solv", "resolv", "Resolv", "help", "Help"),
                pattern=r"(?i)NCCL_P2P_DISABLE\s*=\s*1\b[^\n]{0,80}\b(?:works?|worked|working|fix\w*|"
                r"solv\w*|resolv\w*|helps?|helped)\b",
                # "both didnt work", "does not help": the test came out negative
                exclude=(
                    r"(?i)\b(?:did ?n[o']?t|does ?n[o']?t|do ?n[o']?t|didnt|doesnt|dont|not|no longer|won'?t|never|"
                    r"neither|nor)\s+(?:\w+\s+)?(?:work|fix|solv|resolv|help)",
                ),
                confidence=0.7,
                confirm="Run once with `NCCL_P2P_DISABLE=1` and once without; then `nvidia-smi topo -m` and CUDA's "
                "`p2pBandwidthLatencyTest` show which GPU pairs fail.",
            ),
            # NCCL's own benchmarks hanging: no application code that could skip a collective, so the transport
            Signature(
                role=Role.SYMPTOM,
                triggers=_HANG_WORDS,
                pattern=rf"(?i)\b(?:all_reduce_perf|\w+_perf|nccl-tests|NCCL tests?|P2P)\b[^\n]{{0,60}}\b{_HANG}\b",
                confidence=0.6,
                confirm=_P2P_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=_HANG_WORDS,
                pattern=rf"(?i)\b(?:NCCL|all_?reduce)\b[^\n]{{0,60}}\b{_HANG}\b",
                confidence=0.45,
                confirm=_P2P_CONFIRM,
            ),
            # the same program runs with gloo and stops with NCCL: not the application's collectives, NCCL's transport
            Signature(  # "hangs with 4 gpus with backend="NCCL" but not "gloo"", "stuck with `nccl`, but works with `gloo`"
                role=Role.SYMPTOM,
                triggers=("gloo", "Gloo", "GLOO"),
                pattern=r"(?i)\bnccl\b[^\n]{0,80}?\b(?:but|while|whereas)\s+(?:not\s+|it\s+)?(?:(?:works?|runs?|is)\s+"
                r"(?:fine\s+|ok\s+|well\s+)?)?(?:with\s+|using\s+|on\s+)?(?:the\s+)?(?:backend\s*=?\s*)?[`\"']{0,2}gloo\b",
                confidence=SYMPTOM_MAX,  # the comparison rules out the application's collectives
                confirm=_GLOO_CONFIRM,
            ),
            Signature(  # "gloo backend works, but nccl deadlock"
                role=Role.SYMPTOM,
                triggers=("nccl", "NCCL", "Nccl"),
                pattern=r"(?i)\bgloo\b[^\n]{0,40}?\b(?:works?|worked|runs?|is fine|fine)\b[^\n]{0,20}?\bbut\b[^\n]{0,30}?"
                r"\bnccl\b",
                confidence=SYMPTOM_MAX,  # the comparison rules out the application's collectives
                confirm=_GLOO_CONFIRM,
            ),
            # NCCL's kernels spin while they wait: a hang with every GPU busy at 100% and no error is a transfer
            # that never lands (at the start of training, with no error line, P2P is the usual reason)
            Signature(  # "hangs forever with GPU at 100%", "freezes or hangs with 100% GPU Utilization"
                role=Role.SYMPTOM,
                triggers=("100%", "100 %"),
                pattern=rf"(?i)\b{_HANG}\b[^\n]{{0,40}}?(?:\bGPUs?\b[^\n]{{0,40}}?\b100 ?%|\b100 ?% ?(?:\w+ ){{0,2}}GPU)",
                confidence=0.55,
                confirm=_P2P_CONFIRM,
            ),
            # GPUs without working peer-to-peer (GeForce RTX 40xx have none; PCIe workstation cards behind ACS or an
            # IOMMU): "Deadlock in distribution with multiple 4090", "stuck at the first iteration on A40 GPUs"
            Signature(
                role=Role.SYMPTOM,
                triggers=_HANG_WORDS,
                pattern=rf"(?i)\b{_HANG}\b[^\n]{{0,80}}?\b{_PCIE_CARD}\b|\b{_PCIE_CARD}s?\b[^\n]{{0,80}}?\b{_HANG}\b",
                confidence=0.55,
                confirm=_P2P_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("GPUs",),
                pattern=rf"(?i)\b{_HANG}\b[^\n]{{0,60}}\b(?:when using|with|on|using) (?:\d+|two|three|four|eight|"
                rf"multiple) (?:or more )?(?:\w+ ){{0,3}}GPUs\b",
                confidence=0.5,
                confirm=_P2P_CONFIRM,
            ),
        ),
    )
)

TD499 = register(
    Code(
        code="TD499",
        name="ranks-out-of-sync",
        family="rank-divergence",
        severity=Severity.ERROR,
        area="distributed",
        title="the ranks do different things (shapes, steps or random state), so collectives block or disagree",
        message="The ranks most likely went out of sync: {hint}.",
        fix="Make every rank take the same decisions and call the same collectives with the same shapes: decide to skip "
        "a step on all ranks together (all_reduce a flag; never `return None` / `continue` on one rank under DDP), "
        "pad tensors to the same shape before `all_gather` (gather the sizes first, pad to the maximum, trim after), "
        "give every rank the same number of batches (`DistributedSampler(drop_last=True)` or DDP's `join()`), and "
        "sync the seed and RNG state across all processes (broadcast rank 0's seed). `TORCH_DISTRIBUTED_DEBUG=DETAIL` "
        "checks collective shapes and order across ranks.",
        meaning="Collectives need every rank to call them in the same order with matching sizes; when one rank skips, "
        "adds or resizes a call the others wait for ever or exchange the wrong data.",
        why="Data-dependent branches (NaN loss, empty batch) taken on one rank, variable-length tensors in all_gather, "
        "uneven data shards, per-rank random seeds that decide control flow.",
        false_positives="A crashed or slow rank also makes the others wait; look for its error first.",
        related=("TD494", "TD495", "TD490", "TD493"),
        # Prose. Each signature's triggers are its *last* words: a line cut inside the pattern must reach them.
        signatures=(
            Signature(
                role=Role.SYMPTOM,
                triggers=("variable", "Variable", "different", "Different", "uneven", "Uneven", "not the same"),
                pattern=r"(?i)\ball[_-]?gather\w*\b[^\n]{0,120}\b(?:variable[- ](?:length|size|shape)\w*|different "
                r"(?:length|size|shape|dimension)s?|(?:un)?even[- ]sized?|not the same (?:length|size|shape))",
                confidence=0.6,
                values={"hint": "tensors of different shapes were passed to all_gather"},
                confirm="Print `tensor.shape` on every rank just before the all_gather (or run with "
                "`TORCH_DISTRIBUTED_DEBUG=DETAIL`): different shapes confirm it.",
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    "DDP",
                    "ddp",
                    "multi",
                    "Multi",
                    "istributed",
                    " hang",
                    "Hang",
                    "freez",
                    "Freez",
                    "stuck",
                    "out of sync",
                ),
                pattern=r"(?i)\b(?:return(?:s|ing)? None|skip(?:s|ping)? (?:the |a |this |some )?(?:current )?"
                r"(?:batch|step|iteration|training[_ ]step)\w*|uneven (?:number of )?(?:batch|input|data)\w*|"
                r"if one (?:GPU|rank|process) gets)\b[^\n]{0,100}\b(?:DDP|multi[- ]?GPU|distributed|"
                r"hangs?|hang|freez\w*|stuck|out of sync)\b",
                confidence=0.55,
                values={"hint": "one rank skipped a step (or ran out of batches) while others did not"},
                confirm="Log the step counter and whether backward ran on every rank; a rank that skips where the "
                "others do not confirms it.",
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("seed",),
                pattern=r"(?i)\b(?:each|every|all)\b[^\n]{0,40}\b(?:process(?:es)?|ranks?|GPUs?|workers?|instances?|"
                r"replicas?)\b[^\n]{0,60}\bdifferent (?:random )?seeds?\b",
                confidence=0.45,
                values={"hint": "the processes draw different random seeds"},
                confirm="Print the seed (and `torch.initial_seed()`) on every rank, at start and after resuming.",
            ),
        ),
    )
)
