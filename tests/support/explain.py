"""Shared pieces for the explain tests: test-only codes and builders of multi-rank logs.

The codes below are NOT in the catalogue: they let the engine tests stand on their own while the
real signatures are written elsewhere. Their patterns were written against real text in
``tests/fixtures/explain/torchrun-save-enoent`` (recorded here with torchrun, see its SOURCE.md)
and ``tests/fixtures/logs/TD150/lab-fd-queue-ancdata.log`` (recorded by the lab).
Builders only cut, re-prefix and interleave real lines; they never write error text.
"""

from __future__ import annotations

import re
from pathlib import Path

from torchdoctor.model import Severity
from torchdoctor.registry import Code, lookup
from torchdoctor.signature import Role, Signature

from . import FIXTURES

__all__ = [
    "CONSOLE",
    "FIXTURES",
    "NUMPY_WEAK",
    "PEER_CLOSED",
    "RECVFDS_FRAME",
    "REMOTE_ADVICE",
    "SAVE_MISSING",
    "TD150_LOG",
    "TORCHRUN",
    "TORCHRUN_LOGS",
    "cascade_lines",
    "fixture_body",
    "interleave",
    "rank_lines",
    "support_codes",
]
TORCHRUN = FIXTURES / "explain" / "torchrun-save-enoent"
TORCHRUN_LOGS = TORCHRUN / "logs"
CONSOLE = TORCHRUN / "console.log"
TD150_LOG = FIXTURES / "logs" / "TD150" / "lab-fd-queue-ancdata.log"


def _code(
    num: str,
    name: str,
    family: str,
    role: Role,
    triggers: tuple[str, ...],
    pattern: str,
    message: str,
    related: tuple[str, ...] = (),
    confidence: float = 0.9,
) -> Code:
    return Code(
        code=num,
        name=name,
        family=family,
        severity=Severity.ERROR,
        area="storage",
        title=name,
        message=message,
        fix=f"the fix for {name}",
        meaning="-",
        why="-",
        false_positives="-",
        related=related,
        signatures=(Signature(role=role, triggers=triggers, pattern=pattern, confidence=confidence),),
    )


SAVE_MISSING = _code(
    "TDT01",
    "save-parent-missing",
    "checkpoint-io",
    Role.ROOT_CAUSE,
    ("Parent directory",),
    r"Parent directory (?P<path>\S+) does not exist",
    "torch.save: {path} does not exist",
)
PEER_CLOSED = _code(
    "TDT02",
    "peer-closed",
    "dist-connect",
    Role.CASCADE,
    ("Connection closed by peer",),
    r"Connection closed by peer \[(?P<peer>[^\]]+)\]:(?P<port>\d+)",
    "peer {peer}:{port} went away",
)
REMOTE_ADVICE = _code(
    "TDT03",
    "check-remote-worker",
    "dist-connect",
    Role.ADVICE,
    ("Check the logs of the remote worker",),
    r"Check the logs of the remote worker",
    "gloo says: check the remote worker",
)
RECVFDS_FRAME = _code(
    "TDT04",
    "ancdata-runtime-error",
    "fd-exhausted",
    Role.CONFIRMATION,
    ("RuntimeError: received",),
    r"RuntimeError: received \d+ items",
    "descriptors were being received",
    confidence=0.6,
)
NUMPY_WEAK = _code(
    "TDT05",
    "numpy-missing-weak",
    "worker-crash",
    Role.ROOT_CAUSE,
    ("Failed to initialize NumPy",),
    r"Failed to initialize NumPy: (?P<why>.+?) \(Triggered",
    "numpy: {why}",
    confidence=0.3,
)


def support_codes() -> list[Code]:
    return [SAVE_MISSING, PEER_CLOSED, REMOTE_ADVICE, RECVFDS_FRAME, NUMPY_WEAK, lookup("TD150")]


def fixture_body(path: Path) -> list[str]:
    """The log lines of a tests/fixtures/logs fixture (after its '# ---' header)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    return lines[lines.index("# ---") + 1 :] if "# ---" in lines else lines


_PREFIX_RE = re.compile(r"^(?:\[default\d+\]:)?(?:\[rank\d+\]: )?")


def rank_lines(rank: int) -> list[str]:
    """Rank ``rank``'s own lines from the recorded torchrun console, prefixes removed."""
    out = []
    for line in CONSOLE.read_text(encoding="utf-8").split("\n"):
        if line.startswith(f"[default{rank}]:"):
            out.append(_PREFIX_RE.sub("", line))
    return out


def cascade_lines() -> list[str]:
    """A real gloo cascade (rank 3's traceback ending in 'Connection closed by peer')."""
    lines = rank_lines(3)
    start = next(i for i, line in enumerate(lines) if line.startswith("Traceback"))
    return lines[start:]


def interleave(streams: dict[int, list[str]], prefix: str = "[rank{r}]: ") -> list[str]:
    """Round-robin the ranks' lines, each with its rank prefix, as a shared console shows them."""
    out: list[str] = []
    queues = {r: list(lines) for r, lines in streams.items()}
    while any(queues.values()):
        for r in sorted(queues):
            if queues[r]:
                out.append(prefix.format(r=r) + queues[r].pop(0))
    return out
