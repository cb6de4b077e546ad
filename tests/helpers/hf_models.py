"""Tiny random HF transformers models (the reference nobody here wrote) saved as safetensors checkpoints.

Shapes are small enough for a 2-core CI box but keep every feature the converters map: GQA (Llama, Mixtral),
experts (Mixtral), edge cases keyed ``family:variant`` (plain multi-head attention with tied embeddings and a
vocabulary of 163 that TP does not divide), and for DeepSeek-V3 first-k dense + MoE layers with three different FFN sizes, a shared
expert, the group-limited sigmoid router with a non-zero correction bias, MLA with q LoRA and YaRN RoPE, and an
MTP layer in DeepSeek's release layout (HF's model does not build it; its tensors are added to the files).
"""

from __future__ import annotations

import os

import torch

SEQ = 16


def _llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)


def _mixtral_config():
    from transformers import MixtralConfig

    return MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=1e6,
                         router_aux_loss_coef=0.0)


def _deepseek_config():
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=160, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=2,
        num_experts_per_tok=4, n_group=4, topk_group=2, first_k_dense_replace=1, q_lora_rank=32,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, routed_scaling_factor=2.5,
        max_position_embeddings=64, num_nextn_predict_layers=1, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                         "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0},
    )


def _llama_mha_tied_config():
    """Llama-2 style multi-head attention (kv heads == heads), tied embeddings, a vocabulary (163) that neither
    TP2 nor 128 divides."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=163, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                       rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True)


def _mixtral_vocab163_config():
    config = _mixtral_config()
    config.vocab_size = 163
    return config


def _llama31_config():
    """Llama-3.1-style RoPE scaling (type llama3; a factor of 32 as in 3.2, so the scaled frequencies differ
    clearly) with a head dim of 32 (not hidden/heads = 16), so the medium and low frequency bands both exist."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
                       rms_norm_eps=1e-5, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192})


def _llama3_own_rope_values_config():
    """Llama-3.x RoPE scaling with other values than megatron-core's fixed 1 / 4 / 8192 (factor 8, low 2, high 6,
    original context 16): the 16-token sequence spans the scaled and the smoothed frequency bands."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**_llama31_config().to_dict(), "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 6.0,
        "original_max_position_embeddings": 16}})


def _qwen2_config():
    """Qwen2.5-style: q/k/v biases, tied embeddings (as the small releases), an unused sliding-window size."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
                       rope_theta=1e6, tie_word_embeddings=True, use_sliding_window=False, sliding_window=32)


def _qwen3_config():
    """Qwen3: q/k RMSNorm per head, head_dim 32 while hidden/heads is 16."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
                       rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False)


def _qwen3_moe_config():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64,
                          rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False, router_aux_loss_coef=0.0)


def _mistral_config():
    from transformers import MistralConfig

    return MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         rope_theta=1e6, sliding_window=None, tie_word_embeddings=False)


CONFIGS = {"llama3": _llama_config, "llama3:3.1-rope-scaling": _llama31_config,
           "llama3:rope-own-values": _llama3_own_rope_values_config, "qwen2.5": _qwen2_config,
           "qwen3": _qwen3_config, "qwen3-moe": _qwen3_moe_config, "mistral": _mistral_config, "mixtral": _mixtral_config, "deepseek-v3": _deepseek_config,
           "llama3:mha-tied-163": _llama_mha_tied_config, "mixtral:vocab-163": _mixtral_vocab163_config}


def _randomize(model) -> None:
    """Non-trivial values everywhere (norm weights and the router bias too, so mapping mistakes show)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.02 if p.dim() > 1 else 0.1)
                    + (1.0 if "norm" in name else 0.0))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.05)


