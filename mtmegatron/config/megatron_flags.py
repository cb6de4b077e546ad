"""Every flag of Megatron-LM core_v0.16.1's ``arguments.py``, recognised by ``mtmegatron.pretrain``.

The flag facts (option string, dest, action, default, choices, type, nargs) are data:
``megatron_lm_flags.tsv`` beside this file (made by scripts/make_megatron_flag_table.py from the shared table
and Megatron-LM's parser). Flags that some mtmegatron module registers by hand are *honoured* (the code reads
them); every other option string is registered here from the table with Megatron-LM's default, and is one of:
- a **config field**: its dest is a field of megatron-core's TransformerConfig / MLATransformerConfig /
  OptimizerConfig / DistributedDataParallelConfig, copied into that config by name (models/config_from_flags.py);
- a **no-op**: accepted without effect, because it is a no-op (deprecated) in Megatron-LM 0.16 too;
- **refused**: giving it a value other than its default is one ``ConfigError`` line naming the flag and why.
May assume: nothing but argparse; called by arguments.build_parser / arguments.parse_args.
"""

from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import functools
from pathlib import Path

from mtmegatron.utils.errors import ConfigError

TABLE = Path(__file__).with_name("megatron_lm_flags.tsv")
GROUP_TITLE = "other Megatron-LM flags (defaults as in Megatron-LM; see --help of each)"


@dataclasses.dataclass(frozen=True)
class FlagRow:
    flag: str
    dest: str
    action: str
    default: str   # Python repr, as Megatron-LM's parser holds it
    choices: str
    type: str
    nargs: str
    const: str

    @property
    def default_value(self):
        return python_value(self.default)


def python_value(text: str):
    """The value behind a repr in the table; enum members (``<AttnBackend.auto: 5>``) become their name."""
    if text.startswith("<") and "." in text and ":" in text:
        return text[1:].split(":", 1)[0].split(".", 1)[1]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


@functools.cache
def table() -> tuple[FlagRow, ...]:
    with open(TABLE, newline="") as f:
        return tuple(FlagRow(**row) for row in csv.DictReader(f, delimiter="\t"))


# --- no-ops: deprecated in Megatron-LM 0.16, where they do nothing either -------------------------------------
NOOP = {
    "deprecated_use_mcore_models": "megatron-core models are the only ones (as in Megatron-LM 0.16)",
    "use_dist_ckpt_deprecated": "deprecated in Megatron-LM 0.16 (see --ckpt-format)",
    "dist_ckpt_format_deprecated": "deprecated in Megatron-LM 0.16 (see --ckpt-format)",
    "ckpt_fully_parallel_save_deprecated": "deprecated in Megatron-LM 0.16 (fully parallel save is the default)",
    "local_rank": "set by legacy launchers; the local rank is read from LOCAL_RANK (torchrun), as Megatron-LM does",
    # nothing to act on here (a start-up line says so when given)
    "use_persistent_ckpt_worker": "it keeps megatron-core's --async-save worker alive; saves here are synchronous "
                                  "(--async-save is refused)",
    # read nowhere by Megatron-LM 0.16.1's megatron-core models and training loop (only by its legacy models)
    "head_lr_mult": "Megatron-LM 0.16.1 reads it nowhere (a leftover of its vision fine-tuning)",
    "openai_gelu": "read only by Megatron-LM's legacy models; megatron-core models ignore it in Megatron-LM 0.16",
    "scatter_gather_tensors_in_pipeline": "Megatron-LM 0.16.1 reads it nowhere (megatron-core's p2p sends whole "
                                          "tensors)",
    "exit_signal_handler_for_dataloader": "Megatron-LM 0.16.1 reads it nowhere (its data-loader workers take the "
                                          "handler with --exit-signal-handler, as here)",
    # megatron-core config fields that megatron-core 0.16.1 declares but reads nowhere (grep of the installed
    # package: only the dataclass field), so Megatron-LM 0.16.1's megatron-core models ignore them too
    "apply_residual_connection_post_layernorm": "a megatron-core TransformerConfig field that megatron-core 0.16.1 "
                                                "reads nowhere (only Megatron-LM's legacy models did): a no-op in "
                                                "Megatron-LM 0.16.1's megatron-core models too",
    "async_tensor_model_parallel_allreduce": "a megatron-core config field that megatron-core 0.16.1 reads nowhere "
                                             "(the overlap is always on): a no-op in Megatron-LM 0.16.1 too",
    "moe_extended_tp": "a megatron-core config field that megatron-core 0.16.1 reads nowhere (extended TP was "
                       "removed): a no-op in Megatron-LM 0.16.1 too",
}

