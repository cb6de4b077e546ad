"""Megatron-LM's conventions for the non-tensor part of a ``torch_dist`` checkpoint, read and written here.

Megatron-LM core_v0.16.1 (megatron/training/checkpointing.py) stores in a checkpoint's common state: ``args``
(its argparse Namespace), ``checkpoint_version`` 3.0, ``iteration``, ``opt_param_scheduler`` (the scheduler's
state), ``num_floating_point_operations_so_far``, and ``content_metadata`` (how the optimizer was sharded:
``distrib_optim_sharding_type`` etc.); the model under ``model`` (``model0``, ``model1``... with virtual
pipeline stages), the optimizer under ``optimizer`` and the RNG states as the sharded object ``rng_state`` (a
one-element list of ``{random_rng_state, np_rng_state, torch_rng_state, cuda_rng_state, rng_tracker_states}``
per (PP, TP) rank). mtmegatron writes the same keys (``args`` holds our flags under Megatron-LM's dests plus the
attributes its loader reads: ``consumed_train_samples``, ``world_size``, ``padded_vocab_size``...), so each side
loads the other's checkpoints; what only mtmegatron uses sits under the extra key ``mtmegatron``.
The data position is Megatron-LM's too: ``args.consumed_train_samples`` (the next training sample; with
``skipped_train_samples`` and ``consumed_valid_samples``) is written from the run's counters and read back on
load, whichever side wrote the checkpoint (for one without it, Megatron-LM's rule: iteration x global batch).
``num_floating_point_operations_so_far`` is carried over from a loaded Megatron-LM checkpoint, else 0 (not
counted here). ``cuda_rng_state`` holds the device generator of whatever accelerator ran (the host generator on
the cpu backend, as Megatron-LM on the CPU bridge writes it).
May assume: megatron-core's parallel state is initialised when the RNG/metadata helpers are called.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch

from mtmegatron.backends.device import compute_device, on_host

CHECKPOINT_VERSION = 3.0
OURS = "mtmegatron"  # common-state key of what only mtmegatron reads
_PLAIN = (type(None), bool, int, float, str)

# Megatron-LM's load_args_from_checkpoint: (dest, force) — forced ones always come from the checkpoint, the
# others only when the user did not give the flag.
CHECKPOINT_MODEL_ARGS = (
    ("num_layers", False), ("hidden_size", False), ("ffn_hidden_size", False), ("seq_length", False),
    ("num_attention_heads", False), ("num_query_groups", True), ("group_query_attention", True),
    ("kv_channels", False), ("max_position_embeddings", False), ("position_embedding_type", True),
    ("add_position_embedding", True), ("rotary_base", True), ("rotary_percent", True),
    ("rotary_interleaved", True), ("add_bias_linear", True), ("add_qkv_bias", True), ("squared_relu", True),
    ("swiglu", True), ("untie_embeddings_and_output_weights", True), ("apply_layernorm_1p", True),
    ("normalization", True), ("apply_query_key_layer_scaling", True), ("attention_dropout", True),
    ("hidden_dropout", True), ("num_experts", True), ("moe_layer_freq", True), ("moe_ffn_hidden_size", True),
    ("moe_router_topk", True), ("moe_token_dispatcher_type", False), ("moe_router_pre_softmax", True),
    ("moe_shared_expert_intermediate_size", True), ("moe_router_score_function", True),
    ("moe_router_enable_expert_bias", True), ("moe_router_topk_scaling_factor", True),
    # beyond Megatron-LM's list: fields that fix shapes or math here and that its Namespace also holds
    ("layernorm_epsilon", True), ("qk_layernorm", True), ("multi_latent_attention", True), ("q_lora_rank", True),
    ("kv_lora_rank", True), ("qk_head_dim", True), ("qk_pos_emb_head_dim", True), ("v_head_dim", True),
    ("mtp_num_layers", True), ("make_vocab_size_divisible_by", False),
)


def _plain(value):
    """``value`` if it pickles without any mtmegatron class (Megatron-LM must unpickle it), else None."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return type(value)(items) if all(i is not None or v is None for i, v in zip(items, value)) else None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if isinstance(k, str)}
    return None


