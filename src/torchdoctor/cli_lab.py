"""``torchdoctor lab list | run | record``: reproduce failure modes for real, in an isolated child.

Exit status of ``lab run`` and ``lab record``: 0 when every scenario behaved as declared (the
failure happened; with ``--fixed`` the fix passed; with ``--explain`` explain named the expected
code) or was skipped with a reason, 1 otherwise, 2 on usage errors.
"""

from __future__ import annotations

import contextlib
import json
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import click

from .cli import CONTEXT_SETTINGS, cli
from .errors import UsageError
from .model import ExitCode

TAIL_LINES = 25


@cli.group(context_settings=CONTEXT_SETTINGS)
def lab() -> None:
    """Reproduce failures for real, safely, in an isolated child process.

    Each scenario runs in its own session with lowered limits (or a private /dev/shm in its own
    mount namespace), bounded in time and memory; nothing system-wide is changed.

    \b
      torchdoctor lab list
      torchdoctor lab run map-count-fast-spawn --fixed --explain
      torchdoctor lab record tests/fixtures/logs worker-sigsegv
    """


# -- list -----------------------------------------------------------------------------------------


@lab.command("list", context_settings=CONTEXT_SETTINGS)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def list_(fmt: str) -> None:
    """List the scenarios: expected family and code, what each needs, typical time and memory bound."""
    from .lab import all_scenarios
    from .lab.runner import missing_needs

    rows: list[dict[str, Any]] = [
        {
            "name": s.name,
            "family": s.family,
            "code": s.code,
            "needs": list(s.needs),
            "seconds": s.seconds,
            "memory_mb": s.memory_mb,
            "slow": s.slow,
            "summary": s.summary,
            "skipped_reason": missing_needs(s),
        }
        for s in all_scenarios()
    ]
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    width = max((len(r["name"]) for r in rows), default=4)
    for r in rows:
        tags = ", ".join(r["needs"]) + (", slow" if r["slow"] else "")
        click.echo(
            f"{r['name']:<{width}}  {r['code']}  {r['family']:<16} ~{r['seconds']:>4.0f} s  "
            f"≤{r['memory_mb']} MB  [{tags}]"
        )
        click.echo(f"{'':<{width}}  {r['summary']}")
        if r["skipped_reason"]:
            click.echo(f"{'':<{width}}  skipped here: {r['skipped_reason']}")


# -- run ------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What ``lab run`` found; :meth:`to_dict` is the documented JSON."""

    scenario: str
    expected_family: str
    expected_code: str
    reproduced: bool = False
    exit_code: int | None = None
    seconds: float = 0.0
    explained_family: str | None = None
    explained_code: str | None = None
    fixed_passed: bool | None = None
    output_tail: str = ""
    skipped_reason: str | None = None
    timed_out: bool = False
    fixed_seconds: float | None = None
    fixed_output_tail: str | None = None
    notes: list[str] = field(default_factory=list)
    explain_wanted: bool = False
    warned: dict[str, Any] | None = None
    """With --watch: watch's first warning of the expected family, and how long before the end it came."""
    predicted: dict[str, Any] | None = None
    """The preflight (check or dist, under the scenario's own conditions) that named the failure's family first."""
    warnings: list[str] = field(default_factory=list)
    watch_wanted: bool = False

    @property
    def ok(self) -> bool:
        if self.skipped_reason:
            return True
        if not self.reproduced or self.fixed_passed is False:
            return False
        return not self.explain_wanted or self.explained_code == self.expected_code

    def to_dict(self) -> dict[str, Any]:
        keys = (
            "scenario",
            "expected_family",
            "expected_code",
            "reproduced",
            "exit_code",
            "seconds",
            "explained_family",
            "explained_code",
            "fixed_passed",
            "output_tail",
            "skipped_reason",
            "timed_out",
            "fixed_seconds",
            "fixed_output_tail",
            "notes",
        )
        out = {k: getattr(self, k) for k in keys}
        out["predicted"] = self.predicted
        if self.watch_wanted:
            out["warned"] = self.warned
            out["warnings"] = self.warnings
        return out


def shows_code(code: str, text: str) -> bool:
    """Whether the engine matches ``code``'s log signatures in ``text`` (the failure's own text)."""
    from .explain import shows

    return bool(shows(text, code))


def explain_record(text: str, expected: str | None = None) -> tuple[str | None, str | None, str | None]:
    """(family, code, note) of the root cause explain names for ``text``; a note when it cannot.

    A scenario whose code is a *confirmation* (a warning printed before the failure it predicts, e.g.
    TD277's memory imbalance before TD270's out-of-memory) counts as explained when explain attaches
    that code to the root cause it names: its code is returned, with a note naming the root cause."""
    from .explain import explain

    report = explain(text)
    root = report.root_cause
    if root is not None and expected and root.code != expected:
        if any(d.code == expected and d.explained_by == root.code for d in report.diagnoses):
            note = f"--explain: {expected} is the confirmation explain attached to the root cause {root.code}"
            return root.family, expected, note
    if root is None:
        # A survivor's output (a peer died elsewhere) holds only the cascade: name it, and say so.
        top = report.diagnoses[0] if report.diagnoses else None
        if top is not None and top.role == "cascade":
            return top.family, top.code, f"--explain: only a cascade ({top.code}); its root cause is in another process"
        return None, None, "--explain: explain named no root cause for this output"
    return root.family, root.code, None


