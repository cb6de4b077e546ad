"""torch_dist checkpoints of a model wrapped in Megatron-FSDP (``--use-megatron-fsdp``; training/checkpoint/checkpointing.py
asks here), written as the same logical checkpoint a DDP + distributed-optimizer run writes.

megatron-core 0.16.1's distributed optimizer describes Megatron-FSDP state only as 'fsdp_dtensor' (its torch_dist
sharded state raises NotImplementedError). Each parameter of Megatron-FSDP is a DTensor sharded unevenly along dim 0
in whole rows (megatron_fsdp's make_fsdp_dtensor; the row offsets are computed here, one all-gather of the row
counts over the DP mesh dimension: the chunk metadata megatron-core 0.16.1 leaves on the optimizer parameters' local
tensors, ``__create_chunk_list__``, gave even-split offsets, e.g. 32 for a rank holding all 64 rows of a layer), and
megatron-core's dist_checkpointing takes irregular chunks: a ShardedTensor with ``axis_fragmentations=None`` (its
validation defers uneven sharding to torch DCP). So each parameter is described here by the key and global shape the
model's own ``sharded_state_dict`` gives it, with this rank's rows only (global offset: TP offset plus row offset;
zero-row chunks left out). The optimizer writes Adam's moments and its fp32 main weights (``param``) per parameter
under the distributed optimizer's fully reshardable keys (``optimizer.state.{param,exp_avg,exp_avg_sq}.<key>``),
its param groups with the step as ``DistributedOptimizer.state_dict`` gives them. The checkpoint therefore loads at
any layout under DDP + the distributed optimizer, under torch FSDP2 (training/checkpoint/fsdp_checkpoint.py), and in the HF
converter; and Megatron-FSDP loads theirs (and a plain optimizer's: FSDP2, DDP) by asking for the same rows, which
DCP fills in place (it reads by overlap). The model's weights are the optimizer's main weights cast to the model's
dtype (exact: Megatron-FSDP's model weights are that cast); after a load the main weights are copied into the model
weight buffers and all-gathered as after an optimizer step; a parameter the load leaves out (a LoRA base load keeps
the frozen base's entries only) keeps its main weights as the model's dtype holds them (bf16 LoRA: equal to bf16 DDP
exactly, docs/lora.md). Independent of the sharding strategy (no_shard: one chunk of all rows per rank, a DP replica).
Measured (tests/parallel/test_fsdp_checkpoint.py, fp32, optim_grads, DP2): a resumed run continues the one that
saved exactly; DDP + the distributed optimizer at DP2 and TP2 continue it within 1.2e-7; Megatron-FSDP continues a TP2
distributed-optimizer run exactly. By hand: no_shard, optim, optim_grads_params and bf16 (optim_grads) resume
exactly (optim_grads_params under DDP + the distributed optimizer within 1.2e-7), bf16 also under
DDP + the distributed optimizer; a GPT without SwiGLU at TP2 x DP2 resumes exactly under Megatron-FSDP at TP2 x DP2
and under DDP + the distributed optimizer at TP1 x DP2; Megatron-FSDP resumes FSDP2's checkpoint exactly.
May assume: a Megatron-FSDP run (megatron-core's mcore_fsdp_adapter.FullyShardedDataParallel chunks) with
megatron-core's DistributedOptimizer (possibly chained); no SwiGLU at TP>1, no expert or hybrid sharding
(refused by fsdp_flags._checkpoint_refusal); called on every rank.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
from megatron.core.dist_checkpointing.serialization import load_tensors_metadata
from torch.distributed.tensor import DTensor, Shard

from mtmegatron.training.checkpoint.plain_to_distributed_optimizer import groups_with_step
from mtmegatron.training.checkpoint.section import Checkpoint

_PREFIX = "optimizer.state"
_GROUP_IDENTITY = ("wd_mult", "lr_mult", "is_expert_parallel", "is_decoupled_lr")


def applies(checkpoint: Checkpoint) -> bool:
    return bool(checkpoint.use_megatron_fsdp)


def _unwrap(chunk):
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def _name(name: str) -> str:
    """A Megatron-FSDP parameter name as the model's state dict spells it (no wrapper prefix)."""
    while name.startswith("module."):
        name = name[len("module."):]
    return name


