"""Exact parameters of every pipeline stage: the run's own model chunks built on the meta device.

For each pipeline stage (with all its virtual-pipeline chunks) the chunks come from the training builder
(models/gpt.build_model_chunks, the same layer specs, families and patches) inside ``torch.device("meta")``,
under the parallel state of that stage (plan/rank_state.py), with the host-init path and
``perform_initialization=False``: no storage is allocated and nothing is drawn, so Llama-3-8B's stages build in
well under a second each. Each parameter is sorted as megatron-core treats it: expert parameters
(``allreduce=False``: sharded over expert-TP, distinct per EP rank, reduced over the expert data-parallel group)
or dense ones (reduced over data-parallel x context-parallel); TP-sharded dense parameters
(``tensor_model_parallel``) count once per TP rank in the model total, replicated ones once; the output layer of
the last stage that shares the first stage's embedding (``shared_embedding``) is memory on its rank but not a
parameter of the model. With ``--lora-r`` the chunks are wrapped by lora/wrap.py as training wraps them: the adapters
are parameters of the model, the frozen base (``frozen_*``) has weights but no gradients and no optimizer state.
May assume: ``args`` is a parsed, validated pretrain configuration (config.parse), world size included.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import torch

from mtmegatron.plan.rank_state import Layout, rank_position


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One model chunk of a stage (one virtual pipeline stage)."""
    layers: int
    moe_layers: int
    mtp_layers: int
    pre_process: bool
    post_process: bool
    torch_rmsnorm: bool = False  # the layers' norms are torch.nn.RMSNorm (no apex/TE: megatron-core's fallback)
    core_attention: str = "sdpa"  # "local" (megatron-core's unfused DotProductAttention), "sdpa" (ours), "other"
    lora_dense: float = 0.0  # elements a layer's non-expert LoRA adapters keep per token (_lora_elements)
    lora_expert: float = 0.0  # ... one expert's adapters per token copy routed to it


@dataclasses.dataclass(frozen=True)
class StageParams:
    """One rank of a pipeline stage: its parameters by kind (elements on this rank) and its chunks."""
    stage: int
    dense: int  # non-expert parameters held by this rank
    expert: int  # expert parameters held by this rank
    dense_tp_sharded: int  # of ``dense``: split over TP ranks
    shared_embedding: int  # of ``dense``: the last stage's copy of a tied embedding
    chunks: tuple[Chunk, ...]
    frozen_dense: int = 0  # of ``dense``: needing no gradient (a LoRA run's base): no grad buffer, no optimizer state
    frozen_expert: int = 0  # of ``expert``: likewise
    # what fully sharded data parallelism gathers whole (plan/memory.fsdp_gathered_bytes): the embedding module's
    # parameters (first stage), the rest outside the layers and embedding (output layer, final norm, MTP; last
    # stage) and the largest transformer layer, elements on this rank
    embedding: int = 0
    head: int = 0
    largest_layer: int = 0

    @property
    def local(self) -> int:
        return self.dense + self.expert

    def model_share(self, layout: Layout) -> int:
        """This stage's parameters of the whole model (every TP and EP rank of the stage, counted once)."""
        replicated = self.dense - self.dense_tp_sharded - self.shared_embedding
        return self.dense_tp_sharded * layout.tp + replicated + self.expert * layout.ep * layout.etp


