"""``mtmegatron flags [FLAG ...]``: how mtmegatron treats each Megatron-LM 0.16.1 flag.

Without arguments it prints the counts per kind, the honoured flags of which some values are refused, and every
refused flag with its reason; with option strings
(e.g. a launch script's flags pasted after it) only those, so a user sees before launching what will run,
what is copied into megatron-core's configs, what is a no-op and what will be refused.
May assume: nothing beyond the pretrain parser (no backend, no process group).
"""

from __future__ import annotations

import argparse

from mtmegatron.config import megatron_flags

KINDS = {"honoured": "honoured (read by mtmegatron)", "config": "copied into a megatron-core config by name",
         "noop": "accepted, no effect (as in Megatron-LM 0.16)", "refused": "refused unless at its default"}


USAGE = """usage: mtmegatron flags [--flag FLAG ...] [FLAG ...]

How mtmegatron.pretrain treats each Megatron-LM 0.16.1 flag: honoured, copied into a megatron-core config by
name, accepted without effect (as in Megatron-LM), or refused unless at its default (with the reason).
  (no arguments)       the counts per kind, the honoured flags of which some values are refused, every refusal
  --flag FLAG          look up FLAG (--flag --lr, --flag lr or --flag=--lr); may be repeated
  FLAG ...             look up these option strings (e.g. a launch script's flags pasted here; values ignored)
  -h, --help           this text"""


def add_flag_report_args(sub) -> None:
    p = sub.add_parser("flags", help="how each Megatron-LM flag is treated (honoured, config field, no-op, refused)",
                       add_help=False)
    p.add_argument("names", nargs="*", help="option strings to look up (other words are ignored)")
    p.set_defaults(fn=run)


def lookup_names(words: list[str]) -> list[str] | None:
    """The option strings asked for: ``--flag X`` / ``--flag=X`` (X with or without its dashes) and bare option
    strings (values after them ignored); None for ``-h``/``--help``."""
    names, i = [], 0
    while i < len(words):
        word = words[i]
        if word in ("-h", "--help"):
            return None
        if word == "--flag" or word.startswith("--flag="):
            value = word.split("=", 1)[1] if "=" in word else (words[i + 1] if i + 1 < len(words) else "")
            i += 1 if "=" in word else 2
            if value:
                names.append(value.split("=", 1)[0] if value.startswith("--") else "--" + value.split("=", 1)[0])
            continue
        if word.startswith("--"):
            names.append(word.split("=", 1)[0])
        i += 1
    return names


def describe(row, hand) -> str:
    kind = megatron_flags.classify(row, hand)
    why = {"refused": megatron_flags.refusal_reason(row), "noop": megatron_flags.NOOP.get(row.dest, "")}.get(kind)
    if kind == "honoured" and row.dest in megatron_flags.PARTLY_REFUSED:
        why = "some values refused: " + megatron_flags.PARTLY_REFUSED[row.dest]
    return f"{row.flag}: {KINDS[kind]}" + (f" — {why}" if why else "")


def run(args: argparse.Namespace) -> int:
    from mtmegatron.config.arguments import build_parser

    hand = build_parser().hand_registered
    rows = {row.flag: row for row in megatron_flags.table() if row.action != "HelpAction"}
    names = lookup_names(list(args.names))
    if names is None:
        print(USAGE)
        return 0
    if names:
        for name in names:
            print(describe(rows[name], hand) if name in rows else f"{name}: not a Megatron-LM 0.16.1 flag")
        return 0
    kinds = {row.flag: megatron_flags.classify(row, hand) for row in rows.values()}
    for kind, text in KINDS.items():
        print(f"{sum(k == kind for k in kinds.values()):4d} {text}")
    print("honoured, some values refused:")
    for flag, kind in kinds.items():
        if kind == "honoured" and rows[flag].dest in megatron_flags.PARTLY_REFUSED:
            print("  " + describe(rows[flag], hand))
    print("refused:")
    for flag, kind in kinds.items():
        if kind == "refused":
            print("  " + describe(rows[flag], hand))
    return 0
