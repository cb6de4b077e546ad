"""The DeepSeek-V3 preset builds the model it claims, on megatron-core 0.16 with the local (no-TE) spec on CPU.

One single-rank worker checks:
* heterogeneous FFN sizes by parameter shapes: the first-k dense layers' MLP uses ffn_hidden_size, routed
  experts moe_ffn_hidden_size, the shared expert moe_shared_expert_intermediate_size (all three differ in the
  tiny preset); MLA projections have the LoRA ranks and head dims; the MTP block exists (single stage);
* the patch ``mla_without_te`` is needed: with megatron-core's own flag value the MLA layer does not build;
* the aux-loss-free expert bias, updated by megatron-core's finalize_model_grads step
  (``_update_router_expert_bias``) once per "global batch" on a skewed-routing toy, moves load toward balance
  (max/mean load falls; the overloaded expert's bias goes down, an idle one's up), while the weights of the
  chosen experts stay the unbiased sigmoid scores (normalised, times the scaling factor).
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

FLAGS = ["--model", "deepseek-v3", "--model-size", "tiny", "--moe-router-bias-update-rate", "0.005",
         "--micro-batch-size", "1", "--global-batch-size", "1"]


def _worker():
    from megatron.core.distributed.finalize_model_grads import _update_router_expert_bias

    from mtmegatron.convert.model import build_model, init_single_rank, parse_flags

    args = parse_flags(FLAGS)
    init_single_rank(args)
    model = build_model(args)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if hasattr(v, "shape")}

    # the upstream flag value (TE "present" because megatron's TE wrapper module imports) breaks MLA
    import megatron.core.transformer.multi_latent_attention as mla

    patched, mla.HAVE_TE = mla.HAVE_TE, True
    try:
        build_model(args)
        unpatched_error = None
    except TypeError as e:
        unpatched_error = str(e)
    finally:
        mla.HAVE_TE = patched

    # expert bias on a skewed toy: hidden states pushing most tokens to expert 0
    router = model.decoder.layers[1].mlp.router
    config = model.config
    gen = torch.Generator().manual_seed(0)
    common = torch.randn(args.hidden_size, generator=gen)
    hidden = torch.randn(256, 1, args.hidden_size, generator=gen) + 0.3 * common  # diverse tokens...
    with torch.no_grad():
        router.weight.copy_(0.05 * torch.randn(router.weight.shape, generator=gen))
        router.weight[0] += 2.0 * common / common.norm() ** 2  # ...that favour expert 0 (logit ~ +0.6): max/mean load 1.47, ~1.03 after the updates
    loads, biases = [], []
    for _ in range(40):  # one "global batch" each: count tokens in forward, then the finalize-step update
        router.local_tokens_per_expert.zero_()
        with torch.enable_grad():
            probs, routing_map = router(hidden)
        loads.append(router.local_tokens_per_expert.clone())
        _update_router_expert_bias([model], config)
        biases.append(router.expert_bias.clone())
    # chosen-expert weights: unbiased sigmoid scores of the chosen experts, normalised, times the scaling factor
    with torch.no_grad():
        logits = torch.nn.functional.linear(hidden.view(-1, args.hidden_size), router.weight).float()
        scores = torch.sigmoid(logits)
        chosen = scores * routing_map
        expected = chosen / chosen.sum(dim=-1, keepdim=True) * args.moe_router_topk_scaling_factor
    return {"shapes": shapes, "unpatched_error": unpatched_error, "loads": torch.stack(loads),
            "biases": torch.stack(biases), "probs": probs.detach(), "expected": expected * routing_map,
            "routing_map": routing_map.float()}


def test_deepseek_tiny_structure_patch_and_expert_bias(tmp_path):
    # one plain process (not a forked rank: torch compute earlier in the pytest process can hang a fork)
    out = tmp_path / "result.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, __file__, str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    result = torch.load(out)
    shapes = result["shapes"]
    hidden, dense_ffn, expert_ffn, shared_ffn = 64, 160, 32, 64  # the tiny preset (all FFN sizes differ)
    assert shapes["decoder.layers.0.mlp.linear_fc1.weight"] == (2 * dense_ffn, hidden)  # first-k dense
    assert shapes["decoder.layers.0.mlp.linear_fc2.weight"] == (hidden, dense_ffn)
    for layer in (1, 2, 3):
        assert f"decoder.layers.{layer}.mlp.linear_fc1.weight" not in shapes
        for e in range(8):
            assert shapes[f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc1.weight"] == (2 * expert_ffn, hidden)
            assert shapes[f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc2.weight"] == (hidden, expert_ffn)
        assert shapes[f"decoder.layers.{layer}.mlp.shared_experts.linear_fc1.weight"] == (2 * shared_ffn, hidden)
        assert shapes[f"decoder.layers.{layer}.mlp.shared_experts.linear_fc2.weight"] == (hidden, shared_ffn)
        assert shapes[f"decoder.layers.{layer}.mlp.router.expert_bias"] == (8,)
    attn = "decoder.layers.0.self_attention."
    assert shapes[attn + "linear_q_down_proj.weight"] == (32, hidden)  # q_lora_rank
    assert shapes[attn + "linear_q_up_proj.weight"] == (4 * (16 + 8), 32)  # heads x (qk_head + rope)
    assert shapes[attn + "linear_kv_down_proj.weight"] == (16 + 8, hidden)  # kv_lora_rank + rope
    assert shapes[attn + "linear_kv_up_proj.weight"] == (4 * (16 + 16), 16)  # heads x (qk_head + v_head)
    assert shapes["mtp.layers.0.eh_proj.weight"] == (hidden, 2 * hidden)

    assert result["unpatched_error"] is not None and "isinstance" in result["unpatched_error"]

    loads, biases = torch.as_tensor(result["loads"]), torch.as_tensor(result["biases"])
    imbalance = loads.max(dim=1).values / loads.mean(dim=1)
    assert imbalance[0] > 1.3, f"the toy is not skewed: {loads[0]}"
    assert imbalance[-5:].mean() < imbalance[0] * 0.8, f"load did not move toward balance: {imbalance.tolist()}"
    busiest, idlest = int(loads[0].argmax()), int(loads[0].argmin())
    assert biases[-1, busiest] < 0 < biases[-1, idlest]
    probs, expected = torch.as_tensor(result["probs"]), torch.as_tensor(result["expected"])
    assert torch.allclose(probs * torch.as_tensor(result["routing_map"]), expected, atol=1e-6)


if __name__ == "__main__":
    torch.save(_worker(), sys.argv[1])