def layer_kinds(layers) -> dict:
    """Which implementations the layers run, as far as what they keep for backward depends on it: the norm class
    and the core attention class of the first layer that has them (plan/activations.py)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from mtmegatron.attention.core import SDPADotProductAttention

    kinds = {}
    for layer in layers:
        norm = getattr(layer, "input_layernorm", None)
        if norm is not None and "torch_rmsnorm" not in kinds:
            kinds["torch_rmsnorm"] = isinstance(norm, torch.nn.RMSNorm)
        core = getattr(getattr(layer, "self_attention", None), "core_attention", None)
        if core is not None and "core_attention" not in kinds:
            kinds["core_attention"] = ("sdpa" if isinstance(core, SDPADotProductAttention) else
                                       "local" if isinstance(core, DotProductAttention) else "other")
        if "lora_dense" not in kinds:
            dense, expert = _lora_elements(layer)
            if dense or expert:
                kinds["lora_dense"], kinds["lora_expert"] = dense, expert
    return kinds


def _lora_elements(layer) -> tuple[float, float]:
    """(non-expert adapters' elements per token, one expert's adapters' elements per routed token copy) that a
    layer's LoRA adapters (lora/adapter.py, lora/grouped.py) keep for backward, beyond the base linear's input
    (which A's matmul shares): A's output (parts x r: B's input), the sequence-parallel gather of a column
    adapter's input (a full-sequence copy), and with --lora-dropout the dropped input copy. Per token of the whole
    sequence (A's output is all-reduced / gathered before B)."""
    from mtmegatron.lora.adapter import LoRA
    from mtmegatron.lora.grouped import GroupedLoRA

    dense = expert = 0.0
    experts: set[str] = set()
    for name, module in layer.named_modules():
        if isinstance(module, LoRA):
            n = module.lora_a.shape[0] + (module.lora_a.shape[1] if isinstance(module.dropout, torch.nn.Dropout) else 0)
            if module.kind == "column" and module.sequence_parallel:
                n += module.lora_a.shape[1]
            if "local_experts." in name:
                experts.add(name.split("local_experts.")[1].split(".")[0])
                expert += n
            else:
                dense += n
        elif isinstance(module, GroupedLoRA):
            for pair in module.children():
                if hasattr(pair, "lora_a"):
                    expert += pair.lora_a.shape[-2]
    return dense, expert / max(len(experts), 1)


def _chunk(model) -> Chunk:
    from megatron.core.transformer.moe.moe_layer import MoELayer

    layers = list(model.decoder.layers) if getattr(model, "decoder", None) is not None else []
    mtp = getattr(model, "mtp", None)
    return Chunk(layers=len(layers), moe_layers=sum(isinstance(getattr(l, "mlp", None), MoELayer) for l in layers),
                 mtp_layers=len(mtp.layers) if mtp is not None else 0,
                 pre_process=bool(model.pre_process), post_process=bool(model.post_process), **layer_kinds(layers))


def meta_chunks(args, stage: int) -> list:
    """Stage ``stage``'s model chunks, built by the training builder on the meta device (no storage, no init)."""
    from mtmegatron.models.gpt import build_model_chunks, transformer_config

    args = copy.copy(args)  # the planner's own copy: the host-init path, whatever the backend
    args.use_cpu_initialization = True
    with rank_position(Layout.of(args), stage):
        config = transformer_config(args)
        config.perform_initialization = False  # shapes only: nothing is drawn
        with torch.device("meta"):
            chunks = build_model_chunks(args, config)
        if args.lora_r:  # the run's adapters, as training/setup.py wraps them: the base frozen; each adapter's A is
            from mtmegatron.lora import wrap  # drawn on the host (r x the linear's input: small), then moved to meta
            from mtmegatron.lora.section import Lora

            chunks = wrap(chunks, Lora.of(args), args.seed)
        return chunks


def stage_params(args, stage: int) -> StageParams:
    """Build stage ``stage``'s chunks on the meta device and count what the rank holds."""
    chunks = meta_chunks(args, stage)
    dense = expert = sharded = shared = frozen_dense = frozen_expert = embedding = largest = 0
    for chunk in chunks:
        layers = list(chunk.decoder.layers) if getattr(chunk, "decoder", None) is not None else []
        largest = max([largest, *(sum(p.numel() for p in layer.parameters()) for layer in layers)])
        if getattr(chunk, "embedding", None) is not None and chunk.pre_process:  # (MTP's copy: the head's)
            embedding += sum(p.numel() for p in chunk.embedding.parameters())
        for p in chunk.parameters():
            n = p.numel()
            if not getattr(p, "allreduce", True):
                expert += n
                frozen_expert += 0 if p.requires_grad else n
                continue
            dense += n
            frozen_dense += 0 if p.requires_grad else n
            if getattr(p, "shared_embedding", False) and chunk.post_process and not chunk.pre_process:
                shared += n
            elif getattr(p, "tensor_model_parallel", False):
                sharded += n
    return StageParams(stage=stage, dense=dense, expert=expert, dense_tp_sharded=sharded, shared_embedding=shared,
                       chunks=tuple(_chunk(c) for c in chunks), frozen_dense=frozen_dense,
                       frozen_expert=frozen_expert, embedding=embedding,
                       head=_outside_layers(chunks) - embedding, largest_layer=largest)


def _outside_layers(chunks) -> int:
    """Parameters of the chunks outside their transformer layers (the embedding included; each counted once)."""
    inside = {id(p) for chunk in chunks if getattr(chunk, "decoder", None) is not None
              for layer in chunk.decoder.layers for p in layer.parameters()}
    return sum(p.numel() for chunk in chunks for p in chunk.parameters() if id(p) not in inside)


@contextlib.contextmanager
def cpu_backend_unless_active():
    """The CPU backend's bridge and patches while models are built, when no backend is active (the planner runs on
    a login node; the parameter shapes do not depend on the backend); an active backend is left as it is."""
    import mtmegatron
    from mtmegatron.backends.active import active_backend

    activated = active_backend() is None
    if activated:
        mtmegatron.activate("cpu")
    try:
        yield
    finally:
        if activated:
            mtmegatron.deactivate()


def all_stages(args) -> list[StageParams]:
    """Every pipeline stage (under ``cpu_backend_unless_active``)."""
    with cpu_backend_unless_active():
        return [stage_params(args, stage) for stage in range(args.pipeline_model_parallel_size)]
