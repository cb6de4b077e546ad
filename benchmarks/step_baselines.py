"""The two baselines of benchmarks/step.py, built from the same parsed pretrain flags as the run they are compared
with (so the shapes are the same):

- ``plain_step_ms``: a minimal plain-PyTorch training loop of the model: embedding, per layer RMSNorm + fused QKV
  linear + RoPE + SDPA (causal, grouped-query) + output projection + RMSNorm + SwiGLU MLP (or, for MoE, a
  softmax top-k router and one loop over the experts), final norm, untied output layer, cross-entropy; the
  optimizer is torch's AdamW with the run's lr, betas, eps and weight decay, gradients clipped to ``--clip-grad``.
  bf16 runs use ``torch.autocast`` over fp32 parameters (the plain-PyTorch way to train in bf16). The global batch's
  micro-batches accumulate gradients before the optimizer step. Optionally torchao's float8 training
  (``convert_to_float8_training``, tensorwise or rowwise dynamic scaling) on its linears and torch.compile per layer.
- ``bound_step_ms``: the GEMM + attention bound: the time of the model's matrix multiplies alone (forward and the
  two backward GEMMs of every linear, the experts' at balanced routing, the router and the output layer) plus
  SDPA's forward and backward, each timed on its own on random tensors and summed over the layers. Everything
  else a training step does (norms, activations, RoPE, permutation, loss, optimizer, communication) is overhead
  over this bound; one per micro-batch of the global batch.
- ``flop_shares``: the layers' and the output layer's shares of those FLOPs (to read a row's MFU per layer).
May assume: torch >= 2.6 (``torch.accelerator``); ``args`` parsed by mtmegatron.config.arguments.parse_args.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize()


def _rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half RoPE over the last dim of ``x`` [b, heads, s, d]."""
    s, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), torch.cat([angles, angles], -1).sin().to(x.dtype)
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 2 * ffn, bias=False)
        self.fc2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        gate, up = self.fc1(x).chunk(2, -1)
        return self.fc2(F.silu(gate) * up)


class TopKExperts(nn.Module):
    def __init__(self, hidden: int, ffn: int, num_experts: int, topk: int):
        super().__init__()
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(hidden, ffn) for _ in range(num_experts))
        self.topk = topk

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, chosen = self.router(x).topk(self.topk, -1)
        weights = weights.softmax(-1).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out.reshape(shape)


class Layer(nn.Module):
    def __init__(self, args):
        super().__init__()
        h, self.heads, self.groups = args.hidden_size, args.num_attention_heads, args.num_query_groups
        self.head_dim = args.kv_channels or h // self.heads
        self.eps, self.base = args.layernorm_epsilon, args.rotary_base
        self.qkv = nn.Linear(h, (self.heads + 2 * self.groups) * self.head_dim, bias=False)
        self.proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.norm1, self.norm2 = nn.Parameter(torch.ones(h)), nn.Parameter(torch.ones(h))
        ffn = args.moe_ffn_hidden_size or args.ffn_hidden_size
        self.mlp = (TopKExperts(h, ffn, args.num_experts, args.moe_router_topk) if args.num_experts
                    else SwiGLU(h, args.ffn_hidden_size))

    def forward(self, x):
        b, s, h = x.shape
        y = F.rms_norm(x, (h,), self.norm1, self.eps)
        q, k, v = self.qkv(y).split([self.heads * self.head_dim, self.groups * self.head_dim,
                                     self.groups * self.head_dim], -1)
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = _rope(q, self.base), _rope(k, self.base)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.groups != self.heads)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(F.rms_norm(x, (h,), self.norm2, self.eps))