@contextlib.contextmanager
def _spinner(message: str) -> Iterator[None]:
    """A rich spinner on stderr while a child runs, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(message, spinner="dots"):
        yield


def run_outcome(name: str, fixed: bool, explain: bool, timeout: float | None, watch: float | None = None) -> Outcome:
    from .lab import get
    from .lab.predict import predicted
    from .lab.runner import run

    s = get(name)
    out = Outcome(s.name, s.family, s.code, explain_wanted=explain, watch_wanted=watch is not None)
    if s.predict is not None:
        with _spinner(f"lab: {s.name}: the preflight ({s.predict.by}) under the scenario's conditions …"):
            out.predicted = predicted(s)
    with _spinner(f"lab: {s.name}: reproducing the failure (~{s.seconds:.0f} s) …"):
        rec = run(s, fixed=False, timeout=timeout, watch=watch)
    if rec.timeline is not None:
        out.warned = warned(rec.timeline, s.family)
        out.warnings = [w["message"] for w in rec.timeline["warnings"]]
    if rec.skipped:
        out.skipped_reason = rec.skipped
        return out
    out.exit_code, out.seconds, out.timed_out = rec.exit_code, rec.seconds, rec.timed_out
    out.reproduced = rec.failed and not rec.timed_out and not rec.memory_killed and shows_code(s.code, rec.text())
    out.output_tail = rec.tail(TAIL_LINES)
    out.notes += rec.notes
    if rec.failed and not out.reproduced and not rec.timed_out and not rec.memory_killed:
        out.notes.append(f"the child failed, but not with the text {s.code} recognises")
    if rec.timed_out:
        out.notes.append(f"the child was killed after {rec.seconds:.0f} s (time bound); that is not the failure")
    if explain:
        out.explained_family, out.explained_code, note = explain_record(rec.text(), s.code)
        if note:
            out.notes.append(note)
    if fixed:
        with _spinner(f"lab: {s.name}: running with the fix ({s.fix}) …"):
            frec = run(s, fixed=True, timeout=timeout)
        out.fixed_passed = frec.exit_code == 0 and not frec.timed_out
        out.fixed_seconds = frec.seconds
        out.fixed_output_tail = frec.tail(TAIL_LINES)
    return out


def warned(timeline: dict[str, Any], family: str) -> dict[str, Any] | None:
    """watch's first warning of ``family`` and how many seconds before the failure it came: before the
    output first showed the failure, or (when the output never showed it) before the run ended."""
    first = next((w for w in timeline.get("warnings") or [] if w.get("family") == family), None)
    if first is None:
        return None
    end = timeline.get("failed_at") or timeline["ended"]
    return {
        "code": first["code"],
        "lead_seconds": round(end - first["t"], 2),
        "before": "the failure's text" if timeline.get("failed_at") else "the end of the run",
        "message": first["message"],
    }


def _echo_outcome(out: Outcome, fix: str, summary: str) -> None:
    click.echo(f"{out.scenario}: {out.expected_family}, expects {out.expected_code}")
    click.echo(f"  {summary}")
    if out.skipped_reason:
        click.echo(f"  skipped: {out.skipped_reason}")
        return
    if out.predicted:
        p = out.predicted
        click.echo(f"  predicted by `torchdoctor {p['by']}` before the run: {p['code']} ({p['severity']})")
    state = "reproduced" if out.reproduced else "NOT reproduced"
    click.echo(f"  failure {state} in {out.seconds:.1f} s (exit code {out.exit_code})")
    click.echo("  ── last lines of its output ──")
    for line in out.output_tail.splitlines():
        click.echo(f"  │ {line}")
    if out.explain_wanted:
        if out.explained_code:
            verdict = "as expected" if out.explained_code == out.expected_code else f"expected {out.expected_code}"
            click.echo(f"  explain: {out.explained_code} ({out.explained_family}): {verdict}")
    if out.fixed_passed is not None:
        verdict = "passed" if out.fixed_passed else "FAILED"
        click.echo(f"  with the fix ({fix}): {verdict} in {out.fixed_seconds:.1f} s")
        if not out.fixed_passed and out.fixed_output_tail:
            for line in out.fixed_output_tail.splitlines():
                click.echo(f"  │ {line}")
    if out.watch_wanted:
        for line in out.warnings:
            click.echo(f"  watch: ▲ {line}")
        if out.warned:
            w = out.warned
            click.echo(f"  watch warned {w['lead_seconds']:.1f} s before {w['before']} ({w['code']})")
        else:
            click.echo(f"  watch: no warning of {out.expected_family} before the end")
    for note in out.notes:
        click.echo(f"  note: {note}")


@lab.command("run", context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@click.option("--fixed", is_flag=True, help="Then run it again with the recommended fix applied; it must pass.")
@click.option("--explain", "do_explain", is_flag=True, help="Pipe the captured output through `explain`.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=None,
    help="Seconds before the child is killed (default: the scenario's).",
)
@click.option(
    "--watch",
    "watch_interval",
    is_flag=False,
    flag_value=0.25,
    type=click.FloatRange(min=0.05, max=10),
    default=None,
    help="Sample the scenario like `torchdoctor watch` (every 0.25 s, or the seconds given) and report its "
    "first warning of the expected family (JSON: warned).",
)
def run_cmd(
    name: str, fixed: bool, do_explain: bool, fmt: str, timeout: float | None, watch_interval: float | None
) -> None:
    """Run scenario NAME in an isolated child and show what really happened.

    Exit status 0 when the failure happened (and, with --fixed, the fix passed; with --explain,
    explain named the expected code) or the scenario was skipped here with its reason; 1 otherwise.

    \b
      torchdoctor lab run fd-queue-ancdata
      torchdoctor lab run map-count-fast-spawn --fixed --explain --format json
    """
    from .lab import get

    s = get(name)
    out = run_outcome(name, fixed, do_explain, timeout, watch=watch_interval)
    if fmt == "json":
        click.echo(json.dumps(out.to_dict(), indent=2))
    else:
        _echo_outcome(out, s.fix, s.summary)
    sys.exit(int(ExitCode.OK if out.ok else ExitCode.FINDINGS))


# -- record ---------------------------------------------------------------------------------------


def _torch_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "not installed"


def fixture_header(name: str, exit_code: int | None, expect_top: str | None = None) -> str:
    """The header of a recorded fixture (see tests/test_explain_fixtures.py for the format)."""
    lines = [
        f"# source: recorded on this machine by `torchdoctor lab run {name}` (exit code {exit_code})",
        f"# torch {_torch_version()}, Python {platform.python_version()}, {platform.system()} {platform.release()}, "
        f"{date.today().isoformat()}",
    ]
    if expect_top:
        lines.append(f"# expect-top: {expect_top}")
    return "\n".join(lines + ["# ---"]) + "\n"


@lab.command("record", context_settings=CONTEXT_SETTINGS)
@click.argument("directory", type=click.Path(file_okay=False))
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="Overwrite fixtures that already exist.")
@click.option(
    "--as",
    "as_code",
    default=None,
    metavar="TDnnn",
    help="File the output under this code (e.g. a cascade it contains), with `# expect-top:` the scenario's code.",
)
@click.option("--include-slow", is_flag=True, help="Without NAMEs, also record the slow scenarios.")
@click.option("--timeout", type=click.FloatRange(min=1), default=None, help="Seconds before a child is killed.")
def record_cmd(
    directory: str, names: tuple[str, ...], force: bool, as_code: str | None, include_slow: bool, timeout: float | None
) -> None:
    """Record each scenario's real output as DIRECTORY/<CODE>/lab-<NAME>.log (explain's fixtures).

    Without NAMEs every scenario that is not slow is recorded. An existing file is kept unless
    --force. Only outputs where the failure really happened are written.

    \b
      torchdoctor lab record tests/fixtures/logs
      torchdoctor lab record tests/fixtures/logs worker-sigkill --as TD564
    """
    from .lab import all_scenarios, get
    from .lab.runner import run
    from .registry import lookup

    if as_code:
        as_code = lookup(as_code).code
    chosen = [get(n) for n in names] if names else [s for s in all_scenarios() if include_slow or not s.slow]
    if not chosen:
        raise UsageError("no scenarios to record")
    failures = 0
    for s in chosen:
        code = as_code or s.code
        target = Path(directory) / code / f"lab-{s.name}.log"
        if target.exists() and not force:
            click.echo(f"{s.name}: {target} exists; kept (--force to overwrite)")
            continue
        with _spinner(f"lab: recording {s.name} (~{s.seconds:.0f} s) …"):
            rec = run(s, fixed=False, timeout=timeout)
        if rec.skipped:
            click.echo(f"{s.name}: skipped: {rec.skipped}")
            continue
        if not rec.failed or rec.timed_out or rec.memory_killed or not shows_code(s.code, rec.text()):
            failures += 1
            why = (
                "timed out"
                if rec.timed_out
                else "was killed over its memory bound"
                if rec.memory_killed
                else "exited 0"
                if not rec.failed
                else f"failed without the text {s.code} recognises"
            )
            click.echo(f"{s.name}: the failure did not happen (the child {why}); nothing written")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        expect_top = s.code if as_code and as_code != s.code else None
        target.write_text(fixture_header(s.name, rec.exit_code, expect_top) + rec.text(), encoding="utf-8")
        click.echo(f"{s.name}: wrote {target} ({rec.seconds:.1f} s, exit code {rec.exit_code})")
    sys.exit(int(ExitCode.FINDINGS if failures else ExitCode.OK))
