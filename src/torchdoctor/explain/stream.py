"""Reading sources line by line where it matters: stitching tracebacks, matching, collecting.

:func:`read_all` drives each :class:`~.sources.Source` through :func:`~.sources.blocks`, the
literal :class:`~.match.Scanner` and :class:`LineProcessor`. Only lines holding a literal, and the
lines in a short window after a traceback start or a torchrun summary, are decoded; everything a
report needs is kept in a :class:`Collector` whose size does not grow with the input.

Streams: lines are grouped by (source, rank), so a rank-prefixed traceback interleaved with other
ranks' lines is stitched from its own rank's lines only. The frames and source lines inside an open
traceback are never matched against signatures (``torch.save(...)`` in a frame is code, not an
error); the exception line that closes it is, and carries the traceback. Tracebacks chained by
"During handling of the above exception", "The above exception was the direct cause" or
DataLoader's "Original Traceback" share a chain id, so a match explains the unmatched error lines
of its whole chain (and those a few lines around it on its rank): what stays unexplained is what
the report shows next to a named root cause.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from .match import FAST_AFTER, TRACEBACK, SignatureIndex, match_line
from .model import LineRef
from .normalize import NormLine, RankFailure, SummaryTracker, Time, normalize, unflatten
from .relevance import (
    UnmatchedStore,
    is_chain_marker,
    looks_like_exception_line,
    relevance,
)
from .sources import MAX_LINE, Block, Source, TruncatedInput, blocks, prefetch

TB_KEEP_HEAD = 2
TB_KEEP_TAIL = 14
TB_MAX_LINES = 2000
"""A traceback longer than this is treated as truncated (its exception line never came)."""
MAX_EVIDENCE = 6
MAX_RANKS = 20_000
"""Ranks with a per-rank record; further ranks are only counted."""
TIMELINE = 8
PREFETCH_OVER = 16 * 1024 * 1024
TIE_BEFORE = 3
"""Unmatched error lines up to this many lines before a matched signature (same rank) belong to it."""
TIE_AFTER = 4
"""... and up to this many lines after it (the rest of a multi-line message, its echo)."""
RECENT = 8

_CARETS_RE = re.compile(r"[\^~ ]+")
_BOX = ("│", "╭", "╰", "┃")
"""rich's boxed tracebacks (accelerate, typer): every frame line starts with one of these."""


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
        if ev.ref.rank is not None and len(self.ranks) < 1_000_000:
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
    skipped_repeats: int = 0
    """Error lines not read because two lines of the same shape already were."""

    def add(self, ev: Event) -> None:
        key = (ev.code, ev.role)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(ev.code, ev.role, ev.confidence, ev)
        group.add(ev)
        rank = ev.ref.rank
        if rank is None:
            return
        rec = self.ranks.get(rank)
        if rec is None:
            if len(self.ranks) >= MAX_RANKS:
                self.ranks_dropped += 1
                return
            rec = self.ranks[rank] = RankRecord()
        rec.host = rec.host or ev.ref.host
        rec.codes[ev.code] = rec.codes.get(ev.code, 0) + 1
        if len(rec.timeline) < TIMELINE:
            rec.timeline.append(ev)
        if rec.first is None or ev.seq < rec.first.seq:
            rec.first = ev


@dataclass(repr=False, eq=False)
class StreamState:
    tb: list[str] | None = None
    tb_indent: int = 0
    tb_start: int = 0
    tb_lines: int = 0
    closed_tb: tuple[str, ...] = ()
    closed_at: int = -10
    pending: tuple[NormLine, int] | None = None
    last_time: Time | None = None
    chain: int | None = None
    """Id of the current (or last closed) traceback chain: tracebacks joined by "During handling of
    the above exception" or "The above exception was the direct cause" share one id."""
    chain_marker_at: int = -10
    last_match: tuple[int, int | None] | None = None
    """(line, chain) of the last matched signature that explains its neighbours (not advice)."""
    recent: deque[tuple[int, str, int | None]] = field(default_factory=lambda: deque(maxlen=RECENT))
    """(line, key, chain) of the last unmatched error lines not yet explained by a match."""


