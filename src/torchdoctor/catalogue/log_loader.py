"""TD55x-59x: DataLoader workers that cannot be started or die, as they show up in logs (``explain``).

TD550-554 worker-pickling (spawn/forkserver pickle the Dataset to each worker), TD560-569 workers
that die (signals, exit codes, hangs) and the main process's "exited unexpectedly" cascade.
Positive and near-miss fixtures live in ``tests/fixtures/logs/<CODE>/``, recorded by the lab
scenarios in ``torchdoctor/lab/scenarios/loader.py``.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature

_PICKLING_WHY = ("With the spawn or forkserver start method (the default on macOS and Windows, on Linux from Python "
                 "3.14, and for any DataLoader created in a process that was itself started that way) the Dataset, "
                 "its transforms, collate_fn and worker_init_fn are pickled to every worker.")
_TRY_FORK = ("On Linux, `DataLoader(..., multiprocessing_context=\"fork\")` avoids pickling altogether (workers "
             "inherit the dataset).")

# -- worker-pickling -----------------------------------------------------------------------------

TD550 = register(Code(
    code="TD550",
    name="pickle-local-object",
    family="worker-pickling",
    severity=Severity.ERROR,
    area="loader",
    title="a local function or lambda cannot be pickled to the workers",
    message="`{object}` cannot be pickled (`Can't pickle local object`): it is defined inside a function, so a "
            "worker process could not import it by name. The Dataset (or collate_fn / worker_init_fn) holds it.",
    fix="Define the function or class at module level (`def transform(x): ...` at the top of a module) and pass that; "
        "for parameters use `functools.partial(module_level_fn, arg)`. " + _TRY_FORK,
    meaning="pickle stores functions and classes by their qualified name and the worker imports them; a name with "
            "`<locals>` in it (a nested function, a lambda inside a function) cannot be imported.",
    why=_PICKLING_WHY,
    false_positives="Any other pickling of local objects (multiprocessing.Pool tasks, torch.save of a model holding a "
                    "lambda) fails with the same text; the traceback shows which.",
    related=("TD551", "TD552", "TD553", "TD112"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("Can't pickle local object",),
            pattern=r"Can't pickle local object '?(?P<object>[^'\n]+)",
            confidence=0.9,
        ),
    ),
))

TD551 = register(Code(
    code="TD551",
    name="pickle-attribute-lookup",
    family="worker-pickling",
    severity=Severity.ERROR,
    area="loader",
    title="an object cannot be pickled to the workers: its name does not lead back to it",
    message="`{object}` cannot be pickled: looking up `{name}` in `{module}` failed, so a worker could not find it by "
            "name. A module-level lambda is called `<lambda>`, not by the variable it is assigned to.",
    fix="Replace `name = lambda ...` with `def name(...): ...` at module level, and make sure classes and functions "
        "are reachable as `module.name` (not created dynamically or renamed). " + _TRY_FORK,
    meaning="pickle records a function as (module, qualified name) and checks that importing that name gives the same "
            "object; a lambda's qualified name is `<lambda>`, which no module defines.",
    why=_PICKLING_WHY,
    false_positives="Decorators that replace a function without functools.wraps, or classes created at runtime, "
                    "fail the same lookup.",
    related=("TD550", "TD552"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("attribute lookup",),
            pattern=r"Can't pickle (?P<object><.+?>): attribute lookup (?P<name>\S+) on (?P<module>\S+) failed",
            confidence=0.85,
        ),
    ),
))

TD552 = register(Code(
    code="TD552",
    name="pickle-unpicklable-type",
    family="worker-pickling",
    severity=Severity.ERROR,
    area="loader",
    title="the Dataset holds an object that cannot be pickled (lock, generator, open handle)",
    message="An object of type `{type}` cannot be pickled, and the Dataset (or something it references) holds one: "
            "locks, generators, open files, sockets, database and native-library handles do not travel to worker "
            "processes.",
    fix="Open or create such objects in the worker: lazily in `__getitem__`, or in `worker_init_fn` through "
        "`torch.utils.data.get_worker_info().dataset`. Or leave them out of the pickled state: `def __getstate__(self): "
        "state = self.__dict__.copy(); del state['lock']; return state` and re-create them in `__setstate__`. "
        "Materialise generators into lists. " + _TRY_FORK,
    meaning="Objects tied to the running process (a lock's OS state, a generator's suspended frame, a file "
            "descriptor) have no pickled form; pickle raises TypeError naming the type.",
    why=_PICKLING_WHY,
    false_positives="The same TypeError from other pickling (torch.save, multiprocessing.Pool arguments, Ray); the "
                    "traceback shows which.",
    related=("TD550", "TD551", "TD112"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("cannot pickle '", "can't pickle "),
            pattern=r"(?:cannot|can't) pickle '?(?P<type>[\w.]+)'? objects?",
            exclude=(r"local object",),
            confidence=0.85,
        ),
    ),
))

TD553 = register(Code(
    code="TD553",
    name="worker-main-attribute-missing",
    family="worker-pickling",
    severity=Severity.ERROR,
    area="loader",
    title="a worker cannot find a class or function defined in __main__",
    message="A worker could not find `{name}` in its `__main__` module: the object was defined in code the worker does "
            "not re-run (`python -c`, an interactive session or notebook cell), so unpickling the Dataset failed "
            "and the worker exited.",
    fix="Move the Dataset class (and functions it uses) into a module file and import it (`from mydata import "
        "MyDataset`), or run the program as a script file with the training code under "
        "`if __name__ == \"__main__\":`. " + _TRY_FORK,
    meaning="A spawn/forkserver worker re-creates `__main__` from the parent's script file; classes defined in "
            "`python -c` code, a REPL or a Jupyter cell have no file to re-run, so the pickled reference "
            "`__main__.Name` cannot be resolved in the worker.",
    why="Interactive development (Jupyter, IPython, `python -c`) with num_workers > 0 on macOS/Windows, or on Linux "
        "with spawn/forkserver.",
    false_positives="A class renamed or moved between pickling and unpickling gives the same error for another "
                    "module; this code only matches `__main__`.",
    related=("TD554", "TD564", "TD550"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("Can't get attribute",),
            pattern=r"Can't get attribute '(?P<name>[^']+)' on <module '__main__'",
            confidence=0.9,
        ),
    ),
))

TD554 = register(Code(
    code="TD554",
    name="main-guard-missing",
    family="worker-pickling",
    severity=Severity.ERROR,
    area="loader",
    title="workers re-ran the training script: the `if __name__ == \"__main__\":` guard is missing",
    message="A worker process re-ran the main script and tried to start processes itself (`An attempt has been made "
            "to start a new process before the current process has finished its bootstrapping phase`): the code "
            "that creates the DataLoader is not under `if __name__ == \"__main__\":`.",
    fix="Put everything that runs (building the DataLoader, training) in a function called from "
        "`if __name__ == \"__main__\": main()`; keep only imports, classes and functions at module level. "
        + _TRY_FORK,
    meaning="spawn and forkserver workers import the main script as `__mp_main__` to find its classes; top-level code "
            "runs again there, and starting workers from a worker that is still bootstrapping is refused.",
    why="Scripts written on Linux with fork (no guard needed) run on macOS/Windows, with Python 3.14 (forkserver "
        "default) or with `multiprocessing_context=\"spawn\"`.",
    false_positives="None known; the text comes from Python's multiprocessing only.",
    related=("TD553", "TD564"),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("An attempt has been made to start a new process",),
            pattern=r"An attempt has been made to start a new process before the",
            confidence=0.9,
        ),
    ),
))

# -- worker-crash --------------------------------------------------------------------------------

_ISOLATE = ("Reproduce with `num_workers=0`: the crash then happens in the main process, where "
            "`python -X faulthandler` (or `gdb -ex r --args python train.py`) shows the native frame.")

TD560 = register(Code(
    code="TD560",
    name="loader-worker-killed-by-signal",
    family="worker-crash",
    severity=Severity.ERROR,
    area="loader",
    title="a DataLoader worker was killed by a signal",
    message="A DataLoader worker died of a signal ({signal}). Segmentation faults and aborts come from native code in "
            "the worker (a library used after fork, a handle or pointer from another process, a library bug); "
            "'Terminated' means something sent it SIGTERM (a launcher, a scheduler's preemption, a stray kill).",
    fix=_ISOLATE + " Open native resources (decoders, DB/RPC clients, memory maps) inside the worker (lazily, or in "
        "`worker_init_fn`), never pass handles or addresses to it; with libraries that are not fork-safe use "
        "`multiprocessing_context=\"spawn\"`; cap library threads in `worker_init_fn` (`cv2.setNumThreads(0)`, "
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
            pattern=r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: (?P<signal>[^.]+)\.",
            exclude=(r"killed by signal: Bus error", r"killed by signal: Killed\."),
            confidence=0.85,
        ),
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("encountered in worker",),
            pattern=r"ERROR: Unexpected (?P<signal>segmentation fault|floating-point exception) encountered in worker",
            confidence=0.85,
        ),
    ),
))

TD562 = register(Code(
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
        "of objects (copy-on-write turns every touched object's page into a private copy in each worker), fewer "
        "workers, a lower `prefetch_factor`; or raise the memory limit.",
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
            pattern=r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: Killed\.",
            confidence=0.75,
        ),
    ),
))

TD563 = register(Code(
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
            role=Role.ROOT_CAUSE,
            triggers=("exited unexpectedly with exit code",),
            pattern=r"DataLoader worker \(pid (?P<pid>\d+)\) exited unexpectedly with exit code (?P<exit_code>-?\d+)",
            confidence=0.6,
        ),
    ),
))

TD564 = register(Code(
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
))

TD565 = register(Code(
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
        "`multiprocessing_context=\"spawn\"`, or create such objects in `worker_init_fn`. For slow storage, raise "
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
))
