"""Options that shape what the checks assume about the coming training run."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024

#: Defaults chosen to describe a typical single-node image/text training job.
DEFAULT_NUM_WORKERS = 4
DEFAULT_PREFETCH_FACTOR = 2  # torch's own default when num_workers > 0
DEFAULT_BATCH_BYTES = 32 * MiB


@dataclass(frozen=True)
class CheckOptions:
    """The planned run, as far as the checks need to know it."""

    num_workers: int = DEFAULT_NUM_WORKERS
    batch_bytes: int = DEFAULT_BATCH_BYTES
    prefetch_factor: int = DEFAULT_PREFETCH_FACTOR
    expect_bytes: int | None = None
    dist: bool = False
    start_method: str | None = None
    """Start method of the process that will iterate the loader (None: that of Python's default)."""
    sharing_strategy: str | None = None
    """torch.multiprocessing sharing strategy the run will use (None: torch's default)."""
    nproc_per_node: int | None = None
    assumed: frozenset[str] = frozenset()
    """Options the user did not give (their defaults are assumptions): checks that would only
    judge an assumed value stay silent (``--num-workers`` left at its default says nothing of the
    loader the run will really build)."""

    def __post_init__(self) -> None:
        """The same bounds as the command line's options: a wrong value is a ValueError at once."""
        for name, low in (("num_workers", 0), ("batch_bytes", 0), ("prefetch_factor", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"CheckOptions.{name} must be an integer >= {low}; got {value!r}")
        if self.nproc_per_node is not None and (not isinstance(self.nproc_per_node, int) or self.nproc_per_node < 1):
            raise ValueError(
                f"CheckOptions.nproc_per_node must be an integer >= 1 or None; got {self.nproc_per_node!r}"
            )
        if self.expect_bytes is not None and (not isinstance(self.expect_bytes, int) or self.expect_bytes < 0):
            raise ValueError(f"CheckOptions.expect_bytes must be an integer >= 0 or None; got {self.expect_bytes!r}")
        if self.start_method not in (None, "fork", "spawn", "forkserver"):
            raise ValueError(
                f"CheckOptions.start_method must be fork, spawn, forkserver or None; got {self.start_method!r}"
            )

    def shm_need_bytes(self) -> int:
        """Bytes of /dev/shm that in-flight batches occupy: workers x prefetch x batch."""
        return max(self.num_workers, 0) * max(self.prefetch_factor, 1) * max(self.batch_bytes, 0)
