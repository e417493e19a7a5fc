"""What each rank of the smoke test writes as it goes, so that a rank that dies or hangs is still named.

A rank appends one JSON line per event to ``rank-<RANK>.jsonl`` in the directory the local launcher
gave it (``TORCHDOCTOR_DIST_DIR``); once the rendezvous store is reachable it also mirrors its step
results there, under keys of its own, so rank 0 can report ranks on other machines. Records:

- ``{"event": "hello", "rank", "world_size", "local_rank", "node_rank", "host", "pid", "t"}``
- ``{"event": "step", "step", "status": "running", "t"}`` when a step starts;
- ``{"event": "step", "step", "status": "ok"|"failed"|"timeout"|"skipped", "seconds", "message",
  "code", "details", "t"}`` when it ends (``timeout``: the rank's own watchdog fired);
- ``{"event": "stopped", "step", "signal", "t"}`` when the launcher ended the rank mid-step;
- ``{"event": "gathered", "ranks": {...}, "findings": [...], "bandwidth": [...]}`` (rank 0 only);
- ``{"event": "end", "ok", "t"}``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DIR_VAR = "TORCHDOCTOR_DIST_DIR"
#: Prefix of the store keys the ranks write (per run: torchrun's run id, when there is one).
KEY_PREFIX = "torchdoctor/dist"


def journal_name(rank: str) -> str:
    return f"rank-{rank}.jsonl"


class Journal:
    """Append-only record of one rank; every write is one ``write(2)`` of one line (O_APPEND)."""

    def __init__(self, directory: str | None, rank: str) -> None:
        self.path = Path(directory) / journal_name(rank) if directory else None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if self.path else None
        self._lock = threading.Lock()
        self.steps: list[dict[str, Any]] = []
        self.store: Any = None
        self.store_key = ""
        self.gathered: dict[str, Any] | None = None
        self.hello: dict[str, Any] = {}
        self.notes: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any], mirror_wait: float | None = None) -> None:
        """Append ``record``; mirror it to the store. ``mirror_wait``: give the store at most that long
        (a thread about to end the process must not block on a store the main thread is using)."""
        record = {**record, "t": round(time.time(), 3)}
        with self._lock:
            if record.get("event") == "step" and record.get("status") != "running":
                self.steps.append(record)
            if record.get("event") == "hello":
                self.hello = record
            if record.get("event") == "note":
                self.notes.append(record)
            if record.get("event") == "gathered":
                self.gathered = record
            if self._fd is not None:
                os.write(self._fd, (json.dumps(record, default=str) + "\n").encode())
            store = self.store
        if store is None:
            return
        if mirror_wait is None:
            self._mirror(record)
            return
        thread = threading.Thread(target=self._mirror, args=(record,), daemon=True)
        thread.start()
        thread.join(mirror_wait)

    def attach(self, store: Any, key: str) -> None:
        """Mirror this rank's records to the rendezvous store from now on (and what came before)."""
        with self._lock:
            self.store, self.store_key = store, key
        self._mirror({"event": "attached"})

    def mirror(self, last: dict[str, Any] | None = None) -> dict[str, Any]:
        """What this rank shows the others: who it is, its step results, its last record."""
        return {"hello": self.hello, "notes": self.notes, "steps": self.steps, "last": last or {"event": "end"}}

    def _mirror(self, record: dict[str, Any]) -> None:
        store = self.store
        if store is None:
            return
        try:
            store.set(self.store_key, json.dumps(self.mirror(record), default=str))
        except Exception:  # noqa: BLE001 - the store went away with the job; the file journal remains
            self.store = None


def read_records(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete lines of a journal from ``offset``; returns them and the offset after the last one."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    out = []
    for line in data[:end].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out, offset + end


def journals(directory: Path) -> Iterator[Path]:
    yield from sorted(directory.glob("rank-*.jsonl"))


def rank_of(path: Path) -> int | None:
    """The rank a journal belongs to, from its name (``rank-3.jsonl``); None for a rank without a number."""
    stem = path.name.removeprefix("rank-").removesuffix(".jsonl")
    return int(stem) if stem.isdigit() else None


def records_in(directory: Path) -> dict[int | None, list[dict[str, Any]]]:
    """Every journal of a run directory, read whole: rank -> records."""
    return {rank_of(path): read_records(path)[0] for path in journals(directory)}
