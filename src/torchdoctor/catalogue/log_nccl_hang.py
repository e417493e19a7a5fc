"""TD490-TD496: collectives that never complete under ProcessGroupNCCL, as they show up in logs (``explain``).

When one rank fails, hangs or takes another code path, the others wait in their next collective until
ProcessGroupNCCL's watchdog times it out (TD490), aborts the process (TD491) or its heartbeat monitor
gives up (TD492). These lines are cascades: the first failing rank's own error is the root cause. The
desync report (TD493) is the exception: it names the ranks that never arrived. Positive and
near-miss fixtures (real text, with the public report they come from) live in
``tests/fixtures/logs/<CODE>/``.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature
from .log_nccl import _HANG as _NCCL_HANG
from .log_nccl import _HANG_WORDS as _NCCL_HANG_WORDS

_KEYS = r"SeqNum=|OpType=|Numel(?:In|ln|Out)=|Timeout\(ms\)="
_FIELD = (
    r"(?:SeqNum=(?P<seq>\d+)|OpType=(?P<op>\w+)|Numel(?:In|ln)=(?P<numel_in>\d+)|NumelOut=(?P<numel_out>\d+)"
    rf"|Timeout\(ms\)=(?P<timeout_ms>\d+)|(?!{_KEYS})[^,()\s][^,()]*)"
)
_WORK = rf"WorkNCCL\((?:{_FIELD}(?:,\s*|(?=\))))+\)"
"""``WorkNCCL(...)`` in any torch version: fields in any order, each optional (``SeqNum`` since 1.10,
``TensorShape`` in 1.8-1.10, ``NumelIn``/``NumelOut`` since 1.12), unknown fields and pasting damage
(``Numelln``, a wrapped ``OpTy pe``) skipped. A field must end at a comma or the closing parenthesis and
a skipped field cannot start like a known one, so a line without the parenthesis fails in linear time."""
_WORK_DEFAULTS = {"seq": "?", "op": "?", "timeout_ms": "?"}
_SYMPTOM_VALUES = {"seq": "?", "op": "a collective", "timeout_ms": "the process group timeout"}
_HANG = _NCCL_HANG[:-1] + "|blocked)"
_HANG_WORDS = (*_NCCL_HANG_WORDS, "blocked")
"""log_nccl's hang words, and ``blocked``."""
_TIMEOUT_CONFIRM = (
    "Look for `Watchdog caught collective operation timeout ... Timeout(ms)=1800000` and check whether "
    "one rank was still busy (preprocessing, evaluation, saving) when the others waited."
)

