"""The gradient of MLA's shared RoPE key under tensor parallelism with the local (non-TE) spec.

Target: megatron.core.transformer.multi_latent_attention:apply_rotary_pos_emb
Reason: with megatron-core's local spec, ``linear_kv_down_proj`` is a ColumnParallelLinear; MLA all-gathers its
output over TP (``gather_from_tensor_model_parallel_region``) and splits off ``k_pos_emb``, the RoPE part of
the key that every attention head on every TP rank uses. Each rank's heads only produce their share of its
gradient, and the gather's backward keeps the local slice without summing over TP, so the other ranks' share
is dropped: under TP>1 (with or without sequence parallelism) training silently diverges from the single-rank
model from the second iteration on (3.7e-4 relative after 3 iterations on DeepSeek-V3 tiny). The fix routes
the roped key through ``copy_to_tensor_model_parallel_region`` (identity forward, all-reduce over TP
backward). The key is told apart from the query by call order inside one ``get_query_key_value_tensors``
(query first, key second); only layers whose ``linear_kv_down_proj`` is a ColumnParallelLinear and TP>1
are touched (the TE path all-gathers along the sequence, whose backward already sums).
Versions: megatron-core 0.16.x. Backends: all (any run on the local spec).
"""

from __future__ import annotations

import contextvars
import functools

from .base import Patch, current, set_attr

TARGET = "megatron.core.transformer.multi_latent_attention:apply_rotary_pos_emb"
METHOD = "megatron.core.transformer.multi_latent_attention:MLASelfAttention.get_query_key_value_tensors"

# the number of rotary calls seen inside the current get_query_key_value_tensors, or None outside one
_calls: contextvars.ContextVar[list | None] = contextvars.ContextVar("mtm_mla_rope_calls", default=None)


def _needs_fix(attention) -> bool:
    from megatron.core.tensor_parallel import ColumnParallelLinear

    return isinstance(attention.linear_kv_down_proj, ColumnParallelLinear) and attention.pg_collection.tp.size() > 1


def apply():
    original_rope = current(TARGET)
    original_method = current(METHOD)

    @functools.wraps(original_rope)
    def rope(t, *args, **kwargs):
        out = original_rope(t, *args, **kwargs)
        calls = _calls.get()
        if calls is not None:
            calls.append(None)
            if len(calls) == 2:  # the key's RoPE part, shared by every head on every TP rank
                from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region

                out = copy_to_tensor_model_parallel_region(out)
        return out

    @functools.wraps(original_method)
    def get_query_key_value_tensors(self, *args, **kwargs):
        token = _calls.set([] if _needs_fix(self) else None)
        try:
            return original_method(self, *args, **kwargs)
        finally:
            _calls.reset(token)

    undo_rope = set_attr(TARGET, rope)
    undo_method = set_attr(METHOD, get_query_key_value_tensors)

    def undo():
        undo_method()
        undo_rope()

    return undo


PATCH = Patch(
    name="mla_tp_rope_key_grad",
    target=TARGET,
    reason="local-spec MLA drops the other TP ranks' share of the shared RoPE key's gradient (training diverges "
    "from single rank under TP); the roped key's gradient is all-reduced over TP",
    versions=">=0.16,<0.17",
    apply=apply,
)
