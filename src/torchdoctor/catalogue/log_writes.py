"""TD657, TD659-TD664: several processes writing one file or directory, as it shows up in logs.

Concurrent writers leave no error of their own; these codes recognise what the *readers* of the
damaged file, or the losers of a rename or delete race, print.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature
from ..signature import prose_gap as _gap
from .log_storage import _ATOMIC

TD657 = register(
    Code(
        code="TD657",
        name="json-records-glued",
        family="concurrent-write",
        severity=Severity.WARNING,
        area="storage",
        title="a JSON line holds more than one record (writers interleaved)",
        message="A JSON document was followed by more data on the same line (`JSONDecodeError: Extra data` at column "
        "{column}): typical of a JSON-lines file appended to by several processes at once, whose records and "
        "newlines were interleaved.",
        fix="Write from one process (rank 0: `if dist.get_rank() == 0:`), give each process its own file "
        "(`metrics.rank$RANK.jsonl`), or serialise the appends: `with filelock.FileLock(path + '.lock'): "
        "f.write(line)` with the whole line in one write call.",
        meaning="print() issues one write for the text and another for the newline; with unbuffered or line-buffered "
        "streams shared by several processes (ranks, DataLoader workers, stdout redirected to one file), "
        "another process's record can land in between, gluing two records onto one line and leaving an "
        "empty one.",
        why="Several ranks or workers appending to the same metrics or log file without coordination.",
        false_positives="Any JSON text with trailing content on the same line gives the same error (two documents written "
        "to one file on purpose, a response with junk after it). Reading a whole JSON-lines file with "
        "json.load() fails at 'line 2 column 1' instead: that form is not matched.",
        related=("TD610", "TD659", "TD660"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Extra data: line",),
                # Python >= 3.5 (JSONDecodeError); Python 2.7 and 3.0-3.4 raise a ValueError whose errmsg() also
                # names where the extra data ends: "line 1 column 3 - line 1 column 73 (char 2 - 72)"
                pattern=r"(?:JSONDecodeError|ValueError): Extra data: line (?P<line>\d+) column (?P<column>\d+) "
                r"(?:- line \d+ column \d+ )?\(char (?P<char>\d+)(?: - \d+)?\)",
                # column 1: the extra data starts a new line, i.e. a whole JSON-lines file read with json.load()
                exclude=(r"Extra data: line \d+ column 1 (?:\(|- line)",),
                confidence=0.55,
            ),
            Signature(  # prose: "repeated logs, as many times as GPUs", "every line is printed once per process"
                role=Role.SYMPTOM,
                # prose signatures end with their triggers: a line cut short never matches on its first half
                triggers=("GPU", "gpu", "process", "rank", "device", "worker", "DDP", "ddp"),
                pattern=r"(?i)(?:\b(?:repeated|duplicated?)\s+(?:logs?|log lines|lines|messages|outputs?|prints?)|"
                r"\b(?:logs?|lines?|messages?|outputs?)\b"
                + _gap(30, "(?i:repeat|duplicat)")
                + r"\b(?:repeated|duplicated|printed|logged|"
                r"written)\b)"
                + _gap(80, "(?i:rank|gpu|process|device|worker|node|ddp|distributed)")
                + r"(?:\bnumber of (?:gpus|processes|ranks|devices)|\b(?:each|every|per|all) "
                r"(?:gpus?|process(?:es)?|ranks?|devices?|workers?)|\bddp)\b",
                confidence=0.5,
                confirm="Prefix each line with its rank (`torchrun --tee 3`, or log `dist.get_rank()`): one copy per rank "
                "means every process writes the same log; log from rank 0 only (`rank_zero_only`, "
                "`if dist.get_rank() == 0`).",
            ),
        ),
    )
)


_ONE_WRITER = (
    "Let one process write it: rank 0 only (`if dist.get_rank() == 0:`, `trainer.is_global_zero`, "
    "`trainer.is_world_process_zero()`) with a barrier (`dist.barrier()`) before the others read it; or give "
    "every process its own path (`f'ckpt.rank{rank}.pt'`)."
)

TD659 = register(
    Code(
        code="TD659",
        name="checkpoint-publish-race",
        family="concurrent-write",
        severity=Severity.ERROR,
        area="storage",
        title="several processes renamed the same staging directory or file into place",
        message="Several processes published the same checkpoint at once: {what}. Typically every rank (or every node "
        "on a shared file system) runs the write-then-rename code, and only the first rename can win.",
        fix=_ONE_WRITER + " The rename itself: one process renames the staging directory after a barrier, the others "
        "wait for it. With Hugging Face Trainer, upgrade transformers past 4.36 (its staging-directory rename ran on "
        "several processes) and keep `save_on_each_node=False` when the output directory is shared by the nodes.",
        meaning="Saving into a temporary name and renaming it to the final one makes a save atomic for one writer. When "
        "several processes do it with the same names, the first rename moves the staging path away: the others "
        "find no source (`FileNotFoundError: ... 'tmp-...' -> '...'`), or, with one staging directory per "
        "process, find the final directory already full (`OSError: [Errno 39] Directory not empty: ... -> ...`).",
        why="Checkpoint code that is not guarded by a rank check, multi-node jobs whose nodes share the output directory "
        "(each node's local rank 0 saves), framework versions that published checkpoints from every process.",
        false_positives="A rename whose source was never created fails the same way in a single process; only renames "
        "from temporary-looking names (tmp, temp, staging) are matched.",
        related=("TD610", "TD657", "TD660", "TD661"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("' -> '",),
                pattern=r"\[Errno 2\] No such file or directory: '(?P<source>(?:[^']*/)?[^'/]*(?i:tmp|temp|staging)"
                r"[^'/]*)' -> '(?P<target>[^']+)'",
                values={"what": "the staging path was already renamed away by another process (ENOENT)"},
                confidence=0.75,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("' -> '",),
                pattern=r"\[Errno 39\] Directory not empty: '(?P<source>(?:[^']*/)?[^'/]*(?i:tmp|temp|staging)[^'/]*)' -> "
                r"'(?P<target>[^']+)'",
                values={"what": "the final directory already held another process's checkpoint (ENOTEMPTY)"},
                confidence=0.75,
            ),
            Signature(  # "saving checkpoint crashes in multi-gpu (DDP): OSError: [Errno 39] Directory not empty"
                role=Role.SYMPTOM,
                triggers=("[Errno 39] Directory not empty",),
                pattern=r"(?i)(?:checkpoint|\bddp\b|multi[- ]?(?:gpu|node)|\branks?\b|distributed|processes).{0,80}"
                r"\[Errno 39\] Directory not empty",
                exclude=(r"' -> '",),
                values={"what": "the final directory already held another process's checkpoint (ENOTEMPTY)"},
                confidence=0.65,
                confirm="Read the full traceback of each rank: an `os.rename`/`shutil.move` of a temporary checkpoint "
                "directory failing on all ranks but one confirms it.",
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("tmp-checkpoint-",),
                pattern=r"\[Errno 2\] No such file or directory: '(?P<path>[^']*tmp-checkpoint-\d+[^']*)'",
                exclude=(r"' -> '",),
                values={
                    "what": "a path inside Hugging Face Trainer's staging directory tmp-checkpoint-N vanished (another "
                    "process renamed or removed it)"
                },
                confidence=0.65,
            ),
        ),
    )
)

TD660 = register(
    Code(
        code="TD660",
        name="checkpoint-storage-size-mismatch",
        family="concurrent-write",
        severity=Severity.ERROR,
        area="storage",
        title="torch.load found storage sizes that do not match the data (a checkpoint written by several processes)",
        message="torch.load read a storage size from the checkpoint that does not match its data (`storage has wrong "
        "size`): the file's bytes are inconsistent, typically because several processes saved to the same path "
        "at once and their writes landed at each other's offsets.",
        fix="If the file was downloaded, download it again and compare its size or checksum. If your job wrote it: "
        + _ONE_WRITER
        + " Then "
        + _ATOMIC
        + ".",
        meaning="The pre-1.6 checkpoint format stores a pickled header followed by each storage prefixed with its size; "
        "torch.load reads the size at the offset the header implies. When processes whose pickles differ by a "
        "few bytes (per-rank counters, RNG states) write one file at the same time, the offsets no longer line "
        "up and the size read is garbage (huge or negative). torch 2.x prints the numbers after a literal "
        "'expected %ld got %ld'.",
        why="torch.save called on every rank with the same path (no rank check), several runs or scripts sharing an "
        "output directory; more rarely a file damaged in transfer.",
        false_positives="A file corrupted in a copy or download gives the same message; the current zip format fails "
        "differently when written concurrently (TD656).",
        related=("TD656", "TD659", "TD657"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("storage has wrong",),
                pattern=r"storage has wrong (?:byte )?size: expected (?P<expected>-?\d+|%ld) got (?P<got>\d+|%ld)",
                confidence=0.7,
            ),
        ),
    )
)


_RMTREE_WALK = (
    # shutil.rmtree's own operations on entries *inside* the tree (3.8-3.13, fd-based walk), each as
    # the frame line's end and the source line under it: a FileNotFoundError there means an entry
    # that rmtree had just listed was gone (another process deleted it first)
    "in _rmtree_safe_fd\nos.unlink(",
    "in _rmtree_safe_fd\nos.rmdir(",
    "in _rmtree_safe_fd\norig_st = entry.stat(",
    "in _rmtree_safe_fd\ndirfd = os.open(",
    "in _rmtree_safe_fd\ntopfd = os.open(",
    "in _rmtree_safe_fd\nwith os.scandir(",
    # the top directory, after rmtree saw it (<= 3.12): open after lstat, rmdir after the walk
    "in rmtree\nfd = os.open(",
    "in rmtree\nos.rmdir(",
    # platforms without dir_fd support
    "in _rmtree_unsafe\nos.unlink(",
    "in _rmtree_unsafe\nos.rmdir(",
)
"""Where rmtree fails when it loses a race. Deliberately absent: ``os.lstat(path`` on the top directory
(in ``rmtree``, or in 3.13's ``_rmtree_safe_fd``), which is how a directory that never existed fails."""

TD661 = register(
    Code(
        code="TD661",
        name="rmtree-race",
        family="concurrent-write",
        severity=Severity.ERROR,
        area="storage",
        title="shutil.rmtree lost a race: another process deleted the same tree first",
        message="shutil.rmtree stopped because '{path}' vanished while it was walking the tree: another process "
        "deleted it first, typically every rank removing the same old checkpoint (checkpoint rotation, "
        "save_total_limit, cleaning an output directory). rmtree names entries inside the tree relative to "
        "their directory, so '{path}' may be a bare file name.",
        fix="Delete from one process and let the others wait: `if dist.get_rank() == 0: shutil.rmtree(path)` then "
        "`dist.barrier()` (`trainer.is_world_process_zero()` with Hugging Face Trainer, `trainer.is_global_zero` "
        "with Lightning, `accelerator.is_main_process` with Accelerate); on several nodes sharing the directory, "
        "the global rank 0 only. Where any process may clean up, tolerate the others: "
        "`shutil.rmtree(path, ignore_errors=True)` (Python 3.13's rmtree already ignores entries that vanish "
        "inside the tree, not the top directory).",
        meaning="rmtree lists a directory, then unlinks each entry and recurses into subdirectories. When several "
        "processes run it on the same tree at once, each lists entries that another one removes before it gets "
        "to them; the losers get ENOENT from unlink, rmdir, open or stat inside the walk, and the one that "
        "finishes last finds the top directory already gone.",
        why="Checkpoint rotation or cleanup code that is not guarded by a rank check (every rank deletes "
        "checkpoint-N), several nodes sharing an output directory, two jobs cleaning one cache or temp directory.",
        false_positives="On NFS, a `.nfsXXXX` placeholder of a file that another process still holds open disappears "
        "when that process closes it, with the same error inside the walk: the fix (one deleter, or "
        "ignore_errors) is the same. rmtree of a directory that does not exist fails at its first "
        "lstat and is not matched; neither is a FileNotFoundError outside rmtree. Hugging Face "
        "Trainer's staging directory (tmp-checkpoint-N) is TD659.",
        related=("TD659", "TD657", "TD660"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("No such file or directory",),
                pattern=r"FileNotFoundError: \[Errno 2\] No such file or directory: '(?P<path>[^']+)'",
                exclude=(r"' -> '", r"tmp-checkpoint-\d+"),
                context=_RMTREE_WALK,
                confidence=0.8,
            ),
        ),
    )
)


TD662 = register(
    Code(
        code="TD662",
        name="checkpoint-record-missing",
        family="concurrent-write",
        severity=Severity.ERROR,
        area="storage",
        title="torch.load found no record for a storage its pickle names (a zip checkpoint written by several processes)",
        message="torch.load could not find the storage record {record} in the checkpoint archive: the archive's index "
        "and its pickled object do not belong together, typically because several processes saved to the same "
        "path at once.",
        fix="If the file was downloaded, download it again. If your job wrote it: "
        + _ONE_WRITER
        + " Then "
        + _ATOMIC
        + ".",
        meaning="A zip-format checkpoint holds a pickle (data.pkl) naming its storages (data/0, data/1, ...; in torch "
        "1.6-1.8 the storage's memory address, data/94308821128336) and one record per storage, listed in the "
        "central directory written at the end. A file that is merely cut short has no central directory (TD656); "
        "a complete archive whose pickle names records it does not hold was assembled from two writers: the "
        "pickle of one process and the index of another.",
        why="torch.save called on every rank (or on every node's local rank 0) with the same path; two runs writing one "
        "output directory; more rarely a file edited or assembled by hand.",
        false_positives="`failed locating file constants.pkl` or `data.pkl` is a different problem (a TorchScript or a "
        "non-torch zip loaded with the wrong function) and is not matched.",
        related=("TD656", "TD660", "TD659"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("PytorchStreamReader failed locating file",),
                pattern=r"PytorchStreamReader failed locating file (?P<record>data/\d+): file not found",
                confidence=0.7,
            ),
            Signature(  # torch 1.6-1.8: "[enforce fail at inline_container.cc:222] . file not found: archive/data/943..."
                role=Role.ROOT_CAUSE,
                triggers=("file not found: archive/data/",),
                pattern=r"file not found: (?P<record>[^/\s]+/data/\d+)",
                confidence=0.7,
            ),
        ),
    )
)

