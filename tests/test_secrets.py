"""Secrets never leave the machine: planted in the environment, in a port holder's command line and
in logs, then searched for in every output format of the real CLI.

The redaction itself (names and value shapes) is tested here too, in both directions: what must go
(a property test plants each token format in arbitrary text) and what must stay readable.
"""

from __future__ import annotations

import json
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from torchdoctor.facts.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_text,
)

from .conftest import run_cli

# -- by name ----------------------------------------------------------------------------------------

SECRET_NAMES = [
    "HF_TOKEN",
    "GITHUB_TOKEN",
    "WANDB_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "DB_PASSWORD",
    "MYSQL_PWD",
    "DB_PWD",
    "COOKIE",
    "AZURE_STORAGE_CONNECTION_STRING",
    "CI_JOB_JWT",
    "CI_JOB_JWT_V2",
    "SLACK_WEBHOOK_URL",
    "PGPASSWORD",
    "REDIS_PASS",
    "SENTRY_DSN",
    "SSH_AUTH_SOCK",
    "apiKey",
    "HFTOKEN",
    "AccountKey",
    "x-api-key",
    "client_secret",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "KEY_PASSPHRASE",
]
PLAIN_NAMES = [
    "PATH",
    "PWD",
    "OLDPWD",
    "HOME",
    "MONKEY",
    "KEYBOARD_LAYOUT",
    "TOKENIZERS_PARALLELISM",
    "GIT_AUTHOR_NAME",
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "SLURM_JOB_NAME",
    "max_tokens",
    "tokenizer",
    "PASSTHROUGH",
    "BYPASS",
    "PGPASSFILE",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_plain_names_stay_readable(name: str) -> None:
    assert not is_secret_name(name)


GHP = "ghp_R8b2Kq7Zp0Lx4Vw9Nc3Ty6Hs1Jd5Fg2Ma8Qe"
HF = "hf_Vb7Kq2Lm9Np4Rs6Tu8Wx1Yz3Ac5De7Fg9Hj"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJwcm9qZWN0X3BhdGg6Z3JvdXAvcmVwbyJ9.Qm9ndXNTaWduYXR1cmVWYWx1ZTEyMzQ1Njc4"
ACCOUNT_KEY = "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6QUJDREVGR0hJSks+/w=="
#: name -> (value, the secret part of it, what must stay readable)
PLANTED_ENV = {
    "MYSQL_PWD": ("my5ql-Pw0rd", "my5ql-Pw0rd", ""),
    "DB_PWD": ("dbPw-77aa", "dbPw-77aa", ""),
    "COOKIE": ("session=c00kieVal42", "c00kieVal42", ""),
    "AZURE_STORAGE_CONNECTION_STRING": (
        (f"DefaultEndpointsProtocol=https;AccountName=acct7;AccountKey={ACCOUNT_KEY};EndpointSuffix=core.windows.net"),
        ACCOUNT_KEY,
        "",
    ),
    "CI_JOB_JWT": (JWT, JWT, ""),
    "SLACK_WEBHOOK_URL": (
        "https://hooks.slack.com/services/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",
        "ZyXwVuTsRqPoNmLkJiHgFeDc",
        "",
    ),
    # not secret by name: by shape
    "METRICS_URL": (
        "https://metrics.example.com/push?api_key=AkSecret7731&job=train",
        "AkSecret7731",
        "https://metrics.example.com/push?api_key=<redacted>&job=train",
    ),
    "SLURM_JOB_NAME": (f"finetune-{HF}", HF, "finetune-<redacted>"),
    "TRAIN_ARGS": (
        "--lr 3e-4 --hf-token hf_not_a_real_format_but_a_flag --epochs 3",
        "hf_not_a_real_format_but_a_flag",
        "--lr 3e-4 --hf-token <redacted> --epochs 3",
    ),
    "DATA_REMOTE": (
        "s3://minio:M1n10-Secr3t@minio.internal:9000/datasets",
        "M1n10-Secr3t",
        "s3://<redacted>@minio.internal:9000/datasets",
    ),
    "NOTES": (f"pushed with {GHP} by ci", GHP, "pushed with <redacted> by ci"),
    "AUTH_HEADER_VALUE": ("Bearer abcDEF123456.ghiJKL", "abcDEF123456.ghiJKL", ""),
}
#: Ordinary values: kept as they are, whatever the name (not secret).
READABLE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "PWD": "/home/alice/project",
    "OLDPWD": "/home/alice",
    "HOSTNAME": "node7.cluster.example.com",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TOKENIZERS_PARALLELISM": "false",
    "MONKEY": "banana",
    "GIT_AUTHOR_NAME": "Alice Example",
    "PIP_INDEX_URL": "https://pypi.org/simple",
    "NCCL_SOCKET_IFNAME": "eth0",
    "SLURM_JOB_NAME": "finetune-llama-7b",
    "OMP_NUM_THREADS": "8",
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    "TORCH_HOME": "/data/cache/torch",
    "HF_HUB_ENABLE_HF_TRANSFER": "1",
}


