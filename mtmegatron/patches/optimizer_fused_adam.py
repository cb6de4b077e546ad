"""megatron-core builds its Adam on mtmegatron's fused ``adam_step`` when neither TransformerEngine nor apex is
installed (CPU, MUSA without MT-TE, CUDA without TE).

Targets: megatron.core.optimizer:Adam / CPUAdam / USING_PYTORCH_OPTIMIZER / is_te_min_version /
_get_megatron_optimizer_based_on_param_groups, megatron.core.optimizer.optimizer_config:is_te_min_version /
OptimizerConfig.__post_init__.
Reason: without TE/apex megatron falls back to a per-tensor ``torch.optim.AdamW`` (6-13% of a CPU step), and
``--use-precision-aware-optimizer`` is impossible: OptimizerConfig probes TE's FusedAdam signature and
``is_te_min_version`` raises TypeError when TE is absent. The replacement names mtmegatron.optim.FusedAdam as
megatron's ``Adam`` (device part) and ``CPUAdam`` (host part of the offloaded optimizer), lets the precision-aware
check accept it (it has the four arguments the probe asks for), answers "no TE version is new enough" when TE
is not installed, and makes ``--use-torch-optimizer-for-cpu-offload`` choose torch's AdamW for the host part
(megatron 0.16 ignores that flag for adam). When TE or apex is importable megatron keeps their FusedAdam and
this patch changes nothing (it says so in ``mtmegatron patches``' reason). Disable it
(``MTMEGATRON_DISABLE_PATCHES=optimizer_fused_adam``) to get megatron's torch AdamW back, e.g. to benchmark.
Versions: megatron-core 0.16.x.
"""

import importlib

import torch

from mtmegatron.backends.base import installed_transformer_engine

from .base import Patch, current, set_attr, undo_in_reverse

MODULE = "megatron.core.optimizer"
CONFIG = "megatron.core.optimizer.optimizer_config"
BUILD = f"{MODULE}:_get_megatron_optimizer_based_on_param_groups"
POST_INIT = f"{CONFIG}:OptimizerConfig.__post_init__"
PRECISION_AWARE_ARGS = ("master_weight_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "use_decoupled_grad")


def apply():
    optimizer_module = importlib.import_module(MODULE)
    if not optimizer_module.USING_PYTORCH_OPTIMIZER:  # TE's or apex's FusedAdam is in use: leave it
        return lambda: None
    import inspect

    from mtmegatron.optim import FusedAdam

    missing = [a for a in PRECISION_AWARE_ARGS if a not in inspect.signature(FusedAdam).parameters]
    assert not missing, f"FusedAdam lacks {missing}"
    original_is_te_min = current(f"{MODULE}:is_te_min_version")
    original_post_init = current(POST_INIT)
    original_build = current(BUILD)

    def is_te_min_version(version, check_equality=True):
        return False if installed_transformer_engine() is None else original_is_te_min(version, check_equality)

    def __post_init__(self):
        if not (self.use_precision_aware_optimizer and not self.optimizer_cpu_offload and installed_transformer_engine() is None):
            return original_post_init(self)
        # megatron's own checks, minus the probe of TE's FusedAdam signature (ours is checked above): the
        # probe is skipped on megatron's offload branch, so run that branch and restore the flag after
        self.optimizer_cpu_offload = True
        try:
            original_post_init(self)
        finally:
            self.optimizer_cpu_offload = False
        self.use_precision_aware_optimizer_no_fp8_or_ds_fp8 = (
            self.main_params_dtype != torch.float32 or self.fp8_recipe in (None, "delayed"))

    def build(config, *args, **kwargs):
        if not config.use_torch_optimizer_for_cpu_offload:
            return original_build(config, *args, **kwargs)
        undo = set_attr(f"{MODULE}:CPUAdam", torch.optim.AdamW)
        try:
            return original_build(config, *args, **kwargs)
        finally:
            undo()

    undo = [
        set_attr(f"{MODULE}:Adam", FusedAdam),
        set_attr(f"{MODULE}:CPUAdam", FusedAdam),
        set_attr(f"{MODULE}:USING_PYTORCH_OPTIMIZER", False),
        set_attr(f"{MODULE}:is_te_min_version", is_te_min_version),
        set_attr(f"{CONFIG}:is_te_min_version", is_te_min_version),
        set_attr(POST_INIT, __post_init__),
        set_attr(BUILD, build),
    ]
    return undo_in_reverse(undo)


PATCH = Patch(
    name="optimizer_fused_adam",
    target=BUILD,
    reason="without TE/apex megatron's Adam is a per-tensor torch AdamW and the precision-aware optimizer "
    "is unavailable: use mtmegatron's FusedAdam (fused adam_step kernel) on device and host (no-op when TE/apex "
    "FusedAdam is importable)",
    versions=">=0.16,<0.17",
    apply=apply,
)