DATA_POSITION = ("consumed_train_samples", "skipped_train_samples", "consumed_valid_samples")


def saved_namespace(args, iteration: int, world_size: int, position: dict | None = None) -> argparse.Namespace:
    """Our flags as Megatron-LM's ``args``: every plain-valued attribute, plus what its loader reads; ``position``
    holds the DATA_POSITION counters (default: ``iteration`` whole global batches, nothing skipped)."""
    ns = argparse.Namespace(**{k: _plain(v) for k, v in vars(args).items() if not k.startswith("_")})
    position = position or {}
    # Megatron-LM resumes its samplers at these counts
    ns.consumed_train_samples = position.get("consumed_train_samples", iteration * args.global_batch_size)
    ns.skipped_train_samples = position.get("skipped_train_samples", 0)
    ns.consumed_valid_samples = position.get("consumed_valid_samples", 0)
    ns.world_size = world_size
    ns.ckpt_format = "torch_dist"
    ns.use_dist_ckpt = True
    ns.iteration = iteration
    return ns


def is_megatron_lm_layout(common: dict) -> bool:
    """Megatron-LM's layout (its own checkpoints, and ours since this module): a Namespace ``args``."""
    return isinstance(common.get("args"), argparse.Namespace)


def written_by_megatron_lm(common: dict) -> bool:
    return is_megatron_lm_layout(common) and OURS not in common


def recorded_fingerprint(common: dict) -> dict:
    """The model fingerprint a checkpoint's common state records, whichever layout wrote it: ours under
    ``OURS``, else read from Megatron-LM's Namespace, else (the older mtmegatron layout and the converter's
    model-only checkpoints) the fingerprint dict stored as ``args``."""
    if is_megatron_lm_layout(common):
        ours = common.get(OURS)
        return ours["fingerprint"] if ours else model_fingerprint(common["args"])
    return common.get("args") or {}


def model_fingerprint(ns: argparse.Namespace) -> dict:
    """The model fingerprint (models/fingerprint.py) of a Megatron-LM Namespace, in our field names. Fields
    that are defaults of an unused feature in Megatron-LM (MLA sizes without MLA, MoE fields without experts)
    and ``vocab_size`` (its tokenizer's, not the model's rows: ``padded_vocab_size`` is) are left out."""
    from mtmegatron.models.fingerprint import FINGERPRINT_FIELDS, _normal

    values = {k: getattr(ns, k) for k in FINGERPRINT_FIELDS if hasattr(ns, k)}
    values.pop("vocab_size", None)
    if hasattr(ns, "add_bias_linear"):
        values["disable_bias_linear"] = not ns.add_bias_linear
    if hasattr(ns, "layernorm_epsilon"):
        values["norm_epsilon"] = ns.layernorm_epsilon
    if not getattr(ns, "group_query_attention", True):
        values["num_query_groups"] = getattr(ns, "num_attention_heads", None)
    if getattr(ns, "use_rope_scaling", False):  # Megatron-LM always scales with megatron-core's fixed values
        from mtmegatron.models.families.gpt import LLAMA3_SCALING_DEFAULTS

        values = {**LLAMA3_SCALING_DEFAULTS, **values}
    if not getattr(ns, "multi_latent_attention", False):
        for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "rope_type",
                  "rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                  "mscale_all_dim"):
            values.pop(k, None)
    if not getattr(ns, "num_experts", None):
        for k in list(values):
            if k.startswith("moe_"):
                values.pop(k)
    return {k: _normal(v) for k, v in values.items()}


def content_metadata(use_distributed_optimizer: bool) -> dict:
    """Megatron-LM's sharded_state_dict metadata (its _build_sharded_state_dict_metadata with
    --dist-ckpt-optim-fully-reshardable), without the process group: stored with the checkpoint."""
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if use_distributed_optimizer:
        metadata.update(distrib_optim_sharding_type="fully_reshardable",
                        distrib_optim_fully_reshardable_mem_efficient=False)
    return metadata


