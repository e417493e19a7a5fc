"""Exceptions torchdoctor raises on purpose.

::

    TorchDoctorError             base: always carries a one-line message naming problem and fix
    ├── UsageError               bad arguments or options (exit code 2)
    │   └── UnknownCodeError     a code, name or family that is not in the catalogue
    └── FactsFileError           a --facts file that is missing, not JSON, or not a facts snapshot

The CLI prints ``str(exc)`` on one line and exits with :attr:`ExitCode.USAGE`; it never shows a
traceback for these.
"""

from __future__ import annotations


class TorchDoctorError(Exception):
    """Base of every error torchdoctor raises deliberately."""


class UsageError(TorchDoctorError):
    """The user asked for something that cannot be done as asked."""


class UnknownCodeError(UsageError):
    def __init__(self, key: str, suggestions: list[str], what: str = "code", hint: str | None = None) -> None:
        self.key = key
        self.suggestions = suggestions
        if hint is None:
            hint = (
                f"; did you mean {', '.join(suggestions)}?"
                if suggestions
                else "; run `torchdoctor codes` for the list"
            )
        super().__init__(f"unknown {what} {key!r}{hint}")


class FactsFileError(TorchDoctorError):
    """A recorded facts snapshot could not be used."""
