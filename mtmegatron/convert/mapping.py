"""Tensor names and layouts between HF transformers checkpoints and our (single-rank, TP1) megatron-core model.

``mcore_sources(family, args)`` gives, per mcore tensor, the HF tensors it is computed from and how (the
streaming hf-to-mcore reads one at a time); ``hf_groups(family, args)`` the way back in bounded groups, and
``to_hf(family, args, mcore)`` their union. LLaVA's tower, projector and key prefixes come from convert/llava.py
through the same two functions. Layout facts:
- ``linear_qkv`` rows are grouped per query group: that group's query heads, then its key, then its value (its
  bias, Qwen2's, likewise); Qwen3's ``q_norm``/``k_norm`` -> ``q_layernorm``/``k_layernorm``.
- Qwen3-MoE: ``mlp.experts.<e>.{gate,up,down}_proj``, router ``mlp.gate`` (DeepSeek's names without a shared expert).
- ``linear_fc1`` is ``cat([gate, up])``; experts are ``mlp.experts.local_experts.<e>`` (sequential experts).
- DeepSeek MLA: q_a/q_b/kv_a/kv_b -> linear_q_down/q_up/kv_down/kv_up, q_a/kv_a layernorms -> q_layernorm/
  kv_layernorm (the local spec's names), gate -> router (+ e_score_correction_bias -> router.expert_bias),
  the MTP layer is HF layer ``num_hidden_layers + k`` (enorm, hnorm, eh_proj, shared_head.norm).
- RoPE rows of MLA's q and k_pe: megatron's MLA de-interleaves them itself before its rotate-half RoPE (it
  expects DeepSeek's interleaved-pairs layout, HF's ``rope_interleave: true``), so those checkpoints map as
  they are; for ``rope_interleave: false`` the rows are interleaved here (an exact permutation, inverted on the
  way back).
May assume: args from training/arguments.py for the same network; fp32 or any float dtype tensors.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from mtmegatron.models.deepseek_args import moe_layer_pattern


# ---- layout helpers ---------------------------------------------------------------------------------------
def qkv_to_mcore(q, k, v, heads: int, groups: int) -> torch.Tensor:
    """Weights (rows x hidden) or biases (rows) of q/k/v -> megatron's per-group row order."""
    head_dim, rest = q.shape[0] // heads, q.shape[1:]
    q = q.view(groups, heads // groups, head_dim, *rest)
    k, v = k.view(groups, 1, head_dim, *rest), v.view(groups, 1, head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def qkv_to_hf(qkv, heads: int, groups: int):
    per_group = heads // groups + 2
    rest = qkv.shape[1:]
    head_dim = qkv.shape[0] // (groups * per_group)
    grouped = qkv.view(groups, per_group, head_dim, *rest)
    q = grouped[:, : heads // groups].reshape(-1, *rest)
    return q, grouped[:, -2].reshape(-1, *rest), grouped[:, -1].reshape(-1, *rest)


def _qkv_parts(args) -> list[str]:
    """The fused q/k/v tensors of plain attention: the weight, and the bias with ``--add-qkv-bias``."""
    return ["weight", "bias"] if args.add_qkv_bias else ["weight"]


def _deinterleave(rows: int) -> torch.Tensor:
    return torch.cat([torch.arange(0, rows, 2), torch.arange(1, rows, 2)])


def _permute_rope_rows(weight, head_dim: int, rope_dim: int, inverse: bool) -> torch.Tensor:
    """Permute the last ``rope_dim`` rows of every ``head_dim``-row block: de-interleave (pairs -> halves), or
    with ``inverse`` interleave (halves -> pairs, what megatron's MLA de-interleaves again)."""
    perm = _deinterleave(rope_dim)
    if inverse:
        perm = torch.argsort(perm)
    blocks = weight.view(-1, head_dim, *weight.shape[1:])
    nope, rope = blocks[:, : head_dim - rope_dim], blocks[:, head_dim - rope_dim:]
    return torch.cat([nope, rope[:, perm]], dim=1).reshape(weight.shape)


# ---- per-part name tables: (mcore suffix, hf suffix) --------------------------------------------------------
def _attention_pairs(family: str, args) -> list[tuple[str, str]]:
    if family != "deepseek-v3":
        pairs = [("self_attention.linear_proj.weight", "self_attn.o_proj.weight")]
        if args.qk_layernorm:  # Qwen3: RMSNorm over each head's q and k
            pairs += [("self_attention.q_layernorm.weight", "self_attn.q_norm.weight"),
                      ("self_attention.k_layernorm.weight", "self_attn.k_norm.weight")]
        return pairs
    pairs = [
        ("self_attention.linear_kv_down_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"),
        ("self_attention.kv_layernorm.weight", "self_attn.kv_a_layernorm.weight"),
        ("self_attention.linear_kv_up_proj.weight", "self_attn.kv_b_proj.weight"),
        ("self_attention.linear_proj.weight", "self_attn.o_proj.weight"),
    ]
    if args.q_lora_rank:
        pairs += [
            ("self_attention.linear_q_down_proj.weight", "self_attn.q_a_proj.weight"),
            ("self_attention.q_layernorm.weight", "self_attn.q_a_layernorm.weight"),
            ("self_attention.linear_q_up_proj.weight", "self_attn.q_b_proj.weight"),
        ]
    else:
        pairs.append(("self_attention.linear_q_proj.weight", "self_attn.q_proj.weight"))
    return pairs


def _mlp_parts(family: str, is_moe: bool, args) -> list[tuple[str, str, str, str]]:
    """(mcore fc1, mcore fc2, hf module prefix, gate/up/down naming) for each SwiGLU MLP of the layer."""
    names = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    if not is_moe:
        return [("mlp.linear_fc1.weight", "mlp.linear_fc2.weight", "mlp", names)]
    hf_moe = "block_sparse_moe" if family == "mixtral" else "mlp"
    parts = [(f"mlp.experts.local_experts.{e}.linear_fc1.weight", f"mlp.experts.local_experts.{e}.linear_fc2.weight",
              f"{hf_moe}.experts.{e}", names) for e in range(args.num_experts)]
    if args.moe_shared_expert_intermediate_size:
        parts.append(("mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight",
                      "mlp.shared_experts", names))
    return parts


def _router_pairs(family: str, args) -> list[tuple[str, str]]:
    hf_moe = "block_sparse_moe" if family == "mixtral" else "mlp"
    pairs = [("mlp.router.weight", f"{hf_moe}.gate.weight")]
    if args.moe_router_enable_expert_bias:
        pairs.append(("mlp.router.expert_bias", f"{hf_moe}.gate.e_score_correction_bias"))
    return pairs


def _layers(args) -> Iterator[tuple[str, str, bool]]:
    """(mcore layer prefix, hf layer prefix, is MoE) for decoder layers, then MTP transformer layers."""
    pattern = moe_layer_pattern(args)
    for i, kind in enumerate(pattern):
        yield f"decoder.layers.{i}.", f"model.layers.{i}.", bool(kind)
    for k in range(args.mtp_num_layers or 0):
        yield f"mtp.layers.{k}.transformer_layer.", f"model.layers.{args.num_layers + k}.", bool(pattern[-1])


def _rope_rows(family: str, args, rope_interleave: bool) -> dict[str, tuple[int, int]]:
    """mcore suffix -> (head block rows, rope rows) of the weights whose RoPE rows need interleaving."""
    if family != "deepseek-v3" or rope_interleave:
        return {}
    q_name = "linear_q_up_proj" if args.q_lora_rank else "linear_q_proj"
    rope = args.qk_pos_emb_head_dim
    return {f"self_attention.{q_name}.weight": (args.qk_head_dim + rope, rope),
            "self_attention.linear_kv_down_proj.weight": (args.kv_lora_rank + rope, rope)}


# ---- the two directions ---------------------------------------------------------------------------------------
def mcore_sources(family: str, args, rope_interleave: bool = True, hf_layout: dict | None = None) -> dict:
    """``{mcore name: (HF names, transform)}``: the tensor is ``transform(*HF tensors)``. Lets a streaming
    converter read only what one output needs (convert/streaming.py). LLaVA: convert/llava.py's, for the key
    layout recorded in ``hf_layout["llava"]``."""
    if family == "llava":
        from mtmegatron.convert import llava

        return llava.mcore_sources(args, hf_layout["llava"])
    def same(tensor):
        return tensor

    def qkv(q, k, v):
        return qkv_to_mcore(q, k, v, args.num_attention_heads, args.num_query_groups)

    def fused(gate, up):
        return torch.cat([gate, up])
    fused.concatenates_rows = True  # a chunk that is exactly one input's rows is that input (convert/streaming.py)

    def interleaved(head_rows: int, rope: int):
        return lambda tensor: _permute_rope_rows(tensor, head_rows, rope, inverse=True)

    out = {"embedding.word_embeddings.weight": (("model.embed_tokens.weight",), same),
           "decoder.final_layernorm.weight": (("model.norm.weight",), same)}
    if args.untie_embeddings_and_output_weights:
        out["output_layer.weight"] = (("lm_head.weight",), same)
    rope_rows = _rope_rows(family, args, rope_interleave)
    for mc, hp, is_moe in _layers(args):
        out[mc + "input_layernorm.weight"] = ((hp + "input_layernorm.weight",), same)
        out[mc + "pre_mlp_layernorm.weight"] = ((hp + "post_attention_layernorm.weight",), same)
        if family != "deepseek-v3":
            for part in _qkv_parts(args):
                out[mc + f"self_attention.linear_qkv.{part}"] = (
                    tuple(hp + f"self_attn.{x}_proj.{part}" for x in "qkv"), qkv)
        for m_name, h_name in _attention_pairs(family, args):
            out[mc + m_name] = ((hp + h_name,), interleaved(*rope_rows[m_name]) if m_name in rope_rows else same)
        for fc1, fc2, h_prefix, (gate, up, down) in _mlp_parts(family, is_moe, args):
            out[mc + fc1] = ((f"{hp}{h_prefix}.{gate}.weight", f"{hp}{h_prefix}.{up}.weight"), fused)
            out[mc + fc2] = ((f"{hp}{h_prefix}.{down}.weight",), same)
        if is_moe:
            for m_name, h_name in _router_pairs(family, args):
                out[mc + m_name] = ((hp + h_name,), same)
    for k in range(args.mtp_num_layers or 0):
        hp = f"model.layers.{args.num_layers + k}."
        for m_name, h_name in (("enorm", "enorm"), ("hnorm", "hnorm"), ("eh_proj", "eh_proj"),
                               ("final_layernorm", "shared_head.norm")):
            out[f"mtp.layers.{k}.{m_name}.weight"] = ((f"{hp}{h_name}.weight",), same)
    return out


def hf_groups(family: str, args, rope_interleave: bool = True,
              hf_layout: dict | None = None) -> list[tuple[tuple[str, ...], Callable[..., dict]]]:
    """The way back as bounded groups: ``[(mcore names, transform)]`` where ``transform(*mcore tensors)`` returns
    ``{HF name: tensor}`` (one layer's fused q/k/v -> three tensors, fc1 -> gate and up, else one tensor). Lets a
    streaming exporter hold one group at a time (convert/streaming_export.py); ``to_hf`` is their union. LLaVA:
    convert/llava.py's, for the key layout and carried tower file in ``hf_layout["llava"]``."""
    if family == "llava":
        from mtmegatron.convert import llava

        return llava.hf_groups(args, hf_layout["llava"])
    def one(hf_name: str, permute: tuple[int, int] | None = None):
        def transform(tensor):
            if permute is not None:
                tensor = _permute_rope_rows(tensor, *permute, inverse=False)
            return {hf_name: tensor}
        return transform

    def qkv(prefix: str, part: str):
        def transform(tensor):
            q, k, v = qkv_to_hf(tensor, args.num_attention_heads, args.num_query_groups)
            return {f"{prefix}self_attn.{x}_proj.{part}": t for x, t in zip("qkv", (q, k, v))}
        return transform

    def gate_up(gate_name: str, up_name: str):
        def transform(tensor):
            gate_w, up_w = torch.chunk(tensor, 2, dim=0)
            return {gate_name: gate_w, up_name: up_w}
        return transform

    def copy(hf_name: str):  # DeepSeek's release stores the MTP layer's (shared) embedding and head with it
        return lambda tensor: {hf_name: tensor.clone()}

    groups = [(("embedding.word_embeddings.weight",), one("model.embed_tokens.weight")),
              (("decoder.final_layernorm.weight",), one("model.norm.weight"))]
    head = "embedding.word_embeddings.weight"
    if args.untie_embeddings_and_output_weights:
        head = "output_layer.weight"
        groups.append(((head,), one("lm_head.weight")))
    rope_rows = _rope_rows(family, args, rope_interleave)
    for mc, hp, is_moe in _layers(args):
        groups.append(((mc + "input_layernorm.weight",), one(hp + "input_layernorm.weight")))
        groups.append(((mc + "pre_mlp_layernorm.weight",), one(hp + "post_attention_layernorm.weight")))
        if family != "deepseek-v3":
            for part in _qkv_parts(args):
                groups.append(((mc + f"self_attention.linear_qkv.{part}",), qkv(hp, part)))
        for m_name, h_name in _attention_pairs(family, args):
            groups.append(((mc + m_name,), one(hp + h_name, rope_rows.get(m_name))))
        for fc1, fc2, h_prefix, (gate, up, down) in _mlp_parts(family, is_moe, args):
            groups.append(((mc + fc1,), gate_up(f"{hp}{h_prefix}.{gate}.weight", f"{hp}{h_prefix}.{up}.weight")))
            groups.append(((mc + fc2,), one(f"{hp}{h_prefix}.{down}.weight")))
        if is_moe:
            for m_name, h_name in _router_pairs(family, args):
                groups.append(((mc + m_name,), one(hp + h_name)))
    for k in range(args.mtp_num_layers or 0):
        hp = f"model.layers.{args.num_layers + k}."
        for m_name, h_name in (("enorm", "enorm"), ("hnorm", "hnorm"), ("eh_proj", "eh_proj"),
                               ("final_layernorm", "shared_head.norm")):
            groups.append(((f"mtp.layers.{k}.{m_name}.weight",), one(f"{hp}{h_name}.weight")))
        groups.append((("embedding.word_embeddings.weight",), copy(hp + "embed_tokens.weight")))
        groups.append(((head,), copy(hp + "shared_head.head.weight")))
    return groups


def to_hf(family: str, args, mcore: dict, rope_interleave: bool = True) -> dict:
    out = {}
    for names, transform in hf_groups(family, args, rope_interleave):
        out.update(transform(*(mcore[n] for n in names)))
    return {name: tensor.contiguous() for name, tensor in out.items()}


def mtp_in_checkpoint(names, num_layers: int) -> bool:
    """Whether an HF DeepSeek checkpoint holds its MTP layer (layer index num_hidden_layers)."""
    prefix = f"model.layers.{num_layers}."
    return any(name.startswith(prefix) for name in names)
