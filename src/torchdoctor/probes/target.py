"""Load the user's TARGET and turn what it returns into the DataLoader to probe.

TARGET is ``package.module:callable`` or ``path/to/file.py:callable`` (``callable`` may be dotted,
``Class.factory``). The callable takes no arguments and returns a ``DataLoader`` or a ``Dataset``;
a Dataset is wrapped in a DataLoader built from the override flags. Runs in the probe's child
process only (it imports the user's code, and torch).

A file target is imported under its own stem with its directory first on ``sys.path``, as
``python file.py`` would find its neighbours; spawn/forkserver workers inherit that ``sys.path``
and can import the file's classes by the same name.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TargetNotFound(Exception):
    """TARGET names nothing importable: the user's typo, not a failure of their code."""


class NotALoader(Exception):
    """TARGET returned something that is neither a DataLoader nor a Dataset."""


@dataclass(frozen=True)
class Overrides:
    """DataLoader arguments given on the command line; None keeps what the target chose."""

    batch_size: int | None = None
    num_workers: int | None = None
    multiprocessing_context: str | None = None
    prefetch_factor: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None

    def any(self) -> bool:
        return any(v is not None for v in self.__dict__.values())


def parse(target: str) -> tuple[str, str]:
    """``"a.b:fn"`` → ``("a.b", "fn")``; the module part may be a ``.py`` path."""
    module, sep, attr = target.rpartition(":")
    if not sep or not module or not attr:
        raise TargetNotFound(f"TARGET {target!r} is not of the form package.module:callable or path/file.py:callable")
    return module, attr


FORMS = "TARGET is path/to/file.py:function or package.module:function"


def is_path(module: str) -> bool:
    """The module part of TARGET names a file (``x.py``, ``dir/x``), not a dotted module."""
    return module.endswith(".py") or os.sep in module or bool(os.altsep and os.altsep in module)


def file_problem(module: str, importable: bool = False) -> str | None:
    """Why the module part of TARGET cannot be imported as a file (None: it can, or it is a module name).

    A name that is not path-like (``notes.txt``) is a file only when such a file exists and the
    dotted name is not ``importable``."""
    path = Path(module)
    if not is_path(module):
        if importable or not path.is_file():
            return None
        return f"TARGET file {module!r} is not a Python file (it does not end in .py); {FORMS}"
    if not path.exists():
        return f"TARGET file {module!r} does not exist"
    if path.is_dir():
        return f"TARGET {module!r} is a directory, not a Python file; {FORMS}"
    if path.suffix != ".py":
        return f"TARGET file {module!r} is not a Python file (it does not end in .py); {FORMS}"
    return None


def top_level_exists(module: str) -> bool:
    """The top-level package or module of a dotted name can be found on ``sys.path`` (nothing is imported)."""
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):  # an empty or relative name
        return False


def _import(module: str) -> Any:
    top = module.split(".")[0]
    problem = file_problem(module, importable=not is_path(module) and top_level_exists(module))
    if problem:
        raise TargetNotFound(problem)
    if is_path(module):
        path = Path(module).resolve()
        sys.path.insert(0, str(path.parent))
        name = path.stem
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) != str(path):
            del sys.modules[name]
        shown, module = module, name
    elif not top_level_exists(module):
        raise TargetNotFound(
            f"no module named {top!r} (TARGET module {module!r}); "
            "run from the directory that contains it or set PYTHONPATH"
        )
    else:
        shown = module
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # the target itself (or its package) is missing: a usage error; a module the target imports
        # that is missing is the user's code failing, a finding
        if exc.name and (exc.name == module or module.startswith(exc.name + ".")):
            problem = file_problem(shown) if Path(shown).is_file() else None  # `notes.txt` beside a `notes/`
            raise TargetNotFound(
                problem or f"no module named {exc.name!r} (TARGET module {shown!r}); {FORMS}"
            ) from None
        raise


