"""Command-line flags of ``mtmegatron.pretrain`` (Megatron-LM spellings) and their validation.

Model fields default to None so a ``--model`` preset can fill them; explicit flags always win. Every user
mistake is reported as one ``ConfigError`` message before any process group exists.
May assume: WORLD_SIZE/RANK come from torchrun (single process when absent).
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

from mtmegatron.config.attention_flags import add_attention_args, check_attention_args
from mtmegatron.config.tokenizer_flags import add_tokenizer_args, check_tokenizer_args
from mtmegatron.config.family_args import add_family_args, check_family_args
from mtmegatron.config.initialization_flags import add_initialization_args
from mtmegatron.config.moe_flags import add_grouped_experts_args, check_grouped_experts_args
from mtmegatron.models.families import FAMILIES
from mtmegatron.models.families.deepseek_v3.flags import check_deepseek_args, normalize_deepseek_args
from mtmegatron.models.families.llava.flags import add_llava_args, check_llava_args, fill_llava_fields
from mtmegatron.config.pipeline_split import check_pipeline_split
from mtmegatron.models.vocab import check_vocab_padding
from mtmegatron.config.transformer_impl import resolve_transformer_impl
from mtmegatron.config.data_flags import add_data_args, check_data_args
from mtmegatron.config.memory_flags import add_memory_args, check_memory_args
from mtmegatron.config.fsdp_flags import add_fsdp_args, check_fsdp_args
from mtmegatron.config.run_control import add_run_control_args, check_run_control_args
from mtmegatron.config.schedule_flags import add_schedule_args, check_schedule_args
from mtmegatron.config.observability_flags import add_observability_args, check_observability_args
from mtmegatron.config.sft_flags import add_sft_args, check_sft_args
from mtmegatron.config.lora_flags import add_lora_args, check_lora_args
from mtmegatron.config.checkpoint_flags import (add_checkpoint_args, check_checkpoint_args, check_checkpoint_paths,
                                                check_convert_args, check_upcycling_args, use_checkpoint_args)
from mtmegatron.config.resilience_flags import check_resilience_args
from mtmegatron.tasks.qwen_vl.data import check_balance
from mtmegatron.config import flag_help
from mtmegatron.config import flag_sources
from mtmegatron.config import megatron_core_checks
from mtmegatron.config import megatron_flags
from mtmegatron.config import run_args
from mtmegatron.config import training_flags
from mtmegatron.utils.checkpoint_dirs import check_writable_dir
from mtmegatron.utils.errors import ConfigError


class RunArgs(argparse.Namespace):
    """The run's values: written while parse_args validates them and pretrain.prepare resolves the data and
    tokenizer facts, read-only after ``freeze()``. A copy (``copy.copy``) is its taker's own, writable."""

    def __setattr__(self, name: str, value) -> None:
        if self.__dict__.get("_frozen"):
            raise AttributeError(f"args.{name} is read-only after start-up: resolve it in the validation pass "
                                 "(config/arguments.py CHECKS) or in pretrain.prepare")
        super().__setattr__(name, value)

    def __copy__(self) -> "RunArgs":
        return RunArgs(**{k: v for k, v in vars(self).items() if k != "_frozen"})

    def freeze(self) -> "RunArgs":
        self.__dict__["_frozen"] = True
        return self


