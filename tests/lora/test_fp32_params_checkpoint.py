"""fp32 trainable parameters beside bf16 ones (fp32 LoRA adapters over a bf16 base) in megatron-core's
mixed-precision optimizer (``Float16OptimizerWithFloat16Params``) save and load through dist_checkpointing
(patches/float16_optimizer_fp32_params_checkpoint.py): in process, one rank, a module whose first parameter is fp32
and whose others are bf16 (megatron-core alone maps the fp32 one's state to the first bf16 one: "Optimizer shape
(2, 3) does not match model shape (4, 3)"; with only fp32 ones trainable, "Param id 0 does not match any model
sharded param").
After one optimizer step, each parameter's Adam state and each bf16 parameter's fp32 main copy are saved under that
parameter's key, and a fresh optimizer loaded from the checkpoint holds the same state and main copies. And the
adapter of ``--lora-fp32-adapters`` stays fp32 when its base linear is cast to bf16 (Float16Module's ``bfloat16()``)
and adds its fp32 path, cast to bf16, to the base's bf16 output."""

from __future__ import annotations

import os

import pytest
import torch

SHAPES = {"a32": ((2, 3), torch.float32), "w16": ((4, 3), torch.bfloat16), "b32": ((3,), torch.float32),
          "v16": ((5,), torch.bfloat16)}


@pytest.fixture(scope="module")
def single_rank():
    import mtmegatron
    from megatron.core import parallel_state

    from helpers.pretrain_runner import free_port

    mtmegatron.activate("cpu")  # the bridge (device tensor names) and the patches
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    yield
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    mtmegatron.deactivate()


def _init_state(opt, config=None):  # megatron-core's Adam init_state_fn
    for group in opt.param_groups:
        for p in group["params"]:
            if len(opt.state[p]) == 0:
                opt.state[p]["exp_avg"] = torch.zeros_like(p.data)
                opt.state[p]["exp_avg_sq"] = torch.zeros_like(p.data)


def _model_and_optimizer(seed: int, shapes=SHAPES):
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params

    generator = torch.Generator().manual_seed(seed)
    params = {k: torch.nn.Parameter(torch.randn(shape, generator=generator).to(dtype)) for k, (shape, dtype)
              in shapes.items()}
    model_sd = {f"m.{k}": ShardedTensor.from_rank_offsets(f"m.{k}", p, replica_id=0) for k, p in params.items()}
    config = OptimizerConfig(optimizer="adam", lr=0.1, bf16=True, clip_grad=0.0, weight_decay=0.0)
    group = {"params": list(params.values()), "wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": False,
             "is_decoupled_lr": False}  # megatron-core's group keys (its load matches groups by them)
    inner = torch.optim.Adam([group], lr=0.1)
    return params, model_sd, Float16OptimizerWithFloat16Params(inner, config, None, _init_state)


def test_mixed_fp32_and_bf16_parameters_save_and_load(single_rank, tmp_path):
    from megatron.core import dist_checkpointing

    params, model_sd, optimizer = _model_and_optimizer(0)
    assert [len(g) for g in optimizer.fp32_from_fp32_groups] == [2]  # a32 and b32 step as they are
    for p in params.values():
        p.main_grad = torch.ones_like(p, dtype=torch.float32)
    optimizer.step()
    state = optimizer.sharded_state_dict(model_sd)
    # every number of torch's state maps to its own parameter: a32 0, w16 1, b32 2, v16 3 (optimizer order)
    keys = {i: s["exp_avg"].key for i, s in state["optimizer"]["state"].items() if isinstance(i, int)}
    assert keys == {i: f"optimizer.state.exp_avg.m.{k}" for i, k in enumerate(SHAPES)}, keys
    assert [t.key for t in state["fp32_from_fp16_params"][0]] == ["optimizer.state.fp32_param.m.w16",
                                                                 "optimizer.state.fp32_param.m.v16"]
    dist_checkpointing.save({"optimizer": state}, str(tmp_path))

    params2, model_sd2, fresh = _model_and_optimizer(1)
    loaded = dist_checkpointing.load({"optimizer": fresh.sharded_state_dict(model_sd2, is_loading=True)},
                                     str(tmp_path))
    fresh.load_state_dict(loaded["optimizer"])
    ours = [p for g in optimizer.optimizer.param_groups for p in g["params"]]
    theirs = [p for g in fresh.optimizer.param_groups for p in g["params"]]
    for mine, other in zip(ours, theirs):  # the fp32 main copies / fp32 parameters' Adam moments
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.optimizer.state[mine][name], fresh.optimizer.state[other][name]), name
    for mine, other in zip(optimizer.fp32_from_float16_groups[0], fresh.fp32_from_float16_groups[0]):
        assert torch.equal(mine, other)  # the bf16 parameters' fp32 main copies


