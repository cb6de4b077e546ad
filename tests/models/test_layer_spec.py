"""``models/layer_spec.build_layer_spec``: the classes in every slot for each (transformer impl x attention backend
x FP8 executor x model family), TE cases by spec structure (class names under megatron-core's TE extension
module, never importing TransformerEngine) -- ``--transformer-impl transformer_engine`` in bf16 as it resolves
where TE serves the backend (the cpu backend's transformer_engine_missing faked to say so), and FP8 with TE's
executor under every impl; LLaVA's language layers follow the impl while its vision encoder stays local; DeepSeek with FP8 keeps MLA, qk-layernorm and MTP; building a spec
never changes another one; one tiny DeepSeek FP8 model built on the CPU has the expected module tree.
The expectations are written out here as a table, independently of the builder's code.
"""

from __future__ import annotations

import copy
import itertools
import os

from unittest import mock

import pytest
import torch.distributed as dist

import mtmegatron
from mtmegatron.models.gpt import layer_choice
from mtmegatron.models.layer_spec import build_layer_spec, describe_layer_spec
from mtmegatron.config.arguments import parse_args

from helpers.ports import free_port

TE = "megatron.core.extensions.transformer_engine"
IMPLS, BACKENDS = ("local", "mtmegatron", "transformer_engine"), ("auto", "local", "flash")
EXECUTORS, FAMILIES = (None, "emulated", "scaled_mm", "transformer_engine"), ("llama3", "mixtral", "deepseek-v3")


def make_args(impl="local", backend="auto", executor=None, family="llama3", *extra):
    fp8 = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--bf16"] if executor else []
    if executor == "transformer_engine":  # by name: TE's layers are decided at parse time (transformer_impl.py)
        fp8 += ["--fp8-executor", "transformer_engine"]
    argv = ["--model", family, "--model-size", "tiny", "--mock-data", "--transformer-impl", impl,
            "--attention-backend", backend, *fp8, *extra]
    with mock.patch("mtmegatron.backends.cpu.CpuBackend.transformer_engine_missing", return_value=None):  # TE serves
        args = parse_args(argv, world_size=1)
    assert args.transformer_impl == impl
    if executor:
        args.fp8_executor_in_use = executor  # what pretrain records; no backend is activated here
    return args


def qualname(slot) -> str:
    """'module.Class' of a class, a ModuleSpec of a class, or a ModuleSpec naming (module, Class)."""
    module = getattr(slot, "module", slot)
    if isinstance(module, tuple):
        return ".".join(module)
    return f"{module.__module__}.{module.__name__}"


def name(slot) -> str:
    return qualname(slot).rsplit(".", 1)[1]


def expected(impl, backend, executor, family):
    """What each slot must hold, written out per case."""
    te = executor == "transformer_engine" or (impl == "transformer_engine" and executor is None)
    fused, mla = impl == "mtmegatron", family == "deepseek-v3"
    if backend == "local":
        core = "FusedDotProductAttention" if fused else "DotProductAttention"
        core = f"MLA{core}" if mla else core  # the head-dims variant
    else:
        core = "TEDotProductAttention" if te else "SDPADotProductAttention"
    column = "TEColumnParallelLinear" if te else {None: "ColumnParallelLinear", "emulated": "Fp8ColumnParallelLinear",
                                                  "scaled_mm": "Fp8ColumnParallelLinear"}[executor]
    row = "TERowParallelLinear" if te else {None: "RowParallelLinear", "emulated": "Fp8RowParallelLinear",
                                            "scaled_mm": "Fp8RowParallelLinear"}[executor]
    norm = "TENorm" if te else "FusedRMSNorm" if fused else "WrappedTorchNorm"
    return dict(core=core, column=column, row=row, norm=norm, te=te, mla=mla,
                mlp="FusedMLP" if fused else "MLP",
                norm_column="TELayerNormColumnParallelLinear" if te else column)


def check_attention(attention, e, family):
    sub = attention.submodules
    assert name(sub.core_attention) == e["core"]
    assert name(sub.linear_proj) == e["row"]
    if not e["mla"]:
        assert name(attention) == "SelfAttention"
        assert name(sub.linear_qkv) == e["norm_column"]  # TE: the input norm fused into linear_qkv
        assert name(sub.q_layernorm) == "IdentityOp"  # llama3/mixtral presets have no qk-layernorm
        return
    assert name(attention) == "MLASelfAttention"
    # MLA's LoRA projections stay high precision (megatron compares them by class); TE: TELinear
    assert name(sub.linear_q_down_proj) == ("TELinear" if e["te"] else "ColumnParallelLinear")
    assert name(sub.linear_kv_down_proj) == ("TELinear" if e["te"] else "ColumnParallelLinear")
    # qk-layernorm (deepseek preset): TE fuses it into the up projections, elsewhere its own norm module
    up = "TELayerNormColumnParallelLinear" if e["te"] else "ColumnParallelLinear"
    assert name(sub.linear_q_up_proj) == up and name(sub.linear_kv_up_proj) == up
    qk_norm = "IdentityOp" if e["te"] else e["norm"]
    assert name(sub.q_layernorm) == qk_norm and name(sub.kv_layernorm) == qk_norm


