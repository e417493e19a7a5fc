"""Entry point of the lab's child process: ``python -m torchdoctor.lab.child NAME [--fixed]``.

Runs one scenario body. Whatever fails, fails here, with torch's and Python's own text on stderr.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from . import get

    name = argv[0]
    fixed = "--fixed" in argv[1:]
    get(name).body(fixed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
