"""Measures the layering of the ``mtmegatron`` package from outside: import circles between modules, package-level
arrows, and the figures the house rules bound (device-type string branches, family-name strings, product lines).

Prints a report; ``--json`` prints the figures as JSON. Assumes ``grimp`` (installed with import-linter).
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re

import grimp

ROOT = pathlib.Path(__file__).resolve().parents[1] / "mtmegatron"
DEVICE_BRANCH = re.compile(r"""(==|!=|\bin\b)\s*[\(\[\{]?\s*["'](cuda|musa|cpu)["']|["'](cuda|musa|cpu)["']\s*(==|!=)|device_type\s*(==|!=)""")
FAMILIES = ("llava", "deepseek-v3", "deepseek_v3", "mixtral", "llama3", "qwen2.5", "qwen3-moe", "qwen3", "mistral")
FAMILY_HOME = "mtmegatron/models/families/"  # one module per family and the registry (__init__.py)


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def circles(graph) -> list[list[str]]:
    """Strongly connected components (size > 1) of the module graph, every import counted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    import sys
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return out


def device_branches() -> list[str]:
    hits = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        if rel.startswith(("mtmegatron/backends/", "mtmegatron/bridge/")):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if DEVICE_BRANCH.search(code):
                hits.append(f"{rel}:{n}: {line.strip()}")
    return hits


def family_files() -> dict[str, list[str]]:
    found = collections.defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        text = path.read_text()
        for fam in FAMILIES:
            if re.search(r"""["']""" + re.escape(fam) + r"""["']""", text):
                found[fam].append(rel)
    return dict(found)


def product_lines() -> int:
    """Non-blank lines of every .py file in the package (backends and patches included)."""
    return sum(1 for p in ROOT.rglob("*.py") for line in p.read_text().splitlines() if line.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--edges", action="store_true", help="print the package-level arrows")
    a = ap.parse_args()
    graph = grimp.build_graph("mtmegatron", include_external_packages=False)
    edges = collections.Counter()
    for m in graph.modules:
        for d in graph.find_modules_directly_imported_by(m):
            if package_of(m) != package_of(d):
                edges[(package_of(m), package_of(d))] += 1
    report = {
        "modules": len(graph.modules),
        "module_circles": circles(graph),
        "device_branches": device_branches(),
        "family_files": family_files(),
        "family_outside": {fam: [f for f in files if not f.startswith(FAMILY_HOME)]
                           for fam, files in family_files().items()},
        "product_lines": product_lines(),
    }
    if a.json:
        print(json.dumps(report, indent=1))
        return
    print(f"modules {report['modules']}, product lines (non-blank) {report['product_lines']}")
    print(f"module circles: {len(report['module_circles'])}")
    for c in report["module_circles"]:
        print("  ", " <-> ".join(c))
    print(f"device-type branches outside backends/bridge: {len(report['device_branches'])}")
    for h in report["device_branches"]:
        print("  ", h)
    for fam, files in report["family_outside"].items():
        print(f"family {fam!r} outside its module and the registry in {len(files)} files: {', '.join(f.removeprefix('mtmegatron/') for f in files)}")
    if a.edges:
        for (x, y), n in sorted(edges.items()):
            print(f"  {x:26} -> {y:26} {n}")


if __name__ == "__main__":
    main()
