"""One rank of ``torchdoctor dist``: every step under its own deadline, every result written down.

Run by the local launcher (``torchdoctor dist --nproc N``), by torchrun (``torchrun ... -m
torchdoctor.dist``) or by Slurm (``srun python -m torchdoctor.dist``, ranks from ``SLURM_*``).

Steps, in order (a failed step skips the rest on that rank):

``env``          the catalogue's distributed checks on this rank's own environment and host;
``rendezvous``   ``torch.distributed.rendezvous('env://')``: the TCPStore connect (or listen, rank 0);
``init``         ``init_process_group`` on that store (gloo on CPU, nccl with GPUs, or ``--backend``);
``barrier``      ``monitored_barrier`` on gloo (it names the ranks that did not arrive), ``barrier`` else;
``collectives``  all_reduce, all_gather, broadcast, reduce_scatter with known inputs, results checked;
``bandwidth``    all_reduce time over message sizes (the slowest rank's), bus bandwidth as nccl-tests;
``devices``      the GPU ``LOCAL_RANK`` lands on; the catalogue's device checks; two ranks on one GPU;
``consistency``  torch/CUDA/NCCL/Python versions and limits gathered and compared across ranks.

Deadlines: torch's own timeouts are set to the step deadline; a watchdog thread ends the rank
half a second later if a step is still running (a hang torch did not notice), after writing
``timeout`` for that step. SIGTERM/SIGINT from the launcher are recorded as ``stopped``, even while
the main thread is blocked inside a collective (the wakeup fd is read by a thread of its own).

``TORCHDOCTOR_DIST_FAULT=RANK:STEP:FAULT`` (``--inject``) makes one rank fail on purpose, for tests
and for seeing what a failure looks like: ``kill`` (SIGKILL itself), ``exit`` (exit 3), ``hang``
(sleep forever: its watchdog ends it), ``stop`` (SIGSTOP itself: only the launcher can end it),
``wrong`` (contribute wrong values to the collectives).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..units import human_bytes
from .journal import DIR_VAR, KEY_PREFIX, Journal
from .rules import STEPS

CONFIG_VAR = "TORCHDOCTOR_DIST_CONFIG"
FAULT_VAR = "TORCHDOCTOR_DIST_FAULT"
FAULTS = ("kill", "exit", "hang", "stop", "wrong")
DEFAULT_TIMEOUT = 30.0
DEFAULT_SIZES = (4 * 1024, 64 * 1024, 1024 * 1024, 16 * 1024 * 1024)
#: The watchdog fires this long after torch's own timeout would have.
WATCHDOG_SLACK = 1.0
RENDEZVOUS_SLACK = 2.5
EXIT_FAILED = 1
EXIT_TIMEOUT = 124
EXIT_STOPPED = 143
#: Env-step codes judged after the ranks' hosts are known (several "nodes" on one machine are fine on loopback).
HOSTS_DECIDE = frozenset({"TD409"})
#: Rank 0 waits at most this long for the other ranks' last records before reporting (torchrun/srun).
GATHER_WAIT = 10.0


@dataclass(frozen=True)
class Fault:
    rank: int
    step: str
    kind: str

    @classmethod
    def parse(cls, text: str) -> Fault:
        parts = text.split(":")
        if len(parts) != 3 or not parts[0].strip().isdigit() or parts[1] not in STEPS or parts[2] not in FAULTS:
            raise ValueError(
                f"{text!r}: expected RANK:STEP:FAULT, STEP one of {', '.join(STEPS)}, FAULT one of {', '.join(FAULTS)}"
            )
        return cls(int(parts[0]), parts[1], parts[2])

    def __str__(self) -> str:
        return f"{self.rank}:{self.step}:{self.kind}"


@dataclass
class ProbeConfig:
    backend: str | None = None
    """``gloo`` or ``nccl``; None: nccl when this rank sees a GPU and torch has NCCL, else gloo."""
    timeout: float = DEFAULT_TIMEOUT
    sizes: tuple[int, ...] = DEFAULT_SIZES
    fault: Fault | None = None
    gather: bool = True
    """Rank 0 collects every rank's records through the store at the end (no launcher of ours reads files)."""
    report: str | None = "text"
    """What rank 0 prints at the end when no launcher of ours reports: text, json, markdown, or None."""
    nproc_per_node: int | None = None

    def to_env(self) -> str:
        return json.dumps(
            {
                "backend": self.backend,
                "timeout": self.timeout,
                "sizes": list(self.sizes),
                "fault": str(self.fault) if self.fault else None,
                "gather": self.gather,
                "report": self.report,
                "nproc_per_node": self.nproc_per_node,
            }
        )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ProbeConfig:
        env = dict(os.environ) if env is None else env
        raw = json.loads(env.get(CONFIG_VAR) or "{}")
        fault = raw.get("fault") or env.get(FAULT_VAR)
        return cls(
            backend=raw.get("backend"),
            timeout=float(raw.get("timeout") or DEFAULT_TIMEOUT),
            sizes=tuple(int(s) for s in raw.get("sizes") or DEFAULT_SIZES),
            fault=Fault.parse(fault) if fault else None,
            gather=bool(raw.get("gather", True)),
            report=raw.get("report", "text"),
            nproc_per_node=raw.get("nproc_per_node"),
        )


