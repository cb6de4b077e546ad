"""``pretrain --help``: the help text of every flag that arguments.py declares without one, the formatter
that appends each default, the launch example, and the one-line error for a mistyped flag.

Defaults are Megatron-LM's (config/megatron_flags.py); a named ``--model`` preset fills model and recipe
values the user did not give. Flags whose default is None show no "(default: None)".
May assume: called by arguments.build_parser / arguments.parse_args only.
"""

from __future__ import annotations

import argparse
import difflib
import os

from mtmegatron.utils.errors import ConfigError

PRESET = "a --model preset fills it when not given"

HELP = {
    # model shape (preset fields)
    "num_layers": f"transformer layers ({PRESET})",
    "hidden_size": f"hidden size ({PRESET})",
    "ffn_hidden_size": f"MLP hidden size ({PRESET}; 4 x hidden size without one)",
    "num_attention_heads": f"attention heads ({PRESET})",
    "num_query_groups": f"key/value head groups with --group-query-attention ({PRESET}; else = heads)",
    "seq_length": f"tokens per sample ({PRESET})",
    "max_position_embeddings": f"longest position the model supports ({PRESET}; else --seq-length)",
    "vocab_size": f"vocabulary size ({PRESET})",
    "rotary_base": f"RoPE base ({PRESET})",
    "num_experts": f"MoE experts per MoE layer ({PRESET}; none: dense)",
    "moe_router_topk": f"experts each token is routed to ({PRESET})",
    "moe_ffn_hidden_size": f"expert MLP hidden size ({PRESET})",
    "layernorm_epsilon": f"layer-norm epsilon ({PRESET})",
    "moe_aux_loss_coeff": f"load-balancing loss coefficient ({PRESET})",
    "normalization": f"LayerNorm or RMSNorm ({PRESET})",
    "position_embedding_type": f"learned_absolute or rope ({PRESET})",
    "moe_token_dispatcher_type": f"how tokens reach experts: allgather or alltoall ({PRESET})",
    "moe_router_load_balancing_type": f"MoE load-balancing loss ({PRESET})",
    "group_query_attention": f"grouped-query attention with --num-query-groups ({PRESET})",
    "swiglu": f"SwiGLU MLP ({PRESET})",
    "disable_bias_linear": f"no biases in linear layers ({PRESET})",
    "untie_embeddings_and_output_weights": f"separate output layer weights ({PRESET})",
    "hidden_dropout": "dropout after attention and MLP",
    "attention_dropout": "dropout on attention probabilities",
    "init_method_std": "standard deviation of the weight initialisation",
    # MLA / MoE pattern / router / MTP
    "q_lora_rank": f"MLA query low-rank dimension ({PRESET}; 0: no query LoRA)",
    "kv_lora_rank": f"MLA key/value low-rank dimension ({PRESET})",
    "qk_head_dim": f"MLA query/key head dimension without RoPE ({PRESET})",
    "qk_pos_emb_head_dim": f"MLA query/key RoPE head dimension ({PRESET})",
    "v_head_dim": f"MLA value head dimension ({PRESET})",
    "original_max_position_embeddings": f"YaRN: the context length the model was trained with ({PRESET})",
    "moe_shared_expert_intermediate_size": f"shared expert MLP size ({PRESET}; none: no shared expert)",
    "moe_router_num_groups": f"group-limited routing: number of expert groups ({PRESET})",
    "moe_router_group_topk": f"group-limited routing: groups each token may use ({PRESET})",
    "mtp_num_layers": f"multi-token-prediction layers ({PRESET}; 0: none)",
    "rotary_scaling_factor": f"YaRN scaling factor ({PRESET})",
    "beta_fast": f"YaRN beta_fast ({PRESET})",
    "beta_slow": f"YaRN beta_slow ({PRESET})",
    "mscale": f"YaRN mscale ({PRESET})",
    "mscale_all_dim": f"YaRN mscale_all_dim ({PRESET})",
    "moe_router_bias_update_rate": f"expert-bias update rate per global batch ({PRESET})",
    "moe_router_topk_scaling_factor": f"scale of the top-k routing weights ({PRESET})",
    "mtp_loss_scaling_factor": f"weight of the MTP loss ({PRESET})",
    "multi_latent_attention": f"multi-latent attention (MLA) ({PRESET})",
    "qk_layernorm": f"layer norm on queries and keys ({PRESET})",
    "moe_router_enable_expert_bias": f"auxiliary-loss-free expert bias ({PRESET})",
    "moe_router_score_function": f"router scores: softmax or sigmoid ({PRESET})",
    # parallelism
    "tensor_model_parallel_size": "TP: ranks that split each layer's weights (must divide heads and query groups)",
    "pipeline_model_parallel_size": "PP: pipeline stages (must divide --num-layers)",
    "num_layers_per_virtual_pipeline_stage": "interleaved pipeline: layers per virtual stage (default: not "
                                             "interleaved)",
    "expert_model_parallel_size": "EP: ranks that split the experts (must divide --num-experts)",
    "context_parallel_size": "CP: ranks that split each sequence",
    "sequence_parallel": "sequence parallelism (with TP > 1; ignored at TP 1)",
    "use_distributed_optimizer": "shard optimizer state over data-parallel ranks",
    # training
    "micro_batch_size": "samples per forward/backward on one rank",
    "global_batch_size": "samples per optimizer step (a multiple of micro-batch size x data-parallel size)",
    "train_iters": "optimizer steps to train for",
    "lr": "peak learning rate",
    "min_lr": "learning rate at the end of the decay",
    "lr_warmup_iters": "linear warm-up steps",
    "lr_decay_iters": "steps the decay spans (default: --train-iters)",
    "lr_decay_style": "learning-rate decay after warm-up",
    "weight_decay": "AdamW weight decay",
    "adam_beta1": "Adam beta1",
    "adam_beta2": "Adam beta2",
    "adam_eps": "Adam epsilon",
    "clip_grad": "clip the global gradient norm to this value",
    "seed": "random seed (weights, data order, dropout)",
    "bf16": "bf16 mixed precision",
    "fp16": "fp16 mixed precision with loss scaling",
    # checkpoints / logging
    "save_interval": "save a checkpoint every N iterations (needs --save; the end of the run is always saved)",
    "no_load_optim": "with --load: do not restore the optimizer state",
    "no_load_rng": "with --load: do not restore the random-number generator states",
    "log_interval": "print a console line every N iterations (metrics.jsonl gets every iteration)",
    # fp8
    "fp8_margin": "delayed scaling: scale margin (power of 2)",
    "fp8_amax_history_len": "delayed scaling: amax history length",
    "fp8_amax_compute_algo": "delayed scaling: amax from the history's most recent or max value",
    "num_layers_at_start_in_bf16": "with --first-last-layers-bf16: leading layers kept in high precision",
    "num_layers_at_end_in_bf16": "with --first-last-layers-bf16: trailing layers kept in high precision",
}

