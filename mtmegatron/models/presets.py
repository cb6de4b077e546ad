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

# DeepSeek-V3: MLA with q LoRA and qk-layernorm, YaRN, first-k dense layers, a shared expert, the sigmoid
# router with expert bias (aux-loss-free balancing) and group-limited top-k, one MTP layer.
_DEEPSEEK_V3_COMMON = dict(
    normalization="RMSNorm", norm_epsilon=1e-6, swiglu=True, position_embedding_type="rope",
    disable_bias_linear=True, untie_embeddings_and_output_weights=True, multi_latent_attention=True,
    qk_layernorm=True, rope_type="yarn", rotary_base=10000, rotary_scaling_factor=40.0,
    original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
    moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_bias_update_rate=1e-3,
    moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff=1e-4, moe_token_dispatcher_type="alltoall",
    mtp_num_layers=1, mtp_loss_scaling_factor=0.1,
)

# LLaVA: a CLIP-style ViT (LLaVA-1.5 reads the penultimate CLIP layer without its class token: the encoder here has
# exactly the layers whose output is used), a 2-layer MLP projector and a Llama-style language model.
_CLIP_L14_336 = dict(vision_model_type="clip", img_h=336, img_w=336, patch_dim=14, vision_num_layers=23,
                     vision_hidden_size=1024, vision_ffn_hidden_size=4096, vision_num_attention_heads=16,
                     vision_norm_epsilon=1e-5, disable_vision_class_token=True)

# The training recipe every named preset carries (the demo's: a short cosine run of small batches without
# dropout), for the values Megatron-LM leaves unset (lr, batch sizes, iterations) or sets for large models
# (dropout 0.1, beta2 0.999, linear decay, 100 evaluation batches, a console line every 100 iterations).
RECIPE = dict(
    train_iters=1000, lr=1e-3, lr_decay_style="cosine", adam_beta2=0.95, micro_batch_size=2, global_batch_size=8,
    hidden_dropout=0.0, attention_dropout=0.0, eval_iters=4, log_interval=1,
)
# Llama-3.1/3.2: Llama-3 plus RoPE frequency scaling (models/family_args.py; megatron-core's fixed low/high
# frequency factors 1/4 and original context 8192 are the published ones) and a 128K context.
_LLAMA31 = dict(_LLAMA_COMMON, use_rope_scaling=True, rope_scaling_factor=8.0, seq_length=8192,
                max_position_embeddings=131072, vocab_size=128256, rotary_base=500000)
_LLAMA32 = dict(_LLAMA31, rope_scaling_factor=32.0, untie_embeddings_and_output_weights=False)

# Qwen2/2.5: biases on q/k/v only; Qwen3: no bias, RMSNorm on each head's q and k, head dim set explicitly;
# Qwen3-MoE: every layer MoE, softmax top-k router with normalised weights (megatron's default order: top-k of
# the logits, then softmax), no shared expert.
_QWEN2 = dict(_LLAMA_COMMON, norm_epsilon=1e-6, rotary_base=1000000, add_qkv_bias=True)
_QWEN3 = dict(_LLAMA_COMMON, norm_epsilon=1e-6, rotary_base=1000000, qk_layernorm=True, vocab_size=151936,
              seq_length=4096, max_position_embeddings=40960)
_QWEN3_MOE = dict(_QWEN3, moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="aux_loss",
                  moe_aux_loss_coeff=1e-3)
