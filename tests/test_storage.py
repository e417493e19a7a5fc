"""Storage and paths (TD601-TD613): real directories, real mounts, real permission checks.

Root-only tests build private mounts inside `unshare -m` (read-only bind mount, a full tmpfs, a
tmpfs short of inodes, an overlay) so the host's mount table is never touched; they skip with the
reason when not root or when the kernel refuses the namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchdoctor.catalogue import storage, storage_mounts
from torchdoctor.checks import run_checks
from torchdoctor.facts import Facts, GatherContext, gather
from torchdoctor.facts import paths as paths_facts
from torchdoctor.options import CheckOptions
from torchdoctor.registry import all_codes

from .conftest import FIXTURES, REPO, run_cli

STORAGE = FIXTURES / "storage"
MiB, GiB = 1024**2, 1024**3
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


# -- helpers ------------------------------------------------------------------------------------
def storage_codes() -> list[Any]:
    return [c for c in all_codes() if c.code.startswith("TD6") and c.check is not None]


def findings(facts: Facts, **opts: Any) -> list[Any]:
    return run_checks(facts, CheckOptions(**opts), codes=storage_codes())


def codes_of(found: list[Any]) -> list[str]:
    return [f.code for f in found]


def live(*paths: str | Path, root: Path | None = None) -> Facts:
    ctx = GatherContext(paths=tuple(str(p) for p in paths), torch=False)
    if root is not None:
        ctx.root = root
    return gather(ctx, sections=["paths", "host"])


def entry(facts: Facts, i: int = 0) -> dict[str, Any]:
    return facts.get("paths.entries")[i]


def snapshot(*entries: dict[str, Any], **sections: Any) -> Facts:
    return Facts.from_dict(
        {"meta": {"schema_version": 1}, "paths": {"euid": 1000, "entries": list(entries)}, **sections}
    )


def dir_entry(
    path: str = "/ckpt",
    free: int = 100 * GiB,
    total: int = 500 * GiB,
    fsid: int = 7,
    inodes_free: int | None = 10_000_000,
    inodes_total: int | None = 20_000_000,
    fstype: str = "ext4",
    kind: str = "local",
    options: tuple[str, ...] = ("rw",),
    write_test: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One entry of the paths section, shaped like facts/paths.py writes it."""
    e = {
        "path": path,
        "abspath": path,
        "exists": True,
        "is_dir": True,
        "writable": True,
        "creatable": None,
        "nearest_existing": None,
        "missing_levels": 0,
        "owner": {"uid": 0, "gid": 0, "mode": "0755"},
        "write_test": write_test or {"ok": True, "where": path},
        "stat_error": None,
        "timed_out": False,
        "fs": {
            "checked_at": path,
            "free_bytes": free,
            "total_bytes": total,
            "inodes_free": inodes_free,
            "inodes_total": inodes_total,
            "read_only": False,
            "fsid": fsid,
        },
        "mount": {"mount_point": "/", "fstype": fstype, "source": "/dev/sda1", "options": list(options)},
        "fstype": fstype,
        "fs_kind": kind,
        "mount_read_only": "ro" in options,
    }
    e.update(extra)
    return e


def failed(errno_name: str, step: str = "open", where: str = "/ckpt") -> dict[str, Any]:
    return {"ok": False, "where": where, "step": step, "errno": errno_name, "errno_num": 0, "message": errno_name}


def need_root() -> None:
    if not IS_ROOT:
        pytest.skip("needs root (private mounts, chattr, setpriv)")


# Runs inside the private mount namespace: the CLI once per argument list, then what is left in D.
DRIVER = r"""
import json, os, subprocess, sys
d, runs = sys.argv[1], json.loads(sys.argv[2])
out = {"runs": []}
for args in runs:
    p = subprocess.run([sys.executable, "-m", "torchdoctor", *args], capture_output=True, text=True)
    out["runs"].append({"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr})
out["listing"] = sorted(os.listdir(d))
out["mountinfo"] = open("/proc/self/mountinfo").read()
print(json.dumps(out))
"""