# --- dests registered from the table (no module adds them by hand) that mtmegatron code reads --------------------
READ_BY_CODE = frozenset({
    "accumulate_allreduce_grads_in_fp32", "grad_reduce_in_bf16", "use_flash_attn", "use_rope_scaling",
    "rope_scaling_factor", "rotary_seq_len_interpolation_factor", "rotary_percent", "fp16_lm_cross_entropy",
    "squared_relu", "init_method_xavier_uniform", "bias_gelu_fusion", "bias_swiglu_fusion", "no_persist_layer_norm",
    "check_for_nan_in_loss_and_grad", "ddp_average_in_collective", "ddp_pad_buckets_for_high_nccl_busbw",
    "ddp_reduce_scatter_with_fp32_accumulation", "recompute_activations", "use_rotary_position_embeddings",
    "num_virtual_stages_per_pipeline_rank", "add_position_embedding", "decoder_last_pipeline_num_layers",
    # fusion switches: models/fusions.py decides what runs on the backend
    "masked_softmax_fusion", "bias_dropout_fusion", "apply_rope_fusion", "gradient_accumulation_fusion",
    "cross_entropy_loss_fusion",
    # the data position (data/position.py; checks in config/schedule_flags.py)
    "rampup_batch_size", "iterations_to_skip",
    # result validation (training/resilience/rerun.py), non-persistent checkpoints (training/checkpoint/non_persistent.py), memory history
    "rerun_mode", "check_for_spiky_loss", "error_injection_rate", "error_injection_type",
    "result_rejected_tracker_filename", "non_persistent_ckpt_type", "non_persistent_global_ckpt_dir",
    "record_memory_history", "memory_snapshot_path",
    # config/training_flags.py: data loader, optimizer param groups, DDP buckets, rank order, logging, dataset
    # builder fields
    "dataloader_type", "no_weight_decay_cond_type", "ddp_num_buckets", "use_tp_pp_dp_mapping", "logging_level",
    "quick_geglu", "dump_param_to_param_group_map", "num_dataset_builder_threads", "mid_level_dataset_surplus",
    "allow_ambiguous_pad_tokens", "dataloader_fast_cache_load", "dataloader_defer_npy_index_mmap",
    "per_dataset_sequences_path",
    "log_progress",  # training/observability/progress_log.py: <--save>/progress.txt
    "log_loss_scale_to_tensorboard",  # training/observability/run_hooks.py: keeps loss_scale out of tensorboard and wandb
    "log_memory_interval", "log_device_memory_used",  # training/observability/memory_report.py
    "check_weight_hash_across_dp_replicas_interval",  # training/resilience/weight_hash.py
    "distributed_timeout_seconds_after_init",  # training/resilience/pg_timeout.py
    "skip_train",  # training/loop.py: validation at the loaded iteration, no step, no save
    "align_grad_reduce",  # training/overlap.py: the schedule launches each chunk's grad reduce
    "padded_vocab_size",  # models/vocab.py: the embedding's rows as given
    "full_validation", "multiple_validation_sets",  # training/evaluate.py: whole validation sets, one loss per set
    "ckpt_convert_format", "ckpt_convert_save",  # pretrain.py: save the loaded checkpoint as torch_dist, exit
    "moe_use_upcycling", "moe_upcycling_granularity",  # training/checkpoint/upcycling.py: a dense checkpoint becomes the MoE
    # config/fsdp_flags.py: the engine that wraps the model chunks, its sharding and the combinations refused
    "use_megatron_fsdp", "data_parallel_sharding_strategy", "use_torch_fsdp2", "torch_fsdp2_reshard_after_forward",
    "fsdp_double_buffer",
    # meta-device init (training/meta_init.py) and HSDP (training/setup.py's groups; checks in fsdp_flags.py)
    "init_model_with_meta_device", "num_distributed_optimizer_instances", "outer_dp_sharding_strategy",
    # config/memory_flags.py: activation offloading, checked against the backend (off with a line on the host)
    "fine_grained_activation_offloading", "offload_modules", "min_offloaded_tensor_size", "cpu_offloading_num_layers",
})

