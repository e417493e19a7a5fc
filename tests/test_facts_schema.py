"""One schema for the facts (facts/schema.py): what checks read is what gatherers write.

* every fact a check reads (recorded by running every preflight check, every "checked and fine"
  subject and the machine summary with attribute access spied on) is written by a gatherer, on
  this machine or in a recorded snapshot; and every schema key is written by some gatherer run;
* the live gather fits the schema completely (no key missing, unknown or mistyped);
* no check reads a fact by a dotted string any more, and ``Facts.get`` refuses a path that is not
  in the schema instead of answering None;
* a bad ``--facts`` file is one clear line per problem and exit 2 through the real CLI;
* TD102, TD204, TD250 and the GPU checks count the same training processes for a Slurm job.
"""

from __future__ import annotations

import copy
import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.catalogue._processes import LocalProcesses, local_processes, per_node
from torchdoctor.checks import SUBJECTS, audit, machine, preflight_codes, run_checks
from torchdoctor.errors import FactsFileError, UnknownFactError
from torchdoctor.facts import MAX_FACTS_BYTES, SCHEMA_VERSION, Facts, GatherContext, _conform, dist_env, gather, schema
from torchdoctor.facts import cpu as cpu_facts
from torchdoctor.facts import paths as paths_facts
from torchdoctor.facts.context import RunResult
from torchdoctor.facts.gpu import build_section
from torchdoctor.facts.nvsmi import parse_xml
from torchdoctor.facts.schema import Record
from torchdoctor.options import CheckOptions
from torchdoctor.registry import lookup

from .conftest import FIXTURES, REPO, run_cli

RECORDED = sorted((FIXTURES / "facts").glob("*.json"))
SLURM = FIXTURES / "facts" / "slurm-4gpu-node.json"
MiB = 1024 * 1024


# -- spying on what checks read ------------------------------------------------------------------


class _Spy:
    """Stands in for a record and writes down the fact path of every attribute read through it."""

    def __init__(self, target: Record, path: str, sink: set[str]) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_sink", sink)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(spy, Interface) stays true
        return type(object.__getattribute__(self, "_target"))

    def __bool__(self) -> bool:
        return bool(object.__getattribute__(self, "_target"))

    def __getattr__(self, name: str) -> Any:
        target = object.__getattribute__(self, "_target")
        value = getattr(target, name)
        if name not in {f.name for f in schema.fields_of(type(target))}:
            return value  # a method or helper, not a fact
        path = f"{object.__getattribute__(self, '_path')}.{schema.json_key(type(target), name)}"
        sink = object.__getattribute__(self, "_sink")
        sink.add(path)
        return _wrap(value, path, sink)


def _wrap(value: Any, path: str, sink: set[str]) -> Any:
    if isinstance(value, Record):
        return _Spy(value, path, sink)
    if isinstance(value, tuple) and any(isinstance(v, Record) for v in value):
        return tuple(_wrap(v, path + "[]", sink) for v in value)
    if isinstance(value, dict) and any(isinstance(v, Record) for v in value.values()):
        return {k: _wrap(v, path + ".*", sink) for k, v in value.items()}
    return value


class SpiedFacts(Facts):
    def __init__(self, data: dict[str, Any], sink: set[str]) -> None:
        super().__init__(data)
        self.sink = sink

    def _record(self, name: str) -> Any:
        self.sink.add(name)
        return _Spy(super()._record(name), name, self.sink)


def reads_of(data: dict[str, Any], options: list[CheckOptions]) -> set[str]:
    """Every fact path the checks, the passed subjects and the machine summary read from ``data``."""
    sink: set[str] = set()
    facts = SpiedFacts(copy.deepcopy(data), sink)
    for opts in options:
        for code in preflight_codes():
            assert code.check is not None
            for _ in code.check(facts, opts):
                pass  # a check that raises here fails the test: it must not crash on real facts
        for subject in SUBJECTS:
            subject.describe(facts, opts)
        audit(facts, opts)
    machine(facts)
    return sink


