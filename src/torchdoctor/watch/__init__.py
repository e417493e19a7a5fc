"""``torchdoctor watch``: early warning while a job runs, and a report when it ends.

- :mod:`.sampler`: one sample of a process tree and the host (through :mod:`torchdoctor.facts`'s
  readers of ``/proc``, cgroups, ``/dev/shm`` and NVML; no second copy of them).
- :mod:`.trend`: the warning rules, pure: a resource's trend against its limit, projected time to
  exhaustion, one warning per process and resource.
- :mod:`.run`: launch a command (or attach to a pid), pass its output through, forward signals,
  sample, warn; at the end explain a failure and write the timeline and the HTML report.
- :class:`Watcher`: the same sampling and warnings in a background thread of a training script.
"""

from __future__ import annotations

from .api import Watcher

__all__ = ["Watcher"]
