"""TD470-TD476 (TD477 in ``log_ranks``): why two runs of the same script (or two ranks) compute different numbers.

None of these has a preflight check over one host's facts or a log signature. TD470-TD476 are judged
in the training process itself by :func:`torchdoctor.ranks.determinism.determinism_report` (the torch
state, the DataLoader, the non-deterministic operations torch warned about). TD477, found by comparing
two recorded runs (`torchdoctor runs diff`), prints a line explain recognises: it is in ``log_ranks``.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register

_FAMILY = "rank-divergence"
_AREA = "distributed"

TD470 = register(
    Code(
        code="TD470",
        name="seed-not-set",
        family=_FAMILY,
        severity=Severity.WARNING,
        area=_AREA,
        title="a random generator the run depends on was not seeded",
        message="{what} is not seeded ({value}): {effect}.",
        fix="Seed once at the top of the script, before building the model and the DataLoader: "
        "`torch.manual_seed(SEED)` (or `lightning.seed_everything(SEED)`, which also seeds `random` and NumPy); "
        "start Python with `PYTHONHASHSEED=SEED` when anything iterates a set or dict of strings to build "
        "vocabularies, label maps or file lists.",
        meaning="The audit read torch's seed (`torch.initial_seed()`) and the `PYTHONHASHSEED` variable. When "
        "nobody seeds torch, it seeds itself at import from the operating system's randomness, so parameter "
        "initialisation, shuffling and the DataLoader workers' seeds (derived from it) change with every run.",
        why="A script that never calls `torch.manual_seed`, or calls it after the model or the DataLoader's "
        "iterator were made. Without `PYTHONHASHSEED` Python salts `hash(str)` per process, so the order of a "
        "`set` of strings differs between runs, between ranks and between spawned DataLoader workers.",
        false_positives="The seed is judged by a heuristic: a seed below 2**32 counts as chosen (every seed a "
        "person types, and the range of NumPy and Lightning seeds); torch's own seed is a 64-bit random number "
        "and falls below that once in 4 billion runs. A large seed set on purpose (`torch.manual_seed(2**40)`) "
        "reads as unseeded: pass `seed=` to the audit. `PYTHONHASHSEED` is read from this process's "
        "environment: it matters only where hash order decides something (reported as info).",
        related=("TD471", "TD477"),
    )
)

TD471 = register(
    Code(
        code="TD471",
        name="worker-rng-unseeded",
        family=_FAMILY,
        severity=Severity.WARNING,
        area=_AREA,
        title="the dataset holds its own random generator that DataLoader workers do not reseed",
        message="the dataset's {where} is a {kind} of its own; each of the {workers} DataLoader worker(s) "
        "starts from a copy of it{how}: {effect}.",
        fix="Reseed it in every worker from the worker's seed (which follows `torch.manual_seed`): "
        "`worker_init_fn=torchdoctor.worker_init_fn.then(reseed)` with `def reseed(worker_id): info = "
        "torch.utils.data.get_worker_info(); info.dataset.{attr} = numpy.random.default_rng(info.seed)` "
        "(or `random.Random(info.seed)`); or draw augmentations from torch (`torch.rand`, `torch.randint`), "
        "whose generator DataLoader seeds per worker.",
        meaning="DataLoader seeds `random`, NumPy's global generator and torch in each worker from "
        "`base_seed + worker_id`, and nothing else. A `numpy.random.Generator`, `RandomState` or "
        "`random.Random` the dataset keeps as an attribute is copied into every worker as it is: all workers "
        "draw the same numbers, and when it was made without a seed the numbers change from run to run.",
        why="`self.rng = np.random.default_rng()` in a dataset's `__init__` (or created lazily in "
        "`__getitem__`); a `worker_init_fn` that reseeds only the global generators "
        "(`np.random.seed`), which the dataset's own object does not use.",
        false_positives="Only generators held as attributes of the dataset (and of the datasets it wraps: "
        "Subset, ConcatDataset) when the audit runs are found; one made later inside a worker is not (a "
        "recorded run shows it: `torchdoctor runs diff` names the data as what parted). A custom "
        "`worker_init_fn` may reseed it: then this is reported as info.",
        related=("TD470", "TD477"),
    )
)

TD472 = register(
    Code(
        code="TD472",
        name="deterministic-algorithms-off",
        family=_FAMILY,
        severity=Severity.INFO,
        area=_AREA,
        title="torch may pick non-deterministic algorithms",
        message="torch.use_deterministic_algorithms is off{cuda}: {effect}.",
        fix="`torch.use_deterministic_algorithms(True)` at the start (on CUDA with "
        "`CUBLAS_WORKSPACE_CONFIG=:4096:8` exported, TD474); to see which operations would be affected first, "
        "`torch.use_deterministic_algorithms(True, warn_only=True)` under "
        "`torchdoctor.ranks.determinism.NondeterminismRecorder`.",
        meaning="With the flag off, operations that have a fast non-deterministic implementation use it: on "
        "CUDA, atomic additions (`index_add_`, `scatter_add_`, embedding and interpolation backward) sum in "
        "whatever order the threads finish, and cuDNN may choose non-deterministic convolution algorithms. The "
        "same inputs then give results that differ in the last bits, and training amplifies the difference.",
        why="It is off by default, because the deterministic versions are slower and some operations have none "
        "(they raise, or warn with `warn_only=True`).",
        false_positives="A CPU-only run uses few non-deterministic kernels (reported as info); bit-exact "
        "reproducibility is not always a goal.",
        related=("TD473", "TD474", "TD476"),
    )
)

TD473 = register(
    Code(
        code="TD473",
        name="cudnn-benchmark-on",
        family=_FAMILY,
        severity=Severity.WARNING,
        area=_AREA,
        title="cuDNN benchmarks convolution algorithms and keeps the fastest",
        message="torch.backends.cudnn.benchmark is True (cudnn.deterministic is {deterministic}): cuDNN times "
        "several convolution algorithms for each new input shape and keeps the fastest, which can be another one "
        "in the next run or on another rank, so the same convolution rounds differently.",
        fix="`torch.backends.cudnn.benchmark = False` (and `torch.backends.cudnn.deterministic = True`, or "
        "`torch.use_deterministic_algorithms(True)`) before the first convolution.",
        meaning="Benchmark mode trades reproducibility for speed: the chosen algorithm depends on timings, "
        "which depend on the GPU's load, clocks and memory at that moment.",
        why="Set by training templates for speed (`cudnn.benchmark = True`), or left on from a tuning run.",
        false_positives="Runs on the CPU (the value is reported but has no effect), and models without convolutions.",
        related=("TD472",),
    )
)

TD474 = register(
    Code(
        code="TD474",
        name="cublas-workspace-config-unset",
        family=_FAMILY,
        severity=Severity.WARNING,
        area=_AREA,
        title="deterministic algorithms are on but cuBLAS is not told to be deterministic",
        message="deterministic algorithms are on and this torch uses CUDA, but CUBLAS_WORKSPACE_CONFIG is {value}: "
        "the first cuBLAS matrix multiply raises a RuntimeError (a warning with warn_only=True) and computes "
        "non-deterministically.",
        fix="`export CUBLAS_WORKSPACE_CONFIG=:4096:8` (or `:16:8`, less memory, slower) in the shell or job "
        "script that starts Python; setting it in `os.environ` works only before CUDA is first used.",
        meaning="Since CUDA 10.2 cuBLAS can split a matrix multiply over several workspace buffers and reduce "
        "them in a varying order; only the two documented workspace configurations make it reproducible, and "
        "torch checks for them once deterministic algorithms are on.",
        why="`torch.use_deterministic_algorithms(True)` set in the script without the environment variable "
        "the CUDA runtime reads when it starts.",
        false_positives="torch builds without CUDA (not reported); runs that never call cuBLAS.",
        related=("TD472",),
    )
)

TD475 = register(
    Code(
        code="TD475",
        name="sampler-epoch-not-set",
        family=_FAMILY,
        severity=Severity.WARNING,
        area=_AREA,
        title="DistributedSampler.set_epoch was not called for this epoch",
        message="the DataLoader's {sampler} shuffles with epoch {sampler_epoch} but training is in epoch {epoch}: "
        "set_epoch() was not called, so every epoch sees the data in the same order.",
        fix="Call `loader.sampler.set_epoch(epoch)` at the start of every epoch, before iterating the loader "
        "(Lightning and Hugging Face Trainer do it for the samplers they create).",
        meaning="`DistributedSampler` seeds its shuffle with `seed + epoch`; the epoch changes only when "
        "`set_epoch` is called, so without it the permutation is the same every epoch.",
        why="A hand-written epoch loop that builds the sampler once and never calls `set_epoch`; a custom "
        "sampler wrapper that does not forward it.",
        false_positives="`shuffle=False` samplers (not reported); an audit called with an epoch counter "
        "that is not the one passed to `set_epoch` (for example counted from 1).",
        related=("TD470",),
    )
)

TD476 = register(
    Code(
        code="TD476",
        name="nondeterministic-op-hit",
        family=_FAMILY,
        severity=Severity.WARNING,
        area=_AREA,
        title="the run called operations that torch says have no deterministic implementation",
        message="{count} operation(s) without a deterministic implementation ran: {ops}.",
        fix="Replace each named operation by a deterministic equivalent (e.g. `scatter`/`index_put_` with "
        "`accumulate=True` instead of `put_`, a sort-based reduction instead of atomics), or accept run-to-run "
        "differences in the results they feed; `torch.use_deterministic_algorithms(True)` makes torch raise at "
        "the first one, with its stack.",
        meaning="With `torch.use_deterministic_algorithms(True, warn_only=True)` torch warns `<op> does not "
        "have a deterministic implementation, but you set 'torch.use_deterministic_algorithms(True, "
        "warn_only=True)'` each time such an operation runs; `NondeterminismRecorder` collected these "
        "warnings.",
        why="Operations whose fast kernels accumulate with atomics or scatter in parallel, mostly on CUDA "
        "(`index_add_`, `scatter_add_`, `histc`, interpolation and pooling backward), and a few on the CPU "
        "too (`put_` without accumulate, `MaxUnpool`).",
        false_positives="An operation whose non-determinism does not reach the result (for example `put_` "
        "with indices that never repeat).",
        related=("TD472", "TD477"),
    )
)
