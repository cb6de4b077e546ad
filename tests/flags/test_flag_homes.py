"""Where flags live and how config/ names them: every flag is registered in mtmegatron/config/ (or a family's own
flags in models/families/; cli.py keeps its top-level subcommands), config's registration and check functions
follow one convention (add_X_args / check_X_args), each concern's check is its own entry of arguments.CHECKS, and
the ``--model`` / ``--model-size`` help is the family registry's (every family with presets, every size)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mtmegatron.config import arguments
from mtmegatron.models.families import FAMILIES

PACKAGE = Path(arguments.__file__).resolve().parents[1]
FLAG_HOMES = ("config/", "models/families/")
ALLOWED = {
    "cli.py": "the console command's own subcommands (env, doctor, patches) and the subparsers it hands config/",
    "generate/__main__.py": "python -m mtmegatron.generate: the entry point's parser, filled by config/generate_flags",
    "backends/musa_device.py": "check_precision_args: the MUSA device's answer to 'does it run bf16', asked by the "
                               "Backend (a capability question, not a flag check)",
}
REGISTERS = re.compile(r"\.add_argument\(|ArgumentParser\(|^def (add|check)_\w+_args\(", re.MULTILINE)


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def test_flags_are_registered_and_checked_only_in_config_and_the_families():
    outside = sorted(_relative(path) for path in PACKAGE.rglob("*.py")
                     if not _relative(path).startswith(FLAG_HOMES) and _relative(path) not in ALLOWED
                     and REGISTERS.search(path.read_text()))
    assert outside == [], f"flag registration or checks outside config/: {outside}"


def test_config_modules_name_their_flag_functions_one_way():
    odd = []
    for path in sorted((PACKAGE / "config").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and re.fullmatch(r"add_\w+|check\w*|validate\w*", node.name) \
                    and not re.fullmatch(r"(add|check)_\w+_args|check_\w+", node.name):
                odd.append(f"{path.name}:{node.name}")
            if isinstance(node, ast.FunctionDef) and node.name in ("add_flags", "add_arguments", "validate", "check"):
                odd.append(f"{path.name}:{node.name}")
    assert odd == [], odd


def test_each_concern_is_its_own_check():
    names = [name for name, _ in arguments.CHECKS]
    for concern in ("checkpoints", "resilience", "checkpoint conversion", "upcycling",
                    "vision data balancing and packing"):
        assert names.count(concern) == 1, (concern, names)
    assert names.index("checkpoints") < names.index("resilience") < names.index("checkpoint conversion") \
        < names.index("upcycling")  # the order check_checkpoint_args ran them in


def test_model_help_is_the_family_registry():
    parser = arguments.build_parser()
    helps = {action.dest: " ".join(action.help.split()) for action in parser._actions if action.help}
    with_presets = {name: family.presets for name, family in FAMILIES.items() if family.presets}
    assert {"qwen2-vl", "qwen2.5-vl", "llama3", "deepseek-v3"} <= set(with_presets)
    for name, sizes in with_presets.items():
        assert f"{name}," in helps["model"] or f"{name})" in helps["model"], name
        assert f"{name} {'/'.join(sizes)}" in helps["model_size"], name