def load(target: str) -> Callable[[], Any]:
    """Import TARGET's module (the user's import errors propagate as they are) and get the callable."""
    module_name, attr = parse(target)
    obj = _import(module_name)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetNotFound(f"{module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TargetNotFound(f"TARGET {target!r} is a {type(obj).__name__}, not a callable")
    return obj


def default_workers() -> int:
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def to_loader(obj: Any, over: Overrides) -> Any:
    """A DataLoader from what the target returned, with the overrides applied."""
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    if isinstance(obj, DataLoader):
        return rebuild(obj, over) if over.any() else obj
    if _is_dataset(obj, Dataset, IterableDataset):
        workers = over.num_workers if over.num_workers is not None else default_workers()
        kw: dict[str, Any] = {
            "batch_size": over.batch_size if over.batch_size is not None else 1,
            "num_workers": workers,
            "pin_memory": bool(over.pin_memory),
            "multiprocessing_context": over.multiprocessing_context,
        }
        if workers > 0:
            kw["prefetch_factor"] = over.prefetch_factor
            kw["persistent_workers"] = bool(over.persistent_workers)
        return DataLoader(obj, **kw)
    raise NotALoader(
        f"the target returned a {type(obj).__module__}.{type(obj).__qualname__}, not a torch DataLoader or Dataset"
    )


def _is_dataset(obj: Any, *torch_types: type) -> bool:
    """A torch Dataset, or what DataLoader also takes as a map-style dataset: a sequence (not a str,
    bytes or mapping)."""
    from collections.abc import Mapping

    if isinstance(obj, torch_types):
        return True
    if isinstance(obj, (str, bytes, Mapping)):
        return False
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")


def rebuild(loader: Any, over: Overrides | None = None, **changes: Any) -> Any:
    """The same loader (dataset, sampling, collate_fn, worker_init_fn…) with some arguments changed."""
    from torch.utils.data import DataLoader

    over = over or Overrides()
    values = {k: v for k, v in over.__dict__.items() if v is not None}
    values.update(changes)
    workers = values.get("num_workers", loader.num_workers)
    kw: dict[str, Any] = {
        "num_workers": workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": values.get("pin_memory", loader.pin_memory),
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "multiprocessing_context": values.get("multiprocessing_context", loader.multiprocessing_context),
    }
    if "batch_size" in values:
        kw.update(batch_size=values["batch_size"], sampler=loader.sampler, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kw["batch_sampler"] = loader.batch_sampler
    else:
        kw.update(batch_size=None, sampler=loader.sampler)
    if workers > 0:
        prefetch = values.get("prefetch_factor", loader.prefetch_factor if loader.num_workers > 0 else None)
        kw["prefetch_factor"] = prefetch
        kw["persistent_workers"] = values.get("persistent_workers", loader.persistent_workers)
    return DataLoader(loader.dataset, **kw)


def in_process(loader: Any) -> Any:
    """The same loader without workers: batches are made in this process, nothing is shared."""
    return rebuild(loader, num_workers=0, multiprocessing_context=None)


def describe(loader: Any) -> dict[str, Any]:
    """The loader's arguments as plain data."""
    try:
        length: int | None = len(loader.dataset)
    except TypeError:
        length = None
    try:
        batches: int | None = len(loader)
    except TypeError:
        batches = None
    ctx = loader.multiprocessing_context
    return {
        "dataset_type": f"{type(loader.dataset).__module__}.{type(loader.dataset).__qualname__}",
        "dataset_len": length,
        "batches_per_epoch": batches,
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "prefetch_factor": loader.prefetch_factor,
        "pin_memory": loader.pin_memory,
        "persistent_workers": loader.persistent_workers,
        "multiprocessing_context": ctx.get_start_method() if ctx is not None else None,
        "collate_fn": _name(loader.collate_fn),
        "worker_init_fn": _name(loader.worker_init_fn),
    }


def _name(fn: Any) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
