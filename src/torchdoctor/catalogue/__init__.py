"""Every catalogue declaration lives in one module per failure domain in this package.

Each module registers its codes with :func:`torchdoctor.registry.register` when imported; there is
no other list to keep in sync. Modules named ``log_*`` hold the codes recognised in logs
(``explain``), the others the preflight codes; :func:`load` imports either or both, once.

Code ranges: 1xx shared memory and IPC, 2xx memory, process limits and CPU threads, 3xx GPU,
4xx distributed, 5xx data loading, 6xx storage, 9xx torchdoctor itself.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..registry import Code

_loaded: set[str] = set()

#: Preflight checks for codes declared in a ``log_*`` module: the same code (name, family, title, doc
#: sections), with a message and fix worded for a check made before the run and the ``check`` function.
#: A preflight module adds to it when imported; :func:`torchdoctor.checks.preflight_codes` runs them.
PREFLIGHT_VARIANTS: dict[str, Code] = {}


def load(logs_only: bool = False) -> None:
    """Import (and so register) the catalogue modules; ``logs_only`` skips the preflight ones."""
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
        if mod in _loaded or (logs_only and not mod.startswith("log_")):
            continue
        importlib.import_module(f"{__name__}.{mod}")
        _loaded.add(mod)
