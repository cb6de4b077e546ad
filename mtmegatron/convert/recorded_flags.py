"""The model flags of a training checkpoint, rebuilt from the fingerprint it records (models/fingerprint.py), so
``mcore-to-hf`` needs no flags after ``--``.

The fingerprint holds every value that changes parameter shapes or the forward math; each becomes its Megatron-LM
flag. The family (``--model``) is not recorded: the registry reads it from the fields
(``families.from_fingerprint``; a Mistral checkpoint comes back as the same network written as HF Llama). LLaVA
checkpoints are not covered (their vision fields are not in the fingerprint).
May assume: ``saved`` is a fingerprint dict as written by training/checkpoint/checkpointing.py or the converter.
"""

from __future__ import annotations

from mtmegatron.models import families
from mtmegatron.models.families import ConversionError
from mtmegatron.models.families.deepseek_v3.flags import _ZERO_IS_NONE

_DERIVED = {"padded_vocab_size"}  # given as --padded-vocab-size at the end (the rows the checkpoint holds)
_FLAG_OF = {"layernorm_zero_centered_gamma": "--apply-layernorm-1p"}  # fields whose flag is not their dest's name


def family_of_fingerprint(saved: dict) -> str:
    return families.from_fingerprint(saved).name


def flags_from_fingerprint(saved: dict) -> list[str]:
    """``--model FAMILY`` and one flag per recorded field (booleans as their switches, off ones explicit where
    a preset could turn them on)."""
    if not saved or "num_layers" not in saved:
        raise ConversionError("the checkpoint records no model fingerprint: pass the model flags after '--'")
    flags = ["--model", family_of_fingerprint(saved)]
    for field, value in saved.items():
        if field in _DERIVED:
            continue
        if value is None:  # a size that is off: explicit 0, so no preset value switches it on
            if field in _ZERO_IS_NONE:
                flags += ["--" + field.replace("_", "-"), "0"]
            continue
        name = _FLAG_OF.get(field, "--" + field.replace("_", "-"))
        if field == "untie_embeddings_and_output_weights":
            flags.append(name if value else "--no-untie-embeddings-and-output-weights")
        elif isinstance(value, bool):
            if value:
                flags.append(name)
        elif field == "moe_layer_freq" and isinstance(value, list):
            flags += [name, "[" + ",".join(str(v) for v in value) + "]"]
        elif field == "window_size" and isinstance(value, list):  # --window-size L,R
            flags += [name, ",".join(str(v) for v in value)]
        elif field == "window_attn_skip_freq" and isinstance(value, list):
            flags += [name, "[" + ",".join(str(v) for v in value) + "]"]
        else:
            flags += [name, str(value)]
    if saved.get("num_query_groups") is not None:
        flags.append("--group-query-attention")
    if "vocab_size" not in saved and saved.get("padded_vocab_size"):  # Megatron-LM records only the padded rows
        flags += ["--vocab-size", str(saved["padded_vocab_size"])]
    elif saved.get("padded_vocab_size"):  # the rows as written, whatever divisor or --padded-vocab-size made them
        flags += ["--padded-vocab-size", str(saved["padded_vocab_size"])]
    return flags
