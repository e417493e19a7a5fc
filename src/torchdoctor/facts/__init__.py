"""Facts: what the machine and process look like, gathered once, judged elsewhere.

Only this package touches the operating system. Every section is gathered by one module's
``gather(ctx)`` with a timeout, never through a shell, and never changes anything it reads.
A value that cannot be read is ``None`` and its reason is recorded under ``unknown``; the whole
snapshot is plain JSON so that a machine can be recorded (``torchdoctor facts --format json``)
and replayed (``torchdoctor check --facts FILE``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import FactsFileError
from .context import GatherContext

SCHEMA_VERSION = 1

_MISSING = object()


class Facts:
    """A JSON-serialisable snapshot of facts, addressed by dotted paths (``"shm.size_bytes"``)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.data.setdefault("unknown", {})

    # -- access -------------------------------------------------------------------------------
    def get(self, path: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in path.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return default
        return default if node is None else node

    def section(self, name: str) -> dict[str, Any]:
        value = self.data.get(name)
        return value if isinstance(value, dict) else {}

    @property
    def unknown(self) -> dict[str, str]:
        return self.data["unknown"]

    def why_unknown(self, path: str) -> str | None:
        """The recorded reason a fact (or its section) could not be read."""
        while path:
            if path in self.unknown:
                return self.unknown[path]
            path = path.rpartition(".")[0]
        return None

    @property
    def source(self) -> str:
        return str(self.get("meta.source", "live"))

    # -- (de)serialisation --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return self.data

    def dumps(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=True, default=str)

    @classmethod
    def load(cls, path: str | Path) -> Facts:
        """Read a recorded snapshot; any problem becomes one clear :class:`FactsFileError`."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FactsFileError(
                f"facts file {str(p)!r} does not exist; record one with "
                "`torchdoctor facts --format json > facts.json`"
            ) from None
        except IsADirectoryError:
            raise FactsFileError(f"facts file {str(p)!r} is a directory; pass the JSON file itself") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise FactsFileError(f"cannot read facts file {str(p)!r}: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FactsFileError(
                f"facts file {str(p)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                "record one with `torchdoctor facts --format json > facts.json`"
            ) from None
        return cls.from_dict(data, origin=str(p))

    @classmethod
    def from_dict(cls, data: Any, origin: str = "<dict>") -> Facts:
        if not isinstance(data, dict) or "meta" not in data:
            raise FactsFileError(
                f"{origin} is JSON but not a torchdoctor facts snapshot (no 'meta' section); "
                "record one with `torchdoctor facts --format json > facts.json`"
            )
        version = data.get("meta", {}).get("schema_version")
        if version != SCHEMA_VERSION:
            raise FactsFileError(
                f"{origin} has facts schema_version {version!r}; this torchdoctor reads version "
                f"{SCHEMA_VERSION}: record the snapshot again with this version"
            )
        if not isinstance(data.get("unknown", {}), dict):
            raise FactsFileError(f"{origin}: 'unknown' must be an object mapping fact paths to reasons")
        data = dict(data)
        data["meta"] = dict(data["meta"], source=data["meta"].get("source") or "file")
        return cls(data)


Gatherer = Callable[[GatherContext], dict[str, Any]]


def _gatherers() -> list[tuple[str, Gatherer]]:
    from . import cgroups, cpu, dist_env, gpu, host, limits, memory, paths, shm, torch_info

    return [
        ("host", host.gather),
        ("shm", shm.gather),
        ("limits", limits.gather),
        ("memory", memory.gather),
        ("cgroup", cgroups.gather),
        ("cpu", cpu.gather),
        ("torch", torch_info.gather),
        ("gpu", gpu.gather),
        ("dist", dist_env.gather),
        ("paths", paths.gather),
    ]


def gather(ctx: GatherContext | None = None, sections: list[str] | None = None) -> Facts:
    """Gather every section concurrently, each bounded by ``ctx.section_timeout`` seconds.

    A section that raises or times out is recorded under ``unknown`` with the reason; gathering
    itself never raises.
    """
    from .. import __version__

    ctx = ctx or GatherContext()
    started = time.perf_counter()
    data: dict[str, Any] = {}
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    todo = [(n, g) for n, g in _gatherers() if sections is None or n in sections]

    def work(name: str, fn: Gatherer) -> None:
        try:
            results[name] = fn(ctx)
        except Exception as exc:  # a broken gatherer degrades to "unknown", never a crash
            errors[name] = f"{type(exc).__name__}: {exc}"

    threads = []
    for name, fn in todo:
        t = threading.Thread(target=work, args=(name, fn), name=f"torchdoctor-facts-{name}", daemon=True)
        try:
            t.start()
        except RuntimeError:  # RLIMIT_NPROC or a pids cgroup refuses threads: gather inline instead
            work(name, fn)
            continue
        threads.append((name, t))
    deadline = time.monotonic() + ctx.section_timeout
    for name, t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            errors[name] = f"timed out after {ctx.section_timeout:g} s"
    for name, _ in todo:
        if name in results and name not in errors:
            data[name] = results[name]
        else:
            data[name] = None
            ctx.unknown(name, errors.get(name, "not gathered"))
    data["meta"] = {
        "schema_version": SCHEMA_VERSION,
        "torchdoctor_version": __version__,
        "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gather_seconds": round(time.perf_counter() - started, 3),
        "source": "live",
        "options": ctx.describe(),
    }
    data["unknown"] = dict(sorted(ctx.unknowns.items()))
    return Facts(data)


__all__ = ["Facts", "GatherContext", "gather", "SCHEMA_VERSION"]
