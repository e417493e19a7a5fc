"""Which lines to look at, and which signatures match them.

Every signature's literal triggers, plus generic error words (a superset of grep's ``Error|Exception|
Traceback|Killed|signal``, for the unmatched-error report) and torchrun's summary markers, form one literal
set. A :class:`Scanner` finds them in a whole block of bytes at C speed; only the lines that hold
one (and short windows after tracebacks and summaries) are decoded and normalised in Python, and
only the signatures whose trigger was found run their regex on that line.

Scanners: Hyperscan (``hyperscan`` package, when installed: SIMD multi-literal search, used once an
input passes :data:`FAST_AFTER` bytes) and a pure-Python fallback (``bytes.find`` per literal,
fine for pasted tracebacks and small logs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..registry import Code
from ..signature import Signature

GENERIC = (
    "Error",
    "error",
    "ERROR",
    "Exception",
    "Interrupt",
    "Warning",
    "warning",
    "WARN",
    "failed",
    "Failed",
    "FAILED",
    "FAIL",
    "failure",
    "Failure",
    "fatal",
    "Fatal",
    "FATAL",
    "Traceback",
    "SIG",
    "Killed",
    "killed",
    "signal",
    "Segmentation fault",
    "core dumped",
    "Aborted",
    "errno",
    "Errno",
    "xit code",
    "xitcode",
    "xit status",
    "eturn code",
    "eturncode",
    "with code",
    "timed out",
    "No such file",
    "Permission denied",
    "Connection refused",
    "Connection reset",
    "already in use",
    "No space left",
    "Cannot allocate",
    "Too many open files",
    "Broken pipe",
    "Input/output error",
    "Read-only file system",
    "quota exceeded",
    "ut of memory",
    "command not found",
    "oom-kill",
    "Illegal instruction",
    "Floating point exception",
    "double free",
    "terminate called",
    "what():",
)
"""Literals that make a line an unmatched-error candidate (see :mod:`.relevance`, which decides).

