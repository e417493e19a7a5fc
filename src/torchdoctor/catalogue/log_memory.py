"""TD270-TD299: host memory (host-oom) and native thread pools (thread-oversubscription) in logs (``explain``).

Each code carries the signatures that recognise it; positive and near-miss fixtures live in
``tests/fixtures/logs/<CODE>/``. Texts recorded here come from the lab scenarios in
``torchdoctor/lab/scenarios/memory.py``; the others are cited in their fixtures' headers.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature

_LIMIT_FIX = ("find the limit: `ulimit -v; ulimit -d` (RLIMIT_AS / RLIMIT_DATA), `cat /sys/fs/cgroup/memory.max` "
              "(container or job limit), `free -g`; then remove or raise the limit (`ulimit -S -v unlimited`, a larger "
              "`--memory` / Slurm `--mem`), or need less: smaller batches, fewer DataLoader workers, numpy or tensor "
              "storage instead of Python lists of objects, load the dataset lazily.")

# -- host-oom --------------------------------------------------------------------------------------

TD270 = register(Code(
    code="TD270",
    name="cpu-allocator-oom",
    family="host-oom",
    severity=Severity.ERROR,
    area="memory",
    title="torch could not allocate host memory for a CPU tensor",
    message="torch's CPU allocator could not get {request} from the operating system: the process reached a "
            "memory limit (RLIMIT_AS/RLIMIT_DATA, a cgroup limit, strict overcommit; on Windows the commit limit, "
            "RAM plus page file) or the host ran out of RAM.",
    fix="Check the request against the limits: " + _LIMIT_FIX + " On Windows ('not enough memory'), enlarge the "
        "page file (System > Advanced system settings > Performance > Virtual memory) or close other programs.",
    meaning="Every CPU tensor's storage comes from c10's DefaultCPUAllocator (TH's allocator before torch 1.0); when "
            "the OS refuses the allocation, torch raises this RuntimeError with the requested size. The wording "
            "changed over the years: 'can't allocate memory: you tried to allocate N bytes. Error code 12' (Linux), "
            "'not enough memory: you tried to allocate N bytes' (Windows), and in old versions 'not enough memory: "
            "you tried to allocate NGB. Buy new RAM!' (the size rounded down to whole GB, or a literal '%dGB'). The "
            "process keeps running, so the traceback names the exact operation.",
    why="A per-process address-space or data limit (`ulimit -v` / `-d` on shared login or batch nodes), "
        "vm.overcommit_memory=2, a Windows page file too small for the model, or a genuinely huge tensor (a size "
        "computed from the wrong shape, a whole dataset materialised at once).",
    false_positives="None known for the message itself; a request of absurd size (terabytes) points at a shape bug "
                    "rather than at a limit.",
    related=("TD205", "TD201", "TD208", "TD271"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("DefaultCPUAllocator",),
            pattern=r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate "
                    r"(?P<request>(?P<bytes>\d+) bytes)",
            confidence=0.95,
        ),
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("Buy new RAM!",),
            pattern=r"(?:DefaultCPUAllocator|Torch): not enough memory: you tried to allocate (?P<gigabytes>\d+|%d)GB"
                    r"\. Buy new RAM!",
            values={"request": "the requested memory (old versions print it in whole GB, rounded down, or as "
                                "'%dGB')"},
            confidence=0.95,
        ),
    ),
))

TD271 = register(Code(
    code="TD271",
    name="python-memory-error",
    family="host-oom",
    severity=Severity.ERROR,
    area="memory",
    title="Python ran out of memory (MemoryError)",
    message="Python raised MemoryError: an allocation was refused by a process memory limit "
            "(RLIMIT_AS/RLIMIT_DATA, strict overcommit) or the host ran out of RAM.",
    fix="Check the request against the limits: " + _LIMIT_FIX,
    meaning="CPython raises a bare MemoryError when malloc fails (a large bytearray, list or a pickle being read); "
            "numpy raises its subclass with the size and shape it wanted ('Unable to allocate 1.6 GiB for an array "
            "with shape ...'). Unlike the OOM killer, the process survives long enough to print the traceback.",
    why="A memory limit smaller than the data (often RLIMIT_AS on shared nodes), or loading a whole dataset or "
        "checkpoint into Python objects.",
    false_positives="Code that raises MemoryError itself for its own reasons; CUDA's OutOfMemoryError is a different "
                    "code (GPU memory).",
    related=("TD270", "TD205"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("MemoryError",),
            pattern=r"(?:^|[\s:])MemoryError(?::\s*(?P<detail>.*?))?\s*$",
            exclude=(r"OutOfMemoryError", r"CUDA out of memory", r"except\s+MemoryError", r"raise\s+MemoryError"),
            confidence=0.7,
        ),
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("Unable to allocate",),
            pattern=r"MemoryError: Unable to allocate (?P<size>[\d.]+ ?[KMGTPE]i?B) for an array with (?:shape|form) "
                    r"(?P<shape>\([^)]*\))",
            confidence=0.8,
        ),
    ),
))

TD272 = register(Code(
    code="TD272",
    name="library-map-failed",
    family="host-oom",
    severity=Severity.ERROR,
    area="memory",
    title="the dynamic loader could not map a shared library",
    message="Loading {library} failed with `failed to map segment from shared object`: the process's address-space "
            "limit (RLIMIT_AS) is too small for the library, or the file lies on a noexec mount.",
    fix="Compare `ulimit -v` with what the libraries need (torch's CPU libraries alone map several hundred MB): set "
        "memory limits after the libraries are loaded or raise them (`ulimit -S -v unlimited`). If `ulimit -v` is "
        "unlimited, look for noexec: `findmnt -T {library}` (and for compiled caches set TMPDIR / "
        "TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR to an exec-mounted directory).",
    meaning="mmap of a library segment failed while dlopen loaded it. glibc prints the same text for ENOMEM (the "
            "address-space limit) and EPERM (a noexec file system).",
    why="`ulimit -v` set in a job script or shell profile before Python starts, or a library (often one compiled at "
        "run time) placed on a noexec /tmp.",
    false_positives="The noexec case has the same text: this is a memory limit only when `ulimit -v` is set.",
    related=("TD205", "TD270"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("failed to map segment from shared object",),
            pattern=r"(?P<library>[^\s:'\"]+\.so[.\d]*): failed to map segment from shared object",
            confidence=0.5,
        ),
    ),
))

TD273 = register(Code(
    code="TD273",
    name="kernel-oom-kill",
    family="host-oom",
    severity=Severity.ERROR,
    area="memory",
    title="the kernel's OOM killer killed a process",
    message="The kernel OOM killer killed pid {pid} ({process}): the host or its memory cgroup ran out of memory.",
    fix="Confirm with `dmesg -T | grep -i -A2 'out of memory'` (or `journalctl -k`), then: " + _LIMIT_FIX,
    meaning="When a memory cgroup or the whole host has no reclaimable memory left, the kernel picks a process "
            "(usually the biggest) and sends it SIGKILL. The victim prints nothing: its parent sees signal 9 / exit "
            "137, a DataLoader reports the worker 'killed by signal: Killed', the shell prints 'Killed'.",
    why="RSS growing past the container or job limit: too many DataLoader workers each holding a copy of Python "
        "objects (copy-on-write turns into copies), large prefetch, a leak over an epoch, several ranks on a "
        "small node.",
    false_positives="The victim may be another process than the training job; check the pid and name.",
    related=("TD203", "TD201", "TD274"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("Killed process",),
            pattern=r"Killed process (?P<pid>\d+) \((?P<process>[^)]*)\)(?: total-vm:(?P<total_vm>[\d,]+kB))?",
            exclude=(r"oom_reaper",),
            confidence=0.95,
        ),
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("Out of memory: Kill process",),
            pattern=r"Out of memory: Kill process (?P<pid>\d+) \((?P<process>[^)]*)\)",
            confidence=0.9,
        ),
    ),
))

TD274 = register(Code(
    code="TD274",
    name="process-sigkilled",
    family="host-oom",
    severity=Severity.WARNING,
    area="memory",
    title="a process was killed by SIGKILL",
    message="A process was killed by SIGKILL ({how}) without a word of its own: the usual sender is the kernel's "
            "OOM killer (or a container/job memory limit); a scheduler or a person can also send it.",
    fix="Look for the OOM killer: `dmesg -T | grep -i 'killed process'` / `journalctl -k` on that host, "
        "`kubectl describe pod` (OOMKilled), `sacct -j JOBID -o JobID,State,MaxRSS` (OUT_OF_MEMORY). If it was the "
        "OOM killer: " + _LIMIT_FIX,
    meaning="SIGKILL cannot be caught, so the process leaves no traceback; only its parent, launcher or shell reports "
            "it. On its own this names no cause, it confirms one (OOM kill, timeout kill, manual kill).",
    why="Most often memory: the host, cgroup or job limit was reached and the kernel chose this process.",
    false_positives="Launchers and schedulers SIGKILL processes that ignore SIGTERM, or on a time limit; a human "
                    "`kill -9` looks the same.",
    related=("TD273", "TD203"),
    signatures=(
        Signature(
            role=Role.CONFIRMATION,
            triggers=("Killed",),
            pattern=r"^\s*Killed\s*$",
            values={"how": "the shell printed 'Killed'"},
            confidence=0.5,
        ),
        Signature(
            role=Role.CONFIRMATION,
            triggers=("(SIGKILL) received by PID",),
            pattern=r"Signal 9 \(SIGKILL\) received by PID (?P<pid>\d+)",
            values={"how": "torchrun: signal 9 received by the worker"},
            confidence=0.5,
        ),
        Signature(
            role=Role.CONFIRMATION,
            triggers=("terminated with signal SIGKILL",),
            pattern=r"process (?P<process_index>\d+) terminated with signal SIGKILL",
            values={"how": "torch.multiprocessing.spawn: terminated with signal SIGKILL"},
            confidence=0.5,
        ),
    ),
))

TD275 = register(Code(
    code="TD275",
    name="enomem-fork",
    family="host-oom",
    severity=Severity.ERROR,
    area="memory",
    title="the kernel refused memory to a system call (ENOMEM), typically fork() starting workers",
    message="A system call failed with `[Errno 12] Cannot allocate memory` (ENOMEM). When the traceback ends in "
            "`os.fork()` (DataLoader workers or a multiprocessing pool starting), the kernel refused to commit a copy "
            "of this process's memory for the child: strict overcommit (vm.overcommit_memory=2), little free RAM "
            "and swap for a large parent, or a container/VM memory limit.",
    fix="Start workers from a small process, or fewer of them: `DataLoader(..., multiprocessing_context="
        "'forkserver')` (or 'spawn'), a lower `num_workers`, `persistent_workers=True` (workers forked once, not at "
        "every epoch); keep the parent small before the loader starts (load data lazily, numpy arrays instead of "
        "Python lists of objects, free what training does not need); add swap. Check the policy: "
        "`cat /proc/sys/vm/overcommit_memory; grep -i commit /proc/meminfo` (`torchdoctor check` reports strict "
        "overcommit as TD208).",
    meaning="fork() duplicates the parent's address space copy-on-write, but the kernel still accounts the "
            "parent's private writable memory for the child. Under strict overcommit it must fit under CommitLimit; "
            "under the default heuristic a fork of a very large process can still be refused when RAM and swap are "
            "short. Python raises OSError errno 12 at `self.pid = os.fork()`; the same errno from mmap or other "
            "calls also means the kernel had no memory (or address space) to give.",
    why="A training process holding a large dataset or model in RAM that starts DataLoader workers (again at every "
        "epoch without persistent workers), several ranks per node doing the same, hosts configured with "
        "vm.overcommit_memory=2, no swap.",
    false_positives="ENOMEM from mmap can also mean the address-space limit (RLIMIT_AS) or the map-count limit; the "
                    "torch form `unable to mmap ... Cannot allocate memory (12)` is shared memory (TD15x), not this.",
    related=("TD208", "TD270", "TD273"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("[Errno 12] Cannot allocate memory",),
            pattern=r"\[Errno 12\] Cannot allocate memory(?:: '(?P<path>[^']*)')?",
            confidence=0.8,
        ),
    ),
))

# -- thread-oversubscription ------------------------------------------------------------------------

_THREADS_FIX = ("Start fewer threads per process: `export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1` "
                "(or `torch.set_num_threads(1)` at the start of each rank and DataLoader worker via worker_init_fn), "
                "fewer DataLoader workers; and check the task limits: `ulimit -u`, "
                "`cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids.current`.")

TD280 = register(Code(
    code="TD280",
    name="omp-thread-creation-failed",
    family="thread-oversubscription",
    severity=Severity.ERROR,
    area="cpu",
    title="OpenMP (libgomp) could not create its worker threads",
    message="libgomp could not start its thread pool (`Thread creation failed: {strerror}`) and ended the process: "
            "the processes and threads of this user or container reached RLIMIT_NPROC or the cgroup pids limit.",
    fix=_THREADS_FIX,
    meaning="torch's CPU kernels run on an OpenMP pool of about one thread per visible core, created at the first "
            "parallel operation in every process (each rank, each DataLoader worker that computes). When "
            "pthread_create fails, libgomp prints this line and exits with status 1: there is no Python traceback.",
    why="Processes x threads per process above `ulimit -u` (which counts every task of the user on the host) or "
        "the container's pids.max; many cores visible to each of many processes makes the product large.",
    false_positives="EAGAIN can also come from memory for thread stacks under a tight RLIMIT_AS; the strerror is "
                    "the same.",
    related=("TD209", "TD206", "TD207", "TD250", "TD281"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("Thread creation failed",),
            pattern=r"libgomp: Thread creation failed: (?P<strerror>.+?)\s*$",
            confidence=0.9,
        ),
    ),
))

TD281 = register(Code(
    code="TD281",
    name="openblas-thread-creation-failed",
    family="thread-oversubscription",
    severity=Severity.ERROR,
    area="cpu",
    title="OpenBLAS could not create its worker threads",
    message="OpenBLAS could not start its thread pool (`blas_thread_init: pthread_create`): the processes and "
            "threads of this user or container reached RLIMIT_NPROC or the pids limit, or memory for thread stacks.",
    fix=_THREADS_FIX,
    meaning="OpenBLAS (used by numpy, and by some torch builds) starts one thread per core when it is loaded, in "
            "every process that imports it. When pthread_create fails it prints these lines with the limit it saw "
            "(`RLIMIT_NPROC current, max`); the process then crashes or continues with fewer threads.",
    why="Many processes (ranks x DataLoader workers) each importing numpy on a machine with many cores, under a "
        "per-user process limit or a container pids limit.",
    false_positives="A line with `RLIMIT_NPROC` far above the number of tasks points at memory (RLIMIT_AS) instead.",
    related=("TD209", "TD206", "TD250", "TD280"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("blas_thread_init: pthread_create",),
            pattern=r"blas_thread_init: pthread_create(?: failed for thread (?P<thread>\d+) of (?P<threads>\d+))?: "
                    r"(?P<strerror>.+?)\s*$",
            confidence=0.85,
        ),
        Signature(
            role=Role.CONFIRMATION,
            triggers=("blas_thread_init: RLIMIT_NPROC",),
            pattern=r"blas_thread_init: RLIMIT_NPROC (?P<current>\d+) current, (?P<max>\d+) max",
            confidence=0.6,
        ),
    ),
))