def test_only_fp32_parameters_trainable_map_to_their_keys(single_rank):
    """The LoRA case: the bf16 base frozen (not in the optimizer), the fp32 adapters its only parameters."""
    only_fp32 = {k: v for k, v in SHAPES.items() if v[1] == torch.float32}
    _, model_sd, optimizer = _model_and_optimizer(0, only_fp32)
    state = optimizer.sharded_state_dict(model_sd, is_loading=True)  # Adam's state initialised, as on a load
    keys = {i: s["exp_avg_sq"].key for i, s in state["optimizer"]["state"].items() if isinstance(i, int)}
    assert keys == {i: f"optimizer.state.exp_avg_sq.m.{k}" for i, k in enumerate(only_fp32)}, keys
    assert state["fp32_from_fp16_params"] == [[]]


def test_fp32_adapters_stay_fp32_over_a_bf16_base(single_rank):
    from megatron.core import ModelParallelConfig
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    from mtmegatron.lora.adapter import LoRA, attach

    config = ModelParallelConfig(use_cpu_initialization=True)
    base = ColumnParallelLinear(8, 6, config=config, init_method=torch.nn.init.normal_, bias=False,
                                gather_output=False)
    attach(base, LoRA(base, "column", 4, 8.0, 0.0, "layers.0.mlp.linear_fc2", 1, fp32=True))
    with torch.no_grad():
        base.lora.lora_b.normal_(generator=torch.Generator().manual_seed(3))
    a, b = base.lora.lora_a.detach().clone(), base.lora.lora_b.detach().clone()
    base.bfloat16()
    assert base.weight.dtype == torch.bfloat16
    assert base.lora.lora_a.dtype == base.lora.lora_b.dtype == torch.float32
    assert torch.equal(base.lora.lora_a, a) and torch.equal(base.lora.lora_b, b)  # not rounded through bf16
    x = torch.randn(3, 2, 8, generator=torch.Generator().manual_seed(4)).bfloat16()
    out, _ = base(x)
    expected = x @ base.weight.t() + ((x.float() @ a.t() @ b.t()) * 2.0).bfloat16()
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)


def test_fp32_grouped_expert_adapters_over_a_bf16_base(single_rank):
    """``--lora-fp32-adapters`` on grouped-GEMM experts (lora/grouped.py): the stacked adapters stay fp32 when the
    GroupedMLP is cast to bf16, their path runs in fp32 through the grouped matmul, the layer's bf16 output is its
    fp32 merged reference within bf16 rounding (and not the base's), and the adapters' gradients are fp32."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.moe.experts import GroupedMLP

    from mtmegatron.lora import grouped

    torch.manual_seed(5)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, ffn_hidden_size=6,
                               moe_ffn_hidden_size=6, num_moe_experts=2, moe_grouped_gemm=True, add_bias_linear=False,
                               gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                               use_cpu_initialization=True)
    experts = GroupedMLP(2, config, ProcessGroupCollection.use_mpu_process_groups())
    grouped.attach(experts, ["linear_fc1", "linear_fc2"], 0, 4, 8.0, 0.0, 1, fp32=True)
    lora = experts.lora
    with torch.no_grad():
        for pair in (lora.linear_fc1, lora.linear_fc2):
            pair.lora_b.normal_(0, 0.5, generator=torch.Generator().manual_seed(3))
    saved = [p.detach().clone() for p in lora.parameters()]
    experts.bfloat16()
    assert experts.weight1.dtype == experts.weight2.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 and torch.equal(p, q) for p, q in zip(lora.parameters(), saved))
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(4)).bfloat16()
    tokens, probs = torch.tensor([2, 1]), torch.ones(3)
    assert lora.path("linear_fc1", x, tokens).dtype == torch.float32
    out, _ = experts(x, tokens, probs)
    assert out.dtype == torch.bfloat16

    def reference(with_adapters: bool) -> torch.Tensor:
        w1 = experts.weight1.float().view(2, 8, -1)
        w2 = experts.weight2.float().view(2, -1, 8)
        if with_adapters:
            w1 = w1 + lora.delta("linear_fc1").transpose(1, 2)
            w2 = w2 + lora.delta("linear_fc2").transpose(1, 2)
        rows = [x[:2].float(), x[2:].float()]
        return torch.cat([experts.activation_func_with_probs(h @ w1[e], probs[:len(h), None]) @ w2[e]
                          for e, h in enumerate(rows)]).detach()

    merged, base = reference(True), reference(False)
    assert (out.float() - merged).abs().max() <= 2e-2 * merged.abs().max()  # bf16 rounding of the base path
    assert (merged - base).abs().max() > 0.2 * merged.abs().max()  # the adapters matter
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.abs().max() > 0
               for p in lora.parameters())
