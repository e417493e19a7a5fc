"""What `torchdoctor watch` costs: the sampler's CPU on a 16-process tree, and the watched job's wall time.

Targets (issue): sampling a 16-process tree at 1 Hz costs under 1% of one core; the watched job's
wall time is within 1% of the unwatched one, side by side.

1. Sampler cost. A real tree: a Python parent iterating a torch DataLoader with `--workers` (15)
   workers, each holding some memory (`--worker-mb`), a few open files and maps, doing light work.
   In this process, `Sampler(root).sample()` + `Warner().feed()` run `--samples` (60) times, and the
   CPU time this process spends (`time.process_time()`: user + system, so the kernel's /proc work
   counts) is divided by the number of samples: at 1 Hz, CPU s per sample x 100 = % of one core.
   Then the real thing: `torchdoctor watch -- <the same tree for --watch-seconds>`; its own CPU time
   (utime + stime of /proc/<watch pid>/stat, read after it exits and before it is reaped: its
   children's time is not in these fields), less the median of a watched trivial command (`true`,
   i.e. its startup), per second of the difference in wall time. That includes the output pumps
   and the poll loop.
2. Wall time. A CPU-bound job of fixed work (a DataLoader epoch, `--workers` workers, each item a
   few single-threaded matmuls; its size calibrated to about `--seconds` on this machine): run
   unwatched and under `torchdoctor watch` (default 1 Hz), `--runs` times each, interleaved (the
   order alternates), medians. Two figures: the job's own wall time (from its first line to its
   end, printed by the job) and the whole command's (which also has watch's own start and exit, a few tenths of a second). The
   spread of the unwatched runs ((max - min) / median) tells whether 1% is measurable here; so do
   the ratios of adjacent pairs, and the CPU other processes used during each run (/proc/stat busy
   + steal, less this script's and its children's), printed in cores, and the median ratio of
   the quiet pairs (both runs with other processes under 0.05 cores).

On a shared machine, other processes' bursts dwarf 1%: more, shorter pairs (the default 5 x 15 s)
leave more quiet pairs than a few long ones. Default total: about 4.5 minutes.

    python benchmarks/watch_overhead.py [--runs 5] [--seconds 15] [--watch-seconds 60] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WATCH = [sys.executable, "-m", "torchdoctor", "watch"]
#: A run is quiet when the rest of the machine used less than this many cores on average meanwhile.
QUIET = 0.05

#: The tree: a parent iterating a DataLoader whose workers hold memory, files and maps, lightly busy.
#: argv: workers, MB per worker, seconds (0: until SIGTERM). Prints "ready" once every worker served.
TREE = r"""
import mmap, os, signal, sys, tempfile, time
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

workers, mb, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
KEEP = []