def produced_paths(doc: Any, tp: Any, prefix: str, out: set[str]) -> set[str]:
    """The schema paths a JSON document has a key for (a null value counts: the key was written)."""
    inner = schema._optional_inner(tp)
    tp = inner if inner is not None else tp
    if isinstance(tp, type) and issubclass(tp, Record):
        if isinstance(doc, dict):
            for f in schema.fields_of(tp):
                if f.key in doc:
                    out.add(f"{prefix}.{f.key}")
                    produced_paths(doc[f.key], f.tp, f"{prefix}.{f.key}", out)
    elif getattr(tp, "__origin__", None) is tuple and isinstance(doc, list):
        for item in doc:
            produced_paths(item, tp.__args__[0], prefix + "[]", out)
    elif getattr(tp, "__origin__", None) is dict and isinstance(doc, dict):
        for item in doc.values():
            produced_paths(item, tp.__args__[1], prefix + ".*", out)
    return out


def produced_by(data: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for name, cls in {**schema.SECTIONS, **schema.OPTIONAL_SECTIONS, "meta": schema.Meta}.items():
        if name in data:
            out.add(name)
            produced_paths(data[name], cls, name, out)
    return out


# -- samples of what gatherers write ---------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """This machine, with a writable, a missing, an impossible and an unstat-able (a symlink loop)
    --path, and --dist."""
    tmp = tmp_path_factory.mktemp("paths")
    (tmp / "loop1").symlink_to(tmp / "loop2")
    (tmp / "loop2").symlink_to(tmp / "loop1")
    ctx = GatherContext(
        paths=(str(tmp), str(tmp / "a" / "b"), "/etc/passwd/ckpt", "/etc/passwd", str(tmp / "loop1")), dist=True
    )
    return gather(ctx).to_json()


def _held_port_dist() -> dict[str, Any]:
    """The dist gatherer on rank 0 whose MASTER_PORT this process already listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2"}
        return dist_env.gather(GatherContext(env=env, torch=False))


def _unresolvable_dist() -> dict[str, Any]:
    env = {"MASTER_ADDR": "torchdoctor-test.invalid", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2"}
    return dist_env.gather(GatherContext(env=env, torch=False))


def _cv2(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """cv2_threads as it runs when cv2 is installed (its child interpreter faked: cv2 is not here)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        cpu_facts.importlib.util, "find_spec", lambda name, *a: object() if name == "cv2" else real(name, *a)
    )

    class Ctx(GatherContext):
        def run(self, argv: list[str], timeout: float | None = None) -> RunResult:
            return RunResult(tuple(argv), 0, "8\n8\n4.10.0\n", "")

    out = cpu_facts.cv2_threads(Ctx())
    monkeypatch.undo()
    return out


def _gpu_sections() -> list[dict[str, Any]]:
    """The gpu section built from every recorded nvidia-smi report, with CUDA_VISIBLE_DEVICES variants."""
    out = []
    for xml in sorted((FIXTURES / "gpu").glob("*.xml")):
        report = parse_xml(xml.read_text())
        for env in ({}, {"CUDA_VISIBLE_DEVICES": "0,7"}, {"CUDA_VISIBLE_DEVICES": "MIG-GPU-x/1/0"}):
            out.append(build_section(copy.deepcopy(report), "nvidia-smi", None, env))
    return out


@pytest.fixture(scope="module")
def samples(live: dict[str, Any]) -> list[dict[str, Any]]:
    """Documents written by gatherers: this machine, the recorded snapshots, and the gatherers run
    under conditions this machine does not have on its own."""
    docs = [live] + [json.loads(p.read_text()) for p in RECORDED]
    docs += [{"dist": _held_port_dist()}, {"dist": _unresolvable_dist()}]
    docs += [{"gpu": g} for g in _gpu_sections()]
    docs.append(
        {
            "paths": {
                "entries": [
                    paths_facts._timed_out("/mnt/hung", 6.0),
                    {**paths_facts._timed_out("/odd", 0), "timed_out": False, "error": "OSError: x"},
                ]
            }
        }
    )
    docs.append({"torch": gather(GatherContext(torch=False), sections=["torch"]).to_json()["torch"]})
    return docs


def test_every_fact_a_check_reads_is_written_by_a_gatherer(
    samples: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    produced: set[str] = set()
    for doc in samples + [{"cpu": {"cv2": _cv2(monkeypatch)}}]:
        produced |= produced_by(doc)
    options = [
        CheckOptions(),
        CheckOptions(
            num_workers=64,
            batch_bytes=8 * 1024 * MiB,
            expect_bytes=10**15,
            nproc_per_node=8,
            dist=True,
            start_method="spawn",
        ),
    ]
    read: set[str] = set()
    for doc in samples[: 1 + len(RECORDED)]:  # the live machine and every recorded snapshot
        read |= reads_of(doc, options)
    read = {p for p in read if not p.startswith("loader")}  # written by `torchdoctor loader`, not by gather
    assert len(read) > 150  # the spy sees the checks' reads
    assert read <= set(schema.all_paths())
    missing = sorted(read - produced)
    assert missing == [], f"checks read facts no gatherer wrote in any sample: {missing}"


#: Schema keys no sample above has, and why none can.
NEVER_SAMPLED = {
    "paths.entries[].write_test.left_behind": "written only when the probe file cannot be removed again",
    "gpu.visible.entries[].problem": "written only for a UUID prefix that matches several GPUs",
}


def test_every_schema_key_is_written_by_some_gatherer(
    samples: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    produced: set[str] = set()
    for doc in samples + [{"cpu": {"cv2": _cv2(monkeypatch)}}]:
        produced |= produced_by(doc)
    expected = {p for p in schema.all_paths(include_optional_sections=False) if not p.startswith("meta.")}
    assert sorted(expected - produced - set(NEVER_SAMPLED)) == []


def test_live_gather_fits_the_schema_completely(live: dict[str, Any]) -> None:
    doc = schema.parse_document(live, complete=True)
    assert [str(p) for p in doc.problems] == []
    assert not [k for k, why in live["unknown"].items() if "torchdoctor bug" in why]
    Facts.from_dict(json.loads(json.dumps(live)), complete=True)  # what `torchdoctor facts` prints loads back


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_recorded_snapshots_fit_the_schema_completely(path: Path) -> None:
    facts = Facts.load(path)
    assert facts.meta.schema_version == SCHEMA_VERSION
    assert all(bool(getattr(facts, name)) for name in schema.SECTIONS)


def test_a_gatherer_that_drifts_from_the_schema_is_contained() -> None:
    ctx = GatherContext(env={})
    section = {
        "path": "/dev/shm",
        "exists": True,
        "mounted": True,
        "mount": None,
        "fstype": "tmpfs",
        "mount_size_option": None,
        "size_bytes": "64m",
        "free_bytes": 1,
        "used_bytes": 0,
        "inodes_free": 5,
        "size_mb": 64,
    }
    fixed = _conform(ctx, "shm", section)
    assert fixed["size_bytes"] is None and "size_mb" not in fixed and fixed["free_bytes"] == 1
    assert "torchdoctor bug" in ctx.unknowns["shm.size_bytes"] and "shm.size_mb" in ctx.unknowns


# -- no dotted strings in checks; Facts.get refuses unknown paths ----------------------------------

CHECK_SOURCES = [*sorted((REPO / "src" / "torchdoctor" / "catalogue").glob("*.py")), REPO / "src/torchdoctor/checks.py"]


def test_checks_read_typed_facts_not_dotted_strings() -> None:
    pattern = re.compile(r"facts\.(get|section)\(")
    offenders = [
        f"{p.name}:{n}"
        for p in CHECK_SOURCES
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_no_code_reads_a_fact_by_dotted_path() -> None:
    """Every reader uses the typed attributes; ``Facts.get`` is left for tools and tests."""
    used = set()
    for p in (REPO / "src" / "torchdoctor").rglob("*.py"):
        used |= {f"{p.name}: {m}" for m in re.findall(r"facts\.get\(\s*[\"']([^\"']+)[\"']", p.read_text())}
    assert used == set()


def test_get_refuses_a_path_that_is_not_in_the_schema() -> None:
    facts = Facts.load(SLURM)
    assert facts.get("shm.size_bytes") == 25276502016
    assert facts.get("host.env.SLURM_NTASKS") == "4" and facts.get("host.env.NOT_SET_ANYWHERE") is None
    assert facts.get("limits.sysctl.fs.file-max") == 2466170 and facts.get("limits.rlimits.as.soft") is None
    with pytest.raises(UnknownFactError, match="did you mean 'shm.size_bytes'|shm.size_bytes"):
        facts.get("shm.size")
    with pytest.raises(UnknownFactError):
        facts.get("cgroup.memory.limit_bytes")
    with pytest.raises(UnknownFactError):
        facts.section("gpus")


def test_typed_sections_are_falsy_when_absent_and_odd_values_read_as_unknown() -> None:
    facts = Facts.from_dict({"meta": {"schema_version": 1}, "shm": {"exists": True, "size_bytes": "big"}})
    assert facts.shm and not facts.gpu and not facts.cgroup.pids
    assert facts.shm.size_bytes is None and "expected an integer" in facts.why_unknown("shm.size_bytes")
    assert facts.gpu.devices == () and facts.host.env == {}
    with pytest.raises(FactsFileError, match="shm.size_byte: not a fact"):
        Facts.from_dict({"meta": {"schema_version": 1}, "shm": {"size_byte": 1}})


# -- bad --facts files through the CLI ------------------------------------------------------------


def _recorded(change: Any = None) -> dict[str, Any]:
    data = json.loads(SLURM.read_text())
    if change:
        change(data)
    return data


def _check_file(tmp_path: Path, content: str | bytes) -> list[str]:
    path = tmp_path / "facts.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    proc = run_cli("check", "--facts", str(path))
    assert proc.returncode == 2, proc.stdout
    assert "Traceback" not in proc.stderr and "could not be evaluated" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert all(line.startswith("torchdoctor: error: ") for line in lines), proc.stderr
    return lines


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda d: d["shm"].update(size_bytes="big"), 'shm.size_bytes: expected an integer (bytes) or null, got "big"'),
        (lambda d: d["cpu"].update(usable_cores=True), "cpu.usable_cores: expected a number (CPUs) or null, got true"),
        (
            lambda d: d["gpu"]["devices"][2]["memory"].update(total_bytes=[1]),
            "gpu.devices[2].memory.total_bytes: expected an integer (bytes) or null, got a list",
        ),
        (
            lambda d: d["shm"].update(size=1),
            "shm.size: not a fact this torchdoctor knows (did you mean shm.size_bytes?)",
        ),
        (
            lambda d: d.pop("gpu"),
            "gpu: missing section (expected an object, or null with the reason under unknown.gpu)",
        ),
        (lambda d: d["memory"].pop("total_bytes"), "memory.total_bytes: missing (expected an integer (bytes) or null)"),
        (lambda d: d.update(shm=None), "shm: is null without a reason under unknown.shm"),
        (lambda d: d["dist"].update(ints={"RANK": "0"}), 'dist.ints.RANK: expected an integer, got "0"'),
        (
            lambda d: d["shm"].update(size_bytes=10**30),
            "shm.size_bytes: expected an integer (bytes) or null, got a 31-digit integer",
        ),
    ],
)
def test_a_wrong_fact_is_one_clear_line(tmp_path: Path, change: Any, expected: str) -> None:
    lines = _check_file(tmp_path, json.dumps(_recorded(change)))
    assert len(lines) == 1 and lines[0].endswith(expected), lines


def test_several_problems_one_line_each_at_most_ten(tmp_path: Path) -> None:
    def many(d: dict[str, Any]) -> None:
        for i, key in enumerate(
            [
                "total_bytes",
                "available_bytes",
                "free_bytes",
                "swap_total_bytes",
                "swap_free_bytes",
                "shmem_bytes",
                "commit_limit_bytes",
                "committed_bytes",
            ]
        ):
            d["memory"][key] = f"x{i}"
        d["shm"].update(size_bytes="big", free_bytes="small", used_bytes={}, inodes_free=-0.5)

    lines = _check_file(tmp_path, json.dumps(_recorded(many)))
    assert len(lines) == 11 and lines[-1].endswith("2 more problem(s) not shown"), lines
    assert lines[0].endswith('shm.size_bytes: expected an integer (bytes) or null, got "big"')


def test_a_file_with_no_sections_is_an_error(tmp_path: Path) -> None:
    lines = _check_file(tmp_path, '{"meta": {"schema_version": 1}}')
    assert len(lines) == 1 and "has no fact sections" in lines[0]
    lines = _check_file(tmp_path, '{"meta": {"schema_version": 1}, "unknown": {}}')
    assert "has no fact sections" in lines[0]


def test_a_huge_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "facts.json"
    with open(path, "wb") as fh:
        fh.truncate(200 * MiB)  # sparse: costs no disk
    proc = run_cli("check", "--facts", str(path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert f"is 200.0 MiB; a facts snapshot is at most {MAX_FACTS_BYTES // MiB} MiB" in proc.stderr


@pytest.mark.parametrize(
    "content, expected",
    [
        ("[" * 100_000 + "]" * 100_000, "nests JSON arrays or objects too deeply to read"),
        (
            '{"meta": {"schema_version": 1}, "shm": {"size_bytes": ' + "9" * 5000 + "}}",
            "holds a number too long to read",
        ),
        ('{"meta": {"schema_version": 1}, "shm": {"size_bytes": NaN}}', "holds NaN, which is not a JSON value"),
        (b'{"meta": {"schema_version": 1}, "host": "\xff"}', "is not UTF-8 text"),
    ],
)
def test_unreadable_json_is_one_clear_line(tmp_path: Path, content: str | bytes, expected: str) -> None:
    lines = _check_file(tmp_path, content)
    assert len(lines) == 1 and expected in lines[0], lines


def test_a_good_file_still_checks(tmp_path: Path) -> None:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(_recorded()))
    proc = run_cli("check", "--facts", str(path), "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    assert not [f for f in json.loads(proc.stdout)["findings"] if f.get("check_error")]


# -- one count of training processes -----------------------------------------------------------------


def test_slurm_snapshot_one_process_count_for_shm_memory_cpu_and_gpu() -> None:
    facts = Facts.load(SLURM)  # srun --ntasks-per-node=4: SLURM_NTASKS_PER_NODE=4, no LOCAL_WORLD_SIZE
    assert local_processes(facts, CheckOptions()) == LocalProcesses(4, "SLURM_NTASKS_PER_NODE", True)
    # make /dev/shm small and show each task two GPUs, so that TD102 and TD310 both have something to say
    facts.data["shm"] = {**facts.data["shm"], "free_bytes": 256 * MiB, "size_bytes": 256 * MiB}
    facts.data["gpu"] = copy.deepcopy(facts.data["gpu"])
    facts.data["gpu"]["visible"].update(
        value="0,1", visible_indices=[0, 1], count=2, entries=facts.data["gpu"]["visible"]["entries"][:2]
    )
    codes = [lookup(c) for c in ("TD102", "TD204", "TD250", "TD310")]
    got = {f.code: f for f in run_checks(facts, CheckOptions(batch_bytes=64 * MiB), codes=codes)}
    assert "4 process(es) × 4 workers" in got["TD102"].message
    assert "4 processes per node (SLURM_NTASKS_PER_NODE)" in got["TD310"].message
    assert got["TD250"].message.startswith("4 training processes")
    for code in ("TD102", "TD250", "TD310"):
        counted = [e for e in got[code].evidence if "processes" in e.label]
        assert [(e.value, e.source) for e in counted] == [(4, "SLURM_NTASKS_PER_NODE")], code
    # and --nproc-per-node overrides it for all of them alike
    over = {f.code: f for f in run_checks(facts, CheckOptions(batch_bytes=64 * MiB, nproc_per_node=8), codes=codes)}
    assert (
        "8 process(es)" in over["TD102"].message and "8 processes per node (--nproc-per-node)" in over["TD310"].message
    )


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, (1, False)),
        ({"LOCAL_WORLD_SIZE": "8", "SLURM_NTASKS_PER_NODE": "1", "TORCHELASTIC_RUN_ID": "x"}, (8, True)),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, (2, True)),
        ({"SLURM_TASKS_PER_NODE": "2,8(x2)", "SLURM_NODEID": "2"}, (8, True)),
        ({"SLURM_STEP_TASKS_PER_NODE": "3", "SLURM_TASKS_PER_NODE": "4"}, (3, True)),
        ({"SLURM_NTASKS_PER_NODE": "4", "SLURM_NODEID": "5"}, (4, True)),  # one number: every node
        ({"LOCAL_WORLD_SIZE": "four", "SLURM_NTASKS_PER_NODE": "2"}, (2, True)),  # not an integer: TD402's business
        ({"LOCAL_WORLD_SIZE": "0"}, (1, False)),
    ],
)
def test_local_processes_order(env: dict[str, str], expected: tuple[int, bool]) -> None:
    facts = Facts.from_dict({"meta": {"schema_version": 1}, "host": {"env": env}})
    got = local_processes(facts, CheckOptions())
    assert (got.count, got.known) == expected
    if "TORCHELASTIC_RUN_ID" in env:
        assert got.source == "LOCAL_WORLD_SIZE (torchrun)"


def test_per_node_counts() -> None:
    assert per_node("2(x3),1", "3") == 1 and per_node("2(x3),1", "0") == 2 and per_node("2(x3),1", "4") is None
    assert per_node("4", None) == 4 and per_node("x", "0") is None and per_node(None, "0") is None
