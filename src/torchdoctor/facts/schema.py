"""The one schema of the facts: every section, every key, its type; versioned with the JSON format.

The JSON a gatherer writes (``torchdoctor facts --format json``) and the typed records the checks
read (``facts.shm.size_bytes``) are two forms of the same thing, and this module is the only place
that says what it is. Each section is a frozen dataclass (:class:`Record`); a field's name is its
JSON key unless ``fact(key=...)`` says otherwise (``limits.rlimits.as`` is ``as_``, the sysctl
``fs.file-max`` is ``file_max``).

Rules, the same for every section:

* **Leaves may be null.** ``int | None``: an integer, or ``null`` when the fact could not be read
  (its reason is then under ``unknown``). A check reads ``None`` as "cannot judge".
* **A record may be null.** Then it reads as an empty record (every field ``None``, collections
  empty) that is *falsy*: ``if not facts.cgroup.pids`` means "the pids controller was not read".
  A record read from the JSON is truthy, whatever its values.
* **Collections are never null** unless annotated so (``tuple[str, ...] | None``).
* **Keys.** A key the schema does not know is an error. In a recorded file
  (:func:`parse_document` with ``complete=True``) every section must be present and every key a
  gatherer always writes must be there; keys a gatherer writes only sometimes are marked
  ``optional`` (``shm.torch_segments`` is absent when /dev/shm does not exist).
* **Numbers.** ``int`` is an integer (never ``true``/``false``) within ±2**64; ``float`` is any
  finite number.

:data:`torchdoctor.facts.SCHEMA_VERSION` is the version of this schema and of the JSON it describes:
a change that removes, renames or retypes a key bumps it; adding an optional key does not.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from . import SCHEMA_VERSION

#: Integers beyond this (in magnitude) are no fact of any machine.
INT_LIMIT = 2**64


def fact(
    default: Any = None, *, key: str | None = None, optional: bool = False, unit: str | None = None, factory: Any = None
) -> Any:
    """A schema field: its JSON ``key`` (when not the attribute name), whether a gatherer may leave
    it out (``optional``), and the ``unit`` named in error messages (inferred from ``_bytes`` …)."""
    meta = {"key": key, "optional": optional, "unit": unit}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Record:
    """Base of every schema record. Truthy when read from the JSON, falsy when null or absent."""

    _recorded: ClassVar[bool] = False

    def __bool__(self) -> bool:
        return self._recorded


# -- host ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Python(Record):
    version: str | None = None
    implementation: str | None = None
    executable: str | None = None
    default_start_method: str | None = None


@dataclass(frozen=True)
class Container(Record):
    in_container: bool | None = None
    kind: str | None = None
    signs: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostFacts(Record):
    """``host``: OS, Python, container runtime and the (redacted) environment (facts/host.py)."""

    hostname: str | None = None
    system: str | None = None
    kernel: str | None = None
    machine: str | None = None
    python: Python = Python()
    pid: int | None = None
    uid: int | None = None
    container: Container = Container()
    env: dict[str, str] = fact(factory=dict)
    """Every environment variable, secrets redacted: launcher variables are read from here."""


# -- shm ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mount(Record):
    """One line of /proc/self/mountinfo (facts/mounts.py ``Mount.to_dict``)."""

    mount_point: str | None = None
    fstype: str | None = None
    source: str | None = None
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class TorchSegments(Record):
    count: int | None = None
    bytes: int | None = fact(unit="bytes")
    owner_pids: tuple[int, ...] = ()
    owners_alive: tuple[int, ...] = ()


@dataclass(frozen=True)
class ShmFacts(Record):
    """``shm``: /dev/shm, its mount, size and torch's segments in it (facts/shm.py)."""

    path: str | None = None
    exists: bool | None = None
    mounted: bool | None = None
    mount: Mount = Mount()
    fstype: str | None = None
    mount_size_option: str | None = None
    size_bytes: int | None = None
    free_bytes: int | None = None
    used_bytes: int | None = None
    inodes_free: int | None = None
    torch_segments: TorchSegments = fact(TorchSegments(), optional=True)
    """Absent when /dev/shm does not exist or could not be measured."""


# -- limits -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RLimit(Record):
    """A soft/hard pair; ``None`` with ``*_unlimited`` true is RLIM_INFINITY."""

    soft: int | None = None
    hard: int | None = None
    soft_unlimited: bool | None = None
    hard_unlimited: bool | None = None


