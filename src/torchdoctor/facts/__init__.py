"""Facts: what the machine and process look like, gathered once, judged elsewhere.

Only this package touches the operating system. Every section is gathered by one module's
``gather(ctx)`` with a timeout, never through a shell, and never changes anything it reads.
A value that cannot be read is ``None`` and its reason is recorded under ``unknown``; the whole
snapshot is plain JSON so that a machine can be recorded (``torchdoctor facts --format json``)
and replayed (``torchdoctor check --facts FILE``).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FactsFileError, UnknownFactError
from .context import GatherContext

if TYPE_CHECKING:  # the schema is imported when facts are first built: `explain` needs none of it
    from . import schema
    from .schema import (
        CgroupFacts,
        CpuFacts,
        DistFacts,
        GpuFacts,
        HostFacts,
        LimitsFacts,
        LoaderFacts,
        MemoryFacts,
        Meta,
        PathsFacts,
        Record,
        ShmFacts,
        TorchFacts,
    )

#: Version of the facts JSON and of its schema (facts/schema.py): bumped when a key is removed,
#: renamed or retyped, not when an optional key is added.
SCHEMA_VERSION = 1

#: A recorded snapshot is a few KiB to a few hundred KiB; a file past this is not one.
MAX_FACTS_BYTES = 20 * 1024 * 1024

_RECORD_HINT = "record one with `torchdoctor facts --format json > facts.json`"


class _NotJSON(ValueError):
    """NaN or Infinity in a file: Python's json reads them, JSON does not have them."""


def _no_constants(name: str) -> Any:
    raise _NotJSON(name)


