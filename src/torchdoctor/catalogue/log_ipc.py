"""TD15x-19x: shared memory, memory maps and descriptors as they show up in logs (``explain``).

Each code carries the signatures that recognise it; positive and near-miss fixtures live in
``tests/fixtures/logs/<CODE>/``.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature

TD150 = register(
    Code(
        code="TD150",
        name="fd-ancdata-exhausted",
        family="fd-exhausted",
        severity=Severity.ERROR,
        area="shm",
        title="a process ran out of file descriptors while receiving shared tensors",
        message="A tensor's file descriptor could not be received (`received {items} items of ancdata`): the receiving "
        "process hit its open-file limit under the file_descriptor sharing strategy.",
        fix="Raise the limit before starting (`ulimit -n $(ulimit -Hn)`), or call "
        "`torch.multiprocessing.set_sharing_strategy('file_system')` in every process, or share fewer, larger "
        "tensors (stack them, or return numpy arrays from the dataset).",
        meaning="With the file_descriptor strategy every tensor storage passed between processes travels as a file "
        "descriptor over a Unix socket; each one kept alive by the receiver stays open. When the receiver is at "
        "RLIMIT_NOFILE, the kernel drops the descriptors and Python reports 0 items of ancdata.",
        why="Many small tensors in flight or kept (a list of received tensors, a dataset shared to spawn workers) and "
        "a soft open-file limit of 1024 or a few thousand.",
        false_positives="The same message appears for any SCM_RIGHTS transfer that loses its descriptors, e.g. a peer "
        "closing the socket early; check that the open-file limit is really low.",
        related=("TD111",),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("items of ancdata",),
                pattern=r"received (?P<items>\d+) items of ancdata",
                confidence=0.9,
            ),
        ),
    )
)

_FD_RAISE = (
    "Raise the soft open-file limit before training starts (`ulimit -n $(ulimit -Hn)` in the job script; "
    "Docker `--ulimit nofile=65536:65536`)"
)

TD151 = register(
    Code(
        code="TD151",
        name="shm-open-emfile",
        family="fd-exhausted",
        severity=Severity.ERROR,
        area="shm",
        title="sharing a tensor failed: no file descriptor left to open its shared-memory segment",
        message="torch could not open the shared-memory segment `{segment}` for a tensor (`Too many open files (24)`): "
        "under the file_descriptor strategy every shared storage keeps one descriptor open, and this process "
        "reached RLIMIT_NOFILE. Typically a DataLoader with spawn/forkserver workers pickling a dataset of many "
        "tensors, or many tensors sent through torch.multiprocessing queues.",
        fix=_FD_RAISE + ". Or let the loader fork so only batches are shared: `DataLoader(..., "
        'multiprocessing_context="fork")`. Or `torch.multiprocessing.set_sharing_strategy("file_system")` right '
        "after `import torch` (then vm.max_map_count bounds the count, TD110). Or hold the data in a few large "
        "tensors / numpy arrays.",
        meaning="The file_descriptor strategy (torch's default on Linux) creates a POSIX shared-memory segment per storage "
        "and passes it around as an open descriptor; the sender keeps it open while the storage lives. When the "
        "process already has RLIMIT_NOFILE descriptors open, shm_open fails with EMFILE (24).",
        why="A soft open-file limit of 1024 (or a few thousand) against a dataset or queue traffic of more storages "
        "than that: with spawn/forkserver the whole Dataset is pickled to each worker, each tensor in it a storage.",
        false_positives="Descriptors leaked by other code (files never closed, sockets) exhaust the same limit; "
        "`ls /proc/PID/fd | wc -l` shows what holds them.",
        related=("TD111", "TD112", "TD150", "TD152"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("unable to open shared memory object",),
                pattern=r"unable to open shared memory object <(?P<segment>[^>]+)> in (?P<mode>[\w-]+) mode: "
                r"Too many open files \(24\)",
                confidence=0.9,
            ),
            Signature(
                # torch 0.x (TH's THAllocator.c, THError appends " at <file>:<line>") and 1.x (THAllocator.cpp /
                # MapAllocator.cpp, AT_ERROR) printed no errno; EMFILE is the usual cause, not the only one: weak, so
                # a line that names the errno (a resource_sharer "[Errno 24]", TD153) leads when the log has one.
                role=Role.ROOT_CAUSE,
                triggers=("unable to open shared memory object",),
                pattern=r"unable to open shared memory object <(?P<segment>/torch_[^>]*)> in (?P<mode>read-write) mode"
                r"(?: at \S*THAllocator\.cp?p?:\d+)?\.?[\s`'\"]*$",
                confidence=0.45,
            ),
        ),
    )
)

TD152 = register(
    Code(
        code="TD152",
        name="loader-too-many-open-files",
        family="fd-exhausted",
        severity=Severity.ERROR,
        area="shm",
        title="the DataLoader ran out of file descriptors receiving batches",
        message="The DataLoader could not receive a batch (`Too many open files. Communication with the workers is no "
        "longer possible`): the main process reached RLIMIT_NOFILE, because under the file_descriptor strategy "
        "each batch storage it still holds keeps one descriptor open.",
        fix="Do not keep batches (or tensors sliced from them) alive across iterations: keep `.item()`/`.tolist()` or "
        "`.clone()` results instead. " + _FD_RAISE + ". Or call "
        '`torch.multiprocessing.set_sharing_strategy("file_system")` at the start of the program, as torch\'s '
        "message suggests.",
        meaning="Workers send every batch as shared-memory storages passed by file descriptor; the main process holds one "
        "descriptor per storage until the tensor is freed. The DataLoader turns the resulting EMFILE into this "
        "RuntimeError.",
        why="Accumulating batches or outputs that are views of them (a list of every batch, metrics kept as tensors), "
        "many tensors per sample, or a low soft limit (1024).",
        false_positives="Descriptors leaked elsewhere in the main process (files, sockets) reach the same limit.",
        related=("TD111", "TD150", "TD151"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Communication with the workers is no longer possible",),
                pattern=r"Too many open files\. Communication with the workers is no longer possible",
                confidence=0.9,
            ),
        ),
    )
)

TD153 = register(
    Code(
        code="TD153",
        name="too-many-open-files",
        family="fd-exhausted",
        severity=Severity.ERROR,
        area="shm",
        title="a process hit its open-file limit (EMFILE, `[Errno 24] Too many open files`)",
        message="An open, pipe, socket or descriptor copy failed with `[Errno 24] Too many open files`: the process "
        "reached RLIMIT_NOFILE. In a DataLoader or torch.multiprocessing job the usual holder is the "
        "file_descriptor sharing strategy (every shared tensor storage keeps one descriptor open until it is "
        "freed; a traceback through `torch/multiprocessing/reductions.py` or `multiprocessing/resource_sharer.py` "
        "(DupFd) says so); otherwise files or sockets opened and never closed.",
        fix=_FD_RAISE + ". If the traceback goes through torch's reductions / resource_sharer: "
        '`torch.multiprocessing.set_sharing_strategy("file_system")` right after `import torch` (in the main '
        "script, so workers inherit it), do not keep batches or tensors sliced from them alive across iterations "
        "(keep `.item()`/`.tolist()`/`.clone()`), or share fewer, larger tensors (numpy arrays in the dataset). "
        "Otherwise find what holds the descriptors (`ls -l /proc/PID/fd | wc -l`, `lsof -p PID`) and close files "
        "in `with` blocks / open them lazily per worker. Fewer `num_workers` lowers the count too.",
        meaning="EMFILE (24): the per-process descriptor table is full. torch's default sharing strategy on Linux, "
        "file_descriptor, sends each tensor storage between processes as a descriptor (duplicated by "
        "`multiprocessing.reduction.DupFd`, served by the resource_sharer thread), so a process that receives "
        "or sends many storages keeps as many descriptors open; starting a worker also needs a few (pipes).",
        why="A soft open-file limit of 1024 (the usual default) against many tensors in flight or kept (a list of "
        "batches, outputs that are views of them, many tensors per sample), many workers with a high "
        "prefetch_factor, or a dataset that opens a file per sample and never closes it.",
        false_positives="None for the errno itself; what holds the descriptors is in the traceback, not in this line. "
        "`[Errno 23] Too many open files in system` is the system-wide table (fs.file-max), not this.",
        related=("TD111", "TD150", "TD151", "TD152"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("[Errno 24]",),
                pattern=r"\[Errno 24\] Too many (?:open files|files open)",
                confidence=0.85,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    "too many open files",
                    "Too many open files",
                    "Too Many Open Files",
                    "too many files open",
                    "Too many files open",
                    "TOO MANY OPEN FILES",
                ),
                pattern=r"(?i)too many (?:open files|files open)",
                exclude=(
                    r"\[Errno 2[34]\]",
                    r"Communication with the workers",
                    r"unable to open shared memory object",
                    r"\(24\)",
                    r"in system",
                ),
                confidence=0.6,
                confirm="Compare `ulimit -n` with `ls /proc/PID/fd | wc -l` for the training process (or "
                "`cat /proc/PID/limits`); the error going away after `ulimit -n $(ulimit -Hn)` or with "
                "`torch.multiprocessing.set_sharing_strategy('file_system')` confirms it.",
            ),
        ),
    )
)

TD155 = register(
    Code(
        code="TD155",
        name="shm-mmap-map-count",
        family="shm-map-count",
        severity=Severity.ERROR,
        area="shm",
        title="sharing a tensor failed: the process ran out of memory mappings (vm.max_map_count)",
        message="torch could not map the {bytes}-byte shared segment `{segment}` (`Cannot allocate memory (12)`): with the "
        "{strategy} strategy every shared tensor storage is one memory mapping, and this process reached "
        "vm.max_map_count (65530 by default). Not a shortage of RAM: many small storages, typically a dataset "
        "of tensors pickled to spawn/forkserver DataLoader workers.",
        fix="Let the loader fork so only batches are shared: `DataLoader(dataset, num_workers=N, "
        'multiprocessing_context="fork")` (a DataLoader created in a spawn/forkserver child inherits that method). '
        "Or hold the data in a few large storages (`torch.stack` into one tensor, numpy arrays) or load samples "
        "lazily in `__getitem__`. Or, as root on the host: `sysctl -w vm.max_map_count=1048576` (not settable in a "
        "container). Check beforehand with `torchdoctor check --sharing-strategy file_system --start-method spawn`.",
        meaning="The file_system strategy shares each storage as a named segment `/torch_<pid>_…` that the sharing process "
        "maps; each mapping counts against vm.max_map_count, so at one page per small tensor about 65k storages "
        "(≈ 256 MiB) fit. mmap then fails with ENOMEM (12) although plenty of memory is free.",
        why="With spawn or forkserver the whole Dataset is pickled to each worker and every tensor inside it shared; a "
        "list of tens of thousands of small tensors passes the limit. file_system is chosen to avoid the descriptor "
        "limit (TD151) or is the only strategy on macOS.",
        false_positives="The same errno from a real memory shortage (a tight RLIMIT_AS, an overcommitted host) reads "
        "alike; `wc -l /proc/PID/maps` near vm.max_map_count confirms the map count.",
        related=("TD110", "TD112", "TD151"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("unable to mmap",),
                pattern=r"unable to mmap (?P<bytes>\d+) bytes from file <(?P<segment>/torch_[^>]*)>: "
                r"Cannot allocate memory \(12\)",
                confidence=0.9,
                values={"strategy": "file_system"},
            ),
            Signature(  # the file_descriptor strategy (Linux default): the segment arrives as a descriptor, no name
                role=Role.ROOT_CAUSE,
                triggers=("unable to mmap",),
                pattern=r"unable to mmap (?P<bytes>\d+) bytes from file <filename not specified>: "
                r"Cannot allocate memory \(12\)",
                confidence=0.7,
                values={"strategy": "file_descriptor", "segment": "(received as a file descriptor)"},
            ),
        ),
    )
)

_SHM_FIX = (
    "Give the container a larger /dev/shm: Docker `--shm-size=8g` (or `--ipc=host`), Kubernetes an "
    "`emptyDir: {{medium: Memory, sizeLimit: 8Gi}}` mounted at /dev/shm. Or need less of it: smaller batches, "
    "fewer workers, a lower `prefetch_factor`. `torchdoctor check --num-workers N --batch-bytes SIZE` "
    "computes what the loader needs."
)

TD156 = register(
    Code(
        code="TD156",
        name="shm-allocate-no-space",
        family="shm-exhausted",
        severity=Severity.ERROR,
        area="shm",
        title="/dev/shm is full: a shared tensor could not be allocated",
        message="torch could not {how} the shared-memory segment `{segment}` ({wording}): the tmpfs at /dev/shm is too "
        "small or full for the batches DataLoader workers hand over (workers × prefetch_factor × batch size, "
        "plus whatever else lives there).",
        fix=_SHM_FIX,
        meaning="DataLoader workers build each batch directly in a POSIX shared-memory segment (a file in /dev/shm) and "
        "torch reserves its full size up front, so a full tmpfs fails here with ENOSPC instead of a later bus "
        "error. Current torch says `unable to allocate shared memory(shm) for file <…>: No space left on device "
        "(28)`; older releases grew the file and wrote its last byte, and said `unable to write to file "
        "</torch_…>` (with `: No space left on device (28)`, with ` at …/THAllocator.c:N`, or with nothing "
        "after it).",
        why="Containers get a 64 MiB /dev/shm by default; large batches (images, video) with several workers and "
        "prefetching need hundreds of MiB; leaked segments of killed runs also take space.",
        false_positives="A /dev/shm filled by another program (or leaked `torch_*` segments) gives the same error with a "
        "loader that fits; `df -h /dev/shm` and `ls -la /dev/shm` tell.",
        related=("TD102", "TD103", "TD104", "TD157"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("unable to allocate shared memory(shm)",),
                pattern=r"unable to allocate shared memory\(shm\) for file <(?P<segment>[^>]+)>: "
                r"No space left on device \(28\)",
                confidence=0.9,
                values={"how": "allocate", "wording": "`No space left on device (28)`"},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("unable to write to file </torch_",),
                pattern=r"unable to write to file <(?P<segment>/torch_[^>]*)>: No space left on device \(28\)",
                confidence=0.9,
                values={
                    "how": "grow",
                    "wording": "`unable to write to file`: `No space left on device (28)`, older torch",
                },
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("unable to write to file </torch_",),
                pattern=r"unable to write to file <(?P<segment>/torch_[^>]*)>(?: at \S*THAllocator\.cp?p?:\d+)?\s*$",
                confidence=0.8,
                values={
                    "how": "grow",
                    "wording": "`unable to write to file`, old torch without the errno: almost always ENOSPC",
                },
            ),
            Signature(
                # Python's own ENOSPC raised while creating a semaphore or a shared segment: those live in /dev/shm
                # (a DataLoader's queues, torch.multiprocessing, multiprocessing.Array/heap). The frames tell.
                role=Role.ROOT_CAUSE,
                triggers=("[Errno 28]",),
                pattern=r"\[Errno 28\] No space left on device",
                context=(
                    "_multiprocessing.SemLock",
                    "multiprocessing/synchronize.py",
                    "multiprocessing\\synchronize.py",
                    "/dev/shm",
                    "multiprocessing/heap.py",
                    "multiprocessing/shared_memory.py",
                    "torch/multiprocessing/",
                    "share_memory_",
                ),
                confidence=0.75,
                values={
                    "how": "create",
                    "segment": "a semaphore or segment in /dev/shm",
                    "wording": "`OSError: [Errno 28] No space left on device` raised in multiprocessing's "
                    "semaphore / shared-memory code",
                },
            ),
        ),
    )
)

TD157 = register(
    Code(
        code="TD157",
        name="loader-worker-bus-error",
        family="shm-exhausted",
        severity=Severity.ERROR,
        area="shm",
        title="a DataLoader worker died of a bus error: shared memory ran out",
        message="A DataLoader worker was killed by SIGBUS ({how}): it wrote to a shared mapping whose page the tmpfs at "
        "/dev/shm could not provide, almost always because /dev/shm is too small or full.",
        fix=_SHM_FIX + " Code that maps its own files from /dev/shm (`torch.from_file(..., shared=True)`, "
        "`np.memmap`) should size them within `df /dev/shm` or use a disk path.",
        meaning="A sparse file mapped from a tmpfs gets its pages when they are first written; with no space left the "
        "kernel cannot back the page and sends SIGBUS instead of returning an error. torch's worker signal "
        "handler prints the shm hint, the main process then reports the worker killed by 'Bus error'.",
        why="A 64 MiB container /dev/shm, shared mappings written by dataset code, or older torch versions that did not "
        "pre-allocate their segments.",
        false_positives="SIGBUS also comes from a file truncated while mapped (a dataset file rewritten during training) "
        "or failing storage behind an mmap; then /dev/shm has room.",
        related=("TD102", "TD103", "TD156", "TD564"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=(
                    "bus error encountered in worker",
                    "bus ERROR encountered in worker",
                    "Bus error encountered in worker",
                    "Bus Error encountered in worker",
                ),
                pattern=r"(?i)unexpected bus error encountered in worker",
                confidence=0.9,
                values={"how": "the worker's own signal handler reported it"},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("is killed by signal: Bus error",),
                pattern=r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: Bus error",
                confidence=0.85,
                values={"how": "the main process saw the worker die of 'Bus error'"},
            ),
        ),
    )
)

_NUM_WORKERS = ("num_worker", "num-worker", "NUM_WORKER", "Num_worker", "num_Worker")
_SHM_CONFIRM = (
    "Run `df -h /dev/shm` inside the container or job (64M is Docker's default) and look above the error for "
    "'Bus error' or 'insufficient shared memory (shm)'; the error going away with `--shm-size=8g` / "
    "`--ipc=host` (or with `num_workers=0`) confirms it."
)

TD158 = register(
    Code(
        code="TD158",
        name="shm-too-small-suspected",
        family="shm-exhausted",
        severity=Severity.ERROR,
        area="shm",
        title="DataLoader workers fail or stall, most likely because /dev/shm is too small (a hypothesis)",
        message="The log describes DataLoader workers that died, hung or failed ({how}) without an error naming the cause. "
        "The most common cause, especially in Docker or Kubernetes, is a /dev/shm too small for the batches the "
        "workers hand over: containers get 64 MiB unless told otherwise.",
        fix=_SHM_FIX
        + " To test the hypothesis quickly, run once with `num_workers=0`: nothing goes through /dev/shm then.",
        meaning="Workers build every batch in a shared-memory segment in /dev/shm and pass it to the main process. When the "
        "tmpfs is full a worker dies of SIGBUS or fails to allocate, and the main process only reports that the "
        "worker 'exited unexpectedly' (or waits until a timeout). PyTorch's README and its bus-error message both "
        "point at the container's shared memory size.",
        why="Docker's default `--shm-size` of 64 MiB, Kubernetes pods without a memory-backed emptyDir at /dev/shm, "
        "managed platforms that run user containers with a small or no /dev/shm.",
        false_positives="Workers also die of the OOM killer (host memory), of crashes in native code, or of errors in "
        "dataset code; this is a hypothesis until /dev/shm is checked.",
        related=("TD156", "TD157", "TD564", "TD273"),
        signatures=(
            Signature(
                role=Role.SYMPTOM,
                triggers=("exited unexpectedly",),
                pattern=r"(?i)DataLoader worker \(pid.{0,40}\) exited unexpectedly",
                confidence=0.45,
                values={"how": "'exited unexpectedly'"},
                confirm=_SHM_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("Bus error", "bus error", "Bus Error", "SIGBUS"),
                pattern=r"(?i)\b(?:bus error|sigbus)\b",
                confidence=0.55,
                values={"how": "a bus error"},
                confirm=_SHM_CONFIRM,
            ),
            # Two-part prose: each signature's triggers are the part its pattern ends with, so a line cut short
            # (Signature.match's cut form) never matches on its first part alone.
            Signature(
                role=Role.SYMPTOM,
                triggers=_NUM_WORKERS,
                pattern=r"(?i)\b(?:docker|containers?|kubernetes|k8s)\b.{0,100}\bnum[_-]?workers?\b",
                confidence=0.55,
                values={"how": "in a container, with num_workers > 0"},
                confirm=_SHM_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("docker", "Docker", "DOCKER", "container", "Container", "kubernetes", "Kubernetes", "k8s"),
                pattern=r"(?i)\bnum[_-]?workers?\b.{0,100}\b(?:docker|containers?|kubernetes|k8s)\b",
                confidence=0.55,
                values={"how": "in a container, with num_workers > 0"},
                confirm=_SHM_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    "shared memory",
                    "Shared memory",
                    "Shared Memory",
                    "shared-memory",
                    "/dev/shm",
                    "shm-size",
                    "shm_size",
                    "--ipc",
                ),
                pattern=r"(?i)shared[ -]memory|/dev/shm|shm[-_]size|--ipc[= ]host",
                exclude=(r"unable to open shared memory object", r"unable to mmap", r"Too many open files"),
                confidence=0.5,
                values={"how": "shared memory is mentioned"},
                confirm=_SHM_CONFIRM,
            ),
        ),
    )
)