def test_redact_env_by_name_and_by_shape() -> None:
    red = redact_env({name: value for name, (value, _, _) in PLANTED_ENV.items()})
    for name, (_value, secret, kept) in PLANTED_ENV.items():
        assert secret not in red[name], (name, red[name])
        if kept:
            assert red[name] == kept
        elif is_secret_name(name):
            assert red[name] == REDACTED


def test_redact_env_keeps_ordinary_values_readable() -> None:
    assert redact_env(READABLE_ENV, gpu_ids=False) == dict(sorted(READABLE_ENV.items()))


# -- by shape -----------------------------------------------------------------------------------------

#: (text, the secret in it, the text once redacted)
SHAPES = [
    ("postgres://user:pw-9x@db.internal/runs", "pw-9x", "postgres://<redacted>@db.internal/runs"),
    ("mysql://root:p@ss@db:3306/x", "p@ss", "mysql://<redacted>@db:3306/x"),
    (
        "GET https://api.example.com/v1?api_key=AkSecret7731&page=2",
        "AkSecret7731",
        "GET https://api.example.com/v1?api_key=<redacted>&page=2",
    ),
    (
        "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&ss=b&sig=AbC%2Bd%3Dxyz&se=2030",
        "AbC%2Bd%3Dxyz",
        "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&ss=b&sig=<redacted>&se=2030",
    ),
    (
        "https://s3.example.com/b/k?X-Amz-Signature=f00dfeed1234&X-Amz-Expires=60",
        "f00dfeed1234",
        "https://s3.example.com/b/k?X-Amz-Signature=<redacted>&X-Amz-Expires=60",
    ),
    (f"GITHUB_TOKEN={GHP}", GHP, "GITHUB_TOKEN=<redacted>"),
    ("login failed: token=tok_9QwErTy12, retrying", "tok_9QwErTy12", "login failed: token=<redacted>, retrying"),
    ("Namespace(api_key='k-123-abc', lr=0.1)", "k-123-abc", "Namespace(api_key='<redacted>', lr=0.1)"),
    ('{"password": "hunter2!", "user": "bob"}', "hunter2!", '{"password": "<redacted>", "user": "bob"}'),
    (
        "wandb:\n  api_key: 0123abcd9876\n  project: llm",
        "0123abcd9876",
        "wandb:\n  api_key: <redacted>\n  project: llm",
    ),
    ("curl -H 'X-Api-Key: sekrit123' https://x", "sekrit123", "curl -H 'X-Api-Key: <redacted>' https://x"),
    ("Authorization: Basic YWxpY2U6c2VjcmV0", "YWxpY2U6c2VjcmV0", "Authorization: <redacted>"),
    ("sent with Bearer abcDEF123456.ghiJKL ok", "abcDEF123456.ghiJKL", "sent with Bearer <redacted> ok"),
    (
        f"DefaultEndpointsProtocol=https;AccountName=acct7;AccountKey={ACCOUNT_KEY};EndpointSuffix=core.windows.net",
        ACCOUNT_KEY,
        "DefaultEndpointsProtocol=https;AccountName=acct7;AccountKey=<redacted>;EndpointSuffix=core.windows.net",
    ),
    (
        "python train.py --db-password hunter2 --hf-token=hf_x --api-key X --epochs 3",
        "hunter2",
        "python train.py --db-password <redacted> --hf-token=<redacted> --api-key <redacted> --epochs 3",
    ),
    (
        "notify https://hooks.slack.com/services/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",
        "ZyXwVuTsRqPoNmLkJiHgFeDc",
        "notify https://hooks.slack.com/services/<redacted>",
    ),
    (f"job={JWT}", JWT, "job=<redacted>"),
    ("AWS key AKIAIOSFODNN7EXAMPLE used", "AKIAIOSFODNN7EXAMPLE", "AWS key <redacted> used"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", "MIIEpAIBAAKCAQEA", REDACTED),
    # a bare "key" is mostly code, but not as a query parameter or when the value looks generated
    (
        "GET https://maps.example.com/api/geocode?key=abcdefghijk",
        "abcdefghijk",
        "GET https://maps.example.com/api/geocode?key=<redacted>",
    ),
    ("cache(key=9f8e7d6c5b4a)", "9f8e7d6c5b4a", "cache(key=<redacted>)"),
    # one form's value holding another's key (found by the property test below)
    ("A=0(password=00000000", "00000000", "A=0(password=<redacted>"),
    ("A-APIKEY: (--db-password 00000000", "00000000", "A-APIKEY: <redacted> <redacted>"),
    ('A://"password=0@0000000', "0000000", "A://<redacted>"),
    ('"PASSWORD":"0"PASSWORD":1', '":1', '"PASSWORD":"<redacted>"PASSWORD":<redacted>'),
    ("Bearer --db-password 00000000", "00000000", "Bearer --db-password <redacted>"),
]


@pytest.mark.parametrize("text, secret, expected", SHAPES)
def test_secret_shapes_are_removed_and_the_rest_kept(text: str, secret: str, expected: str) -> None:
    assert secret in text
    assert redact_text(text) == expected


READABLE_TEXTS = [
    "/home/alice/data/train-00001-of-00010.parquet",
    "node7.cluster.example.com:29500",
    "expandable_segments:True,max_split_size_mb:128",
    "torchrun --nproc_per_node=8 --master_port=29500 train.py --max-tokens 4096 --tokenizer gpt2 --monkey 3",
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity)",
    "KeyError: 'learning_rate'",
    "ValueError: Invalid token: expected an integer",
    "configs/mask-rcnn_r50_fpn_1x_coco.py",
    "https://pypi.org/simple https://example.com/search?q=torch&page=2",
    "git@github.com:pytorch/pytorch.git at 3f2a9c1d4e5b6a7980f1e2d3c4b5a69788796a5b",
    "    token = kwargs.pop('token', None)",
    "    model = AutoModel.from_pretrained(name, token=token, use_auth_token=None, api_key=self.api_key)",
    "huggingface-cli login --token $HF_TOKEN",
    "[rank3]: NCCL WARN NET/Socket : peer 10.0.0.7<45122> closed connection",
    "MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 WORLD_SIZE=16 NCCL_DEBUG=INFO",
    "sklearn task-runner-abcdefghijklmnopqrstuvwxyz0123",
    "the bearer of bad news",
    # source lines of tracebacks: code, not secrets
    "    self.levels_to_dim.sort(key=lambda d: d._level)",
    "    G.add_edge(1, 2, key=0, weight=4)",
    "    for t in sorted(mapping, key=type_sorting_key):",
    "    f = np.vectorize(np.outer, signature='(a),(b)->(a,b)')",
    "    pass_dict=pass_patterns[0], pass_number=1,",
    "    c = Client(address, authkey=process.current_process().authkey)",
    '    log.info("self.hash_key=%s", self.hash_key)',
    "    dispatch_key: DispatchKey",
    "    token: str | None = None",
    "sas-desktop:26887:26910 [1] NCCL INFO Ring 00 : 1[1] -> 0[0] via direct shared memory",
]


