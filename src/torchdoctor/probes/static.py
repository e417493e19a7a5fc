"""What starting the loader's workers will cost, measured without starting them (probe child only).

* the effective start method and sharing strategy, and where each comes from;
* what is pickled to each spawn/forkserver worker (the Dataset, collate_fn, worker_init_fn:
  ``_MultiProcessingDataLoaderIter`` passes these to ``_worker_loop``; samplers stay in the
  main process), pickled with torch's own ``ForkingPickler`` and its registered reducers;
* the distinct tensor storages in it, counted by a ``reducer_override`` that records each storage
  instead of calling torch's ``reduce_storage`` (which would move it into shared memory): no
  shared segment, descriptor or mapping is created;
* when pickling fails, the attribute path to the object that cannot be pickled.
"""

from __future__ import annotations

import functools
import inspect
import io
import multiprocessing
import os
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

from ..units import human_bytes

#: Candidate children tried one by one; longer sequences are bisected.
_BISECT_OVER = 16
_MAX_DEPTH = 24


# -- start method and sharing strategy --------------------------------------------------------


def default_start_method(version: tuple[int, int], platform: str) -> str:
    """Python's default start method: spawn on macOS (3.8+) and Windows, forkserver on Linux from 3.14."""
    if platform.startswith("win") or platform == "darwin":
        return "spawn"
    return "forkserver" if version >= (3, 14) else "fork"


def start_method(loader: Any, parent: str | None) -> dict[str, Any]:
    """The start method the loader's workers will use, and why."""
    if loader.num_workers == 0:
        return {"method": None, "source": "num_workers=0: batches are made in the main process"}
    ctx = loader.multiprocessing_context
    if ctx is not None:
        return {"method": ctx.get_start_method(), "source": "DataLoader(multiprocessing_context=…)"}
    chosen = multiprocessing.get_start_method(allow_none=True)
    if parent:
        return {
            "method": chosen or parent,
            "source": f"--parent-start-method {parent}: a loader without multiprocessing_context inherits it",
        }
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    default = multiprocessing.get_all_start_methods()[0]
    if chosen and chosen != default:
        return {"method": chosen, "source": "set_start_method() in the target's code"}
    note = " (forkserver since Python 3.14)" if default == "forkserver" else ""
    return {"method": chosen or default, "source": f"Python {version}'s default on {sys.platform}{note}"}


def sharing_strategy(requested: str | None) -> dict[str, Any]:
    import torch.multiprocessing as tmp

    current = tmp.get_sharing_strategy()
    if requested:
        return {"strategy": current, "source": "--sharing-strategy"}
    default = "file_descriptor" if sys.platform.startswith("linux") else "file_system"
    source = "torch's default" if current == default else "set_sharing_strategy() in the target's code"
    return {"strategy": current, "source": source}


# -- the process that owns the loader ---------------------------------------------------------


def owner_facts() -> dict[str, Any]:
    """Mappings, descriptors, limits and threads of this process, the one that will start workers."""
    import resource

    import torch

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    with open("/proc/self/maps", "rb") as f:
        maps = sum(1 for _ in f)
    return {
        "pid": os.getpid(),
        "map_count": maps,
        "open_fds": len(os.listdir("/proc/self/fd")) - 1,
        "nofile_soft": None if soft == inf else soft,
        "nofile_hard": None if hard == inf else hard,
        "python_threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
        "cuda_initialized": bool(torch.cuda.is_initialized()),
        "torch_version": torch.__version__,
        "python": sys.version.split()[0],
    }


# -- pickling and storage counting ------------------------------------------------------------