@dataclass(frozen=True)
class RLimits(Record):
    nofile: RLimit = RLimit()
    as_: RLimit = fact(RLimit(), key="as")
    data: RLimit = RLimit()
    memlock: RLimit = RLimit()
    nproc: RLimit = RLimit()
    stack: RLimit = RLimit()


@dataclass(frozen=True)
class SysctlVm(Record):
    max_map_count: int | None = None
    overcommit_memory: int | None = None
    overcommit_ratio: int | None = fact(unit="percent")


@dataclass(frozen=True)
class SysctlFs(Record):
    file_max: int | None = fact(key="file-max")
    nr_open: int | None = None


@dataclass(frozen=True)
class SysctlKernel(Record):
    shmmax: int | None = fact(unit="bytes")
    shmall: int | None = fact(unit="pages")


@dataclass(frozen=True)
class Sysctl(Record):
    vm: SysctlVm = SysctlVm()
    fs: SysctlFs = SysctlFs()
    kernel: SysctlKernel = SysctlKernel()


@dataclass(frozen=True)
class ProcessUsage(Record):
    open_fds: int | None = None
    map_count: int | None = None
    page_size: int | None = fact(unit="bytes")
    cap_sys_resource: bool | None = None


@dataclass(frozen=True)
class LimitsFacts(Record):
    """``limits``: rlimits, the sysctls behind them, what this process uses (facts/limits.py)."""

    rlimits: RLimits = RLimits()
    rlimits_source: str | None = None
    sysctl: Sysctl = Sysctl()
    process: ProcessUsage = ProcessUsage()


# -- memory -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryFacts(Record):
    """``memory``: /proc/meminfo (facts/memory.py)."""

    source: str | None = None
    total_bytes: int | None = None
    available_bytes: int | None = None
    free_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_free_bytes: int | None = None
    shmem_bytes: int | None = None
    commit_limit_bytes: int | None = None
    committed_bytes: int | None = None


# -- cgroup -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupMemory(Record):
    dir: str | None = None
    limited: bool | None = None
    max_bytes: int | None = None
    max_source: str | None = None
    current_bytes: int | None = None
    current_source: str | None = None
    peak_bytes: int | None = None
    high_bytes: int | None = None
    swap_max_bytes: int | None = None
    swap_accounting: bool | None = None
    oom_kill_events: int | None = None
    max_events: int | None = None
    oom_events: int | None = None
    events_source: str | None = None
    inactive_file_bytes: int | None = None
    working_set_bytes: int | None = None


@dataclass(frozen=True)
class CgroupPids(Record):
    dir: str | None = None
    limited: bool | None = None
    max: int | None = None
    max_source: str | None = None
    current: int | None = None
    current_source: str | None = None
    max_events: int | None = None
    events_source: str | None = None


@dataclass(frozen=True)
class CgroupCpu(Record):
    dir: str | None = None
    limited: bool | None = None
    quota_us: int | None = None
    period_us: int | None = None
    quota_cpus: float | None = fact(unit="CPUs")
    quota_source: str | None = None
    cpuset: str | None = None
    cpuset_count: int | None = None
    cpuset_source: str | None = None


@dataclass(frozen=True)
class CgroupFacts(Record):
    """``cgroup``: version, and the memory, pids and cpu controllers' limits (facts/cgroups.py)."""

    version: int | None = None
    hybrid: bool | None = None
    path: str | None = None
    memory: CgroupMemory = CgroupMemory()
    pids: CgroupPids = CgroupPids()
    cpu: CgroupCpu = CgroupCpu()


# -- cpu ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cv2(Record):
    installed: bool | None = None
    threads: int | None = fact(optional=True)
    """Absent when cv2 is not installed; null when its probe was skipped or failed."""
    cpus: int | None = fact(optional=True)
    version: str | None = fact(optional=True)
    source: str | None = fact(optional=True)


