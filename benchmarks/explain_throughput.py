"""Throughput and memory of `torchdoctor explain` on a large multi-rank log, against grep.

Builds a log in a temporary directory (default about 1 GB) from 8 interleaved, rank-prefixed
training processes, with one real failure (a recorded fixture under tests/fixtures/logs/, by default
TD150's lab output, on rank 5) near the end. Two profiles:

* ``world`` (default): what real training output is made of. About half the lines are repeated
  warnings (torch's and Lightning's own UserWarning texts, each followed by Python's echo of the
  ``warnings.warn(`` source line; torchrun's OMP_NUM_THREADS banner), a fifth are tqdm progress bars
  redrawn with ``\r`` (one physical line holds a dozen redraws), the rest logger lines whose metric
  names contain ``Error`` (``val_MeanSquaredError``, ``train_error``). The warning texts are copied
  from real logs in tests/fixtures (recorded here or from public reports; see WARNINGS).
* ``plain``: only the logger lines (the easy case: few lines hold an error-ish word).
 Then, on the same file, with a warm page cache and runs interleaved:

    python -m torchdoctor explain FILE --format json
    grep -n -E 'Error|Exception|Traceback|Killed|signal' FILE

and prints MB/s for both, their ratio and explain's peak RSS (from wait4 on that child). It also
times a 10 KB pasted traceback (real fixture text) explained as text, process start included.

Targets (issue 4): explain within 2x of grep's time; peak RSS under 150 MB; the 10 KB traceback in
under 0.3 s wall.

    python benchmarks/explain_throughput.py [--size 1GB] [--runs 3] [--fixture TD150/lab-fd-queue-ancdata.log]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "logs"
GREP = ["grep", "-n", "-E", "Error|Exception|Traceback|Killed|signal"]
FAILING_RANK = 5
RANKS = 8


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def fixture_body(path: Path) -> list[str]:
    """The log text of a fixture: what follows the '# ---' header line."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if "# ---" in lines:
        lines = lines[lines.index("# ---") + 1 :]
    return lines


def progress_block(rng: random.Random, step: int, n: int) -> str:
    """n interleaved progress lines, as a DDP loop with a logger prints them on every rank."""
    out = []
    for i in range(n):
        rank = i % RANKS
        s = step + i // RANKS
        out.append(
            f"[rank{rank}]:2026-11-21 10:{(s // 60) % 60:02d}:{s % 60:02d},{(i * 37) % 1000:03d} INFO train.py:211 "
            f"epoch {s // 5000} step {s} loss {rng.uniform(0.5, 3):.4f} lr 3.0e-04 grad_norm {rng.random():.3f} "
            f"tokens/s {rng.randrange(40_000, 90_000)} mem_alloc 14.{rng.randrange(10)}GiB data_time 0.00{rng.randrange(10)}s\n"
        )
    return "".join(out)


WARNINGS = (
    # tests/fixtures/logs/TD150/lab-fd-queue-ancdata.log (recorded on this machine): torch's import-time warning
    (
        "/opt/conda/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:368: UserWarning: Failed to "
        "initialize NumPy: No module named 'numpy' (Triggered internally at "
        "/__w/pytorch/pytorch/torch/csrc/utils/tensor_numpy.cpp:84.)",
        '  cpu = _conversion_method_template(device=torch.device("cpu"))',
    ),
    # tests/fixtures/logs/TD570 (public report): the DataLoader's worker-count warning
    (
        "/opt/conda/lib/python3.9/site-packages/torch/utils/data/dataloader.py:554: UserWarning: This DataLoader will "
        "create 8 worker processes in total. Our suggested max number of worker in current system is 4, which is "
        "smaller than what this DataLoader is going to create. Please be aware that excessive worker creation might "
        "get DataLoader running slow or even freeze, lower the worker number to avoid potential slowness/freeze if "
        "necessary.",
        "  warnings.warn(_create_warning_msg(",
    ),
    # tests/fixtures/logs/TD570/near-lightning-too-few-workers.log (public report): Lightning's
    (
        "/opt/conda/lib/python3.8/site-packages/pytorch_lightning/trainer/connectors/data_connector.py:224: "
        "PossibleUserWarning: The dataloader, val_dataloader 0, does not have many workers which may be a bottleneck. "
        "Consider increasing the value of the `num_workers` argument` (try 128 which is the number of cpus on this "
        "machine) in the `DataLoader` init to improve performance.",
        "  rank_zero_warn(",
    ),
    # tests/fixtures/logs/TD45x torchrun runs (recorded on this machine): the launcher's banner
    (
        "W1121 23:23:18.887000 25700 torch/distributed/run.py:874] Setting OMP_NUM_THREADS environment variable for "
        "each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for "
        "optimal performance in your application as needed. ",
        None,
    ),
)


