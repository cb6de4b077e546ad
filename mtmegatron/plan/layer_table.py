"""Parameters per layer of the model at one TP x EP size, from one meta-device build: what ``--search`` turns into
any pipeline stage's parameters without building each layout.

The whole model (one pipeline stage) is built by plan/params.meta_chunks and its parameters are sorted by owner:
``decoder.layers.<i>`` (layer i), the embedding, the head (final norm and output layer), the MTP block; each part
counts dense, expert and TP-sharded elements as plan/params.stage_params does. ``stage(pp, vpp, p)`` assembles stage
``p``'s rank under megatron-core's even split (chunk c of stage p holds layers ``(c pp + p) n .. (c pp + p + 1) n``,
``n = layers / (pp vpp)``; the first chunk of the first stage has the embedding, the last chunk of the last stage the
head and MTP block, plus a copy of the embedding where it is tied or MTP needs it). Exact for even splits; the
uneven-split flags are the search's to set, and every layout it prints is re-planned by the full path.
May assume: ``args`` is a validated pretrain configuration with pipeline size 1 (config.parse); megatron-core 0.16
GPTModel parameter names.
"""

from __future__ import annotations

import dataclasses

from mtmegatron.plan.params import Chunk, StageParams, layer_kinds, meta_chunks


@dataclasses.dataclass(frozen=True)
class Part:
    dense: int = 0
    expert: int = 0
    sharded: int = 0
    frozen_dense: int = 0  # needing no gradient (a LoRA run's base)
    frozen_expert: int = 0

    def __add__(self, other: "Part") -> "Part":
        return Part(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


@dataclasses.dataclass(frozen=True)
class LayerTable:
    layers: tuple[Part, ...]
    moe: tuple[bool, ...]
    embedding: Part
    head: Part
    mtp: Part
    mtp_layers: int
    tied: bool  # the output layer shares the embedding's weight
    word_embedding: int  # elements of the word embedding on this rank
    kinds: tuple = ()  # plan/params.layer_kinds of the layers, as (name, value) pairs

    def stage(self, pp: int, vpp: int | None, p: int) -> StageParams:
        v = vpp or 1
        n = len(self.layers) // (pp * v)
        chunks, total, shared, outside = [], Part(), 0, {"embedding": 0, "head": 0}
        for c in range(v):
            first = (c * pp + p) * n
            pre, post = p == 0 and c == 0, p == pp - 1 and c == v - 1
            for i in range(first, first + n):
                total += self.layers[i]
            if pre:
                total += self.embedding
                outside["embedding"] += self.embedding.dense + self.embedding.expert
            if post:
                total += self.head + self.mtp
                outside["head"] += self.head.dense + self.head.expert + self.mtp.dense + self.mtp.expert
                copy = (self.word_embedding if self.tied else 0) + (self.embedding.dense if self.mtp_layers else 0)
                if pp > 1 and copy:  # the last stage's copy of the first stage's embedding: memory, not model
                    total += Part(dense=copy, sharded=copy, frozen_dense=copy if self.embedding.frozen_dense else 0)
                    shared += copy
                    outside["head"] += copy
            chunks.append(Chunk(layers=n, moe_layers=sum(self.moe[first:first + n]),
                                mtp_layers=self.mtp_layers if post else 0, pre_process=pre, post_process=post,
                                **dict(self.kinds)))
        return StageParams(stage=p, dense=total.dense, expert=total.expert, dense_tp_sharded=total.sharded - shared,
                           shared_embedding=shared, chunks=tuple(chunks), frozen_dense=total.frozen_dense,
                           frozen_expert=total.frozen_expert, **outside,
                           largest_layer=max(l.dense + l.expert for l in self.layers) if self.layers else 0)


def _part(params) -> Part:
    dense = expert = sharded = frozen_dense = frozen_expert = 0
    for p in params:
        frozen = 0 if p.requires_grad else p.numel()
        if not getattr(p, "allreduce", True):
            expert += p.numel()
            frozen_expert += frozen
        else:
            dense += p.numel()
            frozen_dense += frozen
            sharded += p.numel() if getattr(p, "tensor_model_parallel", False) else 0
    return Part(dense, expert, sharded, frozen_dense, frozen_expert)


def layer_table(args) -> LayerTable:
    """The table of ``args``'s model at its TP and EP sizes (pipeline size 1: one build of the whole model)."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    assert args.pipeline_model_parallel_size == 1
    (model,) = meta_chunks(args, 0)
    layers = list(model.decoder.layers)
    owned = {id(p) for layer in layers for p in layer.parameters()}
    embedding = list(model.embedding.parameters()) if getattr(model, "embedding", None) is not None else []
    mtp = list(model.mtp.parameters()) if getattr(model, "mtp", None) is not None else []
    owned |= {id(p) for p in embedding} | {id(p) for p in mtp}
    head = [p for p in model.parameters() if id(p) not in owned]
    word = model.embedding.word_embeddings.weight.numel() if embedding else 0
    return LayerTable(layers=tuple(_part(layer.parameters()) for layer in layers),
                      moe=tuple(isinstance(getattr(layer, "mlp", None), MoELayer) for layer in layers),
                      embedding=_part(embedding), head=_part(head), mtp=_part(mtp),
                      mtp_layers=len(model.mtp.layers) if mtp else 0,
                      tied=not args.untie_embeddings_and_output_weights, word_embedding=word,
                      kinds=tuple(sorted(layer_kinds(layers).items())))
