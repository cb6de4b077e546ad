"""Where each value of a pretrain run comes from: the user's flag, else the preset the user named, else
Megatron-LM's default — and the demo.

- ``--model NAME`` (with ``--model-size``, default ``tiny``) names a preset: it fills the model fields and the
  training recipe it carries (models/families/), wherever the user gave no flag.
- A command line that names no preset and no model-shape flag at all (``torchrun ... -m mtmegatron.pretrain``,
  perhaps with run flags such as ``--mock-data``) is the demo: ``--model llama3 --model-size tiny``, announced.
- Anything else is a Megatron-LM command line: every value it did not give is Megatron-LM's default. A
  Megatron-LM script always names the model's shape (``--num-layers``/``--hidden-size``/
  ``--num-attention-heads``), so it can never receive a preset value it did not ask for.
May assume: the parser is arguments.build_parser()'s (every Megatron-LM flag registered, allow_abbrev off).
"""

from __future__ import annotations

import argparse

from mtmegatron.models.families import DEMO, preset
from mtmegatron.models.families.gpt import RECIPE


# A flag for any of these makes a command line a model description: no demo preset is applied to it.
MODEL_SHAPE_DESTS = frozenset({
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
    "seq_length", "max_position_embeddings", "vocab_size", "num_experts", "normalization", "swiglu",
    "position_embedding_type", "multi_latent_attention", "group_query_attention",
})

def given_dests(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, str]:
    """dest -> the option string the user wrote, for every flag on the command line."""
    given = {}
    for token in argv:
        if not token.startswith("--"):
            continue
        action = parser._option_string_actions.get(token.split("=", 1)[0])
        if action is not None:
            given[action.dest] = token.split("=", 1)[0]
    return given


def choose_preset(args: argparse.Namespace, given: dict[str, str]) -> tuple[str, str] | None:
    """(model, size) of the preset this run uses, or None for a plain Megatron-LM command line."""
    if "model" in given or "model_size" in given:
        return args.model or DEMO[0], args.model_size or DEMO[1]
    if MODEL_SHAPE_DESTS.isdisjoint(given):
        return DEMO
    return None


def apply_preset(args: argparse.Namespace, given: dict[str, str], name: tuple[str, str] | None) -> dict[str, str]:
    """Fill every value the user did not give from the named preset (model fields and its training recipe);
    returns dest -> where the value came from ('flag' or 'preset NAME/SIZE')."""
    sources = {dest: f"flag {flag}" for dest, flag in given.items()}
    if name is None:
        args.model, args.model_size = "gpt", None
        return sources
    args.model, args.model_size = name
    label = f"preset {name[0]}/{name[1]}"
    values = {**RECIPE, **preset(*name)}
    for dest, value in values.items():
        if dest not in given:
            setattr(args, dest, value)
            sources[dest] = label
    return sources


def differences(parser: argparse.ArgumentParser, args: argparse.Namespace, sources: dict[str, str],
                megatron_defaults: dict) -> list[str]:
    """``--flag value (source)`` for every Megatron-LM value this run sets differently from Megatron-LM."""
    lines, seen = [], set()
    for action in parser._actions:
        dest = action.dest
        if dest in seen or dest not in megatron_defaults or not action.option_strings:
            continue
        seen.add(dest)
        value = getattr(args, dest, None)
        if value == megatron_defaults[dest] or dest not in sources:
            continue
        flag = sources[dest].split(" ", 1)[1] if sources[dest].startswith("flag") else action.option_strings[0]
        shown = flag if action.nargs == 0 else f"{flag} {_show(value)}"  # a switch: naming it says it is set
        lines.append(f"{shown} ({'flag' if sources[dest].startswith('flag') else sources[dest]})")
    return lines


def _show(value) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)
