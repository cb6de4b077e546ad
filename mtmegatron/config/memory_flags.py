"""Memory and overlap flags of ``mtmegatron.pretrain`` (Megatron-LM names and semantics) and their rules.

Optimizer CPU offload (megatron-core's HybridDeviceOptimizer), the precision-aware optimizer, overlapped
gradient reduce-scatter / parameter all-gather, activation recompute and activation offloading (megatron-core's
fine-grained one and TransformerEngine's per-layer one; both run in TE's cpu_offload). Every invalid combination is
one ``ConfigError`` raised before any process group exists, with megatron's rule in words; offloading that has nothing
to do (the device is the host) is turned off with a start-up line (``args.activation_offload_note``).
May assume: the model fields are filled (preset applied) and data_parallel_size is derived.
"""

from __future__ import annotations

import argparse

from mtmegatron.backends import BackendUnavailableError, select_backend
from mtmegatron.utils.errors import ConfigError

# megatron-core 0.16's choices for --recompute-modules and --offload-modules
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
OFFLOAD_MODULES = ("core_attn", "attn_proj", "expert_fc1", "moe_act", "attn_norm", "mlp_norm", "qkv_linear")


def add_memory_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("memory and overlap (see docs/memory.md)")
    g.add_argument("--overlap-grad-reduce", action="store_true",
                   help="overlap the gradient all-reduce / reduce-scatter with the backward pass")
    g.add_argument("--overlap-param-gather", action="store_true",
                   help="overlap the distributed optimizer's parameter all-gather with the next forward pass")
    g.add_argument("--ddp-bucket-size", type=int, default=None,
                   help="elements per gradient reduce / parameter gather bucket with --overlap-grad-reduce "
                        "(default megatron-core's: max(40M, 1M x data-parallel size))")
    g.add_argument("--use-precision-aware-optimizer", action="store_true",
                   help="the optimizer keeps master weights and moments itself (needs the distributed optimizer)")
    g.add_argument("--optimizer-cpu-offload", action="store_true",
                   help="keep optimizer states (and run the update) on the host for a fraction of the parameters")
    g.add_argument("--optimizer-offload-fraction", type=float, default=1.0,
                   help="share of the parameters (by element count) whose optimizer runs on the host")
    g.add_argument("--overlap-cpu-optimizer-d2h-h2d", action="store_true",
                   help="copy gradients to the host and parameters back on side streams, overlapped")
    g.add_argument("--use-torch-optimizer-for-cpu-offload", action="store_true",
                   help="the host-side update uses torch.optim.AdamW instead of the fused adam_step kernel")
    g.add_argument("--no-pin-cpu-grads", dest="pin_cpu_grads", action="store_false",
                   help="do not pin the host gradient buffers of the offloaded optimizer")
    g.add_argument("--no-pin-cpu-params", dest="pin_cpu_params", action="store_false",
                   help="do not pin the host parameter copies of the offloaded optimizer")
    g.add_argument("--empty-unused-memory-level", type=int, choices=[0, 1, 2], default=0,
                   help="return the device allocator's cached memory after each step (1) and before validation too "
                        "(2); nothing to return on the cpu backend")
    g.add_argument("--recompute-granularity", choices=["full", "selective"], default=None,
                   help="recompute activations in backward: whole layers (full) or chosen modules (selective)")
    g.add_argument("--recompute-method", choices=["uniform", "block"], default=None,
                   help="full recompute: groups of N layers everywhere (uniform) or the first N per stage (block)")
    g.add_argument("--recompute-num-layers", type=int, default=None,
                   help="N for --recompute-method")
    g.add_argument("--recompute-modules", nargs="+", choices=RECOMPUTE_MODULES, default=None,
                   help="selective recompute: which submodules (default core_attn)")


def check_memory_args(args: argparse.Namespace) -> None:
    """Megatron-LM's rules for these flags, each as one message."""
    if args.overlap_param_gather and not args.use_distributed_optimizer:
        raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer")
    if args.overlap_param_gather and not args.overlap_grad_reduce:
        raise ConfigError("--overlap-param-gather needs --overlap-grad-reduce (as in Megatron-LM)")
    if args.ddp_bucket_size is not None:
        if not args.overlap_grad_reduce:
            raise ConfigError("--ddp-bucket-size needs --overlap-grad-reduce (megatron-core uses one bucket "
                              "without it)")
        if args.ddp_bucket_size < 1:
            raise ConfigError(f"--ddp-bucket-size must be a positive number of elements, not {args.ddp_bucket_size}")
    if args.use_precision_aware_optimizer and not args.use_distributed_optimizer:
        raise ConfigError("--use-precision-aware-optimizer needs --use-distributed-optimizer")
    if args.optimizer_cpu_offload:
        if not args.use_precision_aware_optimizer:
            raise ConfigError("--optimizer-cpu-offload needs --use-precision-aware-optimizer (the offloaded optimizer "
                              "reuses its code path, as in Megatron-LM)")
        if args.fp16:
            raise ConfigError("--optimizer-cpu-offload supports fp32 and --bf16 here, not --fp16")
    elif args.overlap_cpu_optimizer_d2h_h2d or args.use_torch_optimizer_for_cpu_offload:
        raise ConfigError("--overlap-cpu-optimizer-d2h-h2d / --use-torch-optimizer-for-cpu-offload need "
                          "--optimizer-cpu-offload")
    if not 0.0 <= args.optimizer_offload_fraction <= 1.0:
        raise ConfigError(f"--optimizer-offload-fraction must be between 0 and 1, not "
                          f"{args.optimizer_offload_fraction}")
    _check_recompute(args)
    _check_activation_offloading(args)