@pytest.mark.parametrize("text", READABLE_TEXTS)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


def test_command_line_flags_both_forms() -> None:
    argv = [
        "/usr/bin/python3",
        "serve.py",
        "--db-password",
        "pass word 1",
        "--hf-token=hf_abc",
        "--api-key",
        "X",
        "--use-auth-token",
        "--port",
        "29500",
        "--token",
        "-v",
        "--secret=",
        "--key-file",
        "/etc/k.pem",
    ]
    out = redact_argv(argv)
    assert "pass word 1" not in out and "hf_abc" not in out and " X " not in out
    assert out == (
        "/usr/bin/python3 serve.py --db-password <redacted> --hf-token=<redacted> --api-key <redacted> "
        "--use-auth-token --port 29500 --token -v --secret= --key-file /etc/k.pem"
    )
    # a bare --key: its value goes when it looks generated, not when it names a column
    assert redact_argv(["x", "--sort-key", "loss", "--key", "a1b2c3d4e5"]) == "x --sort-key loss --key <redacted>"


def test_redaction_takes_linear_time() -> None:
    """A megabyte-long log line of pairs inside pairs must not take minutes (it did, quadratically)."""
    started = time.perf_counter()
    for text in ("x=" * 300_000, "a=b=c=d=" * 100_000, '"token":"' * 100_000, "--k " * 250_000):
        redact_text(text)
    assert time.perf_counter() - started < 30


