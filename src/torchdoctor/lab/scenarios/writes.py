"""concurrent-write: several processes write the same file or directory without coordination.

``writes-shared-jsonl``: processes append JSON lines to one file.
Each writer appends through an unbuffered text stream, as ``print(..., file=f)`` does on a stream
opened with ``buffering=0`` or on stdout under ``PYTHONUNBUFFERED=1``: ``print`` issues one
``write()`` for the record and another for the newline, so records of different processes land
between them. O_APPEND keeps each ``write()`` whole, so nothing is lost here, but two records glue
onto one line and the next line is empty. The body reads the file back the way a metrics reader
does (``json.loads`` per non-empty line), prints what it found and, when a line does not parse,
re-raises Python's own ``JSONDecodeError`` for it. The fix writes whole lines (a batch per write
call) and serialises the writes with a file lock (the ``filelock`` package).

``writes-ranks-rename-staging`` / ``writes-ranks-rename-own-staging``: every rank publishes the
checkpoint directory by renaming a staging directory (shared, or one per rank) to the final name;
one rename wins and the others fail (ENOENT, or ENOTEMPTY onto the winner's directory). The fix
lets one process publish.

``writes-ranks-same-checkpoint``: every rank torch.saves to one path at once (legacy format, whose
storages are read back at offsets recorded in the file), then the job resumes from it. The fix
saves from rank 0 only. The race is real, so the failing variant repeats save-and-load rounds
until torch.load fails; it prints every round.

``writes-ranks-rmtree-checkpoint``: every rank rotates checkpoints the way an unguarded
``save_total_limit`` does: ``shutil.rmtree`` of the same old checkpoint directory, started together.
The losers find entries gone that rmtree had just listed (FileNotFoundError inside the walk). The
fix deletes from rank 0 only, the others wait at a barrier.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import tempfile
from typing import Any

from .. import scenario

WRITERS = 4
RECORDS = 10_000


def _record(rank: int, step: int) -> str:
    return json.dumps({"rank": rank, "step": step, "loss": round(1.0 / (step + 1), 6)})


def _writer(rank: int, path: str, fixed: bool) -> None:
    """One process's metrics logger: a record per step, appended to the shared file with print()."""
    if fixed:
        from torchdoctor import RankFile

        with RankFile(path) as rf:  # the guard
            for step in range(RECORDS):
                print(_record(rank, step), file=rf)
        return
    with io.TextIOWrapper(open(path, "ab", buffering=0), write_through=True) as f:
        for step in range(RECORDS):
            print(_record(rank, step), file=f)


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
    fix="torchdoctor.RankFile(path): whole lines, one O_APPEND write each, whatever print() does",
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
        print(
            f"{path}: {WRITERS * RECORDS} records written by {WRITERS} processes; {len(records)} lines parse, "
            f"{len(torn)} do not, {empty} empty, {lost} records lost",
            flush=True,
        )
        if torn:
            with open(path) as f:
                line = f.readlines()[torn[0] - 1]
            json.loads(line)  # the reader's own error for the first bad line
        if lost or empty:
            raise SystemExit(1)
    finally:
        shutil.rmtree(where)


# -- ranks publishing one checkpoint directory: stage, then rename ----------------------------------

RANKS = 4
STEP = 49


def _publish(rank: int, root: str, barrier: Any, fixed: bool, shared_stage: bool) -> None:
    """One rank's end of a Trainer-style save: write its shard into a staging directory, then rename
    the staging directory to the final checkpoint name (what Hugging Face Trainer 4.36 did on every
    process). ``shared_stage``: one staging name for all ranks; otherwise each rank makes its own."""
    final = os.path.join(root, f"checkpoint-{STEP}")
    if shared_stage:
        stage = os.path.join(root, f"tmp-checkpoint-{STEP}")
        os.makedirs(stage, exist_ok=True)
    else:
        stage = tempfile.mkdtemp(prefix="tmp-checkpoint-", dir=root)
    with open(os.path.join(stage, f"rng_state_{rank}.pth"), "wb") as f:
        f.write(os.urandom(64))
    barrier.wait()  # every rank has written its part
    if not fixed:
        os.rename(stage, final)
        return
    if shared_stage and rank == 0:  # the fix: one process publishes, the others wait for it
        os.rename(stage, final)
    elif not shared_stage:  # own staging directories: each rank moves its files into the final one, rank 0 makes it
        if rank == 0:
            os.makedirs(final)
        barrier.wait()
        for name in os.listdir(stage):
            os.replace(os.path.join(stage, name), os.path.join(final, name))
        os.rmdir(stage)
    barrier.wait()
    assert os.path.isdir(final)