Every word :func:`~.relevance.relevance` ranks must be here, or a line holding only that word is
never read. A training loop that prints ``MeanSquaredError 0.12`` on every line costs little: lines
of a shape already read twice are skipped (:meth:`~.stream.LineProcessor.walk`), and metric-shaped
words are not error lines."""
TRACEBACK = "Traceback (most recent call last)"
WINDOWS = {
    TRACEBACK: 64 * 1024,
    "Failures:": 64 * 1024,
    "Root Cause (first observed failure)": 32 * 1024,
    "local_rank:": 2 * 1024,
}
"""Literals after which the next N bytes are read line by line (tracebacks, torchrun's summary)."""
HIT_WINDOW = 512
"""Bytes after any other hit read line by line too (wrapped messages continue on the next line)."""
FAST_AFTER = 1024 * 1024
PROSE_WORD = 8
PROSE_LINES = 2000
"""Symptoms keyed on short common words are tried in the first this-many lines of a source only: prose
is what a report is made of, not a gigabyte of training output, where those words are on every line."""


@dataclass(frozen=True, repr=False, eq=False)
class Candidate:
    code: Code
    signature: Signature


class SignatureIndex:
    """Literal set and trigger → signatures map for a list of codes."""

    def __init__(self, codes: Iterable[Code]) -> None:
        self.codes: list[Code] = list(codes)
        literals: dict[str, list[Candidate]] = {}
        for code in self.codes:
            for sig in code.signatures:
                for trig in sig.triggers:
                    entry = literals.setdefault(trig, [])
                    if not any(c.signature is sig for c in entry):
                        entry.append(Candidate(code, sig))
        for extra in (*GENERIC, *WINDOWS):
            literals.setdefault(extra, [])
        self.literals: list[str] = list(literals)
        self.encoded: list[bytes] = [lit.encode("utf-8") for lit in self.literals]
        self.candidates: list[tuple[Candidate, ...]] = [tuple(literals[lit]) for lit in self.literals]
        # a symptom's prose words ("rank", "process") open no window: only a failure's text may wrap
        self.window: list[int] = [
            WINDOWS.get(lit, HIT_WINDOW if any(not c.signature.symptom for c in literals[lit]) else 0)
            for lit in self.literals
        ]
        self.generic: frozenset[int] = frozenset(
            i for i, lit in enumerate(self.literals) if lit in GENERIC or lit == TRACEBACK
        )
        self.cheap: frozenset[int] = frozenset(
            i for i in self.generic if not literals[self.literals[i]] and not self.window[i]
        )
        """Generic literals that only feed the unmatched-error list (repeated shapes are skipped)."""
        self.has_signature: list[bool] = [any(not c.signature.frames for c in cs) for cs in self.candidates]
        """Literals that trigger a signature tried on log lines."""
        self.has_frames: list[bool] = [any(c.signature.frames for c in cs) for cs in self.candidates]
        self.has_strong: list[bool] = [
            any(not c.signature.frames and not c.signature.symptom for c in cs) for cs in self.candidates
        ]
        """Literals that trigger a signature naming a failure (not only a symptom's broad prose words)."""
        """Literals that trigger a ``frames=True`` signature (tried on a cut traceback's last source line)."""
        self._fast: Scanner | None = None
        self._slow: Scanner | None = None

    def signatures_for(self, ids: Iterable[int], frames: bool = False, prose: bool = True) -> list[Candidate]:
        """The signatures these literals trigger: those tried on log lines, or (``frames``) the
        ``frames=True`` ones. Without ``prose``, symptoms triggered only by a short, common word
        (:data:`PROSE_WORD` characters or fewer: "rank", "GPU") are left out."""
        seen: set[int] = set()
        out: list[Candidate] = []
        for i in sorted(ids):
            common = len(self.literals[i]) <= PROSE_WORD
            for cand in self.candidates[i]:
                if not prose and common and cand.signature.symptom:
                    continue
                if cand.signature.frames == frames and id(cand.signature) not in seen:
                    seen.add(id(cand.signature))
                    out.append(cand)
        return out

    def ids_in(self, text: str) -> set[int]:
        """Literal ids present in ``text`` (used for joined wrapped lines): one scan, not one test per literal."""
        data = text.encode("utf-8", "replace")
        return {i for _, i in self.scanner(None).scan(data, 0, len(data))}

    def scanner(self, size_hint: int | None) -> Scanner:
        if size_hint is not None and size_hint < FAST_AFTER:
            return self.slow_scanner()
        if self._fast is None:
            self._fast = HyperscanScanner.create(self.encoded) or self.slow_scanner()
        return self._fast

    def slow_scanner(self) -> Scanner:
        if self._slow is None:
            self._slow = FindScanner(self.encoded)
        return self._slow


class Scanner:
    name = "abstract"

    def scan(self, data: bytes, start: int, end: int) -> list[tuple[int, int]]:
        """``(offset, literal id)`` for every literal occurrence in ``data[start:end]``, any order."""
        raise NotImplementedError


class FindScanner(Scanner):
    """Pure Python: one ``bytes.find`` pass per literal (C speed each; fine below a few MB)."""

    name = "python"

    def __init__(self, literals: Sequence[bytes]) -> None:
        self.literals = list(enumerate(literals))

    def scan(self, data: bytes, start: int, end: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        find = data.find
        for i, lit in self.literals:
            pos = find(lit, start, end)
            while pos >= 0:
                out.append((pos, i))
                pos = find(lit, pos + 1, end)
        return out


class HyperscanScanner(Scanner):
    """Hyperscan block-mode database of all literals; scans release the GIL."""

    name = "hyperscan"

    def __init__(self, db: Any) -> None:
        self.db = db

    @classmethod
    def create(cls, literals: Sequence[bytes]) -> HyperscanScanner | None:
        try:
            import hyperscan
        except ImportError:
            return None
        try:
            db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            db.compile(
                expressions=[re.escape(lit) for lit in literals],
                ids=list(range(len(literals))),
                elements=len(literals),
                flags=[0] * len(literals),
            )
        except Exception:  # noqa: BLE001 - any failure: fall back to the pure-Python scanner
            return None
        return cls(db)

    def scan(self, data: bytes, start: int, end: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []

        def on_match(i: int, _from: int, to: int, _flags: int, _ctx: Any) -> None:
            out.append((start + to - 1, i))

        view = memoryview(data)[start:end]
        try:
            self.db.scan(view, match_event_handler=on_match)
        finally:
            view.release()
        return out


def match_line(
    index: SignatureIndex, ids: Iterable[int], texts: Sequence[str], cut: bool = False, prose: bool = True
) -> list[tuple[Candidate, dict[str, str]]]:
    """Signatures (with extracted values) matching a line, tried on each of its ``texts`` forms;
    ``cut``: the line is known to end early (see :meth:`~torchdoctor.signature.Signature.match`)."""
    found: list[tuple[Candidate, dict[str, str]]] = []
    for cand in index.signatures_for(ids, prose=prose):
        for text in texts:
            values = cand.signature.match(text, cut)
            if values is not None:
                found.append((cand, values))
                break
    return found


def match_frames(
    index: SignatureIndex, ids: Iterable[int], tail: Sequence[str]
) -> list[tuple[Candidate, dict[str, str]]]:
    """``frames=True`` signatures matching the end of a cut traceback (``tail``: its last kept lines)."""
    found: list[tuple[Candidate, dict[str, str]]] = []
    for cand in index.signatures_for(ids, frames=True):
        values = cand.signature.match_frames(tail)
        if values is not None:
            found.append((cand, values))
    return found