def _check_activation_offloading(args: argparse.Namespace) -> None:
    """--fine-grained-activation-offloading (--offload-modules, --min-offloaded-tensor-size) and
    --cpu-offloading-num-layers N (megatron-core's cpu_offloading, on for N > 0 as Megatron-LM sets it):
    megatron-core's rules, then what this backend does with them."""
    args.activation_offload_note = None
    fine, layers = args.fine_grained_activation_offloading, args.cpu_offloading_num_layers
    if not fine and (args.offload_modules or args.min_offloaded_tensor_size != 1024 * 1024):
        raise ConfigError("--offload-modules / --min-offloaded-tensor-size need --fine-grained-activation-offloading")
    if fine and not set(args.offload_modules or ()) <= set(OFFLOAD_MODULES):
        raise ConfigError(f"--offload-modules: choose from {', '.join(OFFLOAD_MODULES)} (megatron-core 0.16's)")
    if fine and (not args.offload_modules or ("attn_proj" in args.offload_modules
                                              and "core_attn" not in args.offload_modules)):
        raise ConfigError("--fine-grained-activation-offloading needs --offload-modules (attn_proj only with "
                          "core_attn, whose backward reads attn_proj's input; as in megatron-core)")
    if layers and (fine or not 0 < layers < args.num_layers or args.pipeline_model_parallel_size > 1
                   or args.recompute_granularity):
        raise ConfigError(f"--cpu-offloading-num-layers {layers}: megatron-core offloads 1 to num-layers - 1 layers, "
                          "without pipeline parallelism, recompute or --fine-grained-activation-offloading")
    if not (fine or layers):
        return
    flag = "--fine-grained-activation-offloading" if fine else "--cpu-offloading-num-layers"
    try:
        backend = select_backend(args.backend, warn=False)
    except BackendUnavailableError:
        return  # pretrain reports it with its own message right after parsing
    if backend.device_is_host:
        args.fine_grained_activation_offloading, args.cpu_offloading_num_layers = False, 0
        args.activation_offload_note = f"{flag}: nothing to do on the {backend.name} backend (its device is the host " \
                                       "memory activations would go to): off"
        return
    why = backend.transformer_engine_missing()
    if why and layers:  # fine-grained offloading runs without TE (patches/activation_offload_without_te.py)
        raise ConfigError(f"{flag}: megatron-core runs this activation offloading in TransformerEngine's cpu_offload: "
                          f"{why} (--fine-grained-activation-offloading does not need TE)")
    args.cpu_offloading = bool(layers)
    args.activation_offload_note = f"{flag}: saved activations of " + (
        f"{', '.join(args.offload_modules)} (tensors of at least {args.min_offloaded_tensor_size} elements)" if fine
        else f"{layers} of the {args.num_layers} layers") + " go to host memory in forward and return in backward (megatron-core; " \
        "the device peak shows with --log-memory-interval)"


def _check_recompute(args: argparse.Namespace) -> None:
    """megatron-core's rules (TransformerConfig.__post_init__, Megatron-LM's validate_args); --recompute-method /
    --recompute-num-layers / --recompute-modules that the granularity does not read are ignored, as there.
    Stricter here, on purpose: ``uniform`` with a count that does not divide a model chunk's layers
    (megatron-core's _checkpointed_forward loops forever on 0 and indexes past the last layer otherwise)."""
    granularity, method, n = args.recompute_granularity, args.recompute_method, args.recompute_num_layers
    if granularity is None:
        return
    if granularity == "selective":
        if method is not None or n is not None:
            raise ConfigError("--recompute-granularity selective takes --recompute-modules, not --recompute-method/"
                              "--recompute-num-layers (as in megatron-core)")
        modules = args.recompute_modules if args.recompute_modules is not None else ["core_attn"]
        if "mla_up_proj" in modules and not args.multi_latent_attention:
            raise ConfigError("--recompute-modules mla_up_proj needs --multi-latent-attention (as in megatron-core)")
        if "moe_act" in modules and not args.moe_grouped_gemm:
            raise ConfigError("--recompute-modules moe_act needs megatron-core's grouped GEMM experts: add "
                              "--moe-grouped-gemm, or use moe or mlp")
        return
    if method is None or n is None:
        raise ConfigError("--recompute-granularity full needs --recompute-method uniform|block and "
                          "--recompute-num-layers")
    per_stage = args.num_layers // args.pipeline_model_parallel_size
    if args.virtual_pipeline_model_parallel_size:
        per_stage = args.num_layers_per_virtual_pipeline_stage
    if method == "uniform" and (n < 1 or per_stage % n):
        raise ConfigError(f"--recompute-method uniform: --recompute-num-layers {n} must divide the {per_stage} layers "
                          f"of a model chunk (megatron-core recomputes groups of N layers; use block to recompute the "
                          f"first N, or none with 0)")
