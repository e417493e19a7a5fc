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

Binary input (an executable, a checkpoint, a core dump, compressed data other than gzip) is not a
log: :func:`sniff_binary` judges the first :data:`SNIFF` bytes (after gunzip). A file or stdin given
explicitly is refused with a :class:`UsageError`; a binary file met while walking a directory
(``a.out``) is skipped. Text and bytes handed to the Python API are always read.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import UsageError

MAX_LINE = 64 * 1024
"""Bytes of one line that are kept: a longer line keeps its first and its last half of this (a tqdm
line redrawn with ``\r`` thousands of times ends in what the terminal showed last: often the
error), joined by ``\r``; the middle is skipped (constant memory)."""
CUT_JOIN = b"\r"


def cut_long(line: bytes, max_line: int = MAX_LINE) -> bytes:
    """``line`` when it fits, else its head and tail halves joined by :data:`CUT_JOIN`."""
    if len(line) <= max_line:
        return line
    half = (max_line - len(CUT_JOIN)) // 2
    return line[:half] + CUT_JOIN + line[-half:]


PIECE = 4 * 1024 * 1024
"""Bytes read at a time."""
ERROR_JSON_MAX = 16 * 1024 * 1024

SNIFF = 8192
"""Bytes at the start of an input that decide whether it is text (``git`` and ``file`` look at as many)."""
#: Share of control bytes (other than tab, newlines, form feed, backspace, escape) above which it is binary.
BINARY_SHARE = 0.05

_GZIP_MAGIC = b"\x1f\x8b"
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x7fELF", "an ELF executable or library"),
    (b"PK\x03\x04", "a zip archive (a torch checkpoint saved with torch.save is one)"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"%PDF-", "a PDF document"),
    (b"\x93NUMPY", "a numpy .npy array"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"\xfd7zXZ\x00", "xz-compressed data"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
    (b"BZh", "bzip2-compressed data"),
    (b"\xcf\xfa\xed\xfe", "a Mach-O executable"),
    (b"\xca\xfe\xba\xbe", "a Mach-O or Java class file"),
)
_TEXT_CONTROLS = frozenset(b"\t\n\r\f\v\b\x1b")
_NUL_RUN = 16
"""NUL bytes in runs at least this long are a hole (a log truncated by logrotate's copytruncate), not data."""
_INSTEAD = "give the text the run printed (stdout/stderr, *.log, *.out, error.json; gzip is fine)"
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
    if path.name.lower() in ("error.json", "error.json.gz") or path.name.lower().endswith(
        ("_error.json", "-error.json")
    ):
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
            found = walk(path)
            files = [f for f in found if _regular_binary(f) is None]
            if not files:
                skipped = f"; {len(found)} binary file(s) skipped" if found else ""
                raise UsageError(
                    f"no log files under {text} (looked for *.log, *.out, *.err, *.txt, stdout*, stderr*, error.json, also gzipped{skipped})"
                )
            sources += [file_source(f) for f in files]
        elif path.exists():
            if not os.access(path, os.R_OK):
                raise UsageError(f"cannot read {text}: permission denied")
            why = _regular_binary(path)
            if why is not None:
                raise UsageError(f"{text} is {why}, not a log: {_INSTEAD}")
            source = file_source(path)
            if not _is_regular(path):  # a pipe or a device (`explain <(cmd)`): judged as it is read, never twice
                source.opener = _refusing(source.opener, text)
            sources.append(source)
        else:
            raise UsageError(f"no such file or directory: {text}")
    return sources


# --------------------------------------------------------------------------- binary input


def sniff_binary(head: bytes) -> str | None:
    """What a binary input is (``"an ELF executable or library"``), or None when ``head`` looks like text.

    ``head`` is the start of the (gunzipped) input. Binary: a known magic number, UTF-16 (NUL bytes
    between the characters), or more than :data:`BINARY_SHARE` control bytes once runs of NUL
    padding are left out. Text in any 8-bit encoding (UTF-8, Latin-1, Shift-JIS ...) passes.
    """
    sample = head[:SNIFF]
    for magic, what in _MAGIC:
        if sample.startswith(magic):
            return what
    if sample[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "UTF-16 text (convert it first: `iconv -f UTF-16 -t UTF-8 FILE > FILE.utf8.log`)"
    body = _drop_nul_runs(sample)
    if not body:
        return None
    if len(body) >= 8 and max(body[0::2].count(0), body[1::2].count(0)) > len(body) // 4:
        return "UTF-16 text without a byte-order mark (convert it first: `iconv -f UTF-16LE -t UTF-8 FILE > FILE.utf8.log`)"
    controls = sum(1 for b in body if (b < 0x20 and b not in _TEXT_CONTROLS) or b == 0x7F)
    if controls > BINARY_SHARE * len(body):
        return f"binary data ({controls * 100 // len(body)}% of its first {len(body):,} bytes are control bytes)"
    return None


def _drop_nul_runs(data: bytes) -> bytes:
    run = b"\x00" * _NUL_RUN
    if run not in data:
        return data
    return re.sub(rb"\x00{%d,}" % _NUL_RUN, b"", data)


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _regular_binary(path: Path) -> str | None:
    """:func:`sniff_binary` of a regular file's start (gunzipped); None for text, pipes, devices and errors."""
    if not _is_regular(path):
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF)
    except OSError:
        return None  # reading it later reports the error in its notes
    if head[:2] == _GZIP_MAGIC:
        head = _gunzip_head(head)
    return sniff_binary(head)