_MAKEDIRS = (
    # os.makedirs' own mkdir (3.x), os.mkdir called directly, pathlib
    "in makedirs\nmkdir(name, mode)",
    "os.makedirs(",
    "os.mkdir(",
    ".mkdir(",
)

TD663 = register(
    Code(
        code="TD663",
        name="makedirs-race",
        family="concurrent-write",
        severity=Severity.ERROR,
        area="storage",
        title="several processes created the same directory at once (FileExistsError)",
        message="Creating a directory failed with `File exists` (EEXIST){where}: when every rank runs the same "
        "`if not exists: makedirs` code, another process creates the directory between the check and the "
        "creation.",
        fix="Create it race-free: `os.makedirs(path, exist_ok=True)` (`Path.mkdir(parents=True, exist_ok=True)`), or "
        "create it on rank 0 only followed by `dist.barrier()` (`trainer.is_global_zero`, "
        "`accelerator.is_main_process`); on several nodes sharing the directory, global rank 0.",
        meaning="`os.path.exists()` followed by `os.makedirs()` is a check-then-act race: processes started together "
        "(DDP ranks, spawned workers, array jobs) all see no directory, one creates it, the others fail with "
        "FileExistsError ([Errno 17]). It is timing-dependent: some runs pass.",
        why="Output, log or checkpoint directories created by every rank at start-up, TensorBoard writers per rank, "
        "framework versions that created directories without exist_ok.",
        false_positives="A single process creating a directory left by an earlier run fails the same way (then it fails "
        "every time, not only sometimes, and with one process); the confirm step tells them apart.",
        related=("TD659", "TD661", "TD657"),
        signatures=(
            Signature(  # the exception in a process started by torch.multiprocessing / a distributed launcher
                role=Role.ROOT_CAUSE,
                triggers=("[Errno 17] File exists",),
                pattern=r"(?:FileExistsError|OSError): \[Errno 17\] File exists(?:: '(?P<path>[^']*)')?",
                context=(
                    "torch/multiprocessing/spawn.py",
                    "in _wrap\nfn(i, *args)",
                    "torch/distributed/",
                    "local_rank",
                    "is_main_process",
                    "get_rank()",
                ),
                values={"where": " in a process started next to others"},
                confidence=0.7,
            ),
            Signature(  # the exception alone: a race only when several processes ran that code
                role=Role.SYMPTOM,
                triggers=("[Errno 17] File exists",),
                pattern=r"(?:FileExistsError|OSError): \[Errno 17\] File exists(?:: '(?P<path>[^']*)')?",
                context=_MAKEDIRS,
                values={"where": ""},
                confidence=0.5,
                confirm="Count the processes that ran this code (ranks, workers, array tasks): with one, an earlier run left "
                "the directory (use exist_ok=True or a new path); with several, it is this race, and it comes "
                "and goes between runs.",
            ),
            Signature(  # prose: "when training on multiple nodes ... it will raise FileExistsError"
                role=Role.SYMPTOM,
                triggers=("FileExistsError",),
                pattern=r"(?i)(?:multi[- ]?(?:gpu|node|process)|multiple (?:gpus|nodes|processes)|several (?:gpus|nodes|"
                r"processes)|\bddp\b|distributed|\branks?\b|simultaneous|same time|race).{0,100}FileExistsError",
                exclude=(r"FileExistsError: \[Errno 17\]",),
                values={"where": ""},
                confidence=0.6,
                confirm="Look for `os.makedirs` (or `os.mkdir`) without `exist_ok=True` in the failing frame, reached by "
                "every rank; the error appearing on some runs only confirms the race.",
            ),
            Signature(  # prose naming the exception alone ("this regularly creates FileExistsErrors")
                role=Role.SYMPTOM,
                triggers=("FileExistsError",),
                pattern=r"FileExistsError(?!: \[Errno)",
                values={"where": ""},
                confidence=0.45,
                confirm="Check whether several processes run the directory-creating code (DDP ranks, spawned workers): "
                "`os.makedirs` without `exist_ok=True` after an existence check then races.",
            ),
        ),
    )
)

