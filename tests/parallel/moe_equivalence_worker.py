"""Worker for test_moe_gloo.py: MoE (sequential experts) under EP2 and EP2xTP2 on gloo vs a single-rank model.

Launched with ``torchrun --nproc_per_node 4 moe_equivalence_worker.py OUT.json [CASE ...]``. Every rank first builds the
reference (TP1, EP1) GPTModel from a fixed seed and records, for each data-parallel split of the global batch
it will be compared against, the per-step loss and the step-0 gradients (mean over the DP micro-batches, as
DDP computes them). Then, for each case (dispatcher x layout), it rebuilds parallel state, loads the same full
weights sharded for its rank, trains with megatron's DistributedDataParallel + finalize_model_grads and SGD,
and compares: DP-averaged loss at every step, and every local gradient (main_grad) at step 0 against the
matching shard of the reference gradient. Rank 0 writes the worst relative differences to OUT.json.
"""

from __future__ import annotations

import json
import re
import sys

import torch
import torch.nn.functional as F

import mtmegatron

NUM_STEPS = 3
GLOBAL_BATCH, SEQ_LEN, VOCAB = 4, 16, 128
NUM_EXPERTS, EP = 4, 2
# (tp, dispatcher, linear biases): biases are Megatron-LM's default (no --disable-bias-linear); megatron-core
# allows them in experts only at expert-TP 1 (so the bias case runs TP2 x EP2 with ETP1), and the reference
# (TP1, EP1) model with them needs the patch moe_expert_bias_without_ep
CASES = [(1, "alltoall", False), (1, "allgather", False), (2, "alltoall", False), (2, "allgather", False),
         (2, "alltoall", True)]
LR = 0.5


def build_model(tp: int, ep: int, dispatcher: str, bias: bool):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, moe_ffn_hidden_size=96,
        num_moe_experts=NUM_EXPERTS, moe_router_topk=2, moe_token_dispatcher_type=dispatcher,
        moe_aux_loss_coeff=1e-2, use_cpu_initialization=True, normalization="RMSNorm",
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=bias, hidden_dropout=0.0,
        attention_dropout=0.0, tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1 if bias else tp, sequence_parallel=tp > 1,
    )
    spec = get_gpt_layer_local_spec(num_experts=NUM_EXPERTS, moe_grouped_gemm=False)
    return GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ_LEN)


def init_parallel(tp: int, ep: int, etp: int | None = None) -> None:
    from megatron.core import parallel_state, tensor_parallel

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                                             expert_tensor_parallel_size=etp)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)


def global_batch():
    gen = torch.Generator().manual_seed(42)
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ_LEN + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def forward_loss(model, tokens, labels):
    position_ids = torch.arange(SEQ_LEN).unsqueeze(0).expand_as(tokens)
    mask = torch.triu(torch.ones(1, 1, SEQ_LEN, SEQ_LEN, dtype=torch.bool), diagonal=1)
    return model(tokens, position_ids, mask, labels=labels).float().mean()