# --- refusals with their reasons -------------------------------------------------------------------------------
_TE_ONLY = "needs TransformerEngine, which this backend does not have"
_CUDA_GRAPHS = "CUDA graphs are not supported by mtmegatron (they need a CUDA/MUSA graph capture path it lacks)"
_INFERENCE = "inference-server flag: mtmegatron.pretrain trains; use `mtmegatron generate` for generation"
_RL = "reinforcement-learning training is not part of mtmegatron"
_OTHER_MODELS = "model type not supported here (GPT-style decoders and LLaVA only)"
_SERVICES = "integration with an NVIDIA service/library that mtmegatron does not ship"
_NOT_YET = "not implemented in mtmegatron"
_BERT_T5_RETRIEVAL = "a BERT/T5/ICT/REALM (retrieval) flag: this trainer builds GPT-style decoders (and LLaVA)"
_VISION = "a vision-pretraining (ViT classification/inpainting/DINO) flag: this trainer builds GPT-style decoders"
_INFERENCE_ENGINE = ("an inference engine/server flag: mtmegatron.pretrain trains; `mtmegatron generate` has its "
                     "own flags")
_NVIDIA_TOOLING = "NVIDIA cluster tooling with no MUSA/CPU counterpart here"
_FSDP = "not implemented in mtmegatron (Megatron-FSDP's HSDP and fsdp_dtensor checkpoints are not wired in)"
_LOCAL_CKPT = ("nvidia-resiliency-ext's local-checkpoint replication: --non-persistent-ckpt-type local is refused "
               "here")
_FIM = ("fill-in-the-middle samples: Megatron-LM's GPTFIMDataset is part of Megatron-LM's training package, not of "
        "megatron-core, and mtmegatron has no FIM dataset yet")
_DATA_ARGS_FILES = ("data blends from a file: Megatron-LM's --data-args-path family is read by its training "
                    "package; give the blend as --data-path (or --train/valid/test-data-path)")
_LEGACY_TOKENIZER = ("Megatron-LM's legacy tokenizer package is not part of megatron-core; mtmegatron's tokenizers "
                     "are --tokenizer-type's (config/tokenizer_flags.py)")

# Flags a module reads ("honoured") of which config/arguments.py's validation refuses some values: dest -> which
# (the flag report says so instead of a plain "honoured"; tests/flags check each refusal really happens)
PARTLY_REFUSED = {
    "moe_aux_loss_coeff": "several values (per-type load balancing) are refused; give one",
    "moe_router_load_balancing_type": "several values (per-type load balancing) are refused; give one",
    "cp_comm_type": "one value for all layers; per-layer lists need TransformerEngine",
    "fp16": "refused with --use-distributed-optimizer and with FP8 (use --bf16)",
    "add_position_embedding": "--no-position-embedding is refused unless --position-embedding-type rope "
                              "(deprecated; Megatron-LM raises too)",
    "dataloader_type": "cyclic (its per-epoch shuffle is not built) and external (no hook for a user's "
                       "dataloader); single, Megatron-LM's default, is honoured",
    "rerun_mode": "report_stats (megatron-core 0.16.1 cannot run it); validate_results and disabled are honoured",
    **dict.fromkeys(("fine_grained_activation_offloading", "cpu_offloading_num_layers"),
                    "without TransformerEngine (megatron-core offloads in TE's cpu_offload) and outside megatron-"
                    "core's rules; off, with a start-up line, where the device is the host"),
    "non_persistent_ckpt_type": "local (nvidia-resiliency-ext's local checkpoints are not wired in) and in_memory "
                                "(Megatron-LM 0.16 refuses it too); global is honoured",
}

