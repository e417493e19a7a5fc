"""What reading keeps: events (matched lines), grouped per (code, role) and per rank, in bounded memory.

:class:`Collector` is filled by :mod:`.stream` and read by :mod:`.triage`; its size does not grow
with the input (evidence, timelines and rank records are capped).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..signature import Signature
from .match import Candidate
from .model import LineRef
from .normalize import RankFailure, Time
from .relevance import UnmatchedStore

MAX_EVIDENCE = 6
MAX_RANKS = 20_000
"""Ranks with a per-rank record; further ranks are only counted."""
MAX_GROUP_RANKS = 65_536
"""Ranks listed per diagnosis (memory stays bounded whatever the rank count; a note says when cut)."""
TIMELINE = 8
HEAD_BYTES = 256 * 1024


@dataclass(repr=False, eq=False)
class Event:
    code: str
    role: str
    confidence: float
    values: dict[str, str]
    ref: LineRef
    time: Time | None
    seq: tuple[int, int]
    traceback: tuple[str, ...] = ()
    how: str = ""
    """``cut-traceback`` for a ``frames=True`` match on a cut traceback; empty for a log line."""
    joined: LineRef | None = None
    """The continuation line (without a prefix of its own) that a wrapped match was joined with."""
    signature: Signature | None = None
    """The signature that matched (kept for :func:`torchdoctor.explain.shows`)."""


Matches = list[tuple[Candidate, dict[str, str]]]


@dataclass(repr=False, eq=False)
class Group:
    """Every event of one (code, role), bounded: counts, ranks, the first few as evidence."""

    code: str
    role: str
    confidence: float
    first: Event
    count: int = 0
    evidence: list[Event] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    earliest_time: Event | None = None

    def add(self, ev: Event) -> None:
        self.count += 1
        self.confidence = max(self.confidence, ev.confidence)
        new_rank = ev.ref.rank is not None and ev.ref.rank not in self.ranks
        if ev.ref.rank is not None and len(self.ranks) < MAX_GROUP_RANKS:
            self.ranks.add(ev.ref.rank)
        if len(self.evidence) < MAX_EVIDENCE and (new_rank or len(self.evidence) < 2):
            self.evidence.append(ev)
        if ev.time is not None and (self.earliest_time is None or _before(ev.time, self.earliest_time.time)):
            self.earliest_time = ev
        if ev.seq < self.first.seq:
            self.first = ev


def _before(a: Time, b: Time | None) -> bool:
    return b is None or (a[0] == b[0] and a[1] < b[1])


@dataclass(repr=False, eq=False)
class RankRecord:
    host: str | None = None
    first: Event | None = None
    codes: dict[str, int] = field(default_factory=dict)
    timeline: list[Event] = field(default_factory=list)
    """The first :data:`TIMELINE` events of this rank, in reading order."""


@dataclass(repr=False, eq=False)
class Collector:
    groups: dict[tuple[str, str], Group] = field(default_factory=dict)
    ranks: dict[int, RankRecord] = field(default_factory=dict)
    ranks_dropped: int = 0
    failures: list[RankFailure] = field(default_factory=list)
    unmatched: UnmatchedStore = field(default_factory=UnmatchedStore)
    lines: int = 0
    bytes: int = 0
    notes: list[str] = field(default_factory=list)
    scanner: str = "python"
    cut_lines: int = 0
    """Lines longer than :data:`~.sources.MAX_LINE` read as their first and last halves."""
    skipped_repeats: int = 0
    """Error lines not read because two lines of the same shape already were."""
    head: list[tuple[str, int, str]] = field(default_factory=list)
    """``(source, first line, text)``: the first :data:`HEAD_BYTES` of each source, for the word
    guess when no signature matched (:mod:`.cues`)."""
    trace: list[Event] | None = None
    """Every event in reading order, when asked for (:func:`torchdoctor.explain.shows`; small inputs)."""

    def echo(self, key: tuple[str, str], rank: int | None, host: str | None) -> bool:
        """One more line of an existing group's failure, seen by its shape (not matched again);
        True when ``rank`` is new to the group."""
        group = self.groups.get(key)
        if group is None:
            return False
        group.count += 1
        if rank is None or rank in group.ranks:
            return False
        if len(group.ranks) < MAX_GROUP_RANKS:
            group.ranks.add(rank)
        self._count_on_rank(rank, host, key[0])
        return True

    def add(self, ev: Event) -> None:
        if self.trace is not None:
            self.trace.append(ev)
        key = (ev.code, ev.role)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(ev.code, ev.role, ev.confidence, ev)
        group.add(ev)
        if ev.ref.rank is None:
            return
        rec = self._count_on_rank(ev.ref.rank, ev.ref.host, ev.code)
        if rec is None:
            return
        if len(rec.timeline) < TIMELINE:
            rec.timeline.append(ev)
        if rec.first is None or ev.seq < rec.first.seq:
            rec.first = ev

    def _count_on_rank(self, rank: int, host: str | None, code: str) -> RankRecord | None:
        """The rank's record with one more line of ``code``; None past :data:`MAX_RANKS` (counted as dropped)."""
        rec = self.ranks.get(rank)
        if rec is None:
            if len(self.ranks) >= MAX_RANKS:
                self.ranks_dropped += 1
                return None
            rec = self.ranks[rank] = RankRecord()
        rec.host = rec.host or host
        rec.codes[code] = rec.codes.get(code, 0) + 1
        return rec
