"""From a raw log line to its text, rank, host and time: the prefixes launchers add, removed.

Understood prefixes (any order, nested up to four deep):

* ANSI escape sequences (colours, cursor moves) anywhere in the line;
* leading timestamps: ISO-8601 (``2024-05-01 10:00:00,123``, ``[2024-05-01T10:00:00.5Z]``),
  dmesg's ``[ 1234.567890]``, syslog's ``May  1 10:00:00 host``;
* rank prefixes: ``[rank3]:`` and ``[default3]:`` (torchrun ``--tee``/log-line prefixes, any role
  name; also what ``accelerate launch`` workers print, since it runs torchrun's agent), Lightning's
  ``[rank: 3]`` (also after a level, ``INFO: [rank: 1] Child process ...``), ``srun --label``'s ``3: ``;
* stream and level tags that wrappers add: ``stderr: `` (``accelerate test``), ``[stderr]``,
  ``[INFO] `` after a timestamp (GUI front-ends that re-log a trainer's output);
* c10/glog headers (``[E501 10:00:00.123456 1234 ProcessGroupNCCL.cpp:616]``) give the time but stay
  in the text, since signatures may name the file they come from.

A paste that lost its newlines (``[rank2]: Traceback ... [rank2]:   File ... [rank2]: FileNotFoundError:
...`` on one line, or a bare traceback flattened the same way) is split back into lines by
:func:`unflatten` before any of this; every piece keeps the line number it was read from.

Lines that name their rank or host in their content are read too: NCCL's ``host:pid:tid [dev] NCCL``,
``srun: error: host: task 3: Killed``, c10's ``[Rank 3] ...``, and torchrun's failure summary
(``rank : 3 (local_rank: 3)``, ``host : node1``, ``exitcode : -9 (pid: 42)``) through
:class:`SummaryTracker`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from ..stopping import signal_name

Time = tuple[str, float]
"""(kind, seconds): times are compared only between equal kinds ("wall", "glog", "mono")."""

ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CTRL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

_ISO_RE = re.compile(
    r"\[?(?P<y>\d{4})[-/](?P<mo>\d{2})[-/](?P<d>\d{2})[T _](?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
    r"(?:[.,](?P<frac>\d{1,9}))?(?:Z|[+-]\d{2}:?\d{2})?\]?(?:\s*[|:-]\s*|\s+|(?=\[))"
)
_DMESG_RE = re.compile(r"\[\s*(?P<mono>\d{1,10}\.\d{3,9})\]\s*")
_MONTHS = {
    m: i for i, m in enumerate(["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], 1)
}
_SYSLOG_RE = re.compile(
    r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d>\d{1,2}) "
    r"(?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2}) (?P<host>[\w.-]+) "
)
_RANK_PREFIX_RE = re.compile(r"\[rank(?P<rank>\d{1,7})\]: ?|\[(?:default|[a-z][a-z_]{0,30}?)(?P<local>\d{1,7})\]:")
_LIGHTNING_RE = re.compile(r"(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):? {1,8})?\[rank: (?P<rank>\d{1,7})\][ \t]?")
_LIGHTNING_ANY_RE = re.compile(r"\[rank: (?P<rank>\d{1,7})\]")
_TAG_RE = re.compile(r"std(?:out|err): |\[std(?:out|err)\] ?|\[(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\] ")
_SRUN_LABEL_RE = re.compile(r" {0,7}(?P<rank>\d{1,7}): ")
_GLOG_RE = re.compile(
    r"\[?[IWEF](?P<mo>\d{1,2})(?P<d>\d{2}) (?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})(?:\.(?P<frac>\d{1,9}))?(?: +\d+)? "
)
_NCCL_HOST_RE = re.compile(r"(?P<host>[A-Za-z0-9][\w.-]{0,252}):\d+:\d+ \[\d+\] (?:\S+ )?(?:NCCL )?(?:INFO|WARN) ")
_SRUN_ERR_RE = re.compile(r"srun: error: (?P<host>[\w.-]+): tasks? (?P<rank>\d+)(?:[-,]\d+)*: ")
_C10_RANK_RE = re.compile(r"\[(?:PG [^\]]{0,80}? )?Rank (?P<rank>\d{1,7})\]")


@dataclass(repr=False, eq=False)
class NormLine:
    text: str
    """The line without ANSI codes, launcher prefixes and leading timestamp."""
    clean: str
    """The line without ANSI codes only (what evidence shows)."""
    rank: int | None = None
    host: str | None = None
    time: Time | None = None


def strip_ansi(text: str) -> str:
    if "\x1b" in text:
        text = ANSI_RE.sub("", text)
    return _CTRL_RE.sub("", text) if _CTRL_RE.search(text) else text


def _frac(s: str | None) -> float:
    return float("0." + s) if s else 0.0


def _iso_time(m: re.Match[str]) -> Time | None:
    from datetime import datetime

    try:
        dt = datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]))
    except ValueError:
        return None
    return ("wall", dt.timestamp() + _frac(m["frac"]))


def _glog_time(m: re.Match[str]) -> Time:
    secs = ((int(m["mo"]) * 31 + int(m["d"])) * 24 + int(m["h"])) * 3600 + int(m["mi"]) * 60 + int(m["s"])
    return ("glog", secs + _frac(m["frac"]))


def normalize(raw: str, rank: int | None = None, host: str | None = None) -> NormLine:
    """Strip prefixes from one line; ``rank``/``host`` are the defaults its source implies."""
    clean = strip_ansi(raw).rstrip("\r\n")
    text = clean
    time: Time | None = None
    found_rank: int | None = None
    for _ in range(6):
        m = _RANK_PREFIX_RE.match(text) or _LIGHTNING_RE.match(text)
        if m:
            if found_rank is None:
                found_rank = int(m["rank"] if m["rank"] is not None else m["local"])
            text = text[m.end() :]
            continue
        m = _ISO_RE.match(text)
        if m:
            time = time or _iso_time(m)
            text = text[m.end() :]
            continue
        m = _TAG_RE.match(text)
        if m:
            text = text[m.end() :]
            continue
        m = _DMESG_RE.match(text)
        if m:
            time = time or ("mono", float(m["mono"]))
            text = text[m.end() :]
            continue
        m = _SYSLOG_RE.match(text)
        if m:
            host = m["host"]
            text = text[m.end() :]
            continue
        if found_rank is None and time is None:
            m = _SRUN_LABEL_RE.match(text)
            if m:
                found_rank = int(m["rank"])
                text = text[m.end() :]
                continue
        break
    if time is None:
        g = _GLOG_RE.match(text)
        if g:
            time = _glog_time(g)
    if "NCCL" in text:
        h = _NCCL_HOST_RE.match(text)
        if h:
            host = h["host"]
    if text.startswith("srun: error:"):
        s = _SRUN_ERR_RE.match(text)
        if s:
            host, found_rank = s["host"], int(s["rank"]) if found_rank is None else found_rank
    if found_rank is None and "[rank: " in text[:240]:
        c = _LIGHTNING_ANY_RE.search(text, 0, 240)
        if c:
            found_rank = int(c["rank"])
    if found_rank is None and "Rank" in text[:160]:
        c = _C10_RANK_RE.search(text, 0, 160)
        if c:
            found_rank = int(c["rank"])
    return NormLine(text, clean, found_rank if found_rank is not None else rank, host, time)


# --------------------------------------------------------------------------- pastes that lost their newlines

_FLAT_RANK_RE = re.compile(r"(?<=\s)(?=\[(?:rank|default)\d{1,7}\]:)")
_LEAD_PREFIX_RE = re.compile(r"(?:\[(?:rank|default)\d{1,7}\]: ?)+")
_TB_HEAD = "Traceback (most recent call last):"
_FLAT_BREAK_RE = re.compile(
    r"\s*(Traceback \(most recent call last\):|During handling of the above exception, another exception occurred:|"
    r"The above exception was the direct cause of the following exception:)\s*"
)
_FLAT_FRAME_RE = re.compile(r"\s+(?=File \"[^\"\n]{1,4096}\", line \d+)")
_FRAME_HEAD_RE = re.compile(r"File \"[^\"\n]{1,4096}\", line \d+(?:, in \S+)?")
_FLAT_EXC_RE = re.compile(
    r"(?:^|\s)(?=(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Warning)(?::\s|:?$))"
)
MAX_PIECES = 4096


def unflatten(line: str) -> list[str] | None:
    """Split a line that holds several log lines (a paste that lost its newlines); None if it does not.

    Two shapes are recognised: repeated rank prefixes (``[rank2]: Traceback ... [rank2]: File ...``),
    split before every prefix that follows whitespace; and a bare traceback on one line
    (``Traceback (most recent call last): File "x.py", line 3, in <module> FileNotFoundError: ...``),
    split into its header, frames, source lines and exception line, re-indented the way Python prints
    them so that the traceback is stitched as usual.
    """
    pieces: list[str] | None = None
    if line.count("]:") >= 2:
        cuts = [m.start() for m in _FLAT_RANK_RE.finditer(line)]
        if cuts and _LEAD_PREFIX_RE.search(line, 0, cuts[0]):
            bounds = [0, *cuts, len(line)]
            pieces = [line[a:b].rstrip() for a, b in pairwise(bounds) if line[a:b].strip()]
    if _TB_HEAD in line:
        out: list[str] = []
        for piece in pieces or [line]:
            out += _flat_traceback(piece) or [piece]
        if len(out) > 1:
            pieces = out
    if pieces is None or len(pieces) < 2:
        return None
    if len(pieces) > MAX_PIECES:  # keep the head and the tail, where the exception line is
        pieces = pieces[: MAX_PIECES // 2] + pieces[-(MAX_PIECES // 2) :]
    return pieces


def _flat_traceback(piece: str) -> list[str] | None:
    """A one-line traceback (after an optional rank prefix) as the lines Python printed."""
    head = piece.find(_TB_HEAD)
    if head < 0 or not piece[head + len(_TB_HEAD) :].strip():
        return None
    m = _LEAD_PREFIX_RE.match(piece)
    prefix = m.group(0) if m else ""
    if prefix and not prefix.endswith(" "):
        prefix += " "
    body = piece[len(prefix) :] if m else piece
    out: list[str] = []
    pos = 0
    for brk in _FLAT_BREAK_RE.finditer(body):
        out += _flat_part(body[pos : brk.start()])
        out.append(brk.group(1))
        pos = brk.end()
    out += _flat_part(body[pos:])
    out = [o for o in out if o.strip()]
    return [prefix + o for o in out] if len(out) > 1 else None


def _flat_part(text: str) -> list[str]:
    """Frames, source lines and the closing exception of the text between two traceback headers."""
    if not text.strip():
        return []
    parts = _FLAT_FRAME_RE.split(" " + text)
    out: list[str] = [parts[0].strip()] if parts[0].strip() else []
    for i, part in enumerate(parts[1:], 1):
        fm = _FRAME_HEAD_RE.match(part)
        if fm is None:
            out.append(part.strip())
            continue
        out.append("  " + fm.group(0))
        rest = part[fm.end() :].strip()
        if not rest:
            continue
        exc = _FLAT_EXC_RE.search(rest) if i == len(parts) - 1 else None
        source, tail = (rest[: exc.start()].strip(), rest[exc.start() :].strip()) if exc else (rest, "")
        if source:
            out.append("    " + source)
        if tail:
            out.append(tail)
    return out


# --------------------------------------------------------------------------- torchrun's summary

_SUMMARY_FIELD_RE = re.compile(r"\s{1,8}(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_SUMMARY_ENTRY_RE = re.compile(r"\[\d+\]:\s*$")
_SUMMARY_RANK_RE = re.compile(r"(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_EXITCODE_RE = re.compile(r"(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")
_AGENT_FAILED_RE = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)")
_SUMMARY_TIME_RE = re.compile(
    r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})_(?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})(?P<frac>)"
)


@dataclass(repr=False, eq=False)
class RankFailure:
    """One entry of torchrun's ``ChildFailedError`` summary (or the agent's ``failed (exitcode ...)`` line)."""

    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    exitcode: int | None = None
    pid: int | None = None
    time: Time | None = None
    error_file: str | None = None
    message: str | None = None
    root: bool = False
    file: str = ""
    line: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "host": self.host,
            "exitcode": self.exitcode,
            "signal": signal_name(self.exitcode),
            "pid": self.pid,
            "error_file": self.error_file,
            "message": self.message,
            "file": self.file,
            "line": self.line,
        }


@dataclass(repr=False, eq=False)
class SummaryTracker:
    """Reads torchrun's failure summary block; lines inside an entry belong to that entry's rank."""

    failures: list[RankFailure] = field(default_factory=list)
    _entry: RankFailure | None = None
    _root_section: bool = False
    _in_traceback: bool = False

    def feed(self, norm: NormLine, file: str, line: int) -> None:
        """Update from one normalised line; may set ``norm.rank``/``norm.host`` for summary lines."""
        text = norm.text
        if "Root Cause (first observed failure)" in text:
            self._close()
            self._root_section = True
            return
        if text.strip() == "Failures:":
            self._close()
            self._root_section = False
            return
        if _SUMMARY_ENTRY_RE.fullmatch(text.strip()) and text.strip().startswith("["):
            self._close()
            self._entry = RankFailure(root=self._root_section, file=file, line=line)
            return
        if "local_rank:" in text and "failed (exitcode" in text:
            m = _AGENT_FAILED_RE.search(text)
            if m:
                self.failures.append(
                    RankFailure(
                        local_rank=int(m["local"]),
                        exitcode=int(m["code"]),
                        pid=int(m["pid"]),
                        file=file,
                        line=line,
                    )
                )
            return
        entry = self._entry
        if entry is None:
            return
        if text.startswith(("====", "----")):
            self._close()
            return
        m = _SUMMARY_FIELD_RE.match(text)
        if m:
            self._in_traceback = m["key"] == "traceback"
            self._field(entry, m["key"], m["value"].strip())
        elif not (self._in_traceback and (text.startswith("  ") or not text.strip())):
            self._close()
            return
        if entry.rank is not None:
            norm.rank = entry.rank
        if entry.host is not None:
            norm.host = entry.host

    @property
    def in_entry(self) -> bool:
        """The line just fed belongs to a failure entry (its fields or its traceback)."""
        return self._entry is not None

    def _field(self, entry: RankFailure, key: str, value: str) -> None:
        if key == "host":
            entry.host = value or None
        elif key == "rank":
            m = _SUMMARY_RANK_RE.match(value)
            if m:
                entry.rank, entry.local_rank = int(m["rank"]), int(m["local"])
        elif key == "exitcode":
            m = _EXITCODE_RE.match(value)
            if m:
                entry.exitcode, entry.pid = int(m["code"]), int(m["pid"])
        elif key == "time":
            m = _SUMMARY_TIME_RE.match(value)
            entry.time = _iso_time(m) if m else None
        elif key == "error_file":
            entry.error_file = None if value in ("", "<N/A>") else value
        elif key == "traceback":
            entry.message = value[:500] or None

    def _close(self) -> None:
        if self._entry is not None and (self._entry.rank is not None or self._entry.exitcode is not None):
            self.failures.append(self._entry)
        self._entry = None
        self._in_traceback = False

    def finish(self) -> list[RankFailure]:
        self._close()
        return self.failures
