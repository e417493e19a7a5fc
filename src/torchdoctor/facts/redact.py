"""Secrets never leave the machine: environment snapshots are redacted here, in one place."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASS", "CREDENTIAL", "AUTH")
REDACTED = "<redacted>"
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def redact_value(value: str) -> str:
    """Strip credentials embedded in URLs (``https://user:pw@host``) from a non-secret variable."""
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", value)


_GPU_ID = re.compile(r"\b(?:GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f/-]*")
GPU_ID_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def anonymise_gpu_ids(value: str) -> str:
    """Replace GPU/MIG UUIDs in a device list with stable stand-ins (prefix kept for readability)."""
    return _GPU_ID.sub(lambda m: f"{m.group(0)[:3]}-{anonymise(m.group(0))}", value)


def redact_env(env: Mapping[str, str], gpu_ids: bool = True) -> dict[str, str]:
    """Secrets by name replaced; credentials in URLs removed; GPU UUIDs anonymised when ``gpu_ids``."""
    out = {}
    for k, v in sorted(env.items()):
        if is_secret_name(k):
            out[k] = REDACTED
        elif gpu_ids and k in GPU_ID_VARIABLES:
            out[k] = anonymise_gpu_ids(v)
        else:
            out[k] = redact_value(v)
    return out


def anonymise(identifier: str, salt: str = "torchdoctor") -> str:
    """A stable stand-in for a hardware identifier (GPU UUID, serial): same input, same output."""
    digest = hashlib.sha256(f"{salt}:{identifier}".encode()).hexdigest()[:12]
    return f"anon-{digest}"
