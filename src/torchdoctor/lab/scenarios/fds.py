"""fd-exhausted: the file_descriptor sharing strategy holds one descriptor per shared storage."""

from __future__ import annotations

from .. import scenario

LOW_NOFILE = 256
TENSORS = 1000


def _producer(q, done, n: int) -> None:  # type: ignore[no-untyped-def]
    import torch

    for i in range(n):
        q.put(torch.full((4,), float(i)))
    q.put(None)
    done.wait(60)  # stay alive: the receiver fetches each descriptor from this process


@scenario(
    name="fd-queue-ancdata",
    family="fd-exhausted",
    code="TD150",
    summary=f"a torch.multiprocessing queue delivers {TENSORS} tensors to a receiver that keeps them, "
            f"with RLIMIT_NOFILE lowered to {LOW_NOFILE}: 'received 0 items of ancdata'",
    fix="torch.multiprocessing.set_sharing_strategy('file_system') in both processes",
    seconds=3.0,
    timeout=60.0,
)
def fd_queue_ancdata(fixed: bool) -> None:
    import resource

    import torch.multiprocessing as mp

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_NOFILE, hard))
    if fixed:
        mp.set_sharing_strategy("file_system")
    ctx = mp.get_context("fork")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_producer, args=(q, done, TENSORS))
    p.start()
    kept = []
    try:
        while (item := q.get(timeout=30)) is not None:
            kept.append(item)  # keeping each tensor keeps its descriptor open
    finally:
        done.set()
        p.join(2)
        if p.is_alive():
            p.kill()
    print(f"received {len(kept)} tensors")