def _add_model(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    presets = {name: family.presets for name, family in FAMILIES.items() if family.presets}
    g.add_argument("--model", default=None,
                   help=f"a model family preset that fills every value you do not give ({', '.join(presets)}); "
                        "without it and without model-shape flags: the demo (llama3 tiny); with model-shape flags and "
                        "no --model: Megatron-LM's defaults")
    sizes = "; ".join(f"{name} {'/'.join(sizes)}" for name, sizes in presets.items())
    g.add_argument("--model-size", default=None,
                   help=f"preset size, default tiny (see models/families/: {sizes})")
    for name in ("num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups",
                 "seq-length", "max-position-embeddings", "vocab-size", "rotary-base", "num-experts",
                 "moe-router-topk", "moe-ffn-hidden-size"):
        g.add_argument(f"--{name}", type=int, default=None)
    g.add_argument("--norm-epsilon", dest="layernorm_epsilon", type=float, default=1e-5)
    g.add_argument("--moe-aux-loss-coeff", type=float, nargs="+", default=0.0)
    g.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default=None)
    g.add_argument("--position-embedding-type", choices=["learned_absolute", "rope", "mrope"], default=None)
    g.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall"], default=None)
    g.add_argument("--moe-router-load-balancing-type", choices=["aux_loss", "seq_aux_loss", "global_aux_loss", "none"],
                   nargs="+", default="aux_loss")
    for name in ("group-query-attention", "swiglu", "untie-embeddings-and-output-weights"):
        g.add_argument(f"--{name}", action="store_true", default=None)
    g.add_argument("--disable-bias-linear", dest="add_bias_linear", action="store_false",
                   help=f"no biases in linear layers ({flag_help.PRESET})")
    g.add_argument("--no-untie-embeddings-and-output-weights", dest="untie_embeddings_and_output_weights",
                   action="store_false", default=None,
                   help="tie the output layer to the input embedding (overrides a preset's untied embeddings)")
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help="pad the vocabulary to a multiple of this x TP (Megatron-LM's rule; default 128)")
    g.add_argument("--hidden-dropout", type=float, default=0.0)
    g.add_argument("--attention-dropout", type=float, default=0.0)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument("--transformer-impl", choices=["local", "mtmegatron", "transformer_engine", "inference_optimized"],
                   default="transformer_engine",
                   help="layer implementation: TransformerEngine's layers where TE is installed (else local, "
                        "said at start-up), megatron-core's local spec, or ours with fused kernels (mtmegatron)")
    _add_mla_moe_mtp(p)


