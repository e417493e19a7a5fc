"""Command line: ``torchdoctor check | facts | codes``.

Exit codes (:class:`~torchdoctor.model.ExitCode`): 0 nothing at or above ``--fail-on``,
1 findings at or above it, 2 usage or internal error. User mistakes produce one line on stderr.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys
from typing import Any

import click

from . import __version__
from .errors import TorchDoctorError, UsageError
from .model import ExitCode, Finding, Severity
from .options import DEFAULT_BATCH_BYTES, DEFAULT_NUM_WORKERS, DEFAULT_PREFETCH_FACTOR, CheckOptions
from .units import human_bytes, parse_bytes

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class SizeParam(click.ParamType):
    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_bytes(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeParam()
FORMAT = click.Choice(["text", "json", "markdown"])
FAIL_ON = click.Choice(["info", "warning", "error", "never"])


def exit_code_for(findings: list[Finding], fail_on: str) -> ExitCode:
    if fail_on == "never":
        return ExitCode.OK
    threshold = Severity.parse(fail_on)
    return ExitCode.FINDINGS if any(f.severity >= threshold for f in findings) else ExitCode.OK


#: Commands that live in their own modules (``torchdoctor/cli_<name>.py``); each registers itself on
#: ``cli`` when imported, and is imported only when asked for, so ``explain`` does not load the lab.
LAZY_COMMANDS = {
    "dist": "cli_dist",
    "explain": "cli_explain",
    "lab": "cli_lab",
    "loader": "cli_loader",
    "runs": "cli_runs",
    "watch": "cli_watch",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        present = {n for n, mod in LAZY_COMMANDS.items() if importlib.util.find_spec(f"{__package__}.{mod}")}
        return sorted(set(super().list_commands(ctx)) | present)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        mod = LAZY_COMMANDS.get(cmd_name)
        if mod and cmd_name not in self.commands and importlib.util.find_spec(f"{__package__}.{mod}"):
            importlib.import_module(f"{__package__}.{mod}")
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="torchdoctor")
def cli() -> None:
    """Prevent, detect and explain the failures where PyTorch training meets the OS.

    \b
    Before a run:   torchdoctor check                 audit this machine
                    torchdoctor check --num-workers 8 --batch-bytes 96MiB --path /ckpt
    After a crash:  torchdoctor explain LOG...        root cause across ranks, with the fix
    Before a job:   torchdoctor dist --nproc 4        smoke-test the process group, step by step
    While it runs:  torchdoctor watch -- python train.py   warn before a limit is reached
    See it fail:    torchdoctor lab list              failures reproduced for real, and their fixes
    Any code:       torchdoctor codes TD101           what it means and how to fix it
    Record a host:  torchdoctor facts > host.json     then: torchdoctor check --facts host.json
    """


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.option("--format", "fmt", type=FORMAT, default="text", show_default=True, help="Output format.")
@click.option(
    "--fail-on",
    type=FAIL_ON,
    default="error",
    show_default=True,
    help="Exit 1 when a finding is at or above this severity ('never': always exit 0).",
)
@click.option(
    "--facts",
    "facts_file",
    type=click.Path(dir_okay=True),
    help="Judge a recorded facts snapshot (from `torchdoctor facts`) instead of this host.",
)
@click.option(
    "--num-workers",
    type=click.IntRange(min=0),
    default=DEFAULT_NUM_WORKERS,
    show_default=True,
    help="DataLoader workers per training process.",
)
@click.option(
    "--batch-bytes",
    type=SIZE,
    default=str(DEFAULT_BATCH_BYTES),
    show_default=human_bytes(DEFAULT_BATCH_BYTES),
    help="Bytes of one batch as workers hand it over (e.g. 48MiB).",
)
@click.option(
    "--prefetch-factor",
    type=click.IntRange(min=1),
    default=DEFAULT_PREFETCH_FACTOR,
    show_default=True,
    help="Batches each worker keeps in flight.",
)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="Training processes on this machine (default: LOCAL_WORLD_SIZE, else 1).",
)
@click.option(
    "--path",
    "paths",
    multiple=True,
    type=click.Path(),
    help="A checkpoint, log or data directory to test (repeatable).",
)
@click.option(
    "--expect-bytes", type=SIZE, default=None, help="Bytes the run will write under each --path (checkpoints, logs)."
)
@click.option(
    "--dist", is_flag=True, help="Check the distributed environment even if no RANK/WORLD_SIZE variable is set."
)
@click.option(
    "--start-method",
    type=click.Choice(["fork", "spawn", "forkserver"]),
    default=None,
    help="Start method of the process that will iterate the DataLoader (default: Python's).",
)
@click.option(
    "--sharing-strategy",
    type=click.Choice(["file_descriptor", "file_system"]),
    default=None,
    help="torch.multiprocessing sharing strategy the run sets (default: torch's).",
)
@click.option("--no-torch", is_flag=True, help="Skip facts about the installed torch (fastest).")
@click.option(
    "--determinism",
    is_flag=True,
    help="Also audit this environment for a run meant to reproduce: PYTHONHASHSEED, CUBLAS_WORKSPACE_CONFIG with "
    "a CUDA torch (TD470, TD474). Seeds, flags and loaders are audited inside training: "
    "torchdoctor.determinism_report().",
)
@click.option(
    "-v", "--verbose", is_flag=True, help="Show what was checked and found fine one line each, with how it was judged."
)
def check(
    fmt: str,
    fail_on: str,
    facts_file: str | None,
    num_workers: int,
    batch_bytes: int,
    prefetch_factor: int,
    nproc_per_node: int | None,
    paths: tuple[str, ...],
    expect_bytes: int | None,
    dist: bool,
    start_method: str | None,
    sharing_strategy: str | None,
    no_torch: bool,
    determinism: bool,
    verbose: bool,
) -> None:
    """Audit this machine (or a recorded one) before training.

    Reads /dev/shm, vm.max_map_count, open-file limits, memory and cgroup limits, CPU threads,
    GPUs (through NVML, without creating a CUDA context), the distributed environment and the
    paths you name; reports each risk with its evidence and fix, and what was checked and found
    fine (one line; --verbose: one line each; JSON: "passed").

    \b
    Examples:
      torchdoctor check
      torchdoctor check --num-workers 8 --batch-bytes 96MiB --prefetch-factor 4
      torchdoctor check --path /checkpoints --expect-bytes 20GiB --fail-on warning
      torchdoctor check --facts recorded-node.json --format json
      torchdoctor check --determinism
    """
    from .checks import audit
    from .facts import Facts, GatherContext, gather
    from .report import render_findings

    if facts_file:
        if paths:
            raise UsageError(
                "--path needs the live host; record the snapshot with `torchdoctor facts --path DIR` instead"
            )
        if determinism:
            raise UsageError("--determinism reads this environment's variables: run it on the host, without --facts")
        facts = Facts.load(facts_file)
        source = f"recorded facts {facts_file}"
    else:
        facts = gather(GatherContext(paths=tuple(paths), dist=dist, torch=not no_torch))
        source = "this host"
    options = CheckOptions(
        num_workers=num_workers,
        batch_bytes=batch_bytes,
        prefetch_factor=prefetch_factor,
        expect_bytes=expect_bytes,
        dist=dist,
        start_method=start_method,
        sharing_strategy=sharing_strategy,
        nproc_per_node=nproc_per_node,
        assumed=frozenset(
            name
            for name in ("num_workers",)
            if click.get_current_context().get_parameter_source(name) is click.core.ParameterSource.DEFAULT
        ),
    )
    result = audit(facts, options)
    if determinism:
        from .checks import Audit

        extra = _determinism_findings(facts)
        findings = sorted([*result.findings, *extra], key=lambda f: -int(f.severity))  # worst first, stable
        result = Audit(findings, result.passed, result.machine)
    finish(
        lambda: render_findings(
            result.findings,
            fmt,
            "check",
            sys.stdout,
            {"source": source, "machine": result.machine},
            passed=result.passed,
            verbose=verbose,
        ),
        int(exit_code_for(result.findings, fail_on)),
    )


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.option("--format", "fmt", type=click.Choice(["json", "text"]), default="json", show_default=True)
@click.option(
    "--path", "paths", multiple=True, type=click.Path(), help="Also record facts about this directory (repeatable)."
)
@click.option("--dist", is_flag=True, help="Also probe MASTER_ADDR/MASTER_PORT.")
@click.option("--no-torch", is_flag=True, help="Skip facts about the installed torch.")
@click.option("--show-uuids", is_flag=True, help="Keep GPU UUIDs and serials as they are (anonymised by default).")
def facts(fmt: str, paths: tuple[str, ...], dist: bool, no_torch: bool, show_uuids: bool) -> None:
    """Print what torchdoctor reads from this machine, as replayable JSON.

    Secrets are redacted, by name: environment variables named like TOKEN, KEY, SECRET,
    PASSWORD, PASS, PWD, CREDENTIAL, AUTH, COOKIE, JWT, WEBHOOK, CONNECTION_STRING (as words:
    MONKEY and TOKENIZERS_PARALLELISM stay readable); and by shape, in every other value and in
    the command line of the process holding MASTER_PORT: credentials in URLs, token=/password=/
    AccountKey=/?api_key= values, secret flags' values, Bearer tokens and known token formats
    (GitHub, Slack, AWS, Hugging Face, OpenAI, JWTs). GPU UUIDs are anonymised unless --show-uuids.

    \b
      torchdoctor facts > node7.json
      torchdoctor check --facts node7.json
    """
    from .facts import GatherContext, gather

    snapshot = gather(GatherContext(paths=tuple(paths), dist=dist, torch=not no_torch, show_uuids=show_uuids))
    if fmt == "json":
        click.echo(snapshot.dumps())
        return
    for key, value in _flatten(snapshot.to_json()):
        click.echo(f"{key} = {value}")


def _flatten(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        out: list[tuple[str, Any]] = []
        for k in sorted(node):
            out += _flatten(node[k], f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, node)]


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("code", required=False)
@click.option("--family", help="Only codes of this failure family (e.g. shm-map-count).")
@click.option("--prefix", help="Only codes starting with this prefix (e.g. TD1).")
@click.option("--format", "fmt", type=FORMAT, default="text", show_default=True)
def codes(code: str | None, family: str | None, prefix: str | None, fmt: str) -> None:
    """List the catalogue, or explain one code (by TDnnn or name).

    \b
      torchdoctor codes                    every code
      torchdoctor codes --family fd-exhausted
      torchdoctor codes TD101              one code in full
      torchdoctor codes shm-too-small      the same, by name
    """
    from .errors import UnknownCodeError
    from .registry import all_codes, lookup, select
    from .report import codes as codes_report

    if code:
        try:
            chosen = [lookup(code)]
        except UnknownCodeError as exc:
            close, hint = codes_report.suggest(exc.key, all_codes())
            raise UnknownCodeError(exc.key, close, hint=hint) from None
    else:
        chosen = select(family=family, prefix=prefix)
    if fmt == "json":
        codes_report.write_json(chosen, sys.stdout)
    elif fmt == "markdown":
        sys.stdout.write(codes_report.markdown(chosen))
    elif code:
        codes_report.write_one(chosen[0], sys.stdout)
    else:
        codes_report.write_list(chosen, sys.stdout)


def _degrade_streams() -> None:
    """Output degrades to what the terminal can show (a non-UTF-8 locale, PYTHONIOENCODING=ascii, a
    lone surrogate in a user's exception message): what the stream cannot encode becomes ``?``,
    never an error."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:  # UTF-8 too: a lone surrogate from user text cannot be encoded
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):
                continue


