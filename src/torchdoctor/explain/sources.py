"""Where log text comes from: files, directories, stdin, strings, bytes, iterables of lines.

Everything becomes a :class:`Source` whose :meth:`Source.pieces` yields raw byte pieces of any
size; :func:`blocks` turns pieces into :class:`Block` s that end on a line boundary, so memory stays
bounded by the piece size whatever the input size. Gzip is recognised by its magic bytes, never by
the file name. A line longer than :data:`MAX_LINE` keeps its first :data:`MAX_LINE` bytes.

Directory layouts understood (rank and host are taken from the path when the lines do not say):

* torchrun ``--log-dir``: ``<dir>/<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log`` and the
  torchelastic ``error.json`` next to them (its ``message`` holds the failing rank's traceback);
* file names that carry a rank: ``rank3.log``, ``rank_3.out``, ``log.rank-3.txt``;
* Slurm ``slurm-<jobid>.out`` and anything else named ``*.log``, ``*.out``, ``*.err``, ``*.txt``
  (also gzipped), ``stdout*``, ``stderr*``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import UsageError

MAX_LINE = 64 * 1024
"""Bytes of one line that are kept; the rest of a longer line is skipped (constant memory)."""
PIECE = 4 * 1024 * 1024
"""Bytes read at a time."""
ERROR_JSON_MAX = 16 * 1024 * 1024

_GZIP_MAGIC = b"\x1f\x8b"
_LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
_TORCHRUN_RE = re.compile(r"attempt_\d+[/\\](\d+)[/\\](?:stdout\.log|stderr\.log|error\.json)(?:\.gz)?$")
_RANK_NAME_RE = re.compile(r"(?i)rank[_.-]?(\d{1,6})(?!\d)")


@dataclass(frozen=True, repr=False, eq=False)
class Block:
    """Whole lines ``data[start:end]`` (ending in a newline, except maybe the very last block)."""

    data: bytes
    start: int
    end: int
    first_line: int
    """1-based number of the first line in the block."""
    lines: int
    """Newlines in ``data[start:end]``."""


@dataclass(repr=False, eq=False)
class Source:
    """One input stream with the rank and host its location implies (None when unknown)."""

    name: str
    opener: Callable[[], Iterator[bytes]]
    rank: int | None = None
    host: str | None = None
    size: int | None = None
    error_json: bool = False

    def pieces(self) -> Iterator[bytes]:
        return self.opener()


# --------------------------------------------------------------------------- resolving inputs


def rank_from_path(path: str) -> int | None:
    """The rank a path implies: torchrun's ``attempt_N/<local_rank>/`` or a ``rankN`` file name."""
    norm = path.replace("\\", "/")
    m = _TORCHRUN_RE.search(norm)
    if m:
        return int(m.group(1))
    m = _RANK_NAME_RE.search(os.path.basename(norm))
    return int(m.group(1)) if m else None


def is_log_name(name: str) -> bool:
    """Whether a file met while walking a directory is read (explicit files are always read)."""
    low = name.lower()
    if low.startswith("."):
        return False
    low = low.removesuffix(".gz")
    if low == "error.json" or low.endswith(("_error.json", "-error.json")):
        return True
    return low.endswith(_LOG_SUFFIXES) or low.startswith(("stdout", "stderr"))


def walk(directory: Path) -> list[Path]:
    """Log files under ``directory``, in a stable (sorted) order, hidden entries skipped."""
    found: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root) / f for f in sorted(files) if is_log_name(f) and os.path.isfile(os.path.join(root, f))]
    return found


def file_source(path: Path, display: str | None = None) -> Source:
    name = display or str(path)
    try:
        size = path.stat().st_size
    except OSError:
        size = None
    if path.name.lower() in ("error.json", "error.json.gz") or path.name.lower().endswith(("_error.json", "-error.json")):
        return Source(name, lambda: error_json_pieces(path), rank=rank_from_path(name), size=size, error_json=True)
    return Source(name, lambda: file_pieces(path), rank=rank_from_path(name), size=size)


def resolve(inputs: Iterable[str | os.PathLike[str]]) -> list[Source]:
    """Sources for CLI-style inputs: paths, directories (walked), ``-`` for stdin.

    Raises :class:`UsageError` with one line for a missing path or a directory with no logs.
    """
    sources: list[Source] = []
    for item in inputs:
        text = os.fspath(item)
        if text == "-":
            sources.append(Source("<stdin>", _stdin_pieces))
            continue
        path = Path(text)
        if path.is_dir():
            files = walk(path)
            if not files:
                raise UsageError(f"no log files under {text} (looked for *.log, *.out, *.err, *.txt, stdout*, stderr*, error.json, also gzipped)")
            sources += [file_source(f) for f in files]
        elif path.exists():
            if not os.access(path, os.R_OK):
                raise UsageError(f"cannot read {text}: permission denied")
            sources.append(file_source(path))
        else:
            raise UsageError(f"no such file or directory: {text}")
    return sources


def _stdin_pieces() -> Iterator[bytes]:
    stdin: Any = sys.stdin
    if stdin is None:  # no standard input at all (daemonised): nothing to read
        return iter(())
    return stream_pieces(stdin.buffer if hasattr(stdin, "buffer") else stdin)


def text_source(data: str | bytes, name: str = "<text>") -> Source:
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)
    return Source(name, lambda: _maybe_gunzip_bytes(raw), size=len(raw))


def lines_source(lines: Iterable[str | bytes], name: str = "<lines>") -> Source:
    def gen() -> Iterator[bytes]:
        buf: list[bytes] = []
        size = 0
        for line in lines:
            b = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else bytes(line)
            if not b.endswith(b"\n"):
                b += b"\n"
            buf.append(b)
            size += len(b)
            if size >= PIECE:
                yield b"".join(buf)
                buf, size = [], 0
        if buf:
            yield b"".join(buf)

    return Source(name, gen)


