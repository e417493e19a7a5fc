from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchdoctor.facts.mounts import mount_for, parse_mountinfo
from torchdoctor.facts.redact import anonymise, redact_env
from torchdoctor.units import human_bytes, parse_bytes

# Lines in the format of /proc/self/mountinfo (proc(5)); the first three recorded on this machine.
MOUNTINFO = """\
1 0 253:0 / / rw,relatime - ext4 /dev/vda rw
24 1 0:22 / /dev/shm rw,nosuid,nodev - tmpfs shm rw,size=65536k,inode64
30 1 0:40 / /mnt/data\\040set ro,relatime - nfs4 server:/export rw,vers=4.2
31 1 0:41 / /mnt/data\\040set/sub rw - overlay overlay rw
"""


def test_parse_mountinfo_fields_and_escapes() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert [m.mount_point for m in mounts] == ["/", "/dev/shm", "/mnt/data set", "/mnt/data set/sub"]
    shm = mounts[1]
    assert shm.fstype == "tmpfs" and shm.option("size") == "65536k" and not shm.read_only
    assert mounts[2].read_only and mounts[2].fstype == "nfs4"


def test_mount_for_picks_longest_prefix() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert mount_for("/dev/shm", mounts).fstype == "tmpfs"
    assert mount_for("/dev/shmx", mounts).mount_point == "/"
    assert mount_for("/mnt/data set/sub/a", mounts).fstype == "overlay"
    assert mount_for("/mnt/data set/b", mounts).fstype == "nfs4"


@given(st.text())
def test_parse_mountinfo_never_raises(text: str) -> None:
    mounts = parse_mountinfo(text)  # the call not raising is the property; every mount is well-formed
    assert all(m.mount_point and m.fstype for m in mounts)


@pytest.mark.parametrize(
    "text, value",
    [("4096", 4096), ("64MiB", 64 * 2**20), ("2G", 2 * 2**30), ("1.5GB", 1_500_000_000), ("512 kib", 512 * 1024)],
)
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "5 parsecs", "-1"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes(text)


def test_human_bytes() -> None:
    assert human_bytes(64 * 2**20) == "64 MiB"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(None) == "unknown"


def test_redaction_and_anonymisation() -> None:
    red = redact_env({"GITHUB_TOKEN": "x", "SSH_AUTH_SOCK": "/tmp/s", "PATH": "/bin", "URL": "s3://u:p@bucket/k"})
    assert red["GITHUB_TOKEN"] == "<redacted>" and red["SSH_AUTH_SOCK"] == "<redacted>"
    assert red["PATH"] == "/bin" and "u:p" not in red["URL"]
    assert anonymise("GPU-1234") == anonymise("GPU-1234") != anonymise("GPU-1235")
    assert "1234" not in anonymise("GPU-1234")


def test_gpu_uuids_in_device_lists_are_anonymised() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "GPU-8a3c2f1e-1234-5678-9abc-def012345678,MIG-4f1a2b3c-aaaa-bbbb-cccc-111122223333",
        "OTHER": "GPU-8a3c2f1e-1234-5678-9abc-def012345678",
    }
    red = redact_env(env)
    assert "8a3c2f1e" not in red["CUDA_VISIBLE_DEVICES"] and "4f1a2b3c" not in red["CUDA_VISIBLE_DEVICES"]
    assert red["CUDA_VISIBLE_DEVICES"].startswith("GPU-anon-") and ",MIG-anon-" in red["CUDA_VISIBLE_DEVICES"]
    assert redact_env(env, gpu_ids=False)["CUDA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"]
    assert red["CUDA_VISIBLE_DEVICES"] == redact_env(env)["CUDA_VISIBLE_DEVICES"]  # stable
