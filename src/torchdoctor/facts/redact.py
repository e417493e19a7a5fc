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


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else redact_value(v)) for k, v in sorted(env.items())}


def anonymise(identifier: str, salt: str = "torchdoctor") -> str:
    """A stable stand-in for a hardware identifier (GPU UUID, serial): same input, same output."""
    digest = hashlib.sha256(f"{salt}:{identifier}".encode()).hexdigest()[:12]
    return f"anon-{digest}"