def init(_):
    torch.set_num_threads(1)
    KEEP.append(np.ones(mb * 2**20 // 8))                       # touched: resident
    d = tempfile.mkdtemp(prefix="watch-bench-")
    for i in range(8):                                          # open files
        f = open(os.path.join(d, f"f{i}"), "w+b")
        f.write(b"\0" * 65536); f.flush()
        KEEP.append(f)
        KEEP.append(mmap.mmap(f.fileno(), 65536))               # and maps
        os.unlink(f.name)                                       # stay open and mapped, leave nothing behind
    os.rmdir(d)

class Light(Dataset):
    def __len__(self):
        return 10**9
    def __getitem__(self, i):
        x = torch.ones(64, 64)
        for _ in range(4):
            x = x @ x / 64
        time.sleep(0.02)
        return x

if __name__ == "__main__":
    loader = DataLoader(Light(), batch_size=4, num_workers=workers, worker_init_fn=init,
                        persistent_workers=True, prefetch_factor=2)
    it = iter(loader)
    for _ in range(workers):
        next(it)
    print("ready", flush=True)
    end = time.monotonic() + seconds if seconds > 0 else float("inf")
    n = 0
    while time.monotonic() < end:
        next(it)
        n += 1
        if n % 20 == 0:
            print(f"step {n}", flush=True)                      # a training log's worth of output
        time.sleep(0.05)
"""

#: The fixed-work job. argv: workers, items. Prints "JOB_WALL <s>" (its own wall time) at the end.
JOB = r"""
import time
T0 = time.perf_counter()
import sys
import torch
from torch.utils.data import DataLoader, Dataset

workers, items = int(sys.argv[1]), int(sys.argv[2])

def work(i):
    x = torch.full((96, 96), 1.0 / 96)
    for _ in range(40):
        x = x @ x
    return x.sum()

class Busy(Dataset):
    def __len__(self):
        return items
    def __getitem__(self, i):
        return work(i)

if __name__ == "__main__":
    if workers == 0:                                            # the calibration: one item, this process
        torch.set_num_threads(1)
        work(0)
        t = time.perf_counter(); [work(i) for i in range(50)]
        print(f"ITEM {(time.perf_counter() - t) / 50:.6f}")
        sys.exit(0)
    loader = DataLoader(Busy(), batch_size=8, num_workers=workers,
                        worker_init_fn=lambda _: torch.set_num_threads(1))
    total = 0.0
    for b in loader:
        total += float(b.sum())
    print(f"JOB_WALL {time.perf_counter() - T0:.4f} items={items} total={total:.3f}", flush=True)
"""


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), e.get("PYTHONPATH", "")]))
    return e


# --- 1. sampler cost -------------------------------------------------------------------------------


def start_tree(workers: int, mb: int, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", TREE, str(workers), str(mb), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise SystemExit(f"the tree did not start: {line!r} {proc.stderr.read()[-2000:] if proc.stderr else ''}")
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    """End a process this script started (its PID), and its DataLoader workers with it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sampler_cost(root: int, n: int, gap: float, profile: bool) -> dict[str, object]:
    from torchdoctor.watch.sampler import Sampler, host_limits
    from torchdoctor.watch.trend import Warner

    limits = host_limits()
    sampler, warner, lim = Sampler(root, limits=limits), Warner(), limits.to_json()
    per: list[float] = []
    pss: list[bool] = []
    sizes: list[int] = []
    prof = cProfile.Profile() if profile else None
    first = None
    for _ in range(n):
        time.sleep(gap)
        if prof:
            prof.enable()
        c0 = time.process_time()
        sample = sampler.sample()
        warner.feed(sample, lim)
        c1 = time.process_time()
        if prof:
            prof.disable()
        per.append(c1 - c0)
        pss.append(any(p["pss"] is not None for p in sample["processes"]))
        sizes.append(len(sample["processes"]))
        first = first or sample
    assert first is not None
    procs = first["processes"]
    if prof:
        print("\n--- cProfile of the samples (cumulative, top 30) ---")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(30)
        print("--- (tottime, top 20) ---")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(20)
    return {
        "per": per,
        "pss": pss,
        "size": statistics.median(sizes),
        "pss_sum": sum(p["pss"] or 0 for p in procs),
        "maps": statistics.median(p["maps"] or 0 for p in procs),
        "fds": statistics.median(p["fds"] or 0 for p in procs),
        "threads": sum(p["threads"] or 0 for p in procs),
    }


def cpu_of_exited(proc: subprocess.Popen[bytes]) -> float:
    """utime + stime of a child that has exited, read before it is reaped (its children's not included)."""
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    raw = Path(f"/proc/{proc.pid}/stat").read_bytes()
    f = raw[raw.rindex(b")") + 2 :].split()
    cpu = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    proc.wait()
    return cpu


def watch_cpu(argv: list[str]) -> tuple[float, float, str]:
    """(CPU s of the watch process itself, wall s, its last stderr line)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([*WATCH, "--", *argv], stdout=subprocess.DEVNULL, stderr=err, env=env())  # noqa: S603
        cpu = cpu_of_exited(proc)
        wall = time.perf_counter() - t0
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    if proc.returncode != 0:
        raise SystemExit(f"watch {' '.join(argv[:3])} failed ({proc.returncode}): {lines[-5:]}")
    return cpu, wall, lines[-1] if lines else ""


# --- 2. wall time ----------------------------------------------------------------------------------


def job(argv: list[str], watched: bool) -> tuple[float, float]:
    """(the job's own wall time, the whole command's wall time)."""
    cmd = [*WATCH, "--", *argv] if watched else argv
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=1800)  # noqa: S603
    took = time.perf_counter() - t0
    m = re.search(r"^JOB_WALL ([0-9.]+)", out.stdout, re.M)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"{'watched ' if watched else ''}job failed ({out.returncode}): {out.stderr[-2000:]}")
    return float(m.group(1)), took


class Background:
    """CPU time the rest of the machine used (busy + steal, less this script's and its children's)."""

    def __init__(self) -> None:
        self.t0, self.busy0, self.ours0 = time.perf_counter(), self.busy(), self.ours()

    @staticmethod
    def busy() -> float:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / os.sysconf(
            "SC_CLK_TCK"
        )  # user nice system irq softirq steal

    @staticmethod
    def ours() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def cores(self) -> float:
        """Other processes' CPU, in cores on average since this was made."""
        other = (self.busy() - self.busy0) - (self.ours() - self.ours0)
        return max(other, 0.0) / max(time.perf_counter() - self.t0, 1e-6)


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / statistics.median(xs) * 100


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="wall-time runs of each side (default 5)")
    ap.add_argument("--seconds", type=float, default=15.0, help="target length of the fixed-work job (default 15)")
    ap.add_argument("--watch-seconds", type=float, default=60.0, help="length of the watched tree (default 60)")
    ap.add_argument("--samples", type=int, default=60, help="in-process samples (default 60)")
    ap.add_argument("--gap", type=float, default=0.1, help="seconds between in-process samples (default 0.1)")
    ap.add_argument("--workers", type=int, default=15, help="DataLoader workers: a tree of 1 + this (default 15)")
    ap.add_argument("--worker-mb", type=int, default=32, help="memory each tree worker holds (default 32)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the in-process samples")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    started = time.perf_counter()
    whole = Background()

    # 1a. in-process sampler cost on a live tree
    tree = start_tree(args.workers, args.worker_mb, 0)
    try:
        time.sleep(1.0)
        s = sampler_cost(tree.pid, args.samples, args.gap, args.profile)
    finally:
        stop(tree)
    per, pss = s["per"], s["pss"]
    assert isinstance(per, list) and isinstance(pss, list)
    mean = statistics.fmean(per)
    plain = [c for c, p in zip(per, pss) if not p]
    with_pss = [c for c, p in zip(per, pss) if p]

    # 1b. the real `torchdoctor watch` process over a watched run of the same tree
    trivial = [watch_cpu(["true"]) for _ in range(3)]
    t_cpu = statistics.median(c for c, _, _ in trivial)
    t_wall = statistics.median(w for _, w, _ in trivial)
    w_cpu, w_wall, w_last = watch_cpu(
        [sys.executable, "-c", TREE, str(args.workers), str(args.worker_mb), str(args.watch_seconds)]
    )
    loop_pct = (w_cpu - t_cpu) / (w_wall - t_wall) * 100

    # 2. wall time, calibrated fixed work, interleaved
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(JOB)
        item = float(
            subprocess.run(
                [sys.executable, str(script), "0", "0"], capture_output=True, text=True, env=env(), check=True
            ).stdout.split()[1]
        )
        ncpu = len(os.sched_getaffinity(0))
        guess = max(int(3.0 * ncpu / item), args.workers * 8)
        # size it on CPU time (all cores busy: wall ~ CPU / cores), which other processes sway less than wall time
        c0 = Background.ours()
        warm, _ = job([sys.executable, str(script), str(args.workers), str(guess)], watched=False)  # also warms
        per_run = min(warm, (Background.ours() - c0) / ncpu)
        items = max(int(guess * args.seconds / per_run), args.workers * 8)
        argv = [sys.executable, str(script), str(args.workers), str(items)]
        own: dict[bool, list[float]] = {False: [], True: []}
        cmd: dict[bool, list[float]] = {False: [], True: []}
        other: dict[bool, list[float]] = {False: [], True: []}
        for i in range(args.runs):
            for watched in (False, True) if i % 2 == 0 else (True, False):
                bg = Background()
                a, b = job(argv, watched)
                other[watched].append(bg.cores())
                own[watched].append(a)
                cmd[watched].append(b)

    print(
        f"machine: {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), "
        f"python {sys.version.split()[0]}, total run {time.perf_counter() - started:.0f} s, "
        f"other processes used {whole.cores():.2f} cores on average meanwhile"
    )
    print()
    print(
        f"1. sampler cost: tree of {s['size']:.0f} processes (DataLoader, {args.workers} workers); "
        f"PSS {int(s['pss_sum']) / 2**30:.2f} GiB in all, median {s['maps']:.0f} maps and {s['fds']:.0f} fds "
        f"per process, {s['threads']} threads"
    )
    print(f"   in-process, {len(per)} samples (Sampler.sample + Warner.feed), CPU per sample:")
    print(
        f"     mean {mean * 1e3:.2f} ms  (median {statistics.median(per) * 1e3:.2f}, first {per[0] * 1e3:.2f}, "
        f"max {max(per) * 1e3:.2f})"
    )
    if plain and with_pss:
        print(
            f"     without PSS {statistics.fmean(plain) * 1e3:.2f} ms (n={len(plain)}), "
            f"with PSS (smaps_rollup) {statistics.fmean(with_pss) * 1e3:.2f} ms (n={len(with_pss)})"
        )
    print(f"   at 1 Hz: {mean * 100:.2f}% of one core  (target < 1%: {verdict(mean * 100 < 1)})")
    print(
        f"   torchdoctor watch process, {w_wall:.1f} s watched run of the tree: {w_cpu:.2f} CPU s; "
        f"startup (watch -- true, median of 3) {t_cpu:.2f} CPU s in {t_wall:.2f} s"
    )
    print(
        f"     loop (samples + pumps + poll) = ({w_cpu:.2f} - {t_cpu:.2f}) / ({w_wall:.1f} - {t_wall:.2f}) s "
        f"= {loop_pct:.2f}% of one core  (target < 1%: {verdict(loop_pct < 1)})"
    )
    print(f"     its summary: {w_last.strip()}")
    print()
    uo, wo, uc, wc = (statistics.median(x) for x in (own[False], own[True], cmd[False], cmd[True]))
    print(
        f"2. wall time: DataLoader epoch, {args.workers} workers, {items} items of fixed work, "
        f"{args.runs} interleaved runs each (medians)"
    )
    print(
        f"   job's own:  unwatched {uo:.2f} s, watched {wo:.2f} s, ratio {wo / uo:.4f}  "
        f"(target within 1%: {verdict(abs(wo / uo - 1) <= 0.01)})"
    )
    print(
        f"   command:    unwatched {uc:.2f} s, watched {wc:.2f} s, ratio {wc / uc:.4f}  "
        f"(within 1%: {verdict(abs(wc / uc - 1) <= 0.01)}; includes watch's own start)"
    )
    pairs = [x / y for x, y in zip(own[True], own[False])]
    print(
        f"   per pair (adjacent runs), job's own watched/unwatched: {' '.join(f'{r:.4f}' for r in pairs)}; "
        f"median {statistics.median(pairs):.4f}"
    )
    quiet = [r for r, a, b in zip(pairs, other[True], other[False]) if max(a, b) < QUIET]
    if quiet:
        print(
            f"   quiet pairs only (other processes < {QUIET} cores in both runs): {len(quiet)} of {len(pairs)}, "
            f"median ratio {statistics.median(quiet):.4f}, range {min(quiet):.4f}-{max(quiet):.4f}"
        )
    else:
        print(f"   quiet pairs only (other processes < {QUIET} cores in both runs): none")
    print(
        f"   unwatched spread (max-min)/median: job {spread(own[False]):.2f}%, command {spread(cmd[False]):.2f}%; "
        f"watched: job {spread(own[True]):.2f}%"
    )
    print(
        f"   runs, job's own s: unwatched {' '.join(f'{x:.2f}' for x in own[False])}; "
        f"watched {' '.join(f'{x:.2f}' for x in own[True])}"
    )
    print(
        f"   other processes' CPU during each run, cores: unwatched {' '.join(f'{x:.2f}' for x in other[False])}; "
        f"watched {' '.join(f'{x:.2f}' for x in other[True])}"
    )
    if spread(own[False]) > 1:
        print("   note: the unwatched runs alone spread more than 1%: the 1% target is within this machine's noise")
    if max(other[False] + other[True]) >= QUIET:
        print(
            "   note: other processes were busy during some runs: the wall-time figures are not clean; rerun on a quiet machine"
        )
    return 0 if mean * 100 < 1 and loop_pct < 1 and abs(wo / uo - 1) <= 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