def _mtp_tensors(state: dict, config, gen) -> dict:
    """DeepSeek's MTP layer (HF index num_hidden_layers): a MoE decoder layer's weights (as saved) + enorm/hnorm/
    eh_proj/shared_head, and copies of the embedding and head, as in the published checkpoints."""
    last, mtp = config.num_hidden_layers - 1, config.num_hidden_layers
    out = {}
    for name, tensor in state.items():
        prefix = f"model.layers.{last}."
        if name.startswith(prefix):
            out[f"model.layers.{mtp}." + name[len(prefix):]] = tensor + 0.01 * torch.randn(tensor.shape, generator=gen)
    hidden = config.hidden_size
    out[f"model.layers.{mtp}.enorm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=gen)
    out[f"model.layers.{mtp}.hnorm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=gen)
    out[f"model.layers.{mtp}.eh_proj.weight"] = 0.02 * torch.randn(hidden, 2 * hidden, generator=gen)
    out[f"model.layers.{mtp}.shared_head.norm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=gen)
    out[f"model.layers.{mtp}.embed_tokens.weight"] = state["model.embed_tokens.weight"].clone()
    out[f"model.layers.{mtp}.shared_head.head.weight"] = state["lm_head.weight"].clone()
    return out


def save_tiny(family: str, directory: str, shard: bool = False):
    """Build the tiny HF model, save it (sharded with an index when ``shard``), return the model (eval, fp32)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = CONFIGS[family]()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    _randomize(model)
    if family in ("llama3:3.1-rope-scaling", "llama3:rope-own-values"):  # large q/k: a 16-token RoPE difference
        # shows (~3e-3 in the logits)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "q_proj" in name or "k_proj" in name:
                    p.mul_(10.0)
    model.save_pretrained(directory, max_shard_size="100KB" if shard else "5GB")
    if family == "deepseek-v3":
        path = os.path.join(directory, "model.safetensors")
        tensors = load_file(path)
        tensors.update(_mtp_tensors(tensors, config, torch.Generator().manual_seed(1)))
        save_file(tensors, path, metadata={"format": "pt"})
    return model


def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


def main(argv: list[str]) -> None:
    """``python hf_models.py FAMILY DIR [--shard]``: save the checkpoint and, next to it, ``reference.pt`` with
    tokens (2 x SEQ), HF logits and HF's mean next-token loss. Run as a subprocess so that the test process
    never runs torch compute before forking its rank processes (a forked OpenMP pool can hang)."""
    family, directory = argv[0], argv[1]
    model = save_tiny(family, directory, shard="--shard" in argv)
    tokens = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(7))
    torch.save({"tokens": tokens, "logits": hf_logits(model, tokens)}, os.path.join(directory, "reference.pt"))


def hf_loss(directory: str, batch_file: str, micro_batch_size: int) -> None:
    """``python hf_models.py --loss DIR BATCH MBS``: HF's next-token loss on BATCH's tokens/labels/loss_mask (a
    torch file), reduced as pretrain reports it (masked token mean per micro-batch, then the mean over
    micro-batches), written back into BATCH as ``hf_loss``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").float().eval()
    batch = torch.load(batch_file)
    logits = hf_logits(model, batch["tokens"])
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["labels"], reduction="none")
    mask = batch["loss_mask"].float()
    per_micro = [(losses[i:i + micro_batch_size] * mask[i:i + micro_batch_size]).sum()
                 / mask[i:i + micro_batch_size].sum() for i in range(0, len(losses), micro_batch_size)]
    batch["hf_loss"] = float(torch.stack(per_micro).mean())
    torch.save(batch, batch_file)


def fp8_release(source: str, fp8_dir: str, bf16_dir: str) -> None:
    """``python hf_models.py --fp8 SRC FP8_DIR BF16_DIR``: SRC's layer projection weights as DeepSeek releases
    them (float8_e4m3fn + ``<name>_scale_inv`` per 128x128 block, edge blocks partial) into FP8_DIR, and into
    BF16_DIR the same checkpoint dequantized by the block formula (fp8 value x its block's scale_inv, written
    out element-block by element-block here, not with the converter's code) in bf16, other tensors bf16."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    tensors = load_file(os.path.join(source, "model.safetensors"))
    fp8, bf16 = {}, {}
    for name, t in tensors.items():
        if t.dim() == 2 and name.startswith("model.layers.") and "_proj.weight" in name:
            rows, cols = t.shape
            scale_inv = torch.empty((rows + 127) // 128, (cols + 127) // 128)
            q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
            deq = torch.empty(rows, cols)
            for i in range(scale_inv.shape[0]):
                for j in range(scale_inv.shape[1]):
                    block = t[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
                    scale_inv[i, j] = block.abs().max().clamp(min=1e-12) / 448.0
                    q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (block / scale_inv[i, j]).to(torch.float8_e4m3fn)
                    deq[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (
                        q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].float() * scale_inv[i, j])
            fp8[name], fp8[name + "_scale_inv"], bf16[name] = q, scale_inv, deq.to(torch.bfloat16)
        else:
            fp8[name] = bf16[name] = t.to(torch.bfloat16)
    for directory, data in ((fp8_dir, fp8), (bf16_dir, bf16)):
        os.makedirs(directory, exist_ok=True)
        save_file(data, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        config = json.load(open(os.path.join(source, "config.json")))
        config["torch_dtype"] = "bfloat16"
        json.dump(config, open(os.path.join(directory, "config.json"), "w"))
    shutil.copy(os.path.join(source, "reference.pt"), os.path.join(bf16_dir, "reference.pt"))


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "--fp8":
        fp8_release(*sys.argv[2:5])
    elif sys.argv[1] == "--loss":
        hf_loss(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main(sys.argv[1:])
