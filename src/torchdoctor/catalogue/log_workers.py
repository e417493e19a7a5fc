"""TD560-599: DataLoader workers that die or hang, and too many of them, as seen in logs (``explain``).

TD560-569 worker-crash (signals, exit codes, hangs) with the main process's "exited unexpectedly"
cascade; TD570 the DataLoader's own warning that it starts more workers than there are CPUs
(thread-oversubscription). Positive and near-miss fixtures live in ``tests/fixtures/logs/<CODE>/``,
recorded by the lab scenarios in ``torchdoctor/lab/scenarios/loader.py`` or copied from public reports.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature

# -- worker-crash --------------------------------------------------------------------------------

_ISOLATE = (
    "Reproduce with `num_workers=0`: the crash then happens in the main process, where "
    "`python -X faulthandler` (or `gdb -ex r --args python train.py`) shows the native frame."
)

TD560 = register(
    Code(
        code="TD560",
        name="loader-worker-killed-by-signal",
        family="worker-crash",
        severity=Severity.ERROR,
        area="loader",
        title="a DataLoader worker was killed by a signal",
        message="A DataLoader worker died of a signal ({signal}). Segmentation faults and aborts come from native code in "
        "the worker (a library used after fork, a handle or pointer from another process, a library bug); "
        "'Terminated' means something sent it SIGTERM (a launcher, a scheduler's preemption, a stray kill).",
        fix=_ISOLATE
        + " Open native resources (decoders, DB/RPC clients, memory maps) inside the worker (lazily, or in "
        "`worker_init_fn`), never pass handles or addresses to it; with libraries that are not fork-safe use "
        '`multiprocessing_context="spawn"`; cap library threads in `worker_init_fn` (`cv2.setNumThreads(0)`, '
        "`torch.set_num_threads(1)`). For SIGTERM on preemption, let only the main process handle it: "
        "`signal.signal(signal.SIGTERM, signal.SIG_IGN)` in `worker_init_fn`.",
        meaning="The main process learns from its SIGCHLD handler that a worker died of a signal and raises this error; "
        "for SIGSEGV (and SIGFPE) the worker's own handler first prints 'Unexpected segmentation fault "
        "encountered in worker'. SIGBUS (TD157) and SIGKILL (TD562) have their own codes.",
        why="Native extensions that keep state which does not survive fork (threads, locks, CUDA, RPC channels), raw "
        "pointers valid only in the process that made them, C library bugs on unusual data, and process-group "
        "signals from launchers on preemption or time limits.",
        false_positives="None for the text itself; which native library crashed is not in it.",
        related=("TD564", "TD157", "TD562", "TD563"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("is killed by signal:",),
                pattern=r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: (?P<signal>[A-Za-z][\w -]*\w)",
                exclude=(r"killed by signal: (?:Bus error|Killed)\b",),
                confidence=0.85,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("encountered in worker",),
                pattern=r"(?i)unexpected (?P<signal>segmentation fault|floating-point exception) encountered in worker",
                confidence=0.85,
            ),
        ),
    )
)

TD562 = register(
    Code(
        code="TD562",
        name="loader-worker-sigkilled",
        family="host-oom",
        severity=Severity.ERROR,
        area="loader",
        title="a DataLoader worker was killed by SIGKILL (usually the OOM killer)",
        message="DataLoader worker {pid} was killed by SIGKILL ('Killed'): SIGKILL cannot be caught, and its usual "
        "sender is the kernel's OOM killer (or a container/job memory limit) choosing a worker whose memory grew.",
        fix="Confirm on that host: `dmesg -T | grep -i 'killed process'` (or `kubectl describe pod`: OOMKilled). Then "
        "reduce memory per worker: keep the dataset in numpy arrays / one tensor instead of Python lists and dicts "
        "of objects (copy-on-write turns every touched object's page into a private copy in each worker), call "
        "`gc.freeze()` just before the DataLoader starts its workers (a full garbage collection in a worker "
        "otherwise writes to every page holding a Python object), fewer workers, a lower `prefetch_factor`; or "
        "raise the memory limit.",
        meaning="The main process's SIGCHLD handler reports the worker's death by signal 9. Forked workers share the "
        "parent's pages until they write to them; reading Python objects writes their reference counts, so a "
        "worker iterating a large list of objects slowly copies all of it.",
        why="Datasets held as Python objects (lists of paths, dicts of annotations) read by several workers, large "
        "prefetching, or simply too many workers for the memory limit.",
        false_positives="A scheduler or a person can send SIGKILL too (time limits, `kill -9`); without an OOM-killer "
        "line in the kernel log this is a guess.",
        related=("TD560", "TD564", "TD273", "TD274"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("is killed by signal: Killed",),
                pattern=r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: Killed\b",
                confidence=0.75,
            ),
        ),
    )
)

TD563 = register(
    Code(
        code="TD563",
        name="loader-worker-exit-code",
        family="worker-crash",
        severity=Severity.ERROR,
        area="loader",
        title="a DataLoader worker exited with a non-zero status",
        message="DataLoader worker {pid} exited with status {exit_code} without a Python exception the loader could "
        "report: something in it called exit() (a native library's error handler, `os._exit`, `sys.exit` "
        "in dataset code) or it failed before its loop started.",
        fix="Look above this line for the worker's own output (an error printed by a library, a traceback from worker "
        "start-up). " + _ISOLATE + " Validate inputs before handing them to native decoders that exit on bad data.",
        meaning="A worker that exits instead of raising leaves the loader only its exit status; the main process finds "
        "it at its next status check.",
        why="Native libraries whose default error handling exits the process, `sys.exit()` in dataset code, or a worker "
        "that could not unpickle its Dataset (TD553) or re-ran the script (TD554).",
        false_positives="When the worker's own error is in the log (TD553, TD554, a traceback), that is the cause and "
        "this is its consequence.",
        related=("TD564", "TD553", "TD554", "TD560"),
        signatures=(
            Signature(
                # The worker exited with a status of its own (sys.exit, a native error handler): worker-crash, at a
                # confidence that a stronger cause elsewhere in the log (a bus error, the OOM killer) outranks.
                role=Role.ROOT_CAUSE,
                triggers=("exited unexpectedly with exit code",),
                pattern=r"DataLoader worker \(pid (?P<pid>\d+)\) exited unexpectedly with exit code (?P<exit_code>-?\d+)",
                confidence=0.6,
            ),
        ),
    )
)

TD564 = register(
    Code(
        code="TD564",
        name="loader-workers-exited",
        family="worker-crash",
        severity=Severity.ERROR,
        area="loader",
        title="DataLoader workers exited unexpectedly (a consequence)",
        message="The DataLoader stopped because worker(s) {pids} exited unexpectedly. This names no cause: the worker's "
        "own death (a signal, an exit status, an error it printed) comes earlier in the log.",
        fix="Find the first error above this line: a worker killed by a signal (TD560, TD157 bus error, TD562 SIGKILL), "
        "an exit status (TD563), or what the worker printed before it died. " + _ISOLATE,
        meaning="The main process raises this RuntimeError from its status check after any worker has died; the original "
        "error is chained above it ('The above exception was the direct cause').",
        why="Any worker death: crashes, the OOM killer, shared-memory bus errors, unpicklable or unimportable datasets.",
        false_positives="None: it is always a consequence.",
        related=("TD560", "TD562", "TD563", "TD157", "TD553"),
        signatures=(
            Signature(
                role=Role.CASCADE,
                triggers=("exited unexpectedly",),
                pattern=r"DataLoader worker \(pid\(s\) (?P<pids>\d+(?:, \d+)*)\) exited unexpectedly",
                confidence=0.5,
            ),
        ),
    )
)

TD565 = register(
    Code(
        code="TD565",
        name="loader-timeout",
        family="worker-crash",
        severity=Severity.ERROR,
        area="loader",
        title="the DataLoader timed out waiting for a batch",
        message="No batch arrived within the DataLoader's timeout of {seconds} s: a worker is hung (a lock or thread pool "
        "inherited in a bad state through fork, a stalled read from network storage) or far slower than the "
        "timeout allows.",
        fix="See where the worker waits: `py-spy dump --pid WORKER_PID` (or `gdb -p`). Locks and thread pools held "
        "while the loader forks stay locked in the workers: start workers with "
        '`multiprocessing_context="spawn"`, or create such objects in `worker_init_fn`. For slow storage, raise '
        "`timeout` or prefetch.",
        meaning="`DataLoader(timeout=T)` makes the main process give up after T seconds without a batch from the worker "
        "it waits for; without a timeout the same situation hangs forever.",
        why="fork copies a lock held by another thread of the parent (logging, a cache refresher, a native thread pool) "
        "in its locked state, and nothing in the worker will ever release it; or I/O that blocks indefinitely.",
        false_positives="A timeout set too low for slow first batches (spawn start-up, cold caches) fires without a hang.",
        related=("TD560", "TD564"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("DataLoader timed out after",),
                pattern=r"DataLoader timed out after (?P<seconds>[\d.]+) seconds",
                confidence=0.7,
            ),
        ),
    )
)

_LOADER_WORDS = (
    "dataloader",
    "DataLoader",
    "Dataloader",
    "DATALOADER",
    "data loader",
    "Data loader",
    "Data Loader",
    "num_worker",
    "num-worker",
    "NUM_WORKER",
)
_HANG_WORDS = (
    "hang",
    "Hang",
    "HANG",
    "hung",
    "stuck",
    "Stuck",
    "freez",
    "Freez",
    "froze",
    "Froze",
    "deadlock",
    "Deadlock",
)
_FORK_CONFIRM = (
    "Rerun with `num_workers=0`: if the crash or hang goes away, run once with "
    '`DataLoader(..., multiprocessing_context="spawn")`; if that works too, state inherited through fork '
    "is the cause. `py-spy dump --pid WORKER_PID` shows where a hung worker waits; "
    "`python -X faulthandler` shows a crashing one's frames."
)

TD566 = register(
    Code(
        code="TD566",
        name="worker-fork-unsafe-state",
        family="worker-crash",
        severity=Severity.ERROR,
        area="loader",
        title="DataLoader workers crash or hang on state inherited through fork",
        message="The log describes DataLoader workers that crash or hang only with num_workers > 0 ({how}). The usual "
        "cause is state the workers inherit from the main process through fork that does not survive it: an "
        "open HDF5/LMDB/database handle, a thread pool or lock created before the loader started, a CUDA or "
        "native library context.",
        fix="Open such resources inside each worker, lazily on first use in `__getitem__` (e.g. `if self.h5 is None: "
        "self.h5 = h5py.File(path, 'r')`) or in `worker_init_fn`, never in the Dataset's `__init__`; create "
        "thread pools and clients after the loader has started its workers, or start workers with "
        '`multiprocessing_context="spawn"` (also the fix when GNU OpenMP refuses the fork: OpenMP-parallel code, '
        "numba or torch CPU ops, already ran in the main process). Keep worker-side libraries single-threaded (`torch.set_num_threads(1)` "
        "in `worker_init_fn`). CUDA cannot be used at all in a forked worker: return CPU tensors from `__getitem__`, "
        "transforms and `collate_fn`, and move the batch to the GPU in the training loop (`pin_memory=True` "
        'speeds the copy), or use `multiprocessing_context="spawn"`.',
        meaning="fork copies the parent's memory, open descriptors and the state of locks, but not its threads: a lock "
        "held by another thread stays locked forever in the child, a thread pool's threads are missing, and a "
        "file handle (HDF5) shared by several processes corrupts its reads. The worker then segfaults, raises "
        "odd errors or waits forever.",
        why="Datasets that open their file in `__init__`, libraries that start threads at import or first use (thread "
        "pools, logging handlers, gRPC, OpenCV), `torch.set_num_threads` called before the loader forks.",
        false_positives="A small /dev/shm (TD158), the OOM killer (TD273) and bugs in dataset code show similar symptoms; "
        "this is a hypothesis until the spawn test above confirms it.",
        related=("TD560", "TD565", "TD564", "TD158"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("fork() called from a process already using GNU OpenMP",),
                pattern=r"fork\(\) called from a process already using GNU OpenMP, this is unsafe",
                confidence=0.8,
                values={
                    "how": "libgomp ended a forked worker: 'fork() called from a process already using GNU OpenMP'"
                },
            ),
            Signature(  # torch/cuda/__init__.py _lazy_init, in a forked child of a process that had initialised CUDA
                role=Role.ROOT_CAUSE,
                triggers=("Cannot re-initialize CUDA in forked subprocess",),
                pattern=r"Cannot re-initialize CUDA in forked subprocess",
                confidence=0.85,
                values={"how": "CUDA used in a forked worker: 'Cannot re-initialize CUDA in forked subprocess'"},
            ),
            Signature(  # the same in torch < 1.2 or from the driver: cudaErrorInitializationError (3) in a worker's frames
                role=Role.ROOT_CAUSE,
                triggers=("initialization error",),
                pattern=r"CUDA error(?: \(3\))?: initialization error",
                context=("_worker_loop", "DataLoader worker process"),
                confidence=0.8,
                values={"how": "CUDA used in a forked DataLoader worker: 'CUDA error: initialization error'"},
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=_LOADER_WORDS,
                pattern=r"(?i)(?:CUDA error(?: \(3\))?: initialization error|re-initialize CUDA).{0,120}\b"
                r"(?:data ?loader|num[_-]?workers?)",
                confidence=0.6,
                values={"how": "a CUDA initialization error with num_workers > 0"},
                confirm=_FORK_CONFIRM,
            ),
            # Two-part prose: each signature's triggers are the part its pattern ends with, so a line cut short
            # (Signature.match's cut form) never matches on its first part alone.
            Signature(
                role=Role.SYMPTOM,
                triggers=_LOADER_WORDS,
                pattern=r"(?i)(?:segmentation fault|segfault|sigsegv).{0,120}\b(?:data ?loader|num[_-]?workers?)",
                exclude=(r"encountered in worker", r"is killed by signal"),
                confidence=0.6,
                values={"how": "a segmentation fault with num_workers > 0"},
                confirm=_FORK_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("egmentation fault", "EGMENTATION FAULT", "egfault", "SIGSEGV"),
                pattern=r"(?i)\b(?:data ?loader|num[_-]?workers?).{0,120}(?:segmentation fault|segfault|sigsegv)",
                exclude=(r"encountered in worker", r"is killed by signal"),
                confidence=0.6,
                values={"how": "a segmentation fault with num_workers > 0"},
                confirm=_FORK_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("num_worker", "num-worker", "NUM_WORKER", "multiple processes", "multiple workers"),
                pattern=r"(?i)\b(?:hdf5|h5py|lmdb)\b.{0,120}\b(?:num[_-]?workers?|multiple (?:processes|workers))",
                confidence=0.6,
                values={"how": "an HDF5/LMDB dataset read by several workers"},
                confirm=_FORK_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("hdf5", "HDF5", "Hdf5", "h5py", "lmdb", "LMDB"),
                pattern=r"(?i)\b(?:num[_-]?workers?|multiple (?:processes|workers))\b.{0,120}\b(?:hdf5|h5py|lmdb)",
                confidence=0.6,
                values={"how": "an HDF5/LMDB dataset read by several workers"},
                confirm=_FORK_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=_HANG_WORDS,
                pattern=r"(?i)\bnum[_-]?workers?\b.{0,100}\b(?:hang|hung|stuck|freez|froze|deadlock)",
                confidence=0.45,
                values={"how": "the loader hangs with num_workers > 0"},
                confirm=_FORK_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("num_worker", "num-worker", "NUM_WORKER"),
                pattern=r"(?i)\b(?:hangs?|hanging|hung|stuck|freez\w*|froze\w*|deadlock\w*)\b.{0,100}\bnum[_-]?worker",
                confidence=0.45,
                values={"how": "the loader hangs with num_workers > 0"},
                confirm=_FORK_CONFIRM,
            ),
        ),
    )
)

# -- thread-oversubscription -----------------------------------------------------------------------

TD570 = register(
    Code(
        code="TD570",
        name="loader-workers-exceed-cpus",
        family="thread-oversubscription",
        severity=Severity.WARNING,
        area="loader",
        title="the DataLoader starts more worker processes than the CPUs it may use",
        message="The DataLoader warned that it starts {workers} worker processes, more than the {suggested} CPUs this "
        "process may use. Workers then compete for cores with each other and with the training loop: loading "
        "gets slower, and it can stall or freeze. A warning, not an error: when the run failed, look for an "
        "error elsewhere first.",
        fix="Lower `num_workers` to at most the CPUs the process may use, counted per process when several training "
        "processes (ranks) share the machine: `num_workers=min(8, len(os.sched_getaffinity(0)) // "
        "local_world_size)`, never from `os.cpu_count()` alone (it ignores cpusets, containers and other ranks). "
        "Keep each worker single-threaded (`torch.set_num_threads(1)`, `cv2.setNumThreads(0)` in `worker_init_fn`, "
        "`OMP_NUM_THREADS=1`). `torchdoctor check --num-workers N` compares the count with the cores and quota.",
        meaning="`DataLoader.check_worker_number_rationality` compares `num_workers` with the CPUs in the process's "
        "affinity mask (`os.sched_getaffinity`) and prints this UserWarning when the loader asks for more; "
        "torch's wording is 'excessive worker creation might get DataLoader running slow or even freeze'.",
        why="`num_workers` copied from a bigger machine or computed from `os.cpu_count()` (the host's cores, not the "
        "container's or the job's share), and one such loader per rank on a multi-GPU node.",
        false_positives="The check counts CPUs only for this process and ignores its cgroup CPU quota; I/O-bound loaders "
        "(network storage) can use somewhat more workers than cores on purpose.",
        related=("TD250", "TD251", "TD252", "TD253"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("worker processes in total",),
                pattern=r"This DataLoader will create (?P<workers>\d+) worker processes in total\.(?:\s*Our suggested max "
                r"number of worker in current system is (?P<suggested>\d+))?",
                confidence=0.4,
                values={"suggested": "suggested number of"},
            ),
        ),
    )
)