_WRITE_VERB = (
    r"(?:sav(?:e|es|ed|ing)|writ(?:e|es|ing|ten)|wrote|overwrit\w*|log(?:s|ged|ging)?|append(?:s|ed|ing)?|"
    r"dump(?:s|ed|ing)?)"
)
_WRITE_TRIGGERS = ("save", "Save", "saving", "writ", "Writ", "wrote", "log", "Log", "append", "dump")
_SEVERAL = (
    r"(?:every|each|all(?: the)?|both|multiple|several|different|many|two)\s+"
    r"(?:ranks?|process(?:es|ors?)?|gpus?|nodes?|workers?|devices?|machines?)\b"
)
_SEVERAL_TRIGGERS = (
    "rank",
    "Rank",
    "process",
    "Process",
    "GPU",
    "gpu",
    "node",
    "Node",
    "worker",
    "Worker",
    "device",
    "machine",
)
_SAME_PLACE = r"(?:the\s+)?same\s+(?:file|path|location|checkpoint|directory|folder|dir|log|name|file ?name)\b"
_PER_RANK_FILES = r"(?i)\bshard|\brank ?\{|\{rank\}|per[- ]rank\b"
"""Files every rank writes by design (FSDP / distributed-checkpoint shards, names with the rank in them)."""
_WHO_WRITES = (
    "Print the rank (`dist.get_rank()`, `trainer.global_rank`) next to the code that writes the file: every rank "
    "printing it confirms it; the file holding each line several times, or a checkpoint that loads on some runs "
    "and not others, does too."
)

