"""Model fields of today's HF families (Llama-3.1/3.2 RoPE scaling, Qwen2/2.5 qkv bias, Qwen3 head_dim), as
Megatron-LM flags, and what megatron-core builds from them.

Flags (Megatron-LM 0.16.1's spellings, dests and defaults): ``--use-rope-scaling`` / ``--rope-scaling-factor``
(Llama-3.x's frequency scaling, megatron-core's ``RotaryEmbedding(rope_scaling=...)``), with mtmegatron's
``--rope-scaling-low-freq-factor`` / ``--rope-scaling-high-freq-factor`` /
``--rope-scaling-original-max-position-embeddings`` (HF's rope_scaling fields; default megatron-core's fixed 1, 4
and 8192, the Llama-3.1 values; others reach megatron-core through patches/llama3_rope_scaling_values.py),
``--add-qkv-bias``
(biases on q/k/v only, Qwen2), ``--kv-channels`` (the head dim when it is not hidden/heads, Qwen3).
``--qk-layernorm`` is registered in config/arguments.py (DeepSeek-V3 uses it too); it works for plain
attention unchanged.
A ``--model`` preset may set these fields (``models/families/``; config/flag_sources.py applies it).
``transformer_config_fields`` / ``gpt_model_fields`` are the extra TransformerConfig / GPTModel
keyword arguments; models/initialization.skip_initialization says whether weights are about to be loaded
(``--load``, ``--finetune``, ``HF_DIR``), so random initialisation is wasted work.
May assume: the model fields are filled (preset applied) before ``check_family_args``.
"""

from __future__ import annotations

import argparse

from mtmegatron.models.families.gemma3.flags import add_gemma3_args, check_gemma3_args
from mtmegatron.models.families.qwen2_vl.flags import add_packed_vision_args, check_packed_vision_args
from mtmegatron.models.initialization import skip_initialization


def add_family_args(p: argparse.ArgumentParser) -> None:
    add_packed_vision_args(p)
    add_gemma3_args(p)
    g = p.add_argument_group("Llama-3.x RoPE scaling, Qwen qkv bias and head dim")
    g.add_argument("--use-rope-scaling", action="store_true", default=False,
                   help="apply Llama-3.x RoPE frequency scaling (low/high frequency factors 1/4, original "
                        "context 8192 unless given below)")
    g.add_argument("--rope-scaling-factor", type=float, default=8.0,
                   help="Llama-3.x RoPE scaling factor with --use-rope-scaling (8 for Llama-3.1, 32 for 3.2)")
    g.add_argument("--rope-scaling-low-freq-factor", type=float, default=1.0,
                   help="Llama-3.x RoPE scaling: HF's rope_scaling.low_freq_factor (mtmegatron's flag; default "
                        "megatron-core's fixed 1)")
    g.add_argument("--rope-scaling-high-freq-factor", type=float, default=4.0,
                   help="Llama-3.x RoPE scaling: HF's rope_scaling.high_freq_factor (mtmegatron's flag; default "
                        "megatron-core's fixed 4)")
    g.add_argument("--rope-scaling-original-max-position-embeddings", type=int, default=8192,
                   help="Llama-3.x RoPE scaling: HF's rope_scaling.original_max_position_embeddings (mtmegatron's "
                        "flag; default megatron-core's fixed 8192)")
    g.add_argument("--add-qkv-bias", action="store_true", default=False,
                   help="biases on the query/key/value projections only (Qwen2/2.5), even with --disable-bias-linear")
    g.add_argument("--kv-channels", type=int, default=None,
                   help="projection size of each attention head (default hidden-size / num-attention-heads)")


def check_family_args(args: argparse.Namespace, error: type[Exception]) -> None:
    if args.kv_channels is not None and args.kv_channels < 1:
        raise error(f"--kv-channels must be positive, not {args.kv_channels}")
    if args.kv_channels is None and args.hidden_size and args.num_attention_heads:
        args.kv_channels = args.hidden_size // args.num_attention_heads  # as Megatron-LM's validate_args
    if args.use_rope_scaling:
        if args.position_embedding_type != "rope":
            raise error("--use-rope-scaling needs --position-embedding-type rope")
        if args.multi_latent_attention:
            raise error("--use-rope-scaling is Llama-3.x scaling; MLA scales RoPE with --rope-type yarn")
        if args.rope_scaling_factor <= 0:
            raise error(f"--rope-scaling-factor must be positive, not {args.rope_scaling_factor}")
        low, high = args.rope_scaling_low_freq_factor, args.rope_scaling_high_freq_factor
        if not 0 < low < high or args.rope_scaling_original_max_position_embeddings < 1:
            raise error(f"--rope-scaling-low-freq-factor {low:g} / --rope-scaling-high-freq-factor {high:g} / "
                        f"--rope-scaling-original-max-position-embeddings "
                        f"{args.rope_scaling_original_max_position_embeddings}: the factors must be positive and "
                        f"low < high (the smoothing divides by their difference), the context positive")
    check_packed_vision_args(args, error)  # M-RoPE and the native-resolution vision-language models
    check_gemma3_args(args, error)  # --model gemma3's flags (models/families/gemma3/flags.py)


def transformer_config_fields(args: argparse.Namespace) -> dict:
    """TransformerConfig fields: the head dim and the q/k/v bias."""
    return {"kv_channels": args.kv_channels or args.hidden_size // args.num_attention_heads,
            "add_qkv_bias": bool(args.add_qkv_bias),
            "perform_initialization": not skip_initialization(args)}


def gpt_model_fields(args: argparse.Namespace) -> dict:
    """GPTModel keyword arguments: Llama-3.x RoPE scaling."""
    if not args.use_rope_scaling:
        return {}
    return {"rope_scaling": True, "rope_scaling_factor": args.rope_scaling_factor}
