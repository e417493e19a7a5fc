"""torchdoctor.save/load against real failures: SIGKILL mid-save, a full disk, a read-only mount, a
directory the user may not write, keep_last rotation, corruption caught by verify.

Everything happens under pytest's tmp dirs; the disk-full and read-only cases mount a private tmpfs in
a private mount namespace (``unshare -m``, root only) that disappears with the process."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torchdoctor  # noqa: E402
from torchdoctor.errors import UsageError  # noqa: E402
from torchdoctor.guards import checkpoint  # noqa: E402
from torchdoctor.guards.checkpoint import CheckpointError, clean_stale_temps, load, save  # noqa: E402

pytestmark = pytest.mark.torch


def _state(mib: int = 1, step: int = 0) -> dict[str, Any]:
    n = mib * (1 << 20) // 4
    g = torch.Generator().manual_seed(1234)
    return {
        "model": {"w": torch.rand(n, generator=g), "b": torch.arange(16, dtype=torch.int64)},
        "opt": [torch.ones(3, 3), {"lr": 0.1}],
        "step": step,
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a["step"] == b["step"]
        and torch.equal(a["model"]["w"], b["model"]["w"])
        and torch.equal(a["model"]["b"], b["model"]["b"])
        and torch.equal(a["opt"][0], b["opt"][0])
    )


def _temps(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if ".tmp-" in n)


# --- basics ------------------------------------------------------------------------------------------


def test_save_load_roundtrip_creates_directory_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "run" / "sub" / "ckpt.pt"
    state = _state(step=3)
    assert save(state, target, verify=True) == target
    assert os.listdir(target.parent) == ["ckpt.pt"]
    assert _same(load(target), state)
    assert torchdoctor.save is save and torchdoctor.load is load


def test_durable_false_skips_only_the_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    target = tmp_path / "ckpt.pt"
    save(_state(step=1), target)
    assert len(synced) == 2  # the file, then its directory
    synced.clear()
    save(_state(step=2), target, durable=False, verify=True)
    assert synced == []
    assert load(target)["step"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_a_file_where_the_directory_should_be_is_td603(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("not a directory")
    for target in (tmp_path / "run" / "ckpt.pt", tmp_path / "run" / "sub" / "ckpt.pt"):
        with pytest.raises(CheckpointError) as info:
            save(_state(), target)
        assert info.value.code == "TD603" and "Fix: Point the checkpoint path" in str(info.value)
        assert "{" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_rank0_only_writes_on_rank_zero_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    assert save(_state(), tmp_path / "a.pt", rank0_only=True) is None
    assert not (tmp_path / "a.pt").exists()
    monkeypatch.setenv("RANK", "0")
    assert save(_state(), tmp_path / "a.pt", rank0_only=True) == tmp_path / "a.pt"
    monkeypatch.setenv("RANK", "1")
    assert save(_state(), tmp_path / "b.pt") == tmp_path / "b.pt"  # without rank0_only every rank writes


def test_estimate_counts_each_storage_once_and_modules_by_state_dict() -> None:
    base = torch.zeros(1000)
    assert checkpoint.estimate_nbytes({"a": base, "view": base[10:20], "again": [base]}) == 4000
    lin = torch.nn.Linear(10, 10)
    assert checkpoint.estimate_nbytes({"m": lin}) == (100 + 10) * 4


def test_keyboard_interrupt_mid_save_removes_temp_and_keeps_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "ckpt.pt"
    old = _state(step=1)
    save(old, target)

    def interrupted(f: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "_durable", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save(_state(step=2), target)
    assert _temps(tmp_path) == []
    assert _same(load(target), old)


# --- (a) SIGKILL at random moments -------------------------------------------------------------------

TRIALS = 60


def _writer(target: Path, state: dict[str, Any], durable: bool) -> None:  # runs in a forked child; never returns
    try:
        for step in range(10**9):
            state["step"] = step
            save(state, target, durable=durable)
    finally:
        os._exit(1)


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "no-fsync"])
def test_sigkill_at_random_moments_never_breaks_the_previous_checkpoint(tmp_path: Path, durable: bool) -> None:
    # durable=False skips the fsyncs: a killed *process* still never leaves a broken checkpoint
    rng = random.Random(int(os.environ.get("TD_KILL_SEED", "0")) or None)
    target = tmp_path / "ckpt.pt"
    state = _state(mib=24, step=-1)  # built before fork: the child uses no thread pools
    save(state, target)
    reference = load(target)
    leftovers = 0
    started = time.monotonic()
    for trial in range(TRIALS):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            _writer(target, state, durable)
        if trial % 2:
            time.sleep(rng.uniform(0, 0.4))  # anywhere: between saves, in torch.save, fsync, rename
        else:  # aim at the write itself: kill shortly after a temp file appears
            deadline = time.monotonic() + 5
            while not _temps(tmp_path) and time.monotonic() < deadline:
                time.sleep(0.0005)
            time.sleep(rng.uniform(0, 0.03))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

        names = set(os.listdir(tmp_path))
        temps = _temps(tmp_path)
        assert names - set(temps) == {"ckpt.pt"}, names  # nothing else, never a second "checkpoint"
        assert all(n.startswith(".ckpt.pt.tmp-") and not n.endswith(".pt") for n in temps), temps
        leftovers += len(temps)
        got = load(target, map_location="cpu")  # always a complete checkpoint: the old or a new one
        assert got["step"] >= -1
        assert torch.equal(got["model"]["w"], reference["model"]["w"])
        assert torch.equal(got["opt"][0], reference["opt"][0])
        clean_stale_temps(tmp_path)  # what the next save does first
        assert _temps(tmp_path) == []
    elapsed = time.monotonic() - started
    # the aimed half must have caught writers mid-write, or this test tested nothing
    assert leftovers >= 1, "no kill landed during a write"
    print(f"{TRIALS} kills in {elapsed:.1f}s, {leftovers} left a temp file behind (all cleaned)")
    assert elapsed < 60


def test_next_save_removes_only_dead_unlocked_temps_of_this_host(tmp_path: Path) -> None:
    import fcntl

    host = checkpoint._host()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".ckpt-3.pt.tmp-{host}-{dead.pid}-0123abcd"
    live = tmp_path / f".ckpt-3.pt.tmp-{host}-{os.getpid()}-0123abcd"  # pid alive: ours
    other_host = tmp_path / f".ckpt-3.pt.tmp-elsewhere-{dead.pid}-0123abcd"
    locked = tmp_path / f".ckpt-4.pt.tmp-{host}-{dead.pid}-deadbeef"  # someone holds the lock
    lookalike = tmp_path / f".ckpt-3.pt.tmp-{host}-{dead.pid}-notours"
    for p in (stale, live, other_host, locked, lookalike):
        p.write_bytes(b"partial")
    fd = os.open(locked, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        save(_state(), tmp_path / "ckpt-5.pt")
    finally:
        os.close(fd)
    assert not stale.exists()
    assert live.exists() and other_host.exists() and locked.exists() and lookalike.exists()


# --- (b)-(c) a full disk and a read-only mount, in a private tmpfs --------------------------------------


def _can_unshare() -> bool:
    if os.geteuid() != 0:
        return False
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "true"], timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


needs_unshare = pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m (private tmpfs)")

_SCRIPT = """
import json, os, sys
import torch
from torchdoctor.guards.checkpoint import CheckpointError, load, save
d, phase = sys.argv[1], sys.argv[2]
out = {}
def tensors(mib):
    return {"w": torch.ones(mib * (1 << 20) // 4), "step": mib}
def attempt(name, obj, path):
    try:
        save(obj, path)
        out[name] = "saved"
    except CheckpointError as e:
        out[name] = {"code": e.code, "msg": str(e), "cause": type(e.__cause__).__name__ if e.__cause__ else None}
if phase == "first":
    save(tensors(1), os.path.join(d, "ckpt.pt"))
elif phase == "full":
    attempt("precheck", tensors(20), os.path.join(d, "ckpt.pt"))          # tensors alone > 8 MiB
    attempt("midwrite", {"blob": b"x" * (12 << 20)}, os.path.join(d, "ckpt.pt"))  # no tensors: ENOSPC in write
    attempt("newdir", {"blob": b"x" * (12 << 20)}, os.path.join(d, "new", "ckpt.pt"))
elif phase == "ro":
    attempt("ro", tensors(1), os.path.join(d, "ckpt.pt"))
    attempt("ro_newdir", tensors(1), os.path.join(d, "sub", "ckpt.pt"))
out["previous_step"] = load(os.path.join(d, "ckpt.pt"))["step"]
out["files"] = sorted(os.listdir(d))
print(json.dumps(out))
"""


def _in_private_tmpfs(tmp_path: Path, shell: str) -> dict[str, Any]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT)
    py = f"{sys.executable} {script} {mnt}"
    cmd = f"mount -t tmpfs -o size=8m tmpfs {mnt} && " + shell.format(py=py, mnt=mnt)
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@needs_unshare
def test_disk_full_refuses_early_or_fails_cleanly_and_keeps_previous(tmp_path: Path) -> None:
    out = _in_private_tmpfs(tmp_path, "{py} first && {py} full")
    pre = out["precheck"]
    assert pre["code"] == "TD654" and "not enough free space" in pre["msg"] and "Fix: Free space" in pre["msg"]
    mid = out["midwrite"]
    assert mid["code"] == "TD654" and "No space left on device" in mid["msg"], mid
    assert mid["cause"] in ("OSError", "RuntimeError")  # the original error is chained
    assert out["newdir"]["code"] == "TD654"
    assert out["previous_step"] == 1  # the old checkpoint still loads
    assert out["files"] == ["ckpt.pt", "new"]  # no temp file left behind


@needs_unshare
def test_read_only_mount_is_td652_and_keeps_previous(tmp_path: Path) -> None:
    out = _in_private_tmpfs(tmp_path, "{py} first && mount -o remount,ro {mnt} && {py} ro")
    assert out["ro"]["code"] == "TD652" and "Read-only file system" in out["ro"]["msg"]
    assert "Fix: Write to a writable volume" in out["ro"]["msg"]
    assert out["ro_newdir"]["code"] == "TD652"
    assert out["previous_step"] == 1
    assert out["files"] == ["ckpt.pt"]


# --- (d) permission denied, as an unprivileged user ---------------------------------------------------


@pytest.fixture
def open_tmp() -> Any:
    """A temp dir uid 65534 can enter (pytest's own sits under a 0700 directory)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="td-guard-"))
    os.chmod(base, 0o755)
    yield base
    for root, dirs, _ in os.walk(base):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    shutil.rmtree(base)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to uid 65534 (root ignores mode bits)")
def test_permission_denied_is_td653_for_an_unprivileged_user(open_tmp: Path) -> None:
    locked = open_tmp / "locked"
    locked.mkdir()
    save(_state(step=1), locked / "ckpt.pt")
    os.chmod(locked, 0o555)  # owned by root: uid 65534 may read and enter, not write
    # import now what the error path imports: the interpreter lives under /root, closed to uid 65534
    str(CheckpointError("TD653", "warm-up", locked))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            out = {}
            for name, path in (("file", locked / "ckpt.pt"), ("newdir", locked / "sub" / "ckpt.pt")):
                try:
                    save({"x": torch.ones(4)}, path)
                    out[name] = {"code": "saved"}
                except CheckpointError as e:
                    out[name] = {"code": e.code, "msg": str(e)}
                except BaseException as e:
                    out[name] = {"code": "other", "msg": repr(e)}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out = json.loads(data)
    assert out["file"]["code"] in ("TD653", "TD651") and "Permission denied" in out["file"]["msg"], out
    assert "Fix: Give the training user its own output directory" in out["file"]["msg"]
    assert out["newdir"]["code"] in ("TD653", "TD651"), out
    assert load(locked / "ckpt.pt")["step"] == 1
    assert _temps(locked) == []


# --- (e) keep_last -----------------------------------------------------------------------------------


def test_keep_last_rotates_only_numbered_siblings(tmp_path: Path) -> None:
    unrelated = [
        "ckpt-final.pt",
        "ckpt-3.pt.bak",
        "ckpt-3.pth",
        "other-1.pt",
        "xckpt-2.pt",
        "ckpt-.pt",
        "ckpt--2.pt",
        "notes.txt",
        ".ckpt-1.pt.tmp-host-1-abc",
    ]
    for name in unrelated:
        (tmp_path / name).write_text("keep me")
    (tmp_path / "ckpt-99.pt").mkdir()  # a directory that matches: never removed
    (tmp_path / "ckpt-100.pt").symlink_to(tmp_path / "notes.txt")  # a symlink that matches: never removed
    (tmp_path / "ckpt-0.pt").write_text("an older run's numbered checkpoint: rotated like ours")
    for step in range(1, 7):
        save(_state(step=step), tmp_path / f"ckpt-{step}.pt", keep_last=3)
    numbered = sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt-") and n[5:-3].isdigit())
    assert numbered == ["ckpt-100.pt", "ckpt-4.pt", "ckpt-5.pt", "ckpt-6.pt", "ckpt-99.pt"]
    for name in unrelated:
        assert (tmp_path / name).read_text() == "keep me", name
    assert (tmp_path / "ckpt-99.pt").is_dir() and (tmp_path / "ckpt-100.pt").is_symlink()


def test_keep_last_orders_by_number_and_always_keeps_the_new_file(tmp_path: Path) -> None:
    for step in (8, 9, 10):
        save(_state(step=step), tmp_path / f"model-v2-step{step:04d}.pt", keep_last=2)
    assert sorted(os.listdir(tmp_path)) == ["model-v2-step0009.pt", "model-v2-step0010.pt"]
    save(_state(step=3), tmp_path / "model-v2-step0003.pt", keep_last=2)  # a restart from an earlier step
    assert sorted(os.listdir(tmp_path)) == ["model-v2-step0003.pt", "model-v2-step0009.pt", "model-v2-step0010.pt"]
    save(_state(step=3), tmp_path / "model-v2-step0011.pt", keep_last=1)
    assert os.listdir(tmp_path) == ["model-v2-step0011.pt"]


def test_keep_last_needs_a_number_and_a_positive_count(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="step number"):
        save(_state(), tmp_path / "last.pt", keep_last=2)
    with pytest.raises(UsageError, match="positive"):
        save(_state(), tmp_path / "ckpt-1.pt", keep_last=0)
    assert os.listdir(tmp_path) == []  # refused before writing anything


# --- (f) verify and load -------------------------------------------------------------------------------


def test_verify_catches_a_file_damaged_after_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ckpt.pt"
    old = _state(step=1)
    save(old, target, verify=True)
    real = checkpoint._durable

    def durable_then_damaged(f: Any) -> None:
        real(f)
        os.ftruncate(f.fileno(), os.fstat(f.fileno()).st_size // 2)  # the disk loses the second half

    monkeypatch.setattr(checkpoint, "_durable", durable_then_damaged)
    with pytest.raises(CheckpointError) as info:
        save(_state(step=2), target, verify=True)
    assert info.value.code == "TD656" and "verify" in str(info.value) and "Fix: " in str(info.value)
    assert _same(load(target), old) and _temps(tmp_path) == []


def test_verify_catches_changed_bytes_that_still_unpickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ckpt.pt"
    real = checkpoint._durable
    marker = torch.full((4096,), 7, dtype=torch.uint8)

    def durable_then_flipped(f: Any) -> None:
        real(f)
        with open(os.readlink(f"/proc/self/fd/{f.fileno()}"), "r+b") as g:  # the temp file, read-write
            at = g.read().find(bytes(marker.numpy()))
            assert at >= 0
            g.seek(at + 100)
            g.write(b"\x08")  # one byte of tensor data changes; the zip still reads

    monkeypatch.setattr(checkpoint, "_durable", durable_then_flipped)
    with pytest.raises(CheckpointError) as info:
        save({"marker": marker}, target, verify=True)
    assert info.value.code == "TD656" and "does not read back as written" in str(info.value)
    assert not target.exists()


def test_load_turns_file_problems_into_codes(tmp_path: Path) -> None:
    good = tmp_path / "ckpt-1.pt"
    save(_state(), good)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError) as info:
        load(cut)
    assert info.value.code == "TD656" and "failed finding central directory" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="TD656"):
        load(empty)
    with pytest.raises(CheckpointError) as info:
        load(tmp_path / "ckpt-2.pt")
    assert info.value.code is None and "ckpt-1.pt" in str(info.value)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    html = tmp_path / "page.pt"
    html.write_text("<html>not a checkpoint</html>")
    with pytest.raises(Exception) as other:  # not a checkpoint at all: raised as torch raises it
        load(html)
    assert not isinstance(other.value, CheckpointError)
