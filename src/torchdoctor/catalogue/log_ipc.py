"""TD15x-19x: shared memory, memory maps and descriptors as they show up in logs (``explain``).

Each code carries the signatures that recognise it; positive and near-miss fixtures live in
``tests/fixtures/logs/<CODE>/``.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature

TD150 = register(Code(
    code="TD150",
    name="fd-ancdata-exhausted",
    family="fd-exhausted",
    severity=Severity.ERROR,
    area="shm",
    title="a process ran out of file descriptors while receiving shared tensors",
    message="A tensor's file descriptor could not be received (`received {items} items of ancdata`): the receiving "
            "process hit its open-file limit under the file_descriptor sharing strategy.",
    fix="Raise the limit before starting (`ulimit -n $(ulimit -Hn)`), or call "
        "`torch.multiprocessing.set_sharing_strategy('file_system')` in every process, or share fewer, larger "
        "tensors (stack them, or return numpy arrays from the dataset).",
    meaning="With the file_descriptor strategy every tensor storage passed between processes travels as a file "
            "descriptor over a Unix socket; each one kept alive by the receiver stays open. When the receiver is at "
            "RLIMIT_NOFILE, the kernel drops the descriptors and Python reports 0 items of ancdata.",
    why="Many small tensors in flight or kept (a list of received tensors, a dataset shared to spawn workers) and "
        "a soft open-file limit of 1024 or a few thousand.",
    false_positives="The same message appears for any SCM_RIGHTS transfer that loses its descriptors, e.g. a peer "
                    "closing the socket early; check that the open-file limit is really low.",
    related=("TD111",),
    signatures=(
        Signature(
            role=Role.ROOT_CAUSE,
            triggers=("items of ancdata",),
            pattern=r"received (?P<items>\d+) items of ancdata",
            confidence=0.9,
        ),
    ),
))
