"""Reading recorded runs: ``RUN_DIR/fingerprints-rank{R}.jsonl`` as :class:`~.fingerprint.RunRecorder` writes them.

:func:`load_run` gives a :class:`Run` (per rank, its header and its step records) for ``torchdoctor runs diff``;
:func:`read_records` gives one file's records in order. ``steps`` lines (several plain steps on one line, their
numbers as hexadecimal float64) come back as step records, bit for bit; files of schema 1 (a line per step) are
read too. What is not a recorded run is a :class:`RunError` naming the file, the line and the fix.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TorchDoctorError
from .deferred import block_records

SCHEMA = 2
"""Written in headers; 2 added ``steps`` lines (several quick records on one line). Schema 1 files are read too."""
READABLE = (1, 2)
FILE_RE = re.compile(r"^fingerprints-rank(\d+)\.jsonl$")


class RunError(TorchDoctorError):
    """A directory or file that is not a recorded run (missing, empty, or not RunRecorder's lines)."""


@dataclass(frozen=True)
class Run:
    """A recorded run: per rank, its header and its step records (``steps[rank][step]``)."""

    path: str
    meta: dict[int, dict[str, Any]]
    steps: dict[int, dict[int, dict[str, Any]]]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.steps)

    def losses(self, rank: int) -> list[float]:
        return [r["loss"] for _, r in sorted(self.steps.get(rank, {}).items()) if r.get("loss") is not None]


def _files(path: Path) -> list[tuple[int, Path]]:
    if not path.exists():
        raise RunError(
            f"{path}: no such file or directory; give the directory RunRecorder wrote "
            f"(RunRecorder(DIR) writes DIR/fingerprints-rank0.jsonl)"
        )
    if path.is_file():
        m = FILE_RE.match(path.name)
        return [(int(m.group(1)) if m else 0, path)]
    found = sorted((int(m.group(1)), p) for p in path.iterdir() if (m := FILE_RE.match(p.name)) and p.is_file())
    if not found:
        raise RunError(
            f"{path} holds no fingerprints-rank*.jsonl: it is not a recorded run; record one with "
            f"torchdoctor.ranks.fingerprint.RunRecorder({str(path)!r}) (see docs/runs.md)"
        )
    return found


def _parse(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The file's records; a last line cut short (a process killed mid-write) is left out with a note."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"{path}: cannot be read as a fingerprint file ({exc})") from None
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    for pos, (number, line) in enumerate(lines):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or rec.get("kind") not in ("header", "step", "steps"):
                raise ValueError("not a header or step record")
            if rec["kind"] == "step" and not isinstance(rec.get("step"), int):
                raise ValueError("a step record without an integer step")
            if rec["kind"] == "steps":
                records += block_records(rec)
                continue
        except (ValueError, KeyError, TypeError) as exc:
            if pos == len(lines) - 1 and pos > 0 and not text.endswith("\n"):
                notes.append(f"{path.name}:{number}: the last line is cut short and was left out")
                break
            raise RunError(
                f"{path}:{number}: not a RunRecorder fingerprint line ({exc}); this file was not written by "
                "RunRecorder: move it out of the run directory"
            ) from None
        records.append(rec)
    if not records or records[0].get("kind") != "header":
        raise RunError(
            f"{path}: does not start with RunRecorder's header line; record runs with "
            "torchdoctor.ranks.fingerprint.RunRecorder (see docs/runs.md)"
        )
    if records[0].get("schema") not in READABLE:
        raise RunError(
            f"{path}: fingerprint schema {records[0].get('schema')!r}; this torchdoctor reads schemas "
            f"{', '.join(map(str, READABLE))}: compare it with the torchdoctor that recorded it"
        )
    return records, notes


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One fingerprints file's records in file order, the header first, ``steps`` lines given back as step records
    (a last line cut short is left out). :class:`RunError` when it is not a RunRecorder file."""
    return _parse(Path(os.fspath(path)))[0]


def _segments(records: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[int, dict[str, Any]], int]:
    """One file's header and steps. A later header starts a new recording into the same file: from its
    first step on it replaces what was there (a run resumed from a checkpoint at that step, or the same
    directory recorded again from step 0). Returns the header of the earliest kept step and the count of
    replaced records."""
    steps: dict[int, dict[str, Any]] = {}
    owner: dict[int, dict[str, Any]] = {}
    header, replaced = records[0], 0
    current, cut = records[0], False
    for rec in records[1:]:
        if rec["kind"] == "header":
            current, cut = rec, True
            continue
        if cut:
            stale = [s for s in steps if s >= rec["step"]]
            replaced += len(stale)
            for s in stale:
                del steps[s], owner[s]
            cut = False
        steps[rec["step"]] = rec
        owner[rec["step"]] = current
    if steps:
        header = owner[min(steps)]
    return header, steps, replaced


def load_run(run_dir: str | os.PathLike[str]) -> Run:
    """Read a run directory (or one fingerprints file). :class:`RunError` names what is wrong and the fix."""
    path = Path(os.fspath(run_dir))
    meta: dict[int, dict[str, Any]] = {}
    steps: dict[int, dict[int, dict[str, Any]]] = {}
    notes: list[str] = []
    for file_rank, file in _files(path):
        records, file_notes = _parse(file)
        notes += file_notes
        rank = int(records[0].get("rank", file_rank))
        if rank in steps:
            raise RunError(f"{path}: rank {rank} is recorded in two files; keep one fingerprints file per rank")
        meta[rank], steps[rank], replaced = _segments(records)
        if replaced:
            notes.append(
                f"rank {rank}: recorded again into the same file (a resumed run, or the directory used twice); "
                f"{replaced} earlier record(s) from the step it restarted at on were replaced"
            )
    return Run(str(path), meta, steps, tuple(notes))


def finite(value: Any) -> Any:
    """``value`` with non-finite floats as strings (``"nan"``, ``"inf"``), for strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