@dataclass(frozen=True)
class CpuFacts(Record):
    """``cpu``: cores, affinity, quota, thread variables and the pools sized from them (facts/cpu.py)."""

    logical_cores: int | None = None
    logical_source: str | None = None
    physical_cores: int | None = None
    affinity_cores: int | None = None
    affinity_list: str | None = None
    cgroup_quota_cpus: float | None = fact(unit="CPUs")
    cgroup_quota_source: str | None = None
    cgroup_cpuset_cores: int | None = None
    usable_cores: float | None = fact(unit="CPUs")
    """The least of online CPUs, affinity and cgroup quota; may be fractional."""
    usable_threads: int | None = None
    usable_limited_by: str | None = None
    machine: str | None = None
    thread_env: dict[str, str] = fact(factory=dict)
    torch_threads_estimate: int | None = None
    torch_threads_rule: str | None = None
    cv2: Cv2 = Cv2()


# -- torch --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchBackends(Record):
    gloo: bool | None = None
    nccl: bool | None = None
    mpi: bool | None = None


@dataclass(frozen=True)
class TorchFacts(Record):
    """``torch``: the installed torch, read from its files, never imported (facts/torch_info.py).

    Only ``installed`` is always there: null with ``skipped`` (``--no-torch``), false when torch is
    not installed, true with the rest."""

    installed: bool | None = None
    skipped: bool | None = fact(optional=True)
    version: str | None = fact(optional=True)
    location: str | None = fact(optional=True)
    imported_for_facts: bool | None = fact(optional=True)
    cuda: str | None = fact(optional=True)
    hip: str | None = fact(optional=True)
    git_version: str | None = fact(optional=True)
    debug: bool | None = fact(optional=True)
    libraries: tuple[str, ...] = fact((), optional=True)
    nvidia_packages: tuple[str, ...] = fact((), optional=True)
    cuda_build: bool | None = fact(optional=True)
    backends: TorchBackends = fact(TorchBackends(), optional=True)
    backends_source: str | None = fact(optional=True)
    default_sharing_strategy: str | None = fact(optional=True)


# -- gpu ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuMemory(Record):
    total_bytes: int | None = None
    used_bytes: int | None = None
    free_bytes: int | None = None


@dataclass(frozen=True)
class GpuUtilization(Record):
    gpu_percent: int | None = None
    memory_percent: int | None = None


@dataclass(frozen=True)
class MigDevice(Record):
    index: int | None = None
    uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None


@dataclass(frozen=True)
class GpuMig(Record):
    current: str | None = None
    pending: str | None = None
    devices: tuple[MigDevice, ...] = ()


@dataclass(frozen=True)
class GpuEcc(Record):
    enabled: bool | None = None
    volatile_uncorrected: int | None = None


@dataclass(frozen=True)
class GpuProcess(Record):
    pid: int | None = None
    type: str | None = None
    """``C`` (compute), ``G`` (graphics) or ``C+G``."""
    name: str | None = None
    used_memory_bytes: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class GpuDevice(Record):
    """One GPU, from NVML or ``nvidia-smi -q -x`` (the same record either way)."""

    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    minor_number: int | None = None
    memory: GpuMemory = GpuMemory()
    utilization: GpuUtilization = GpuUtilization()
    compute_mode: str | None = None
    persistence_mode: bool | None = None
    mig: GpuMig = GpuMig()
    ecc: GpuEcc = GpuEcc()
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class VisibleEntry(Record):
    text: str | None = None
    kind: str | None = None
    """``index``, ``uuid``, ``mig`` or ``invalid``."""
    physical_index: int | None = None
    valid: bool | None = None
    problem: str | None = fact(optional=True)


@dataclass(frozen=True)
class Visible(Record):
    """What CUDA will enumerate for CUDA_VISIBLE_DEVICES (facts/gpu.py ``resolve_visible``)."""

    env_set: bool | None = None
    value: str | None = None
    entries: tuple[VisibleEntry, ...] = ()
    hides_all: bool | None = None
    visible_indices: tuple[int, ...] = ()
    count: int | None = None
    invalid: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    duplicates: tuple[str, ...] = ()
    device_order: str | None = None


@dataclass(frozen=True)
class GpuFacts(Record):
    """``gpu``: NVIDIA GPUs through NVML or nvidia-smi, and CUDA_VISIBLE_DEVICES (facts/gpu.py)."""

    available: bool | None = None
    source: str | None = None
    reason: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    device_count: int | None = None
    devices: tuple[GpuDevice, ...] = ()
    uuids_anonymised: bool | None = None
    visible: Visible = Visible()


# -- dist ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launcher(Record):
    torchrun: bool | None = None
    agent_store: bool | None = None
    slurm: bool | None = None
    slurm_step: bool | None = None
    mpi: str | None = None