TD490 = register(
    Code(
        code="TD490",
        name="nccl-watchdog-timeout",
        family="dist-hang",
        severity=Severity.ERROR,
        area="distributed",
        title="a NCCL collective timed out (watchdog): look for the rank that failed first",
        message="NCCL collective {op} (SeqNum {seq}) did not complete within {timeout_ms} ms: this rank waited for peers "
        "that never joined.",
        fix="This is a symptom. Find the rank that failed or stalled first; its own error (CUDA OOM, a crash, a NCCL "
        "error, a killed process) is the cause. Compare the last completed SeqNum per rank, and set "
        "`TORCH_DISTRIBUTED_DEBUG=DETAIL` (desync report names the lagging rank) and "
        "`TORCH_NCCL_TRACE_BUFFER_SIZE=2000`. If no rank failed: the ranks took different paths. A collective "
        "called on one rank only (a barrier, `all_gather`, a DeepSpeed or Accelerate `save_checkpoint`/`save_state` "
        "inside `if rank == 0` or `is_main_process`) must be called on all ranks; uneven data (one rank runs an "
        "extra step) needs the same number of batches on every rank (`DistributedSampler(drop_last=True)`, DDP's "
        "`Join`). Or a long rank-0-only step "
        "(evaluation, checkpoint saving) exceeded the timeout: raise it with "
        "`init_process_group(timeout=datetime.timedelta(hours=1))`. For transport problems: `NCCL_DEBUG=INFO`, "
        "`NCCL_P2P_DISABLE=1` / `NCCL_IB_DISABLE=1`.",
        meaning="ProcessGroupNCCL's watchdog thread found a collective still running after the process group timeout "
        "(10 minutes by default in recent torch, 30 before) and will abort the process.",
        why="Another rank died, hung, or is executing a different collective; less often the network or GPU "
        "peer-to-peer path hangs.",
        false_positives="A single rank doing long legitimate work between collectives (big evaluation on rank 0) also "
        "times out its peers; then the fix is the timeout or moving that work.",
        related=("TD491", "TD492", "TD493", "TD350", "TD482", "TD480"),
        signatures=(
            Signature(
                role=Role.CASCADE,
                triggers=("collective operation timeout",),  # "Watchdog caught" may wrap away
                pattern=rf"(?:\[Rank (?P<rank>\d+)\] )?(?:Watchdog caught )?collective operation timeout:\s*{_WORK}"
                r"(?: ran for (?P<ran_ms>\d+) (?:milliseconds|ms))?",
                confidence=0.9,
                values=_WORK_DEFAULTS,
            ),
            Signature(
                role=Role.CASCADE,
                triggers=("timed out in blocking wait",),
                pattern=rf"(?:\[Rank (?P<rank>\d+)\] )?Work {_WORK} timed out in blocking wait",
                confidence=0.85,
                values=_WORK_DEFAULTS,
            ),
            # Prose. Each symptom's triggers are its *last* words: a line cut inside the pattern must reach them.
            Signature(
                role=Role.SYMPTOM,
                triggers=_HANG_WORDS,
                pattern=rf"(?i)\b(?:DDP|distributed|multi[- ]?(?:GPU|node|process)s?|torchrun|barrier|broadcast\w*|"
                rf"ranks?)\b[^\n]{{0,80}}\b{_HANG}\b",
                # a hang with its reason on the line (a rank skipping a step, uneven data) is rank divergence
                exclude=(r"(?i)\breturn(?:s|ing)? None\b|\bskip(?:s|ped|ping)?\b|\buneven\b|\ball_?gather",),
                confidence=0.5,
                values=_SYMPTOM_VALUES,
                confirm="Dump every rank's stack while it hangs (`py-spy dump --pid <pid>`) and rerun with "
                "`TORCH_DISTRIBUTED_DEBUG=DETAIL`: ranks waiting in different collectives, or one rank "
                "outside any, confirm it.",
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=_HANG_WORDS,
                pattern=rf"(?i)\b(?:evaluation|validation|validating|evaluating|eval)\b[^\n]{{0,60}}\b{_HANG}\b",
                confidence=0.4,
                values=_SYMPTOM_VALUES,
                confirm="Check whether evaluation runs on every rank or only on rank 0 (`if rank == 0:` around a DDP "
                "model call or a collective); `py-spy dump --pid <pid>` on each rank shows where it waits.",
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("30 min", "30min", "thirty min", "Thirty min"),
                pattern=r"(?i)\b(?:time ?out|timed out)\b[^\n]{0,40}\b(?:30 ?min(?:ute)?s?|thirty minutes)\b",
                confidence=0.55,
                values=_SYMPTOM_VALUES,
                confirm=_TIMEOUT_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("timeout", "Timeout", "time out", "timed out", "time limit", "超时"),
                pattern=r"(?i)(?:\b30 ?min(?:ute)?s?|\bthirty minutes|30 ?分钟)[^\n]{0,40}(?:\btime ?out\b|"
                r"\btimed out\b|\btime limit\b|超时)",
                confidence=0.55,
                values=_SYMPTOM_VALUES,
                confirm=_TIMEOUT_CONFIRM,
            ),
        ),
    )
)

TD491 = register(
    Code(
        code="TD491",
        name="nccl-watchdog-abort",
        family="dist-hang",
        severity=Severity.ERROR,
        area="distributed",
        title="the NCCL watchdog is taking the process down after a failed or timed-out collective",
        message="ProcessGroupNCCL's watchdog is terminating this process after a collective failed or timed out "
        "({status}).",
        fix="A symptom: read the error or timeout printed before it on this rank (TD490 and others), and the first "
        "failure on any rank. " + "Set `TORCH_NCCL_TRACE_BUFFER_SIZE=2000` to record what each rank was doing.",
        meaning="After a NCCL error or timeout the watchdog aborts the communicator and the process, because later GPU "
        "work could use incomplete data.",
        why="Follows every NCCL timeout or asynchronous NCCL error.",
        false_positives="Never a cause by itself.",
        related=("TD490", "TD492"),
        signatures=(
            Signature(
                role=Role.CASCADE,
                triggers=("Some NCCL operations have failed or timed out",),
                pattern=r"Some NCCL operations have failed or timed out",
                confidence=0.8,
                values={"status": "see the watchdog lines before this one"},
            ),
            Signature(
                role=Role.CASCADE,
                triggers=("we are taking the entire process down",),
                pattern=r"To avoid (?:data|this) inconsistency, we are taking the entire process down",
                confidence=0.8,
                values={"status": "see the watchdog lines before this one"},
            ),
            Signature(
                role=Role.CASCADE,
                triggers=("detected by watchdog at work", "Timeout at NCCL work"),
                pattern=r"(?:detected by watchdog at work|Timeout at NCCL work): (?P<status>(?P<work>\d+), last "
                r"enqueued NCCL work: (?P<last_enqueued>-?\d+), last completed NCCL work: "
                r"(?P<last_completed>-?\d+))",
                confidence=0.8,
            ),
            Signature(
                role=Role.CASCADE,
                triggers=("failure detected by watchdog at work sequence id",),
                pattern=r"failure detected by watchdog at work sequence id: (?P<status>(?P<work>\d+) PG status: "
                r"last enqueued work: (?P<last_enqueued>-?\d+), last completed work: "
                r"(?P<last_completed>-?\d+))",
                confidence=0.8,
            ),
        ),
    )
)