def check_layer(spec, e, family, moe: bool):
    assert name(spec) == "TransformerLayer"
    sub = spec.submodules
    input_norm = "IdentityOp" if e["te"] and not e["mla"] else e["norm"]
    assert name(sub.input_layernorm) == input_norm
    check_attention(sub.self_attention, e, family)
    if moe:
        assert name(sub.mlp) == "MoELayer" and name(sub.pre_mlp_layernorm) == e["norm"]
        experts = sub.mlp.submodules.experts
        assert name(experts) == "SequentialMLP"
        assert name(experts.submodules.linear_fc1) == e["column"] and name(experts.submodules.linear_fc2) == e["row"]
        shared = sub.mlp.submodules.shared_experts
        if family == "deepseek-v3":
            assert name(shared.submodules.linear_fc1) == e["column"]
    else:
        assert name(sub.mlp) == e["mlp"]
        assert name(sub.pre_mlp_layernorm) == ("IdentityOp" if e["te"] else e["norm"])
        assert name(sub.mlp.submodules.linear_fc1) == e["norm_column"]
        assert name(sub.mlp.submodules.linear_fc2) == e["row"]


# TE layers run FP8 themselves: --transformer-impl transformer_engine takes no mtmegatron executor (test below)
CASES = [case for case in itertools.product(IMPLS, BACKENDS, EXECUTORS, FAMILIES)
         if not (case[0] == "transformer_engine" and case[2] in ("emulated", "scaled_mm"))]


@pytest.mark.parametrize("impl,backend,executor,family", CASES,
                         ids=[f"{i}-{b}-{x or 'bf16'}-{f}" for i, b, x, f in CASES])
def test_every_slot_has_the_expected_class(impl, backend, executor, family):
    args = make_args(impl, backend, executor, family)
    e = expected(impl, backend, executor, family)
    kinds = {"llama3": ["dense"], "mixtral": ["moe"], "deepseek-v3": ["dense", "moe"]}[family]
    for kind in kinds:
        check_layer(build_layer_spec(layer_choice(args), kind), e, family, moe=kind == "moe")
    if e["te"]:  # by name, under megatron-core's TE extension module
        core = build_layer_spec(layer_choice(args), kinds[-1]).submodules.self_attention.submodules.linear_proj
        assert qualname(core) == f"{TE}.TERowParallelLinear"
    if executor in ("emulated", "scaled_mm"):
        qkv_or_proj = build_layer_spec(layer_choice(args), kinds[0]).submodules.self_attention.submodules.linear_proj
        assert qkv_or_proj.params["fp8_executor"] == executor
        assert qkv_or_proj.params["fp8_recipe"].name == "tensorwise"
    if family == "deepseek-v3":  # MTP: around the decoder's last layer kind (MoE in the tiny preset)
        mtp = build_layer_spec(layer_choice(args), "mtp")
        assert name(mtp) == "MultiTokenPredictionLayer"
        assert name(mtp.submodules.enorm) == e["norm"] and name(mtp.submodules.layer_norm) == e["norm"]
        assert name(mtp.submodules.eh_proj) == ("TEColumnParallelLinear" if e["te"] else "ColumnParallelLinear")
        check_layer(mtp.submodules.transformer_layer, e, family, moe=True)


def test_deepseek_with_te_fp8_keeps_mla_moe_and_mtp():
    """The case the old TE branch got wrong: it returned TE's stock (non-MLA, no-MTP) layer."""
    args = make_args("local", "auto", "transformer_engine", "deepseek-v3")
    moe = build_layer_spec(layer_choice(args), "moe")
    assert name(moe.submodules.self_attention) == "MLASelfAttention"
    assert name(moe.submodules.mlp) == "MoELayer"
    assert name(moe.submodules.mlp.submodules.shared_experts) == "SharedExpertMLP"
    assert name(build_layer_spec(layer_choice(args), "dense").submodules.mlp) == "MLP"
    assert name(build_layer_spec(layer_choice(args), "mtp").submodules.transformer_layer.submodules.self_attention) == \
        "MLASelfAttention"