# --------------------------------------------------------------------------- reading bytes


def _maybe_gunzip_bytes(raw: bytes) -> Iterator[bytes]:
    if raw[:2] == _GZIP_MAGIC:
        yield from _gunzip(iter([raw]))
    else:
        for i in range(0, len(raw), PIECE):
            yield raw[i:i + PIECE]


def file_pieces(path: Path) -> Iterator[bytes]:
    with open(path, "rb", buffering=0) as fh:
        yield from stream_pieces(fh)


def stream_pieces(fh: IO[bytes]) -> Iterator[bytes]:
    """Pieces of a binary stream; gunzipped on the fly when it starts with the gzip magic."""
    first = fh.read(PIECE)
    if not first:
        return
    rest = iter(lambda: fh.read(PIECE), b"")
    if first[:2] == _GZIP_MAGIC:
        yield from _gunzip(_chain(first, rest))
    else:
        yield first
        yield from rest


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


class TruncatedInput(Exception):
    """A gzip stream ended early or is corrupt; what was read before it still counts."""


def _gunzip(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """Decompress (concatenated) gzip members with bounded output per step."""
    import zlib

    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    fed = False
    for piece in pieces:
        data = piece
        while data:
            fed = True
            try:
                out = d.decompress(data, PIECE)
            except zlib.error as exc:
                raise TruncatedInput(f"gzip data is corrupt ({exc})") from None
            if out:
                yield out
            data = d.unconsumed_tail
            while not data and len(out) == PIECE and not d.eof:
                out = d.decompress(b"", PIECE)  # output still pending inside zlib
                if out:
                    yield out
            if d.eof:
                data = d.unused_data + data
                d, fed = zlib.decompressobj(16 + zlib.MAX_WBITS), False
                if data[:2] != _GZIP_MAGIC:
                    return  # padding or garbage after the last member
    if fed and not d.eof:
        tail = d.flush()
        if tail:
            yield tail
        raise TruncatedInput("gzip data ends early (truncated file)")


def error_json_pieces(path: Path) -> Iterator[bytes]:
    """The lines a torchelastic ``error.json`` holds: the traceback, else the message.

    ``{"message": {"message": "RuntimeError: ...", "extraInfo": {"py_callstack": "Traceback ...",
    "timestamp": "1700000000"}}}`` (torch/distributed/elastic/multiprocessing/errors/error_handler.py).
    A file that is not such JSON is read as plain text.
    """
    raw = b"".join(file_pieces(path)) if _size(path) <= ERROR_JSON_MAX else b""
    text = error_json_text(raw) if raw else None
    if text is None:
        yield from file_pieces(path)
        return
    yield text.encode("utf-8", "surrogateescape")


def error_json_text(raw: bytes) -> str | None:
    import json

    try:
        doc = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or "message" not in doc:
        return None
    msg = doc["message"]
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        stack = extra.get("py_callstack") if extra else None
        body = stack if isinstance(stack, str) and stack.strip() else msg.get("message")
        head = f"torchelastic error.json timestamp {extra.get('timestamp')}\n" if extra and extra.get("timestamp") else ""
        return head + (str(body) if body is not None else "")
    return str(msg)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# --------------------------------------------------------------------------- blocks of whole lines


def blocks(pieces: Iterable[bytes], max_line: int = MAX_LINE) -> Iterator[Block]:
    """Whole-line blocks from arbitrary pieces; a line past ``max_line`` bytes is cut there.

    The partial line carried between pieces never exceeds ``max_line``; a longer line's tail is
    skipped up to its newline, so line numbers stay right. Memory: one piece plus ``max_line``.
    """
    carry = b""
    skipping = False
    line = 1
    for piece in pieces:
        pos = 0
        if skipping:
            nl = piece.find(b"\n")
            if nl < 0:
                continue
            pos, skipping = nl + 1, False
        if carry:
            nl = piece.find(b"\n", pos)
            room = max_line - len(carry)
            if nl < 0:
                carry += piece[pos:pos + room]
                if len(piece) - pos > room:
                    yield Block(carry + b"\n", 0, len(carry) + 1, line, 1)
                    line, carry, skipping = line + 1, b"", True
                continue
            head = carry + piece[pos:min(nl, pos + room)] + b"\n"
            yield Block(head, 0, len(head), line, 1)
            line, carry, pos = line + 1, b"", nl + 1
        last = piece.rfind(b"\n", pos)
        if last >= 0:
            n = piece.count(b"\n", pos, last + 1)
            yield Block(piece, pos, last + 1, line, n)
            line, pos = line + n, last + 1
        if len(piece) - pos > max_line:
            yield Block(piece[pos:pos + max_line] + b"\n", 0, max_line + 1, line, 1)
            line, skipping = line + 1, True
        else:
            carry = piece[pos:]
    if carry:
        yield Block(carry + b"\n", 0, len(carry) + 1, line, 1)


def prefetch(it: Iterator[Block], depth: int = 2) -> Iterator[Block]:
    """Run ``it`` in a background thread (reading and counting overlap the scan), ``depth`` ahead.

    The thread stops as soon as the consumer does (``stop``), so it never blocks on a full queue.
    """
    import queue
    import threading

    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in it:
                if not put(item):
                    return
            put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(exc)

    t = threading.Thread(target=work, name="torchdoctor-explain-reader", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


__all__ = [
    "MAX_LINE",
    "Block",
    "Source",
    "TruncatedInput",
    "blocks",
    "error_json_text",
    "file_source",
    "is_log_name",
    "lines_source",
    "prefetch",
    "rank_from_path",
    "resolve",
    "text_source",
    "walk",
]