class StepFailed(Exception):
    """A step's failure as the report shows it: a message, the catalogue code, details."""

    def __init__(self, message: str, code: str | None = None, details: dict[str, Any] | None = None, fix: str = ""):
        super().__init__(message)
        self.message, self.code, self.details, self.fix = message, code, details or {}, fix


# -- slurm -----------------------------------------------------------------------------------------


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (``gpu[01-04,07],cpu1`` -> ``gpu01``)."""
    head = nodelist.split(",")[0] if "[" not in nodelist.split(",")[0] else nodelist
    if "[" not in head:
        return head.strip()
    prefix, rest = head.split("[", 1)
    first = rest.split("]", 1)[0].split(",")[0].split("-")[0]
    return prefix.strip() + first


def env_from_slurm(env: dict[str, str]) -> dict[str, str]:
    """torch's variables from Slurm's, for ``srun python -m torchdoctor.dist`` (never overriding set ones)."""
    if "RANK" in env or "SLURM_PROCID" not in env:
        return {}
    out = {"RANK": env["SLURM_PROCID"]}
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    if tasks:
        out["WORLD_SIZE"] = tasks
    if "SLURM_LOCALID" in env:
        out["LOCAL_RANK"] = env["SLURM_LOCALID"]
    if "SLURM_NODEID" in env:
        out["GROUP_RANK"] = env["SLURM_NODEID"]
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if "MASTER_ADDR" not in env and nodes:
        out["MASTER_ADDR"] = first_host(nodes)
    if "MASTER_PORT" not in env and env.get("SLURM_JOB_ID", "").isdigit():
        out["MASTER_PORT"] = str(29500 + int(env["SLURM_JOB_ID"]) % 1000)
    return {k: v for k, v in out.items() if k not in env}


# -- the watchdog ----------------------------------------------------------------------------------


class Watchdog:
    """Ends the rank when a step outlives its deadline, and records SIGTERM/SIGINT as ``stopped``."""

    def __init__(self, journal: Journal, last_words: Callable[[], object] | None = None) -> None:
        self.journal = journal
        self.last_words = last_words
        """Called before the watchdog ends the process (a rank no launcher of ours reads prints its report)."""
        self._armed: tuple[str, float, float] | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="torchdoctor-dist-watchdog", daemon=True).start()
        self._install_signals()

    def arm(self, step: str, seconds: float) -> None:
        with self._lock:
            self._armed = (step, time.monotonic(), time.monotonic() + seconds)

    def disarm(self) -> None:
        with self._lock:
            self._armed = None

    def current(self) -> str | None:
        with self._lock:
            return self._armed[0] if self._armed else None

    def _watch(self) -> None:
        while True:
            time.sleep(0.05)
            with self._lock:
                armed = self._armed
            if armed and time.monotonic() > armed[2]:
                step, started, _ = armed
                self.journal.write(
                    {
                        "event": "step",
                        "step": step,
                        "status": "timeout",
                        "seconds": round(time.monotonic() - started, 3),
                        "message": f"step {step} still running after its deadline; the rank's watchdog ended it",
                    },
                    mirror_wait=0.3,
                )
                self.journal.write({"event": "end", "ok": False}, mirror_wait=0.3)
                if self.last_words is not None:
                    try:
                        self.last_words()
                    except Exception:  # noqa: BLE001 - the exit below matters more than the report
                        pass
                os._exit(EXIT_TIMEOUT)

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        rfd, wfd = os.pipe()
        os.set_blocking(wfd, False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: None)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)

        def wait() -> None:
            data = os.read(rfd, 1)
            signum = data[0] if data else signal.SIGTERM
            self.journal.write(
                {"event": "stopped", "step": self.current(), "signal": signal.Signals(signum).name}, mirror_wait=0.3
            )
            os._exit(128 + signum)

        threading.Thread(target=wait, name="torchdoctor-dist-signals", daemon=True).start()


# -- the probe -------------------------------------------------------------------------------------


@dataclass
class Probe:
    cfg: ProbeConfig
    journal: Journal
    rank: int | None = None
    world: int | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    host: str = field(default_factory=socket.gethostname)
    facts: Any = None
    store: Any = None
    backend: str = "gloo"
    findings: list[dict[str, Any]] = field(default_factory=list)
    bandwidth: list[dict[str, Any]] = field(default_factory=list)
    failed: bool = False
    watchdog: Watchdog | None = None
    pending: list[Any] = field(default_factory=list)
    """Findings of the env step that only the other ranks' hosts can confirm (:data:`HOSTS_DECIDE`)."""

    # -- running steps ------------------------------------------------------------------------

    def run(self, last_words: Callable[[], object] | None = None) -> bool:
        self.watchdog = Watchdog(self.journal, last_words)
        import torch.distributed  # noqa: F401 - imported before any deadline runs: a slow import is not a hang

        for name in STEPS:
            self.step(name, getattr(self, f"step_{name}"))
        ok = not self.failed
        for f in self.pending:  # never confirmed either way: shown as a warning
            self.findings.append(dict(f.to_dict(), severity="warning", rank=self.rank, host=self.host))
        if self.rank == 0 and self.cfg.gather and self.store is not None:
            self.gather_all()
        self.journal.write({"event": "end", "ok": ok})
        self.shutdown()
        return ok

    def step(self, name: str, fn: Callable[[], dict[str, Any] | None]) -> None:
        if self.failed:
            self.journal.write({"event": "step", "step": name, "status": "skipped", "seconds": 0.0})
            return
        assert self.watchdog is not None
        # torch's store rounds its timeout up to whole seconds and then retries: more slack at the rendezvous
        slack = RENDEZVOUS_SLACK if name == "rendezvous" else WATCHDOG_SLACK
        self.watchdog.arm(name, self.cfg.timeout + slack)
        self.journal.write({"event": "step", "step": name, "status": "running"})
        started = time.monotonic()
        record: dict[str, Any] = {"event": "step", "step": name}
        try:
            self.inject(name)
            self.arrive(name)
            record.update(status="ok", details=fn() or {})
        except StepFailed as exc:
            record.update(status="failed", message=exc.message, code=exc.code, details=exc.details, fix=exc.fix)
        except Exception as exc:  # noqa: BLE001 - the step failed: explained, not a crash of ours
            text = "".join(traceback.format_exception(exc)).strip()
            record.update(status="failed", message=_one_line(exc), **explained(text))
        finally:
            self.watchdog.disarm()
        if record["status"] == "failed" and "missing_ranks" not in (record.get("details") or {}):
            missing = self.not_arrived(name)
            if missing:
                record["details"] = {**(record.get("details") or {}), "missing_ranks": missing}
        record["seconds"] = round(time.monotonic() - started, 3)
        self.failed = record["status"] != "ok"
        self.journal.write(record)

    def _arrival_key(self, step: str, rank: int) -> str:
        return f"{KEY_PREFIX}/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/arrived/{step}/{rank}"

    def arrive(self, step: str) -> None:
        """Tell the others this rank reached ``step`` (so a rank that waits in vain can name who never came)."""
        if self.store is not None and self.rank is not None:
            self.store.set(self._arrival_key(step, self.rank), "1")

    def not_arrived(self, step: str) -> list[int]:
        """The ranks that never reached ``step``, when this rank's wait there failed."""
        if self.store is None or self.world is None or step in ("env", "rendezvous"):
            return []
        try:
            missing = [r for r in range(self.world) if not self.store.check([self._arrival_key(step, r)])]
        except Exception:  # noqa: BLE001 - the store went away with the job
            return []
        return missing if len(missing) < self.world else []

    def inject(self, name: str) -> None:
        fault = self.cfg.fault
        if fault is None or fault.step != name or fault.rank != self.rank or fault.kind == "wrong":
            return
        sys.stdout.flush()
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fault.kind == "exit":
            os._exit(3)
        elif fault.kind == "hang":
            while True:
                time.sleep(3600)

    def wrong(self) -> bool:
        f = self.cfg.fault
        return bool(f and f.kind == "wrong" and f.rank == self.rank)

    def deadline(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.cfg.timeout)

    # -- steps ---------------------------------------------------------------------------------

    def step_env(self) -> dict[str, Any]:
        from ..checks import run_checks
        from ..facts import GatherContext, gather
        from ..options import CheckOptions
        from ..registry import all_codes

        self.facts = gather(GatherContext(dist=True), sections=["host", "dist", "gpu", "torch", "limits", "shm"])
        codes = [c for c in all_codes() if c.area == "distributed" and c.check is not None]
        found = run_checks(self.facts, CheckOptions(dist=True, nproc_per_node=self.cfg.nproc_per_node), codes)
        # a loopback MASTER_ADDR is wrong only if the nodes are different machines: judged once hosts are known
        self.pending = [f for f in found if f.code in HOSTS_DECIDE]
        found = [f for f in found if f.code not in HOSTS_DECIDE]
        self.findings += [dict(f.to_dict(), rank=self.rank, host=self.host) for f in found]
        errors = [f for f in found if f.severity.label == "error"]
        if errors:
            first = errors[0]
            raise StepFailed(first.message, first.code, {"findings": [f.code for f in found]}, first.fix)
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(name):
                raise StepFailed(
                    f"environment variable {name} is not set: this process was not started by a launcher",
                    "TD450",
                    {"variable": name},
                    "run `torchdoctor dist --nproc N` (it launches the ranks), or start this module under "
                    "torchrun / srun, which set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT",
                )
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        return {
            "warnings": [f.code for f in found],
            "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        }

    def step_rendezvous(self) -> dict[str, Any]:
        import torch.distributed as dist

        assert self.rank is not None and self.world is not None
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        reach = None
        where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        if self.rank != 0 or agent_store:  # a client of the store: can it reach it at all? (told apart, recorded)
            reach = tcp_reach(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), min(2.0, self.cfg.timeout / 2))
            self.journal.write({"event": "note", "step": "rendezvous", "connect": reach})
        try:
            store, _, _ = next(
                dist.rendezvous("env://", rank=self.rank, world_size=self.world, timeout=self.deadline())
            )
        except Exception as exc:
            if reach is None:
                raise
            from .rules import reach_text

            text = "".join(traceback.format_exception(exc)).strip()
            found = explained(text)
            raise StepFailed(f"{_one_line(exc)}; {reach_text(reach, where)}", found["code"], {"connect": reach}) from exc
        self.store = store
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        self.journal.attach(store, f"{KEY_PREFIX}/{run}/rank/{self.rank}")
        return {
            "address": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        }

    def step_init(self) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        gpu = bool(self.facts is not None and self.facts.gpu.available and torch.cuda.is_available())
        self.backend = self.cfg.backend or ("nccl" if gpu and dist.is_nccl_available() else "gloo")
        assert self.rank is not None and self.world is not None
        kwargs: dict[str, Any] = {}
        if self.backend == "nccl":
            torch.cuda.set_device(self.local_rank or 0)
            kwargs["device_id"] = torch.device("cuda", self.local_rank or 0)
        dist.init_process_group(
            self.backend, store=self.store, rank=self.rank, world_size=self.world, timeout=self.deadline(), **kwargs
        )
        return {"backend": self.backend}

    def step_barrier(self) -> dict[str, Any]:
        import torch.distributed as dist

        if self.backend != "gloo":
            dist.barrier()
            return {"kind": "barrier"}
        try:
            dist.monitored_barrier(timeout=self.deadline(), wait_all_ranks=True)
        except RuntimeError as exc:
            missing = _missing_ranks(str(exc))
            if missing:
                raise StepFailed(
                    f"rank(s) {', '.join(map(str, missing))} did not reach the barrier within {self.cfg.timeout:g} s",
                    "TD455",
                    {"missing_ranks": missing},
                ) from None
            raise
        return {"kind": "monitored_barrier"}

    def _device(self) -> Any:
        import torch

        return torch.device("cuda", self.local_rank or 0) if self.backend == "nccl" else torch.device("cpu")

    def step_collectives(self) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        assert self.rank is not None and self.world is not None
        r, w, dev = self.rank, self.world, self._device()
        bad = 100.0 if self.wrong() else 0.0
        times: dict[str, float] = {}

        def timed(name: str, fn: Callable[[], object]) -> None:
            t0 = time.perf_counter()
            fn()
            times[name] = round(time.perf_counter() - t0, 6)

        t = torch.full((4,), float(r + 1) + bad, device=dev)
        timed("all_reduce", lambda: dist.all_reduce(t))
        want = float(w * (w + 1) // 2)
        parts = [torch.zeros(2, device=dev) for _ in range(w)]
        timed("all_gather", lambda: dist.all_gather(parts, torch.full((2,), float(r) + bad, device=dev)))
        b = torch.arange(8, dtype=torch.float32, device=dev) * 7 if r == 0 else torch.zeros(8, device=dev)
        timed("broadcast", lambda: dist.broadcast(b, src=0))
        rs_out = torch.zeros(2, device=dev)
        rs_in = torch.arange(2 * w, dtype=torch.float32, device=dev) + bad
        rs_note = None
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        try:
            timed("reduce_scatter", lambda: reduce_scatter(rs_out, rs_in))
        except (RuntimeError, NotImplementedError) as exc:
            rs_note = f"not supported by {self.backend}: {_one_line(exc)}"
        # check every result; name the ranks whose contribution arrived wrong (from all_gather)
        sources = [i for i, p in enumerate(parts) if p.tolist() != [float(i), float(i)]]
        problems: list[tuple[str, Any, Any]] = []
        if t.tolist() != [want] * 4:
            problems.append(("all_reduce", t.tolist()[0], want))
        if sources:
            problems.append(("all_gather", [parts[i].tolist() for i in sources], [[float(i)] * 2 for i in sources]))
        if b.tolist() != [float(i * 7) for i in range(8)]:
            problems.append(("broadcast", b.tolist(), [float(i * 7) for i in range(8)]))
        rs_want = [float(w * (2 * r + i)) for i in range(2)]
        if rs_note is None and rs_out.tolist() != rs_want:
            problems.append(("reduce_scatter", rs_out.tolist(), rs_want))
        details: dict[str, Any] = {"times": times, "checked": sorted(times)}
        if rs_note:
            details["reduce_scatter"] = rs_note
        if problems:
            op, got, expected = problems[0]
            details.update(wrong_sources=sources, problems=[p[0] for p in problems])
            raise StepFailed(
                f"{op} on rank {r} returned {got} where {expected} was expected"
                + (f"; the data from rank(s) {', '.join(map(str, sources))} arrived wrong" if sources else ""),
                "TD467",
                details,
            )
        return details

    def step_bandwidth(self) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        assert self.world is not None
        dev = self.device_for_bw = self._device()
        factor = 2 * (self.world - 1) / self.world if self.world > 1 else 1.0
        rows = []
        lat = torch.zeros(1, device=dev)
        dist.all_reduce(lat)
        samples = []
        for _ in range(20):
            t0 = time.perf_counter()
            dist.all_reduce(lat)
            samples.append(time.perf_counter() - t0)
        latency = statistics.median(samples)
        for size in self.cfg.sizes:
            x = torch.zeros(max(1, size // 4), dtype=torch.float32, device=dev)
            dist.all_reduce(x)  # warm-up: buffers and connections
            iters = max(3, min(50, (64 * 1024 * 1024) // max(size, 1)))
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            mine = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            seconds = float(mine.item())
            algbw = size / seconds if seconds > 0 else 0.0
            rows.append(
                {"bytes": size, "seconds": seconds, "algbw": algbw, "busbw": algbw * factor, "iterations": iters}
            )
        self.bandwidth = rows
        return {"latency_s": latency, "sizes": [human_bytes(s) for s in self.cfg.sizes], "rows": rows}

    def step_devices(self) -> dict[str, Any]:
        import torch.distributed as dist

        from .rules import device_findings, device_of, shared_devices

        assert self.facts is not None and self.world is not None
        mine = {**device_of(self.facts, self.local_rank), "host": self.host, "local_rank": self.local_rank}
        found = device_findings(self.facts, self.cfg.nproc_per_node)
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, mine)
        devices = {r: d for r, d in enumerate(everyone) if isinstance(d, dict)}
        shared = [f for f in shared_devices(devices) if str(self.rank) in f.message.split(" on ")[0]]
        self.findings += [dict(f.to_dict(), rank=self.rank, host=self.host) for f in found + shared]
        errors = [f for f in found if f.severity.label == "error"]
        if shared and devices[min(_ranks_in(shared[0].message))] is not mine:
            errors.insert(0, shared[0])
        if errors:
            raise StepFailed(errors[0].message, errors[0].code, {"device": mine}, errors[0].fix)
        return {"device": mine, "devices": {str(r): d.get("label") for r, d in devices.items()}}

    def step_consistency(self) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        from .rules import differences, digest

        assert self.facts is not None and self.world is not None
        nccl = None
        if torch.cuda.is_available() and dist.is_nccl_available():
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        mine = digest(self.facts, nccl)
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, mine)
        digests = {r: d for r, d in enumerate(everyone) if isinstance(d, dict)}
        hosts = sorted({str(d.get("host")) for d in digests.values()})
        if len(hosts) > 1 and self.pending:
            f = self.pending[0]
            self.findings.append(dict(f.to_dict(), rank=self.rank, host=self.host))
            raise StepFailed(f.message, f.code, {"hosts": hosts}, f.fix)
        self.pending = []
        diffs = differences(digests)
        if self.rank == 0:
            self.findings += [dict(d.finding().to_dict(), rank=None, host=None) for d in diffs]
        errors = [d for d in diffs if d.severity.label == "error" and self.rank in d.odd_ranks()]
        if errors:
            f = errors[0].finding()
            raise StepFailed(f.message, f.code, {"differs": errors[0].key}, f.fix)
        return {"compared": sorted(mine), "differences": [d.key for d in diffs], "digest": mine}

    # -- the end --------------------------------------------------------------------------------

    def gather_all(self) -> None:
        """Rank 0: every rank's records from the store (ranks on other machines too), once they ended."""
        assert self.world is not None
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        keys = [f"{KEY_PREFIX}/{run}/rank/{r}" for r in range(self.world)]
        ranks: dict[str, Any] = {}
        deadline = time.monotonic() + min(GATHER_WAIT, self.cfg.timeout)
        while True:
            for r, key in enumerate(keys):
                try:
                    if self.store.check([key]):
                        ranks[str(r)] = json.loads(self.store.get(key))
                except Exception:  # noqa: BLE001 - the store may be gone; report what we have
                    break
            done = all(
                str(r) in ranks and ranks[str(r)]["last"].get("event") == "end"
                for r in range(self.world)
                if r != self.rank
            )
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.journal.write(
            {"event": "gathered", "ranks": ranks, "findings": self.findings, "bandwidth": self.bandwidth}
        )

    def shutdown(self) -> None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def tcp_reach(host: str, port: int, timeout: float) -> str:
    """One TCP connect to the store's address: ``open``, ``refused`` (nothing listens: rank 0 or the
    launcher is not up), ``timeout`` (no answer: a firewall, or the wrong address), or the error."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return f"error: {exc.strerror or exc}"


def explained(text: str) -> dict[str, Any]:
    """A failing step's traceback, explained by the catalogue: its code and fix (never pasted raw)."""
    from ..explain import explain

    report = explain(text)
    top = report.top
    if top is None:
        return {"code": None, "fix": ""}
    return {"code": top.code, "fix": top.fix}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:400]


def _missing_ranks(text: str) -> list[int]:
    """Ranks named by ``monitored_barrier``'s 'Ranks 1, 3 failed to pass monitoredBarrier'."""
    import re

    m = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
    return sorted({int(x) for x in re.findall(r"\d+", m.group(1))}) if m else []


def _ranks_in(message: str) -> list[int]:
    import re

    head = message.split(" on ")[0]
    return [int(x) for x in re.findall(r"\d+", head)]


_REPORTED = threading.Lock()


def report_self(probe: Probe, journal: Journal, cfg: ProbeConfig) -> bool:
    """What a rank prints when no launcher of ours reports: rank 0 reports every rank (from the store);
    a rank that never reached the store reports itself (nobody else can); others one line on failure.
    Printed once: the main thread and the watchdog (ending the rank) may both get here."""
    from .report import render, report_from_gathered

    if not _REPORTED.acquire(blocking=False):
        if threading.current_thread() is threading.main_thread():
            time.sleep(WATCHDOG_SLACK + 5)  # the watchdog is printing, then ends the process
        return False

    if probe.rank in (0, None) or not journal.store_key:
        gathered = journal.gathered or {"ranks": {str(probe.rank or 0): journal.mirror()}, "findings": probe.findings}
        report = report_from_gathered(gathered, probe.backend)
        report.seconds = time.time() - float(journal.hello.get("t") or time.time())
        render(report, cfg.report or "text", sys.stdout)
        sys.stdout.flush()
        return report.ok
    failed = next((s for s in journal.steps if s.get("status") not in ("ok", "skipped")), None)
    if failed:
        print(
            f"torchdoctor dist: rank {probe.rank} on {probe.host}: step {failed.get('step')} "
            f"{failed.get('status')}: {failed.get('message', '')} [{failed.get('code') or '-'}]",
            file=sys.stderr,
        )
    return failed is None


def main(cfg: ProbeConfig | None = None) -> int:
    """Entry point of one rank (``python -m torchdoctor.dist``, or ``torchdoctor dist`` inside a launcher)."""
    os.environ.update(env_from_slurm(dict(os.environ)))
    cfg = cfg or ProbeConfig.from_env()
    raw_rank = os.environ.get("RANK", "")
    journal = Journal(os.environ.get(DIR_VAR), raw_rank if raw_rank.isdigit() else f"pid{os.getpid()}")
    probe = Probe(cfg, journal)
    probe.rank = int(raw_rank) if raw_rank.isdigit() else None
    local = os.environ.get("LOCAL_RANK", "")
    probe.local_rank = int(local) if local.isdigit() else None
    group = os.environ.get("GROUP_RANK", "")
    probe.node_rank = int(group) if group.isdigit() else None
    ws = os.environ.get("WORLD_SIZE", "")
    journal.write(
        {
            "event": "hello",
            "rank": probe.rank,
            "world_size": int(ws) if ws.isdigit() else None,
            "local_rank": probe.local_rank,
            "node_rank": probe.node_rank,
            "host": probe.host,
            "pid": os.getpid(),
        }
    )
    reports = not os.environ.get(DIR_VAR) and bool(cfg.report)
    ok = probe.run(last_words=(lambda: report_self(probe, journal, cfg)) if reports else None)
    if reports:
        ok = report_self(probe, journal, cfg) and ok
    sys.stdout.flush()
    return 0 if ok else EXIT_FAILED
