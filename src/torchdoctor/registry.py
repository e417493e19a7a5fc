"""The catalogue: one :class:`Code` declaration per failure mode, registered exactly once.

A declaration carries everything a user can ever be told about a code (title, message template,
fix, doc sections, related codes) and, for preflight codes, the pure ``check`` function that
decides from recorded :class:`~torchdoctor.facts.Facts` whether it applies. Docs
(``torchdoctor codes``, ``docs/codes.md``) are generated from these declarations.
"""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .errors import UnknownCodeError
from .families import FAMILIES
from .model import Evidence, Finding, Severity
from .signature import Signature

if TYPE_CHECKING:
    from .facts import Facts
    from .options import CheckOptions

CODE_RE = re.compile(r"^TD\d{3}$")
NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")

#: Areas group findings in the text report; the first digit of a code names its domain.
AREAS: dict[str, str] = {
    "shm": "Shared memory and IPC",
    "memory": "Memory and process limits",
    "cpu": "CPU and threads",
    "gpu": "GPUs",
    "distributed": "Distributed environment",
    "loader": "Data loading",
    "storage": "Storage and paths",
    "torchdoctor": "torchdoctor itself",
}


@dataclass(frozen=True)
class Hit:
    """What a check found: values for the code's templates, and the evidence behind them.

    ``severity`` overrides the code's default (e.g. a warning that becomes an error past a limit).
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    evidence: tuple[Evidence, ...] = ()
    severity: Severity | None = None


CheckFn = Callable[["Facts", "CheckOptions"], Iterable[Hit]]


@dataclass(frozen=True)
class Code:
    """One failure mode. Fields are public API: codes and names are never reused or renumbered."""

    code: str
    name: str
    family: str
    severity: Severity
    area: str
    title: str
    message: str
    """Template shown to the user; ``{placeholders}`` are filled from :attr:`Hit.values`."""
    fix: str
    """Concrete commands or code; may use the same placeholders."""
    meaning: str
    """What it means (doc section)."""
    why: str
    """Why it happens (doc section)."""
    false_positives: str
    """Known false positives (doc section)."""
    related: tuple[str, ...] = ()
    check: CheckFn | None = None
    signatures: tuple[Signature, ...] = ()
    """How this failure shows up in logs (``torchdoctor explain``)."""
    status: Literal["stable", "experimental", "retired"] = "stable"
    cause_follows: int = 0
    """For a wrapper error that prints its cause on the next lines (NCCL's ``Last error:`` block): how many
    lines. A more specific root cause recognised there leads instead of this code (``explain``)."""
    across_nodes: str = ""
    """For an error whose usual cause differs on a run over several machines (NCCL's 'unhandled system error': the
    network between them; 'invalid device ordinal': the global rank used as a device index): the code it is read as
    when the log shows several nodes (``explain``)."""

    def placeholders(self) -> set[str]:
        names: set[str] = set()
        for template in (self.message, self.fix):
            for _, fname, _, _ in string.Formatter().parse(template):
                if fname:
                    names.add(fname.split(".")[0].split("[")[0])
        return names

    def finding(self, hit: Hit) -> Finding:
        values = _SafeDict(hit.values)
        return Finding(
            code=self.code,
            name=self.name,
            family=self.family,
            severity=hit.severity or self.severity,
            area=self.area,
            title=self.title,
            message=string.Formatter().vformat(self.message, (), values),
            fix=string.Formatter().vformat(self.fix, (), values),
            evidence=tuple(hit.evidence),
            related=self.related,
        )

    @property
    def plain_fix(self) -> str:
        """The fix as a user reads it when no values fill its placeholders (``{{`` shown as ``{``)."""
        return string.Formatter().vformat(self.fix, (), _SafeDict())

    def crashed(self, exc: BaseException) -> Finding:
        """The finding a check becomes when it raises: about itself, never a traceback."""
        return Finding(
            code=self.code,
            name=self.name,
            family=self.family,
            severity=Severity.WARNING,
            area=self.area,
            title=self.title,
            message=f"this check could not be evaluated: {type(exc).__name__}: {exc}",
            fix="Report this as a torchdoctor bug with `torchdoctor facts --format json` attached.",
            related=self.related,
            check_error=True,
        )


class _SafeDict(dict[str, Any]):
    """Leaves an unfilled placeholder visible instead of raising KeyError."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


_REGISTRY: dict[str, Code] = {}
_BY_NAME: dict[str, Code] = {}


def register(code: Code) -> Code:
    """Add a declaration to the catalogue. Called once per code, at import of its domain module."""
    if not CODE_RE.match(code.code):
        raise ValueError(f"{code.code!r} is not of the form TDnnn")
    if not NAME_RE.match(code.name):
        raise ValueError(f"{code.name!r} is not kebab-case")
    if code.family not in FAMILIES:
        raise ValueError(f"{code.code}: unknown family {code.family!r}")
    if code.area not in AREAS:
        raise ValueError(f"{code.code}: unknown area {code.area!r}")
    if code.code in _REGISTRY or code.name in _BY_NAME:
        raise ValueError(f"{code.code}/{code.name} registered twice")
    _REGISTRY[code.code] = code
    _BY_NAME[code.name] = code
    return code


def _load(logs_only: bool = False) -> None:
    from . import catalogue

    catalogue.load(logs_only=logs_only)


def all_codes() -> list[Code]:
    _load()
    return sorted(_REGISTRY.values(), key=lambda c: c.code)


def log_codes() -> list[Code]:
    """Codes with log signatures, and the codes ``explain`` reads one of them as (:attr:`Code.across_nodes`),
    loading only the ``log_*`` catalogue modules (what ``explain`` needs)."""
    _load(logs_only=True)
    read_as = {c.across_nodes for c in _REGISTRY.values() if c.signatures and c.across_nodes}
    return sorted((c for c in _REGISTRY.values() if c.signatures or c.code in read_as), key=lambda c: c.code)


def lookup(key: str) -> Code:
    """A code by ``TDnnn`` (any case) or by name; :class:`UnknownCodeError` suggests near names."""
    _load()
    k = key.strip()
    if k.upper() in _REGISTRY:
        return _REGISTRY[k.upper()]
    if k.lower() in _BY_NAME:
        return _BY_NAME[k.lower()]
    if re.fullmatch(r"(?i)td\d{0,3}", k):
        # a partial or mistyped number: codes sharing the longest prefix are the likeliest meant
        for n in range(len(k), 1, -1):
            close = [c for c in _REGISTRY if c.startswith(k[:n].upper())][:3]
            if close:
                break
        else:
            close = []
    else:
        close = difflib.get_close_matches(k.lower(), list(_BY_NAME), n=3, cutoff=0.6)
    raise UnknownCodeError(k, close)


def select(family: str | None = None, prefix: str | None = None, area: str | None = None) -> list[Code]:
    codes = all_codes()
    if family:
        if family not in FAMILIES:
            close = difflib.get_close_matches(family, list(FAMILIES), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; families: {', '.join(FAMILIES)}"
            raise UnknownCodeError(family, close, what="family", hint=hint)
        codes = [c for c in codes if c.family == family]
    if prefix:
        codes = [c for c in codes if c.code.startswith(prefix.upper())]
    if area:
        codes = [c for c in codes if c.area == area]
    return codes