class _Sink:
    """A file that only counts what is written to it."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, data: bytes) -> int:
        self.n += len(data)
        return len(data)


def _counting_pickler(sink: Any, storages: dict[int, int], tensors: list[int]) -> Any:
    from multiprocessing.reduction import ForkingPickler

    import torch

    class Counting(ForkingPickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                if obj.layout == torch.strided and obj.device.type == "cpu":
                    st = obj.untyped_storage()
                    storages.setdefault(st.data_ptr() or id(st), st.nbytes())
                tensors[0] += 1
                return (tuple, ())
            if isinstance(obj, (torch.UntypedStorage, torch.TypedStorage)):
                st = obj.untyped() if isinstance(obj, torch.TypedStorage) else obj
                storages.setdefault(st.data_ptr() or id(st), st.nbytes())
                return (tuple, ())
            return NotImplemented

    return Counting(sink, 4)


def _pickle_error(obj: Any) -> BaseException | None:
    try:
        _counting_pickler(_Sink(), {}, [0]).dump(obj)
    except RecursionError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the answer
        return exc
    return None


def count(payload: dict[str, Any]) -> dict[str, Any]:
    """Pickle the payload as workers get it; count storages and bytes. Never shares anything."""
    storages: dict[int, int] = {}
    tensors = [0]
    sink = _Sink()
    started = time.perf_counter()
    error: BaseException | None = None
    try:
        _counting_pickler(sink, storages, tensors).dump(payload)
    except Exception as exc:  # noqa: BLE001
        error = exc
    out: dict[str, Any] = {
        "count": len(storages),
        "bytes": sum(storages.values()),
        "nonempty": sum(1 for b in storages.values() if b > 0),
        "tensors": tensors[0],
        "pickle_bytes": sink.n,
        "seconds": round(time.perf_counter() - started, 3),
        "partial": error is not None,
    }
    return {"storages": out, "error": error}


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    """(path suffix, child) for what pickling ``obj`` would pickle in turn."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"[{k!r}]", v
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from ((f"[{i}]", v) for i, v in enumerate(obj))
    elif isinstance(obj, functools.partial):
        yield ".func", obj.func
        yield from ((f".args[{i}]", v) for i, v in enumerate(obj.args))
        yield from ((f".keywords[{k!r}]", v) for k, v in obj.keywords.items())
    elif isinstance(obj, types.MethodType):
        yield ".__self__", obj.__self__
        yield ".__func__", obj.__func__
    elif not isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        state: Any = None
        try:
            state = obj.__getstate__() if hasattr(obj, "__getstate__") else getattr(obj, "__dict__", None)
        except Exception:  # noqa: BLE001 - a broken __getstate__ is itself the culprit
            state = None
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            for k, v in state.items():
                yield f".{k}", v


def _first_failing(items: list[tuple[str, Any]]) -> tuple[str, Any] | None:
    """The first child whose pickling fails; long lists are bisected over slices."""
    if len(items) > _BISECT_OVER:
        lo, hi = 0, len(items)
        if _pickle_error([v for _, v in items]) is None:
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _pickle_error([v for _, v in items[lo:mid]]) is not None:
                hi = mid
            else:
                lo = mid
        return items[lo]
    for name, value in items:
        if _pickle_error(value) is not None:
            return name, value
    return None


def find_culprit(root_name: str, obj: Any) -> tuple[str, Any]:
    """The deepest attribute path under ``obj`` whose pickling fails while its parts pickle."""
    path, seen = root_name, set()
    for _ in range(_MAX_DEPTH):
        if id(obj) in seen:
            break
        seen.add(id(obj))
        try:
            items = list(_children(obj))
        except Exception:  # noqa: BLE001
            break
        hit = _first_failing(items)
        if hit is None:
            break
        path, obj = path + hit[0], hit[1]
    return path, obj


