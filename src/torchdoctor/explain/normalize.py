"""From a raw log line to its text, rank, host and time: the prefixes launchers add, removed.

Understood prefixes (any order, nested up to four deep):

* ANSI escape sequences (colours, cursor moves) anywhere in the line;
* leading timestamps: ISO-8601 (``2024-05-01 10:00:00,123``, ``[2024-05-01T10:00:00.5Z]``),
  dmesg's ``[ 1234.567890]``, syslog's ``May  1 10:00:00 host``;
* rank prefixes: ``[rank3]:`` and ``[default3]:`` (torchrun ``--tee``/log-line prefixes, any role
  name), Lightning's ``[rank: 3]``, ``srun --label``'s ``3: ``;
* c10/glog headers (``[E501 10:00:00.123456 1234 ProcessGroupNCCL.cpp:616]``) give the time but stay
  in the text, since signatures may name the file they come from.

Lines that name their rank or host in their content are read too: NCCL's ``host:pid:tid [dev] NCCL``,
``srun: error: host: task 3: Killed``, c10's ``[Rank 3] ...``, and torchrun's failure summary
(``rank : 3 (local_rank: 3)``, ``host : node1``, ``exitcode : -9 (pid: 42)``) through
:class:`SummaryTracker`.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

Time = tuple[str, float]
"""(kind, seconds): times are compared only between equal kinds ("wall", "glog", "mono")."""

ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CTRL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

_ISO_RE = re.compile(
    r"\[?(?P<y>\d{4})[-/](?P<mo>\d{2})[-/](?P<d>\d{2})[T _](?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
    r"(?:[.,](?P<frac>\d{1,9}))?(?:Z|[+-]\d{2}:?\d{2})?\]?(?:\s*[|:-]\s*|\s+|(?=\[))"
)
_DMESG_RE = re.compile(r"\[\s*(?P<mono>\d{1,10}\.\d{3,9})\]\s*")
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}
_SYSLOG_RE = re.compile(
    r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d>\d{1,2}) "
    r"(?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2}) (?P<host>[\w.-]+) "
)
_RANK_PREFIX_RE = re.compile(r"\[rank(?P<rank>\d{1,7})\]: ?|\[(?:default|[a-z][a-z_]{0,30}?)(?P<local>\d{1,7})\]:")
_LIGHTNING_RE = re.compile(r"\[rank: (?P<rank>\d{1,7})\][ \t]?")
_SRUN_LABEL_RE = re.compile(r" {0,7}(?P<rank>\d{1,7}): ")
_GLOG_RE = re.compile(r"\[?[IWEF](?P<mo>\d{1,2})(?P<d>\d{2}) (?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})(?:\.(?P<frac>\d{1,9}))?(?: +\d+)? ")
_NCCL_HOST_RE = re.compile(r"(?P<host>[A-Za-z0-9][\w.-]{0,252}):\d+:\d+ \[\d+\] (?:\S+ )?(?:NCCL )?(?:INFO|WARN) ")
_SRUN_ERR_RE = re.compile(r"srun: error: (?P<host>[\w.-]+): tasks? (?P<rank>\d+)(?:[-,]\d+)*: ")
_C10_RANK_RE = re.compile(r"\[(?:PG [^\]]{0,80}? )?Rank (?P<rank>\d{1,7})\]")


@dataclass
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
    for _ in range(4):
        m = _RANK_PREFIX_RE.match(text) or _LIGHTNING_RE.match(text)
        if m:
            if found_rank is None:
                found_rank = int(m["rank"] if m["rank"] is not None else m["local"])
            text = text[m.end():]
            continue
        m = _ISO_RE.match(text)
        if m:
            time = time or _iso_time(m)
            text = text[m.end():]
            continue
        m = _DMESG_RE.match(text)
        if m:
            time = time or ("mono", float(m["mono"]))
            text = text[m.end():]
            continue
        m = _SYSLOG_RE.match(text)
        if m:
            host = m["host"]
            text = text[m.end():]
            continue
        if found_rank is None and time is None:
            m = _SRUN_LABEL_RE.match(text)
            if m:
                found_rank = int(m["rank"])
                text = text[m.end():]
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
    if found_rank is None and "Rank" in text[:160]:
        c = _C10_RANK_RE.search(text, 0, 160)
        if c:
            found_rank = int(c["rank"])
    return NormLine(text, clean, found_rank if found_rank is not None else rank, host, time)


# --------------------------------------------------------------------------- torchrun's summary

_SUMMARY_FIELD_RE = re.compile(r"\s{1,8}(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_SUMMARY_ENTRY_RE = re.compile(r"\[\d+\]:\s*$")
_SUMMARY_RANK_RE = re.compile(r"(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_EXITCODE_RE = re.compile(r"(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")
_AGENT_FAILED_RE = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)")
_SUMMARY_TIME_RE = re.compile(r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})_(?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})(?P<frac>)")


def signal_name(exitcode: int | None) -> str | None:
    """``-9`` → ``SIGKILL``: a negative exit code is the signal that killed the process."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


@dataclass
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
            "rank": self.rank, "local_rank": self.local_rank, "host": self.host, "exitcode": self.exitcode,
            "signal": signal_name(self.exitcode), "pid": self.pid, "error_file": self.error_file,
            "message": self.message, "file": self.file, "line": self.line,
        }


@dataclass
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
                self.failures.append(RankFailure(
                    local_rank=int(m["local"]), exitcode=int(m["code"]), pid=int(m["pid"]), file=file, line=line,
                ))
            return
        entry = self._entry
        if entry is None:
            return
        if text.startswith("====") or text.startswith("----"):
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
