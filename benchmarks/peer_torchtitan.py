"""torchtitan's row of benchmarks/step.py: torchtitan 0.3's Llama-3 model (``torchtitan.models.llama3``: its
TransformerBlock, GQA attention through its FlexAttention, RMSNorm, SwiGLU FFN, untied output) built with the same
shapes as the row it is compared with, and torchtitan's training step on one device without its data pipeline,
tokenizer, checkpointer or config manager: meta-device build, ``init_weights``, fp32 parameters under bf16
autocast (what torchtitan does on one GPU, where FSDP's mixed precision is off), torchtitan's
``cross_entropy_loss``, gradient accumulation over the global batch's micro-batches, gradient clipping and AdamW
(fused on a GPU, torchtitan's default implementation). Random tokens; the median step time after ``warmup`` steps
and the peak memory (device allocator on a GPU, process RSS on the cpu).

Where torchtitan comes from (``find_source``): $MTM_TORCHTITAN, else .device/peers/torchtitan (scripts/device_bundle.sh
unpacks the torchtitan 0.3.0 wheel and the pure-Python packages its model imports need: spmd_types,
torch_checkpointing, tyro, docstring_parser, typeguard). Its async expert-parallel kernels module imports Triton at
the top; where Triton is missing (a CPU box) that module is replaced by one that refuses (no expert parallelism is
used). The ffn width is ours (``--ffn-hidden-size``), not torchtitan's ``compute_ffn_hidden_dim`` of the same model.
Usage (as a worker; step.py calls ``run``): python benchmarks/peer_torchtitan.py SRC BACKEND ITERS WARMUP OUT.json
       -- <mtmegatron flags of the model>
May assume: mtmegatron installed (its flag parser gives the shapes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / ".device/peers/torchtitan"
_ASYNC_EP_KERNELS = ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
                     "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                     "reduce_topk_slots_kernel", "topk_scores_grad_kernel")


def find_source() -> tuple[str | None, str]:
    given = os.environ.get("MTM_TORCHTITAN")
    for where in ([given] if given else []) + [str(BUNDLED)]:
        if (Path(where) / "torchtitan/models/llama3/model.py").is_file():
            return where, where
    return None, (f"torchtitan is not here: {BUNDLED} holds no torchtitan (scripts/device_bundle.sh unpacks "
                  "torchtitan 0.3.0 there) and $MTM_TORCHTITAN is not set")


def flex_backward_problem(backend: str) -> str | None:
    """Why FlexAttention cannot train on ``backend`` (torch's own answer on a tiny input), or None. torchtitan 0.3's
    language models attend only through FlexAttention or varlen (its get_attention_config refuses sdpa)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 2, 16, 8, device=backend, requires_grad=True)
    try:
        flex_attention(q, q, q).sum().backward()
    except Exception as e:  # noqa: BLE001 -- the reason is the report
        return f"{type(e).__name__}: {e}"
    return None


def run(flags: list[str], backend: str, iters: int, warmup: int, threads: int, timeout: int = 1800) -> dict:
    """One torchtitan process; {"ms", "peak_gib", "fusions"}, {"error"}, or {"skip": why it cannot run here}."""
    src, why = find_source()
    if src is None:
        return {"error": why}
    if backend == "cpu":  # a GPU compiles FlexAttention with Triton; the cpu's torch may refuse its backward
        problem = flex_backward_problem(backend)
        if problem:  # not a failure of the run: the row says why it cannot exist on this backend
            return {"skip": "torchtitan 0.3's Llama-3 attends through FlexAttention (its language models refuse "
                            f"sdpa), which cannot train here: {problem}"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        cmd = [sys.executable, os.path.abspath(__file__), src, backend, str(iters), str(warmup), str(out), "--",
               *flags]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"torchtitan's step did not finish in {timeout}s"}
        if done.returncode != 0 or not out.is_file():
            lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
            why = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "?")
            return {"error": f"torchtitan failed ({done.returncode}): {why.strip()}"}
        result = json.loads(out.read_text())
    return {"ms": statistics.median(result["step_ms"][warmup:]), "peak_gib": result["peak_gib"],
            "fusions": f"torchtitan {result['version']}, {result['attention']} attention"}