def _device_rng_state():
    device = compute_device()
    if on_host(device):
        return torch.get_rng_state()
    return torch.get_device_module(device.type).get_rng_state(device)


def rng_shape() -> tuple:
    """The shape of Megatron-LM's sharded ``rng_state`` in this run: one per (PP, TP) rank, and per DP rank too
    under expert parallelism (its get_rng_state)."""
    from megatron.core import parallel_state as ps

    shape = (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size())
    if ps.get_expert_model_parallel_world_size() > 1:
        return shape + (ps.get_data_parallel_world_size(with_context_parallel=True),)
    return shape


def stored_rng_shape(directory: str) -> tuple | None:
    """The shape of the ``rng_state`` a checkpoint holds, from its metadata (megatron-core names each shard of a
    sharded object ``rng_state/shard_<offset>_<shape>``); None without one."""
    from torch.distributed.checkpoint import FileSystemReader

    for key in FileSystemReader(directory).read_metadata().state_dict_metadata:
        if key.startswith("rng_state/shard_"):
            return tuple(int(n) for n in key.rsplit("_", 1)[1].split("."))
    return None


def rng_state_object():
    """This rank's RNG states as Megatron-LM's sharded object ``rng_state`` (``rng_shape()``: one per (PP, TP)
    rank, replicated over DP; one per (PP, TP, DP) rank under expert parallelism)."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = [{
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": _device_rng_state(),
        "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }]
    ps = parallel_state
    offset = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank())
    dp_rank = ps.get_data_parallel_rank(with_context_parallel=True)
    shape = rng_shape()
    if len(shape) == 3:
        return ShardedObject("rng_state", state, shape, offset + (dp_rank,), replica_id=0)
    return ShardedObject("rng_state", state, shape, offset, replica_id=dp_rank)


def restore_rng(saved) -> None:
    """Set the host, numpy, device and model-parallel tracker RNGs from a loaded ``rng_state`` (Megatron-LM's
    list form)."""
    from megatron.core import tensor_parallel

    state = saved[0] if isinstance(saved, (list, tuple)) else saved
    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    device = compute_device()
    if on_host(device):
        torch.set_rng_state(state["cuda_rng_state"])
    else:
        torch.get_device_module(device.type).set_rng_state(state["cuda_rng_state"], device)
    tracker = tensor_parallel.get_cuda_rng_tracker()
    graph_safe = tensor_parallel.is_graph_safe_cuda_rng_tracker(tracker)
    tracker.set_states({k: tensor_parallel.convert_cuda_rng_state(v, to_graphable=graph_safe)
                        for k, v in state["rng_tracker_states"].items()})


def apply_checkpoint_args(args, ns: argparse.Namespace, given: dict, ours: bool) -> list[str]:
    """``--use-checkpoint-args``: set the model fields of ``args`` from the checkpoint's Namespace, as
    Megatron-LM's load_args_from_checkpoint does (forced fields always; the others unless given on the command
    line). The vocabulary is the checkpoint's (Megatron-LM's padded one: its rows are the model's). Returns
    the ``dest=value`` lines it set."""
    changed = []
    for dest, force in CHECKPOINT_MODEL_ARGS:
        if not hasattr(ns, dest) or (not force and dest in given) or not hasattr(args, dest):
            continue
        value = getattr(ns, dest)
        if value is None and not force:
            continue
        if getattr(args, dest) != value:
            changed.append(f"{dest}={value}")
        setattr(args, dest, value)
    if "vocab_size" not in given:
        vocab = ns.vocab_size if ours else getattr(ns, "padded_vocab_size", None)
        if vocab is not None and vocab != args.vocab_size:
            args.vocab_size = vocab
            changed.append(f"vocab_size={vocab}")
    return changed