@dataclass(frozen=True)
class Master(Record):
    addr: str | None = None
    addresses: tuple[str, ...] | None = None
    error: str | None = None
    errno: int | None = None
    timed_out: bool | None = None
    seconds: float | None = None
    loopback: bool | None = None
    is_local: bool | None = None
    local_because: str | None = None


@dataclass(frozen=True)
class BindAttempt(Record):
    address: str | None = None
    ok: bool | None = None
    errno: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class PortHolder(Record):
    pid: int | None = None
    status: str | None = None
    address: str | None = None
    name: str | None = None
    cmdline: str | None = None
    """The holder's command line, secrets redacted, cut at 200 characters."""
    user: str | None = None
    is_self: bool | None = None
    is_ancestor: bool | None = None


@dataclass(frozen=True)
class Store(Record):
    port: int | None = None
    this_host: bool | None = None
    tested: bool | None = None
    why: str | None = None
    bind: tuple[BindAttempt, ...] = ()
    in_use: bool | None = None
    holder: PortHolder = PortHolder()
    bindable: bool | None = fact(optional=True)
    """Present when the port was test-bound."""


@dataclass(frozen=True)
class Interface(Record):
    addresses: tuple[str, ...] = ()
    up: bool | None = None


@dataclass(frozen=True)
class Interfaces(Record):
    names: dict[str, Interface] = fact(factory=dict)
    source: str | None = None


@dataclass(frozen=True)
class DistFacts(Record):
    """``dist``: launcher variables, MASTER_ADDR/MASTER_PORT, interfaces (facts/dist_env.py)."""

    active: bool | None = None
    active_because: tuple[str, ...] = ()
    requested: bool | None = None
    env: dict[str, str] = fact(factory=dict)
    ints: dict[str, int] = fact(factory=dict)
    not_int: dict[str, str] = fact(factory=dict)
    launcher: Launcher = Launcher()
    hostname: str | None = None
    master: Master = Master()
    store: Store = Store()
    interfaces: Interfaces = Interfaces()


# -- paths --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteTest(Record):
    ok: bool | None = None
    where: str | None = fact(optional=True)
    step: str | None = fact(optional=True)
    errno: str | None = fact(optional=True)
    """The errno's name (``EACCES``)."""
    errno_num: int | None = fact(optional=True)
    message: str | None = fact(optional=True)
    left_behind: str | None = fact(optional=True)


@dataclass(frozen=True)
class StatError(Record):
    step: str | None = None
    errno: str | None = None
    errno_num: int | None = None
    message: str | None = None


@dataclass(frozen=True)
class Owner(Record):
    uid: int | None = None
    gid: int | None = None
    mode: str | None = None
    """Octal, ``"0755"``."""


@dataclass(frozen=True)
class FsInfo(Record):
    checked_at: str | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    inodes_free: int | None = None
    inodes_total: int | None = None
    read_only: bool | None = None
    fsid: int | None = None


@dataclass(frozen=True)
class PathEntry(Record):
    """One ``--path`` (facts/paths.py ``examine``; a path that did not answer has fewer keys)."""

    path: str | None = None
    abspath: str | None = None
    exists: bool | None = None
    is_dir: bool | None = None
    is_symlink: bool | None = fact(optional=True)
    writable: bool | None = None
    creatable: bool | None = None
    nearest_existing: str | None = fact(optional=True)
    missing_levels: int | None = fact(optional=True)
    write_test: WriteTest = WriteTest()
    owner: Owner = fact(Owner(), optional=True)
    stat_error: StatError = fact(StatError(), optional=True)
    fs: FsInfo = FsInfo()
    timed_out: bool | None = None
    timeout_seconds: float | None = fact(optional=True)
    error: str | None = fact(optional=True)
    mount: Mount = Mount()
    fstype: str | None = None
    fs_kind: str | None = None
    """``local``, ``network``, ``fuse``, ``overlay`` or ``memory``."""
    mount_read_only: bool | None = None


@dataclass(frozen=True)
class PathsFacts(Record):
    """``paths``: each ``--path`` (facts/paths.py)."""

    euid: int | None = None
    egid: int | None = None
    probe_prefix: str | None = None
    entries: tuple[PathEntry, ...] = ()


# -- loader (added by `torchdoctor loader`, not by `gather`) --------------------------------------