TD664 = register(
    Code(
        code="TD664",
        name="ranks-write-one-path",
        family="concurrent-write",
        severity=Severity.WARNING,
        area="storage",
        title="every rank (or worker) writes the same file: a report that describes it",
        message="The report describes several processes writing one path ({how}): their writes interleave or replace "
        "each other, so the file can come out mangled, truncated, or half one rank's and half another's, and only on "
        "some runs.",
        fix=_ONE_WRITER + " For logs every rank appends to, give each rank its own file or append whole lines with "
        "`torchdoctor.RankFile`. For checkpoints, also " + _ATOMIC + ".",
        meaning="Under DDP every rank runs the same script, so code that saves, logs or caches without asking for the "
        "rank runs N times at once on the same path. The file system keeps no order between them.",
        why="`torch.save` / `save_pretrained` / a logger's file handler / a cache writer not guarded by "
        "`if rank == 0`; `local_rank == 0` used as the guard on a multi-node run (one writer per node on a "
        "shared file system).",
        false_positives="Each rank writing its own file (the fix) reads the same in prose; so does a report of one "
        "process saving several files.",
        related=("TD660", "TD662", "TD657", "TD663"),
        signatures=(
            Signature(  # "every processor(GPU) would save an checkpoint", "runs on different ranks and write ..."
                role=Role.SYMPTOM,
                triggers=_WRITE_TRIGGERS,
                pattern=r"(?i)\b"
                + _SEVERAL
                + r"(?:\([^)\n]{0,20}\))?"
                + _gap(60, _WRITE_VERB)
                + r"\b"
                + _WRITE_VERB
                + r"\b",
                exclude=(r"(?i)\b(?:its|their) own\b", r"(?i)\bsav(?:e|es|ed|ing) (?:memory|time)\b", _PER_RANK_FILES),
                values={"how": "several processes saving or writing"},
                confidence=0.5,
                confirm=_WHO_WRITES,
            ),
            Signature(  # "... will save their checkpoints with same file name", "writing to the same location"
                role=Role.SYMPTOM,
                triggers=("same",),
                pattern=r"(?i)\b" + _WRITE_VERB + r"\b" + _gap(60, r"(?i:same)") + r"\b" + _SAME_PLACE,
                values={"how": "processes writing the same path"},
                confidence=0.55,
                confirm=_WHO_WRITES,
            ),
            Signature(  # "saved by every rank", "written from all processes"
                role=Role.SYMPTOM,
                triggers=_SEVERAL_TRIGGERS,
                pattern=r"(?i)\b" + _WRITE_VERB + r"\s+(?:\w+\s+){0,3}?(?:by|from|on|in)\s+" + _SEVERAL,
                exclude=(r"(?i)\b(?:its|their) own\b", _PER_RANK_FILES),
                values={"how": "a file written by several processes"},
                confidence=0.5,
                confirm=_WHO_WRITES,
            ),
        ),
    )
)
