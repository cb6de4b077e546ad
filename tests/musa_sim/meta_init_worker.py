"""Worker for test_meta_init_memory.py: one rank of a 4-rank ``torchrun`` on the simulated MUSA device that sets
up the tiny Llama-3 under Megatron-FSDP (optim_grads_params, DP4) through pretrain's own pieces (flags ->
``init_distributed`` -> ``setup.build``), with ``--init-model-with-meta-device`` when ``argv[2]`` is ``meta``, and
writes into the directory ``argv[1]`` what the simulator counted on this rank's device: the peak of the set-up
(``max_memory_allocated``), what stays allocated after it, and the whole model's parameter bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import mtmegatron
from mtmegatron.config.arguments import parse_args
from mtmegatron.training.setup import build, init_distributed

FLAGS = ["--backend", "musa", "--model", "llama3", "--num-layers", "4", "--hidden-size", "64",
         "--num-attention-heads", "4", "--num-query-groups", "2", "--ffn-hidden-size", "128", "--seq-length", "32",
         "--max-position-embeddings", "32", "--vocab-size", "256", "--micro-batch-size", "1",
         "--global-batch-size", "4", "--mock-data", "--train-iters", "1", "--use-megatron-fsdp",
         "--use-distributed-optimizer", "--data-parallel-sharding-strategy", "optim_grads_params"]


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    backend = mtmegatron.activate("musa")
    args = parse_args(FLAGS + (["--init-model-with-meta-device"] if mode == "meta" else []))
    init_distributed(args, backend)
    device = backend.device_module()
    device.synchronize()
    device.reset_peak_memory_stats()
    before = device.memory_allocated()
    model, _, _, _ = build(args)
    device.synchronize()
    rank = torch.distributed.get_rank()
    # every parameter's full size: Megatron-FSDP's optimizer-facing parameters are DTensors of the whole tensor
    model_bytes = sum(p.numel() * p.element_size() for p in model[0].module.module.parameters())
    report = {"peak": device.max_memory_allocated() - before, "after": device.memory_allocated() - before,
              "model_bytes": model_bytes}
    (out / f"{mode}_rank{rank}.json").write_text(json.dumps(report))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