# dest -> reason, for dests where the reason is specific
REFUSED = {
    "batch_size": "no longer valid in Megatron-LM: use --micro-batch-size",
    "warmup": "no longer valid in Megatron-LM: use --lr-warmup-fraction",
    "model_parallel_size": "no longer valid in Megatron-LM: use --tensor-model-parallel-size",
    "checkpoint_activations": "no longer valid in Megatron-LM: use --recompute-granularity/--recompute-method",
    "use_legacy_models": "legacy (non-megatron-core) models were removed; mtmegatron builds megatron-core models",
    "tp_comm_overlap": _TE_ONLY + " (userbuffers)",
    "fp8_param_gather": _TE_ONLY + " (FP8 parameters)",
    "fp4": _TE_ONLY, "fp4_recipe": _TE_ONLY, "fp4_param": _TE_ONLY,
    "te_rng_tracker": _TE_ONLY, "te_precision_config_file": _TE_ONLY,
    "enable_cuda_graph": _CUDA_GRAPHS, "external_cuda_graph": _CUDA_GRAPHS, "cuda_graph_impl": _CUDA_GRAPHS,
    "cuda_graph_scope": _CUDA_GRAPHS, "cuda_graph_warmup_steps": _CUDA_GRAPHS,
    "use_custom_fsdp": "deprecated in Megatron-LM: use --use-megatron-fsdp",
    "heterogeneous_layers_config_path": "heterogeneous (NAS) layer configs are not supported; DeepSeek-style "
                                        "dense/MoE patterns use --moe-layer-freq",
    "yaml_cfg": "YAML configs are not read: pass the flags",
    "spec": "custom layer-spec modules are not loaded: use --transformer-impl",
    "is_hybrid_model": "hybrid (Mamba) models are not supported",
    "hybrid_override_pattern": "hybrid (Mamba) models are not supported",
    "mock_data_json": _NOT_YET,
    "non_persistent_local_ckpt_dir": "only for --non-persistent-ckpt-type local, which is refused here "
                                     "(nvidia-resiliency-ext's local checkpoints are not wired in)",
    "non_persistent_local_ckpt_algo": "only for --non-persistent-ckpt-type local, which is refused here "
                                      "(nvidia-resiliency-ext's local checkpoints are not wired in)",
    "distributed_backend": "the collective library follows --backend (nccl on cuda, mccl on musa, gloo on cpu)",
    **dict.fromkeys(("block_data_path", "titles_data_path", "evidence_data_path", "embedding_path", "mask_prob",
                     "short_seq_prob", "query_in_block_prob", "use_one_sent_docs", "output_bert_embeddings",
                     "vocab_extra_ids", "encoder_num_layers", "encoder_seq_length",
                     "relative_attention_max_distance", "relative_attention_num_buckets", "indexer_batch_size",
                     "indexer_log_interval", "sample_rate"), _BERT_T5_RETRIEVAL),
    **dict.fromkeys(("vision_pretraining", "vision_pretraining_type", "vision_backbone_type", "swin_backbone_type",
                     "num_classes", "num_channels", "classes_fraction", "data_per_class_fraction", "iter_per_epoch",
                     "mask_type", "mask_factor"), _VISION),
    **dict.fromkeys(("enable_chunked_prefill", "decode_only_cuda_graphs", "nccl_all_reduce_for_prefill",
                     "use_legacy_static_engine", "inference_wandb_logging", "disable_chunked_prefill",
                     "moe_pad_experts_for_cuda_graph_inference",
                     "tokenizer_metadata"), _INFERENCE_ENGINE),
    **dict.fromkeys(("perform_rl_step", "refit_method", "train_sync_interval"), _RL),
    "use_sharp": _NVIDIA_TOOLING + " (InfiniBand SHARP in NCCL)",
    "sharp_enabled_group": _NVIDIA_TOOLING + " (InfiniBand SHARP in NCCL)",
    "log_straggler": _NVIDIA_TOOLING + " (the straggler detector of nvidia-resiliency-ext)",
    "log_energy": _NVIDIA_TOOLING + " (the energy monitor reads NVML)",
    "calc_ft_timeouts": _NVIDIA_TOOLING + " (nvidia-resiliency-ext fault tolerance)",
    "nccl_communicator_config_path": _NVIDIA_TOOLING + " (a YAML of NCCL communicator settings)",
    "high_priority_stream_groups": _NVIDIA_TOOLING + " (NCCL high-priority communicator streams)",
    "object_storage_cache_path": _SERVICES + " (Multi-Storage Client / S3 data loading)",
    "strict_fsdp_dtensor_load": _FSDP,
    "enable_full_sharding_in_hsdp": "Megatron-LM 0.16.1 declares it but neither it nor megatron-core 0.16.1 reads "
                                    "it (it would do nothing); HSDP's outer sharding is --outer-dp-sharding-strategy",
    **dict.fromkeys(("replication", "replication_jump", "replication_factor"), _LOCAL_CKPT),
    "heterogeneous_layers_config_encoded_json": "heterogeneous (NAS) layer configs are not supported; "
                                                "DeepSeek-style dense/MoE patterns use --moe-layer-freq",
    **dict.fromkeys(("hybrid_attention_ratio", "hybrid_mlp_ratio"), "hybrid (Mamba) models are not supported"),
    **dict.fromkeys(("fim_data", "fim_rate", "fim_spm_rate", "fim_split_sample", "fim_fragment_rate",
                     "fim_no_prefix", "fim_prefix_token", "fim_middle_token", "fim_suffix_token", "fim_pad_token",
                     "fim_eod_token"), _FIM),
    **dict.fromkeys(("data_args_path", "per_split_data_args_path"), _DATA_ARGS_FILES),
    "decoder_num_layers": "Megatron-LM 0.16 reads it only in its legacy models and pretrain_vlm.py (the language "
                          "model's layers); give --num-layers",
    "legacy_tokenizer": _LEGACY_TOKENIZER,
    "data_sharding": "only for --dataloader-type cyclic, which is refused here",
    "onnx_safe": "ONNX export workarounds: mtmegatron exports checkpoints (`mtmegatron convert`), not ONNX graphs",
    "fake_process_group": "torch's fake process group (no communication, for memory estimation) is not wired in: "
                          "the cpu backend runs the real collectives over gloo",
    "lazy_mpu_init": "for external launchers that initialise model parallelism themselves; mtmegatron.pretrain "
                     "initialises it",
    "dist_ckpt_save_pre_mcore_014": "writes the checkpoint layout of megatron-core < 0.14; mtmegatron saves with "
                                    "megatron-core 0.16's",
    "mock_data_json": "Megatron-LM's multimodal mock-data description; --mock-data builds megatron-core's mock GPT "
                      "dataset (LLaVA: --mock-data with the llava preset)",
    "ckpt_convert_update_legacy_dist_opt_format": "it rewrites the distrib_optim.pt of a legacy --ckpt-format "
                                                  "torch checkpoint saved before Feb 2024; mtmegatron reads no "
                                                  "--ckpt-format torch checkpoint (convert those with Megatron-LM)",
    "check_for_large_grads": "megatron-core's in-DDP large-gradient check is not wired in: this loop handles NaN/Inf "
                             "gradients itself (training/resilience/robustness.py, --no-check-for-nan-in-loss-and-grad)",
    "moe_per_layer_logging": "Megatron-LM's per-layer MoE metrics (its training loop's track_moe_metrics) are not "
                             "logged here; megatron-core reads the field nowhere",
    "enable_experimental": "megatron-core's experimental-feature switch: none of its experimental features is wired "
                           "into mtmegatron",
}