def in_private_mounts(setup: str, arg: Path, d: Path, runs: list[list[str]]) -> dict[str, Any]:
    """Run ``setup`` (sh, with $1 = arg) in a new mount namespace, then the CLI runs; skip if refused."""
    need_root()
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --make-rprivate /"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -m refused: {probe.stderr.strip()}")
    script = f'mount --make-rprivate / && {setup} && shift && exec "$@"'
    argv = ["unshare", "-m", "sh", "-c", script, "sh", str(arg), sys.executable, "-c", DRIVER, str(d), json.dumps(runs)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for run in out["runs"]:
        assert run["rc"] in (0, 1), run["stderr"]
    return out


def copy_root(fixture: str, tmp_path: Path, *dirs: str) -> Path:
    root = tmp_path / "root"
    shutil.copytree(STORAGE / fixture, root)
    for d in dirs:
        (root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return root


# -- the gatherer on real directories -------------------------------------------------------------
def test_writable_directory_is_tested_for_real_and_left_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    before = sorted(os.listdir(tmp_path))
    facts = live(tmp_path)
    e = entry(facts)
    assert e["exists"] and e["is_dir"] and e["writable"] is True and e["write_test"]["ok"]
    assert e["fs"]["total_bytes"] > 0 and e["fs"]["free_bytes"] <= e["fs"]["total_bytes"]
    assert e["mount"]["mount_point"] and e["fstype"] == e["mount"]["fstype"]
    assert sorted(os.listdir(tmp_path)) == before
    assert not set(codes_of(findings(facts))) & {"TD601", "TD602", "TD603", "TD604", "TD605", "TD606"}


def test_missing_but_creatable_is_info_and_nothing_is_created(tmp_path: Path) -> None:
    target = tmp_path / "nope" / "deeper"
    facts = live(target)
    e = entry(facts)
    assert e["exists"] is False and e["creatable"] is True
    assert e["nearest_existing"] == str(tmp_path) and e["missing_levels"] == 2
    assert not (tmp_path / "nope").exists() and os.listdir(tmp_path) == []
    found = findings(facts)
    assert "TD602" in codes_of(found) and "TD601" not in codes_of(found)
    td602 = next(f for f in found if f.code == "TD602")
    assert td602.severity.label == "info" and "FileNotFoundError" in td602.message
    assert f'os.makedirs("{target}", exist_ok=True)' in td602.fix


def test_file_in_the_way_is_not_a_directory_and_blocks_creation(tmp_path: Path) -> None:
    blocker = tmp_path / "ckpt.pt"
    blocker.write_bytes(b"not a directory")
    facts = live(blocker, blocker / "sub")
    assert entry(facts, 0)["is_dir"] is False
    sub = entry(facts, 1)
    assert sub["creatable"] is False and sub["write_test"]["errno"] == "ENOTDIR"
    found = findings(facts)
    assert "TD603" in codes_of(found) and "TD601" in codes_of(found)
    assert next(f for f in found if f.code == "TD601").message.count("ENOTDIR") == 1
    assert os.listdir(tmp_path) == ["ckpt.pt"] and blocker.read_bytes() == b"not a directory"


def test_expect_bytes_against_real_free_space(tmp_path: Path) -> None:
    facts = live(tmp_path)
    free = entry(facts)["fs"]["free_bytes"]
    over = findings(facts, expect_bytes=2 * free + GiB)
    assert "TD607" in codes_of(over)
    assert "TD607" not in codes_of(findings(facts, expect_bytes=1 * MiB))
    assert os.listdir(tmp_path) == []


def test_two_paths_on_one_file_system_add_up(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    facts = live(a, b)
    free = entry(facts)["fs"]["free_bytes"]
    half = free * 6 // 10  # each fits alone, both together do not
    assert "TD607" not in codes_of(findings(live(a), expect_bytes=half))
    td607 = [f for f in findings(facts, expect_bytes=half) if f.code == "TD607"]
    assert len(td607) == 1 and "× 2 paths" in td607[0].message


def test_root_ignores_mode_bits_so_only_the_write_test_tells(tmp_path: Path) -> None:
    need_root()
    d = tmp_path / "r-x"
    d.mkdir(mode=0o555)
    d.chmod(0o555)
    e = entry(live(d))
    assert e["owner"]["mode"] == "0555" and e["writable"] is True  # root: writable despite 0555
    assert os.listdir(d) == []


def test_immutable_directory_reports_eperm(tmp_path: Path) -> None:
    need_root()
    d = tmp_path / "frozen"
    d.mkdir()
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    set_i = subprocess.run(["chattr", "+i", str(d)], capture_output=True, text=True)
    if set_i.returncode != 0:
        pytest.skip(f"chattr +i is not supported here: {set_i.stderr.strip()}")
    try:
        facts = live(d, d / "child")
        listing = os.listdir(d)
    finally:
        subprocess.run(["chattr", "-i", str(d)], check=True)
    e, child = entry(facts, 0), entry(facts, 1)
    assert e["writable"] is False and e["write_test"]["errno"] == "EPERM" and e["write_test"]["step"] == "open"
    assert child["creatable"] is False and child["write_test"]["errno"] == "EPERM"
    found = findings(facts)
    td604 = next(f for f in found if f.code == "TD604")
    assert "EPERM" in td604.message and "chattr -i" in td604.fix
    assert "TD601" in codes_of(found)
    assert listing == []


def test_unprivileged_user_on_0555_directory_gets_eacces() -> None:
    need_root()
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    base = Path(tempfile.mkdtemp(prefix="td-storage-", dir="/tmp"))
    try:
        base.chmod(0o755)
        d = base / "readonly"
        d.mkdir()
        d.chmod(0o555)
        can_run = subprocess.run([*drop, sys.executable, "-c", "import torchdoctor"], capture_output=True, text=True)
        if can_run.returncode != 0:
            pytest.skip(f"uid 65534 cannot run this interpreter: {can_run.stderr.strip()[-200:]}")
        proc = subprocess.run(
            [*drop, sys.executable, "-m", "torchdoctor", "check", "--no-torch", "--format", "json", "--path", str(d)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert proc.returncode == 1, proc.stderr
        doc = json.loads(proc.stdout)
        td604 = [f for f in doc["findings"] if f["code"] == "TD604"]
        assert len(td604) == 1 and "EACCES" in td604[0]["message"] and "uid 65534" in td604[0]["message"]
        assert any(ev["value"] == "0:0 0555" for ev in td604[0]["evidence"])
        assert os.listdir(d) == []
    finally:
        shutil.rmtree(base)


# -- private mounts (unshare -m) -----------------------------------------------------------------
def test_read_only_bind_mount(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    setup = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"'
    runs = [
        ["check", "--no-torch", "--format", "json", "--fail-on", "never", "--path", str(d), "--path", str(d / "new")],
        ["facts", "--no-torch", "--path", str(d)],
    ]
    out = in_private_mounts(setup, d, d, runs)
    facts = json.loads(out["runs"][1]["stdout"])["paths"]["entries"][0]
    assert facts["mount"]["mount_point"] == str(d) and facts["mount_read_only"] is True
    assert facts["write_test"]["errno"] == "EROFS" and facts["fs"]["read_only"] is True
    found = json.loads(out["runs"][0]["stdout"])["findings"]
    by_code = {}
    for f in found:
        by_code.setdefault(f["code"], []).append(f)
    assert {f["message"].split(" ")[0] for f in by_code["TD605"]} == {str(d), str(d / "new")}
    assert "EROFS" in by_code["TD601"][0]["message"]
    assert "TD604" not in by_code  # EROFS is TD605's, not a permission problem
    assert out["listing"] == []
    assert str(d) not in Path("/proc/self/mountinfo").read_text()  # the bind mount stayed private


def test_full_tmpfs_reports_enospc_and_leaves_only_the_filler(tmp_path: Path) -> None:
    d = tmp_path / "full"
    d.mkdir()
    setup = 'mount -t tmpfs -o size=1m tmpfs "$1" && { head -c 4194304 /dev/zero > "$1/fill" 2>/dev/null; true; }'
    runs = [
        ["check", "--no-torch", "--format", "json", "--path", str(d), "--expect-bytes", "1MiB"],
        ["facts", "--no-torch", "--path", str(d)],
    ]
    out = in_private_mounts(setup, d, d, runs)
    e = json.loads(out["runs"][1]["stdout"])["paths"]["entries"][0]
    assert e["fstype"] == "tmpfs" and e["fs_kind"] == "memory" and e["fs"]["free_bytes"] == 0
    assert e["write_test"]["ok"] is False and e["write_test"]["errno"] == "ENOSPC"
    check = out["runs"][0]
    assert check["rc"] == 1
    found = {f["code"]: f for f in json.loads(check["stdout"])["findings"]}
    assert "ENOSPC" in found["TD606"]["message"] and "0 B of 1 MiB is free" in found["TD606"]["message"]
    assert "TD607" not in found  # TD606 already says it is full
    assert "TD612" in found
    assert out["listing"] == ["fill"]


def test_expect_bytes_on_a_private_tmpfs(tmp_path: Path) -> None:
    d = tmp_path / "eight"
    d.mkdir()
    setup = 'mount -t tmpfs -o size=8m tmpfs "$1"'
    base = ["check", "--no-torch", "--format", "json", "--fail-on", "never", "--path", str(d)]
    out = in_private_mounts(setup, d, d, [[*base, "--expect-bytes", "16MiB"], [*base, "--expect-bytes", "4MiB"], base])
    over, under, no_expect = ({f["code"]: f for f in json.loads(r["stdout"])["findings"]} for r in out["runs"])
    assert (
        "TD607" in over and "8 MiB free of 8 MiB" in over["TD607"]["message"] and "16 MiB" in over["TD607"]["message"]
    )
    assert "TD607" not in under and "TD608" not in under
    assert "TD608" in no_expect  # 8 MiB is below the 1 GiB floor when nothing was expected
    assert out["listing"] == []


def test_tmpfs_short_of_inodes(tmp_path: Path) -> None:
    d = tmp_path / "inodes"
    d.mkdir()
    setup = (
        'mount -t tmpfs -o size=4m,nr_inodes=64 tmpfs "$1" && '
        'i=0; while [ $i -lt 60 ]; do : > "$1/f$i" || break; i=$((i+1)); done'
    )
    runs = [
        ["check", "--no-torch", "--format", "json", "--fail-on", "never", "--path", str(d)],
        ["facts", "--no-torch", "--path", str(d)],
    ]
    out = in_private_mounts(setup, d, d, runs)
    fs = json.loads(out["runs"][1]["stdout"])["paths"]["entries"][0]["fs"]
    assert fs["inodes_total"] == 64 and 0 < fs["inodes_free"] < 64 * storage.INODES_LOW_FRACTION
    found = {f["code"]: f for f in json.loads(out["runs"][0]["stdout"])["findings"]}
    assert (
        found["TD609"]["severity"] == "warning" and f"of {fs['inodes_total']} inodes free" in found["TD609"]["message"]
    )
    assert "TD606" not in found
    assert len(out["listing"]) == 60


def test_real_overlay_mount_is_recognised(tmp_path: Path) -> None:
    for sub in ("lower", "upper", "work", "merged"):
        (tmp_path / sub).mkdir()
    setup = 'mount -t overlay overlay -o lowerdir="$1/lower",upperdir="$1/upper",workdir="$1/work" "$1/merged"'
    merged = tmp_path / "merged"
    out = in_private_mounts(
        setup,
        tmp_path,
        merged,
        [["check", "--no-torch", "--format", "json", "--fail-on", "never", "--path", str(merged)]],
    )
    found = {f["code"]: f for f in json.loads(out["runs"][0]["stdout"])["findings"]}
    assert "TD611" in found and "overlay at " + str(merged) in found["TD611"]["message"]
    assert out["listing"] == [] and os.listdir(tmp_path / "upper") == []


# -- recorded mount tables (GatherContext.root) ----------------------------------------------------
def test_recorded_kubernetes_pod_nfs_overlay_and_read_only_configmap(tmp_path: Path) -> None:
    root = copy_root("k8s-nfs", tmp_path, "kaiwudb/certs", "workspace", "opt")
    facts = live("/kaiwudb/certs", "/workspace/ckpt", "/opt", root=root)
    nfs, ckpt, opt = (entry(facts, i) for i in range(3))
    assert nfs["fstype"] == "nfs4" and nfs["fs_kind"] == "network" and nfs["writable"] is True
    assert ckpt["exists"] is False and ckpt["nearest_existing"] == "/workspace" and ckpt["fs_kind"] == "overlay"
    assert opt["mount"]["mount_point"] == "/opt" and opt["mount_read_only"] is True
    found = findings(facts)
    by_code = {f.code: f for f in found}
    assert "20.20.20.43:/data/k8s/nfs_share" in by_code["TD610"].message
    assert "go through the NFS server" in by_code["TD610"].message  # local_lock=none
    assert by_code["TD610"].family == "concurrent-write"
    assert "/workspace/ckpt" in by_code["TD611"].message and "TD602" in by_code
    assert by_code["TD605"].message.startswith("/opt is on a read-only mount") and "ro" in by_code["TD605"].message
    assert sorted(p.name for p in (root / "opt").iterdir()) == []


def test_recorded_hpc_node_lustre_lock_modes_and_fuse(tmp_path: Path) -> None:
    root = copy_root("hpc-lustre", tmp_path, "lustre/scratch/run", "lustre/project", "home/me", "data/s3", "tmp")
    facts = live("/lustre/scratch/run", "/lustre/project", "/home/me", "/data/s3", "/tmp", root=root)
    kinds = [entry(facts, i)["fs_kind"] for i in range(5)]
    assert kinds == ["network", "network", "network", "fuse", "memory"]
    td610 = {f.message.split(" ")[0]: f.message for f in findings(facts) if f.code == "TD610"}
    assert "local to this node (localflock)" in td610["/lustre/scratch/run"]
    assert "coherent across nodes (flock)" in td610["/lustre/project"]
    assert "(FUSE)" in td610["/data/s3"] and "copy and delete" in td610["/data/s3"]
    assert "TD612" in codes_of(findings(facts))


@pytest.mark.parametrize(
    "fstype, options, expected",
    [
        ("nfs", ["rw", "vers=3", "nolock"], "local to this node"),
        ("nfs4", ["rw", "local_lock=all"], "local to this node"),
        ("nfs4", ["rw", "local_lock=flock"], "flock() locks, which filelock.FileLock uses, are local"),
        ("nfs4", ["rw", "local_lock=none"], "go through the NFS server"),
        ("lustre", ["rw", "noflock"], "ENOSYS"),
        ("lustre", ["rw"], "do not show flock"),
        ("cifs", ["rw"], "depends on this file system's client"),
    ],
)
def test_lock_note_reads_the_mount_options(fstype: str, options: list[str], expected: str) -> None:
    assert expected in storage_mounts.lock_note(fstype, options)


@pytest.mark.parametrize(
    "fstype, kind",
    [
        ("ext4", "local"),
        ("xfs", "local"),
        ("fuseblk", "local"),
        ("nfs4", "network"),
        ("lustre", "network"),
        ("beegfs", "network"),
        ("fuse.sshfs", "fuse"),
        ("fuse.fuse-overlayfs", "overlay"),
        ("overlay", "overlay"),
        ("tmpfs", "memory"),
        (None, None),
    ],
)
def test_fs_kind(fstype: str | None, kind: str | None) -> None:
    assert paths_facts.fs_kind(fstype) == kind


def test_a_hung_path_times_out_without_hiding_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = paths_facts._statvfs
    hung = tmp_path / "hung"
    hung.mkdir()

    def slow(local: Path) -> dict[str, Any]:
        if Path(local) == hung:
            time.sleep(1.5)  # what statvfs on an unreachable hard-mounted NFS server does, forever
        return real(local)

    monkeypatch.setattr(paths_facts, "_statvfs", slow)
    ctx = GatherContext(paths=(str(hung), str(tmp_path)), torch=False, section_timeout=1.0)
    started = time.monotonic()
    facts = gather(ctx, sections=["paths"])
    assert time.monotonic() - started < 1.4
    assert entry(facts, 0)["timed_out"] is True and entry(facts, 1)["writable"] is True
    assert "did not finish" in facts.unknown["paths.entries[0]"]
    assert codes_of(findings(facts)) == ["TD613"]
    time.sleep(1.0)  # let the slow thread end before tmp_path goes away
    assert os.listdir(hung) == []


# -- pure checks on snapshots: positive and near-miss ------------------------------------------------
def test_space_below_expected_and_its_near_miss() -> None:
    facts = snapshot(dir_entry(free=10 * GiB))
    assert "TD607" in codes_of(findings(facts, expect_bytes=11 * GiB))
    assert "TD607" not in codes_of(findings(facts, expect_bytes=9 * GiB))
    two_fs = snapshot(dir_entry("/a", free=10 * GiB, fsid=1), dir_entry("/b", free=10 * GiB, fsid=2))
    assert "TD607" not in codes_of(findings(two_fs, expect_bytes=6 * GiB))
    one_fs = snapshot(dir_entry("/a", free=10 * GiB, fsid=1), dir_entry("/b", free=10 * GiB, fsid=1))
    assert "TD607" in codes_of(findings(one_fs, expect_bytes=6 * GiB))


def test_low_space_floor_only_without_an_expectation() -> None:
    low, ok = snapshot(dir_entry(free=900 * MiB)), snapshot(dir_entry(free=1100 * MiB))
    assert "TD608" in codes_of(findings(low)) and "TD608" not in codes_of(findings(ok))
    assert "TD608" not in codes_of(findings(low, expect_bytes=100 * MiB))


@pytest.mark.parametrize(
    "free, total, expected",
    [
        (0, 1_000_000, "error"),
        (1_000, 1_000_000, "warning"),
        (40_000, 10_000_000, "warning"),
        (60_000, 1_000_000, None),
        (40_000, 100_000, None),
        (None, None, None),
    ],
)
def test_inodes(free: int | None, total: int | None, expected: str | None) -> None:
    found = [f for f in findings(snapshot(dir_entry(inodes_free=free, inodes_total=total))) if f.code == "TD609"]
    assert [f.severity.label for f in found] == ([expected] if expected else [])


@pytest.mark.parametrize(
    "errno_name, code, absent",
    [
        ("EACCES", "TD604", "TD605"),
        ("EPERM", "TD604", "TD605"),
        ("ESTALE", "TD604", "TD606"),
        ("EROFS", "TD605", "TD604"),
        ("ENOSPC", "TD606", "TD604"),
        ("EDQUOT", "TD606", "TD604"),
    ],
)
def test_each_errno_goes_to_one_code(errno_name: str, code: str, absent: str) -> None:
    found = findings(snapshot(dir_entry(writable=False, write_test=failed(errno_name))))
    assert code in codes_of(found) and absent not in codes_of(found)
    assert errno_name in next(f for f in found if f.code == code).message


def test_disk_full_explains_inodes_when_space_is_free() -> None:
    e = dir_entry(free=5 * GiB, inodes_free=0, writable=False, write_test=failed("ENOSPC"))
    td606 = [f for f in findings(snapshot(e)) if f.code == "TD606"]
    assert len(td606) == 1 and "no inodes are left" in td606[0].message


def test_healthy_local_directory_has_no_finding() -> None:
    assert findings(snapshot(dir_entry()), expect_bytes=GiB) == []


def test_overlay_names_the_container_when_known() -> None:
    e = dir_entry(fstype="overlay", kind="overlay")
    in_ct = snapshot(e, host={"container": {"in_container": True, "kind": "docker"}})
    assert "this container's writable layer" in next(f for f in findings(in_ct) if f.code == "TD611").message
    bare = snapshot(e)
    assert "an overlay (union) file system" in next(f for f in findings(bare) if f.code == "TD611").message


@pytest.mark.parametrize("data", [{}, {"paths": None}, {"paths": {"entries": None}}, {"paths": {"entries": [None, 3]}}])
def test_unknown_paths_section_yields_nothing(data: dict[str, Any]) -> None:
    assert findings(Facts.from_dict({"meta": {"schema_version": 1}, **data})) == []


_maybe = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.text(max_size=8))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "path",
                "abspath",
                "exists",
                "is_dir",
                "writable",
                "creatable",
                "timed_out",
                "nearest_existing",
                "fs_kind",
                "mount_read_only",
                "stat_error",
                "owner",
                "mount",
                "missing_levels",
            ]
        ),
        _maybe,
    ),
    st.one_of(st.none(), st.fixed_dictionaries({"ok": st.booleans(), "errno": _maybe, "where": _maybe})),
    st.one_of(
        st.none(),
        st.fixed_dictionaries(
            {
                "free_bytes": st.one_of(st.none(), st.integers(0, 10**13)),
                "inodes_free": st.one_of(st.none(), st.integers(0, 10**7)),
                "inodes_total": st.one_of(st.none(), st.integers(0, 10**7)),
                "fsid": _maybe,
            }
        ),
    ),
)
def test_checks_never_crash_on_partial_entries(e: dict[str, Any], wt: Any, fs: Any) -> None:
    found = findings(snapshot({**e, "write_test": wt, "fs": fs}), expect_bytes=GiB)
    assert not [f for f in found if f.check_error]


# -- the CLI -------------------------------------------------------------------------------------
def test_cli_text_report_for_a_missing_directory(tmp_path: Path) -> None:
    target = tmp_path / "checkpoints"
    proc = run_cli("check", "--no-torch", "--path", str(target), env={"NO_COLOR": "1"})
    assert proc.returncode in (0, 1), proc.stderr
    assert "TD602" in proc.stdout and "path-missing" in proc.stdout and "os.makedirs" in proc.stdout
    assert not target.exists() and os.listdir(tmp_path) == []


def test_registry_holds_the_storage_range() -> None:
    codes = storage_codes()
    assert [c.code for c in codes] == [f"TD6{n:02d}" for n in range(1, 14)]
    assert all(c.area == "storage" for c in codes)
    assert {c.family for c in codes} == {"checkpoint-io", "concurrent-write"}
