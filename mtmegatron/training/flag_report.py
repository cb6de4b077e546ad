"""``mtmegatron flags [FLAG ...]``: how mtmegatron treats each Megatron-LM 0.16.1 flag.

Without arguments it prints the counts per kind, the honoured flags of which some values are refused, and every
refused flag with its reason; with option strings
(e.g. a launch script's flags pasted after it) only those, so a user sees before launching what will run,
what is copied into megatron-core's configs, what is a no-op and what will be refused.
May assume: nothing beyond the pretrain parser (no backend, no process group).
"""

from __future__ import annotations

import argparse

from mtmegatron.training import megatron_flags

KINDS = {"honoured": "honoured (read by mtmegatron)", "config": "copied into a megatron-core config by name",
         "noop": "accepted, no effect (as in Megatron-LM 0.16)", "refused": "refused unless at its default"}


def add_parser(sub) -> None:
    p = sub.add_parser("flags", help="how each Megatron-LM flag is treated (honoured, config field, no-op, refused)")
    p.add_argument("names", nargs="*", help="option strings to look up (other words are ignored)")
    p.set_defaults(fn=run)


def describe(row, hand) -> str:
    kind = megatron_flags.classify(row, hand)
    why = {"refused": megatron_flags.refusal_reason(row), "noop": megatron_flags.NOOP.get(row.dest, "")}.get(kind)
    if kind == "honoured" and row.dest in megatron_flags.PARTLY_REFUSED:
        why = "some values refused: " + megatron_flags.PARTLY_REFUSED[row.dest]
    return f"{row.flag}: {KINDS[kind]}" + (f" — {why}" if why else "")


def run(args: argparse.Namespace) -> int:
    from mtmegatron.training.arguments import build_parser

    hand = build_parser().hand_registered
    rows = {row.flag: row for row in megatron_flags.table() if row.action != "HelpAction"}
    names = [n.split("=", 1)[0] for n in args.names if n.startswith("--")]
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