# option-string prefixes -> reason (the first match wins), for whole families of flags
_PREFIX_REASONS = (
    ("--inference-", _INFERENCE), ("--flash-decode", _INFERENCE), ("--max-tokens-to-oom", _INFERENCE),
    ("--mlp-chunks-for-prefill", _INFERENCE), ("--return-log-probs", _INFERENCE), ("--top-", _INFERENCE),
    ("--rl-", _RL), ("--no-rl-", _RL), ("--langrl", _RL), ("--no-langrl", _RL), ("--grpo-", _RL),
    ("--retro-", _OTHER_MODELS), ("--bert-", _OTHER_MODELS), ("--ict-", _OTHER_MODELS), ("--t5-", _OTHER_MODELS),
    ("--biencoder-", _OTHER_MODELS), ("--retriever-", _OTHER_MODELS), ("--dino-", _OTHER_MODELS),
    ("--mamba-", "hybrid (Mamba) models are not supported"),
    ("--ft-", _SERVICES), ("--straggler", _SERVICES), ("--disable-straggler", _SERVICES),
    ("--inprocess-", _SERVICES), ("--enable-one-logger", _SERVICES), ("--one-logger", _SERVICES),
    ("--no-one-logger", _SERVICES), ("--app-tag", _SERVICES), ("--enable-ft", _SERVICES),
    ("--run-workload-inspector", _SERVICES), ("--workload-inspector", _SERVICES), ("--msc", _SERVICES),
    ("--disable-msc", _SERVICES), ("--kitchen", _SERVICES), ("--adlr-autoresume", _SERVICES),
    ("--nvrx", _SERVICES), ("--tp-comm-", _TE_ONLY + " (userbuffers)"),
    ("--disable-tp-comm-", _TE_ONLY + " (userbuffers)"), ("--no-tp-comm-", _TE_ONLY + " (userbuffers)"),
    ("--fp4", _TE_ONLY), ("--cuda-graph", _CUDA_GRAPHS), ("--dsa-", "DeepSeek sparse attention is not supported"),
    ("--linear-attention", "linear-attention variants are not supported"),
    ("--experimental-attention", "experimental attention variants are not supported"),
)


