"""Selective recompute of a module that returns one of its own Parameters (patches/checkpoint_function_passthrough_params.py).

megatron-core's MLP built with a bias (Megatron-LM's default ``--add-bias-linear``) returns ``(output, fc2.bias)``;
recomputed through ``tensor_parallel.checkpoint`` the bias Parameter became the CheckpointFunction's output, its
``grad_fn`` the Function's own node, and backward re-entered the Function without end (issue 35:
``--recompute-modules mlp`` ran no iteration in 180 s). In-process: the Parameter stays a leaf and the gradients
equal the un-recomputed function's (without the patch the first assert fails, before any backward could hang).
One-rank runs with Megatron-LM's defaults (biased MLP, dropout 0.1/0.1): the dense modules recomputed (core_attn,
layernorm, mlp) train the losses of the run without recompute. Measured by hand, the same, every loss equal: moe,
moe_act (--moe-grouped-gemm), shared_experts (mixtral preset) and mla_up_proj (--multi-latent-attention).
"""

from __future__ import annotations

import torch

from helpers.pretrain_runner import TINY, run_pretrain


def test_recomputed_function_returning_a_parameter_keeps_it_a_leaf(activated):
    from megatron.core.tensor_parallel.random import CheckpointFunction, model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(7, tp_rank=0, ep_rank=0, etp_rank=0)  # CheckpointFunction copies the tracker
    device = activated.device(0)
    linear = torch.nn.Linear(8, 8).to(device)
    bias = torch.nn.Parameter(torch.randn(8, device=device))
    x = torch.randn(4, 8, device=device, requires_grad=True)

    def function(inp):
        return torch.nn.functional.gelu(linear(inp)), bias

    out, returned = CheckpointFunction.apply(function, False, x)
    assert bias.is_leaf and bias.grad_fn is None, "the Parameter took the CheckpointFunction's node as grad_fn"
    assert torch.equal(returned, bias) and returned.grad_fn is not None
    ((out + returned) ** 2).sum().backward()
    recomputed = [t.grad.clone() for t in (x, linear.weight, linear.bias, bias)]

    for t in (x, linear.weight, linear.bias, bias):
        t.grad = None
    out, returned = function(x)
    ((out + returned) ** 2).sum().backward()
    assert all(torch.equal(a, t.grad) for a, t in zip(recomputed, (x, linear.weight, linear.bias, bias)))


def test_recompute_modules_of_a_biased_dense_model_train_the_same_losses(tmp_path):
    base = [a for a in TINY]
    del base[base.index("--model"):base.index("--model") + 2]  # Megatron-LM's defaults: GeLU MLP with biases
    base[base.index("--hidden-dropout") + 1] = "0.1"
    base[base.index("--attention-dropout") + 1] = "0.1"
    base += ["--train-iters", "3", "--num-workers", "0"]
    _, plain = run_pretrain(1, base, tmp_path / "plain")
    _, recomputed = run_pretrain(1, base + ["--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                                            "layernorm", "mlp"], tmp_path / "recomputed", timeout=240)
    assert [r["iteration"] for r in recomputed] == [1, 2, 3]
    assert [r["loss"] for r in recomputed] == [r["loss"] for r in plain]  # measured: equal