def test_building_a_spec_never_changes_another():
    cases = [make_args(*case) for case in [("local", "auto", None, "deepseek-v3"),
                                           ("mtmegatron", "local", "emulated", "deepseek-v3"),
                                           ("mtmegatron", "auto", "transformer_engine", "mixtral"),
                                           ("local", "flash", "scaled_mm", "llama3")]]
    first = [(build_layer_spec(layer_choice(a), "dense"), build_layer_spec(layer_choice(a), "mtp") if a.mtp_num_layers else None)
             for a in cases]
    snapshot = copy.deepcopy(first)
    second = [(build_layer_spec(layer_choice(a), "dense"), build_layer_spec(layer_choice(a), "mtp") if a.mtp_num_layers else None)
              for a in reversed(cases)][::-1]
    assert first == snapshot  # nothing built later edited what was built before
    assert second == first  # building again gives the same spec
    assert first[0][0] is not second[0][0]  # a new object each time


def test_layer_kinds_and_mistakes():
    args = make_args(family="mixtral")
    assert name(build_layer_spec(layer_choice(args), 4).submodules.mlp) == "MoELayer"
    assert name(build_layer_spec(layer_choice(args), None).submodules.mlp) == "MLP"
    with pytest.raises(ValueError, match="a MoE layer needs --num-experts"):
        build_layer_spec(layer_choice(make_args(family="llama3")), "moe")
    with pytest.raises(ValueError, match="layer_kind 'sparse'"):
        build_layer_spec(layer_choice(args), "sparse")


def test_description_states_the_attention_and_why():
    line = describe_layer_spec(layer_choice(make_args("mtmegatron", "auto")))
    assert "attention SDPADotProductAttention" in line and "faster than mtmegatron's fused softmax" in line
    assert "norm FusedRMSNorm" in line and "MLP FusedMLP" in line
    line = describe_layer_spec(layer_choice(make_args("mtmegatron", "local")))
    assert "attention FusedDotProductAttention (--attention-backend local with --transformer-impl mtmegatron)" in line
    line = describe_layer_spec(layer_choice(make_args("local", "auto", "transformer_engine", "deepseek-v3")))
    assert "attention TEDotProductAttention" in line and "linears TEColumnParallelLinear/TERowParallelLinear" in line
    assert "FP8 executor transformer_engine" in line


def test_te_bf16_description_names_te_layers():
    line = describe_layer_spec(layer_choice(make_args("transformer_engine", "auto", None, "llama3")))
    assert line.startswith("mtmegatron: layers: --transformer-impl transformer_engine | norm TENorm + "
                           "TELayerNormColumnParallelLinear | attention TEDotProductAttention")
    assert "with TransformerEngine layers" in line and "linears TEColumnParallelLinear/TERowParallelLinear" in line
    assert "FP8 executor" not in line


def test_deepseek_fp8_model_has_mla_mtp_and_fp8_linears():
    """A built module tree (CPU, one rank): MLA with the fused softmax's head-dims variant, FP8 dense/expert
    linears, high-precision MLA projections, an MTP block."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from mtmegatron.models.gpt import build_model_chunks, transformer_config

    args = make_args("mtmegatron", "local", "emulated", "deepseek-v3")
    mtmegatron.activate("cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel()
        model_parallel_cuda_manual_seed(1234)
        (model,) = build_model_chunks(args, transformer_config(args))
        layers = model.decoder.layers
        assert [type(layer.mlp).__name__ for layer in layers] == ["FusedMLP", "MoELayer", "MoELayer", "MoELayer"]
        attention = layers[1].self_attention
        assert type(attention).__name__ == "MLASelfAttention"
        assert type(attention.core_attention).__name__ == "MLAFusedDotProductAttention"
        assert type(attention.linear_proj).__name__ == "Fp8RowParallelLinear"
        assert type(attention.linear_q_down_proj).__name__ == "ColumnParallelLinear"
        assert type(layers[1].mlp.experts.local_experts[0].linear_fc1).__name__ == "Fp8ColumnParallelLinear"
        mtp_layer = model.mtp.layers[0]
        assert type(mtp_layer.transformer_layer.self_attention).__name__ == "MLASelfAttention"
        assert type(mtp_layer.enorm).__name__ == "FusedRMSNorm"
        assert type(mtp_layer.eh_proj).__name__ == "ColumnParallelLinear"
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        mtmegatron.deactivate()


@pytest.mark.parametrize("impl", IMPLS)
def test_llava_language_layers_follow_the_impl_and_the_vision_encoder_stays_local(impl):
    from mtmegatron.models.families.llava.model import vision_layer_spec

    args = make_args(impl, "auto", None, "llava")
    check_layer(build_layer_spec(layer_choice(args), "dense"), expected(impl, "auto", None, "llama3"), "llama3", moe=False)
    vision = vision_layer_spec(layer_choice(args))
    assert name(vision.submodules.self_attention.submodules.linear_qkv) == "ColumnParallelLinear"
    assert name(vision.submodules.input_layernorm) == "WrappedTorchNorm"
    assert name(vision.submodules.self_attention.submodules.core_attention) == "SDPADotProductAttention"