def refusal_reason(row: FlagRow) -> str:
    if row.dest in REFUSED:
        return REFUSED[row.dest]
    for prefix, reason in _PREFIX_REASONS:
        if row.flag.startswith(prefix):
            return reason
    return _NOT_YET


def _help(row: FlagRow) -> str:
    kind = classify(row, set())
    if kind == "honoured":
        return "Megatron-LM's meaning"
    if kind == "config":
        return f"Megatron-LM's meaning: megatron-core config field {row.dest}"
    if kind == "noop":
        return f"accepted, no effect: {NOOP[row.dest]}"
    return f"refused unless at its default: {refusal_reason(row)}"


def _type(name: str):
    """The converter of a table ``type``: int/float/str, or Megatron-LM's own (config/megatron_lm_types.py)."""
    from mtmegatron.config.megatron_lm_types import CONVERTERS

    return {"int": int, "float": float, "str": str, **CONVERTERS}.get(name, str)


def _add_from_row(group, row: FlagRow) -> None:
    default = row.default_value
    kwargs = {"dest": row.dest, "default": default, "help": _help(row)}
    if row.action in ("StoreTrueAction", "StoreFalseAction"):
        kwargs["action"] = "store_true" if row.action == "StoreTrueAction" else "store_false"
    elif row.action == "BooleanOptionalAction":
        kwargs["action"] = "store_true" if not row.flag.startswith("--no-") else "store_false"
    elif row.action == "StoreAction":
        kwargs["type"] = _type(row.type)
        if row.nargs:
            kwargs["nargs"] = int(row.nargs) if row.nargs.isdigit() else row.nargs
        if row.choices and row.type in ("str", "int") and row.type != "enum_type_handler":
            kwargs["choices"] = [_type(row.type)(c) for c in row.choices.split(",")]
    else:
        return  # help
    group.add_argument(row.flag, **kwargs)


def add_table_args(parser: argparse.ArgumentParser) -> list[FlagRow]:
    """Register every table option string that no module registered by hand; returns their rows."""
    group = parser.add_argument_group(GROUP_TITLE)
    added = []
    for row in table():
        if row.flag in parser._option_string_actions:
            continue
        _add_from_row(group, row)
        added.append(row)
    return added


@functools.cache
def config_fields() -> frozenset[str]:
    """Field names of the megatron-core config dataclasses that flags fill by name."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    names = set()
    for cls in (TransformerConfig, MLATransformerConfig, OptimizerConfig, DistributedDataParallelConfig):
        names.update(f.name for f in dataclasses.fields(cls))
    return frozenset(names)


def classify(row: FlagRow, hand_registered: set[str]) -> str:
    """'honoured' (a module reads it), 'config' (copied into a megatron-core config by name), 'noop', 'refused'."""
    if row.flag in hand_registered or row.dest in hand_registered or row.dest in READ_BY_CODE:
        return "honoured"
    if row.dest in NOOP:
        return "noop"
    if row.dest in REFUSED or any(row.flag.startswith(p) for p, _ in _PREFIX_REASONS):
        return "refused"
    if row.dest in config_fields():
        return "config"
    return "refused"


def check_refused(parser: argparse.ArgumentParser, args: argparse.Namespace, given: dict[str, str]) -> None:
    """One message, naming the option string the user wrote, for the first refused table flag set to a value
    other than its default (``given``: dest -> option string)."""
    hand = getattr(parser, "hand_registered", set())
    for row in getattr(parser, "table_rows", ()):
        if given.get(row.dest) != row.flag or classify(row, hand) != "refused":
            continue
        if getattr(args, row.dest) != parser.get_default(row.dest):  # given: in the namespace
            raise ConfigError(f"{row.flag}: {refusal_reason(row)}")


def apply_megatron_defaults(parser: argparse.ArgumentParser) -> dict:
    """Give every hand-registered Megatron-LM flag Megatron-LM's default (a module's own default is only a
    fallback for flags Megatron-LM does not have); returns dest -> Megatron-LM default for them."""
    rows = {row.flag: row for row in table()}
    defaults = {}
    for action in parser._actions:
        for option in action.option_strings:
            row = rows.get(option)
            if row is None or row.action == "HelpAction":
                continue
            if row.dest != action.dest:
                raise AssertionError(f"{option} is registered with dest {action.dest}, Megatron-LM's is {row.dest}")
            value = row.default_value  # a store_false flag's default is True, as its dest reads
            action.default = value
            defaults[action.dest] = value
    return defaults
