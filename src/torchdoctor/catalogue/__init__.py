"""Every catalogue declaration lives in one module per failure domain in this package.

Importing the package imports each module once, and each module registers its codes with
:func:`torchdoctor.registry.register`; there is no other list to keep in sync.

Code ranges: 1xx shared memory and IPC, 2xx memory, process limits and CPU threads, 3xx GPU,
4xx distributed, 5xx data loading, 6xx storage, 9xx torchdoctor itself.
"""

from __future__ import annotations

import importlib
import pkgutil

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_mod}")
