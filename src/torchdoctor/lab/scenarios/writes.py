"""concurrent-write: several processes append JSON lines to one file without coordination.

Each writer appends through an unbuffered text stream, as ``print(..., file=f)`` does on a stream
opened with ``buffering=0`` or on stdout under ``PYTHONUNBUFFERED=1``: ``print`` issues one
``write()`` for the record and another for the newline, so records of different processes land
between them. O_APPEND keeps each ``write()`` whole, so nothing is lost here, but two records glue
onto one line and the next line is empty. The body reads the file back the way a metrics reader
does (``json.loads`` per non-empty line), prints what it found and, when a line does not parse,
re-raises Python's own ``JSONDecodeError`` for it. The fix writes whole lines (a batch per write
call) and serialises the writes with a file lock (the ``filelock`` package).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from typing import Any

from .. import scenario

WRITERS = 4
RECORDS = 10_000
#: The fixed logger appends this many whole lines per write, each write under the file lock.
FLUSH_EVERY = 500


def _record(rank: int, step: int) -> str:
    return json.dumps({"rank": rank, "step": step, "loss": round(1.0 / (step + 1), 6)})


def _writer(rank: int, path: str, fixed: bool) -> None:
    """One process's metrics logger: a record per step, appended to the shared file."""
    with io.TextIOWrapper(open(path, "ab", buffering=0), write_through=True) as f:
        if not fixed:
            for step in range(RECORDS):
                print(_record(rank, step), file=f)
            return
        from filelock import FileLock

        lock = FileLock(path + ".lock")
        for start in range(0, RECORDS, FLUSH_EVERY):  # a buffered logger: whole lines, flushed under the lock
            chunk = "".join(_record(rank, step) + "\n" for step in range(start, min(start + FLUSH_EVERY, RECORDS)))
            with lock:
                f.write(chunk)


def _read_back(path: str) -> tuple[list[dict[str, Any]], list[int], int]:
    """Records that parse, numbers of lines that do not, and the count of empty lines."""
    records: list[dict[str, Any]] = []
    torn: list[int] = []
    empty = 0
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                empty += 1
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                torn.append(number)
    return records, torn, empty


def _lost(path: str) -> int:
    """Records written but absent from the file (each line may hold several glued records)."""
    decoder, seen = json.JSONDecoder(), set()
    with open(path) as f:
        for line in f:
            pos, line = 0, line.strip()
            while pos < len(line):
                try:
                    obj, pos = decoder.raw_decode(line, pos)
                except ValueError:
                    break
                seen.add((obj.get("rank"), obj.get("step")))
    return WRITERS * RECORDS - len(seen)


@scenario(
    name="writes-shared-jsonl",
    family="concurrent-write",
    code="TD657",
    summary=f"{WRITERS} processes append {RECORDS} JSON lines each to one file with unbuffered print(); reading it "
            "back: records glued onto one line ('JSONDecodeError: Extra data')",
    fix="serialise the appends with a file lock (filelock.FileLock around each write of whole lines)",
    seconds=3.0,
    timeout=120.0,
    memory_mb=1536,
)
def writes_shared_jsonl(fixed: bool) -> None:
    import torch.multiprocessing as mp

    where = tempfile.mkdtemp(prefix="torchdoctor-lab-writes-")
    path = os.path.join(where, "metrics.jsonl")
    try:
        mp.start_processes(_writer, args=(path, fixed), nprocs=WRITERS, start_method="fork")
        records, torn, empty = _read_back(path)
        lost = _lost(path)
        print(f"{path}: {WRITERS * RECORDS} records written by {WRITERS} processes; {len(records)} lines parse, "
              f"{len(torn)} do not, {empty} empty, {lost} records lost", flush=True)
        if torn:
            with open(path) as f:
                line = f.readlines()[torn[0] - 1]
            json.loads(line)  # the reader's own error for the first bad line
        if lost or empty:
            raise SystemExit(1)
    finally:
        shutil.rmtree(where)
