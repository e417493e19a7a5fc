"""The 17 failure families: stable slugs, never renamed (every code belongs to exactly one)."""

from __future__ import annotations

FAMILIES: dict[str, str] = {
    "shm-exhausted": "POSIX shared memory (/dev/shm) too small or full for what workers share",
    "shm-map-count": "one memory mapping per shared storage passes vm.max_map_count",
    "fd-exhausted": "one file descriptor per shared storage passes RLIMIT_NOFILE",
    "worker-pickling": "objects sent to spawn/forkserver workers cannot be pickled",
    "worker-crash": "a DataLoader worker died for a reason other than shm or OOM",
    "host-oom": "host RAM, a cgroup limit or RLIMIT_AS/DATA is exhausted",
    "checkpoint-io": "reading or writing checkpoints, logs or data fails at the file-system level",
    "dist-env": "the distributed environment is missing or inconsistent",
    "dist-port": "the rendezvous port is already taken",
    "dist-connect": "ranks cannot reach the rendezvous or each other",
    "dist-hang": "a collective never completes",
    "nccl": "NCCL itself fails",
    "gpu-unavailable": "the GPU a process wants cannot be used",
    "cuda-oom": "GPU memory exhausted",
    "rank-divergence": "ranks disagree on parameters, shapes, collective order or numerics",
    "concurrent-write": "several ranks or workers write one file without coordination",
    "thread-oversubscription": "threads x processes exceed the usable cores",
}

SHOWS_AS: dict[str, tuple[str, ...]] = {
    "rank-divergence": ("dist-hang",),
}
"""Families whose failures usually surface as another family's symptom: ranks that took different paths wait in
a collective that never completes. ``explain`` lets the words of a report decide between the symptom and the
cause behind it (rule 10 of :mod:`torchdoctor.explain.triage`)."""