def _offsets(params: list[DTensor]) -> list[tuple[int, ...]]:
    """Where each parameter's local rows start in its global tensor: the rows of the lower DP ranks (one
    all-gather of every parameter's row count over the DP mesh dimension) plus, at TP>1, the TP offset."""
    rows = torch.tensor([p._local_tensor.shape[0] if isinstance(p.placements[0], Shard) else 0 for p in params],
                        dtype=torch.int64)
    mesh = params[0].device_mesh
    gathered = [torch.empty_like(rows) for _ in range(mesh.size(0))]
    torch.distributed.all_gather(gathered, rows, group=mesh.get_group(0))
    below = sum(gathered[:mesh.get_local_rank(0)], torch.zeros_like(rows)).tolist()
    offsets = []
    for param, row_offset in zip(params, below):
        offset = [row_offset] + [0] * (param.dim() - 1)
        for mesh_dim, placement in enumerate(param.placements[1:], start=1):  # TP: an even split (make_fsdp_dtensor)
            if isinstance(placement, Shard):
                offset[placement.dim] += param.device_mesh.get_local_rank(mesh_dim) * (
                    param.shape[placement.dim] // param.device_mesh.size(mesh_dim))
        offsets.append(tuple(offset))
    return offsets


class _Rows:
    """One parameter of one model chunk: its checkpoint key, this rank's chunk, the main weight (the optimizer's
    DTensor) and the model's dtype. Axes megatron-core prepends (the layer index of stacked layers) are written
    as leading axes of size 1 (megatron-core's torch strategy takes prepended axes on regular grids only)."""

    def __init__(self, template, param: DTensor, offset: tuple[int, ...]):
        if isinstance(template, ShardedTensorFactory):  # SwiGLU's [gate; up] at TP1: the parameter as it is
            built = template.build()
            first = next(iter(built.values())) if isinstance(built, dict) else built[0] if isinstance(
                built, (list, tuple)) else built
            template = replace(first, key=template.key, replica_id=template.replica_id)
        self.param, self.dtype, self.prepended = param, param.orig_param.dtype, template.prepend_axis_num
        replica = template.replica_id if isinstance(template.replica_id, tuple) else (0, 0, template.replica_id)
        dp_replica = 0 if isinstance(param.placements[0], Shard) else param.device_mesh.get_local_rank(0)
        leading = template.global_offset[:self.prepended]
        self.template = replace(
            template, data=None, replica_id=(*replica[:-1], dp_replica), axis_fragmentations=None,
            global_shape=(*template.global_shape[:self.prepended], *param.shape),
            global_offset=(*leading, *offset), prepend_axis_num=0, flattened_range=None,
            local_shape=(1,) * self.prepended + tuple(param._local_tensor.shape))

    @property
    def empty(self) -> bool:
        return self.param._local_tensor.numel() == 0

    def sharded(self, data: torch.Tensor, key: str | None = None) -> ShardedTensor:
        data = data.view((1,) * self.prepended + tuple(data.shape))
        return replace(self.template, key=key or self.template.key, data=data, dtype=data.dtype)


def _chunks(model, metadata: dict) -> list[tuple[dict, dict[str, _Rows]]]:
    """Per model chunk: (its sharded state dict, {state-dict name: _Rows} of every parameter Megatron-FSDP
    optimizes)."""
    chunks = []
    for chunk in model:
        template = _unwrap(chunk).sharded_state_dict(metadata=metadata)
        params = {_name(n): p for n, p in chunk.param_and_grad_buffer.optimizer_named_parameters if _name(n) in template}
        offsets = _offsets(list(params.values()))
        chunks.append((template, {n: _Rows(template[n], p, o) for (n, p), o in zip(params.items(), offsets)}))
    return chunks


_MODEL_DTYPE_LOADS: dict = {}  # id(model) -> {id(main weight): (main weight, buffer loaded in the model's dtype)}


def _model_entries(template: dict, rows: dict[str, _Rows], is_loading: bool, buffers: dict) -> dict:
    """A chunk's template with its parameters as this rank's rows (saving: the main weights cast to the model's
    dtype; loading: the main weights themselves, or a buffer of the model's dtype noted in ``buffers``)."""
    entries = {k: v for k, v in template.items() if k not in rows}
    for name, row in rows.items():
        if row.empty:
            continue
        local = row.param._local_tensor
        if local.dtype == row.dtype:
            data = local if is_loading else local.detach()
        elif is_loading:  # starts as the model weight: a parameter the load leaves out (a LoRA base load's
            data = local.detach().to(row.dtype)  # adapters) keeps its weights in finish_load
            buffers[id(row.param)] = (row.param, data)
        else:
            data = local.detach().to(row.dtype)
        entries[name] = row.sharded(data)
    return entries


def _inner(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _optimizer_entries(inner, by_param: dict, is_loading: bool, stored, buffers: dict) -> dict:
    """One inner optimizer's per-parameter tensors, keyed by the parameter's index in its torch state dict: Adam's
    moments (in place) and the main weights. Loading, the main weights are asked for (the distributed optimizer's
    ``param``, a plain mixed-precision optimizer's ``fp32_param``) only where the model's dtype is not theirs (the
    model's entry loads them otherwise)."""
    params = [p for group in inner.optimizer.param_groups for p in group["params"]]
    param_state = {}
    for index, param in enumerate(params):
        row, current = by_param.get(id(param)), inner.optimizer.state.get(param)
        if row is None or row.empty or not current:
            continue
        key = row.template.key
        tensors = {k: current[k]._local_tensor for k in ("exp_avg", "exp_avg_sq")}
        if not is_loading:
            tensors["param"] = param._local_tensor
        elif row.dtype != param.dtype:
            for name in ("param", "fp32_param"):
                if f"{_PREFIX}.{name}.{key}" in stored:
                    tensors[name] = param._local_tensor
                    buffers.pop(id(param), None)  # the main weights come from the optimizer's entry
                    break
        param_state[index] = {("param" if k == "fp32_param" else k): row.sharded(
            v if is_loading else v.detach(), f"{_PREFIX}.{k}.{key}") for k, v in tensors.items()}
    return param_state


def sharded_state(model, keys: list[str], optimizer, metadata: dict, directory: str | None = None) -> dict:
    """The model's (under ``keys``) and, unless ``optimizer`` is None, the optimizer's sharded state: to save, or,
    with the checkpoint's ``directory``, to load (the optimizer's state is first materialised, as megatron-core does
    for its own fsdp_dtensor load)."""
    is_loading = directory is not None
    chunks, buffers = _chunks(model, metadata), {}
    state = {key: _model_entries(template, rows, is_loading, buffers) for key, (template, rows) in zip(keys, chunks)}
    if optimizer is not None:
        by_param = {id(row.param): row for _, rows in chunks for row in rows.values()}
        stored = load_tensors_metadata(directory) if is_loading else None
        states = []
        for inner in _inner(optimizer):
            if is_loading and not inner.optimizer.state:
                inner._init_optimizer_states_with_dummy_values()
            common = {} if is_loading else {**inner.state_dict(), "param_state_sharding_type": "fully_reshardable"}
            states.append({**common, "param_state": _optimizer_entries(inner, by_param, is_loading, stored, buffers)})
        state["optimizer"] = states[0] if len(states) == 1 else dict(enumerate(states))
    _MODEL_DTYPE_LOADS[id(model)] = buffers
    return state


def _saved_groups(saved: dict) -> list[dict]:
    """The checkpoint's param groups with the step: a distributed optimizer's, or a plain one's (its step as
    'common_step')."""
    if "param_state_sharding_type" in saved:
        return saved["optimizer"]["param_groups"]
    return groups_with_step(saved)


def optimizer_state_to_load(loaded: dict, optimizer) -> dict:
    """The loaded optimizer state as Megatron-FSDP's distributed optimizer loads it (a torch optimizer's state dict:
    its DTensor state, filled in place, with the step; the checkpoint's param groups)."""
    inner_optimizers = _inner(optimizer)
    entries = [loaded] if len(inner_optimizers) == 1 else [loaded[i] for i in range(len(inner_optimizers))]
    states = []
    for inner, saved in zip(inner_optimizers, entries):
        groups = _saved_groups(saved)
        by_identity = {tuple(g.get(k) for k in _GROUP_IDENTITY): g for g in groups}
        ours = inner.optimizer.state_dict()["param_groups"]
        param_groups = [{**{k: v for k, v in by_identity[tuple(g.get(k) for k in _GROUP_IDENTITY)].items()
                            if k != "step"}, "params": g["params"]} for g in ours]
        step = torch.tensor(float(groups[0]["step"]))
        params = [p for group in inner.optimizer.param_groups for p in group["params"]]
        state = {index: {**inner.optimizer.state[p], "step": step.clone()}
                 for index, p in enumerate(params) if inner.optimizer.state.get(p)}
        states.append({"state": state, "param_groups": param_groups})
    return states[0] if len(states) == 1 else dict(enumerate(states))


def finish_load(model) -> None:
    """After a load: main weights the checkpoint gave only in the model's dtype take the loaded model weights; then
    the main weights go into the model weight buffers and are all-gathered (as after an optimizer step)."""
    for param, data in _MODEL_DTYPE_LOADS.pop(id(model), {}).values():
        param._local_tensor.copy_(data)
    for chunk in model:
        chunk.param_and_grad_buffer.copy_main_weights_to_model_weights()
        chunk.start_param_sync(force_sync=True)
