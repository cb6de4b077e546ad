"""Writes mtmegatron/config/megatron_lm_flags.tsv: the shared flag table of Megatron-LM core_v0.16.1
(`shared/megatron-lm-0.16.1-flags.tsv`: option string, dest, action, default, choices, type) with two more
columns read from Megatron-LM's own parser, `nargs` and `const`, which the shared table lacks and which
decide how many values an option takes.

Usage: python scripts/make_megatron_flag_table.py SHARED_TSV MEGATRON_LM_CHECKOUT
(the checkout: `git archive core_v0.16.1 megatron/training | tar -x -C DIR` of NVIDIA/Megatron-LM). It imports
that checkout's ``megatron/training/arguments.py`` with its training-side helpers stubbed, builds its parser and
reads each action; nothing of Megatron-LM is copied into this repository except these facts.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import sys
import types
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "mtmegatron" / "config" / "megatron_lm_flags.tsv"


def megatron_lm_parser(checkout: str) -> argparse.ArgumentParser:
    package = types.ModuleType("megatron.training")
    package.__path__ = [f"{checkout}/megatron/training"]
    sys.modules["megatron.training"] = package
    utils = types.ModuleType("megatron.training.utils")  # rank printing / device probes, unused by the parser
    for name in ("get_device_arch_version", "update_use_dist_ckpt", "print_rank_0", "warn_rank_0"):
        setattr(utils, name, lambda *a, **k: None)
    sys.modules["megatron.training.utils"] = utils
    spec = importlib.util.spec_from_file_location("megatron.training.arguments",
                                                  f"{checkout}/megatron/training/arguments.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    parser = argparse.ArgumentParser(allow_abbrev=False)
    module.add_megatron_arguments(parser)
    return parser


def main(shared_tsv: str, checkout: str) -> None:
    actions = {s: a for a in megatron_lm_parser(checkout)._actions for s in a.option_strings}
    with open(shared_tsv, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    with open(OUT, "w", newline="") as f:
        out = csv.writer(f, delimiter="\t", lineterminator="\n")
        out.writerow(list(rows[0]) + ["nargs", "const"])
        for row in rows:
            action = actions[row["flag"]]
            out.writerow(list(row.values()) + ["" if action.nargs is None else str(action.nargs),
                                               "" if action.const is None else repr(action.const)])
    print(f"wrote {OUT} ({len(rows)} option strings)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