def world_block(rng: random.Random, step: int, n: int) -> str:
    """n lines shaped like real multi-rank training output (see the module doc, profile ``world``)."""
    out = []
    for i in range(n):
        rank = i % RANKS
        s = step + i // RANKS
        kind = rng.random()
        if kind < 0.5:
            text, echo = WARNINGS[rng.randrange(len(WARNINGS))]
            out.append(f"[rank{rank}]:{text}\n")
            if echo:
                out.append(f"[rank{rank}]:{echo}\n")
        elif kind < 0.7:
            total = 5000
            redraws = []
            for k in range(12):
                done = (s * 12 + k) % total
                pct = done * 100 // total
                bar = "█" * (pct // 10) + " " * (10 - pct // 10)
                redraws.append(
                    f"Epoch {s // total}: {pct:3d}%|{bar}| {done}/{total} [{k:02d}:{k * 7 % 60:02d}<01:42, "
                    f"{rng.uniform(3, 9):.2f}it/s, loss={rng.uniform(0.1, 2):.3g}, v_num=0, "
                    f"val_MeanSquaredError={rng.random():.3f}]"
                )
            out.append(f"[rank{rank}]:" + "\r".join(redraws) + "\n")
        else:
            out.append(
                f"[rank{rank}]:2026-11-21 10:{(s // 60) % 60:02d}:{s % 60:02d},{(i * 37) % 1000:03d} INFO train.py:211 "
                f"step {s} train_error {rng.uniform(0.01, 0.3):.4f} val_MeanSquaredError {rng.uniform(0.1, 2):.4f} "
                f"MeanAbsoluteError {rng.random():.3f} tokens/s {rng.randrange(40_000, 90_000)}\n"
            )
    return "".join(out)


def build_log(path: Path, size: int, failure: list[str], profile: str = "world") -> int:
    rng = random.Random(4)
    written, step = 0, 0
    inserted = False
    make = world_block if profile == "world" else progress_block
    with open(path, "w", encoding="utf-8") as fh:
        while written < size:
            block = make(rng, step, 4000)
            step += 4000 // RANKS
            fh.write(block)
            written += len(block)
            if not inserted and written >= size * 0.98:
                text = "".join(f"[rank{FAILING_RANK}]:{line}\n" for line in failure)
                fh.write(text)
                written += len(text)
                inserted = True
    return path.stat().st_size


def output_of(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode in (0, 1) else f"FAILED rc={proc.returncode}: {proc.stderr[-400:]}"


def peak_rss_mb(argv: list[str]) -> float:
    pid = os.fork()
    if pid == 0:  # child: exec the command with output discarded
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    _, _, usage = os.wait4(pid, 0)
    return usage.ru_maxrss / 1024


def timed(argv: list[str], out: Path | None = None) -> float:
    """Wall time of ``argv``. Output goes to a real file: GNU grep stops at its first match when
    its standard output is /dev/null, which would time nothing."""
    with open(out, "wb") if out is not None else open(os.devnull, "wb") as sink:
        start = time.perf_counter()
        subprocess.run(argv, stdout=sink, stderr=subprocess.DEVNULL, check=False)
        return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1GB", help="Size of the generated log (e.g. 200MB, 1GB, 4GB).")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--fixture", default="TD150/lab-fd-queue-ancdata.log", help="Real failure to bury near the end."
    )
    parser.add_argument("--keep", action="store_true", help="Keep the generated directory.")
    parser.add_argument(
        "--profile",
        choices=("world", "plain"),
        default="world",
        help="world: repeated warnings, tqdm redraws, metric names with Error (default); plain: logger lines only.",
    )
    args = parser.parse_args()
    size = parse_size(args.size)
    fixture = FIXTURES / args.fixture
    expected = fixture.parent.name
    tmp = Path(tempfile.mkdtemp(prefix="torchdoctor-bench-"))
    try:
        log = tmp / "train.log"
        t0 = time.perf_counter()
        actual = build_log(log, size, fixture_body(fixture), args.profile)
        mb = actual / 1e6
        print(
            f"built {log} ({mb:,.0f} MB, profile {args.profile}, {RANKS} ranks, failure from {args.fixture} on rank {FAILING_RANK}) in {time.perf_counter() - t0:.1f}s"
        )
        # An installed package has its bytecode compiled; a source checkout (PYTHONDONTWRITEBYTECODE
        # is common in containers) would otherwise recompile every module on every start.
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(REPO / "src" / "torchdoctor")],
            check=False,
            stdout=subprocess.DEVNULL,
        )
        explain = [sys.executable, "-m", "torchdoctor", "explain", str(log), "--format", "json"]
        grep = [*GREP, str(log)]
        sink = tmp / "output"
        timed(grep, sink)  # warm the page cache, untimed
        out = output_of(explain)
        try:
            doc = json.loads(out)
            top = doc["diagnoses"][0]["code"] if doc["diagnoses"] else None
            print(
                f"explain named {top} on rank {doc['first_failure'] and doc['first_failure'].get('rank')} "
                f"(expected {expected} on rank {FAILING_RANK}); scanner: {doc.get('scanner')}"
            )
        except (ValueError, KeyError, IndexError):
            print(f"explain output was not the expected JSON: {out[:400]}")
            return 1
        t_explain, t_grep = [], []
        for _ in range(args.runs):
            t_explain.append(timed(explain, sink))
            t_grep.append(timed(grep, sink))
        rss = peak_rss_mb(explain)
        me, mg = statistics.median(t_explain), statistics.median(t_grep)
        ratio = me / mg
        print(f"{'command':<10} {'median':>9} {'MB/s':>9}   ({args.runs} runs each, interleaved)")
        print(f"{'explain':<10} {me:>8.2f}s {mb / me:>9,.0f}")
        print(f"{'grep':<10} {mg:>8.2f}s {mb / mg:>9,.0f}")
        print(f"explain / grep = {ratio:.2f}  (target <= 2.00: {'PASS' if ratio <= 2 else 'FAIL'})")
        print(f"explain peak RSS = {rss:.0f} MB  (target < 150 MB: {'PASS' if rss < 150 else 'FAIL'})")

        paste = tmp / "pasted.txt"
        body = "\n".join(fixture_body(fixture)) + "\n"
        lead = progress_block(random.Random(1), 0, 200)
        lead = lead[-max(0, 10_240 - len(body)) :] if len(body) < 10_240 else ""
        paste.write_text(lead[lead.find("\n") + 1 :] + body, encoding="utf-8")
        quick = [sys.executable, "-m", "torchdoctor", "explain", str(paste)]
        timed(quick)
        t_quick = statistics.median(timed(quick) for _ in range(5))
        print(
            f"pasted traceback ({paste.stat().st_size / 1024:.1f} KB, text output) = {t_quick:.3f}s  "
            f"(target < 0.300 s: {'PASS' if t_quick < 0.3 else 'FAIL'})"
        )
        return 0 if ratio <= 2 and rss < 150 and t_quick < 0.3 and top == expected else 1
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
