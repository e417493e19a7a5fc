"""Error lines that no signature explained: which ones are worth showing, and in what order.

``explain`` must be honest when it cannot name a cause: it shows the few most relevant error lines
instead of guessing, and when it does name a cause it still shows error lines the diagnosis does
not account for (a second, independent failure must stay visible).

Relevance tiers (:func:`relevance`), highest first:

* 4 the exception line that ends a Python traceback (each traceback's last line);
* 3 a named exception (``FileNotFoundError: ...``), a fatal signal (``SIGSEGV``, ``Killed``,
  ``Segmentation fault``, ``core dumped``, C++'s ``terminate called``), an errno (``[Errno 28]``) or
  its text (``No space left on device``), a negative exit code;
* 2 error words (``error``, ``failed``, ``failure``, ``fatal``, ``timed out``, a capital ``FAIL``), a non-zero exit code, and launcher
  wrappers that only say a process died (torchrun's ``ChildFailedError``, ``CalledProcessError``);
* 1 warnings (``UserWarning: ...``, ``WARNING``) and launcher noise (``Sending process N closing
  signal SIGTERM``);
* 0 not an error line: traceback frames, chain markers, metrics such as ``val_error: 0.12``.

:class:`UnmatchedStore` keeps them in bounded memory, grouped by shape (digits ignored) with the
ranks that printed them, and remembers which occurrences sit next to a matched signature (same
traceback chain, or a few lines around it on the same rank): those are explained by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .model import LineRef

MAX_KEPT = 200
"""Distinct unmatched shapes kept; past it a more relevant line evicts the least relevant one."""
KEY_CHARS = 300

_EXC_RE = re.compile(
    r"(?<![\w.])(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*(?:Error|Exception|Interrupt|Warning))(?P<colon>:|\b)"
)
_EXC_LINE_RE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::(?:\s|$)|$)")
"""The shape of the line that ends a traceback: ``Name: message`` or a bare ``Name``."""
_SIGNAL_RE = re.compile(
    r"\bSIG[A-Z]{2,7}\b|\bKilled\b|\bkilled by signal\b|Segmentation fault|core dumped|\bBus error\b|\bAborted\b|"
    r"Illegal instruction|Floating point exception|double free or corruption|terminate called after throwing|"
    r"^\s*what\(\):|invoked oom-killer|\boom-kill"
)
_STRERROR_RE = re.compile(
    r"No such file or directory|Permission denied|Connection refused|Connection reset by peer|Address already in use|"
    r"No space left on device|Cannot allocate memory|Too many open files|Broken pipe|Input/output error|"
    r"Read-only file system|Disk quota exceeded|[Oo]ut of memory|command not found"
)
"""strerror texts and shell errors: an OS error even without ``[Errno N]``."""
_ERRNO_RE = re.compile(r"\[Errno -?\d+\]|\berrno\b|\bErrno\b")
_EXIT_RE = re.compile(
    r"(?i)\b(?:exit ?code|exitcode|exit status|return ?code|terminated with code|exited with code)\b\W{0,4}(?P<code>-?\d+)"
)
_ERROR_WORD_RE = re.compile(r"\b(?i:error|failed|failure|fatal|timed out)\b|\bFAIL\b")
"""Error words; ``FAIL`` in capitals too (THC's ``THCudaCheck FAIL file=... error=38 : ...``)."""
_WARN_RE = re.compile(r"\bWARN(?:ING)?\b|(?i:\bwarning:)")
_METRIC_RE = re.compile(r"\s*[:=]\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?%?\s*(?:[,;|)\]]|\s|$)")
"""What follows an error word that is a metric name (``val_error: 0.12``, ``MeanSquaredError=3.1``)."""
_LOW_LEVEL_RE = re.compile(r"\b(?:INFO|DEBUG|TRACE)\b|^\[?[IW]\d{4} |^\[[IW] ")
"""Info and warning levels (words, or c10/glog ``[W1121 ...`` / ``[W file.cpp:12]`` headers)."""
_ERROR_HEADER_RE = re.compile(r"\[?[EF]\d{4} \d{2}:\d{2}:\d{2}|\[[EF] [\w.]+:\d+\]")
"""c10/glog error and fatal headers: ``[E1121 23:23:25.1 ...]``, ``[E ProcessGroupNCCL.cpp:916]``."""
_WRAPPER_RE = re.compile(
    r"ChildFailedError|CalledProcessError|ProcessRaisedException|ProcessExitedException|"
    r"srun: error: .*(?:Exited with exit code|Killed|terminated)|failed \(exitcode: -?\d+\) local_rank|"
    r"Child process with PID \d+ terminated with code|\bFAILED\s*$|returned non-zero exit status|"
    r"Root Cause \(first observed failure\)|no error file defined for parent"
)
"""Lines that only report that a process died: explained by any named root cause."""
_NOISE_RE = re.compile(r"Sending process \d+ closing signal|closing signal SIG")
_FRAME_PREFIXES = ('File "', "│", "╭", "╰", "^", "~")
_CHAIN_MARKERS = ("During handling of the above exception", "The above exception was the direct cause")


def _not_metric(text: str, end: int) -> bool:
    return _METRIC_RE.match(text, end) is None


def is_chain_marker(text: str) -> bool:
    return any(m in text for m in _CHAIN_MARKERS)


def looks_like_exception_line(text: str) -> bool:
    """``KeyError: 'lr'``, ``torch.cuda.OutOfMemoryError: ...`` or a bare ``SystemExit``."""
    return _EXC_LINE_RE.match(text.strip()) is not None


def relevance(text: str, closes_traceback: bool = False, trigger_hit: bool = False) -> tuple[int, bool]:
    """``(tier, wrapper)`` for one normalised line (see the module doc); tier 0: not an error line.

    ``trigger_hit``: the line holds a signature's literal trigger but its pattern did not match
    (a truncated or reworded known message): at least tier 2.
    """
    s = text.strip()
    if (
        not s
        or s.startswith(_FRAME_PREFIXES)
        or s.startswith("Traceback (most recent call last)")
        or is_chain_marker(s)
    ):
        return 0, False
    if _NOISE_RE.search(s):
        return 1, True
    if _WRAPPER_RE.search(s):
        return 2, True
    if closes_traceback and looks_like_exception_line(s):
        return (1, False) if s.split(":", 1)[0].endswith("Warning") else (4, False)
    tier = _exception_tier(s)
    if tier == 1:
        return 1, False  # a warning, whatever words its message holds
    if tier < 3 and (_SIGNAL_RE.search(s) or _ERRNO_RE.search(s) or _STRERROR_RE.search(s)):
        tier = 3
    if tier < 3:
        m = _EXIT_RE.search(s)
        if m and m["code"] != "0":
            tier = max(tier, 3 if m["code"].startswith("-") else 2)
    if tier < 2 and (trigger_hit or _ERROR_HEADER_RE.match(s) or _error_word(s)):
        tier = 2
    if tier < 1 and _WARN_RE.search(s):
        tier = 1
    if tier == 2 and not trigger_hit and _LOW_LEVEL_RE.search(s, 0, 80):
        tier = 1
    return tier, False


def _exception_tier(s: str) -> int:
    """3 for a named exception, 1 for a named warning only, 0 for neither."""
    warning = False
    for m in _EXC_RE.finditer(s):
        if m["colon"] == ":" and not _not_metric(s, m.end("name")):
            continue
        if m["colon"] != ":" and m.start() > 0:
            continue  # a bare class name inside prose ("uses RuntimeError") is not an exception line
        if m["name"].endswith("Warning"):
            warning = True
            continue
        return 3
    return 1 if warning else 0


def _error_word(s: str) -> bool:
    return any(_not_metric(s, m.end()) for m in _ERROR_WORD_RE.finditer(s))


@dataclass(repr=False, eq=False)
class Unmatched:
    """One shape of unmatched error line: its first occurrence, how often, on which ranks."""

    score: int
    ref: LineRef
    seq: tuple[int, int]
    traceback: tuple[str, ...] = ()
    wrapper: bool = False
    count: int = 0
    free: int = 0
    """Occurrences no matched signature sits next to (0: every occurrence is explained)."""
    ranks: set[int] = field(default_factory=set)


@dataclass(repr=False, eq=False)
class UnmatchedStore:
    items: dict[str, Unmatched] = field(default_factory=dict)
    limit: int = MAX_KEPT

    @staticmethod
    def key(text: str) -> str:
        return _DIGITS_RE.sub("N", text.strip())[:KEY_CHARS]

    def add(
        self, ref: LineRef, text: str, score: int, wrapper: bool, tb: tuple[str, ...], seq: tuple[int, int], tied: bool
    ) -> str | None:
        """Record one occurrence of ``text`` (the line without prefixes; ``ref`` shows it as read).

        Returns its key, or None when it was dropped as less relevant than everything kept.
        """
        key = self.key(text)
        item = self.items.get(key)
        if item is None:
            if len(self.items) >= self.limit and not self._evict_below(score):
                return None
            item = self.items[key] = Unmatched(score, ref, seq, tb, wrapper)
        else:
            item.score = max(item.score, score)
            item.wrapper = item.wrapper and wrapper
        item.count += 1
        if not tied:
            item.free += 1
        if not item.traceback and tb:
            item.traceback = tb
        if ref.rank is not None and len(item.ranks) < 10_000:
            item.ranks.add(ref.rank)
        return key

    def withdraw(self, key: str) -> None:
        """One occurrence of ``key`` was matched after all (a line found to be cut short): not unmatched."""
        item = self.items.get(key)
        if item is None:
            return
        item.count -= 1
        item.free = max(0, item.free - 1)
        if item.count <= 0:
            del self.items[key]

    def tie(self, key: str) -> None:
        """One earlier occurrence of ``key`` turned out to sit next to a matched signature."""
        item = self.items.get(key)
        if item is not None and item.free > 0:
            item.free -= 1

    def _evict_below(self, score: int) -> bool:
        worst = min(self.items, key=lambda k: (self.items[k].score, -self.items[k].seq[0], -self.items[k].seq[1]))
        if self.items[worst].score >= score:
            return False
        del self.items[worst]
        return True

    def ranked(self, named_cause: bool) -> list[Unmatched]:
        """Most relevant first (tier, then reading order); with a named cause, only unexplained ones."""
        kept = [u for u in self.items.values() if u.score > 0]
        if named_cause:
            kept = [u for u in kept if u.score >= 2 and u.free > 0 and not u.wrapper]
        return sorted(kept, key=lambda u: (-u.score, u.seq))


_DIGITS_RE = re.compile(r"\d+")