class LineProcessor:
    """Per-source state: torchrun summary, per-rank streams; turns lines into events."""

    def __init__(self, index: int, source: Source, sig: SignatureIndex, col: Collector) -> None:
        self.index, self.source, self.sig, self.col = index, source, sig, col
        self.summary = SummaryTracker()
        self.streams: dict[int | None, StreamState] = {}
        self.shapes: dict[bytes, int] = {}
        self.chains = 0

    # -- walking a block: which lines get decoded ------------------------------------------

    def walk(self, block: Block, hits: list[tuple[int, int]], window_left: int) -> int:
        """Feed the lines holding hits, and every line inside a window; return window bytes left."""
        data, start, end = block.data, block.start, block.end
        by_line: dict[int, set[int]] = {}
        if hits:
            rfind = data.rfind
            for pos, lit in hits:
                ls = rfind(b"\n", start, pos) + 1
                by_line.setdefault(max(start, ls), set()).add(lit)
        starts = sorted(by_line)
        k = 0
        cur, cur_line = start, block.first_line
        window_end = start + window_left
        while True:
            if cur < window_end and cur < end:
                ls = cur
            elif k < len(starts):
                ls = starts[k]
            else:
                break
            while k < len(starts) and starts[k] < ls:
                k += 1
            lineno = cur_line + (data.count(b"\n", cur, ls) if ls > cur else 0)
            le = data.find(b"\n", ls, end)
            if le < 0:
                le = end
            ids = by_line.get(ls, set())
            if k < len(starts) and starts[k] == ls:
                k += 1
            if ids and ls >= window_end and ids <= self.sig.cheap and self._seen_shape(data[ls:min(le, ls + 512)]):
                cur, cur_line = le + 1, lineno + 1
                continue
            self.feed(lineno, data[ls:min(le, ls + MAX_LINE)], ids)
            for i in ids:
                w = self.sig.window[i]
                if w and le + 1 + w > window_end:
                    window_end = le + 1 + w
            cur, cur_line = le + 1, lineno + 1
        return max(0, window_end - end)

    def _seen_shape(self, head: bytes) -> bool:
        """True when an error line of this shape (digits ignored) was already read twice."""
        shape = head.translate(None, b"0123456789")
        n = self.shapes.get(shape, 0)
        if n >= 2:
            self.col.skipped_repeats += 1
            return True
        if len(self.shapes) > 50_000:
            self.shapes.clear()
        self.shapes[shape] = n + 1
        return False

    # -- one line --------------------------------------------------------------------------

    def feed(self, lineno: int, raw: bytes, ids: set[int]) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        segs = [seg for seg in text.split("\r") if seg.strip()] if "\r" in text else [text]
        for seg in segs:
            pieces = unflatten(seg) if ("]:" in seg or TRACEBACK in seg) and len(seg) > 40 else None
            if pieces is None:
                self.line(lineno, seg, ids if len(segs) == 1 else self._ids_in(ids, seg))
                continue
            for piece in pieces:
                self.line(lineno, piece, self._ids_in(ids, piece))

    def _ids_in(self, ids: set[int], text: str) -> set[int]:
        return {i for i in ids if self.sig.literals[i] in text}

    def line(self, lineno: int, raw: str, ids: set[int]) -> None:
        src = self.source
        norm = normalize(raw, src.rank, src.host)
        self.summary.feed(norm, src.name, lineno)
        st = self.streams.get(norm.rank)
        if st is None:
            if len(self.streams) > MAX_RANKS:
                self.streams.clear()
            st = self.streams[norm.rank] = StreamState()
        if norm.time is not None:
            st.last_time = norm.time
        else:
            norm.time = st.last_time
        if is_chain_marker(norm.text):
            st.chain_marker_at = lineno
        closed = self._stitch(st, norm.text, lineno)
        seq = (self.index, lineno)
        ref = LineRef(src.name, lineno, norm.clean, norm.rank, norm.host)
        in_frames = st.tb is not None and closed is None and len(st.tb) > 1 and TRACEBACK not in norm.text
        sig_ids = [] if in_frames else [i for i in ids if self.sig.has_signature[i]]
        texts = [norm.text] if norm.clean == norm.text else [norm.text, norm.clean]
        matches = match_line(self.sig, sig_ids, texts) if sig_ids else []
        refs = [ref]
        if not matches and st.pending is not None and 0 < lineno - st.pending[1] <= 3:
            prev, prev_line = st.pending
            joined = prev.text.rstrip() + " " + norm.text.strip()
            join_ids = [i for i in self.sig.ids_in(joined) if self.sig.has_signature[i]]
            matches = match_line(self.sig, join_ids, [joined])
            if matches:
                refs = [LineRef(src.name, prev_line, prev.clean, prev.rank, prev.host), ref]
        st.pending = (norm, lineno) if sig_ids and not matches else None
        chain = st.chain if closed is not None or (st.tb is None and 0 <= lineno - st.closed_at <= 2) else None
        if matches:
            tb = closed if closed is not None else (st.closed_tb if lineno - st.closed_at <= 2 else ())
            for cand, values in matches:
                for r in refs:
                    self._rank_host(r)
                self.col.add(Event(
                    cand.code.code, cand.signature.role.value, cand.signature.confidence, values, refs[0],
                    norm.time, seq, tb,
                ))
            if any(cand.signature.role.value != "advice" for cand, _ in matches):
                self._explains_neighbours(st, lineno, chain)
            return
        if in_frames or not (ids or closed is not None):
            return
        score, wrapper = relevance(norm.text, closed is not None, trigger_hit=bool(sig_ids))
        if score:
            wrapper = wrapper or self.summary.in_entry  # torchrun's summary repeats what a rank printed
            last = st.last_match
            tied = last is not None and (
                (chain is not None and chain == last[1]) or (chain is None and 0 <= lineno - last[0] <= TIE_AFTER)
            )
            key = self.col.unmatched.add(ref, norm.text, score, wrapper, closed or (), seq, tied)
            if key is not None and not tied:
                st.recent.append((lineno, key, chain))

    def _explains_neighbours(self, st: StreamState, lineno: int, chain: int | None) -> None:
        """A match explains the unmatched error lines of its traceback chain and those just before it."""
        st.last_match = (lineno, chain)
        keep: list[tuple[int, str, int | None]] = []
        for ln, key, c in st.recent:
            if (chain is not None and c == chain) or (c is None and 0 <= lineno - ln <= TIE_BEFORE):
                self.col.unmatched.tie(key)
            else:
                keep.append((ln, key, c))
        st.recent.clear()
        st.recent.extend(keep)

    def _rank_host(self, ref: LineRef) -> None:
        if ref.rank is not None and ref.host:
            rec = self.col.ranks.get(ref.rank)
            if rec is not None and rec.host is None:
                rec.host = ref.host

    def _stitch(self, st: StreamState, text: str, lineno: int) -> tuple[str, ...] | None:
        """Track this stream's open traceback; return it when ``text`` is its exception line."""
        pos = text.find(TRACEBACK)
        if pos >= 0:
            # chained: after "During handling of the above exception..." / "The above exception was the
            # direct cause...", or DataLoader's re-raise ("Caught X in DataLoader worker" + "Original Traceback")
            chained = st.chain is not None and 0 <= lineno - st.closed_at <= 8 and (
                st.chain_marker_at >= st.closed_at or text.startswith("Original Traceback", max(0, pos - 9)))
            if not chained:
                self.chains += 1
                st.chain = self.chains
            st.tb = [text.strip()]
            st.tb_indent = len(text) - len(text.lstrip(" ")) if pos == len(text) - len(text.lstrip()) else 2
            st.tb_start, st.tb_lines = lineno, 1
            return None
        if st.tb is None:
            return None
        stripped = text.strip()
        indent = len(text) - len(text.lstrip(" "))
        st.tb_lines += 1
        if st.tb_lines > TB_MAX_LINES or lineno - st.tb_start > 20 * TB_MAX_LINES:
            st.tb = None
            return None
        frame = not stripped or indent > st.tb_indent or stripped.startswith(("File \"", "^", "~", *_BOX))
        if not frame and st.tb[-1].startswith("File \"") and not looks_like_exception_line(stripped):
            frame = True  # the source line of a frame whose indentation a paste lost
        if frame:
            if stripped and not _CARETS_RE.fullmatch(stripped):
                st.tb.append(stripped)
                if len(st.tb) > TB_KEEP_HEAD + TB_KEEP_TAIL:
                    del st.tb[TB_KEEP_HEAD]
            return None
        tb = tuple(st.tb)
        st.tb = None
        st.closed_tb, st.closed_at = tb, lineno
        return tb

    def finish(self) -> None:
        self.col.failures += self.summary.finish()


def read_all(sources: list[Source], sig: SignatureIndex, col: Collector) -> None:
    for si, src in enumerate(sources):
        proc = LineProcessor(si, src, sig, col)
        # small or unknown-size inputs start with the pure-Python scanner (no compile cost for a
        # pasted traceback); a stream that grows past FAST_AFTER switches to the fast one.
        scanner = sig.scanner(src.size if src.size is not None else 0)
        it = blocks(src.pieces())
        if src.size is None or src.size > PREFETCH_OVER:
            it = prefetch(it)
        window_left, seen = 0, 0
        try:
            for block in it:
                seen += block.end - block.start
                col.bytes += block.end - block.start
                col.lines += block.lines
                if seen > FAST_AFTER and src.size is None and scanner is sig.slow_scanner():
                    scanner = sig.scanner(None)
                hits = scanner.scan(block.data, block.start, block.end)
                window_left = proc.walk(block, hits, window_left)
        except TruncatedInput as exc:
            col.notes.append(f"{src.name}: {exc}; the lines before it were read")
        except OSError as exc:
            col.notes.append(f"{src.name}: read failed ({exc.strerror or exc}); the lines before it were read")
        proc.finish()
        if scanner.name != "python":
            col.scanner = scanner.name
