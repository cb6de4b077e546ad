"""DeepSeek-V3 (``--model deepseek-v3``; HF ``DeepseekV3ForCausalLM``): MLA with q LoRA and qk-layernorm, YaRN,
first-k dense layers, a shared expert, the sigmoid router with expert bias (aux-loss-free balancing) and
group-limited top-k, one MTP layer.

HF config: the router scores a group by its top-2 experts (megatron: top topk/group_topk), normalises the top-k
weights (megatron's sigmoid router always does). Map: q_a/q_b/kv_a/kv_b -> linear_q_down/q_up/kv_down/kv_up,
q_a/kv_a layernorms -> q_layernorm/kv_layernorm (the local spec's names), gate -> router (+
e_score_correction_bias -> router.expert_bias); the MTP layer is HF layer ``num_hidden_layers + k`` (enorm, hnorm,
eh_proj, shared_head.norm; the release also stores the shared embedding and head there, written as copies).
RoPE rows of MLA's q and k_pe: megatron's MLA de-interleaves them itself (it expects HF's ``rope_interleave:
true``), so those checkpoints map as they are; for ``rope_interleave: false`` the rows are interleaved here (an
exact permutation, inverted on the way back).
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import sys

import torch

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import Entry, Family
from mtmegatron.models.families.shared.mtp import mtp_map
from mtmegatron.models.families.shared.router import group_limited_flags

_COMMON = dict(
    normalization="RMSNorm", layernorm_epsilon=1e-6, swiglu=True, position_embedding_type="rope",
    add_bias_linear=False, untie_embeddings_and_output_weights=True, multi_latent_attention=True,
    qk_layernorm=True, rope_type="yarn", rotary_base=10000, rotary_scaling_factor=40.0,
    original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
    moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_bias_update_rate=1e-3,
    moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff=1e-4, moe_token_dispatcher_type="alltoall",
    mtp_num_layers=1, mtp_loss_scaling_factor=0.1,
)
_REAL = dict(seq_length=4096, max_position_embeddings=163840, vocab_size=129280, kv_lora_rank=512, qk_head_dim=128,
             qk_pos_emb_head_dim=64, v_head_dim=128, moe_router_topk=8, moe_router_num_groups=8,
             moe_router_group_topk=4, moe_router_topk_scaling_factor=2.5)

PRESETS = {
    # 1 dense + 3 MoE layers; dense FFN 160, routed experts 32, shared expert 64: all sizes differ
    "tiny": dict(
        _COMMON, num_layers=4, hidden_size=64, ffn_hidden_size=160, num_attention_heads=4,
        seq_length=32, max_position_embeddings=64, vocab_size=256, q_lora_rank=32, kv_lora_rank=16,
        qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16, moe_layer_freq=[0] + [1] * 3,
        num_experts=8, moe_router_topk=4, moe_router_num_groups=4, moe_router_group_topk=2,
        moe_router_topk_scaling_factor=2.5, moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=64,
    ),
    # our own reduced shape of the same architecture (~1/3.5 the width, 16 layers): not a published model
    "lite": dict(_COMMON, **_REAL, num_layers=16, hidden_size=2048, ffn_hidden_size=10944, num_attention_heads=16,
                 q_lora_rank=768, moe_layer_freq=[0] + [1] * 15, num_experts=64, moe_ffn_hidden_size=1408,
                 moe_shared_expert_intermediate_size=1408),
    "671b": dict(_COMMON, **_REAL, num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=128,
                 q_lora_rank=1536, moe_layer_freq=[0] * 3 + [1] * 58, num_experts=256, moe_ffn_hidden_size=2048,
                 moe_shared_expert_intermediate_size=2048),
}


def flags_from_hf(config: dict, with_mtp: bool = True, names=None, source: str | None = None, **_) -> list[str]:
    """``names``: the checkpoint's tensor names (its MTP layer, HF layer num_hidden_layers, is converted when it
    holds one)."""
    if names is not None:
        with_mtp = any(name.startswith(f"model.layers.{config['num_hidden_layers']}.") for name in names)
        if config.get("num_nextn_predict_layers") and not with_mtp:
            print(f"mtmegatron convert: {source} has no MTP layer weights; converting without MTP", file=sys.stderr)
    require = gpt.require
    require(config.get("scoring_func", "sigmoid") == "sigmoid", "only the sigmoid router (scoring_func) is supported")
    topk = config["num_experts_per_tok"]
    require(config.get("norm_topk_prob", True) or topk == 1,
            "norm_topk_prob false: megatron's sigmoid router always normalises the top-k weights")
    layers, first_dense = config["num_hidden_layers"], config.get("first_k_dense_replace", 0)
    flags = ["--model", FAMILY.name] + gpt.common_flags(config) + [
        "--multi-latent-attention", "--qk-layernorm", "--kv-lora-rank", str(config["kv_lora_rank"]),
        "--qk-head-dim", str(config["qk_nope_head_dim"]), "--qk-pos-emb-head-dim", str(config["qk_rope_head_dim"]),
        "--v-head-dim", str(config["v_head_dim"]), "--moe-layer-freq", f"([0]*{first_dense}+[1]*{layers - first_dense})",
        "--num-experts", str(config["n_routed_experts"]), "--moe-router-topk", str(topk),
        "--moe-ffn-hidden-size", str(config["moe_intermediate_size"]),
        "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
        "--moe-router-topk-scaling-factor", repr(float(config.get("routed_scaling_factor", 1.0))),
    ]
    # every size explicit (0 = off) so no preset value leaks into the converted network
    flags += ["--q-lora-rank", str(config.get("q_lora_rank") or 0), "--moe-shared-expert-intermediate-size",
              str((config.get("n_shared_experts") or 0) * config["moe_intermediate_size"])]
    flags += group_limited_flags(config)
    theta, scaling = gpt.rope(config)
    flags += gpt.rotary_base_flags(theta)
    if scaling is None:  # megatron's MLA takes its softmax scale from the YaRN fields even for plain RoPE
        flags += ["--rope-type", "rope", "--rotary-scaling-factor", "1.0", "--mscale", "1.0", "--mscale-all-dim", "0.0"]
    else:
        require(scaling["rope_type"] == "yarn", f"RoPE scaling {scaling['rope_type']!r}: only yarn is supported")
        flags += ["--rope-type", "yarn", "--rotary-scaling-factor", repr(float(scaling["factor"])),
                  "--original-max-position-embeddings", str(scaling["original_max_position_embeddings"]),
                  "--beta-fast", repr(float(scaling.get("beta_fast", 32))),
                  "--beta-slow", repr(float(scaling.get("beta_slow", 1))),
                  "--mscale", repr(float(scaling.get("mscale", 1.0))),
                  "--mscale-all-dim", repr(float(scaling.get("mscale_all_dim", 0.0)))]
    return flags + ["--mtp-num-layers", str(config.get("num_nextn_predict_layers") or 0 if with_mtp else 0)]


def hf_config(config, build, rope_interleave: bool = True, **_) -> dict:
    out = gpt.hf_config_base(FAMILY, config, build)
    pattern = config.moe_layer_freq if isinstance(config.moe_layer_freq, list) else None
    out.update(
        num_key_value_heads=config.num_attention_heads, q_lora_rank=config.q_lora_rank,
        kv_lora_rank=config.kv_lora_rank, qk_nope_head_dim=config.qk_head_dim,
        qk_rope_head_dim=config.qk_pos_emb_head_dim, v_head_dim=config.v_head_dim,
        first_k_dense_replace=pattern.index(1) if pattern else 0, n_routed_experts=config.num_moe_experts,
        num_experts_per_tok=config.moe_router_topk, moe_intermediate_size=config.moe_ffn_hidden_size,
        n_shared_experts=(config.moe_shared_expert_intermediate_size or 0) // config.moe_ffn_hidden_size,
        n_group=config.moe_router_num_groups or 1, topk_group=config.moe_router_group_topk or 1,
        routed_scaling_factor=config.moe_router_topk_scaling_factor or 1.0, norm_topk_prob=True,
        scoring_func="sigmoid", topk_method="noaux_tc", num_nextn_predict_layers=config.mtp_num_layers or 0,
        rope_interleave=rope_interleave,
    )
    if build.rope_type == "yarn":
        out["rope_scaling"] = {
            "type": "yarn", "rope_type": "yarn", "factor": build.rotary_scaling_factor,
            "original_max_position_embeddings": build.original_max_position_embeddings,
            "beta_fast": build.beta_fast, "beta_slow": build.beta_slow, "mscale": build.mscale,
            "mscale_all_dim": build.mscale_all_dim,
        }
    return out


def _permute_rope_rows(weight, head_dim: int, rope_dim: int, inverse: bool) -> torch.Tensor:
    """Permute the last ``rope_dim`` rows of every ``head_dim``-row block: de-interleave (pairs -> halves), or
    with ``inverse`` interleave (halves -> pairs, what megatron's MLA de-interleaves again)."""
    perm = torch.cat([torch.arange(0, rope_dim, 2), torch.arange(1, rope_dim, 2)])
    if inverse:
        perm = torch.argsort(perm)
    blocks = weight.view(-1, head_dim, *weight.shape[1:])
    nope, rope = blocks[:, : head_dim - rope_dim], blocks[:, head_dim - rope_dim:]
    return torch.cat([nope, rope[:, perm]], dim=1).reshape(weight.shape)


def _mla(rope_interleave: bool):
    def attention(config, mc: str, hp: str) -> list[Entry]:
        rope = config.qk_pos_emb_head_dim
        q = ("linear_q_up_proj", "q_b_proj") if config.q_lora_rank else ("linear_q_proj", "q_proj")
        rows = {} if rope_interleave else {q[0]: config.qk_head_dim + rope, "linear_kv_down_proj": config.kv_lora_rank + rope}
        pairs = [("linear_kv_down_proj", "kv_a_proj_with_mqa"), ("kv_layernorm", "kv_a_layernorm"),
                 ("linear_kv_up_proj", "kv_b_proj"), ("linear_proj", "o_proj")]
        pairs += [("linear_q_down_proj", "q_a_proj"), ("q_layernorm", "q_a_layernorm"), q] if config.q_lora_rank else [q]
        out = []
        for m, h in pairs:
            m, h = f"{mc}self_attention.{m}.weight", f"{hp}self_attn.{h}.weight"
            head = rows.get(m.split(".")[-2])
            out.append(gpt.same(m, h) if head is None else Entry(
                m, (h,), lambda t, head=head: _permute_rope_rows(t, head, rope, inverse=True),
                lambda t, head=head: (_permute_rope_rows(t, head, rope, inverse=False),)))
        return out
    return attention


def hf_map(config, build, rope_interleave: bool = True, layout=None, **_) -> list[Entry]:
    return (gpt.decoder_map(config, build, attention=_mla(rope_interleave))
            + mtp_map(config.num_layers, config.mtp_num_layers, build.untie_embeddings_and_output_weights))


FAMILY = Family(name="deepseek-v3", presets=PRESETS, hf_model_type="deepseek_v3",
                hf_architecture="DeepseekV3ForCausalLM", flags_from_hf=flags_from_hf, hf_config=hf_config,
                hf_map=hf_map, matches=lambda saved: bool(saved.get("multi_latent_attention")))
