"""``torchdoctor explain``: the root cause of a failed run, from its logs, across ranks.

    >>> from torchdoctor.explain import explain
    >>> report = explain(Path("logs/"))          # a file, a directory, bytes, text or lines
    >>> report.root_cause.code, report.root_cause.rank
    ('TD150', 5)

Pipeline: :mod:`.sources` (files, directories, gzip, stdin; whole-line blocks in constant memory)
→ :mod:`.match` (one literal scan per block, then only the signatures whose trigger was found)
→ :mod:`.stream` (normalisation, pastes split back into lines, per-rank traceback stitching,
cut tracebacks, traceback context, wrapped lines joined; bounded collection in :mod:`.collect`;
:mod:`.relevance` ranks the error lines no signature explains)
→ :mod:`.triage` (earliest root cause, cascades attached, confidences) → :mod:`.render`
(:mod:`.textout` lays out the text report).
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Union

from ..registry import Code, log_codes
from ..signature import Signature
from .collect import Collector
from .match import SignatureIndex
from .model import Diagnosis, ExplainReport, LineRef, UnmatchedError, rank_ranges
from .sources import Source, lines_source, resolve, text_source
from .stream import read_all
from .triage import triage

Input = Union[str, bytes, bytearray, "os.PathLike[str]", Iterable[str], Iterable[bytes]]

_DEFAULT: list[SignatureIndex] = []


def _index(codes: Sequence[Code] | None) -> tuple[SignatureIndex, list[Code]]:
    """The literal index; built once for the whole catalogue, afresh for a custom code list."""
    if codes is not None:
        return SignatureIndex(codes), list(codes)
    chosen = log_codes()
    if not _DEFAULT or _DEFAULT[0].codes != chosen:
        _DEFAULT[:] = [SignatureIndex(chosen)]
    return _DEFAULT[0], chosen


def sources_for(data: Input) -> list[Source]:
    """Turn any accepted input into sources (see :func:`explain`); a wrong type is a ``TypeError``
    at the call, naming what is accepted."""
    if isinstance(data, str):
        if data and "\n" not in data and len(data) < 4096 and _is_file(data):
            warnings.warn(
                f"explain() takes a str as log text, and {data!r} names a file: pass "
                f"pathlib.Path({data!r}) to read the file",
                UserWarning,
                stacklevel=3,
            )
        return [text_source(data)]
    if isinstance(data, (bytes, bytearray, memoryview)):
        return [text_source(bytes(data), "<bytes>")]
    if isinstance(data, os.PathLike):
        return resolve([data])
    if data is None or not isinstance(data, Iterable):
        raise TypeError(
            f"explain() takes log text (str or bytes), a pathlib.Path, a list of paths or an "
            f"iterable of lines; got {type(data).__name__}"
        )
    items = list(data) if isinstance(data, (list, tuple)) else None
    if items is not None and items and all(isinstance(i, os.PathLike) for i in items):
        return resolve(items)
    if items is not None:
        bad = next((i for i in items if not isinstance(i, (str, bytes, bytearray, memoryview))), _NONE)
        if bad is not _NONE:
            raise TypeError(
                f"explain() got a list holding a {type(bad).__name__}: give lines as str or bytes, "
                "or every item as a pathlib.Path"
            )
    return [lines_source(items if items is not None else data)]


_NONE = object()


def _is_file(text: str) -> bool:
    try:
        return os.path.isfile(text)
    except (OSError, ValueError):
        return False


def explain(data: Input, codes: Sequence[Code] | None = None) -> ExplainReport:
    """Explain a failed run from its logs.

    ``data`` is the log text (``str``), raw bytes (plain or gzip), a ``pathlib.Path`` to a file or a
    directory (walked; torchrun ``--log-dir`` layouts and ``error.json`` understood), a list of
    paths, or an iterable of lines. ``codes`` restricts the catalogue (default: every code).
    A ``str`` is always the log text itself, never a file name (a ``str`` naming an existing file
    warns); pass ``pathlib.Path`` to read a file. Never raises on bad log content (undecodable
    bytes, lone surrogates); a missing path or a binary file raises :class:`torchdoctor.UsageError`,
    an argument of the wrong type a ``TypeError``.
    """
    return explain_sources(sources_for(data), codes)


def explain_sources(sources: list[Source], codes: Sequence[Code] | None = None) -> ExplainReport:
    index, chosen = _index(codes)
    col = Collector()
    read_all(sources, index, col)
    return triage(col, {c.code: c for c in chosen}, [s.name for s in sources])


@dataclass(frozen=True)
class Shown:
    """One place where the engine matched a signature (see :func:`shows`)."""

    code: str
    signature: Signature
    line: int
    """1-based line number in the text (the first line of a joined, wrapped match)."""
    values: dict[str, str]
    how: str = ""
    """``cut-traceback`` when read from a traceback cut before its exception line."""


def shows(data: Input, code: str | Code | Iterable[str | Code]) -> list[Shown]:
    """Every match of ``code``'s signatures in ``data``, in reading order, decided by the engine itself.

    This is the one answer to "does this text show TDnnn?": ``lab run`` calls a failure reproduced
    with it, and the tests check fixtures with it. It runs the same reading as :func:`explain`
    (normalisation, traceback stitching, ``context=``/``frames=`` rules, wrapped lines joined,
    placeholders and cut lines tolerated), restricted to the given codes.
    """
    from ..registry import lookup

    items = [code] if isinstance(code, (str, Code)) else list(code)
    chosen = [c if isinstance(c, Code) else lookup(c) for c in items]
    col = Collector(trace=[])
    read_all(sources_for(data), SignatureIndex(chosen), col)
    assert col.trace is not None
    return [Shown(e.code, e.signature, e.ref.line, dict(e.values), e.how) for e in col.trace if e.signature is not None]


def explain_paths(paths: Iterable[str | os.PathLike[str]], codes: Sequence[Code] | None = None) -> ExplainReport:
    """Explain files, directories and ``-`` (stdin), as the command line does."""
    return explain_sources(resolve(paths), codes)


def explain_exception(exc: BaseException, codes: Sequence[Code] | None = None) -> ExplainReport:
    """Explain a live exception: its formatted traceback (with causes and context) is the log."""
    import traceback

    if not isinstance(exc, BaseException):
        raise TypeError(f"explain_exception() takes an exception; got {type(exc).__name__}")
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return explain(text, codes)


__all__ = [
    "Diagnosis",
    "ExplainReport",
    "LineRef",
    "UnmatchedError",
    "explain",
    "explain_exception",
    "explain_paths",
    "Shown",
    "rank_ranges",
    "shows",
]


class _CallableModule(types.ModuleType):
    """``torchdoctor.explain`` is both this package and the function :func:`explain`: once any of
    its submodules is imported, Python binds the package (not the function) to the name on
    ``torchdoctor``, so the package itself answers a call the same way."""

    def __call__(self, data: Input, codes: Sequence[Code] | None = None) -> ExplainReport:
        return explain(data, codes)


sys.modules[__name__].__class__ = _CallableModule
