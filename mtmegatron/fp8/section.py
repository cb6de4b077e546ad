"""The FP8 flags as a typed section (utils/section.py): ``Fp8`` holds what the recipe, the executor choice, the
FP8 linears, TransformerConfig's FP8 fields and the first/last-layers rule read (fp8/recipes.py, fp8/spec.py).
The executor *in use* is not a flag: it is chosen once the backend is active (``fp8/spec.choose_executor``) and
travels beside this section as a plain value.
May assume: the flags were parsed and checked (config/arguments.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Fp8(Section):
    fp8: str | None                     # --fp8-format (e4m3, hybrid), None: no FP8
    fp8_recipe: str | None              # delayed, tensorwise, blockwise, mxfp8
    fp8_margin: int                     # delayed scaling's values
    fp8_amax_history_len: int
    fp8_amax_compute_algo: str
    fp8_executor: str                   # asked for: auto, transformer_engine, scaled_mm, emulated
    tp_only_amax_red: bool
    first_last_layers_bf16: bool        # the first/last transformer layers' linears in high precision
    num_layers_at_start_in_bf16: int
    num_layers_at_end_in_bf16: int