TD492 = register(
    Code(
        code="TD492",
        name="nccl-heartbeat-monitor-timeout",
        family="dist-hang",
        severity=Severity.ERROR,
        area="distributed",
        title="ProcessGroupNCCL's heartbeat monitor found the watchdog stuck and kills the process",
        message="ProcessGroupNCCL's watchdog thread stopped making progress ({detail}); the heartbeat monitor "
        "terminates the process.",
        fix="A symptom of a hang: a NCCL or CUDA call blocks the watchdog (a peer died or never arrived, a GIL deadlock, "
        "a collective that never completes). Find the first rank that failed; dump the stacks of hung ranks "
        "(`py-spy dump --pid <pid>`). If nodes start minutes apart (LlamaFactory#6953) or one rank does long work "
        "before its first collective, raise `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`; set "
        "`TORCH_NCCL_ENABLE_MONITORING=0` only when sure it is a false positive.",
        meaning="A monitor thread checks that the watchdog thread's heartbeat advances; when it stalls for "
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC the monitor dumps debug info and aborts.",
        why="The watchdog is blocked inside NCCL/CUDA (usually because a collective can never finish) or by the GIL.",
        false_positives="Very slow startup of some ranks.",
        related=("TD490", "TD491", "TD493"),
        signatures=(
            Signature(
                role=Role.CASCADE,
                triggers=("Heartbeat monitor timed out",),
                pattern=r"Heartbeat monitor timed out! Process will be terminated after dumping debug info\."
                r"(?: (?P<detail>workMetaList_\.size\(\)=(?P<pending>\d+)))?",
                confidence=0.85,
                values={"detail": "heartbeat monitor timed out"},
            ),
            Signature(
                role=Role.CASCADE,
                triggers=("watchdog got stuck for",),
                pattern=r"ProcessGroupNCCL's watchdog got stuck for (?P<detail>(?P<stuck_s>\d+) seconds) without "
                r"making progress",
                confidence=0.85,
            ),
        ),
    )
)

TD493 = register(
    Code(
        code="TD493",
        name="nccl-desync-lagging-rank",
        family="dist-hang",
        severity=Severity.ERROR,
        area="distributed",
        title="torch's desync report names the rank(s) that never joined a collective",
        message="The desync report names rank(s) {lagging} as lagging, dead or mismatched: they did not join collective "
        "#{missing}.",
        fix="Read the log of rank(s) {lagging}: a crash, OOM or error there is the cause. If they were alive, they were "
        "blocked elsewhere (data loading, I/O, a different code path or a rank-conditional collective): dump their "
        "stacks with `py-spy dump --pid <pid>` and run with `TORCH_DISTRIBUTED_DEBUG=DETAIL` to check collective "
        "order and shapes.",
        meaning="With desync debugging on, the watchdog of a timed-out rank asks every rank for its last collective and "
        "reports who is behind.",
        why="One rank died, hung, or took another code path, so its peers waited for it until the timeout.",
        false_positives="None known; the named ranks are the ones to investigate.",
        related=("TD490", "TD492"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("didn't join collective",),
                pattern=r"\[(?P<lagging>\d+(?:, \d+)*)\] (?:finished collective #(?P<finished>\d+), but )?"
                r"didn't join collective #(?P<missing>\d+)",
                confidence=0.7,
            ),
        ),
    )
)

TD496 = register(
    Code(
        code="TD496",
        name="nccl-flight-recorder-advice",
        family="dist-hang",
        severity=Severity.INFO,
        area="distributed",
        title="torch's note that the NCCL flight recorder was off",
        message="torch could not show the failed collective's stack ({hint}); context for a NCCL failure, not a cause.",
        fix="To record each rank's recent collectives for the next failure, set `TORCH_NCCL_TRACE_BUFFER_SIZE=2000`; "
        "the dumps show which rank stopped issuing collectives.",
        meaning="Printed by ProcessGroupNCCL next to a watchdog failure when its trace buffer is disabled.",
        why="The flight recorder is off by default in many torch versions.",
        false_positives="It is advice, never a diagnosis.",
        related=("TD490", "TD491"),
        signatures=(
            Signature(
                role=Role.ADVICE,
                triggers=("FlightRecorder is disabled",),
                pattern=r"Stack trace of the failed collective not found, potentially because FlightRecorder is "
                r"disabled",
                confidence=0.3,
                values={"hint": "flight recorder disabled; enable with TORCH_NCCL_TRACE_BUFFER_SIZE"},
            ),
        ),
    )
)