# -- a planted token of each format, inside arbitrary text, always goes --------------------------------

_B62 = string.ascii_letters + string.digits
_B64URL = _B62 + "-_"
_UPPER_DIGITS = string.ascii_uppercase + string.digits
_SEPARATORS = [" ", "\t", "\n", '"', "'", "(", ")", "[", ",", ";", "|", "`", "{", ">", "<"]
#: After a value, "(" or "[" would make it code (``token=get_token(``, left alone on purpose).
_AFTER = [sep for sep in _SEPARATORS if sep not in "(["]


def _s(alphabet: str, low: int, high: int | None = None) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=low, max_size=high if high is not None else low)


def _value(low: int = 6, high: int = 40) -> st.SearchStrategy[str]:
    """A password or key: starts with a letter or digit, then anything a value holds unquoted."""
    return st.builds(str.__add__, _s(_B62, 1), _s(_B62 + "-_.+/=!@#$%^*~:", low - 1, high))


#: format -> strategy of (planted text, the secret that must not survive)
TOKEN_FORMATS: dict[str, st.SearchStrategy[tuple[str, str]]] = {
    "github": st.builds(
        lambda p, b: (p + b, b), st.sampled_from(["ghp_", "gho_", "ghs_", "ghu_", "ghr_"]), _s(_B62, 36)
    ),
    "github_pat": st.builds(lambda a, b: (f"github_pat_{a}_{b}", f"{a}_{b}"), _s(_B62, 22), _s(_B62, 59)),
    "slack": st.builds(
        lambda k, a, b, c: (f"xox{k}-{a}-{b}-{c}", f"{a}-{b}-{c}"),
        st.sampled_from("abpr"),
        _s(string.digits, 10, 13),
        _s(string.digits, 10, 13),
        _s(_B62, 24, 32),
    ),
    "aws": st.builds(lambda p, b: (p + b, p + b), st.sampled_from(["AKIA", "ASIA"]), _s(_UPPER_DIGITS, 16)),
    "huggingface": st.builds(lambda b: ("hf_" + b, b), _s(_B62, 34)),
    "openai": st.builds(
        lambda p, b: (p + b, b), st.sampled_from(["sk-", "sk-proj-", "sk-svcacct-"]), _s(_B62 + "-_", 40, 160)
    ),
    "jwt": st.builds(
        lambda h, p, s: (f"eyJ{h}.eyJ{p}.{s}", f"{p}.{s}"),
        _s(_B64URL, 10, 40),
        _s(_B64URL, 10, 200),
        _s(_B64URL, 20, 86),
    ),
    "slack_webhook": st.builds(
        lambda t, b, s: (f"https://hooks.slack.com/services/T{t}/B{b}/{s}", s),
        _s(_UPPER_DIGITS, 8, 10),
        _s(_UPPER_DIGITS, 8, 10),
        _s(_B62, 24),
    ),
    "bearer": st.builds(lambda b: ("Bearer " + b, b), _s(_B62 + "-._~+/", 20, 80)),
    "url_credentials": st.builds(
        lambda sc, u, pw, h: (f"{sc}://{u}:{pw}@{h}.example.com/db", pw),
        st.sampled_from(["https", "postgres", "postgresql+psycopg2", "redis", "s3", "amqp"]),
        _s(_B62, 1, 12),
        _s(_B62 + "-._~!$*+,;=:@%", 8, 40),
        _s(string.ascii_lowercase, 1, 12),
    ),
    "query": st.builds(
        lambda k, v: (f"https://api.example.com/v1/x?run=7&{k}={v}&page=2", v),
        st.sampled_from(
            [
                "api_key",
                "apikey",
                "token",
                "key",
                "sig",
                "signature",
                "password",
                "secret",
                "access_token",
                "refresh_token",
                "client_secret",
                "X-Amz-Signature",
                "X-Amz-Security-Token",
                "AccountKey",
                "auth",
            ]
        ),
        _s(_B62 + "-._~%+/=", 8, 60),
    ),
    "pair": st.builds(
        lambda k, v: (f"{k}={v}", v),
        st.sampled_from(
            [
                "password",
                "passwd",
                "token",
                "api_key",
                "AccountKey",
                "secret",
                "DB_PASSWORD",
                "MYSQL_PWD",
                "--hf-token",
                "--db-password",
                "x-api-key",
            ]
        ),
        _value(8),
    ),
    "flag": st.builds(
        lambda k, v: (f"--{k} {v}", v),
        st.sampled_from(
            ["db-password", "hf-token", "api-key", "password", "token", "secret", "auth-token", "access-key"]
        ),
        _value(8),
    ),
}


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    fmt=st.sampled_from(sorted(TOKEN_FORMATS)),
    prefix=st.text(max_size=60),
    suffix=st.text(max_size=60),
    before=st.sampled_from(_SEPARATORS),
    after=st.sampled_from(_AFTER),
)
def test_a_planted_token_never_survives(
    data: st.DataObject, fmt: str, prefix: str, suffix: str, before: str, after: str
) -> None:
    planted, secret = data.draw(TOKEN_FORMATS[fmt], label=fmt)
    assert len(secret) >= 8 and secret in planted
    around = prefix + before + planted.replace(secret, "", 1) + after + suffix
    parts = (secret, secret[:8], secret[-8:])
    assume(not any(part in around for part in parts))
    out = redact_text(prefix + before + planted + after + suffix)
    for part in parts:
        assert part not in out, (fmt, planted, out)
    assert REDACTED in out


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_redaction_is_idempotent(text: str) -> None:
    once = redact_text(text)
    assert redact_text(once) == once


