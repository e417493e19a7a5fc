"""Facts about the installed torch, read from its package files: torch is never imported here.

``import torch`` costs about two seconds and may initialise libraries; a preflight tool must not
pay that or disturb the process. Everything below comes from package metadata, ``torch/version.py``
(parsed, not executed) and the library folder.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

from .context import GatherContext


def _version_module(path: Path) -> dict[str, Any]:
    """Literal assignments of torch/version.py (``cuda = '12.4'``, ``hip = None`` ...)."""
    out: dict[str, Any] = {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target.id, node.value
        if target is None or value is None:
            continue
        try:
            out[target] = ast.literal_eval(value)
        except ValueError:
            continue
    return out


def _distributions(prefix: str) -> list[str]:
    names = []
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get_all("Name") or [""])[0]
        if name.lower().startswith(prefix):
            names.append(f"{name}=={dist.version}")
    return sorted(set(names))


def gather(ctx: GatherContext) -> dict[str, Any]:
    if not ctx.torch:
        ctx.unknown("torch", "skipped (--no-torch)")
        return {"installed": None, "skipped": True}
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return {"installed": False, "version": None}
    location = Path(next(iter(spec.submodule_search_locations)))
    out: dict[str, Any] = {"installed": True, "location": str(location), "imported_for_facts": False}
    try:
        out["version"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        out["version"] = None
    vfile = location / "version.py"
    if vfile.exists():
        v = _version_module(vfile)
        out["version"] = out["version"] or v.get("__version__")
        out["cuda"] = v.get("cuda")
        out["hip"] = v.get("hip")
        out["git_version"] = v.get("git_version")
        out["debug"] = v.get("debug")
    else:
        ctx.unknown("torch.cuda", f"{vfile} not found")
    lib = location / "lib"
    libs = sorted(p.name for p in lib.glob("*.so*")) if lib.is_dir() else []
    out["libraries"] = libs
    cuda_build = any(name.startswith("libtorch_cuda") for name in libs)
    nvidia = _distributions("nvidia-")
    out["nvidia_packages"] = nvidia
    out["cuda_build"] = cuda_build or bool(out.get("cuda"))
    out["backends"] = {
        # Linux and macOS wheels link gloo into libtorch_cpu; NCCL ships with CUDA wheels only.
        "gloo": (location / "distributed").is_dir() and any(n.startswith("libtorch_cpu") for n in libs),
        "nccl": out["cuda_build"] and (any("nccl" in n.lower() for n in libs + nvidia) or cuda_build),
        "mpi": any(n.startswith("libmpi") for n in libs),
    }
    out["backends_source"] = f"library folder {lib}"
    out["default_sharing_strategy"] = "file_descriptor" if ctx.path("/proc").exists() else "file_system"
    return out
