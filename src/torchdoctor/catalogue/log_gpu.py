"""TD350-399: GPU failures as they show up in logs (``explain``): CUDA out of memory, unusable devices.

These are the observed counterparts of the GPU preflight codes in ``catalogue/gpu.py`` (TD3xx): a
preflight code predicts a failure from the machine's facts, a code here recognises it in a log, and
the two point to each other with ``related=``. Positive and near-miss fixtures (real text, with the
public report they come from) live in ``tests/fixtures/logs/<CODE>/``.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature
from .log_dist import MULTI_NODE

#: A size as torch's caching allocator prints it (``format_size``): "2.26 GiB", "576.00 KiB", "0 bytes".
SIZE = r"\d+(?:\.\d+)? (?:bytes|[KMGTPE]iB)"

_OOM_FIX = (
    "Make the step fit: lower the per-GPU batch size (keep the global batch with gradient accumulation), "
    "use mixed precision (`torch.autocast`) and activation checkpointing, or shard the model (FSDP / ZeRO). "
    "If much memory is reserved but unallocated, start with "
    "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` to avoid fragmentation. If other processes hold "
    "the GPU, stop them or pick a free GPU (`nvidia-smi`, `CUDA_VISIBLE_DEVICES`). In a multi-rank job "
    "check whether one rank gets larger inputs than the others."
)

_GPU_WORD = r"(?:[AHVPTLK]\d{2,3}|RTX ?\w*\d{3,4}\w*|GTX ?\d{3,4}|Tesla|GPUs?|VRAM|\d+ ?G(?:i?B)? (?:GPU|card|VRAM))"
"""A GPU named in prose: a model (A100, RTX 3090, Tesla), 'GPU', 'VRAM', '24GB card'."""

TD350 = register(
    Code(
        code="TD350",
        name="cuda-out-of-memory",
        family="cuda-oom",
        severity=Severity.ERROR,
        area="gpu",
        title="the CUDA caching allocator could not get memory for a tensor",
        message="GPU {gpu} ran out of memory: torch tried to allocate {requested} while only {free} of {total} "
        "were free.",
        fix=_OOM_FIX,
        meaning="torch's CUDA caching allocator asked the driver for a new block and the GPU had no room left, even "
        "after freeing its own cached blocks. The numbers on the error line tell whether the process itself "
        "holds the memory (allocated / reserved by PyTorch) or other processes do (torch >= 2.1 lists them "
        "as 'Process N has X memory in use').",
        why="Activations of a large batch or long sequence, a model that does not fit without sharding, memory kept "
        "alive by references (losses accumulated with their graph), fragmentation (reserved >> allocated), or "
        "another process on the same GPU. In data-parallel jobs one rank often fails first because its batch "
        "is the largest; the other ranks then time out in their next collective.",
        false_positives="None for the message itself. A request of many exabytes ('Tried to allocate more than 1EB') "
        "is a corrupted size from an earlier failure, not a real shortage.",
        related=("TD351", "TD305", "TD490"),
        signatures=(
            Signature(  # torch < 2.1: "(GPU 0; 6.00 GiB total capacity; 781.59 MiB already allocated; 3.03 GiB free; ...)"
                role=Role.ROOT_CAUSE,
                triggers=("CUDA out of memory",),
                pattern=rf"CUDA out of memory\. Tried to allocate (?P<requested>{SIZE}) \(GPU (?P<gpu>\d+); "
                rf"(?P<total>{SIZE}) total capacity; (?P<allocated>{SIZE}) already allocated; "
                rf"(?P<free>{SIZE}) free;(?: (?P<reserved>{SIZE}) (?:reserved in total by PyTorch|cached))?",
                confidence=0.95,
            ),
            Signature(  # torch >= 2.1: "GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB is free. Process ..."
                role=Role.ROOT_CAUSE,
                triggers=("CUDA out of memory",),
                pattern=rf"CUDA out of memory\. Tried to allocate (?P<requested>{SIZE})\. GPU (?:(?P<gpu>\d+) )? ?has a total "
                rf"capac(?:i)?ty of (?P<total>{SIZE}) of which (?P<free>{SIZE}) is free\."
                rf"(?: Process (?P<other_pid>\d+) has (?P<other_used>{SIZE}) memory in use\.)?"
                rf"(?:(?: Process \d+ has {SIZE} memory in use\.)* Including non-PyTorch memory, this process "
                rf"has (?P<process_used>{SIZE}) memory in use\.)?",
                confidence=0.95,
            ),
            Signature(  # prose: "one A100 with 40 G memory, and it reports 'out of memory'", "OOM error on 40GB A100"
                role=Role.SYMPTOM,
                triggers=("out of memory", "Out of memory", "OUT OF MEMORY", "OOM", "oom"),
                pattern=rf"(?i)\b{_GPU_WORD}\b[^.\n]{{0,80}}?\b(?:out of memory|OOM)\b|\b(?:out of memory|OOM)\b(?: errors?)? "
                rf"(?:on|with) (?:an? |my |the |one )?(?:\d+ ?G(?:i?B)? )?{_GPU_WORD}\b",
                exclude=(
                    r"CUDA out of memory\. Tried",
                    r"(?i)\b(?:RAM|host memory|cpu memory|system memory|swap)\b.{0,30}\b(?:out of memory|OOM)\b",
                    r"(?i)\bout of memory\b.{0,20}\b(?:on|in) (?:the )?(?:CPU|host|RAM)\b",
                ),
                values={"requested": "?", "gpu": "?", "total": "?", "free": "?"},
                confidence=0.55,
                confirm="Watch `nvidia-smi --query-gpu=memory.used,memory.total --format=csv -l 1` while it runs, or "
                "print `torch.cuda.max_memory_allocated()` per step: the GPU filling up before the crash confirms it.",
            ),
        ),
    )
)

TD351 = register(
    Code(
        code="TD351",
        name="cuda-error-out-of-memory",
        family="cuda-oom",
        severity=Severity.ERROR,
        area="gpu",
        title="a CUDA call failed with out of memory outside torch's caching allocator",
        message="A CUDA runtime call failed with 'out of memory' ({error}): the GPU had no memory left for a context, "
        "a library workspace or a kernel launch.",
        fix="Free the GPU first: check `nvidia-smi` for other processes (stale runs, notebooks, a second rank on the "
        "same GPU) and stop them or choose another GPU with `CUDA_VISIBLE_DEVICES`. Then leave headroom for "
        "CUDA's own allocations: " + _OOM_FIX,
        meaning="The error came from the CUDA runtime itself (cudaErrorMemoryAllocation), not from torch's caching "
        "allocator, so no 'Tried to allocate' numbers are printed. It happens when creating a CUDA context, "
        "loading kernels, or in libraries that allocate on their own.",
        why="The GPU is already full (this process's cache, another process, or two ranks sharing one GPU), so even "
        "a small internal allocation cannot be served.",
        false_positives="Because CUDA errors are reported asynchronously, the failing call shown may not be the one "
        "that used the memory.",
        related=("TD350", "TD352", "TD305", "TD310"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("out of memory", "OUT_OF_MEMORY"),
                # THC (torch < 1.5) printed "THCudaCheck FAIL file=<file> line=<n> error=2 : out of memory"
                pattern=r"(?P<error>CUDA error: out of memory|cuda runtime error \(2\) : out of memory|"
                r"CUDA_ERROR_OUT_OF_MEMORY|THCudaCheck FAIL file=\S+ line=\d+ error=2 : out of memory)",
                confidence=0.85,
            ),
        ),
    )
)

TD352 = register(
    Code(
        code="TD352",
        name="cublas-alloc-failed",
        family="cuda-oom",
        severity=Severity.ERROR,
        area="gpu",
        title="cuBLAS could not allocate its workspace (GPU memory exhausted)",
        message="cuBLAS failed with {status}: it could not allocate GPU memory for its handle or workspace.",
        fix="Treat it as GPU out of memory: run on a GPU with enough free memory (one rank per GPU, no other "
        "processes; check `nvidia-smi`), or shrink the step. " + _OOM_FIX,
        meaning="cuBLAS allocates a handle and workspace on first use on each device and stream; "
        "CUBLAS_STATUS_ALLOC_FAILED means that allocation failed.",
        why="The first matrix multiply on a device happens after the caching allocator has already taken nearly all "
        "memory, or other processes fill the GPU.",
        false_positives="Rarely a broken CUDA / cuBLAS installation reports the same status; then it fails even with "
        "an empty GPU.",
        related=("TD350", "TD351", "TD305"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("CUBLAS_STATUS_ALLOC_FAILED",),
                pattern=r"(?P<status>CUBLAS_STATUS_ALLOC_FAILED)(?: when calling `(?P<call>[^`]+)`)?",
                confidence=0.8,
            ),
            Signature(
                # THC (torch <= 1.6) printed the status as text: THCublasCheck maps CUBLAS_STATUS_ALLOC_FAILED to
                # "resource allocation failed" ("cublas runtime error : resource allocation failed at .../THCGeneral.cpp:250").
                # Threads of that time also show it after a device-side assert (an index out of range), hence lower.
                role=Role.ROOT_CAUSE,
                triggers=("cublas runtime error : resource allocation failed",),
                pattern=r"cublas runtime error : resource allocation failed",
                values={"status": "CUBLAS_STATUS_ALLOC_FAILED (THC: 'resource allocation failed')"},
                confidence=0.7,
            ),
        ),
    )
)

TD353 = register(
    Code(
        code="TD353",
        name="cudnn-error-low-memory",
        family="cuda-oom",
        severity=Severity.ERROR,
        area="gpu",
        title="cuDNN failed to initialise or run, most often because the GPU is out of memory",
        message="cuDNN failed with {status}; cuDNN reports a failed allocation this way, so the GPU was most likely "
        "out of memory.",
        fix="Reduce memory first (smaller batch or input size; the threads this comes from were settled by that). If it "
        "still fails with an empty GPU, check that torch's bundled cuDNN is used (`python -c 'import torch; "
        "print(torch.backends.cudnn.version())'`) and no other libcudnn is on `LD_LIBRARY_PATH`. "
        "`torch.backends.cudnn.enabled = False` confirms the diagnosis at the cost of speed.",
        meaning="cuDNN allocates its handle, workspaces and, in cuDNN 8, loads large kernel libraries on first use; when "
        "that fails it returns NOT_INITIALIZED, INTERNAL_ERROR or ALLOC_FAILED rather than an out-of-memory "
        "error with numbers.",
        why="The caching allocator already holds nearly all GPU memory when cuDNN initialises, or the batch needs a "
        "larger workspace than is free.",
        false_positives="A cuDNN library that does not match the CUDA runtime, or a GPU too new for the cuDNN version, "
        "give the same statuses independent of memory.",
        related=("TD350", "TD352"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("CUDNN_STATUS_",),
                pattern=r"\b(?P<status>CUDNN_STATUS_(?:NOT_INITIALIZED|INTERNAL_ERROR|ALLOC_FAILED))\b",
                confidence=0.55,
            ),
        ),
    )
)

TD355 = register(
    Code(
        code="TD355",
        name="cuda-device-busy-or-unavailable",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="CUDA refused the GPU: busy (exclusive mode) or unavailable",
        message="CUDA could not create a context on the GPU: '{error}'.",
        fix="Check the compute mode and who holds the GPU: `nvidia-smi --query-gpu=index,compute_mode --format=csv` "
        "and `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name --format=csv`. Use a GPU nobody holds "
        "(`CUDA_VISIBLE_DEVICES=<free index>`), stop the holder if it is yours, or have an admin allow sharing: "
        "`sudo nvidia-smi -i <index> -c DEFAULT`. In containers, check the GPU was passed in (`--gpus`). "
        "`torchdoctor check` shows compute modes and holders before the run.",
        meaning="cudaErrorDevicesUnavailable: the device exists but no new context may be created on it.",
        why="The GPU is in Exclusive_Process mode and another process (another job, a leftover run, a second rank "
        "mapped to the same GPU) already has a context, or it is in Prohibited mode, or the driver marked it "
        "unusable (broken driver install, virtual GPU without a licence).",
        false_positives="None for the message; its cause must be read from nvidia-smi on the node that failed.",
        related=("TD303", "TD304", "TD306", "TD356"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("busy or unavailable",),
                pattern=r"(?P<error>all CUDA-capable devices are busy or unavailable|"
                r"CUDA-capable device\(s\) is/are busy or unavailable)",
                confidence=0.9,
            ),
        ),
    )
)

TD356 = register(
    Code(
        code="TD356",
        name="cuda-invalid-device-ordinal",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="the code asked for a GPU index this process cannot see",
        message="CUDA reported 'invalid device ordinal': a device index (cuda:N, set_device(N), a --gpu_ids value or "
        "LOCAL_RANK) is not below the number of GPUs this process sees.",
        fix="Count the visible GPUs (`python -c 'import torch; print(torch.cuda.device_count())'`) and index below it. "
        "With torchrun use `torch.cuda.set_device(int(os.environ['LOCAL_RANK']))` and `--nproc-per-node` no larger "
        "than that count; if each task already sees one GPU (`srun --gpus-per-task=1`, CUDA_VISIBLE_DEVICES per "
        "rank), use `cuda:0`. Remove hard-coded `cuda:1` defaults on single-GPU machines.",
        meaning="Device ordinals index the GPUs visible to this process (after CUDA_VISIBLE_DEVICES), starting at 0.",
        why="More processes per node than GPUs, a hard-coded device index, or CUDA_VISIBLE_DEVICES narrowed by the "
        "scheduler while the code still indexes by LOCAL_RANK.",
        false_positives="None known.",
        related=("TD309", "TD307", "TD308"),
        # on a log that shows several nodes (the words of the report, ranks on several hosts): the global rank used as
        # the device index (tuning half: both reports with it and the words of a multi-node run were settled so)
        across_nodes="TD479",
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("invalid device ordinal",),
                # cudaErrorInvalidDevice is 10 up to CUDA 10.2 and 101 since CUDA 11; THC printed "error=N :", DGL "CUDA:"
                pattern=r"(?:CUDA error(?: \(\d+\))?: |cuda runtime error \(\d+\) : |error=\d+ : |Error \d+: |CUDA: )"
                r"invalid device ordinal",
                exclude=(MULTI_NODE,),  # on a multi-node run: the global rank used as the index (TD479)
                # the message is certain, its family is not: of 24 labelled reports with it (tuning half and the old
                # set), 9 were settled as a launcher starting more processes than the node has GPUs (dist-env)
                confidence=0.7,
            ),
        ),
    )
)

TD357 = register(
    Code(
        code="TD357",
        name="cuda-driver-too-old-for-torch",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="the NVIDIA driver is older than the CUDA version torch was built with",
        message="CUDA cannot start: the NVIDIA driver is too old for this torch build (driver version reported: "
        "{found}).",
        fix="Update the NVIDIA driver to one supporting torch's CUDA version (`python -c 'import torch; "
        "print(torch.version.cuda)'` vs the 'CUDA Version' in `nvidia-smi`), or install a torch build for an older "
        "CUDA: `pip install torch --index-url https://download.pytorch.org/whl/cu<NNN>`. In containers the host "
        "driver counts, not the image's CUDA.",
        meaning="torch's CUDA runtime needs a driver that supports at least its CUDA major version; the number in "
        "'found version 11040' is the driver's CUDA version (11.4).",
        why="pip installs the newest CUDA build of torch while the machine's driver is older, or a container image "
        "with a newer CUDA runs on an old host driver.",
        false_positives="None known.",
        related=("TD311", "TD302"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("driver on your system is too old",),
                pattern=r"NVIDIA driver on your system is too old(?: \(found version (?P<found>\d+)\))?",
                confidence=0.95,
                values={"found": "not printed"},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("CUDA driver version is insufficient",),
                pattern=r"CUDA driver version is insufficient for CUDA runtime version",
                confidence=0.9,
                values={"found": "not printed"},
            ),
        ),
    )
)

TD358 = register(
    Code(
        code="TD358",
        name="cuda-no-nvidia-driver",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="torch found no NVIDIA driver",
        message="torch found no NVIDIA driver, so CUDA cannot be used in this environment.",
        fix="Check `nvidia-smi` works where the job runs. In Docker start with `--gpus all` (NVIDIA Container Toolkit); "
        "in Kubernetes request `nvidia.com/gpu`; under Slurm request GPUs (`--gres=gpu:N`). On a machine without "
        "a GPU, run on CPU: remove `.cuda()` calls or use `device = 'cuda' if torch.cuda.is_available() else 'cpu'`.",
        meaning="libcuda (the driver library) could not be loaded or found no device.",
        why="No driver installed, a container started without the NVIDIA runtime, or code that calls `.cuda()` on a "
        "CPU-only machine.",
        false_positives="None known.",
        related=("TD301", "TD359"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Found no NVIDIA driver",),
                pattern=r"Found no NVIDIA driver on your system",
                confidence=0.95,
            ),
        ),
    )
)

TD359 = register(
    Code(
        code="TD359",
        name="cuda-no-gpus-visible",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="CUDA sees no GPU (CUDA_VISIBLE_DEVICES hides them or the job got none)",
        message="CUDA initialised but found no usable GPU ('No CUDA GPUs are available' or 'no CUDA-capable device is "
        "detected').",
        fix="Check what the process sees: `echo $CUDA_VISIBLE_DEVICES` and `nvidia-smi -L`. Set CUDA_VISIBLE_DEVICES to "
        "GPUs that exist on this machine (e.g. `0` on a single-GPU box, not an index copied from a multi-GPU "
        "script), before the process starts; under Slurm request GPUs for the job.",
        meaning="The driver works but the list of devices visible to this process is empty.",
        why="CUDA_VISIBLE_DEVICES set (often inside the script) to an index the machine does not have, empty, or -1; "
        "a scheduler that gave the job no GPU.",
        false_positives="None known.",
        related=("TD308", "TD307", "TD358"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("No CUDA GPUs are available",),
                pattern=r"No CUDA GPUs are available",
                confidence=0.9,
            ),
            Signature(  # cudaErrorNoDevice: 38 up to CUDA 10.2 ("cuda runtime error (38)", THC's "error=38 :"), 100 since
                role=Role.ROOT_CAUSE,
                triggers=("no CUDA-capable device is detected",),
                pattern=r"(?:cuda runtime error \(\d+\) : |error=\d+ : |CUDA error(?: \(\d+\))?: )"
                r"no CUDA-capable device is detected",
                confidence=0.85,
            ),
        ),
    )
)

TD360 = register(
    Code(
        code="TD360",
        name="torch-not-compiled-with-cuda",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="CUDA was requested from a CPU-only torch build",
        message="The installed torch has no CUDA support ('Torch not compiled with CUDA enabled') but the code moved "
        "something to a CUDA device.",
        fix="Install a CUDA build of torch (`pip install torch --index-url https://download.pytorch.org/whl/cu<NNN>`, "
        "see https://pytorch.org/get-started/locally/) and check `python -c 'import torch; "
        "print(torch.version.cuda, torch.cuda.is_available())'`; or run on CPU (`device='cpu'`).",
        meaning="CPU wheels contain no CUDA kernels, so any `.cuda()` / `device='cuda'` fails at the first use.",
        why="A CPU wheel from PyPI's default index on Windows/macOS, a `+cpu` pin, or code that assumes a GPU.",
        false_positives="None known.",
        related=("TD302",),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Torch not compiled with CUDA enabled",),
                pattern=r"Torch not compiled with CUDA enabled",
                exclude=(r"raise AssertionError\(",),
                confidence=0.95,
            ),
        ),
    )
)

TD361 = register(
    Code(
        code="TD361",
        name="cuda-unknown-error-at-init",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="CUDA initialisation failed with 'CUDA unknown error'",
        message="CUDA failed to initialise ('CUDA unknown error') and torch set the number of usable GPUs to zero.",
        fix="Do not change CUDA_VISIBLE_DEVICES after the process has started (set it in the shell or before importing "
        "torch). If that is not it, the driver's unified-memory module is usually stuck: reload it with "
        "`sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm`, or reboot; after a driver update, reboot.",
        meaning="cuInit returned CUDA_ERROR_UNKNOWN; torch then treats the machine as having no GPU.",
        why="nvidia_uvm missing or wedged (often after suspend/resume or many runs), a driver update without reboot, "
        "or CUDA_VISIBLE_DEVICES modified inside the process after CUDA was touched.",
        false_positives="None known.",
        related=("TD301", "TD362"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("CUDA unknown error",),
                pattern=r"CUDA unknown error - this may be due to an incorrectly set up environment",
                confidence=0.85,
            ),
            Signature(  # torch <= 1.4: THC's check of cudaGetDeviceCount in THCudaInit (cudaErrorUnknown: 30, 999 from
                # CUDA 10.1), printed by THCudaCheck and raised as "cuda runtime error (N) : unknown error at ..."
                role=Role.ROOT_CAUSE,
                triggers=("THCGeneral.c",),
                pattern=r"(?:cuda runtime error \((?:30|999)\) : unknown error at \S*THCGeneral\.cp?p?:\d+|"
                r"THCudaCheck FAIL file=\S*THCGeneral\.cp?p? line=\d+ error=(?:30|999) : unknown error)",
                confidence=0.75,
            ),
        ),
    )
)

TD362 = register(
    Code(
        code="TD362",
        name="nvml-driver-library-mismatch",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="the loaded NVIDIA kernel module and the user-space driver library differ",
        message="NVML cannot start: 'Driver/library version mismatch' (kernel module and libnvidia-ml are different "
        "driver versions).",
        fix="Reboot the node after a driver update (or unload and reload the nvidia kernel modules when no process uses "
        "the GPU: `sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`); make sure only "
        "one driver version is installed.",
        meaning="The kernel module still loaded is from the old driver while the libraries on disk are the new one.",
        why="A driver upgrade (often an unattended package upgrade) without a reboot.",
        false_positives="None known.",
        related=("TD311", "TD361"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Driver/library version mismatch",),
                pattern=r"Failed to initialize NVML: Driver/library version mismatch",
                confidence=0.95,
            ),
        ),
    )
)

TD363 = register(
    Code(
        code="TD363",
        name="cuda-no-kernel-image",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="torch (or an extension) has no kernels for this GPU's architecture",
        message="A CUDA kernel could not launch: 'no kernel image is available for execution on the device' (the build "
        "does not include this GPU's compute capability).",
        fix="Compare `python -c 'import torch; print(torch.cuda.get_device_capability(), torch.cuda.get_arch_list())'`; "
        "install a torch build whose arch list includes the GPU (newer GPUs need newer CUDA builds, very old GPUs "
        "are dropped from new builds), and rebuild custom CUDA extensions with `TORCH_CUDA_ARCH_LIST` set to it.",
        meaning="The binary contains machine code (SASS/PTX) only for other GPU generations.",
        why="An old torch on a new GPU, a new torch on a GPU its builds no longer support, or an extension compiled "
        "for another machine's GPU.",
        false_positives="None known.",
        related=("TD302", "TD311"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("no kernel image is available",),
                pattern=r"no kernel image is available for execution on the device",
                confidence=0.9,
            ),
        ),
    )
)

TD364 = register(
    Code(
        code="TD364",
        name="cuda-async-error-advice",
        family="gpu-unavailable",
        severity=Severity.INFO,
        area="gpu",
        title="CUDA's standard advice printed after a CUDA error",
        message="torch's note that CUDA errors are reported asynchronously ({hint}); it accompanies a CUDA error and is "
        "not a cause by itself.",
        fix="Read the CUDA error printed just before this line. To find the call that really failed, rerun with "
        "`CUDA_LAUNCH_BLOCKING=1` (slow; for debugging only).",
        meaning="Kernels run asynchronously, so an error can surface at a later, unrelated call; the traceback may point "
        "at the wrong line.",
        why="Printed by torch after every CUDA error it raises.",
        false_positives="It is advice, never a diagnosis.",
        related=("TD351", "TD355", "TD356"),
        signatures=(
            Signature(
                role=Role.ADVICE,
                triggers=("might be asynchronously reported",),
                pattern=r"CUDA kernel errors might be asynchronously reported at some other API call",
                confidence=0.3,
                values={"hint": "kernel errors might be reported at another API call"},
            ),
            Signature(
                role=Role.ADVICE,
                triggers=("consider passing CUDA_LAUNCH_BLOCKING=1",),
                pattern=r"For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
                confidence=0.3,
                values={"hint": "run with CUDA_LAUNCH_BLOCKING=1 to debug"},
            ),
            Signature(
                role=Role.ADVICE,
                triggers=("TORCH_USE_CUDA_DSA",),
                pattern=r"Compile with `?TORCH_USE_CUDA_DSA`? to enable device-side assertions",
                confidence=0.3,
                values={"hint": "compile with TORCH_USE_CUDA_DSA for device-side assertions"},
            ),
        ),
    )
)


_GPU0 = r"(?:GPU[- ]?:?0|cuda:0|(?:the )?first GPU)"
_GPU0_CONFIRM = (
    "Run `nvidia-smi` during training: the same PIDs listed under GPU 0 and under their own GPU confirm it; "
    "then look for `torch.load` without `map_location` and CUDA use before `set_device`."
)

TD365 = register(
    Code(
        code="TD365",
        name="gpu0-memory-from-other-ranks",
        family="cuda-oom",
        severity=Severity.WARNING,
        area="gpu",
        title="every rank puts memory on GPU 0 (reported as GPU 0 using more memory than the others)",
        message="GPU 0 holds more memory than the other GPUs: other ranks most likely create CUDA contexts or tensors on "
        "GPU 0 as well as on their own GPU, which runs GPU 0 out of memory first.",
        fix="Pin each process to its own GPU before any CUDA work: `torch.cuda.set_device(local_rank)` with "
        "`local_rank = int(os.environ['LOCAL_RANK'])`, and `DDP(model, device_ids=[local_rank])`. Load checkpoints "
        "with `torch.load(path, map_location=torch.device('cuda', local_rank))` (or `map_location='cpu'`): without "
        "map_location every rank restores the tensors onto the GPU they were saved from, usually GPU 0. Avoid "
        "bare `.cuda()` / `'cuda'` / `torch.cuda.empty_cache()` before `set_device`. `nvidia-smi` lists the "
        "processes holding memory on GPU 0.",
        meaning="A CUDA context costs a few hundred MB per process and device; a process that touches GPU 0 (the default "
        "device) keeps a context and its cached blocks there for its lifetime.",
        why="`torch.load` of a checkpoint saved from cuda:0 without map_location, tensors created with the default "
        "device before `set_device`, or DataParallel (which gathers outputs on GPU 0) instead of DDP.",
        false_positives="Rank 0 legitimately doing extra work (evaluation, logging, a larger batch) also uses more "
        "memory; then every process appears once in nvidia-smi's list for GPU 0.",
        related=("TD350", "TD488", "TD356"),
        # Prose. Each signature's triggers are its *last* words: a line cut inside the pattern must reach them.
        signatures=(
            Signature(
                role=Role.SYMPTOM,
                triggers=("memory", "Memory"),
                pattern=rf"(?i){_GPU0}\b[^.\n]{{0,60}}\b(?:more|higher|larger|extra|additional)\b[^.\n]{{0,25}}\bmemory\b",
                confidence=0.6,
                confirm=_GPU0_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("higher", "more", "larger", "Higher", "More", "Larger"),
                pattern=rf"(?i)\bmemory (?:usage |use )?(?:of|on|in) {_GPU0}\b[^.\n]{{0,40}}\b(?:higher|more|larger)\b",
                confidence=0.6,
                confirm=_GPU0_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    "GPU0",
                    "GPU 0",
                    "gpu0",
                    "gpu 0",
                    "GPU:0",
                    "gpu:0",
                    "GPU-0",
                    "cuda:0",
                    "first GPU",
                    "first gpu",
                ),
                pattern=rf"(?i)\b(?:each|every|all|other) (?:DDP )?(?:process|rank)(?:es|s)?\b[^.\n]{{0,40}}"
                rf"\b(?:memory|allocat\w*)\b[^.\n]{{0,30}}\b(?:on|of|in) {_GPU0}",
                confidence=0.6,
                confirm=_GPU0_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("unbalance", "imbalance", "Unbalance", "Imbalance"),
                pattern=r"(?i)\b(?:GPU|memory)\b[^.\n]{0,25}\b(?:unbalanced|imbalanced|unbalance|imbalance)\b",
                confidence=0.5,
                confirm=_GPU0_CONFIRM,
            ),
        ),
    )
)
