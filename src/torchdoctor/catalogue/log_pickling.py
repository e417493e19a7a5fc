"""TD550-559: DataLoader workers that cannot get their dataset (worker-pickling), as seen in logs.

With spawn/forkserver the Dataset, collate_fn and worker_init_fn are pickled to every worker.
Positive and near-miss fixtures live in ``tests/fixtures/logs/<CODE>/``, recorded by the lab
scenarios in ``torchdoctor/lab/scenarios/loader.py`` or copied from public reports.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature

_PICKLING_WHY = (
    "With the spawn or forkserver start method (the default on macOS and Windows, on Linux from Python "
    "3.14, and for any DataLoader created in a process that was itself started that way) the Dataset, "
    "its transforms, collate_fn and worker_init_fn are pickled to every worker."
)
_TRY_FORK = (
    'On Linux, `DataLoader(..., multiprocessing_context="fork")` avoids pickling altogether (workers '
    "inherit the dataset)."
)
_ISOLATE = (
    "Quick isolation step (and stop-gap until the fix is in): `DataLoader(..., num_workers=0)` loads in the "
    "main process and pickles nothing; if the error goes away, pickling for the workers was the cause. "
    "It is slower, so restore the workers once the fix is in."
)

TD550 = register(
    Code(
        code="TD550",
        name="pickle-local-object",
        family="worker-pickling",
        severity=Severity.ERROR,
        area="loader",
        title="a local function or lambda cannot be pickled to the workers",
        message="`{object}` cannot be pickled (`Can't {verb} local object`): it is defined inside a function, so a "
        "worker process could not import it by name. The Dataset (or collate_fn / worker_init_fn) holds it.",
        fix="Define the function or class at module level (`def transform(x): ...` at the top of a module) and pass that; "
        "for parameters use `functools.partial(module_level_fn, arg)` or a small module-level class with "
        "`__call__`. " + _TRY_FORK + " " + _ISOLATE,
        meaning="pickle stores functions and classes by their qualified name and the worker imports them; a name with "
        "`<locals>` in it (a nested function, a lambda inside a function) cannot be imported. Python up to "
        "3.12.4 says `Can't pickle local object`, 3.12.5 and 3.13 `Can't get local object` (an AttributeError), "
        "3.14 a PicklingError naming the function.",
        why=_PICKLING_WHY,
        false_positives="Any other pickling of local objects (multiprocessing.Pool tasks, torch.save of a model holding a "
        "lambda) fails with the same text; the traceback shows which.",
        related=("TD551", "TD552", "TD553", "TD112"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Can't pickle local object", "Can't get local object"),
                pattern=r"Can't (?P<verb>pickle|get) local object '?(?:<(?:function|class) )?(?P<object>[^'\s]+)",
                confidence=0.9,
            ),
        ),
    )
)

TD551 = register(
    Code(
        code="TD551",
        name="pickle-attribute-lookup",
        family="worker-pickling",
        severity=Severity.ERROR,
        area="loader",
        title="an object cannot be pickled to the workers: its name does not lead back to it",
        message="`{object}` cannot be pickled: looking up `{name}` in `{module}` failed, so a worker could not find it by "
        "name. A module-level lambda is called `<lambda>`, not by the variable it is assigned to.",
        fix="Replace `name = lambda ...` with `def name(...): ...` at module level, and make sure classes and functions "
        "are reachable as `module.name` (not created dynamically or renamed). " + _TRY_FORK + " " + _ISOLATE,
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
            Signature(  # Python 2.7's cPickle (and 3.0-3.3's _pickle): "attribute lookup <module>.<name> failed", no " on "
                role=Role.ROOT_CAUSE,
                triggers=("attribute lookup",),
                pattern=r"Can't pickle (?P<object><.+?>): attribute lookup (?P<module>[^\s:]+)\.(?P<name>[^.\s]+) failed",
                confidence=0.85,
            ),
            Signature(  # the pure-Python pickler (Python 2.7 pickle.py, used by multiprocessing's ForkingPickler on
                # Windows; Python 3's pickle.py; both picklers from Python 3.14): "it's not found as <module>.<name>"
                role=Role.ROOT_CAUSE,
                triggers=("it's not found as",),
                pattern=r"Can't pickle (?P<object><.+?>): it's not found as (?P<module>[^\s:]+)\.(?P<name>[^.\s]+)",
                confidence=0.85,
            ),
        ),
    )
)

TD552 = register(
    Code(
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
        "Materialise generators into lists. " + _TRY_FORK + " " + _ISOLATE,
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
    )
)

TD553 = register(
    Code(
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
        '`if __name__ == "__main__":`. ' + _TRY_FORK + " " + _ISOLATE,
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
    )
)

TD554 = register(
    Code(
        code="TD554",
        name="main-guard-missing",
        family="worker-pickling",
        severity=Severity.ERROR,
        area="loader",
        title='workers re-ran the training script: the `if __name__ == "__main__":` guard is missing',
        message="A worker process re-ran the main script and tried to start processes itself (`An attempt has been made "
        "to start a new process before the current process has finished its bootstrapping phase`): the code "
        'that creates the DataLoader is not under `if __name__ == "__main__":`.',
        fix="Put everything that runs (building the DataLoader, training) in a function called from "
        '`if __name__ == "__main__": main()`; keep only imports, classes and functions at module level '
        "(`freeze_support()` is only needed for frozen executables). " + _TRY_FORK + " " + _ISOLATE,
        meaning="spawn and forkserver workers import the main script as `__mp_main__` to find its classes; top-level code "
        "runs again there, and starting workers from a worker that is still bootstrapping is refused. Python "
        "prints a multi-line RuntimeError; pasted logs often keep only some of its lines.",
        why="Scripts written on Linux with fork (no guard needed) run on macOS/Windows, with Python 3.14 (forkserver "
        'default) or with `multiprocessing_context="spawn"`.',
        false_positives="None known; the text comes from Python's multiprocessing only.",
        related=("TD553", "TD564"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("An attempt has been made to start a new process",),
                pattern=r"An attempt has been made to start a new process before the",
                confidence=0.9,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=(
                    "finished its bootstrapping phase",
                    "not using fork to start your",
                    "line can be omitted if the program",
                    "is not going to be frozen to produce an executable",
                ),
                pattern=r"(?P<part>current process has finished its bootstrapping phase|you are not using fork to start "
                r"your|line can be omitted if the program|is not going to be frozen to produce an executable)",
                confidence=0.85,
            ),
        ),
    )
)

_PICKLE_CONFIRM = (
    "Run once with `DataLoader(..., num_workers=0)`: if the error goes away, pickling the Dataset for the "
    "workers is the cause. Then look in the full output for the parent's own error, `Can't pickle ...` or "
    "`cannot pickle '...' object` (it names the object), or test it directly: "
    "`import pickle; pickle.dumps(dataset)`."
)

TD555 = register(
    Code(
        code="TD555",
        name="worker-dataset-not-transferred",
        family="worker-pickling",
        severity=Severity.ERROR,
        area="loader",
        title="a spawned worker did not receive its Dataset: pickling it for the worker failed",
        message="A DataLoader worker (or another spawned process) could not be given its Dataset ({how}). With the spawn "
        "start method (Windows, macOS) the Dataset, collate_fn and worker_init_fn are pickled to every worker; "
        "when the parent cannot pickle one of them, the parent raises a pickling error and the child, whose "
        "input stops short, fails with `EOFError: Ran out of input`.",
        fix="Find the object that does not pickle (the parent's error names it; `pickle.dumps(dataset)` in the main "
        "process reproduces it) and make it picklable: module-level functions instead of lambdas and local "
        "functions, open files / DB handles / locks created lazily in the worker. Put the training code under "
        '`if __name__ == "__main__":`. ' + _TRY_FORK + " " + _ISOLATE,
        meaning="multiprocessing's spawn child reads the pickled process object from a pipe (`spawn.py`, "
        "`reduction.pickle.load(from_parent)`); an empty pipe means the parent failed while pickling "
        "(`popen_spawn_*`, `reduction.dump`, `ForkingPickler`). The parent's error is the cause; the child's "
        "EOFError is its echo, often the only line that reaches the console or the issue report.",
        why=_PICKLING_WHY + " Notebooks and scripts written on Linux (fork) hit this on Windows and macOS.",
        false_positives="`EOFError: Ran out of input` also comes from unpickling an empty or truncated file "
        "(`torch.load`/`pickle.load` of a checkpoint cut short); the traceback then ends in "
        "`serialization.py`, not in multiprocessing's `spawn.py`.",
        related=("TD550", "TD551", "TD552", "TD553", "TD554"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Ran out of input",),
                pattern=r"EOFError: Ran out of input",
                context=(
                    "spawn_main",
                    "pickle.load(from_parent)",
                    "multiprocessing/spawn.py",
                    "multiprocessing\\spawn.py",
                ),
                confidence=0.75,
                values={"how": "the spawned child found its input empty: `EOFError: Ran out of input` in spawn.py"},
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("PicklingError",),
                pattern=r"(?:_?pickle\.)?PicklingError\b(?P<detail>.*)",
                exclude=(r"Can't (?:pickle|get) local object", r"attribute lookup", r"(?:cannot|can't) pickle '"),
                context=(
                    "multiprocessing/reduction.py",
                    "multiprocessing\\reduction.py",
                    "popen_spawn",
                    "ForkingPickler",
                ),
                confidence=0.75,
                values={"how": "the parent's PicklingError while pickling the process object for the worker"},
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("Ran out of input",),
                pattern=r"EOFError:? Ran out of input",
                confidence=0.55,
                values={"how": "`EOFError: Ran out of input` (the usual echo, in the worker, of a pickling error)"},
                confirm=_PICKLE_CONFIRM,
            ),
            # Two-part prose: each signature's triggers are the part its pattern ends with, so a line cut short
            # (Signature.match's cut form) never matches on its first part alone.
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    "PicklingError",
                    "Pickling error",
                    "Pickling Error",
                    "pickling error",
                    "Pickle error",
                    "pickle error",
                    "Pickle Error",
                    "PickleError",
                ),
                pattern=r"(?i)pickl(?:e|ing) ?error",
                confidence=0.5,
                values={"how": "a pickling error is mentioned"},
                confirm=_PICKLE_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("pickl", "Pickl", "PICKL"),
                pattern=r"(?i)\b(?:error|issue|problem|fail\w*)\b.{0,60}\bpickl",
                exclude=(r"(?i)pickl(?:e|ing) ?error",),
                confidence=0.5,
                values={"how": "a pickling error is mentioned"},
                confirm=_PICKLE_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("num_worker", "num-worker", "NUM_WORKER"),
                pattern=r"(?i)\bwindows\b.{0,100}\bnum[_-]?workers?\b",
                confidence=0.45,
                values={"how": "num_workers > 0 on Windows (spawn)"},
                confirm=_PICKLE_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("windows", "Windows", "WINDOWS"),
                pattern=r"(?i)\bnum[_-]?workers?\b.{0,100}\bwindows\b",
                confidence=0.45,
                values={"how": "num_workers > 0 on Windows (spawn)"},
                confirm=_PICKLE_CONFIRM,
            ),
        ),
    )
)
