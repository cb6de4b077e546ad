"""Which core attention a transformer layer gets: one decision from the flags, with the reason it was made.

``core_attention_choice(attention_backend, transformer_impl, transformer_engine)`` returns ``(kind, reason)``, kind one of:
- ``"te"``: TransformerEngine's ``TEDotProductAttention`` (TE layers: ``--transformer-impl transformer_engine`` where
  TE serves the backend, or ``--fp8-executor transformer_engine``; with ``--attention-backend auto|flash|fused``;
  TE picks its own fused kernel);
- ``"sdpa"``: mtmegatron's ``SDPADotProductAttention`` (torch's flash / memory-efficient kernels, context
  parallelism) for ``auto|flash|fused`` otherwise. Under ``--transformer-impl mtmegatron`` ``auto`` also picks
  SDPA: mtmegatron's fused softmax (``FusedDotProductAttention``) still materialises ``[b, h, s, s]`` and was
  slower than SDPA at every fp32 benchmark length and at 2k-4k in bf16 (``benchmarks/attention.py``,
  docs/attention.md);
- ``"fused_softmax"``: ``--attention-backend local|unfused`` with ``--transformer-impl mtmegatron``;
- ``"local"``: megatron-core's ``DotProductAttention`` (``local|unfused`` with ``--transformer-impl local``).
``models/layer_spec.py`` turns the kind into the class (and MLA's head-dims variant); nothing here edits a spec.
May assume: the values of validated flags (config/attention_flags.py); no megatron-core import needed.
"""

from __future__ import annotations

KINDS = ("te", "sdpa", "fused_softmax", "local")
# --cp-comm-type's values (attention/core.py runs them) and the --attention-backend values that keep an explicit
# [b, h, s, s] core attention (no context parallelism); config/attention_flags.py registers the flags with them
CP_COMM_TYPES = ("p2p", "all_gather")
LOCAL_BACKENDS = ("local", "unfused")

# benchmarks/attention.py (fwd+bwd of one causal core attention, 4 heads / 2 KV groups, head dim 64, batch 1,
# 1 thread, shared 2-core CPU; docs/attention.md): fused-softmax time / SDPA time at s = 128 ... 8192 in fp32.
# bf16: mixed below 2k (0.5-1.4x, noisy), SDPA 1.5-2.6x faster at 2k-4k.
MEASURED_FUSED_OVER_SDPA = "1.3-4.6x"


def core_attention_choice(attention_backend: str, transformer_impl: str, transformer_engine: bool) -> tuple[str, str]:
    """``(kind, reason)`` for ``--attention-backend`` and ``--transformer-impl``; ``transformer_engine``: the layers
    are TransformerEngine's (decided at parse time, config/transformer_impl.py)."""
    backend = attention_backend
    fused_impl = transformer_impl == "mtmegatron"
    if backend in LOCAL_BACKENDS:
        if fused_impl:
            return "fused_softmax", f"--attention-backend {backend} with --transformer-impl mtmegatron"
        return "local", f"--attention-backend {backend}"
    if transformer_engine:
        return "te", f"--attention-backend {backend} with TransformerEngine layers"
    if fused_impl and backend == "auto":
        return "sdpa", (f"--attention-backend auto: torch SDPA is faster than mtmegatron's fused softmax "
                        f"(fp32 fused/SDPA time {MEASURED_FUSED_OVER_SDPA}, docs/attention.md); "
                        "--attention-backend local selects the fused softmax")
    return "sdpa", f"--attention-backend {backend}"