def reference_run(model, num_dp: int):
    """Losses per step and step-0 grads when the global batch is split over ``num_dp`` DP ranks."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    tokens, labels = global_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], None
    # The aux-loss gradient bypasses the returned loss; scale it like the main loss (as DDP's 1/dp does).
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(1.0 / num_dp))
    for step in range(NUM_STEPS):
        optimizer.zero_grad()
        step_loss = 0.0
        for mb_tokens, mb_labels in zip(tokens.chunk(num_dp), labels.chunk(num_dp)):
            loss = forward_loss(model, mb_tokens, mb_labels) / num_dp
            loss.backward()
            step_loss += loss.item()
        losses.append(step_loss)
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    return losses, grads


def shard_for_rank(full: dict, name: str, param, gated: bool) -> torch.Tensor:
    """The piece of the full (TP1, EP1) tensor that rank-local parameter ``name`` holds."""
    from megatron.core import parallel_state as ps

    match = re.match(r"(.*\.local_experts\.)(\d+)(\..*)", name)
    if match:
        num_local = NUM_EXPERTS // ps.get_expert_model_parallel_world_size()
        index = ps.get_expert_model_parallel_rank() * num_local + int(match.group(2))
        tensor = full[f"{match.group(1)}{index}{match.group(3)}"]
        tp_rank, tp_size = ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()
    else:
        tensor = full[name]
        tp_rank, tp_size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    if getattr(param, "tensor_model_parallel", False) and tp_size > 1:
        dim = param.partition_dim
        if gated and name.endswith(("linear_fc1.weight", "linear_fc1.bias")):  # [gate; up], each split over TP
            tensor = torch.cat([half.chunk(tp_size, dim)[tp_rank] for half in tensor.chunk(2, dim)], dim)
        else:
            tensor = tensor.chunk(tp_size, dim)[tp_rank]
    assert tensor.shape == param.shape, (name, tensor.shape, param.shape)
    return tensor


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def case_name(tp: int, dispatcher: str, bias: bool) -> str:
    return f"ep{EP}_tp{tp}_{dispatcher}" + ("_bias" if bias else "")


def parallel_run(tp: int, dispatcher: str, bias: bool, full_weights: dict, ref_losses, ref_grads) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed import finalize_model_grads

    init_parallel(tp, EP, 1 if bias else tp)
    model = build_model(tp, EP, dispatcher, bias)
    gated = model.config.gated_linear_unit
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(shard_for_rank(full_weights, name, param, gated))
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), module=model)
    params = dict(model.named_parameters())
    optimizer = torch.optim.SGD(params.values(), lr=LR)

    dp_group = ps.get_data_parallel_group()
    num_dp, dp_rank = dp_group.size(), ps.get_data_parallel_rank()
    tokens, labels = global_batch()
    tokens, labels = tokens.chunk(num_dp)[dp_rank], labels.chunk(num_dp)[dp_rank]

    loss_diffs, grad_diff, worst_param, num_compared = [], 0.0, None, 0
    for step in range(NUM_STEPS):
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        loss = forward_loss(ddp, tokens, labels)
        loss.backward()
        finalize_model_grads([ddp])
        mean_loss = loss.detach().clone()
        torch.distributed.all_reduce(mean_loss, group=dp_group)
        mean_loss /= num_dp
        loss_diffs.append(abs(mean_loss.item() - ref_losses[step]) / abs(ref_losses[step]))
        for name, param in params.items():
            param.grad = param.main_grad
            if step == 0:
                diff = rel_diff(param.main_grad, shard_for_rank(ref_grads, name, param, gated))
                num_compared += param.numel()
                if diff > grad_diff:
                    grad_diff, worst_param = diff, name
        optimizer.step()

    worst = torch.tensor([max(loss_diffs), grad_diff], dtype=torch.float64)
    torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MAX)
    compared = torch.tensor([num_compared])
    torch.distributed.all_reduce(compared)
    return {
        "max_rel_loss_diff": worst[0].item(), "max_rel_grad_diff": worst[1].item(),
        "rank0_worst_grad_param": worst_param, "ref_losses": ref_losses,
        "grad_elements_compared_all_ranks": compared.item(),
    }


def main(out_path: str, only: list[str]) -> None:
    mtmegatron.activate("cpu")
    torch.distributed.init_process_group("gloo")

    full_weights, references = {}, {}
    for bias in sorted({bias for _, _, bias in CASES}):
        init_parallel(1, 1)
        torch.manual_seed(0)
        reference = build_model(1, 1, "alltoall", bias)
        with torch.no_grad():  # every rank must hold rank 0's weights, whatever the RNG did
            for name, param in reference.named_parameters():
                if name.endswith(".bias"):  # megatron-core zeroes biases: make them count from step 0
                    param.normal_(0.0, 0.1)
                torch.distributed.broadcast(param, src=0)
        full_weights[bias] = {n: p.detach().clone() for n, p in reference.state_dict(keep_vars=True).items()
                              if isinstance(p, torch.nn.Parameter)}
        for num_dp in sorted({torch.distributed.get_world_size() // tp for tp, _, b in CASES if b == bias}):
            with torch.no_grad():
                for name, param in reference.named_parameters():
                    param.copy_(full_weights[bias][name])
            references[bias, num_dp] = reference_run(reference, num_dp)

    from mtmegatron import patches

    results = {"_patches_applied": [patch.name for patch in patches.applied()],
               "_reference_num_params": {str(bias).lower(): sum(p.numel() for p in weights.values())
                                         for bias, weights in full_weights.items()}}
    for tp, dispatcher, bias in CASES:
        key = case_name(tp, dispatcher, bias)
        if only and key not in only:
            continue
        num_dp = torch.distributed.get_world_size() // tp
        results[key] = parallel_run(tp, dispatcher, bias, full_weights[bias], *references[bias, num_dp])
        if torch.distributed.get_rank() == 0:
            print(key, json.dumps(results[key]), flush=True)

    if torch.distributed.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])  # optional: names of the cases to run (default: all)