def _stub_async_ep_kernels() -> None:
    name = "torchtitan.distributed.minimal_async_ep.kernels"
    stub = types.ModuleType(name)

    def refuse(*args, **kwargs):
        raise RuntimeError("torchtitan's async expert-parallel kernels need Triton (not installed)")

    for kernel in _ASYNC_EP_KERNELS:
        setattr(stub, kernel, refuse)
    sys.modules[name] = stub


def build_model(args, device):
    """torchtitan's Llama3Model of ``args``' shapes on ``device`` (its meta-device build and init_weights)."""
    import torch
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import (_EMBEDDING_INIT, _NORM_INIT, Llama3Model, _build_llama3_layers,
                                          _output_linear_init)

    dim, vocab = args.hidden_size, args.padded_vocab_size
    config = Llama3Model.Config(
        dim=dim, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=_build_llama3_layers(
            fuse_qkv=True, n_layers=args.num_layers, dim=dim, n_heads=args.num_attention_heads,
            n_kv_heads=args.num_query_groups, hidden_dim=args.ffn_hidden_size,
            rope=ComplexRoPE.Config(dim=dim // args.num_attention_heads, max_seq_len=args.seq_length,
                                    theta=args.rotary_base, scaling="none"),
            attn_backend="flex"),
    )
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    model.train()
    return model


def worker(src: str, backend: str, iters: int, warmup: int, out: str, flags: list[str]) -> None:
    sys.path.insert(0, src)
    if importlib.util.find_spec("triton") is None:
        _stub_async_ep_kernels()
    import torch
    from mtmegatron.config.arguments import parse_args
    from torchtitan.components.loss import cross_entropy_loss

    args = parse_args(flags, world_size=1, for_training=False)
    torch.manual_seed(0)
    device = torch.device(backend)
    module = None if backend == "cpu" else torch.get_device_module(backend)
    model = build_model(args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(args.adam_beta1, args.adam_beta2),
                                  eps=args.adam_eps, weight_decay=args.weight_decay,
                                  **({"fused": True} if backend != "cpu" else {"foreach": True}))
    b, s = args.micro_batch_size, args.seq_length
    micro_batches = max(1, args.global_batch_size // b)
    tokens = torch.randint(0, args.vocab_size, (b, s + 1), device=device)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(s, device=device).expand(b, s)
    masks = model.get_attention_masks(positions)
    step_ms = []
    for step in range(warmup + iters):
        if module is not None:
            module.synchronize()
            if step == warmup:
                module.reset_peak_memory_stats()
        start = time.perf_counter()
        for _ in range(micro_batches):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(args.bf16)):
                pred = model(inputs, attention_masks=masks, positions=positions)
            loss = cross_entropy_loss(pred, labels) / (labels.numel() * micro_batches)  # its sum, as a mean
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad or 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if module is not None:
            module.synchronize()
        step_ms.append(1000 * (time.perf_counter() - start))
    peak = (module.max_memory_allocated() / 2 ** 30 if module is not None
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20)
    import torchtitan

    version = getattr(torchtitan, "__version__", None) or _dist_version(src)
    Path(out).write_text(json.dumps({"step_ms": step_ms, "peak_gib": peak, "version": version,
                                     "attention": "FlexAttention", "loss": float(loss) * micro_batches}))


def _dist_version(src: str) -> str:
    found = sorted(Path(src).glob("torchtitan-*.dist-info"))
    return found[0].name.split("-")[1].removesuffix(".dist-info") if found else "?"


if __name__ == "__main__":
    split = sys.argv.index("--")
    source, backend_name, n_iters, n_warmup, out_file = sys.argv[1:split]
    worker(source, backend_name, int(n_iters), int(n_warmup), out_file, sys.argv[split + 1:])
