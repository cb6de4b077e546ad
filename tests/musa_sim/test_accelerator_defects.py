"""One test per host/device defect the simulated MUSA device exposed, each small enough to name its cause (the
lane in test_lane.py shows them end to end, but there the first one hides the rest). Each runs in a subprocess
on the simulated device, one rank, ``--backend musa``; each failed on the code before the fix (the note on the
accelerator-path issue records the run).
"""

from __future__ import annotations

import textwrap

import pytest

from helpers.musa_sim import run_python_in_sim, sim_env
from helpers.pretrain_runner import free_port

pytestmark = pytest.mark.musa_sim

ONE_RANK = """
import os
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
import torch
import mtmegatron
from mtmegatron.config.arguments import parse_args
backend = mtmegatron.activate("musa")
args = parse_args(["--backend", "musa", "--mock-data", "--seed", "1234", "--tensor-model-parallel-size", "1"])
"""


def _run(body: str) -> str:
    code = ONE_RANK.format(port=free_port()) + textwrap.dedent(body)
    return run_python_in_sim(code, env=sim_env()).stdout


def test_model_parameters_and_their_attributes_move_to_the_device():
    """Defect 1: the model stayed on the host (and a plain Module.to would drop megatron's parameter attributes)."""
    out = _run("""
        from mtmegatron.training.setup import init_distributed, build
        init_distributed(args, backend)
        model, optimizer, _, _ = build(args)
        params = list(model[0].parameters())
        print("devices", sorted({str(p.device) for p in params}))
        print("tp-marked", sum(bool(getattr(p, "tensor_model_parallel", False)) for p in params))
    """)
    assert "devices ['musa:0']" in out, out
    assert "tp-marked 0" not in out, out


def test_tensor_type_names_answer_megatron_core_cuda_checks():
    """Defect 2: megatron-core compares Tensor.type() with 'torch.cuda.*Tensor' (grad clipping asserts)."""
    out = _run("""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
        p = torch.nn.Parameter(torch.ones(4, device="musa"))
        p.grad = torch.full((4,), 2.0, device="musa")
        clip_grad_by_total_norm_fp32([p], max_norm=1.0, total_norm=4.0)
        print("type", p.type(), torch.zeros(1, dtype=torch.bfloat16, device="musa").type())
        print("clipped", all(abs(g - 0.5) < 1e-5 for g in p.grad.tolist()))  # 2 * max_norm / (4 + 1e-6)
    """)
    assert "type torch.cuda.FloatTensor torch.cuda.BFloat16Tensor" in out, out
    assert "clipped True" in out, out


def test_seed_fixes_the_host_initialisation():
    """Defect 3: only the device RNG was seeded; master weights come from the host RNG."""
    draws = []
    for noise in (0, 7):
        out = _run(f"""
            torch.randn({noise})  # a different host RNG history before setup
            from mtmegatron.training.setup import init_distributed
            init_distributed(args, backend)
            print("draw", torch.randn(3).tolist())
        """)
        draws.append([line for line in out.splitlines() if line.startswith("draw")])
    assert draws[0] == draws[1] and draws[0], draws


def test_mtp_loss_reduction_uses_a_device_tensor():
    """Defect 4: the MTP loss statistic was all-reduced from a host tensor (MCCL/NCCL refuse it)."""
    out = _run("""
        from mtmegatron.training.setup import init_distributed
        from mtmegatron.models.aux_losses import _mtp_loss
        init_distributed(args, backend)
        args.num_microbatches = 1
        print("mtp", _mtp_loss(args))
    """)
    assert "mtp 0.0" in out, out


def test_bf16_outputs_return_to_fp32_whatever_the_import_order():
    """Defect 5: megatron-core imported before torchada kept the real CUDA legacy types, so Float16Module never
    cast MUSA outputs back to fp32."""
    code = ("import megatron.core.transformer.module\n"  # megatron-core first, as a user script may do
            + ONE_RANK.format(port=free_port())
            + "from megatron.core.transformer.module import float16_to_fp32\n"
            + "print('dtype', float16_to_fp32(torch.ones(2, dtype=torch.bfloat16, device='musa')).dtype)\n")
    out = run_python_in_sim(code, env=sim_env()).stdout
    assert "dtype torch.float32" in out, out


def test_checkpoint_restores_the_device_generator(tmp_path):
    """Defect 6: checkpoints saved the host and tracker RNG only, so dropout outside the tracker (the device's
    default generator) resumed from another state. Save, draw, load, draw again: the draws repeat."""
    out = _run(f"""
        from mtmegatron.training.setup import init_distributed, build
        from mtmegatron.training.checkpoint import checkpointing
        args = parse_args(["--backend", "musa", "--mock-data", "--num-layers", "1", "--hidden-size", "16",
                           "--num-attention-heads", "2", "--num-query-groups", "2", "--ffn-hidden-size", "32",
                           "--seq-length", "8", "--max-position-embeddings", "8", "--vocab-size", "64",
                           "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1",
                           "--lr", "1e-3"])
        init_distributed(args, backend)
        model, optimizer, scheduler, _ = build(args)
        checkpointing.save("{tmp_path}", 1, model, optimizer, scheduler, args)
        first = torch.rand(3, device="musa").tolist()
        torch.rand(5, device="musa")
        args.no_load_optim = True  # saved before any step: no optimizer state yet
        checkpointing.load("{tmp_path}", model, optimizer, scheduler, args)
        print("same", torch.rand(3, device="musa").tolist() == first)
    """)
    assert "same True" in out, out
