"""``torchdoctor.Watcher``: the same sampling and warnings from inside a training script.

    from torchdoctor import Watcher

    with Watcher(interval=1.0, timeline="watch.json"):
        train()

It samples this process and its children (DataLoader workers, spawned ranks) in a daemon thread and
prints one line per warning to stderr (or calls ``on_warning``). Nothing of it outlives ``stop()``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from .run import Loop, Timeline, WatchOptions, warn_line
from .sampler import Sampler, host_limits
from .trend import Warning


class Watcher:
    def __init__(
        self,
        interval: float = 1.0,
        *,
        on_warning: Callable[[Warning], None] | None = None,
        timeline: str | os.PathLike[str] | None = None,
        horizon: float | None = None,
    ) -> None:
        if not isinstance(interval, (int, float)) or not 0.05 <= interval <= 3600:
            raise ValueError(f"interval={interval!r}: give seconds between 0.05 and 3600")
        self.opts = WatchOptions(interval=float(interval), horizon=horizon)
        self.on_warning = on_warning or (lambda w: warn_line(w, sys.stderr))
        self.path = Path(timeline) if timeline is not None else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.timeline: Timeline | None = None

    @property
    def warnings(self) -> list[Warning]:
        return list(self.timeline.warnings) if self.timeline else []

    def start(self) -> Watcher:
        if self._thread is not None:
            raise RuntimeError("this Watcher is already running")
        limits = host_limits()
        pid = os.getpid()
        self.timeline = Timeline(command=list(sys.argv), pid=pid, interval=self.opts.interval, limits=limits.to_json())
        loop = Loop(pid, self.opts, self.timeline, Sampler(pid, limits=limits), self.on_warning)

        def body() -> None:
            while not self._stop.is_set():
                loop.tick()
                self._stop.wait(self.opts.interval)

        self._thread = threading.Thread(target=body, name="torchdoctor-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Timeline | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.opts.interval))
        if self.timeline is not None:
            import time

            self.timeline.ended = time.time()
            if self.path is not None:
                self.timeline.write(self.path)
        return self.timeline

    def __enter__(self) -> Watcher:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
