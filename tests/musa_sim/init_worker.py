"""Worker for test_device_init.py: builds a tiny Llama-3 on one rank of ``--backend <argv[1]>`` several times and
writes what the test checks into the directory ``argv[2]``.

Each build goes through pretrain's own pieces (flags -> ``init_distributed`` seeding -> ``transformer_config`` ->
``build_model_chunks``), without ``setup.build``'s move to the device, so a parameter found on the device was
born there. A TorchDispatchMode records every floating-point tensor any aten op produces on the host during the
build: a host tensor shaped like a weight is the host copy the device init must not make.
Builds: device init with --seed 1234 (twice) and 1235, and --use-cpu-initialization with 1234 (``--backend cpu``:
only the last, the cpu backend always builds on the host). Runs as LOCAL_RANK 1, so the device is ``musa:1``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import mtmegatron  # noqa: E402
from mtmegatron.models.gpt import build_model_chunks, transformer_config  # noqa: E402
from mtmegatron.models.initialization import rank_seed  # noqa: E402
from mtmegatron.config.arguments import parse_args  # noqa: E402
from mtmegatron.training.setup import init_distributed, seed_everything  # noqa: E402

FLAGS = ["--model", "llama3", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
         "--num-query-groups", "2", "--ffn-hidden-size", "128", "--seq-length", "32", "--max-position-embeddings",
         "32", "--vocab-size", "256", "--micro-batch-size", "1", "--global-batch-size", "1", "--mock-data"]


class HostTensors(TorchDispatchMode):
    """Shapes of the floating-point host tensors that aten ops produce while active."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.is_floating_point():
                self.shapes.append(tuple(t.shape))
        return out


def build(args, seed: int, host: bool) -> dict:
    args.seed, args.use_cpu_initialization = seed, (True if host else None)
    seed_everything(rank_seed(args))
    recorder = HostTensors()
    with recorder:
        chunk = build_model_chunks(args, transformer_config(args))[0]
    params = dict(chunk.named_parameters())
    weight_shapes = {tuple(p.shape) for p in params.values() if p.dim() >= 2}
    return {"devices": sorted({str(p.device) for p in params.values()}),
            "on_the_host": sorted(name for name, p in params.items() if p.device.type == "cpu"),
            "host_weight_copies": sum(shape in weight_shapes for shape in recorder.shapes),
            "weights": {name: p.detach().to("cpu") for name, p in params.items()}}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    backend_name, out = sys.argv[1], Path(sys.argv[2])
    backend = mtmegatron.activate(backend_name)
    args = parse_args(["--backend", backend_name, *FLAGS])
    init_distributed(args, backend)
    host = build(args, 1234, host=True)
    torch.save(host["weights"], out / f"{backend_name}_host_init.pt")
    report = {"host": {k: v for k, v in host.items() if k != "weights"}}
    if backend_name != "cpu":
        first, again, other = (build(args, seed, host=False) for seed in (1234, 1234, 1235))
        report["device"] = {k: v for k, v in first.items() if k != "weights"}
        report["same_seed_same_weights"] = same(first["weights"], again["weights"])
        report["other_seed_other_weights"] = not same(first["weights"], other["weights"])
        report["device_init_differs_from_host_init"] = not same(first["weights"], host["weights"])
        report["num_weights"] = len(first["weights"])
    (out / f"{backend_name}_report.json").write_text(json.dumps(report))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