@dataclass(frozen=True)
class LoaderFacts(Record):
    """``loader``: what the loader probe measured (probes/judge.py ``loader_section``, docs/loader.md).

    Only ``torchdoctor loader`` adds it; its parts are the probe's own records, typed here as
    objects (their keys are in docs/loader.md)."""

    target: str | None = fact(optional=True)
    outcome: dict[str, Any] | None = fact(optional=True)
    loader: dict[str, Any] | None = fact(optional=True)
    import_seconds: float | None = fact(optional=True)
    static: dict[str, Any] | None = fact(optional=True)
    batch: dict[str, Any] | None = fact(optional=True)
    live: dict[str, Any] | None = fact(optional=True)
    tune: dict[str, Any] | None = fact(optional=True)


# -- meta ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetaOptions(Record):
    paths: tuple[str, ...] = ()
    dist: bool | None = None
    torch: bool | None = None
    root: str | None = None


@dataclass(frozen=True)
class Meta(Record):
    """``meta``: how the snapshot was taken. Only ``schema_version`` is required."""

    schema_version: int | None = None
    torchdoctor_version: str | None = fact(optional=True)
    collected_at: str | None = fact(optional=True)
    gather_seconds: float | None = fact(optional=True)
    source: str | None = fact(optional=True)
    """``live``, or ``file`` for a snapshot read back without one."""
    options: MetaOptions = fact(MetaOptions(), optional=True)
    provenance: str | None = fact(optional=True)
    """Free text: how a recorded snapshot was made (test fixtures)."""


#: Section name → its record, in the order ``gather`` writes them. All are required in a file.
SECTIONS: dict[str, type[Record]] = {
    "host": HostFacts,
    "shm": ShmFacts,
    "limits": LimitsFacts,
    "memory": MemoryFacts,
    "cgroup": CgroupFacts,
    "cpu": CpuFacts,
    "torch": TorchFacts,
    "gpu": GpuFacts,
    "dist": DistFacts,
    "paths": PathsFacts,
}
#: Sections a snapshot may have besides: ``loader`` (only from ``torchdoctor loader``).
OPTIONAL_SECTIONS: dict[str, type[Record]] = {"loader": LoaderFacts}
#: Every top-level key: the sections, ``meta`` and ``unknown`` (fact path → why it is null).
TOP_LEVEL: tuple[str, ...] = (*SECTIONS, *OPTIONAL_SECTIONS, "meta", "unknown")


# ================================================================================================
# the engine: field specs, parsing with problems, repair, paths
# ================================================================================================


@dataclass(frozen=True)
class Field:
    name: str
    """Python attribute."""
    key: str
    """JSON key."""
    tp: Any
    optional: bool
    unit: str | None


_UNITS = (
    ("bytes", "bytes"),
    ("_seconds", "seconds"),
    ("seconds", "seconds"),
    ("_us", "microseconds"),
    ("_percent", "percent"),
)


_FIELDS: dict[type, tuple[Field, ...]] = {}
_BY_KEY: dict[type, dict[str, Field]] = {}


def fields_of(cls: type[Record]) -> tuple[Field, ...]:
    """A record's fields: attribute, JSON key, type, whether optional, unit (computed once)."""
    found = _FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            key = f.metadata.get("key") or f.name
            unit = f.metadata.get("unit") or next((u for suffix, u in _UNITS if key.endswith(suffix)), None)
            out.append(Field(f.name, key, hints[f.name], bool(f.metadata.get("optional")), unit))
        found = _FIELDS[cls] = tuple(out)
    return found


def _by_key(cls: type[Record]) -> dict[str, Field]:
    found = _BY_KEY.get(cls)
    if found is None:
        found = _BY_KEY[cls] = {f.key: f for f in fields_of(cls)}
    return found


def _optional_inner(tp: Any) -> Any | None:
    """``X`` for ``X | None``, else None."""
    if _is_union(tp):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


