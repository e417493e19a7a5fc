"""Log signatures of the GPU (TD350-399) and NCCL (TD480-499) codes against real fixture text.

Fixtures are real text from public reports (URL in each header) under ``tests/fixtures/logs/<CODE>/``:
positive files must be recognised by their code with the right values, ``near-*.log`` files must not.
Matching goes through the engine's own :func:`torchdoctor.explain.shows` (one matcher everywhere).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from torchdoctor.explain import explain, shows
from torchdoctor.registry import Code, Hit, all_codes, lookup
from torchdoctor.signature import Role, Signature

LOGS = Path(__file__).parent / "fixtures" / "logs"
# log codes of the GPU and NCCL ranges (TD366, a rank's GPU memory report, has no signature yet)
MINE = [c for c in all_codes() if c.signatures and (350 <= int(c.code[2:]) <= 399 or 480 <= int(c.code[2:]) <= 499)]
BY_CODE = {c.code: c for c in MINE}


@dataclass(frozen=True)
class Fixture:
    path: Path
    header: tuple[str, ...]
    lines: tuple[str, ...]

    @property
    def code(self) -> str:
        return self.path.parent.name

    @property
    def near(self) -> bool:
        return self.path.name.startswith("near-")

    @property
    def expect_top(self) -> str | None:
        for h in self.header:
            if h.startswith("# expect-top:"):
                return h.split(":", 1)[1].strip()
        return None

    @property
    def id(self) -> str:
        return f"{self.code}/{self.path.name}"


def _load(path: Path) -> Fixture:
    raw = path.read_text(encoding="utf-8").splitlines()
    end = raw.index("# ---")
    return Fixture(path, tuple(raw[:end]), tuple(raw[end + 1 :]))


FIXTURES = [_load(p) for code in sorted(BY_CODE) for p in sorted((LOGS / code).glob("*.log"))]
POSITIVE = [f for f in FIXTURES if not f.near]
NEAR = [f for f in FIXTURES if f.near]


@dataclass(frozen=True)
class Match:
    code: Code
    signature: Signature
    line_no: int
    values: dict[str, str]


def matches(code: Code, lines: tuple[str, ...]) -> list[Match]:
    """What the engine matches for ``code`` (the one matcher: :func:`torchdoctor.explain.shows`)."""
    return [Match(code, m.signature, m.line, m.values) for m in shows("\n".join(lines) + "\n", code)]


def all_matches(lines: tuple[str, ...]) -> list[Match]:
    return [m for code in MINE for m in matches(code, lines)]


def top_root_cause(lines: tuple[str, ...]) -> str | None:
    """The root cause the engine names when only these codes are known."""
    root = explain("\n".join(lines) + "\n", codes=MINE).root_cause
    return root.code if root is not None else None


# -- the fixture set itself ----------------------------------------------------------------------


def test_every_code_has_positive_and_near_miss_fixtures() -> None:
    assert len(MINE) >= 25
    for code in MINE:
        assert any(f.code == code.code for f in POSITIVE), f"{code.code} has no positive fixture"
        assert any(f.code == code.code for f in NEAR), f"{code.code} has no near-miss fixture"


@pytest.mark.parametrize("fx", FIXTURES, ids=lambda f: f.id)
def test_fixture_header_cites_a_real_source(fx: Fixture) -> None:
    assert fx.header and all(h.startswith("# ") for h in fx.header)
    source = [h for h in fx.header if h.startswith("# source:")]
    assert source and "https://github.com/" in source[0], "header must cite the public report"
    assert any(line.strip() for line in fx.lines), "fixture has no log text"


def test_every_signature_matches_some_real_text() -> None:
    for code in MINE:
        for sig in code.signatures:
            hit = any(m.signature is sig for f in POSITIVE if f.code == code.code for m in matches(code, f.lines))
            assert hit, f"{code.code}: signature {sig.pattern[:60]!r} has no positive fixture"


# -- positives and near misses -------------------------------------------------------------------


@pytest.mark.parametrize("fx", POSITIVE, ids=lambda f: f.id)
def test_positive_fixture_is_recognised(fx: Fixture) -> None:
    found = matches(BY_CODE[fx.code], fx.lines)
    assert found, f"{fx.id}: no signature of {fx.code} matched"
    for m in found:
        finding = m.code.finding(Hit(values=m.values))
        leftover = {p.strip("{}") for p in re.findall(r"\{[a-z_]+\}", finding.message + finding.fix)}
        # a wording that does not print a value (older NCCL names no peer) leaves it to the engine,
        # which shows it as unknown ("?"); every value the pattern captures must be filled
        captured = set(re.compile(m.signature.pattern).groupindex)
        assert not leftover & captured, f"{fx.id}: unfilled placeholders {leftover & captured} in {m.code.code}"
        assert not leftover - (m.code.placeholders() - captured), f"{fx.id}: {leftover} in {m.code.code}"


@pytest.mark.parametrize(
    "fx", [f for f in POSITIVE if BY_CODE[f.code].signatures[0].role is Role.ROOT_CAUSE], ids=lambda f: f.id
)
def test_root_cause_fixture_names_its_code_first(fx: Fixture) -> None:
    found = matches(BY_CODE[fx.code], fx.lines)
    if found and all(m.signature.role is Role.SYMPTOM for m in found):
        # prose that only a symptom of the code matches: no root cause, the code's hypothesis leads
        report = explain("\n".join(fx.lines) + "\n", codes=MINE)
        assert report.root_cause is None and report.diagnoses[0].code == (fx.expect_top or fx.code)
        return
    assert top_root_cause(fx.lines) == (fx.expect_top or fx.code)


@pytest.mark.parametrize("fx", NEAR, ids=lambda f: f.id)
def test_near_miss_fixture_is_not_recognised(fx: Fixture) -> None:
    found = matches(BY_CODE[fx.code], fx.lines)
    assert not found, f"{fx.id}: {[(m.line_no, m.signature.pattern[:40]) for m in found]}"


# -- extracted values ----------------------------------------------------------------------------

EXPECTED: dict[str, list[dict[str, str]]] = {
    "TD350/pytorch-59778-old-wording.log": [
        {
            "requested": "2.26 GiB",
            "gpu": "0",
            "total": "6.00 GiB",
            "allocated": "781.59 MiB",
            "free": "3.03 GiB",
            "reserved": "1.24 GiB",
        }
    ],
    "TD350/pytorch-examples-621-cached-torch-1.2.log": [
        {"requested": "26.00 MiB", "total": "1024.00 MiB", "free": "24.17 MiB", "reserved": "26.39 MiB"}
    ],
    "TD350/generativegraph-5-kib.log": [{"requested": "1024.00 KiB", "free": "576.00 KiB"}],
    "TD350/stable-diffusion-702-zero-bytes-free.log": [{"requested": "192.00 MiB", "free": "0 bytes"}],
    "TD350/mygirlgpt-11-torch-2.1-capacty.log": [
        {"requested": "32.00 MiB", "gpu": "0", "total": "4.00 GiB", "free": "41.56 MiB", "process_used": "3.44 GiB"}
    ],
    "TD350/mgfn-35-zero-bytes-is-free.log": [{"total": "6.00 GiB", "free": "0 bytes"}],
    "TD350/pytorch-16417-expandable-segments.log": [
        {"requested": "22.00 MiB", "total": "23.65 GiB", "free": "11.06 MiB", "process_used": "23.60 GiB"}
    ],
    "TD350/firered-tts2-17-other-processes.log": [
        {"free": "9.81 MiB", "other_pid": "3893521", "other_used": "618.00 MiB", "process_used": "9.74 GiB"}
    ],
    "TD350/ms-swift-5943-rank15.log": [{"gpu": "7", "requested": "2.63 GiB", "process_used": "0 bytes"}],
    "TD350/multirank-ms-swift-6301-oom-then-watchdog.log": [
        {"gpu": "3", "requested": "4.35 GiB", "other_pid": "2521735", "process_used": "60.30 GiB"}
    ],
    "TD351/wan2gp-1083-acceleratorerror.log": [{"error": "CUDA error: out of memory"}],
    "TD352/densematching-20.log": [{"status": "CUBLAS_STATUS_ALLOC_FAILED", "call": "cublasCreate(handle)"}],
    "TD353/info-hcvae-7-torch-1.3.log": [{"status": "CUDNN_STATUS_NOT_INITIALIZED"}],
    "TD355/cosipy-631-torch2.log": [{"error": "CUDA-capable device(s) is/are busy or unavailable"}],
    "TD355/pytorch-2704-thc-error-46.log": [{"error": "all CUDA-capable devices are busy or unavailable"}],
    "TD357/fastfcn-37-assertion-found-9000.log": [{"found": "9000"}],
    "TD357/fooocus-1313-found-11040.log": [{"found": "11040"}],
    "TD357/yuan-65-userwarning.log": [{"found": "11000"}],
    "TD357/mlcommons-54-error-35.log": [{"found": "not printed"}],
    "TD480/slowfast-535-nccl-2.7.8.log": [
        {"where": "/pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825", "nccl_version": "2.7.8"}
    ],
    "TD480/pytorch-pr-30157-ci.log": [{"nccl_version": "2.5.6"}],
    "TD480/nccl-207-title-no-version.log": [
        {"where": "/torch/lib/c10d/ProcessGroupNCCL.cpp:260", "nccl_version": "version not printed on this line"}
    ],
    "TD481/nccl-520-internal-error.log": [{"nccl_version": "20.9.9"}],
    "TD481/nccl-1546-barrier.log": [{"nccl_version": "2.18.1"}],
    "TD482/nccl-2076-nccl-2.21.5.log": [
        {"where": "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268", "nccl_version": "2.21.5"}
    ],
    "TD483/nccl-1405-status-12.log": [{"peer": "10.216.210.236<54862>", "status": "12", "vendor_err": "129"}],
    "TD483/nccl-928-error-4.log": [{"peer": "fe80::966d:ae03:8b:df78%ib0<53249>", "status": "4", "vendor_err": "81"}],
    "TD483/nccl-1664-ibp-title.log": [{"peer": "7.6.13.83<36315>", "status": "12"}],
    "TD484/nccl-1410-invalid-argument.log": [
        {"nccl_version": "2.20.5"},
        {"cuda_code": "1", "cuda_error": "invalid argument"},
    ],
    "TD484/diffusion-pipe-ui-10.log": [{"cuda_code": "999", "cuda_error": "unknown error"}],
    "TD485/nccl-1235-calloc.log": [{"bytes": "6291456"}],
    "TD486/ci-infra-490-enospc.log": [
        {"segment": "/dev/shm/nccl-WU88OE", "size": "9637888", "errno": "28", "error": "No space left on device"},
        {"segment": "/dev/shm/nccl-WU88OE", "size": "9637892"},
    ],
    "TD486/nccl-tests-166-extend.log": [{"segment": "/dev/shm/nccl-fjwOOB", "size": "5967872"}],
    "TD486/easyr1-228-ray.log": [{"segment": "/dev/shm/nccl-UmqSM9", "size": "7340384"}],
    "TD487/nccl-1589-attach-enoent.log": [
        {"segment": "/dev/shm/nccl-glnlGK", "size": "14156128", "errno": "2", "error": "No such file or directory"}
    ],
    "TD487/vllm-18831-title.log": [{"segment": "/dev/shm/nccl-", "size": "192814336"}],
    "TD488/verl-161.log": [{"rank": "1", "other_rank": "0", "device": "10"}, {"nccl_version": "2.20.5"}],
    "TD488/horovod-3929-mpirun.log": [{"rank": "2", "other_rank": "0", "device": "1000"}],
    "TD490/ofa-271-old-format.log": [
        {"rank": "1", "seq": "469508", "op": "ALLREDUCE", "timeout_ms": "1800000", "ran_ms": "1802212"}
    ],
    "TD490/basicsr-737.log": [{"rank": "2", "numel_in": "9801523", "ran_ms": "600061"}],
    "TD490/open-clip-1024-torch-2.5.1.log": [{"op": "ALLGATHER", "seq": "14217", "numel_out": "524288"}],
    "TD490/diffusers-12422-blocking-wait.log": [{"rank": "7", "seq": "2521", "timeout_ms": "600000"}],
    "TD490/accelerate-2174-thread-terminated.log": [{"rank": "7", "seq": "48490", "ran_ms": "1800368"}],
    "TD491/llamafactory-6269-timeout-at-work.log": [
        {"work": "7753", "last_enqueued": "7755", "last_completed": "7752"}
    ],
    "TD491/arctic-training-219.log": [{"work": "120049", "last_enqueued": "120051", "last_completed": "120048"}],
    "TD492/llamafactory-6953-multinode.log": [{"pending": "1"}, {"stuck_s": "600"}],
    "TD492/deim-105.log": [{"pending": "103"}, {"pending": "84"}],
    "TD493/pytorch-152623-desync.log": [{"lagging": "7", "finished": "182", "missing": "183"}],
    "TD494/ddcap-35-torch-1.9.log": [{"rank": "0", "indices": "1"}],
    "TD495/star-44.log": [{"rank": "3", "params": "2247", "other_rank": "0", "other_params": "0"}],
    "TD495/kronfluence-41-wrapped-twice.log": [{"rank": "6", "params": "59", "other_rank": "0", "other_params": "48"}],
    # widened wordings: old CUDA error numbers, NCCL result lines of other printers, NCCL < 2.8 segment names,
    # WorkNCCL without SeqNum/Timeout or wrapped after "Watchdog caught"
    "TD356/semantic-segmentation-68-error-101.log": [{}],
    "TD361/faster-rcnn-808-thc-error-999.log": [{}],
    "TD361/fastphotostyle-45-torch-0.3-thcgeneral-c.log": [{}],
    "TD357/colabtools-1685-title.log": [{"found": "not printed"}],
    "TD480/romp-80-nccl-error-2.log": [{"nccl_version": "version not printed on this line"}],
    "TD480/nccl-tests-15-common-cu.log": [{"test_where": "common.cu:921"}],
    "TD484/nccl-tests-5-all-reduce-cu.log": [{"test_where": "all_reduce.cu:95"}],
    "TD486/nccl-342-shm-recv.log": [
        {"error": "No space left on device"},
        {"segment": "nccl-shm-recv-250a7cc850ba9298-0-1-3", "size": "9637888"},
    ],
    "TD486/nccl-290-posix-fallocate.log": [{"error": "No space left on device", "size": "not printed"}],
    "TD490/anysplat-61-optype-first.log": [{"op": "ALLREDUCE", "seq": "458", "ran_ms": "1800600", "timeout_ms": "?"}],
    "TD490/nanotron-204-wrapped-prefix.log": [
        {"seq": "3", "numel_in": "1", "numel_out": "1", "timeout_ms": "600000", "ran_ms": "600888"},
        {"rank": "3", "seq": "3", "timeout_ms": "600000"},
    ],
    "TD497/nccl-210-ipv6.log": [{"error": "Address family not supported by protocol"}],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_signature_extracts_the_values(name: str) -> None:
    fx = _load(LOGS / name)
    got = [m.values for m in matches(BY_CODE[fx.code], fx.lines)]
    for want in EXPECTED[name]:
        assert any(want.items() <= values.items() for values in got), f"{name}: {want} not in {got}"


def test_oom_message_shows_the_numbers() -> None:
    fx = _load(LOGS / "TD350" / "pytorch-59778-old-wording.log")
    (m,) = matches(BY_CODE["TD350"], fx.lines)
    message = m.code.finding(Hit(values=m.values)).message
    assert "GPU 0" in message and "2.26 GiB" in message and "3.03 GiB" in message and "6.00 GiB" in message


# -- roles and relations -------------------------------------------------------------------------

ROLES = {
    "TD350": Role.ROOT_CAUSE,
    "TD351": Role.ROOT_CAUSE,
    "TD352": Role.ROOT_CAUSE,
    "TD355": Role.ROOT_CAUSE,
    "TD356": Role.ROOT_CAUSE,
    "TD357": Role.ROOT_CAUSE,
    "TD364": Role.ADVICE,
    "TD480": Role.ROOT_CAUSE,
    "TD486": Role.ROOT_CAUSE,
    "TD488": Role.ROOT_CAUSE,
    "TD490": Role.CASCADE,
    "TD491": Role.CASCADE,
    "TD492": Role.CASCADE,
    "TD493": Role.ROOT_CAUSE,
    "TD494": Role.ROOT_CAUSE,
    "TD496": Role.ADVICE,
    "TD497": Role.ROOT_CAUSE,
}


@pytest.mark.parametrize("code", sorted(ROLES))
def test_primary_signature_role(code: str) -> None:
    assert BY_CODE[code].signatures[0].role is ROLES[code]


def test_advice_lines_are_never_root_causes() -> None:
    fx = _load(LOGS / "TD364" / "forge-2524-advice-around-oom.log")
    advice = [m for m in matches(BY_CODE["TD364"], fx.lines)]
    assert len(advice) == 6 and all(m.signature.role is Role.ADVICE for m in advice)
    assert top_root_cause(fx.lines) == "TD351"


def test_observed_codes_point_to_the_preflight_codes() -> None:
    pairs = {
        "TD350": "TD305",
        "TD355": "TD303",
        "TD356": "TD309",
        "TD357": "TD311",
        "TD358": "TD301",
        "TD359": "TD308",
        "TD360": "TD302",
        "TD486": "TD103",
        "TD488": "TD310",
    }
    for log_code, preflight in pairs.items():
        assert preflight in BY_CODE[log_code].related
        assert lookup(preflight).family in {"gpu-unavailable", "cuda-oom", "nccl", "shm-exhausted"}


def test_two_ranks_on_one_gpu_is_a_gpu_mapping_problem() -> None:
    """failure-modes.md files "two ranks on one GPU" under gpu-unavailable, not under NCCL itself."""
    assert BY_CODE["TD488"].family == "gpu-unavailable"
    assert {BY_CODE[c].family for c in ("TD480", "TD486", "TD497")} == {"nccl"}


def test_workncl_fields_tolerate_a_line_without_its_parenthesis() -> None:
    """A WorkNCCL(...) cut before its closing parenthesis fails quickly instead of backtracking."""
    import time

    sig = BY_CODE["TD490"].signatures[0]
    fx = _load(LOGS / "TD490" / "nanotron-204-wrapped-prefix.log")
    cut = fx.lines[1].split(", Timeout")[0]  # real text, cut where a pasted line can end
    start = time.perf_counter()
    assert sig.match(cut + ", a" * 5000) is None
    assert time.perf_counter() - start < 0.5


def test_watchdog_cascade_points_to_root_causes() -> None:
    related = set(BY_CODE["TD490"].related)
    assert {"TD350", "TD480", "TD482", "TD491", "TD493"} <= related
    assert "TD490" in BY_CODE["TD350"].related


# -- multi-rank logs -----------------------------------------------------------------------------

RANK = re.compile(r"^\[rank(\d+)\]:")


@pytest.mark.parametrize(
    "name",
    ["TD350/multirank-ms-swift-6301-oom-then-watchdog.log", "TD350/multirank-assembled-ms-swift-5943-and-4917.log"],
)
def test_multirank_oom_explains_the_watchdog_timeouts(name: str) -> None:
    fx = _load(LOGS / name)
    found = all_matches(fx.lines)
    roots = [m for m in found if m.signature.role is Role.ROOT_CAUSE]
    cascades = [m for m in found if m.signature.role is Role.CASCADE]
    assert [m.code.code for m in roots] == ["TD350"], "the OOM is the only root cause in these logs"
    assert cascades and all(m.code.code in {"TD490", "TD491"} for m in cascades)
    oom_rank = RANK.match(fx.lines[roots[0].line_no - 1]).group(1)
    cascade_ranks = {RANK.match(fx.lines[m.line_no - 1]).group(1) for m in cascades}
    assert oom_rank not in cascade_ranks, "the timeouts come from the other ranks"
    assert roots[0].line_no < min(m.line_no for m in cascades), "the root cause precedes the cascade"
    assert fx.expect_top == "TD350" == top_root_cause(fx.lines)
