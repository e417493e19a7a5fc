"""TD270-TD299: host memory (host-oom) and native thread pools (thread-oversubscription) in logs (``explain``).

Each code carries the signatures that recognise it; positive and near-miss fixtures live in
``tests/fixtures/logs/<CODE>/``. Texts recorded here come from the lab scenarios in
``torchdoctor/lab/scenarios/memory.py``; the others are cited in their fixtures' headers.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature

_LIMIT_FIX = (
    "find the limit: `ulimit -v; ulimit -d` (RLIMIT_AS / RLIMIT_DATA), `cat /sys/fs/cgroup/memory.max` "
    "(container or job limit), `free -g`; then remove or raise the limit (`ulimit -S -v unlimited`, a larger "
    "`--memory` / Slurm `--mem`), or need less: smaller batches, fewer DataLoader workers, numpy or tensor "
    "storage instead of Python lists of objects, load the dataset lazily."
)

# -- host-oom --------------------------------------------------------------------------------------

TD270 = register(
    Code(
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
                values={
                    "request": "the requested memory (old versions print it in whole GB, rounded down, or as '%dGB')"
                },
                confidence=0.95,
            ),
            Signature(
                # torch 1.0-1.4: c10's alloc_cpu checked posix_memalign with CAFFE_ENFORCE_EQ; "12 vs 0" is ENOMEM.
                role=Role.ROOT_CAUSE,
                triggers=("posix_memalign(",),
                pattern=r"posix_memalign\(&data, gAlignment, nbytes\) == 0\. 12 vs 0",
                values={
                    "request": "an aligned block of host memory (`posix_memalign` returned ENOMEM, 12; torch "
                    "1.0-1.4 does not print the size)"
                },
                confidence=0.9,
            ),
        ),
    )
)

TD271 = register(
    Code(
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
    )
)

TD272 = register(
    Code(
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
    )
)

TD273 = register(
    Code(
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
                # older kernels printed this line before "Killed process ..."; inside a memory cgroup (a container
                # or job limit) the prefix is "Memory cgroup out of memory"
                triggers=("Out of memory: Kill process", "out of memory: Kill process"),
                pattern=r"(?:Out of memory|Memory cgroup out of memory): Kill process (?P<pid>\d+) \((?P<process>[^)]*)\)",
                confidence=0.9,
            ),
        ),
    )
)

TD274 = register(
    Code(
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
    )
)

TD275 = register(
    Code(
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
    )
)

_NOT_HOST = (
    r"(?i)\b(?:cuda|gpu)\b.{0,20}\bmemory|\bvram\b|max_split_size|memory (?:on|of) (?:the )?gpu|"
    r"CUDA out of memory",
)
_OOM_CONFIRM = (
    "On that host: `dmesg -T | grep -i -E 'killed process|out of memory'` (or `journalctl -k`, "
    "`kubectl describe pod`: OOMKilled, `sacct -j JOBID -o JobID,State,MaxRSS`); watch the memory while it "
    "runs (`free -g`, `ps -o rss,cmd -p PID` for the main process and its workers) and compare with "
    "`num_workers=0`."
)

TD276 = register(
    Code(
        code="TD276",
        name="host-memory-exhausted-suspected",
        family="host-oom",
        severity=Severity.ERROR,
        area="memory",
        title="host memory grows until the job is killed (a hypothesis)",
        message="The log describes host memory running out ({how}) without the line that proves it. With DataLoader "
        "workers the usual cause is copy-on-write: every worker touches the dataset's Python objects (reference "
        "counts), so each one slowly turns the parent's shared pages into a private copy, and the total grows "
        "with the number of workers until the OOM killer ends the job.",
        fix="Hold the dataset in numpy arrays or tensors (one large buffer) instead of Python lists, dicts or pandas "
        "objects of objects; read samples lazily from disk; use fewer `num_workers` and a lower `prefetch_factor`; "
        "do not keep batches or outputs alive across iterations; or raise the memory limit. Then " + _LIMIT_FIX,
        meaning="Forked workers share the parent's memory until a page is written; reading a Python object writes its "
        "reference count, so iterating a large list of objects copies it page by page in every worker. RSS of "
        "each worker looks stable while the sum over workers (PSS/USS) grows. When the host or the cgroup runs "
        "out, the kernel's OOM killer sends SIGKILL: the shell prints 'Killed', a DataLoader reports its worker "
        "'exited unexpectedly' or 'killed by signal: Killed'.",
        why="Large datasets held as Python objects (file lists, annotation dicts, pandas frames) read by several workers, "
        "many workers per rank and several ranks per node, tensors accumulated over an epoch.",
        false_positives="A real leak in user code (a growing list of tensors with autograd history) grows memory with "
        "num_workers=0 too; a small /dev/shm (TD158) also ends with workers 'exited unexpectedly'.",
        related=("TD273", "TD274", "TD562", "TD158"),
        signatures=(
            Signature(
                role=Role.SYMPTOM,
                triggers=("exited unexpectedly",),
                pattern=r"(?i)DataLoader worker \(pid.{0,40}\) exited unexpectedly",
                confidence=0.3,
                values={"how": "DataLoader workers 'exited unexpectedly'"},
                confirm=_OOM_CONFIRM,
            ),
            # Two-part prose: each signature's triggers are the part its pattern ends with, so a line cut short
            # (Signature.match's cut form) never matches on its first part alone.
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    "oom kill",
                    "oom-kill",
                    "oom_kill",
                    "oomkill",
                    "OOM kill",
                    "OOM-kill",
                    "OOM Kill",
                    "OOMKill",
                    "OOM-Kill",
                    "Oom kill",
                ),
                pattern=r"(?i)\boom[ _-]?kill",
                exclude=(r"Killed process \d+", r"Out of memory: Kill"),
                confidence=0.6,
                values={"how": "the OOM killer is mentioned"},
                confirm=_OOM_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("increas", "Increas", "grow", "Grow", "rise", "rising", "rises", "climb", "leak", "Leak"),
                pattern=r"(?i)\b(?:memory|ram|rss)\b(?: \w+){0,3} (?:keeps? |starts? |is |was |slowly |rapidly |steadily |"
                r"continuously |constantly |gradually )*(?:increas|grow|rise|rising|rises|climb|leak)",
                exclude=_NOT_HOST,
                confidence=0.55,
                values={"how": "host memory keeps growing"},
                confirm=_OOM_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    "all my",
                    "all the",
                    "all of",
                    "all available",
                    "whole",
                    "surpass",
                    "Surpass",
                    "exceed",
                    "Exceed",
                ),
                pattern=r"(?i)\b(?:consum|eat|us|fill|exhaust)\w* (?:up )?(?:all|the whole)(?: of)? (?:my |the |available )?"
                r"(?:ram|memory)\b|\b(?:surpass|exceed)\w* (?:the )?(?:available|total|physical) (?:ram|memory)\b",
                exclude=_NOT_HOST,
                confidence=0.55,
                values={"how": "the host's memory is used up"},
                confirm=_OOM_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    "excessive",
                    "Excessive",
                    "huge",
                    "Huge",
                    "high memory",
                    "High memory",
                    "high RAM",
                    "High RAM",
                    "HIGH MEMORY",
                ),
                pattern=r"(?i)\b(?:excessive|huge|high) (?:ram|memory) (?:use|usage|consumption)",
                exclude=_NOT_HOST,
                confidence=0.5,
                values={"how": "excessive host memory use"},
                confirm=_OOM_CONFIRM,
            ),
            Signature(  # "the RAM (16 GBs) is full and so is the SWAP", "RAM fills up", "swap is full"
                role=Role.SYMPTOM,
                triggers=("full", "Full", "FULL", "fills up", "filled up", "filling up"),
                pattern=r"(?i)\b(?:ram|swap|system memory|host memory|cpu memory)\b(?:\s*\([^)\n]{0,20}\))?[^.\n]{0,20}?"
                r"\b(?:(?:is|are|was|were|gets?|got|becomes?|became|being)\s+(?:completely\s+|almost\s+|nearly\s+|totally\s+)?"
                r"full\b|fill(?:s|ed|ing)?\s+up\b)",
                exclude=_NOT_HOST,
                confidence=0.55,
                values={"how": "host RAM (or swap) full"},
                confirm=_OOM_CONFIRM,
            ),
            Signature(  # "runs out of RAM", "out of host memory": not a bare "out of memory" (CUDA's words)
                role=Role.SYMPTOM,
                triggers=("RAM", "ram", "system memory", "host memory", "CPU memory", "cpu memory", "swap"),
                pattern=r"(?i)\bout of (?:the\s+)?(?:system\s+|host\s+|cpu\s+|physical\s+)?(?:ram|memory and swap|swap)\b|"
                r"\bout of (?:system|host|cpu|physical) memory\b",
                exclude=_NOT_HOST,
                confidence=0.55,
                values={"how": "out of host RAM"},
                confirm=_OOM_CONFIRM,
            ),
        ),
    )
)

# -- thread-oversubscription ------------------------------------------------------------------------

_THREADS_FIX = (
    "Start fewer threads per process: `export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1` "
    "(or `torch.set_num_threads(1)` at the start of each rank and DataLoader worker via worker_init_fn), "
    "fewer DataLoader workers; and check the task limits: `ulimit -u`, "
    "`cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids.current`."
)

TD280 = register(
    Code(
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
    )
)

TD281 = register(
    Code(
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
    )
)

_THREAD_CONFIRM = (
    "Count the threads: `ps -o nlwp,pcpu,cmd -p PID` for the main process and each worker (or "
    "`top -H`); compare `torch.get_num_threads()` with the cores the process may use "
    "(`len(os.sched_getaffinity(0))`, divided by processes per node). If `OMP_NUM_THREADS=1` (or "
    "`torch.set_num_threads(1)` / `cv2.setNumThreads(0)` in `worker_init_fn`) makes it faster, "
    "that confirms it."
)

TD282 = register(
    Code(
        code="TD282",
        name="cpu-threads-oversubscribed-suspected",
        family="thread-oversubscription",
        severity=Severity.WARNING,
        area="cpu",
        title="more busy threads than cores: CPU usage high, training or loading slow (a hypothesis)",
        message="The log describes high CPU use or slow CPU-side work ({how}). The usual cause is thread "
        "oversubscription: every process (each rank, each DataLoader worker) starts an OpenMP/MKL pool of one "
        "thread per visible core, and OpenCV/OpenBLAS pools on top; processes x threads far exceed the cores, so "
        "they spin and preempt each other.",
        fix=_THREADS_FIX
        + " With torchrun/torch.distributed.launch set `OMP_NUM_THREADS` to cores / processes per node "
        "(launch sets it to 1 by default). For image pipelines add `cv2.setNumThreads(0)` in `worker_init_fn`.",
        meaning="torch's intra-op pool defaults to the number of physical cores, in every process that computes on the "
        "CPU. Eight ranks on a 32-core node start 8 x 32 threads; DataLoader workers running torch or OpenCV "
        "code each start their own pools. Spinning OpenMP threads show as several hundred percent CPU per "
        "process while throughput drops.",
        why="Several processes per machine without OMP_NUM_THREADS, DataLoader workers doing tensor or OpenCV work with "
        "library-default thread counts, containers whose CPU quota is smaller than the cores they can see.",
        false_positives="Slow training also comes from slow storage, too few workers or a GPU-bound model; high CPU with "
        "one process and no workers can be plain CPU work. This is a hypothesis until the thread count "
        "is checked.",
        related=("TD280", "TD281", "TD570", "TD250"),
        signatures=(
            # Two-part prose: each signature's triggers are the part its pattern ends with, so a line cut short
            # (Signature.match's cut form) never matches on its first part alone.
            Signature(
                role=Role.SYMPTOM,
                triggers=("CPU", "cpu", "Cpu"),
                pattern=r"(?i)\b(?:[1-9]\d{2,3})\s?%\s*(?:of\s+)?(?:a\s+)?cpu",
                confidence=0.55,
                values={"how": "a process at several hundred percent CPU"},
                confirm=_THREAD_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("high", "High", "HIGH", "increas", "Increas", "boost", "Boost", "spike", "Spike"),
                pattern=r"(?i)\bcpu (?:usage|load|utili[sz]ation)\b.{0,60}\b(?:high|increas|boost|spike|\d+ times|100 ?%)",
                confidence=0.5,
                values={"how": "high CPU usage or load"},
                confirm=_THREAD_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    "CPU usage",
                    "cpu usage",
                    "CPU Usage",
                    "CPU load",
                    "cpu load",
                    "CPU Load",
                    "CPU utili",
                    "cpu utili",
                    "CPU Utili",
                ),
                pattern=r"(?i)\b(?:high|increas\w*|boost\w*|spike\w*) (?:of |in |the )*cpu (?:usage|load|utili[sz]ation)",
                confidence=0.5,
                values={"how": "high CPU usage or load"},
                confirm=_THREAD_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("threads", "Threads", "THREADS"),
                pattern=r"(?i)\b(?:control|limit|set|reduce|restrict|cap)\w* (?:the )?(?:number of |num(?:ber)? )?"
                r"(?:cpu )?threads\b|\bnumber of (?:cpu )?threads\b",
                confidence=0.5,
                values={"how": "the number of CPU threads is in question"},
                confirm=_THREAD_CONFIRM,
            ),
            Signature(  # "excessive thread creation", "spawns hundreds of threads"
                role=Role.SYMPTOM,
                triggers=("threads", "Threads", "thread creation"),
                pattern=r"(?i)\b(?:too many|excessive|thousands of|hundreds of|huge number of|a lot of)\s+(?:\w+\s+)?threads\b|"
                r"\bexcessive thread creation\b",
                confidence=0.5,
                values={"how": "too many threads"},
                confirm=_THREAD_CONFIRM,
            ),
            Signature(  # "pytorch inference eat all cpu", "uses 100% of all cores"
                role=Role.SYMPTOM,
                triggers=("cpu", "CPU", "Cpu", "cores", "Cores"),
                pattern=r"(?i)\b(?:eat|eats|ate|eating|use|uses|used|using|occup\w+|consum\w+|takes?|took|taking|hog\w*|max\w*)"
                r"\s+(?:up\s+)?(?:all|every|100\s?%)(?:\s+of)?\s+(?:the\s+|my\s+|available\s+)?(?:cpus?|cores|cpu cores)\b",
                confidence=0.5,
                values={"how": "every CPU busy"},
                confirm=_THREAD_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("OMP_NUM_THREADS", "MKL_NUM_THREADS", "setNumThreads", "set_num_threads"),
                pattern=r"OMP_NUM_THREADS|MKL_NUM_THREADS|setNumThreads|set_num_threads",
                exclude=(r"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default",),
                confidence=0.4,
                values={"how": "thread-count settings are mentioned"},
                confirm=_THREAD_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("slow", "Slow", "SLOW"),
                pattern=r"(?i)\b(?:data ?loader|data ?loading|num_workers)\b.{0,40}\bslow|"
                r"\b(?:training|train) (?:speed|is|got|gets|became|runs?)\b.{0,40}\bslow|\bgot slow|"
                r"\bslow\w* (?:data ?loader|data ?loading|training|speed)",
                confidence=0.35,
                values={"how": "training or data loading is slow"},
                confirm=_THREAD_CONFIRM,
            ),
        ),
    )
)