def _is_union(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin is Union or origin is types.UnionType


def _is_record(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Record)


def describe(tp: Any, unit: str | None = None) -> str:
    """What a value of type ``tp`` is, for a person: ``an integer (bytes)``."""
    inner = _optional_inner(tp)
    if inner is not None:
        return describe(inner, unit)
    suffix = f" ({unit})" if unit else ""
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer" + suffix
    if tp is float:
        return "a number" + suffix
    if tp is str:
        return "a string"
    if tp is Any:
        return "any value"
    if _is_record(tp):
        return "an object"
    origin = typing.get_origin(tp)
    if origin is tuple:
        return f"a list of {_plural(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"an object whose values are {_plural(typing.get_args(tp)[1])}"
    return str(tp)


def _plural(tp: Any) -> str:
    return {bool: "true/false", int: "integers", float: "numbers", str: "strings"}.get(tp, "objects")


def shown(value: Any) -> str:
    """A JSON value as it appears in the file, cut short: ``"big"``, ``12``, ``an object``."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_LIMIT:
        return f"a {len(str(abs(value)))}-digit integer"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "…"


PathT = tuple[str | int, ...]


def path_text(path: PathT) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


@dataclass(frozen=True)
class Problem:
    """One way a facts document differs from the schema, and how ``repair`` mends it."""

    path: PathT
    message: str
    action: str
    """``delete`` the value at ``path``, or ``set`` it to ``replacement``."""
    replacement: Any = None
    kind: str = "type"
    """``type`` (a value of the wrong type), ``unknown`` (a key the schema does not have) or ``missing``."""

    def __str__(self) -> str:
        return f"{path_text(self.path)}: {self.message}"


class _Parse:
    def __init__(self, complete: bool) -> None:
        self.complete = complete
        self.problems: list[Problem] = []

    # -- values -----------------------------------------------------------------------------------
    def value(self, tp: Any, value: Any, path: PathT, unit: str | None, in_list: bool = False) -> Any:
        inner = _optional_inner(tp)
        if inner is not None:
            return None if value is None else self.value(inner, value, path, unit, in_list)
        if tp is Any:
            return value
        if _is_record(tp):
            if value is None and not in_list:
                return tp()
            if not isinstance(value, dict):
                self._wrong(tp, value, path, unit, in_list, None)
                return tp()
            return self.record(tp, value, path)
        if tp in (bool, int, float, str):
            if value is None and not in_list:
                return None  # every leaf of a record may be null: "could not be read"
            ok = (
                isinstance(value, bool)
                if tp is bool
                else isinstance(value, int) and not isinstance(value, bool) and abs(value) < INT_LIMIT
                if tp is int
                else isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and abs(value) < INT_LIMIT
                if tp is float
                else isinstance(value, str)
            )
            if not ok:
                self._wrong(tp, value, path, unit, in_list, None)
                return None
            return value
        origin = typing.get_origin(tp)
        if origin is tuple:
            if not isinstance(value, list):
                self._wrong(tp, value, path, unit, in_list, [])
                return ()
            (elem,) = typing.get_args(tp)[:1]
            return tuple(self.value(elem, v, (*path, i), unit, in_list=True) for i, v in enumerate(value))
        if origin is dict:
            if not isinstance(value, dict):
                self._wrong(tp, value, path, unit, in_list, {})
                return {}
            elem = typing.get_args(tp)[1]
            return {k: self.value(elem, v, (*path, k), unit, in_list=True) for k, v in value.items()}
        raise TypeError(f"unsupported schema type {tp!r} at {path_text(path)}")  # pragma: no cover

    def _wrong(self, tp: Any, value: Any, path: PathT, unit: str | None, in_list: bool, empty: Any) -> None:
        nullable = not in_list and (empty is None or _optional_inner(tp) is not None)
        expected = _or_null(describe(tp, unit)) if nullable and empty is None else describe(tp, unit)
        action = "delete" if in_list else "set"
        self.problems.append(
            Problem(
                path, f"expected {expected}, got {shown(value)}", action, None if action == "delete" else empty, "type"
            )
        )

    # -- records ----------------------------------------------------------------------------------
    def record(self, cls: type[Record], raw: dict[str, Any], path: PathT) -> Record:
        known = _by_key(cls)
        for key in raw:
            if key not in known:
                close = [k for k in known if str(key) and (k.startswith(str(key)) or str(key).startswith(k))][
                    :1
                ] or difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
                hint = f" (did you mean {path_text((*path, close[0]))}?)" if close else ""
                self.problems.append(
                    Problem((*path, key), f"not a fact this torchdoctor knows{hint}", "delete", kind="unknown")
                )
        kwargs: dict[str, Any] = {}
        for f in fields_of(cls):
            if f.key in raw:
                kwargs[f.name] = self.value(f.tp, raw[f.key], (*path, f.key), f.unit)
            elif self.complete and not f.optional:
                empty = empty_json(f.tp)
                expected = _or_null(describe(f.tp, f.unit)) if empty is None else describe(f.tp, f.unit)
                self.problems.append(Problem((*path, f.key), f"missing (expected {expected})", "set", empty, "missing"))
        inst = cls(**kwargs)
        object.__setattr__(inst, "_recorded", True)
        return inst


def _or_null(what: str) -> str:
    return "true, false or null" if what == "true or false" else f"{what} or null"


def messages(problems: list[Problem]) -> list[str]:
    """Problems as lines for a person: wrong values and unknown keys first, then what is missing,
    the keys missing from one object on one line."""
    missing: dict[PathT, list[Problem]] = {}
    lines: list[str] = []
    for prob in problems:
        if prob.kind == "missing" and len(prob.path) > 1:
            missing.setdefault(prob.path[:-1], []).append(prob)
        else:
            lines.append(str(prob))
    for parent, probs in missing.items():
        if len(probs) == 1:
            lines.append(str(probs[0]))
        else:
            keys = ", ".join(str(p.path[-1]) for p in probs)
            lines.append(f"{path_text(parent)}: missing {len(probs)} keys a gatherer always writes: {keys}")
    return lines


def empty_json(tp: Any) -> Any:
    """The JSON a missing value of type ``tp`` is mended to: null, [] or {}."""
    if _optional_inner(tp) is not None or _is_record(tp) or tp in (bool, int, float, str, Any):
        return None
    return [] if typing.get_origin(tp) is tuple else {}


def parse_section(name: str, raw: Any, complete: bool = False) -> tuple[Record, list[Problem]]:
    """One section's record from its JSON (``None`` → an empty, falsy record), and its problems."""
    cls = SECTIONS.get(name) or OPTIONAL_SECTIONS.get(name) or (Meta if name == "meta" else None)
    if cls is None:
        raise KeyError(name)
    p = _Parse(complete)
    rec = p.value(cls, raw, (name,), None)
    return rec, p.problems


@dataclass
class Document:
    """A whole facts document, parsed: the records by section name, ``unknown``, and the problems."""

    records: dict[str, Record]
    unknown: dict[str, str]
    problems: list[Problem]


def parse_document(data: dict[str, Any], complete: bool) -> Document:
    """Check a facts document against the schema. ``complete``: a recorded file, where every section
    must be there and every key a gatherer always writes; otherwise (a dict built in code or a
    test) sections and keys may be missing, but nothing may be unknown or of the wrong type."""
    problems: list[Problem] = []
    records: dict[str, Record] = {}
    for key in data:
        if key not in TOP_LEVEL:
            close = difflib.get_close_matches(str(key), list(TOP_LEVEL), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else f" (sections: {', '.join(SECTIONS)})"
            problems.append(Problem((key,), f"not a facts section{hint}", "delete", kind="unknown"))
    unknown_raw = data.get("unknown", {})
    unknown: dict[str, str] = {}
    if not isinstance(unknown_raw, dict):
        problems.append(
            Problem(
                ("unknown",), f"expected an object mapping fact paths to reasons, got {shown(unknown_raw)}", "set", {}
            )
        )
    else:
        for k, v in unknown_raw.items():
            if isinstance(v, str):
                unknown[k] = v
            else:
                problems.append(
                    Problem(("unknown", k), f"expected a string (why the fact is unknown), got {shown(v)}", "delete")
                )
    for name in (*SECTIONS, *OPTIONAL_SECTIONS, "meta"):
        if name not in data:
            if complete and name in SECTIONS:
                problems.append(
                    Problem(
                        (name,),
                        f"missing section (expected an object, or null with the reason under unknown.{name})",
                        "set",
                        None,
                        "missing",
                    )
                )
            continue
        raw = data[name]
        if complete and raw is None and name in SECTIONS and name not in unknown:
            problems.append(Problem((name,), f"is null without a reason under unknown.{name}", "set", None, "missing"))
        rec, found = parse_section(name, raw, complete)
        records[name] = rec
        problems += found
    return Document(records, unknown, problems)


def repair(section: Any, problems: list[Problem]) -> Any:
    """Mend a section's JSON in place so that it fits the schema (live gathering: a gatherer that
    drifted from the schema must not break the snapshot); returns the section (None if it was
    itself unusable). Paths in ``problems`` start with the section's name."""
    for prob in sorted(
        problems, key=lambda p: [str(x).zfill(12) if isinstance(x, int) else x for x in p.path], reverse=True
    ):
        if len(prob.path) == 1:
            return prob.replacement if prob.action == "set" else None
        node = section
        try:
            for part in prob.path[1:-1]:
                node = node[part]
            last = prob.path[-1]
            if prob.action == "delete":
                del node[last]
            else:
                node[last] = prob.replacement
        except (KeyError, IndexError, TypeError):
            continue
    return section


# -- dotted paths ---------------------------------------------------------------------------------


def resolve_path(path: str) -> Any | None:
    """The schema type a dotted fact path (``"shm.size_bytes"``) names, or None when it names none.

    Keys below a ``dict`` (``host.env.LOCAL_WORLD_SIZE``) and below an ``Any`` are accepted."""
    parts = path.split(".")
    head, rest = parts[0], parts[1:]
    if head == "unknown":
        return dict[str, str] if not rest else str
    tp: Any = SECTIONS.get(head) or OPTIONAL_SECTIONS.get(head) or (Meta if head == "meta" else None)
    if tp is None:
        return None
    for part in rest:
        inner = _optional_inner(tp)
        tp = inner if inner is not None else tp
        if tp is Any:
            return Any
        if _is_record(tp):
            f = _by_key(tp).get(part)
            if f is None:
                return None
            tp = f.tp
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    return tp


def suggest_paths(path: str, n: int = 3) -> list[str]:
    return difflib.get_close_matches(path, list(all_paths()), n=n, cutoff=0.6)


def all_paths(include_optional_sections: bool = True) -> Iterator[str]:
    """Every dotted path the schema defines; list elements are ``[]`` (``gpu.devices[].index``)."""

    def walk(tp: Any, prefix: str) -> Iterator[str]:
        inner = _optional_inner(tp)
        tp = inner if inner is not None else tp
        if _is_record(tp):
            for f in fields_of(tp):
                p = f"{prefix}.{f.key}"
                yield p
                yield from walk(f.tp, p)
        elif typing.get_origin(tp) is tuple:
            yield from walk(typing.get_args(tp)[0], prefix + "[]")
        elif typing.get_origin(tp) is dict and _is_record(typing.get_args(tp)[1]):
            yield from walk(typing.get_args(tp)[1], prefix + ".*")

    sections = {**SECTIONS, **(OPTIONAL_SECTIONS if include_optional_sections else {}), "meta": Meta}
    for name, cls in sections.items():
        yield name
        yield from walk(cls, name)


def json_key(cls: type[Record], attribute: str) -> str:
    """The JSON key of a record's attribute (``as_`` → ``as``)."""
    for f in fields_of(cls):
        if f.name == attribute:
            return f.key
    raise AttributeError(f"{cls.__name__} has no fact {attribute!r}")


__all__ = [
    "SCHEMA_VERSION",
    "SECTIONS",
    "OPTIONAL_SECTIONS",
    "TOP_LEVEL",
    "Record",
    "Problem",
    "Document",
    "Field",
    "fields_of",
    "parse_section",
    "parse_document",
    "repair",
    "resolve_path",
    "all_paths",
    "suggest_paths",
    "json_key",
    "describe",
    "path_text",
    "fact",
    "HostFacts",
    "Python",
    "Container",
    "ShmFacts",
    "Mount",
    "TorchSegments",
    "LimitsFacts",
    "RLimits",
    "RLimit",
    "Sysctl",
    "SysctlVm",
    "SysctlFs",
    "SysctlKernel",
    "ProcessUsage",
    "MemoryFacts",
    "CgroupFacts",
    "CgroupMemory",
    "CgroupPids",
    "CgroupCpu",
    "CpuFacts",
    "Cv2",
    "TorchFacts",
    "TorchBackends",
    "GpuFacts",
    "GpuDevice",
    "GpuMemory",
    "GpuUtilization",
    "GpuMig",
    "MigDevice",
    "GpuEcc",
    "GpuProcess",
    "Visible",
    "VisibleEntry",
    "DistFacts",
    "Launcher",
    "Master",
    "Store",
    "BindAttempt",
    "PortHolder",
    "Interfaces",
    "Interface",
    "PathsFacts",
    "PathEntry",
    "WriteTest",
    "StatError",
    "Owner",
    "FsInfo",
    "LoaderFacts",
    "Meta",
    "MetaOptions",
]