class Facts:
    """A snapshot of facts: plain JSON (:attr:`data`) checked against the one schema
    (:mod:`torchdoctor.facts.schema`), read by checks as typed records: ``facts.shm.size_bytes``.

    Every section is a property (``host``, ``shm``, ``limits``, ``memory``, ``cgroup``, ``cpu``,
    ``torch``, ``gpu``, ``dist``, ``paths``, ``loader``, ``meta``); a section that was not gathered
    or could not be read is an empty, falsy record. ``Facts(data)`` accepts a partial document (code
    and tests build them); :meth:`load` requires a complete one. A key the schema does not have is
    a :class:`~torchdoctor.errors.FactsFileError` either way; a value of the wrong type is one in a
    file, and in a partial document built in code reads as unknown (null, with the reason under
    ``unknown``). Either way no check ever sees a value of the wrong type. :attr:`data` may be
    changed section by section (``facts.data["cpu"] = {...}``): a replaced section is read again.
    """

    def __init__(self, data: dict[str, Any], *, complete: bool = False, origin: str = "facts") -> None:
        from . import schema

        self.data = data
        if isinstance(self.data, dict):
            self.data.setdefault("unknown", {})
        doc = schema.parse_document(self.data, complete)
        if doc.problems and not complete and self._mend(doc.problems):
            doc = schema.parse_document(self.data, complete)
        if doc.problems:
            raise FactsFileError(origin, schema.messages(doc.problems))
        self._records: dict[str, tuple[Any, Record]] = {
            name: (self.data.get(name), rec) for name, rec in doc.records.items()
        }

    def _mend(self, problems: list[schema.Problem]) -> bool:
        """A partial document built in code: values of the wrong type read as unknown (null, the
        reason under ``unknown``), so that no check ever sees one. Keys the schema does not have are
        not mended (a typo in code is a bug). Returns False, changing nothing, when it cannot mend."""
        from . import schema

        sections = {*schema.SECTIONS, *schema.OPTIONAL_SECTIONS, "meta"}
        if not all(p.kind == "type" and p.path[0] in sections for p in problems):
            return False
        by_section: dict[str, list[schema.Problem]] = {}
        for prob in problems:
            by_section.setdefault(str(prob.path[0]), []).append(prob)
        for name, probs in by_section.items():
            self.data[name] = schema.repair(copy.deepcopy(self.data[name]), probs)
            for prob in probs:
                self.data["unknown"][schema.path_text(prob.path)] = f"not read: {prob.message}"
        return True

    # -- typed sections ---------------------------------------------------------------------------
    def _record(self, name: str) -> Any:
        """The typed record of a section, parsed again only when ``data[name]`` was replaced."""
        raw = self.data.get(name)
        cached = self._records.get(name)
        if cached is not None and cached[0] is raw:
            return cached[1]
        from . import schema

        rec, problems = schema.parse_section(name, raw)
        if problems:
            raise FactsFileError(f"facts section {name!r}", schema.messages(problems))
        self._records[name] = (raw, rec)
        return rec

    @property
    def host(self) -> HostFacts:
        return self._record("host")

    @property
    def shm(self) -> ShmFacts:
        return self._record("shm")

    @property
    def limits(self) -> LimitsFacts:
        return self._record("limits")

    @property
    def memory(self) -> MemoryFacts:
        return self._record("memory")

    @property
    def cgroup(self) -> CgroupFacts:
        return self._record("cgroup")

    @property
    def cpu(self) -> CpuFacts:
        return self._record("cpu")

    @property
    def torch(self) -> TorchFacts:
        return self._record("torch")

    @property
    def gpu(self) -> GpuFacts:
        return self._record("gpu")

    @property
    def dist(self) -> DistFacts:
        return self._record("dist")

    @property
    def paths(self) -> PathsFacts:
        return self._record("paths")

    @property
    def loader(self) -> LoaderFacts:
        return self._record("loader")

    @property
    def meta(self) -> Meta:
        return self._record("meta")

    # -- raw access by path -------------------------------------------------------------------------
    def get(self, path: str, default: Any = None) -> Any:
        """The raw JSON value at a dotted path (``"shm.size_bytes"``), ``default`` when it is null or
        absent. A path the schema does not have raises :class:`~torchdoctor.errors.UnknownFactError`:
        a typo is a bug, never "not applicable". Checks read the typed sections instead."""
        from . import schema

        if schema.resolve_path(path) is None:
            raise UnknownFactError(path, schema.suggest_paths(path))
        node: Any = self.data
        for part in path.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return default
        return default if node is None else node

    def section(self, name: str) -> dict[str, Any]:
        """A section's raw JSON ({} when null or absent)."""
        from . import schema

        if name not in schema.TOP_LEVEL:
            raise UnknownFactError(name, schema.suggest_paths(name))
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
        return self.meta.source or "live"

    # -- (de)serialisation --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return self.data

    def dumps(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=True, default=str)

    @classmethod
    def load(cls, path: str | Path, max_bytes: int = MAX_FACTS_BYTES) -> Facts:
        """Read a recorded snapshot and check it against the schema; any problem becomes one
        :class:`FactsFileError` (one line per problem)."""
        p = Path(path)
        name = str(p)
        try:
            with open(p, "rb") as fh:
                size = _size(fh)
                if size is not None and size > max_bytes:
                    raise FactsFileError(_too_large(name, size, max_bytes))
                raw = fh.read(max_bytes + 1)
        except FileNotFoundError:
            raise FactsFileError(f"facts file {name!r} does not exist; {_RECORD_HINT}") from None
        except IsADirectoryError:
            raise FactsFileError(f"facts file {name!r} is a directory; pass the JSON file itself") from None
        except OSError as exc:
            raise FactsFileError(f"cannot read facts file {name!r}: {exc.strerror or exc}") from None
        if len(raw) > max_bytes:
            raise FactsFileError(_too_large(name, None, max_bytes))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FactsFileError(f"facts file {name!r} is not UTF-8 text (byte {exc.start}); {_RECORD_HINT}") from None
        try:
            data = json.loads(text, parse_constant=_no_constants)
        except json.JSONDecodeError as exc:
            raise FactsFileError(
                f"facts file {name!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                f"{_RECORD_HINT}"
            ) from None
        except _NotJSON as exc:
            raise FactsFileError(
                f"facts file {name!r} holds {exc}, which is not a JSON value; {_RECORD_HINT}"
            ) from None
        except RecursionError:
            raise FactsFileError(
                f"facts file {name!r} nests JSON arrays or objects too deeply to read (a facts snapshot nests a "
                f"few levels); {_RECORD_HINT}"
            ) from None
        except ValueError as exc:  # int() refuses numbers of more than sys.get_int_max_str_digits() digits
            raise FactsFileError(
                f"facts file {name!r} holds a number too long to read ({str(exc).split(':')[0]}); no fact is that "
                f"large: {_RECORD_HINT}"
            ) from None
        return cls.from_dict(data, origin=name, complete=True)

    @classmethod
    def from_dict(cls, data: Any, origin: str = "<dict>", complete: bool = False) -> Facts:
        """A snapshot from a parsed JSON document. ``complete``: it must have every section and key a
        gatherer writes (a recorded file); otherwise missing ones read as unknown (code, tests)."""
        from . import schema

        if not isinstance(data, dict) or "meta" not in data:
            raise FactsFileError(
                f"{origin} is JSON but not a torchdoctor facts snapshot (no 'meta' section); {_RECORD_HINT}"
            )
        if not isinstance(data["meta"], dict):
            raise FactsFileError(f"{origin}: meta: expected an object, got {schema.shown(data['meta'])}")
        version = data["meta"].get("schema_version")
        if version != SCHEMA_VERSION:
            raise FactsFileError(
                f"{origin} has facts schema_version {version!r}; this torchdoctor reads version "
                f"{SCHEMA_VERSION}: record the snapshot again with this version"
            )
        if complete and not any(name in data for name in schema.SECTIONS):
            raise FactsFileError(
                f"{origin} has no fact sections (expected {', '.join(schema.SECTIONS)}): it describes no machine; "
                f"{_RECORD_HINT}"
            )
        data = dict(data)
        data["meta"] = dict(data["meta"], source=data["meta"].get("source") or "file")
        return cls(data, complete=complete, origin=origin)


def _size(fh: Any) -> int | None:
    import os
    import stat

    st = os.fstat(fh.fileno())
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _too_large(name: str, size: int | None, cap: int) -> str:
    what = f"is {size / 2**20:.1f} MiB" if size is not None else "is larger than that"
    return (
        f"facts file {name!r} {what}; a facts snapshot is at most {cap // 2**20} MiB (a recorded machine is "
        f"usually under 1 MiB): pass the file `torchdoctor facts --format json` wrote"
    )


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
            data[name] = _conform(ctx, name, results[name])
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


def _conform(ctx: GatherContext, name: str, section: Any) -> Any:
    """A gathered section checked against the schema. A gatherer that wrote something the schema
    does not describe is a torchdoctor bug: the value is left out (null, or the key dropped) with
    the reason under ``unknown``, so the snapshot stays loadable and the rest of it usable."""
    from . import schema

    _, problems = schema.parse_section(name, section, complete=True)
    if not problems:
        return section
    fixed = schema.repair(section, problems)
    _, again = schema.parse_section(name, fixed, complete=True)
    for prob in problems:
        ctx.unknown(
            schema.path_text(prob.path),
            f"torchdoctor bug: the {name} gatherer wrote a value outside the facts schema ({prob.message}); left out",
        )
    if again:
        ctx.unknown(name, f"torchdoctor bug: the {name} gatherer's facts do not fit the facts schema ({again[0]})")
        return None
    return fixed


__all__ = ["Facts", "GatherContext", "gather", "SCHEMA_VERSION", "MAX_FACTS_BYTES"]