class PlainModel(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embedding = nn.Embedding(args.padded_vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(Layer(args) for _ in range(args.num_layers))
        self.norm = nn.Parameter(torch.ones(args.hidden_size))
        self.output = nn.Linear(args.hidden_size, args.padded_vocab_size, bias=False)
        self.eps = args.layernorm_epsilon

    def forward(self, tokens, labels):
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.output(F.rms_norm(x, (x.shape[-1],), self.norm, self.eps))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


def _median_ms(times: list[float]) -> float:
    return 1000 * statistics.median(times)


def to_float8(model: nn.Module, recipe: str) -> None:
    """torchao's float8 training (``convert_to_float8_training``, dynamic scaling, ``recipe`` tensorwise or
    rowwise) on every linear of ``model`` but the output layer, whose dims torch._scaled_mm takes (multiples of 16)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def eligible(module: nn.Module, fqn: str) -> bool:
        return (isinstance(module, nn.Linear) and fqn != "output" and module.in_features % 16 == 0
                and module.out_features % 16 == 0)

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe), module_filter_fn=eligible)


def plain_step_ms(args, device: torch.device, iters: int, warmup: int = 2, with_peak: bool = False,
                  float8: str | None = None, compile_layers: bool = False):
    """Median step time of the plain-PyTorch loop (forward, backward, clip, AdamW) over ``iters`` steps; with
    ``with_peak`` also the device allocator's peak in GiB over the timed steps (None on the cpu). Gradients of the
    global batch's micro-batches accumulate before the optimizer step, as in the run compared with. ``float8``:
    torchao's float8 training with that recipe (``to_float8``); ``compile_layers``: each layer torch.compile'd (as
    torchtitan does; where float8's casts fuse)."""
    torch.manual_seed(0)
    model = PlainModel(args).to(device)
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.normal_(p, std=args.init_method_std)
    if float8:
        to_float8(model, float8)
    if compile_layers:
        for i, layer in enumerate(model.layers):
            model.layers[i] = torch.compile(layer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(args.adam_beta1, args.adam_beta2),
                                  eps=args.adam_eps, weight_decay=args.weight_decay)
    b, s = args.micro_batch_size, args.seq_length
    micro_batches = max(1, args.global_batch_size // b)
    tokens = torch.randint(0, args.vocab_size, (b, s + 1), device=device)
    module = None if device.type == "cpu" else torch.get_device_module(device.type)
    times = []
    for step in range(warmup + iters):
        synchronize(device)
        if step == warmup and module is not None:
            module.reset_peak_memory_stats()
        start = time.perf_counter()
        for _ in range(micro_batches):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(args.bf16)):
                loss = model(tokens[:, :-1], tokens[:, 1:]) / micro_batches
            loss.backward()
        if args.clip_grad:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        if step >= warmup:
            times.append(time.perf_counter() - start)
    if not with_peak:
        return _median_ms(times)
    return _median_ms(times), (None if module is None else module.max_memory_allocated() / 2 ** 30)


def _time_ms(fn, device: torch.device, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return _median_ms(times)


def _linear_ms(tokens: int, n_in: int, n_out: int, dtype, device, reps: int) -> float:
    """Forward (x W^T) and the two backward GEMMs (dY W, dY^T x) of one linear layer."""
    if tokens == 0:
        return 0.0
    x = torch.randn(tokens, n_in, dtype=dtype, device=device)
    w = torch.randn(n_out, n_in, dtype=dtype, device=device)
    dy = torch.randn(tokens, n_out, dtype=dtype, device=device)
    return _time_ms(lambda: (x @ w.t(), dy @ w, dy.t() @ x), device, reps)


def _attention_ms(args, dtype, device, reps: int) -> float:
    b, s, heads, groups = args.micro_batch_size, args.seq_length, args.num_attention_heads, args.num_query_groups
    d = args.kv_channels or args.hidden_size // heads
    q = torch.randn(b, heads, s, d, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(b, groups, s, d, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(b, groups, s, d, dtype=dtype, device=device, requires_grad=True)
    grad = torch.randn(b, heads, s, d, dtype=dtype, device=device)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=groups != heads)
        out.backward(grad)

    return _time_ms(fwd_bwd, device, reps)


def bound_step_ms(args, device: torch.device, reps: int = 5) -> float:
    """The GEMM + attention bound of one step (see the module docstring)."""
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    h, heads, groups = args.hidden_size, args.num_attention_heads, args.num_query_groups
    d = args.kv_channels or h // heads
    tokens = args.micro_batch_size * args.seq_length
    layer = (_linear_ms(tokens, h, (heads + 2 * groups) * d, dtype, device, reps)
             + _linear_ms(tokens, heads * d, h, dtype, device, reps) + _attention_ms(args, dtype, device, reps))
    if args.num_experts:
        ffn = args.moe_ffn_hidden_size or args.ffn_hidden_size
        per_expert = tokens * args.moe_router_topk // args.num_experts
        layer += _linear_ms(tokens, h, args.num_experts, dtype, device, reps)
        layer += args.num_experts * (_linear_ms(per_expert, h, 2 * ffn, dtype, device, reps)
                                     + _linear_ms(per_expert, ffn, h, dtype, device, reps))
    else:
        ffn = args.ffn_hidden_size
        layer += _linear_ms(tokens, h, 2 * ffn, dtype, device, reps) + _linear_ms(tokens, ffn, h, dtype, device, reps)
    micro_batches = max(1, args.global_batch_size // args.micro_batch_size)
    return micro_batches * (args.num_layers * layer + _linear_ms(tokens, h, args.padded_vocab_size, dtype, device,
                                                                 reps))


def flop_shares(args) -> dict:
    """Shares of one micro-batch's GEMM + attention FLOPs (the bound's pieces): the layers' and the output
    layer's, so a row's MFU can be read per layer (the embedding and the optimizer do no GEMM)."""
    h, heads, groups = args.hidden_size, args.num_attention_heads, args.num_query_groups
    d = args.kv_channels or h // heads
    s = args.seq_length
    attn = h * (heads + 2 * groups) * d + heads * d * h + 2 * s * heads * d  # per token, causal SDPA counted whole
    if args.num_experts:
        ffn = args.moe_ffn_hidden_size or args.ffn_hidden_size
        mlp = h * args.num_experts + args.moe_router_topk * 3 * h * ffn
    else:
        mlp = 3 * h * args.ffn_hidden_size
    layers = args.num_layers * (attn + mlp)
    output = h * args.padded_vocab_size
    return {"layers": layers / (layers + output), "output_layer": output / (layers + output)}
