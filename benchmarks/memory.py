"""What each memory feature costs and saves, for one model and layout: ``python benchmarks/memory.py [--help]``.

One run trains the same model once per row with ``torchrun`` on ``--nproc`` ranks of ``--backend`` (default: a
small Llama-3 on the CPU backend, DP2, fp32). ``--group features`` (default; with the distributed optimizer):
plain; optimizer CPU offload at fraction 0 / 0.5 / 1.0; overlapped grad reduce + param gather off/on; recompute
none / selective / full. ``--group sharding``: DDP without and with the distributed optimizer, Megatron-FSDP with
each ``--data-parallel-sharding-strategy``, torch FSDP2 with and without resharding after forward, FSDP2 with CPU
offload (``--torch-fsdp2-cpu-offload``), the distributed optimizer with ``--optimizer-cpu-offload``, and on a model
whose activations dominate (``long seq:`` rows: sequence 1024, hidden 64) DDP without and with fine-grained
activation offloading. ``--group lora``: full fine-tuning and LoRA (``--lora-r 8 --lora-alpha 16``, the four
dense targets) of the same model with the same local layers (LoRA's), whose frozen base holds no gradient and no
optimizer state (docs/lora.md). It prints, each with its ratio to the reference row (the first row; a ``prefix: ...`` row's
is the first row of its prefix):
* step time: mean over the steps after ``--warmup``;
* peak device memory: the backend's allocator peak (``max_memory_allocated``) over the steps after ``--warmup`` on
  cuda/musa; the CPU backend has no device allocator statistics, so the column says ``n/a (cpu)`` there;
* activations saved for backward: peak bytes alive in autograd's saved tensors during a step (parameters
  excluded), counted with ``torch.autograd.graph.saved_tensors_hooks`` on every backend; this is what recompute
  trades for time (tensors that activation offloading saves through megatron-core's own hooks are not seen here);
* parameters, gathered weights, gradients and optimizer state this rank holds on the device when its optimizer
  steps (a step pre-hook: gradients reduced, before the update; benchmarks/state_bytes.py), and the bytes of those
  components on the host ("host MiB": what an offload moved there; n/a on the cpu backend, whose device is the host);
* bytes the offloaded optimizer copied per step (D2H + H2D; ``mtmegatron.training.observability.offload_stats``).
Every number is rank 0's. May assume: run from the repository (or with mtmegatron installed).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from state_bytes import COMPONENTS, state_bytes  # beside this file (sys.path[0] when run as a script)

MODEL = ["--model", "llama3", "--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "8",
         "--num-query-groups", "4", "--ffn-hidden-size", "384", "--seq-length", "128",
         "--max-position-embeddings", "128", "--vocab-size", "2048", "--micro-batch-size", "2",
         "--global-batch-size", "8", "--lr", "1e-4", "--lr-decay-style", "constant", "--mock-data",
         "--untie-embeddings-and-output-weights"]  # untied: what torch FSDP2 needs, the same for every row
DISTOPT = ["--use-distributed-optimizer"]
MFSDP = ["--use-megatron-fsdp", "--use-distributed-optimizer", "--data-parallel-sharding-strategy"]
OFFLOAD = ["--use-precision-aware-optimizer", "--optimizer-cpu-offload", "--optimizer-offload-fraction"]
FSDP2 = ["--use-torch-fsdp2"]
# a model whose activations dominate (long sequence, small hidden size) for activation offloading; later flags win
LONG_SEQ = ["--seq-length", "1024", "--max-position-embeddings", "1024", "--hidden-size", "64",
            "--num-attention-heads", "4", "--num-query-groups", "2", "--ffn-hidden-size", "192",
            "--micro-batch-size", "1"]
ACTIVATION_OFFLOAD = ["--fine-grained-activation-offloading", "--offload-modules", "attn_norm", "qkv_linear",
                      "core_attn", "attn_proj", "mlp_norm", "--min-offloaded-tensor-size", "1024"]
GROUPS = {
    "features": [
        ("plain", DISTOPT),
        ("offload 0.0", DISTOPT + OFFLOAD + ["0.0"]),
        ("offload 0.5", DISTOPT + OFFLOAD + ["0.5"]),
        ("offload 1.0", DISTOPT + OFFLOAD + ["1.0"]),
        ("overlap off", DISTOPT),  # the same flags as plain: the run-to-run spread of the step time
        ("overlap on", DISTOPT + ["--overlap-grad-reduce", "--overlap-param-gather"]),
        ("recompute none", DISTOPT),
        ("recompute selective", DISTOPT + ["--recompute-granularity", "selective", "--recompute-modules",
                                           "core_attn", "mlp"]),
        ("recompute full", DISTOPT + ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                      "--recompute-num-layers", "1"]),
    ],
    "sharding": [
        ("DDP", []),
        ("DDP + distributed optimizer", DISTOPT),
        *((f"Megatron-FSDP {s}", MFSDP + [s]) for s in ("no_shard", "optim", "optim_grads", "optim_grads_params")),
        ("torch FSDP2", FSDP2),
        ("torch FSDP2, no reshard after forward", FSDP2 + ["--torch-fsdp2-no-reshard-after-forward"]),
        ("torch FSDP2 + CPU offload", FSDP2 + ["--torch-fsdp2-cpu-offload"]),
        ("DDP + distributed optimizer + CPU offload", DISTOPT + OFFLOAD + ["1.0"]),
        ("long seq: DDP", LONG_SEQ),  # ratios of a "long seq:" row are to this row
        ("long seq: DDP + activation offloading", LONG_SEQ + ACTIVATION_OFFLOAD),
    ],
    "lora": [
        ("full fine-tuning", ["--transformer-impl", "local"]),
        ("LoRA r 8", ["--transformer-impl", "local", "--lora-r", "8", "--lora-alpha", "16"]),
    ],
}


class SavedActivations:
    """Peak bytes of tensors autograd keeps for backward (parameters and other leaves excluded)."""

    def __init__(self):
        self.live = self.peak = 0

    def pack(self, tensor):
        if tensor.is_leaf and tensor.requires_grad:
            return tensor
        size = tensor.untyped_storage().nbytes()
        self.live += size
        self.peak = max(self.peak, self.live)
        return _Held(tensor, size, self)

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held


class _Held:
    __slots__ = ("tensor", "size", "owner")

    def __init__(self, tensor, size, owner):
        self.tensor, self.size, self.owner = tensor, size, owner

    def __del__(self):
        self.owner.live -= self.size


def worker(pretrain_args: list[str], iters: int, warmup: int, out: str) -> None:
    """One row, inside torchrun: build the run as pretrain does, train ``iters`` steps, write rank 0's numbers."""
    import torch

    import mtmegatron
    from mtmegatron.backends import select_backend
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.data.section import GptData
    from mtmegatron.training.data import TextReader, build_mock_dataset
    from mtmegatron.training.observability.offload_stats import inner_optimizers, offload_stats
    from mtmegatron.training.overlap import ParamGather
    from mtmegatron.training.section import Parallel
    from mtmegatron.training.setup import build, init_distributed
    from megatron.core import parallel_state
    from mtmegatron.training.train_step import StepValues, train_step

    args = parse_args(pretrain_args + ["--train-iters", str(iters)])
    backend = select_backend(args.backend)
    mtmegatron.activate(backend)
    init_distributed(args, backend)
    model, optimizer, scheduler, _ = build(args)
    dataset = build_mock_dataset(GptData.of(args), (iters + 1) * args.global_batch_size)
    reader = TextReader.of(args, parallel_state.get_data_parallel_world_size())
    iterators = [reader(dataset, parallel_state.get_data_parallel_rank(), 0) for _ in model]
    device_module = None if backend.device_type == "cpu" else backend.device_module()
    params = ParamGather(model, Parallel.of(args))
    values = StepValues.of(args)
    params.start()
    saved = SavedActivations()
    # what the rank holds when its optimizer steps (gradients reduced, before the update; FSDP2 frees its
    # gradients after the step), on the device and on the host
    at_step = {}

    def count_at_step(*_):
        at_step["device"] = state_bytes(model, optimizer, None if device_module is None else backend.device_type)
        at_step["host"] = None if device_module is None else state_bytes(model, optimizer, "cpu")

    for inner in inner_optimizers(optimizer):
        inner.register_step_pre_hook(count_at_step)
    losses = []
    times, copied = [], []
    for iteration in range(1, iters + 1):
        before = offload_stats(optimizer)
        if iteration == warmup + 1 and device_module is not None:
            device_module.reset_peak_memory_stats()
        torch.distributed.barrier()
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            stats = train_step(iterators, model, optimizer, scheduler, values, iteration)
        if device_module is not None:
            device_module.synchronize()
        elapsed = time.perf_counter() - t0
        params.after_step(not stats["skipped"])
        losses.append(stats["loss"])
        after = offload_stats(optimizer)
        if iteration > warmup:
            times.append(elapsed)
            copied.append(after["d2h_bytes"] + after["h2d_bytes"] - before["d2h_bytes"] - before["h2d_bytes"])
    params.finish()
    final = offload_stats(optimizer)
    if torch.distributed.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({
                "step_s": sum(times) / len(times),
                "peak_device_bytes": None if device_module is None else device_module.max_memory_allocated(),
                "saved_activation_bytes": saved.peak,
                "device_state_bytes": final["device_state_bytes"],
                "host_state_bytes": final["host_state_bytes"],
                "copied_bytes_per_step": sum(copied) / len(copied),
                "loss": stats["loss"],
                "losses": losses,
                **{f"{c}_bytes": at_step["device"][c] for c in COMPONENTS},
                "host_bytes": None if at_step["host"] is None else sum(at_step["host"].values()),
            }, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reference(name: str, names: list[str]) -> str:
    """The row ``name``'s ratios are to: the first row with its ``prefix:`` (e.g. "long seq: DDP"), else the first."""
    prefix = name.split(": ", 1)[0] + ": " if ": " in name else None
    return next((n for n in names if prefix and n.startswith(prefix)), names[0])


def _mib(n) -> str:
    return "n/a (cpu)" if n is None else f"{n / 2**20:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                epilog="\n".join(f"--group {g}: " + ", ".join(n for n, _ in rows)
                                                 for g, rows in GROUPS.items()))
    p.add_argument("--group", default="features", choices=list(GROUPS), help="which rows (default: features)")
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "musa"])
    p.add_argument("--nproc", type=int, default=2, help="ranks (data-parallel unless --extra says otherwise)")
    p.add_argument("--iters", type=int, default=6, help="training steps per row")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the timing")
    p.add_argument("--rows", nargs="*", default=None, help="only these rows (names as in the table)")
    p.add_argument("--extra", default="", help="more pretrain flags for every row, e.g. \"--bf16 --num-layers 16\"")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.worker:
        worker(rest, args.iters, args.warmup, args.out)
        return 0
    if args.warmup >= args.iters:
        p.error("--warmup must be smaller than --iters")
    rows = [(n, f) for n, f in GROUPS[args.group] if args.rows is None or n in args.rows]
    results, failed = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, flags) in enumerate(rows, 1):
            out = os.path.join(tmp, f"row{i}.json")
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}",
                   f"--master_port={_free_port()}", os.path.abspath(__file__), "--worker", "--out", out,
                   "--iters", str(args.iters), "--warmup", str(args.warmup),
                   "--backend", args.backend, *MODEL, *args.extra.split(), *flags]
            print(f"[{i}/{len(rows)}] {name} ...", end=" ", flush=True)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
            if proc.returncode != 0 or not os.path.exists(out):
                errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln] or proc.stderr.splitlines()[-1:]
                failed[name] = errors[-1].strip()[-160:] if errors else f"exit status {proc.returncode}"
                print(f"failed: {failed[name]}", flush=True)
                continue
            with open(out) as f:
                results[name] = json.load(f)
            print(f"{time.perf_counter() - t0:.0f} s (step {results[name]['step_s'] * 1000:.0f} ms)", flush=True)
    if not results:
        print("every row failed", file=sys.stderr)
        return 1
    ratio = lambda v, ref: "" if v is None else f" ({v / ref:.2f})" if ref else " (-)"  # noqa: E731
    header = ("row", "step ms (x ref)", "peak device MiB (x ref)", "saved act. MiB (x ref)",
              *(f"{c} MiB (x ref)" for c in COMPONENTS), "host MiB", "copied MiB/step", "last loss")
    table = [header]
    for name, r in results.items():
        ref = results[reference(name, list(results))]
        table.append((name, f"{r['step_s'] * 1000:.0f}{ratio(r['step_s'], ref['step_s'])}",
                      f"{_mib(r['peak_device_bytes'])}{ratio(r['peak_device_bytes'], ref['peak_device_bytes'])}",
                      f"{_mib(r['saved_activation_bytes'])}"
                      f"{ratio(r['saved_activation_bytes'], ref['saved_activation_bytes'])}",
                      *(f"{_mib(r[f'{c}_bytes'])}{ratio(r[f'{c}_bytes'], ref[f'{c}_bytes'])}"
                        for c in COMPONENTS), _mib(r["host_bytes"]), _mib(r["copied_bytes_per_step"]),
                      f"{r['loss']:.4f}"))
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    print(f"\nbackend {args.backend}, {args.nproc} ranks, {args.iters} steps per row ({args.warmup} warm-up), rank 0; "
          f"state by component on the device at the last optimizer step; x ref = ratio to the row "
          f"'{next(iter(results))}' (a 'prefix: ...' row: to the first row of that prefix):")
    for j, row in enumerate(table):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |")
        if j == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for name, why in failed.items():
        print(f"{name}: failed ({why})")
    if args.backend == "cpu":
        print("peak device memory: not measurable on the cpu backend (no device allocator); there the device is the "
              "host: every component counts as on the device and 'host MiB' is n/a")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
