"""Exceptions torchdoctor raises on purpose.

::

    TorchDoctorError             base: always carries a one-line message naming problem and fix
    ├── UsageError               bad arguments or options (exit code 2)
    │   └── UnknownCodeError     a code, name or family that is not in the catalogue
    └── FactsFileError           a --facts file that is missing, not JSON, too large, or does not
                                 match the facts schema (one line per problem)

    UnknownFactError             (a LookupError, not a user error) code asked for a fact path the
                                 facts schema does not have: a torchdoctor bug, never "not applicable"

The CLI prints ``str(exc)``, one line per problem, and exits with :attr:`ExitCode.USAGE`; it never
shows a traceback for these.
"""

from __future__ import annotations


class TorchDoctorError(Exception):
    """Base of every error torchdoctor raises deliberately."""


class UsageError(TorchDoctorError):
    """The user asked for something that cannot be done as asked."""


def positive_count(name: str, value: object, what: str = "steps", error: type[Exception] = ValueError) -> int:
    """``value`` when it is a positive int (not a bool); else ``error`` naming the argument and what it counts."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{name} must be a positive number of {what}; got {value!r}")
    return value


class UnknownCodeError(UsageError):
    def __init__(self, key: str, suggestions: list[str], what: str = "code", hint: str | None = None) -> None:
        self.key = key
        self.suggestions = suggestions
        if hint is None:
            hint = (
                f"; did you mean {', '.join(suggestions)}?" if suggestions else "; run `torchdoctor codes` for the list"
            )
        super().__init__(f"unknown {what} {key!r}{hint}")


class FactsFileError(TorchDoctorError):
    """A recorded facts snapshot could not be used.

    ``problems`` lists each problem on its own (``shm.size_bytes: expected an integer (bytes) or
    null, got "big"``); ``str()`` is one line per problem, at most :attr:`SHOWN` of them."""

    SHOWN = 10

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        if self.problems:
            lines = [f"{message}: {p}" for p in self.problems[: self.SHOWN]]
            more = len(self.problems) - self.SHOWN
            if more > 0:
                lines.append(f"{message}: {more} more problem(s) not shown")
            text = "\n".join(lines)
        else:
            text = message
        super().__init__(text)


class UnknownFactError(LookupError):
    """A fact path that is not in the facts schema (``facts/schema.py``): a programming error.

    Raised by :meth:`torchdoctor.facts.Facts.get` so that a typo or a renamed key can never read as
    ``None`` ("not applicable") and silently switch a check off."""

    def __init__(self, path: str, suggestions: list[str]) -> None:
        self.path = path
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        super().__init__(f"{path!r} is not a fact in the facts schema (torchdoctor/facts/schema.py){hint}")
