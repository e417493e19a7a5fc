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

Three refinements, each opted into or bounded:

* a traceback cut before its exception line (a paste that stops at a frame) is closed by a line that
  is not an exception line, by a new ``Traceback`` header, or by the end of the input; its last
  source line is then tried against the ``frames=True`` signatures only (``raise _env_error("RANK")``);
* a signature with ``context=(...)`` matches only an exception line whose traceback holds one of
  those literals (a ``FileNotFoundError`` raised inside ``shutil.rmtree``'s walk);
* a wrapped line is joined with its continuation on the same rank (up to 3 lines later); a
  continuation without any prefix (a terminal wrapped ``[rank2]: ... WorkNCCL(SeqNum=4, OpTy`` before
  ``pe=BROADCAST, ...``) is joined with the line just before it on the rank that printed it, when
  that line held a trigger but did not match, does not end a sentence, and the join matches. The
  diagnosis keeps that rank and line; a note names the continuation's line. A continuation holds no
  literal when the wrap split the trigger (``... Buy new`` + ``RAM! at ...``): an error line that does
  not end a sentence has the next line read all the same, one line at a time. A head may hold no
  literal either (``[.../pair.cc:761] connect [127.0.1.1]:60817:`` + ``Connection refused``): a line
  whose trigger did not match is then joined with the line before it, read back from the block.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field, replace

from ..signature import Role
from .collect import HEAD_BYTES, MAX_RANKS, Collector, Event, Matches
from .match import FAST_AFTER, PROSE_LINES, TRACEBACK, Scanner, SignatureIndex, match_frames, match_line
from .model import LineRef
from .normalize import NormLine, SummaryTracker, Time, normalize, unflatten
from .relevance import (
    is_chain_marker,
    looks_like_exception_line,
    relevance,
)
from .repeats import RepeatFilter
from .sources import MAX_LINE, Block, Source, TruncatedInput, blocks, cut_long, prefetch

TB_KEEP_HEAD = 2
TB_KEEP_TAIL = 14
TB_MAX_LINES = 2000
"""A traceback longer than this is treated as truncated (its exception line never came)."""
PREFETCH_OVER = 16 * 1024 * 1024
TIE_BEFORE = 3
"""Unmatched error lines up to this many lines before a matched signature (same rank) belong to it."""
TIE_AFTER = 4
"""... and up to this many lines after it (the rest of a multi-line message, its echo)."""
RECENT = 8
MAX_JOINED = 2048
"""A wrapped message is joined over its continuation lines up to this many characters."""
CUT_WIDTH = 120
"""A line at least this long that ends inside a signature's pattern may have been cut (see _flush_cut)."""

_CARETS_RE = re.compile(r"[\^~ ]+")
_BOX = ("│", "╭", "╰", "┃")
"""rich's boxed tracebacks (accelerate, typer): every frame line starts with one of these."""


@dataclass(repr=False, eq=False)
class StreamState:
    tb: list[str] | None = None
    tb_indent: int = 0
    tb_start: int = 0
    tb_lines: int = 0
    closed_tb: tuple[str, ...] = ()
    closed_at: int = -10
    pending: tuple[NormLine, int, bool] | None = None
    """A line that may continue on the next one: (line, number, whether it holds a signature trigger)."""
    last_time: Time | None = None
    chain: int | None = None
    """Id of the current (or last closed) traceback chain: tracebacks joined by "During handling of
    the above exception" or "The above exception was the direct cause" share one id."""
    chain_marker_at: int = -10
    last_match: tuple[int, int | None] | None = None
    """(line, chain) of the last matched signature that explains its neighbours (not advice)."""
    recent: deque[tuple[int, str, int | None]] = field(default_factory=lambda: deque(maxlen=RECENT))
    """(line, key, chain) of the last unmatched error lines not yet explained by a match."""
    cut: tuple[NormLine, int, tuple[int, ...], tuple[str, ...]] | None = None
    """The open traceback's last source line when it holds a ``frames=True`` trigger: (line, number,
    literal ids, the traceback so far), tried if the traceback turns out to be cut there."""


class LineProcessor:
    """Per-source state: torchrun summary, per-rank streams; turns lines into events."""

    def __init__(self, index: int, source: Source, sig: SignatureIndex, col: Collector) -> None:
        self.index, self.source, self.sig, self.col = index, source, sig, col
        self.summary = SummaryTracker()
        self.streams: dict[int | None, StreamState] = {}
        self.shapes: dict[bytes, int] = {}
        self.chains = 0
        self.prev: tuple[int | None, int] | None = None
        """(stream, line number) of the last line read: where a continuation without prefix belongs."""
        self.repeats: RepeatFilter | None = None
        """Told of each line that showed a failure, to return its later echoes (see :meth:`echo`)."""
        self.failed: list[tuple[str, str]] = []
        """Group keys of the failures (root causes, cascades) the line being read showed."""
        self.lookahead = False
        """The line just read may continue on the next one (see :meth:`walk`): read that one too."""
        self.before: tuple[int, bytes, int, int] | None = None
        """Where the line being fed sits: (its number, block data, block start, line start), so that
        the line before it can be read back (:meth:`_join_before`)."""

    # -- walking a block: which lines get decoded ------------------------------------------

    def walk(self, block: Block, hits: list[tuple[int, int]], window_left: int, extend: bool = True) -> int:
        """Feed the lines holding hits, and every line inside a window; return window bytes left.

        ``extend=False`` for lines read only because a window covers them although their shape
        repeats (see :func:`_read_block`): they are read, but open no window of their own, so a
        line repeated every few lines cannot chain windows over the whole log (a failure every
        rank prints is still counted on every rank: see :meth:`echo`)."""
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
            if ids and ls >= window_end and ids <= self.sig.cheap and self._seen_shape(data[ls : min(le, ls + 512)]):
                cur, cur_line = le + 1, lineno + 1
                continue
            self.failed = []
            self.lookahead = False
            self.before = (lineno, data, start, ls)
            if le - ls > MAX_LINE:
                self.col.cut_lines += 1
                self.feed(lineno, cut_long(data[ls:le]), ids)
            else:
                self.feed(lineno, data[ls:le], ids)
            self.before = None
            if self.failed and self.repeats is not None:
                self.repeats.watch(data[ls:le], tuple(self.failed))
            for i in ids if extend else ():
                w = self.sig.window[i]
                if w and le + 1 + w > window_end:
                    window_end = le + 1 + w
            if self.lookahead and extend and le + 2 > window_end:
                # an error line that may be wrapped: its continuation holds no literal of its own
                # (``... Buy new`` + ``RAM! at ...``), so read the next line too, one at a time
                window_end = le + 2
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
            if pieces is not None or len(segs) > 1:
                self.before = None  # a piece of a line: the line before it is not its head
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
        prev_key, self.prev = self.prev, (norm.rank, lineno)
        st = self.streams.get(norm.rank)
        if st is None:
            if len(self.streams) > MAX_RANKS:
                self.streams.clear()
            st = self.streams[norm.rank] = StreamState()
        own_time = norm.time is not None
        if own_time:
            st.last_time = norm.time
        else:
            norm.time = st.last_time
        if is_chain_marker(norm.text):
            st.chain_marker_at = lineno
        if st.cut is not None and TRACEBACK in norm.text:
            self._try_cut(st)  # a new traceback began: the open one was cut
        closed = self._stitch(st, norm.text, lineno)
        self._track_cut(st, norm, lineno, ids, closed)
        seq = (self.index, lineno)
        ref = LineRef(src.name, lineno, norm.clean, norm.rank, norm.host)
        in_frames = st.tb is not None and closed is None and len(st.tb) > 1 and TRACEBACK not in norm.text
        sig_ids = [] if in_frames else [i for i in ids if self.sig.has_signature[i]]
        tb = closed if closed is not None else (st.closed_tb if lineno - st.closed_at <= 2 else ())
        texts = [norm.text] if norm.clean == norm.text else [norm.text, norm.clean]
        matches = _in_context(match_line(self.sig, sig_ids, texts, prose=lineno <= PROSE_LINES), tb) if sig_ids else []
        refs = [ref]
        grown = False
        # symptoms never stop a line from being the head or the tail of a wrapped message
        decisive = any(not c.signature.symptom for c, _ in matches)
        strong = any(self.sig.has_strong[i] for i in sig_ids)
        if (
            not decisive
            and strong
            and not own_time
            and not (st.pending is not None and st.pending[1] == lineno - 1)
            and self._join_before(norm, lineno, sig_ids, tb)
        ):
            return
        if not decisive and st.pending is not None and 0 < lineno - st.pending[1] <= 3:
            prev, prev_line, triggered = st.pending
            spaced = prev.text.rstrip() + " " + norm.text.strip()
            joined = (
                _in_context(self._joined([spaced, prev.text + norm.text.lstrip()]), tb)
                if triggered or _looks_cut(prev.text, norm.text)
                else []
            )
            if joined:
                matches, decisive = joined + matches, True
                refs = [LineRef(src.name, prev_line, prev.clean, prev.rank, prev.host), ref]
                st.pending = None
            elif not own_time and len(spaced) <= MAX_JOINED and _looks_cut(prev.text, norm.text):
                # a message wrapped over several lines: keep joining (the whole is tried, then cut)
                st.pending, grown = (replace(prev, text=spaced), prev_line, triggered), True
        if st.pending is not None and not grown:
            self._flush_cut(st)  # not continued by this line: it may have been cut short
        if not grown:
            # a line with a trigger that did not match, or an error line that matched nothing, may be
            # the head of a message wrapped over the next lines (a trigger split by the wrap); a head
            # without any literal is read only when its continuation holds a trigger (_join_before)
            generic = any(i in self.sig.generic for i in ids)
            wrapped_head = not decisive and (strong or (generic and not in_frames))
            st.pending = (norm, lineno, strong) if wrapped_head else None
            # its continuation may hold no literal: have it read (an error line only, not a metric)
            self.lookahead = wrapped_head and (strong or relevance(norm.text)[0] > 0) and _open_end(norm.text)
        else:
            self.lookahead = True
        if (
            not matches
            and not own_time
            and norm.rank is None
            and prev_key is not None
            and self._join_other_stream(prev_key, norm, lineno)
        ):
            return
        chain = st.chain if closed is not None or (st.tb is None and 0 <= lineno - st.closed_at <= 2) else None
        if matches:
            for r in refs:
                self._rank_host(r)
            self._add(matches, refs[0], norm.time, seq, tb)
            if _explains(matches):
                self._explains_neighbours(st, lineno, chain)
            if decisive:
                return
        if in_frames or not (ids or closed is not None):
            return
        score, wrapper = relevance(
            norm.text, closed is not None, trigger_hit=any(self.sig.has_strong[i] for i in sig_ids)
        )
        if score:
            wrapper = wrapper or self.summary.in_entry  # torchrun's summary repeats what a rank printed
            last = st.last_match
            tied = last is not None and (
                (chain is not None and chain == last[1]) or (chain is None and 0 <= lineno - last[0] <= TIE_AFTER)
            )
            key = self.col.unmatched.add(ref, norm.text, score, wrapper, closed or (), seq, tied)
            if key is not None and not tied:
                st.recent.append((lineno, key, chain))

    def _add(
        self,
        matches: Matches,
        ref: LineRef,
        time: Time | None,
        seq: tuple[int, int],
        tb: tuple[str, ...],
        how: str = "",
        joined: LineRef | None = None,
    ) -> None:
        for cand, values in matches:
            sig = cand.signature
            self.col.add(
                Event(cand.code.code, sig.role.value, sig.confidence, values, ref, time, seq, tb, how, joined, sig)
            )
            if sig.role in (Role.ROOT_CAUSE, Role.CASCADE):
                self.failed.append((cand.code.code, sig.role.value))

    def echo(self, raw: bytes, keys: tuple[tuple[str, str], ...]) -> bool:
        """A line of the same shape as one that showed these failures, not read again: only its
        rank and host are taken (every rank that printed the failure is counted and listed).
        True when it named a rank the failure had not been seen on."""
        norm = normalize(raw.decode("utf-8", "replace").rstrip("\r\n"), self.source.rank, self.source.host)
        new = False
        for key in keys:
            new = self.col.echo(key, norm.rank, norm.host) or new
        return new

    def _joined(self, texts: list[str]) -> Matches:
        """Signatures matching a wrapped line joined with its continuation (the first form that matches)."""
        for text in texts:
            ids = [i for i in self.sig.ids_in(text) if self.sig.has_signature[i]]
            found = match_line(self.sig, ids, [text], prose=False) if ids else []
            if found:
                return found
        return []

    def _flush_cut(self, st: StreamState, last: bool = False) -> None:
        """The stream's pending line (a trigger, no match) was not continued: try it as a line cut
        short (:meth:`~torchdoctor.signature.Signature.match` with ``cut``) when it is the stream's
        ``last`` line (the paste stops there) or as long as lines that trackers and terminals cut
        (:data:`CUT_WIDTH`); a shorter line in the middle of a log is taken as complete."""
        assert st.pending is not None
        prev, prev_line, _ = st.pending
        st.pending = None
        if not last and len(prev.text) < CUT_WIDTH:
            return
        tb = st.closed_tb if 0 <= prev_line - st.closed_at <= 2 else ()
        texts = [prev.text] if prev.clean == prev.text else [prev.text, prev.clean]  # clean: the head alone
        ids = [i for i in self.sig.ids_in("\n".join(texts)) if self.sig.has_signature[i]]
        found = (
            _in_context(match_line(self.sig, ids, texts, cut=True, prose=prev_line <= PROSE_LINES), tb) if ids else []
        )
        if not found:
            return
        ref = LineRef(self.source.name, prev_line, prev.clean, prev.rank, prev.host)
        self._rank_host(ref)
        self._add(found, ref, prev.time, (self.index, prev_line), tb, how="cut-line")
        for item in [r for r in st.recent if r[0] == prev_line]:  # the line itself is explained now
            st.recent.remove(item)
            self.col.unmatched.withdraw(item[1])
        if _explains(found):
            self._explains_neighbours(st, prev_line, st.chain if tb else None)

    # -- a continuation without prefix, wrapped off a rank's line ------------------------------

    def _join_other_stream(self, prev_key: tuple[int | None, int], norm: NormLine, lineno: int) -> bool:
        """Join ``norm`` (no prefix, no time of its own) with the line just before it when that line
        is another stream's pending, cut-looking line and the join matches; True when it did."""
        key, prev_line = prev_key
        pst = self.streams.get(key) if key is not None and prev_line == lineno - 1 else None
        if pst is None or pst.pending is None:
            return False  # (the previous line was that stream's: its pending ends there)
        prev, prev_line, triggered = pst.pending
        if not _looks_cut(prev.text, norm.text):
            return False
        tb = pst.closed_tb if 0 <= prev_line - pst.closed_at <= 2 else ()
        # a terminal wraps at a column: the exact concatenation first, then as words
        spaced = prev.text.rstrip() + " " + norm.text.strip()
        matches = _in_context(self._joined([prev.text + norm.text, spaced]), tb)
        if not matches:
            if len(spaced) > MAX_JOINED:
                return False
            # wrapped over more lines: keep joining on that rank's stream
            pst.pending = (replace(prev, text=prev.text + norm.text), prev_line, triggered)
            self.lookahead = True
            own = self.streams.get(None)
            if own is not None and own.pending is not None and own.pending[1] == lineno:
                own.pending = None
            self.prev = (key, lineno)
            return True
        src = self.source
        first = LineRef(src.name, prev_line, prev.clean, prev.rank, prev.host)
        self._rank_host(first)
        cont = LineRef(src.name, lineno, norm.clean, prev.rank, prev.host)
        self._add(matches, first, prev.time, (self.index, prev_line), tb, joined=cont)
        pst.pending = None
        self.prev = (key, lineno)  # the continuation belongs to that rank's stream
        if _explains(matches):
            chain = pst.chain if tb else None
            self._explains_neighbours(pst, lineno, chain)
        return True

    # -- a continuation holding the trigger, its head holding none ----------------------------

    def _join_before(self, norm: NormLine, lineno: int, sig_ids: list[int], tb: tuple[str, ...]) -> bool:
        """Join ``norm`` (a line whose trigger did not match) with the line before it, read back from
        the block, when that line may continue on this one and the join matches one of the signatures
        this line triggers (``[...pair.cc:761] connect [127.0.1.1]:60817:`` + ``Connection refused``:
        a head without any literal is not read on its own). True when it did; the match keeps the
        head's line and rank, and a note names this line."""
        before, self.before = self.before, None
        if before is None or before[0] != lineno:
            return False
        _, data, start, ls = before
        if ls <= start:
            return False  # the first line of a block: the line before it is gone
        ps = max(start, data.rfind(b"\n", start, ls - 1) + 1)
        if ls - 1 - ps > MAX_JOINED:
            return False
        src = self.source
        prev = normalize(data[ps : ls - 1].decode("utf-8", "replace").rstrip("\r\n"), src.rank, src.host)
        if (norm.rank is not None and norm.rank != prev.rank) or not _looks_cut(prev.text, norm.text):
            return False
        texts = [prev.text.rstrip() + " " + norm.text.strip(), prev.text + norm.text.lstrip()]
        matches = _in_context(match_line(self.sig, sig_ids, texts, prose=False), tb)
        matches = [(c, v) for c, v in matches if not c.signature.symptom]
        if not matches:
            return False
        first = LineRef(src.name, lineno - 1, prev.clean, prev.rank, prev.host)
        self._rank_host(first)
        cont = LineRef(src.name, lineno, norm.clean, prev.rank, prev.host)
        self._add(matches, first, prev.time or norm.time, (self.index, lineno - 1), tb, joined=cont)
        st = self.streams.get(prev.rank)
        if st is not None and _explains(matches):
            self._explains_neighbours(st, lineno, st.chain if tb else None)
        return True

    # -- tracebacks cut before their exception line ------------------------------------------

    def _track_cut(
        self, st: StreamState, norm: NormLine, lineno: int, ids: set[int], closed: tuple[str, ...] | None
    ) -> None:
        """Remember the open traceback's last source line when it holds a ``frames`` trigger; try it
        when the traceback ends without an exception line."""
        if closed is not None:
            if st.cut is not None:
                if looks_like_exception_line(norm.text):
                    st.cut = None  # closed as usual: its exception line is matched instead
                else:
                    self._try_cut(st)
            return
        if st.tb is None:
            st.cut = None  # no traceback open (or one given up as too long)
            return
        stripped = norm.text.strip()
        if not stripped or _CARETS_RE.fullmatch(stripped) or TRACEBACK in stripped:
            return
        st.cut = None
        tb = st.tb
        if len(tb) >= 2 and tb[-1] == stripped and tb[-2].startswith('File "'):
            fids = tuple(i for i in ids if self.sig.has_frames[i])
            if fids:
                st.cut = (norm, lineno, fids, tuple(tb))

    def _try_cut(self, st: StreamState) -> None:
        """The traceback ended at its last source line: try the ``frames`` signatures there."""
        assert st.cut is not None
        norm, lineno, fids, tb = st.cut
        st.cut = None
        matches = match_frames(self.sig, fids, tb)
        if not matches:
            return
        ref = LineRef(self.source.name, lineno, norm.clean, norm.rank, norm.host)
        self._rank_host(ref)
        self._add(matches, ref, norm.time, (self.index, lineno), tb, how="cut-traceback")
        if _explains(matches):
            self._explains_neighbours(st, lineno, st.chain)

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
            chained = (
                st.chain is not None
                and 0 <= lineno - st.closed_at <= 8
                and (st.chain_marker_at >= st.closed_at or text.startswith("Original Traceback", max(0, pos - 9)))
            )
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
        frame = not stripped or indent > st.tb_indent or stripped.startswith(('File "', "^", "~", *_BOX))
        if not frame and st.tb[-1].startswith('File "') and not looks_like_exception_line(stripped):
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
        for st in self.streams.values():
            if st.cut is not None:
                self._try_cut(st)
            if st.pending is not None:
                self._flush_cut(st, last=True)
        self.col.failures += self.summary.finish()


def _explains(matches: Matches) -> bool:
    """Whether a match explains the unmatched error lines around it (advice and symptoms do not)."""
    return any(cand.signature.role not in (Role.ADVICE, Role.SYMPTOM) for cand, _ in matches)


def _in_context(matches: Matches, tb: tuple[str, ...]) -> Matches:
    """Drop the matches whose signature needs a traceback context that ``tb`` does not hold."""
    return [(c, v) for c, v in matches if not c.signature.context or c.signature.in_context(tb)]


def _open_end(text: str) -> bool:
    """``text`` does not end a sentence (a wrapped line's head ends mid-sentence)."""
    t = text.rstrip()
    return bool(t) and t[-1] not in ".!?"


def _looks_cut(head: str, cont: str) -> bool:
    """``head`` may continue on the next line: it does not end a sentence, and ``cont`` does not
    start a record of its own (a traceback, a frame, an exception line)."""
    h, c = head.rstrip(), cont.strip()
    if not h or not c or (h[-1] in ".!?" and not (c[0].islower() or c[0] in "([{'\"/<`")):
        return False
    return not (c.startswith(('File "', TRACEBACK)) or _STARTS_RECORD.match(c))


_STARTS_RECORD = re.compile(
    r"(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Warning|Interrupt|Exit)\b|\[?rank\d+\]?:|\[[EWIF]\d"
    r"|frame #\d|Exception raised from "
)
"""A line that starts a record of its own (an exception, another rank's line, a glog line), not a continuation."""


def read_all(sources: list[Source], sig: SignatureIndex, col: Collector) -> None:
    for si, src in enumerate(sources):
        proc = LineProcessor(si, src, sig, col)
        repeats = proc.repeats = RepeatFilter()
        # small or unknown-size inputs start with the pure-Python scanner (no compile cost for a
        # pasted traceback); a stream that grows past FAST_AFTER switches to the fast one.
        scanner = sig.scanner(src.size if src.size is not None else 0)
        cuts = [0]
        it = blocks(src.pieces(), count=False, cuts=cuts)
        if src.size is None or src.size > PREFETCH_OVER:
            it = prefetch(it)
        window_left, seen, line = 0, 0, 1
        try:
            for block in it:
                seen += block.end - block.start
                col.bytes += block.end - block.start
                if seen > FAST_AFTER and src.size is None and scanner is sig.slow_scanner():
                    scanner = sig.scanner(None)
                if seen - (block.end - block.start) < HEAD_BYTES:
                    head = block.data[block.start : min(block.end, block.start + HEAD_BYTES)]
                    col.head.append((src.name, line, head.decode("utf-8", "replace")))
                window_left, n = _read_block(proc, scanner, repeats, block, line, window_left)
                line += n
                col.lines += n
        except TruncatedInput as exc:
            col.notes.append(f"{src.name}: {exc}; the lines before it were read")
        except OSError as exc:
            col.notes.append(f"{src.name}: read failed ({exc.strerror or exc}); the lines before it were read")
        proc.finish()
        col.cut_lines += cuts[0]
        col.skipped_repeats += repeats.skipped
        if scanner.name != "python":
            col.scanner = scanner.name


def _read_block(
    proc: LineProcessor, scanner: Scanner, repeats: RepeatFilter, block: Block, first_line: int, window_left: int
) -> tuple[int, int]:
    """Scan and walk the runs of ``block`` (its first line is number ``first_line``) that
    :class:`RepeatFilter` keeps; lines an open window covers are read even when their shape
    repeats. Returns the window bytes left after the block, and the block's newline count."""
    plan = repeats.runs(block.data, block.start, block.end)
    runs, newlines = plan.runs, plan.newlines
    block = Block(block.data, block.start, block.end, first_line, newlines)
    if runs is None:
        return proc.walk(block, scanner.scan(block.data, block.start, block.end), window_left), newlines
    data, pos, line = block.data, block.start, block.first_line

    def walk(s: int, e: int, left: int, extend: bool = True) -> int:
        nonlocal line
        n = data.count(b"\n", s, e)
        left = proc.walk(Block(data, s, e, line, n), scanner.scan(data, s, e), left, extend)
        line += n
        return left

    covered: list[tuple[int, int]] = []  # skipped lines read all the same: an open window covered them
    for s, e in [*runs, (block.end, block.end)]:
        while window_left and pos < s:  # an open window reads the skipped lines it covers
            stop = min(s, pos + window_left)
            nl = data.find(b"\n", stop - 1, s)
            stop = s if nl < 0 else nl + 1
            repeats.skipped -= data.count(b"\n", pos, stop)
            window_left = walk(pos, stop, window_left, extend=False)
            covered.append((pos, stop))
            pos = stop
        if pos < s:
            if s < e:  # line numbers matter only for a run still to read
                line += data.count(b"\n", pos, s)
            window_left = 0
        if s < e:
            window_left = walk(s, e, window_left)
        pos = max(pos, e)
    k = 0
    for s, e, shape, keys in repeats.echoes(data, block.start, block.end, plan):
        while k < len(covered) and covered[k][1] <= s:
            k += 1
        if (k == len(covered) or s < covered[k][0]) and shape in repeats.echo:
            repeats.echoed(shape, proc.echo(data[s : min(e, s + MAX_LINE)], keys))
    return window_left, newlines
