"""Which decoder layers are MoE: the ``--moe-layer-freq`` parser and the dense/MoE layer pattern it gives, read by
the layer specs (layer_spec.py, deepseek.py), the families' HF map (families/gpt.py) and the DeepSeek-V3 flags.
Pure Python, imported before megatron-core is.
May assume: the values were parsed (``moe_layer_freq`` an int or a list of 0/1, ``parse_moe_layer_freq``).
"""

from __future__ import annotations


def parse_moe_layer_freq(value):
    """``--moe-layer-freq``: an int N (one MoE layer every N) or a Python list expression such as
    ``([0]*3+[1]*58)`` (Megatron-LM's spelling: 0 dense, 1 MoE)."""
    if isinstance(value, (int, list)):
        return value
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    if not set(text) <= set("[]()0123456789*+, "):
        raise ValueError(f"--moe-layer-freq {value!r}: expected an int or a list expression like ([0]*3+[1]*58)")
    pattern = eval(text, {"__builtins__": {}}, {})  # only digits, brackets, + and * reach here
    if not isinstance(pattern, list) or any(v not in (0, 1) for v in pattern):
        raise ValueError(f"--moe-layer-freq {value!r} must give a list of 0 (dense) and 1 (MoE)")
    return pattern


def moe_layer_pattern(num_layers: int, num_experts: int | None, moe_layer_freq) -> list[int]:
    """1 for an MoE layer, 0 for a dense one, over the decoder's ``num_layers`` layers (all dense without experts;
    the flags ``--num-layers``, ``--num-experts``, ``--moe-layer-freq``)."""
    if not num_experts:
        return [0] * num_layers
    if isinstance(moe_layer_freq, int):
        return [1 if i % moe_layer_freq == 0 else 0 for i in range(num_layers)]
    return list(moe_layer_freq)
