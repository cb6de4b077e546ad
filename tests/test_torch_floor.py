"""The torch floor of the MUSA path is torch 2.7 (torch_musa 2.7.1, the oldest release still supported; 2.9 and
2.11 are the current ones): every module that runs on MUSA (all of mtmegatron/, backends/, patches/) uses a torch
API newer than 2.7 only behind feature detection. A static check (AST, no import): each use of an API on the list
below must sit in a module that also asks for it by name with ``hasattr(x, "<name>")`` / ``getattr(x, "<name>",
default)``, which is how such code keeps a fallback. The list is not every newer API, only those this code base
is likely to reach for; each entry says when it arrived (sources: the torch docs of each release).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [ROOT / "mtmegatron", ROOT / "backends", ROOT / "patches"]
FLOOR = "2.7"

# torch.accelerator in torch 2.7's docs: anything else under it is newer (2.8 adds device_index, 2.9 the memory API)
ACCELERATOR_2_7 = {"device_count", "is_available", "current_accelerator", "set_device_index", "set_device_idx",
                   "current_device_index", "current_device_idx", "set_stream", "current_stream", "synchronize"}
# dotted name (matched as a suffix of the written chain) -> the torch release that added it
NEWER = {
    "torch._grouped_mm": "2.8",
    "torch._scaled_grouped_mm": "2.8",
    "torch._scaled_mm_v2": "2.10",
    "torch._scaled_grouped_mm_v2": "2.10",
    "functional.grouped_mm": "2.10", "F.grouped_mm": "2.10",
    "functional.scaled_grouped_mm": "2.10", "F.scaled_grouped_mm": "2.10",
    "functional.scaled_mm": "2.10", "F.scaled_mm": "2.10",
    "functional.ScalingType": "2.10", "F.ScalingType": "2.10",
    "functional.SwizzleType": "2.10", "F.SwizzleType": "2.10",
    "fp32_precision": "2.9",  # torch.backends.{cuda.matmul,cudnn,...}.fp32_precision, the TF32 API of 2.9
}


def _chain(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _newer(chain: str) -> str | None:
    """The release that added ``chain`` when it is newer than the floor, else None."""
    parts = chain.split(".")
    if parts[:2] == ["torch", "accelerator"] and len(parts) > 2 and parts[2] not in ACCELERATOR_2_7:
        return "2.8+ (not in torch 2.7's torch.accelerator)"
    for name, version in NEWER.items():
        if chain == name or chain.endswith("." + name) or ("." not in name and parts[-1] == name):
            return version
    return None


def uses_without_guard(source: str) -> list[tuple[int, str, str]]:
    """(line, dotted name, release) of newer-API uses in ``source`` whose name the module never feature-detects."""
    tree = ast.parse(source)
    guarded, uses = set(), []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            guarded.add(node.args[1].value)
        elif isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain is not None and (version := _newer(chain)):
                uses.append((node.lineno, chain, version))
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                chain = f"{node.module}.{alias.name}"
                if version := _newer(chain):
                    uses.append((node.lineno, chain, version))
    # an attribute chain is visited once per prefix: keep the longest, then drop the guarded ones
    longest = {(line, chain, v) for line, chain, v in uses
               if not any(o != chain and o.startswith(chain + ".") and ol == line for ol, o, _ in uses)}
    return sorted((line, chain, v) for line, chain, v in longest if chain.split(".")[-1] not in guarded)


def test_the_musa_path_uses_no_torch_api_newer_than_the_floor_unguarded():
    offenders = []
    for folder in SCANNED:
        for path in sorted(folder.rglob("*.py")):
            for line, chain, version in uses_without_guard(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {chain} (torch {version} > floor {FLOOR})")
    assert not offenders, "guard these with hasattr/getattr and a fallback:\n" + "\n".join(offenders)


def test_the_check_catches_unguarded_uses_and_accepts_guarded_ones():
    unguarded = ("import torch\nimport torch.nn.functional as F\n"
                 "def f(a, b, o):\n    torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
                 "    torch.accelerator.memory_allocated()\n    torch.accelerator.synchronize()\n"
                 "    return F.grouped_mm(a, b, offs=o), torch._grouped_mm(a, b, offs=o)\n"
                 "from torch.nn.functional import scaled_grouped_mm\n")
    found = [(line, chain) for line, chain, _ in uses_without_guard(unguarded)]
    assert found == [(4, "torch.backends.cuda.matmul.fp32_precision"), (5, "torch.accelerator.memory_allocated"),
                     (7, "F.grouped_mm"), (7, "torch._grouped_mm"), (8, "torch.nn.functional.scaled_grouped_mm")]
    guarded = ("import torch\n"
               "def f(a, b, o):\n    if hasattr(torch, '_grouped_mm'):\n        return torch._grouped_mm(a, b, offs=o)\n"
               "    return [x @ y for x, y in zip(a, b)]\n")
    assert uses_without_guard(guarded) == []


def test_the_list_names_real_torch_apis():
    """Every listed name exists in the torch CI runs (2.13), so a typo cannot hide a use."""
    import torch
    import torch.nn.functional as F

    for name in ("_grouped_mm", "_scaled_grouped_mm", "_scaled_mm_v2", "_scaled_grouped_mm_v2"):
        assert hasattr(torch, name), name
    for name in ("grouped_mm", "scaled_grouped_mm", "scaled_mm", "ScalingType", "SwizzleType"):
        assert hasattr(F, name), name
    assert hasattr(torch.backends.cuda.matmul, "fp32_precision")
    assert ACCELERATOR_2_7 <= set(dir(torch.accelerator))