_TINY_DENSE = dict(num_layers=4, hidden_size=128, ffn_hidden_size=352, num_attention_heads=8, num_query_groups=4,
                   seq_length=128, max_position_embeddings=128, vocab_size=1024)

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
        "3.1-tiny": dict(_LLAMA31, **_TINY_DENSE),
        "3.1-8b": dict(_LLAMA31, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                       num_query_groups=8),
        "3.1-70b": dict(_LLAMA31, num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                        num_query_groups=8),
        "3.2-1b": dict(_LLAMA32, num_layers=16, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=32,
                       num_query_groups=8),
        "3.2-3b": dict(_LLAMA32, num_layers=28, hidden_size=3072, ffn_hidden_size=8192, num_attention_heads=24,
                       num_query_groups=8),
    },
    "qwen2.5": {
        "tiny": dict(_QWEN2, **_TINY_DENSE, untie_embeddings_and_output_weights=False),
        "0.5b": dict(_QWEN2, num_layers=24, hidden_size=896, ffn_hidden_size=4864, num_attention_heads=14,
                     num_query_groups=2, seq_length=4096, max_position_embeddings=32768, vocab_size=151936,
                     untie_embeddings_and_output_weights=False),
        "7b": dict(_QWEN2, num_layers=28, hidden_size=3584, ffn_hidden_size=18944, num_attention_heads=28,
                   num_query_groups=4, seq_length=4096, max_position_embeddings=32768, vocab_size=152064),
        "72b": dict(_QWEN2, num_layers=80, hidden_size=8192, ffn_hidden_size=29568, num_attention_heads=64,
                    num_query_groups=8, seq_length=4096, max_position_embeddings=32768, vocab_size=152064),
    },
    "qwen3": {
        # head dim 32 with hidden 128 / 8 heads = 16: kv_channels explicit, as in the real ones
        "tiny": dict(_QWEN3, **{**_TINY_DENSE, "kv_channels": 32}, untie_embeddings_and_output_weights=False),
        "0.6b": dict(_QWEN3, num_layers=28, hidden_size=1024, ffn_hidden_size=3072, num_attention_heads=16,
                     num_query_groups=8, kv_channels=128, untie_embeddings_and_output_weights=False),
        "8b": dict(_QWEN3, num_layers=36, hidden_size=4096, ffn_hidden_size=12288, num_attention_heads=32,
                   num_query_groups=8, kv_channels=128),
        "32b": dict(_QWEN3, num_layers=64, hidden_size=5120, ffn_hidden_size=25600, num_attention_heads=64,
                    num_query_groups=8, kv_channels=128),
    },
    "qwen3-moe": {
        "tiny": dict(_QWEN3_MOE, **{**_TINY_DENSE, "kv_channels": 32}, num_experts=8, moe_router_topk=2,
                     moe_ffn_hidden_size=64),
        "30b-a3b": dict(_QWEN3_MOE, num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
                        num_query_groups=4, kv_channels=128, num_experts=128, moe_router_topk=8,
                        moe_ffn_hidden_size=768),
        "235b-a22b": dict(_QWEN3_MOE, num_layers=94, hidden_size=4096, ffn_hidden_size=12288, num_attention_heads=64,
                          num_query_groups=4, kv_channels=128, num_experts=128, moe_router_topk=8,
                          moe_ffn_hidden_size=1536),
    },
    "mistral": {  # v0.3: Llama's layer, 32K vocabulary, no sliding window
        "tiny": dict(_LLAMA_COMMON, **_TINY_DENSE, rotary_base=1000000),
        "7b": dict(_LLAMA_COMMON, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                   num_query_groups=8, seq_length=4096, max_position_embeddings=32768, vocab_size=32768,
                   rotary_base=1000000),
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
    "llava": {
        # a 4-layer language model, a 2-layer ViT on 32x32 images in 8x8 patches: 16 image embeddings per image
        "tiny": dict(
            _LLAMA_COMMON, num_layers=4, hidden_size=128, ffn_hidden_size=352, num_attention_heads=8,
            num_query_groups=4, seq_length=128, vocab_size=1024, rotary_base=500000, vision_model_type="clip",
            img_h=32, img_w=32, patch_dim=8, vision_num_layers=2, vision_hidden_size=64, vision_ffn_hidden_size=256,
            vision_num_attention_heads=4, vision_norm_epsilon=1e-5, disable_vision_class_token=True,
        ),
        # LLaVA-1.5-7B (llava-hf/llava-1.5-7b-hf): CLIP ViT-L/14-336 + Vicuna-7B (Llama-2 shape, no GQA)
        "7b": {
            **_LLAMA_COMMON, **_CLIP_L14_336, "num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 11008,
            "num_attention_heads": 32, "group_query_attention": False, "seq_length": 4096, "vocab_size": 32064,
            "rotary_base": 10000, "norm_epsilon": 1e-5, "prompt_format": "vicuna_v1",
        },
    },
    "deepseek-v3": {
        # 1 dense + 3 MoE layers; dense FFN 160, routed experts 32, shared expert 64: all sizes differ
        "tiny": dict(
            _DEEPSEEK_V3_COMMON, num_layers=4, hidden_size=64, ffn_hidden_size=160, num_attention_heads=4,
            seq_length=32, max_position_embeddings=64, vocab_size=256, q_lora_rank=32, kv_lora_rank=16,
            qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16, moe_layer_freq=[0] + [1] * 3,
            num_experts=8, moe_router_topk=4, moe_router_num_groups=4, moe_router_group_topk=2,
            moe_router_topk_scaling_factor=2.5, moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=64,
        ),
        # our own reduced shape of the same architecture (~1/3.5 the width, 16 layers): not a published model
        "lite": dict(
            _DEEPSEEK_V3_COMMON, num_layers=16, hidden_size=2048, ffn_hidden_size=10944, num_attention_heads=16,
            seq_length=4096, max_position_embeddings=163840, vocab_size=129280, q_lora_rank=768, kv_lora_rank=512,
            qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128, moe_layer_freq=[0] + [1] * 15,
            num_experts=64, moe_router_topk=8, moe_router_num_groups=8, moe_router_group_topk=4,
            moe_router_topk_scaling_factor=2.5, moe_ffn_hidden_size=1408, moe_shared_expert_intermediate_size=1408,
        ),
        "671b": dict(
            _DEEPSEEK_V3_COMMON, num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=128,
            seq_length=4096, max_position_embeddings=163840, vocab_size=129280, q_lora_rank=1536,
            kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
            moe_layer_freq=[0] * 3 + [1] * 58, num_experts=256, moe_router_topk=8, moe_router_num_groups=8,
            moe_router_group_topk=4, moe_router_topk_scaling_factor=2.5, moe_ffn_hidden_size=2048,
            moe_shared_expert_intermediate_size=2048,
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