def _add_mla_moe_mtp(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("MLA, MoE layer pattern and router, MTP (DeepSeek-V3)")
    for name in ("q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim",
                 "original-max-position-embeddings", "moe-shared-expert-intermediate-size", "moe-router-num-groups",
                 "moe-router-group-topk", "mtp-num-layers"):
        g.add_argument(f"--{name}", type=int, default=None)
    for name in ("rotary-scaling-factor", "beta-fast", "beta-slow", "mscale", "mscale-all-dim",
                 "moe-router-bias-update-rate", "moe-router-topk-scaling-factor", "mtp-loss-scaling-factor"):
        g.add_argument(f"--{name}", type=float, default=None)
    for name in ("multi-latent-attention", "qk-layernorm", "moe-router-enable-expert-bias"):
        g.add_argument(f"--{name}", action="store_true", default=None)
    g.add_argument("--rope-type", choices=["rope", "yarn"], default=None, help="MLA's RoPE variant")
    g.add_argument("--moe-layer-freq", default=None,
                   help="int N (an MoE layer every N layers) or a 0/1 list expression, e.g. ([0]*3+[1]*58)")
    g.add_argument("--moe-router-score-function", choices=["softmax", "sigmoid"], default=None)
    # our own YaRN flags (Megatron-LM has none): megatron-core's MLATransformerConfig defaults, as before the table
    p.set_defaults(original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0)


def _add_parallel(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    g.add_argument("--expert-model-parallel-size", type=int, default=1)
    g.add_argument("--context-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--use-distributed-optimizer", action="store_true")


def _add_training(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=int, default=2)
    g.add_argument("--global-batch-size", type=int, default=8)
    g.add_argument("--train-iters", type=int, default=1000)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-iters", type=int, default=None)
    g.add_argument("--lr-decay-style", choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"],
                   default="cosine")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--fp16", action="store_true")
    g.add_argument("--loss-scale", type=float, default=None, help="static fp16 loss scale (default: dynamic)")
    g.add_argument("--initial-loss-scale", type=float, default=2.0**32, help="start of the dynamic fp16 loss scale")


def _add_io(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data, checkpoints, logging")
    g.add_argument("--mock-data", action="store_true", help="megatron-core's mock GPT dataset (default: real data)")
    g.add_argument("--save", default=None, help="checkpoint directory to write")
    g.add_argument("--load", default=None, help="checkpoint directory to resume from")
    g.add_argument("--save-interval", type=int, default=None)
    g.add_argument("--exit-interval", type=int, default=None,
                   help="stop after this iteration (saving a checkpoint when --save is given)")
    g.add_argument("--finetune", action="store_true", help="load model weights only; start at iteration 0")
    g.add_argument("--no-load-optim", action="store_true")
    g.add_argument("--no-load-rng", action="store_true")
    g.add_argument("--override-opt_param-scheduler", action="store_true", default=False,
                   help="on --load, use this run's LR/weight-decay schedule flags, not the checkpoint's")
    g.add_argument("--use-checkpoint-opt_param-scheduler", action="store_true", default=False,
                   help="on --load, keep the checkpoint's LR/weight-decay schedule, ignoring the schedule flags")
    g.add_argument("--log-interval", type=int, default=1)
    g.add_argument("--log-dir", default=None, help="where metrics.jsonl goes (default ./runs/<model>)")
    g.add_argument("--backend", choices=None, default=None, help="cpu, cuda or musa (default: auto-detect)")


def _add_fp8(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fp8 (see docs/fp8.md)")
    g.add_argument("--fp8-format", dest="fp8", choices=["e4m3", "hybrid"], default=None,
                   help="train linears in FP8: e4m3 everywhere, or hybrid (E4M3 forward, E5M2 gradients)")
    g.add_argument("--fp8-recipe", choices=["delayed", "tensorwise", "blockwise", "mxfp8"], default=None,
                   help="scaling recipe (default delayed)")
    g.add_argument("--fp8-margin", type=int, default=0)
    g.add_argument("--fp8-amax-history-len", type=int, default=1)
    g.add_argument("--fp8-amax-compute-algo", choices=["most_recent", "max"], default="most_recent")
    g.add_argument("--tp-only-amax-red", action="store_true", help="reduce amax over TP (x CP) only, not DP")
    g.add_argument("--first-last-layers-bf16", action="store_true",
                   help="keep the first/last transformer layers' linears in high precision")
    g.add_argument("--num-layers-at-start-in-bf16", type=int, default=1)
    g.add_argument("--num-layers-at-end-in-bf16", type=int, default=1)
    g.add_argument("--fp8-executor", choices=["auto", "transformer_engine", "scaled_mm", "emulated"],
                   default="auto", help="who runs the FP8 GEMMs (default: the backend's first that works)")


def _check_fp8(args: argparse.Namespace) -> None:
    if args.fp8_format is None:
        if "fp8_recipe" in args.given_flags or args.first_last_layers_bf16:
            raise ConfigError("--fp8-recipe/--first-last-layers-bf16 need --fp8-format (e4m3 or hybrid)")
        return
    if args.fp16:
        raise ConfigError("FP8 training needs --bf16 (or fp32) weights here, not --fp16")
    if args.fp8_amax_history_len < 1 or args.fp8_margin < 0:
        raise ConfigError("--fp8-amax-history-len must be >= 1 and --fp8-margin >= 0")
    if args.first_last_layers_bf16:
        per_stage = args.num_layers // args.pipeline_model_parallel_size
        if args.fp8_recipe == "delayed":
            raise ConfigError("--first-last-layers-bf16 is not supported with --fp8-recipe delayed (as in "
                              "megatron-core)")
        for flag in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            if not 0 <= getattr(args, flag) <= per_stage:
                raise ConfigError(f"--{flag.replace('_', '-')} must be between 0 and the {per_stage} layers of a "
                                  "pipeline stage")


def build_parser() -> argparse.ArgumentParser:
    p = flag_help.Parser(prog="mtmegatron.pretrain", usage=flag_help.USAGE, formatter_class=flag_help.HelpFormatter,
                         epilog=flag_help.EPILOG,
                         description="Pretrain a GPT-style model with megatron-core (Megatron-LM flag names).")
    _add_model(p)
    _add_parallel(p)
    add_attention_args(p)
    _add_training(p)
    _add_io(p)
    _add_fp8(p)
    add_memory_args(p)
    add_fsdp_args(p)
    add_grouped_experts_args(p)
    add_schedule_args(p)
    add_run_control_args(p)
    add_data_args(p)
    add_observability_args(p)
    add_checkpoint_args(p)
    add_llava_args(p)
    add_tokenizer_args(p)
    add_sft_args(p)
    add_lora_args(p)
    add_family_args(p)
    add_initialization_args(p)
    run_args.add_run_args(p)
    flag_help.fill_help(p)
    # option strings and dests registered by mtmegatron's modules: a table flag whose dest one of them reads is
    # honoured too (e.g. Megatron-LM's --override-opt-param-scheduler beside our older underscore spelling)
    p.hand_registered = ({s for a in p._actions for s in a.option_strings}
                         | {a.dest for a in p._actions if a.option_strings and a.dest != "help"})
    p.megatron_defaults = megatron_flags.apply_megatron_defaults(p)
    p.table_rows = megatron_flags.add_table_args(p)
    p.megatron_defaults.update({row.dest: row.default_value for row in p.table_rows})
    return p


def _derive(args: argparse.Namespace, given: dict[str, str]) -> None:
    """Megatron-LM's derived values (its validate_args), after the preset: FFN and head sizes, query groups,
    positions; plus the older attribute names the rest of mtmegatron reads."""
    args.disable_bias_linear = not args.add_bias_linear
    args.norm_epsilon = args.layernorm_epsilon
    args.fp8_format = args.fp8
    args.fp8_executor_in_use = args.fp8_executor_note = None  # chosen once the backend is active (fp8/spec.py)
    fill_llava_fields(args, given, ConfigError)  # LLaVA: vision fields; --seq-length = --decoder-seq-length
    typed = args.tokenizer_type not in (None, "NullTokenizer")  # then its vocabulary sets --vocab-size
    for field in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")[:5 - typed]:
        if getattr(args, field) is None:
            raise ConfigError(f"--{field.replace('_', '-')} is required (Megatron-LM has no default; or name a "
                              "preset with --model)")
    # sizes a run divides by or makes tensors of (Megatron-LM fails on them later, in a traceback)
    for field in ("hidden_size", "num_attention_heads", "seq_length", "vocab_size", "log_interval",
                  "micro_batch_size", "global_batch_size"):  # Megatron-LM's validate_args asserts batch sizes > 0
        if getattr(args, field) is not None and getattr(args, field) < 1:
            raise ConfigError(f"--{field.replace('_', '-')} must be >= 1, not {getattr(args, field)}")
    if args.ffn_hidden_size is None:  # Megatron-LM's rule: 4h, or 2/3 of it rounded down to 64 with SwiGLU
        args.ffn_hidden_size = (int((4 * args.hidden_size * 2 / 3) / 64) * 64 if args.swiglu
                                else 4 * args.hidden_size)
    if args.kv_channels is None:
        if args.hidden_size % args.num_attention_heads:
            raise ConfigError(f"--hidden-size {args.hidden_size} is not divisible by --num-attention-heads "
                              f"{args.num_attention_heads} (or give --kv-channels)")
        args.kv_channels = args.hidden_size // args.num_attention_heads
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if not args.add_position_embedding and args.position_embedding_type != "rope":
        raise ConfigError("--no-position-embedding is deprecated (Megatron-LM raises too): use "
                          "--position-embedding-type")
    if args.num_experts and args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    for field in ("moe_aux_loss_coeff", "moe_router_load_balancing_type"):
        value = getattr(args, field)
        if isinstance(value, list):
            if len(value) != 1:
                raise ConfigError(f"--{field.replace('_', '-')}: several values (per-type load balancing) are not "
                                  "supported here; give one")
            setattr(args, field, value[0])
    if isinstance(args.cp_comm_type, list):
        if len(args.cp_comm_type) != 1:
            raise ConfigError("--cp-comm-type: one value for all layers (per-layer types need TransformerEngine)")
        args.cp_comm_type = args.cp_comm_type[0]
    if args.bf16:  # Megatron-LM: bf16 gradients are reduced in fp32 unless --grad-reduce-in-bf16
        if args.grad_reduce_in_bf16:
            args.accumulate_allreduce_grads_in_fp32 = False
        elif args.main_grads_dtype == "fp32":
            args.accumulate_allreduce_grads_in_fp32 = True
    resolve_transformer_impl(args, given, ConfigError)  # TE layers where TE serves the backend, else local
    if args.use_flash_attn and "attention_backend" not in given:
        args.attention_backend = "flash"  # Megatron-LM's meaning; which kernel runs is said at start-up
    if args.recompute_activations and "recompute_granularity" not in given:
        args.recompute_granularity = "selective"  # Megatron-LM's shorthand
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = "rope"  # Megatron-LM's deprecated spelling
    normalize_deepseek_args(args)  # --moe-layer-freq parsing; 0 switches off a preset's q LoRA/groups/MTP


def _check_parallel_sizes(args: argparse.Namespace) -> None:
    tp = args.tensor_model_parallel_size
    if min(tp, args.pipeline_model_parallel_size, args.context_parallel_size, args.expert_model_parallel_size) < 1:
        raise ConfigError("parallel sizes must be >= 1")
    check_attention_args(args)
    if args.num_attention_heads % tp:
        raise ConfigError(f"--tensor-model-parallel-size {tp} does not divide --num-attention-heads "
                          f"{args.num_attention_heads}")
    if args.num_query_groups % tp:
        raise ConfigError(f"--tensor-model-parallel-size {tp} does not divide --num-query-groups "
                          f"{args.num_query_groups}")
    if args.num_attention_heads % args.num_query_groups:
        raise ConfigError(f"--num-query-groups {args.num_query_groups} does not divide --num-attention-heads "
                          f"{args.num_attention_heads}")


def _resolve_layout(args: argparse.Namespace) -> None:
    """Data-parallel size, virtual pipeline stages, sequence parallelism at TP 1 (off, said at start-up)."""
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    if args.world_size % (tp * pp * cp):
        raise ConfigError(f"world size {args.world_size} is not divisible by TP {tp} x PP {pp} x CP {cp}")
    args.data_parallel_size = args.world_size // (tp * pp * cp)
    args.virtual_pipeline_model_parallel_size = None
    if args.num_virtual_stages_per_pipeline_rank is not None:
        if args.num_layers_per_virtual_pipeline_stage is not None:
            raise ConfigError("give --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank, "
                              "not both")
        stages = args.num_virtual_stages_per_pipeline_rank * pp
        if stages < 1 or args.num_layers % stages:
            raise ConfigError(f"--num-virtual-stages-per-pipeline-rank {args.num_virtual_stages_per_pipeline_rank}"
                              f" x PP {pp} does not divide --num-layers {args.num_layers}")
        args.num_layers_per_virtual_pipeline_stage = args.num_layers // stages
    if args.num_layers_per_virtual_pipeline_stage is not None:
        per_stage = args.num_layers // pp
        if pp < 2:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size >= 2")
        if per_stage % args.num_layers_per_virtual_pipeline_stage:
            raise ConfigError(f"--num-layers-per-virtual-pipeline-stage {args.num_layers_per_virtual_pipeline_stage}"
                              f" does not divide the {per_stage} layers of each pipeline stage")
        args.virtual_pipeline_model_parallel_size = per_stage // args.num_layers_per_virtual_pipeline_stage
        if args.virtual_pipeline_model_parallel_size == 1:
            args.virtual_pipeline_model_parallel_size = None  # one virtual stage is no interleaving (Megatron-LM)
    else:  # Megatron-LM: p2p overlap and aligned parameter gathers exist only in the interleaved schedule
        args.overlap_p2p_comm = False
    args.sequence_parallel_at_tp1 = args.sequence_parallel and tp == 1
    if args.sequence_parallel_at_tp1:
        args.sequence_parallel = False  # as Megatron-LM (with a start-up line): SP is a TP feature


def _check_experts(args: argparse.Namespace) -> None:
    tp, pp, ep = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.expert_model_parallel_size
    if not args.num_experts:
        if ep != 1:
            raise ConfigError("--expert-model-parallel-size needs --num-experts")
        return
    if args.num_experts % ep:
        raise ConfigError(f"--expert-model-parallel-size {ep} does not divide --num-experts {args.num_experts}")
    etp = args.expert_tensor_parallel_size or tp  # expert TP defaults to TP, as in megatron-core
    if args.world_size % (ep * etp * pp):
        raise ConfigError(f"world size {args.world_size} is not divisible by EP {ep} x expert-TP {etp} x PP {pp}")
    if args.moe_router_topk > args.num_experts:
        raise ConfigError(f"--moe-router-topk {args.moe_router_topk} exceeds --num-experts {args.num_experts}")


def _check_vocab(args: argparse.Namespace) -> None:
    if args.vocab_size is not None:  # else set from the tokenizer by data/resolve.py
        check_vocab_padding(args, ConfigError)  # sets args.padded_vocab_size


def _resolve_micro_batches(args: argparse.Namespace) -> None:
    """After the schedule check gave --global-batch-size its default: micro-batches per iteration (and the
    default --lr-decay-iters: --train-iters, which --train-samples set)."""
    dp, mbs, gbs, pp = (args.data_parallel_size, args.micro_batch_size, args.global_batch_size,
                        args.pipeline_model_parallel_size)
    if gbs % (mbs * dp):
        raise ConfigError(f"--global-batch-size {gbs} is not divisible by --micro-batch-size {mbs} x data-parallel "
                          f"size {dp}")
    args.num_microbatches = gbs // (mbs * dp)
    if args.lr_decay_iters is None:
        args.lr_decay_iters = max(args.train_iters, 1)
    if args.virtual_pipeline_model_parallel_size and args.num_microbatches % pp:
        raise ConfigError(f"interleaved pipeline needs the number of micro-batches ({args.num_microbatches}) to be a "
                          f"multiple of --pipeline-model-parallel-size {pp}")


def _check_training(args: argparse.Namespace) -> None:
    if args.seq_length > args.max_position_embeddings:
        raise ConfigError(f"--seq-length {args.seq_length} exceeds --max-position-embeddings "
                          f"{args.max_position_embeddings}")
    if args.bf16 and args.fp16:
        raise ConfigError("--bf16 and --fp16 are mutually exclusive")
    for field in ("hidden_dropout", "attention_dropout"):  # torch's dropout refuses these in the first forward
        if not 0.0 <= getattr(args, field) <= 1.0:
            raise ConfigError(f"--{field.replace('_', '-')} {getattr(args, field)} is not a probability (between "
                              f"0 and 1)")
    if args.train_iters < 0:
        raise ConfigError("--train-iters must be >= 0")
    if args.save_interval is not None and args.save_interval <= 0:  # without --save it is unused (Megatron-LM)
        raise ConfigError("--save-interval must be positive")
    if args.exit_interval is not None and args.exit_interval <= 0:
        raise ConfigError("--exit-interval must be positive")
    if (args.use_distributed_optimizer or args.overlap_param_gather) and args.fp16:
        raise ConfigError("fp16 with the distributed optimizer is not supported here; use --bf16")


# The one validation pass, by concern, in this order (a later check may read what an earlier one resolved, e.g.
# data_parallel_size). Each check takes the parsed args, raises ConfigError (one line naming the flag) and may
# resolve its own concern's derived values; after pretrain.prepare nothing writes args (RunArgs.freeze).
CHECKS = (
    ("parallel sizes, attention heads and context parallelism", _check_parallel_sizes),
    ("pipeline split", partial(check_pipeline_split, error=ConfigError)), ("parallel layout", _resolve_layout),
    ("multimodal model", partial(check_llava_args, error=ConfigError)),
    ("model family", partial(check_family_args, error=ConfigError)), ("experts", _check_experts),
    ("MLA and MoE layer pattern", partial(check_deepseek_args, error=ConfigError)), ("vocabulary padding", _check_vocab),
    ("schedule", check_schedule_args), ("micro-batches", _resolve_micro_batches), ("training", _check_training),
    ("memory", check_memory_args), ("fully sharded data parallelism", check_fsdp_args),
    ("grouped experts", partial(check_grouped_experts_args, error=ConfigError)),
    ("run control", check_run_control_args), ("data", partial(check_data_args, error=ConfigError)),
    ("vision data balancing and packing", check_balance),
    ("tokenizer", partial(check_tokenizer_args, error=ConfigError)), ("observability", check_observability_args),
    ("checkpoints", check_checkpoint_args), ("resilience", check_resilience_args),
    ("checkpoint conversion", check_convert_args), ("upcycling", check_upcycling_args),
    ("training flags", training_flags.check_training_args), ("evaluation and samples", run_args.check_run_args),
    ("sft", partial(check_sft_args, error=ConfigError)), ("lora", partial(check_lora_args, error=ConfigError)),
    ("fp8", _check_fp8),
    ("megatron-core's own requirements", megatron_core_checks.check_rules),  # its configs: pretrain.prepare
)


def check_training_run_args(args: argparse.Namespace) -> None:
    """Checks that concern training only (a converter or an inference forward may build these models)."""
    if args.lr is None:
        raise ConfigError("--lr is required (Megatron-LM has no default learning rate; or name a preset with --model)")
    check_checkpoint_paths(args)  # --save/--load as they are on disk
    if args.num_experts and args.tensor_model_parallel_size > 1 and not args.sequence_parallel:
        # megatron-core's MoE layer raises this in the first training forward otherwise
        raise ConfigError("MoE with --tensor-model-parallel-size > 1 needs --sequence-parallel in training "
                          "(megatron-core refuses MoE + TP without it)")
    check_writable_dir("--log-dir", args.log_dir, ConfigError)  # metrics, the loss plot and samples go there
    if args.tensorboard_dir:
        check_writable_dir("--tensorboard-dir", args.tensorboard_dir, ConfigError)


def parse_args(argv=None, world_size: int | None = None, for_training: bool = True,
               parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The run's values: the user's flag, else the named preset's, else Megatron-LM's default
    (config/flag_sources.py); validated. ``args.value_sources`` holds dest -> where it came from and
    ``args.megatron_differences`` the start-up lines for values that differ from Megatron-LM's defaults."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = parser or build_parser()  # a caller parsing many command lines may pass one build_parser() result
    args = parser.parse_args(argv, namespace=RunArgs())
    given = flag_sources.given_dests(parser, argv)
    try:
        name = flag_sources.choose_preset(args, given)
        args.value_sources = flag_sources.apply_preset(args, given, name)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    args.preset_name = name
    args.given_flags = given
    megatron_flags.check_refused(parser, args, given)
    use_checkpoint_args(args, given)  # --use-checkpoint-args: model fields from the --load checkpoint
    _derive(args, given)
    args.megatron_differences = flag_sources.differences(parser, args, args.value_sources, parser.megatron_defaults)
    args.world_size = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    for _, check in CHECKS:
        check(args)
    if args.sequence_parallel_at_tp1:  # not in effect: said at start-up instead (run_plan.startup_lines)
        args.megatron_differences = [d for d in args.megatron_differences if not d.startswith("--sequence-parallel ")]
    if args.log_dir is None:
        args.log_dir = os.path.join("runs", args.model)
    if for_training:
        check_training_run_args(args)
    return args