def _gunzip_head(data: bytes) -> bytes:
    """Up to :data:`SNIFF` bytes of what the start of gzip ``data`` holds; b"" (read as usual, where a corrupt
    stream is noted) when it cannot be decompressed."""
    import zlib

    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, SNIFF)
    except zlib.error:
        return b""


def _refusing(opener: Callable[[], Iterator[bytes]], name: str) -> Callable[[], Iterator[bytes]]:
    return lambda: _refuse_binary(opener(), name)


def _refuse_binary(pieces: Iterator[bytes], name: str) -> Iterator[bytes]:
    """Pass the pieces of a stream through, raising :class:`UsageError` when its first bytes are binary."""
    head = b""
    held: list[bytes] = []
    judged = False
    for piece in pieces:
        if not judged:
            held.append(piece)
            head += piece[: SNIFF - len(head)]
            if len(head) < SNIFF:
                continue
            judged = True
            _judge(head, name)
            yield from held
            held = []
            continue
        yield piece
    if not judged:
        _judge(head, name)
        yield from held


def _judge(head: bytes, name: str) -> None:
    why = sniff_binary(head)
    if why is not None:
        raise UsageError(f"{name} is {why}, not a log: {_INSTEAD}")


def _stdin_pieces() -> Iterator[bytes]:
    stdin: Any = sys.stdin
    if stdin is None:  # no standard input at all (daemonised): nothing to read
        return iter(())
    return _refuse_binary(stream_pieces(stdin.buffer if hasattr(stdin, "buffer") else stdin), "standard input")


def encode_text(text: str) -> bytes:
    """UTF-8 bytes of any ``str``: undecodable bytes kept (surrogateescape), other lone surrogates
    (``"\\ud800"`` from a broken exception message) replaced, never an error."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def text_source(data: str | bytes, name: str = "<text>") -> Source:
    raw = encode_text(data) if isinstance(data, str) else bytes(data)
    return Source(name, lambda: _maybe_gunzip_bytes(raw), size=len(raw))


def lines_source(lines: Iterable[str | bytes], name: str = "<lines>") -> Source:
    def gen() -> Iterator[bytes]:
        buf: list[bytes] = []
        size = 0
        for line in lines:
            if not isinstance(line, (str, bytes, bytearray, memoryview)):
                raise TypeError(
                    f"explain() got an iterable holding a {type(line).__name__}: "
                    "give lines as str or bytes, or paths as pathlib.Path"
                )
            b = encode_text(line) if isinstance(line, str) else bytes(line)
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
            yield raw[i : i + PIECE]


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
        head = (
            f"torchelastic error.json timestamp {extra.get('timestamp')}\n" if extra and extra.get("timestamp") else ""
        )
        return head + (str(body) if body is not None else "")
    return str(msg)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# --------------------------------------------------------------------------- blocks of whole lines


def blocks(
    pieces: Iterable[bytes], max_line: int = MAX_LINE, count: bool = True, cuts: list[int] | None = None
) -> Iterator[Block]:
    """Whole-line blocks from arbitrary pieces; a line past ``max_line`` bytes is cut there.

    ``cuts[0]`` (when given) counts the lines cut here. ``count=False`` leaves the newlines of the large blocks uncounted (``lines`` and
    ``first_line`` are -1 there; the one-line blocks keep ``lines=1``): a reader that splits the
    block into lines anyway counts them for free (see :func:`~.stream.read_all`).

    The partial line carried between pieces never exceeds ``max_line``; a longer line's tail is
    skipped up to its newline, so line numbers stay right. Memory: one piece plus ``max_line``.
    """
    carry = b""
    skipping = False  # inside a line past max_line: its middle is skipped, its tail kept
    tail = b""
    half = (max_line - len(CUT_JOIN)) // 2
    line = 1
    for piece in pieces:
        pos = 0
        if skipping:
            nl = piece.find(b"\n")
            if nl < 0:
                tail = (tail + piece[-half:])[-half:]
                continue
            tail = (tail + piece[max(0, nl - half) : nl])[-half:]
            head = carry + CUT_JOIN + tail + b"\n"
            if cuts is not None:
                cuts[0] += 1
            yield Block(head, 0, len(head), line, 1)
            line, carry, tail, pos, skipping = line + 1, b"", b"", nl + 1, False
        if carry:
            nl = piece.find(b"\n", pos)
            room = max_line - len(carry)
            if nl < 0:
                if len(piece) - pos > room:
                    carry = (carry + piece[pos:])[:half]
                    tail, skipping = piece[-half:], True
                else:
                    carry += piece[pos:]
                continue
            if nl - pos > room:
                head = cut_long(carry + piece[pos:nl], max_line) + b"\n"
                if cuts is not None:
                    cuts[0] += 1
            else:
                head = carry + piece[pos:nl] + b"\n"
            yield Block(head, 0, len(head), line, 1)
            line, carry, pos = line + 1, b"", nl + 1
        last = piece.rfind(b"\n", pos)
        if last >= 0:
            if count:
                n = piece.count(b"\n", pos, last + 1)
                yield Block(piece, pos, last + 1, line, n)
                line += n
            else:
                yield Block(piece, pos, last + 1, -1, -1)
            pos = last + 1
        if len(piece) - pos > max_line:
            carry, tail, skipping = piece[pos : pos + half], piece[-half:], True
        else:
            carry = piece[pos:]
    if carry:
        head = (carry + CUT_JOIN + tail if skipping else carry) + b"\n"
        yield Block(head, 0, len(head), line, 1)


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
    "sniff_binary",
    "text_source",
    "walk",
]