USAGE = "torchrun --nproc_per_node N -m mtmegatron.pretrain [flags]   (or python -m mtmegatron.pretrain [flags])"

EPILOG = """\
launch (one process per device; N processes per node):
  torchrun --nproc_per_node 2 -m mtmegatron.pretrain                      # tiny Llama-3 on the embedded corpus
  torchrun --nproc_per_node 2 -m mtmegatron.pretrain --backend cpu --mock-data --tensor-model-parallel-size 2
  several nodes: torchrun --nnodes 4 --node_rank R --master_addr HOST --master_port 29500 --nproc_per_node 8 ...
  or the launchers in examples/ (examples/llama3/dist_run_pretrain_megatron_llama3_musa.sh ...).
A user mistake exits with status 2 and one message (printed by rank 0)."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Appends "(default: X)" except where the default is None (the help text says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None:
            return action.help or ""
        return super()._get_help_string(action)


def fill_help(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if not action.help and action.dest in HELP:
            action.help = HELP[action.dest]


def unknown_flags_message(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """One line for flags argparse did not recognise, with the closest known spelling of each."""
    known = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    parts, after_flag = [], False
    for extra in extras:
        flag = extra.split("=", 1)[0]
        if flag.startswith("-") and flag.rstrip("\r") != flag:
            parts.append(f"flag {flag!r} ends in a carriage return: the script has Windows line endings (CRLF); "
                         "run dos2unix on it")
            after_flag = True
            continue
        if flag.startswith("-") and len(extra.split()) > 1:
            parts.append(f"{extra!r} is several flags in one argument: unquote it")
            after_flag = True
            continue
        if not flag.startswith("-"):
            if not after_flag:  # a value of the unknown flag before it is not worth a second complaint
                parts.append(f"unexpected argument {extra!r}")
            continue
        after_flag = True
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        parts.append(f"unknown flag {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
    return "; ".join(parts) + " (see --help)"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (raised as ConfigError, no usage dump) and help printed by rank 0 only."""

    def error(self, message: str):
        raise ConfigError(message + " (see --help)")

    def print_help(self, file=None):
        if int(os.environ.get("RANK", "0")) == 0:
            super().print_help(file)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            raise ConfigError(unknown_flags_message(self, extras))
        return parsed