def describe_culprit(obj: Any) -> dict[str, Any]:
    """What the object is, in the words a fix needs: a lambda, a local function, a lock…"""
    qual = getattr(obj, "__qualname__", None)
    tname = f"{type(obj).__module__}.{type(obj).__qualname__}".replace("builtins.", "")
    where = None
    if isinstance(obj, (types.FunctionType, type)):
        try:
            where = f"{inspect.getsourcefile(obj)}:{inspect.getsourcelines(obj)[1]}"
        except (OSError, TypeError):
            where = None
    if isinstance(obj, (types.GeneratorType, types.AsyncGeneratorType)):
        kind = "generator"
    elif isinstance(obj, types.FunctionType) and qual and "<lambda>" in qual:
        kind = "lambda"
        qual = f"{obj.__module__}.{qual}" if "<locals>" not in qual else qual
    elif qual and "<locals>" in qual:
        kind = "local function" if isinstance(obj, types.FunctionType) else "local class"
    elif isinstance(obj, io.IOBase):
        kind = "open file"
    elif "lock" in type(obj).__name__.lower() or type(obj).__name__ in ("Condition", "Semaphore", "Event"):
        kind = "lock"
    elif type(obj).__name__ == "socket":
        kind = "socket"
    elif "<locals>" in type(obj).__qualname__:
        kind = "instance of a local class"
    elif isinstance(obj, type) or isinstance(obj, types.FunctionType):
        kind = "unimportable " + ("class" if isinstance(obj, type) else "function")
    else:
        kind = "object"
    text = repr(obj)
    return {
        "kind": kind,
        "type": tname,
        "qualname": qual,
        "repr": text[:120] + ("…" if len(text) > 120 else ""),
        "defined_at": where,
    }


def payload(loader: Any) -> dict[str, Any]:
    """What ``_MultiProcessingDataLoaderIter`` pickles to each worker besides queues and seeds."""
    return {"dataset": loader.dataset, "collate_fn": loader.collate_fn, "worker_init_fn": loader.worker_init_fn}


def analyse(loader: Any, parent: str | None, strategy: str | None) -> dict[str, Any]:
    """Everything static: start method, strategy, pickling (with culprit) and storages."""
    method = start_method(loader, parent)
    out: dict[str, Any] = {"start_method": method, "sharing_strategy": sharing_strategy(strategy)}
    counted = count(payload(loader))
    out["storages"] = counted["storages"]
    exc = counted["error"]
    pickling: dict[str, Any] = {"pickled_to_workers": method["method"] in ("spawn", "forkserver"), "ok": exc is None}
    if exc is not None:
        path, culprit = "worker payload", None
        for name, value in payload(loader).items():
            if _pickle_error(value) is not None:
                path, culprit = find_culprit(name, value)
                break
        pickling.update(
            error=f"{type(exc).__name__}: {exc}"[:500],
            path=path,
            culprit=describe_culprit(culprit) if culprit is not None else None,
        )
    out["pickling"] = pickling
    return out


def blockers(static: dict[str, Any], owner: dict[str, Any], limits: dict[str, Any]) -> list[str]:
    """Why starting workers would fail for sure (then the live run is skipped): pure arithmetic."""
    out: list[str] = []
    method = static["start_method"]["method"]
    if method not in ("spawn", "forkserver"):
        return out
    if not static["pickling"]["ok"]:
        out.append(f"the worker payload cannot be pickled ({static['pickling'].get('path')})")
    n = static["storages"]["count"]
    maps = limits.get("max_map_count")
    if maps is not None and n + owner["map_count"] > maps:
        out.append(f"{n} storages + {owner['map_count']} mappings > vm.max_map_count {maps}")
    if static["sharing_strategy"]["strategy"] == "file_descriptor" and owner.get("nofile_soft") is not None:
        if static["storages"]["nonempty"] + owner["open_fds"] > owner["nofile_soft"]:
            out.append(
                f"{static['storages']['nonempty']} storages + {owner['open_fds']} open descriptors > "
                f"RLIMIT_NOFILE {owner['nofile_soft']}"
            )
    free = limits.get("shm_free")
    if free is not None and static["storages"]["bytes"] > free:
        out.append(f"{human_bytes(static['storages']['bytes'])} of storages > {human_bytes(free)} free in /dev/shm")
    return out


def batch_blockers(batch: dict[str, Any], loader: Any, limits: dict[str, Any]) -> list[str]:
    """Why the live run would fail for sure: batches in flight larger than /dev/shm's free space."""
    free, workers = limits.get("shm_free"), loader.num_workers
    if free is None or workers == 0:
        return []
    need = int(batch.get("bytes") or 0) * workers * int(loader.prefetch_factor or 2)
    return [f"{human_bytes(need)} of batches in flight > {human_bytes(free)} free in /dev/shm"] if need > free else []