def _run_publish(fixed: bool, shared_stage: bool) -> None:
    import multiprocessing

    import torch.multiprocessing as mp

    root = tempfile.mkdtemp(prefix="torchdoctor-lab-publish-")
    try:
        barrier = multiprocessing.get_context("fork").Barrier(RANKS, timeout=30)
        mp.start_processes(_publish, args=(root, barrier, fixed, shared_stage), nprocs=RANKS, start_method="fork")
        final = os.path.join(root, f"checkpoint-{STEP}")
        print(f"{final}: {sorted(os.listdir(final))}; left in {root}: {sorted(os.listdir(root))}", flush=True)
    finally:
        shutil.rmtree(root)


@scenario(
    name="writes-ranks-rename-staging",
    family="concurrent-write",
    code="TD659",
    summary=f"{RANKS} ranks write into one staging directory tmp-checkpoint-{STEP}, then each renames it to "
    f"checkpoint-{STEP}: the first rename wins, the others fail with FileNotFoundError '...' -> '...'",
    fix="one process renames (rank 0, after a barrier); the others wait for it",
    seconds=2.0,
    timeout=60.0,
    memory_mb=1536,
)
def writes_ranks_rename_staging(fixed: bool) -> None:
    _run_publish(fixed, shared_stage=True)


@scenario(
    name="writes-ranks-rename-own-staging",
    family="concurrent-write",
    code="TD659",
    summary=f"{RANKS} ranks each write into their own staging directory tmp-checkpoint-XXXX, then rename it to "
    f"checkpoint-{STEP}: the first rename wins, the others fail with '[Errno 39] Directory not empty'",
    fix="rank 0 creates the final directory, every rank moves its own files into it (os.replace per file)",
    seconds=2.0,
    timeout=60.0,
    memory_mb=1536,
)
def writes_ranks_rename_own_staging(fixed: bool) -> None:
    _run_publish(fixed, shared_stage=False)


# -- ranks saving one checkpoint path ---------------------------------------------------------------

#: Rounds of "every rank saves, then resume from the file"; the race shows within a few.
SAVE_ROUNDS = 25
LAYERS = 64
LAYER_ELEMS = 4096


def _save_same_path(rank: int, path: str, barrier: Any, fixed: bool) -> None:
    """Every rank saves 'the' checkpoint to one path (no rank check), in the legacy (non-zip) format that
    torch used before 1.6. The rank-local counters pickle to a few bytes more or less on each rank, so
    the ranks' files differ in layout: writes of one rank land at offsets of another's."""
    import torch

    state = {
        "samples_seen": 100 * (rank + 1) ** 4,
        "rank_rng": [rank] * (rank + 1),
        **{f"layer{i}.weight": torch.full((LAYER_ELEMS,), float(i)) for i in range(LAYERS)},
    }
    barrier.wait()
    if fixed:
        import torchdoctor

        os.environ["RANK"] = str(rank)  # as torchrun sets it
        torchdoctor.save(state, path, rank0_only=True)  # the guard
        return
    torch.save(state, path, _use_new_zipfile_serialization=False)