# -- the real CLI: planted in the environment ------------------------------------------------------------


def _secrets_of(planted: dict[str, tuple[str, str, str]]) -> list[str]:
    return [secret for _, secret, _ in planted.values()]


def _squeeze(text: str) -> str:
    """Without whitespace: the text report folds a long token over lines, the search must not miss it."""
    return "".join(text.split())


def _assert_clean(outputs: dict[str, str], secrets: list[str]) -> None:
    for label, text in outputs.items():
        leaked = [s for s in secrets if s in text or s in _squeeze(text)]
        assert not leaked, f"{label} leaks {leaked}"


def test_facts_and_check_never_print_planted_environment_secrets() -> None:
    env = {name: value for name, (value, _, _) in PLANTED_ENV.items()}
    env.update(HF_TOKEN=HF, GITHUB_TOKEN=GHP, WANDB_API_KEY="0123456789abcdef0123456789abcdef01234567")
    secrets = _secrets_of(PLANTED_ENV) + [HF, GHP, env["WANDB_API_KEY"]]
    runs = {
        "facts json": ("facts", "--no-torch"),
        "facts text": ("facts", "--no-torch", "--format", "text"),
        "check json": ("check", "--no-torch", "--format", "json", "--fail-on", "never"),
        "check markdown": ("check", "--no-torch", "--format", "markdown", "--fail-on", "never"),
        "check text": ("check", "--no-torch", "--fail-on", "never"),
    }
    outputs = {}
    for label, args in runs.items():
        proc = run_cli(*args, env=env)
        assert proc.returncode == 0, (label, proc.stderr)
        outputs[label] = proc.stdout + proc.stderr
    _assert_clean(outputs, secrets)
    host_env = json.loads(outputs["facts json"])["host"]["env"]
    for name, (_, _, kept) in PLANTED_ENV.items():
        assert host_env[name] == (kept or REDACTED), name
    for name in ("HF_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY"):
        assert host_env[name] == REDACTED


