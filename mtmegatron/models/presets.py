"""Model presets selectable with ``--model NAME [--model-size SIZE]``; explicit flags override any field.

Values use Megatron-LM flag names (dest form). "tiny" shapes finish on a 2-core box in minutes; the real
shapes are the published ones. May assume: nothing (pure data).
"""

from __future__ import annotations

_LLAMA_COMMON = dict(
    normalization="RMSNorm",
    norm_epsilon=1e-5,
    swiglu=True,
    position_embedding_type="rope",
    disable_bias_linear=True,
    untie_embeddings_and_output_weights=True,
    group_query_attention=True,
)

PRESETS: dict[str, dict[str, dict]] = {
    "llama3": {
        "tiny": dict(
            _LLAMA_COMMON, num_layers=4, hidden_size=128, ffn_hidden_size=352, num_attention_heads=8,
            num_query_groups=4, seq_length=128, max_position_embeddings=128, vocab_size=1024,
            rotary_base=500000,
        ),
        "8b": dict(
            _LLAMA_COMMON, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
            num_query_groups=8, seq_length=8192, max_position_embeddings=8192, vocab_size=128256,
            rotary_base=500000,
        ),
        "70b": dict(
            _LLAMA_COMMON, num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
            num_query_groups=8, seq_length=8192, max_position_embeddings=8192, vocab_size=128256,
            rotary_base=500000,
        ),
    },
    "mixtral": {
        "tiny": dict(
            _LLAMA_COMMON, num_layers=4, hidden_size=128, ffn_hidden_size=352, num_attention_heads=8,
            num_query_groups=4, seq_length=128, max_position_embeddings=128, vocab_size=1024,
            rotary_base=1000000, num_experts=4, moe_router_topk=2, moe_token_dispatcher_type="alltoall",
            moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2,
        ),
        "8x7b": dict(
            _LLAMA_COMMON, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
            num_query_groups=8, seq_length=4096, max_position_embeddings=32768, vocab_size=32000,
            rotary_base=1000000, num_experts=8, moe_router_topk=2, moe_token_dispatcher_type="alltoall",
            moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2,
        ),
    },
}


def preset(model: str, size: str) -> dict:
    if model not in PRESETS:
        raise ValueError(f"unknown --model '{model}' (known: {', '.join(PRESETS)})")
    sizes = PRESETS[model]
    if size not in sizes:
        raise ValueError(f"unknown --model-size '{size}' for {model} (known: {', '.join(sizes)})")
    return dict(sizes[size])
