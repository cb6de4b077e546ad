"""The values lora/ reads: LoRA's flags (config/lora_flags.py), by their dests. Filled once where a run wraps its
model (``Lora.of(args)``: training/setup.py, generate/model.py, convert/lora_merge.py and lora_peft.py) and at the
checkpoint's save and load (training/checkpoint/checkpointing.py), compared by value. The seed, ``--load`` and the
base's model flags are other concerns: callers pass them as plain parameters.
``lora_target_modules`` is the parser's list (a section converts nothing), so a ``Lora`` compares by value but is
not hashable; nothing keys a cache on it.
May assume: the flags were parsed and checked (config/lora_flags.py); or, for merging and generating, set from
the adapters' record (checkpoint.adopt).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Lora(Section):
    lora_r: int | None              # the adapters' rank; None: no LoRA (the switch)
    lora_alpha: float               # scale alpha / r, as HF peft
    lora_dropout: float             # dropout on the adapter input only
    lora_target_modules: list[str]  # megatron-core names: linear_qkv, linear_proj, linear_fc1, linear_fc2
    lora_load: str | None           # adapters to continue from (--load names the base)
    lora_fp32_adapters: bool        # adapters in fp32 over a --bf16/--fp16 base
