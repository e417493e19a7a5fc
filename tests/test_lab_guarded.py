"""The guards' closed loop: each lab scenario whose cause a guard prevents has its --fixed variant
written with the guard (torchdoctor.save, RankFile); the unguarded run fails with its code, the
guarded one passes.

- ckpt-save-missing-dir: torchdoctor.save creates the directory.
- ckpt-load-truncated: a save that runs out of space leaves the previous checkpoint loadable.
- writes-shared-jsonl: four processes print() through one RankFile: no glued records.
- writes-ranks-same-checkpoint: torchdoctor.save(rank0_only=True): one atomic writer.
"""

from __future__ import annotations

import inspect

import pytest

from torchdoctor.explain import shows
from torchdoctor.lab import get
from torchdoctor.lab.runner import missing_needs, run
from torchdoctor.lab.scenarios import storage, writes

#: scenario -> (the guard its fix names, the function of the fixed variant, the guarded call in it)
GUARDED = {
    "ckpt-save-missing-dir": ("torchdoctor.save", storage.ckpt_save_missing_dir, "torchdoctor.save(_state(), path)"),
    "ckpt-load-truncated": ("torchdoctor.save", storage.ckpt_load_truncated, "(save if fixed else torch.save)"),
    "writes-shared-jsonl": ("torchdoctor.RankFile", writes._writer, "with RankFile(path) as rf"),
    "writes-ranks-same-checkpoint": (
        "torchdoctor.save",
        writes._save_same_path,
        "torchdoctor.save(state, path, rank0_only=True)",
    ),
}


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_unguarded_fails_and_guarded_passes(name: str) -> None:
    s = get(name)
    reason = missing_needs(s)
    if reason:
        pytest.skip(reason)
    guard, fn, call = GUARDED[name]
    assert guard in s.fix, s.fix
    assert call in inspect.getsource(fn)
    bad = run(s, fixed=False)
    assert bad.failed and shows(bad.text(), s.code), bad.tail()
    good = run(s, fixed=True)
    assert good.exit_code == 0, good.tail()
