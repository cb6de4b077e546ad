"""megatron-core's own requirements, checked at parse time: one ``ConfigError`` line instead of a traceback.

The run builds megatron-core's ``TransformerConfig`` (or ``MLATransformerConfig``), ``OptimizerConfig`` and
``DistributedDataParallelConfig`` from the flags (models/config_from_flags.py); their ``__post_init__`` asserts
Megatron-LM's combinations (e.g. ``--batch-invariant-mode`` needs ``--attention-backend flash``, a ``--no-rope-freq``
list as long as ``--num-layers``). ``check_configs`` builds them the same way once the backend is active (its
patches applied), before any process group (pretrain.prepare), and turns an
AssertionError/ValueError into one line naming the flag that causes it (found by putting each given flag back to
its default until the config builds). A few requirements megatron-core asserts later, in its modules' constructors
or forward, are stated below (``RULES``) with the module that asserts them.
May assume: ``check_rules``: called last in training/arguments.CHECKS; ``check_configs``: validated args and the
backend active (pretrain.prepare).
"""

from __future__ import annotations

import copy

from mtmegatron.utils.errors import ConfigError


def config_builders():
    """(name, function args -> that config), as the run builds them."""
    from mtmegatron.models.gpt import transformer_config
    from mtmegatron.training.optimizer import optimizer_config
    from mtmegatron.training.overlap import ddp_config

    def optimizer(args):
        from mtmegatron.models.config_from_flags import params_dtype

        return optimizer_config(args, params_dtype(args))

    def transformer(args):
        if args.fp8_format and not args.fp8_executor_in_use:
            args = copy.copy(args)  # the FP8 executor is chosen once the backend is active (pretrain.prepare)
            args.fp8_executor_in_use = "emulated"
        return transformer_config(args)

    return (("TransformerConfig", transformer), ("OptimizerConfig", optimizer),
            ("DistributedDataParallelConfig", ddp_config))


def _build(builder, args) -> str | None:
    """None where the config builds, else megatron-core's message."""
    try:
        builder(args)
    except (AssertionError, ValueError, TypeError, ImportError) as e:  # ImportError: a kernel of TE's
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def _culprit(builder, args) -> str | None:
    """The option string of the one given flag whose default makes ``builder`` succeed, if there is one."""
    from mtmegatron.config import megatron_flags

    defaults = {row.dest: row.default_value for row in megatron_flags.table() if row.action != "HelpAction"}
    for dest, flag in args.given_flags.items():
        if dest not in defaults or getattr(args, dest) == defaults[dest]:
            continue
        trial = copy.copy(args)
        setattr(trial, dest, defaults[dest])
        if _build(builder, trial) is None:
            return flag
    return None


def _flag_text(args, flag: str) -> str:
    from mtmegatron.config import megatron_flags

    row = next((r for r in megatron_flags.table() if r.flag == flag), None)
    value = getattr(args, row.dest, None) if row else None
    if row is None or isinstance(value, bool) or value is None:
        return flag
    return f"{flag} {' '.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"


def _te_installed() -> bool:
    from megatron.core.transformer.moe import moe_layer

    return bool(getattr(moe_layer, "HAVE_TE", False))


# (flag, when it applies, the requirement, where megatron-core asserts it)
RULES = (
    ("--moe-latent-size", lambda a: a.num_experts and a.moe_latent_size and not _te_installed(),
     "MoE latent projections are TransformerEngine linears and TransformerEngine is not installed "
     "(megatron-core's MoELayer asserts it)"),
    ("--moe-permute-fusion", lambda a: a.moe_permute_fusion and not _te_installed(),
     "needs TransformerEngine's permutation kernels, and TransformerEngine is not installed (megatron-core's "
     "TransformerConfig imports them)"),
    ("--moe-apply-probs-on-input", lambda a: a.num_experts and a.moe_apply_probs_on_input and a.moe_router_topk != 1,
     "works only with --moe-router-topk 1 (megatron-core's experts assert it in the first forward)"),
    ("--moe-shared-expert-intermediate-size", lambda a: a.num_experts and a.moe_shared_expert_intermediate_size
     and a.add_bias_linear,
     "shared experts take no linear biases: add --disable-bias-linear (megatron-core's SharedExpertMLP asserts it)"),
)


def check_rules(args) -> None:
    """The flag-only requirements (``RULES``): in the validation pass (training/arguments.CHECKS)."""
    for flag, applies, why in RULES:
        if applies(args):
            raise ConfigError(f"{flag}: {why}")


def check_configs(args) -> None:
    """The configs built as the run builds them: after ``mtmegatron.activate`` (pretrain.prepare), whose patches
    change what megatron-core accepts (e.g. patches/optimizer_fused_adam.py lets OptimizerConfig take
    --use-precision-aware-optimizer without TransformerEngine) and whose backend decides the fusion fields."""
    for name, builder in config_builders():
        message = _build(builder, args)
        if message is None:
            continue
        flag = _culprit(builder, args)
        named = _flag_text(args, flag) if flag else "these flags together"
        raise ConfigError(f"{named}: megatron-core's {name} refuses it: {message}")