def _quiet_stdout() -> None:
    """The reader of our output went away (``| head``): point stdout at /dev/null so the final
    flush at exit cannot fail again and change the exit status."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _exit_now(code: int) -> None:
    """Exit at once after a signal: every ``with`` block (children, temporary files) has already
    unwound; the interpreter's own shutdown could deadlock on a reader thread blocked in stdin."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def finish(render: Any, exit_code: int) -> None:
    """Render a command's output, then exit ``exit_code``; a closed pipe ends it quietly with the
    same status it would have had."""
    try:
        render()
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
    sys.exit(int(exit_code))


def main(argv: list[str] | None = None) -> None:
    """Entry point: turns every error into one line and a documented exit code.

    Ctrl-C exits 130 and SIGTERM/SIGHUP 128 + the signal (the shell's convention), after every
    child torchdoctor started has been ended (:mod:`torchdoctor.supervise`)."""
    from .stopping import Stopped, stoppable

    _degrade_streams()
    try:
        with stoppable():
            cli.main(args=argv, prog_name="torchdoctor", standalone_mode=False)
            sys.stdout.flush()  # a closed pipe shows here, not at exit where it would change the status
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("torchdoctor: interrupted", err=True)
        _exit_now(130)
    except Stopped as exc:
        click.echo(f"torchdoctor: stopped by {signal.Signals(exc.signum).name}", err=True)
        _exit_now(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(int(ExitCode.USAGE))
    except TorchDoctorError as exc:
        for line in str(exc).splitlines() or [""]:  # one line per problem (a facts file may have several)
            click.echo(f"torchdoctor: error: {line}", err=True)
        sys.exit(int(ExitCode.USAGE))
    except BrokenPipeError:
        _quiet_stdout()
        sys.exit(int(ExitCode.OK))
    except SystemExit as exc:
        if type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):  # click turned a closed pipe into exit 1
            _quiet_stdout()
            sys.exit(int(ExitCode.OK))  # commands whose status is not 0 when fine use finish()
        raise exc
    except Exception as exc:  # noqa: BLE001 - never a traceback from our code
        if os.environ.get("TORCHDOCTOR_DEBUG"):
            raise
        click.echo(
            f"torchdoctor: internal error: {type(exc).__name__}: {exc} "
            "(rerun with TORCHDOCTOR_DEBUG=1 for the traceback, and report it)",
            err=True,
        )
        sys.exit(int(ExitCode.USAGE))
    sys.exit(int(ExitCode.OK))


def _determinism_findings(facts: Any) -> list[Any]:
    """``check --determinism``: the determinism rules over this environment, as catalogue findings."""
    from dataclasses import replace

    from .model import Evidence
    from .ranks.determinism import determinism_rules, planned_facts
    from .registry import Hit, lookup

    cuda = facts.torch.cuda_build if facts.torch.installed else None
    out = []
    for found in determinism_rules(planned_facts(os.environ, cuda_built=cuda)):
        hit = Hit(severity=found.severity, evidence=(Evidence("read", found.evidence, "environment"),))
        out.append(replace(lookup(found.code).finding(hit), message=found.message, fix=found.fix))
    return out
