"""The docs say what the code does: generated tables are current, and README's "how to add a code"
is walked through against the real registry, Signature and Makefile."""

from __future__ import annotations

import dataclasses
import re

from torchdoctor.families import FAMILIES
from torchdoctor.registry import Code, all_codes
from torchdoctor.report.families import render_markdown
from torchdoctor.signature import Role, Signature

from .conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(title)
    end = README.find("\n## ", start + len(title))
    return README[start : end if end > 0 else None]


def test_docs_families_md_is_current() -> None:
    on_disk = (REPO / "docs" / "families.md").read_text(encoding="utf-8")
    assert on_disk == render_markdown(), "docs/families.md is stale: run `make docs`"


def test_every_family_has_codes_and_every_code_a_known_family() -> None:
    families = {c.family for c in all_codes()}
    assert families == set(FAMILIES)


def test_readme_names_every_family_once_in_its_codes_section() -> None:
    section = _section("## Codes, families and how to add a code")
    named = re.findall(r"`([a-z-]+)`", section)
    assert set(FAMILIES) <= set(named)
    assert f"{len(FAMILIES)} failure families" in section


def test_readme_walkthrough_uses_real_fields_and_places() -> None:
    section = _section("## Codes, families and how to add a code")
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the section shows a preflight code and a code with log signatures"
    code_fields = {f.name for f in dataclasses.fields(Code)}
    sig_fields = {f.name for f in dataclasses.fields(Signature)}
    # every keyword argument the README passes to Code(...) and Signature(...) exists
    for block in blocks:
        for name in re.findall(r"\b(\w+)=", block):
            assert name in code_fields | sig_fields, f"README passes {name}= which Code/Signature do not have"
    for role in re.findall(r"Role\.(\w+)", section):
        assert hasattr(Role, role)
    # where things go: the preflight code in a domain module, signatures in log_<domain>.py
    assert "src/torchdoctor/catalogue/<domain>.py" in section
    assert "src/torchdoctor/catalogue/log_<domain>.py" in section
    catalogue = REPO / "src" / "torchdoctor" / "catalogue"
    for code in all_codes():
        if code.signatures:
            module = code.check.__module__ if code.check else None
            assert module is None or module.startswith("torchdoctor.catalogue.")
    assert list(catalogue.glob("log_*.py"))
    # the fixture rule: a positive and a near miss per code with signatures
    fixtures = REPO / "tests" / "fixtures" / "logs"
    assert "tests/fixtures/logs/TDnnn/" in section
    for code in all_codes():
        if code.signatures:
            files = [p.name for p in (fixtures / code.code).glob("*.log")]
            assert any(not n.startswith("near-") for n in files), f"{code.code}: no positive fixture"
            assert any(n.startswith("near-") for n in files), f"{code.code}: no near-miss fixture"
    # `make docs` regenerates what the section says it does
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    docs_rule = makefile[makefile.index("\ndocs:") :].split("\n\n", 1)[0]
    assert "make docs" in section
    for generated in ("docs/codes.md", "docs/families.md"):
        assert generated in docs_rule
        assert generated in section or generated in README


def test_each_output_model_says_which_commands_use_it() -> None:
    import torchdoctor.explain.model as explain_model
    import torchdoctor.model as model

    assert "check" in (model.__doc__ or "") and "loader" in (model.__doc__ or "")
    assert "explain" in (explain_model.__doc__ or "")
    assert "one output model behind every command" not in (model.__doc__ or "")


def test_readme_python_snippets_run(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every ```python block of README runs as written, in a directory holding what it names."""
    import shutil

    pytest_torch = __import__("importlib").util.find_spec("torch")
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    # blocks that start a process group run under torchrun in their own tests (test_ranks_readme.py)
    runnable = [b for b in blocks if "import torchdoctor" in b and "init_process_group" not in b]
    assert runnable, "README shows the Python API"
    shutil.copytree(REPO / "tests" / "fixtures" / "explain" / "torchrun-save-enoent" / "logs", tmp_path / "logs")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "def make_loader():\n    return DataLoader(TensorDataset(torch.zeros(64, 4)), batch_size=8)\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    tb_source = REPO / "tests" / "fixtures" / "logs" / "TD150" / "lab-fd-queue-ancdata.log"
    failure = next(
        line for line in tb_source.read_text(encoding="utf-8").splitlines() if line.startswith("RuntimeError: received")
    )

    def train() -> None:
        raise RuntimeError(failure.split(": ", 1)[1])  # the real message the lab recorded

    for block in runnable:
        if "probe_loader" in block and pytest_torch is None:
            block = block.split("loader_report")[0]
        namespace: dict[str, object] = {"train": train}
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
        report = namespace.get("report")
        assert report is not None and report.root_cause is not None  # type: ignore[attr-defined]
        assert report.root_cause.code == "TD650"  # type: ignore[attr-defined]
        if "loader_report" in namespace:
            assert namespace["loader_report"] is not None
