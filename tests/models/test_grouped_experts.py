"""``--moe-grouped-gemm`` (models/grouped_experts.py): which experts module each case builds (TE by spec structure,
never importing TransformerEngine), the start-up line, the user mistakes refused before anything starts, the HF
converter's sequential view, and the patches that serve megatron-core's GroupedMLP without the grouped_gemm package.
The numerical equivalence with the sequential experts (EP1, EP2, EP2xTP2) is in tests/parallel/test_equivalence.py.
"""

from __future__ import annotations

import pytest

from mtmegatron.models.gpt import layer_choice
from mtmegatron.models.layer_spec import build_layer_spec, describe_layer_spec
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

TE = "megatron.core.extensions.transformer_engine"


def make_args(*extra, impl="local", te_executor=False):
    fp8 = (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--bf16", "--fp8-executor", "transformer_engine"]
           if te_executor else [])
    args = parse_args(["--model", "mixtral", "--model-size", "tiny", "--mock-data", "--transformer-impl", impl,
                       *fp8, *extra], world_size=1)
    if te_executor:  # TE layers by structure: what pretrain records; TE itself is never imported
        args.fp8_executor_in_use = "transformer_engine"
    return args


def experts(args):
    return build_layer_spec(layer_choice(args), "moe").submodules.mlp.submodules.experts


def qualname(slot) -> str:
    module = getattr(slot, "module", slot)
    return ".".join(module) if isinstance(module, tuple) else f"{module.__module__}.{module.__name__}"


@pytest.mark.parametrize("impl", ["local", "mtmegatron"])
def test_experts_module_per_flag_without_te(impl):
    sequential = experts(make_args(impl=impl))
    assert sequential.module.__name__ == "SequentialMLP"
    assert sequential.submodules.linear_fc1.__name__ == "ColumnParallelLinear"
    grouped = experts(make_args("--moe-grouped-gemm", impl=impl))
    assert grouped.module.__name__ == "GroupedMLP" and grouped.submodules is None
    assert "experts GroupedMLP" in describe_layer_spec(layer_choice(make_args("--moe-grouped-gemm", impl=impl)))


def test_te_layers_get_te_grouped_linears_unless_legacy():
    args = make_args(te_executor=True)
    args.moe_grouped_gemm = True
    spec = experts(args)
    assert qualname(spec.module) == "megatron.core.transformer.moe.experts.TEGroupedMLP"
    assert qualname(spec.submodules.linear_fc1) == f"{TE}.TEColumnParallelGroupedLinear"
    assert qualname(spec.submodules.linear_fc2) == f"{TE}.TERowParallelGroupedLinear"
    args.moe_use_legacy_grouped_gemm = True
    assert experts(args).module.__name__ == "GroupedMLP"
    args.moe_grouped_gemm = False
    assert qualname(experts(args).submodules.linear_fc1) == f"{TE}.TEColumnParallelLinear"


NO_PRESET = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--max-position-embeddings", "32", "--vocab-size", "256", "--num-experts", "4", "--mock-data",
             "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1", "--lr", "1e-3"]
MISTAKES = {
    "fp8_without_te": (["--moe-grouped-gemm", "--fp8-format", "hybrid", "--bf16"],
                       "--moe-grouped-gemm with --fp8-format needs TransformerEngine's grouped linears"),
    "bias": (["--moe-grouped-gemm"], "add --disable-bias-linear"),  # Megatron-LM's default: biases on
    "moe_act_without_grouped": (["--recompute-granularity", "selective", "--recompute-modules", "moe_act"],
                                "--recompute-modules moe_act needs megatron-core's grouped GEMM experts: add "
                                "--moe-grouped-gemm"),
}


@pytest.mark.parametrize("case", MISTAKES)
def test_mistakes_are_one_line_errors(case):
    import importlib.util

    if case == "fp8_without_te" and importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("TransformerEngine is installed: its grouped linears run FP8")
    flags, message = MISTAKES[case]
    with pytest.raises(ConfigError) as e:
        if case == "bias":  # no preset
            parse_args(NO_PRESET + flags, world_size=1)
        else:
            make_args(*flags)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_moe_act_recompute_is_accepted_with_grouped_gemm():
    args = make_args("--moe-grouped-gemm", "--recompute-granularity", "selective", "--recompute-modules", "moe_act")
    assert args.moe_grouped_gemm and args.recompute_modules == ["moe_act"]


def test_converter_builds_the_sequential_experts():
    """The HF mapping names local_experts.<e>; torch_dist checkpoints are the same for both layouts."""
    from mtmegatron.convert.model import parse_flags

    assert parse_flags(["--model", "mixtral", "--model-size", "tiny", "--moe-grouped-gemm"]).moe_grouped_gemm is False


def test_patch_serves_megatron_gmm_hook_when_grouped_gemm_is_absent():
    from megatron.core.transformer.moe import grouped_gemm_util as gg

    from mtmegatron import patches
    from mtmegatron.ops import grouped_mm

    if gg.grouped_gemm_is_available() and gg.grouped_gemm is not grouped_mm.package:
        pytest.skip("the grouped_gemm package is installed: the patch leaves it in place")
    patch = next(p for p in patches.all_patches() if p.name == "grouped_gemm_ops")
    before = gg.ops
    undo = patch.apply()
    try:
        gg.assert_grouped_gemm_is_available()  # what GroupedMLP.__init__ asks
        assert gg.ops.gmm is grouped_mm.gmm
    finally:
        undo()
    assert gg.ops is before