@scenario(
    name="writes-ranks-same-checkpoint",
    family="concurrent-write",
    code="TD660",
    summary=f"{RANKS} ranks torch.save (legacy format) to one path at once, then the job resumes from it: "
    f"torch.load fails with 'storage has wrong size' (repeated up to {SAVE_ROUNDS} rounds until it shows)",
    fix="torchdoctor.save(state, path, rank0_only=True): rank 0 writes, atomically; the others skip",
    seconds=4.0,
    timeout=120.0,
    memory_mb=1536,
)
def writes_ranks_same_checkpoint(fixed: bool) -> None:
    import multiprocessing

    import torch
    import torch.multiprocessing as mp

    where = tempfile.mkdtemp(prefix="torchdoctor-lab-samepath-")
    path = os.path.join(where, "last.pt")
    loaded = 0
    try:
        for rnd in range(1, SAVE_ROUNDS + 1):
            barrier = multiprocessing.get_context("fork").Barrier(RANKS, timeout=30)
            mp.start_processes(_save_same_path, args=(path, barrier, fixed), nprocs=RANKS, start_method="fork")
            print(
                f"round {rnd}: {os.path.getsize(path)} bytes saved by {1 if fixed else RANKS} process(es)", flush=True
            )
            try:
                state = torch.load(path, weights_only=False)
            except (pickle.UnpicklingError, MemoryError) as exc:  # the same race seen earlier in the file:
                # zeros where a truncating open left a hole, or a torn size field asking for absurd memory
                print(f"round {rnd}: torch.load failed: {exc!r}", flush=True)
                continue
            assert len(state) == LAYERS + 2
            loaded += 1
        print(f"resumed {loaded} of {SAVE_ROUNDS} times from {path}", flush=True)
        if loaded < SAVE_ROUNDS:
            raise SystemExit(1)
    finally:
        shutil.rmtree(where)


# -- ranks deleting one old checkpoint directory ----------------------------------------------------

#: The old checkpoint every rank deletes: SHARDS directories of FILES_PER_SHARD empty files, enough
#: entries that the ranks' walks overlap.
SHARDS = 8
FILES_PER_SHARD = 400
OLD_STEP = 500


def _old_checkpoint(root: str) -> str:
    old = os.path.join(root, f"checkpoint-{OLD_STEP}")
    for shard in range(SHARDS):
        sub = os.path.join(old, f"shard-{shard:02d}")
        os.makedirs(sub)
        for i in range(FILES_PER_SHARD):
            open(os.path.join(sub, f"rng_state_{i}.pth"), "wb").close()
    return old


def _rotate(rank: int, old: str, barrier: Any, fixed: bool) -> None:
    """One rank's checkpoint rotation after saving a newer one: delete the oldest checkpoint."""
    barrier.wait()  # the ranks reach the rotation together, as after a collective save
    if not fixed or rank == 0:
        shutil.rmtree(old)
    if fixed:
        barrier.wait()  # the others wait for rank 0's delete
    assert not os.path.exists(old)


@scenario(
    name="writes-ranks-rmtree-checkpoint",
    family="concurrent-write",
    code="TD661",
    summary=f"{RANKS} ranks shutil.rmtree the same old checkpoint directory ({SHARDS * FILES_PER_SHARD} files) at "
    "once: the losers fail with FileNotFoundError on entries another rank deleted first",
    fix="rank 0 deletes, the other ranks wait at a barrier",
    seconds=2.0,
    timeout=60.0,
    memory_mb=1536,
)
def writes_ranks_rmtree_checkpoint(fixed: bool) -> None:
    import multiprocessing

    import torch.multiprocessing as mp

    root = tempfile.mkdtemp(prefix="torchdoctor-lab-rotate-")
    try:
        old = _old_checkpoint(root)
        barrier = multiprocessing.get_context("fork").Barrier(RANKS, timeout=30)
        mp.start_processes(_rotate, args=(old, barrier, fixed), nprocs=RANKS, start_method="fork")
        print(
            f"{old}: deleted by {1 if fixed else RANKS} rank(s); left in {root}: {sorted(os.listdir(root))}", flush=True
        )
    finally:
        shutil.rmtree(root)