def test_facts_keep_ordinary_environment_readable() -> None:
    proc = run_cli("facts", "--no-torch", "--show-uuids", env=READABLE_ENV)
    assert proc.returncode == 0, proc.stderr
    host_env = json.loads(proc.stdout)["host"]["env"]
    for name, value in READABLE_ENV.items():
        assert host_env[name] == value, name


# -- the real CLI: planted in the command line of the process holding MASTER_PORT ----------------------

HOLDER_SECRETS = {"--db-password": "Db-Pw-4417xyz", "--hf-token": HF, "--api-key": "AK-77x-secret"}
HOLD_PORT = """\
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


def test_port_holder_command_line_is_redacted(tmp_path: Path) -> None:
    script = tmp_path / "hold.py"
    script.write_text(HOLD_PORT)
    argv = [
        sys.executable,
        str(script),
        "--db-password",
        HOLDER_SECRETS["--db-password"],
        f"--hf-token={HOLDER_SECRETS['--hf-token']}",
        "--api-key",
        HOLDER_SECRETS["--api-key"],
        "--epochs",
        "3",
    ]
    holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2"}
        facts = run_cli("facts", "--no-torch", "--dist", env=env)
        assert facts.returncode == 0, facts.stderr
        store = json.loads(facts.stdout)["dist"]["store"]
        assert store["bindable"] is False and store["holder"]["pid"] == holder.pid, store
        cmdline = store["holder"]["cmdline"]
        assert (
            cmdline
            == (
                f"{sys.executable} {script} --db-password <redacted> --hf-token=<redacted> "
                "--api-key <redacted> --epochs 3"
            )[:200]
        )
        outputs = {"facts --dist": facts.stdout + facts.stderr}
        for fmt in ("json", "markdown", "text"):
            proc = run_cli("check", "--no-torch", "--dist", "--format", fmt, "--fail-on", "never", env=env)
            assert proc.returncode == 0, proc.stderr
            assert "TD407" in proc.stdout and str(holder.pid) in proc.stdout
            outputs[f"check --dist --format {fmt}"] = proc.stdout + proc.stderr
        _assert_clean(outputs, list(HOLDER_SECRETS.values()))
        assert "--db-password <redacted>" in outputs["check --dist --format json"]
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)


# -- the real CLI: planted in logs -----------------------------------------------------------------------

ROOT_CAUSE_LOG = f"""\
[rank2]: Traceback (most recent call last):
[rank2]:   File "/work/train.py", line 30, in <module>
[rank2]:     save(model, "/nonexistent-dir/ckpt.pt", hub_token="{HF}")
[rank2]:   File "/work/train.py", line 12, in save
[rank2]:     torch.save(model.state_dict(), path)
[rank2]:   File "/venv/lib/python3.11/site-packages/torch/serialization.py", line 828, in __init__
[rank2]:     torch._C.PyTorchFileWriter(
[rank2]: RuntimeError: Parent directory /nonexistent-dir does not exist.
"""
UNMATCHED_LOG = f"""\
Traceback (most recent call last):
  File "/work/report.py", line 9, in <module>
    requests.post(url, headers={{"Authorization": "Bearer {JWT}"}})
requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: https://api.example.com/v1/log?api_key=AkSecret7731&run=7
ERROR: notify failed: https://hooks.slack.com/services/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
ERROR: upload failed with token=tok_9QwErTy12 for postgres://trainer:PgPw-4c1d9e@db.internal:5432/runs
fatal: could not read from https://x-access-token:{GHP}@github.com/org/data.git
[rank0]: RuntimeError: cannot log in: GITHUB_TOKEN={GHP} HF_TOKEN={HF}
"""
LOG_SECRETS = [
    HF,
    JWT.split(".", 1)[1],
    "AkSecret7731",
    "ZyXwVuTsRqPoNmLkJiHgFeDc",
    "tok_9QwErTy12",
    "PgPw-4c1d9e",
    GHP[4:],
]
#: log -> format -> the secrets the report quotes when not redacted (markdown shows no traceback)
QUOTED = {
    "root-cause": {"text": [HF], "json": [HF], "markdown": []},
    "unmatched": {"text": LOG_SECRETS[1:], "json": LOG_SECRETS[1:], "markdown": LOG_SECRETS[2:]},
}
#: what stays readable around the secrets
CONTEXT = {
    "root-cause": ["Parent directory /nonexistent-dir", 'hub_token="<redacted>"'],
    "unmatched": [
        "api_key=<redacted>&run=7",
        "postgres://<redacted>@db.internal:5432/runs",
        "hooks.slack.com/services/",
        "GITHUB_TOKEN=<redacted>",
    ],
}


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("secret-logs")
    (d / "root-cause.log").write_text(ROOT_CAUSE_LOG, encoding="utf-8")
    (d / "unmatched.log").write_text(UNMATCHED_LOG, encoding="utf-8")
    return {"root-cause": d / "root-cause.log", "unmatched": d / "unmatched.log"}


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
@pytest.mark.parametrize("log", ["root-cause", "unmatched"])
def test_explain_redacts_log_secrets_in_every_format(logs: dict[str, Path], log: str, fmt: str) -> None:
    exit_code = 0 if log == "root-cause" else 1
    red = run_cli("explain", str(logs[log]), "--format", fmt)
    assert red.returncode == exit_code, red.stderr
    _assert_clean({f"explain --format {fmt}": red.stdout + red.stderr}, LOG_SECRETS)
    raw = run_cli("explain", str(logs[log]), "--format", fmt, "--no-redact")
    assert raw.returncode == exit_code, raw.stderr
    for secret in QUOTED[log][fmt]:
        assert secret in _squeeze(raw.stdout), f"--no-redact does not show {secret}"
    text = red.stdout.replace("\\<redacted\\>", REDACTED)  # markdown prose escapes the marker
    for kept in CONTEXT[log]:
        if fmt == "json":
            kept = json.dumps(kept)[1:-1]
        if log == "root-cause" and fmt == "markdown" and "hub_token" in kept:
            continue  # markdown shows no traceback
        assert kept in text, (kept, text)
    if fmt == "json":
        assert json.loads(red.stdout)["redacted"] is True and json.loads(raw.stdout)["redacted"] is False


def test_explain_from_stdin_is_redacted_too() -> None:
    red = run_cli("explain", "-", input=UNMATCHED_LOG)
    assert red.returncode == 1, red.stderr
    _assert_clean({"explain -": red.stdout}, LOG_SECRETS)
    raw = run_cli("explain", "-", "--no-redact", input=UNMATCHED_LOG)
    assert raw.returncode == 1, raw.stderr
    assert "AkSecret7731" in raw.stdout and GHP in raw.stdout


def test_explain_help_documents_no_redact() -> None:
    proc = run_cli("explain", "--help")
    assert proc.returncode == 0
    assert "--no-redact" in proc.stdout and "<redacted>" in proc.stdout


def test_render_redacts_by_default_for_api_callers() -> None:
    import io

    from torchdoctor.explain import explain
    from torchdoctor.explain.render import render

    report = explain(UNMATCHED_LOG)
    for fmt in ("text", "markdown", "json"):
        out = io.StringIO()
        render(report, fmt, out)
        _assert_clean({fmt: out.getvalue()}, LOG_SECRETS)
    # the report itself is untouched: matching and the Python API see the raw lines
    assert any("AkSecret7731" in u.ref.text for u in report.unmatched_errors)


def test_markdown_shows_the_marker_in_prose() -> None:
    """Outside code spans a bare <redacted> would render as an empty HTML tag on GitHub."""
    from torchdoctor.explain.render import _prose

    assert _prose(f"at {REDACTED}@db") == "at \\<redacted\\>@db"
