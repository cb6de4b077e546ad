"""The one transformer-layer spec builder: every module of a dense, MoE or MTP layer chosen from the flags here.

``build_layer_spec(choice, layer_kind)`` reads like megatron-core's ``get_gpt_layer_local_spec`` /
``get_gpt_layer_with_transformer_engine_spec`` and reuses their pieces (``ModuleSpec``, the submodules classes,
``get_moe_module_spec_for_backend``, ``get_mtp_layer_spec_for_backend``, ``LocalSpecProvider``):

| slot | ``--transformer-impl local`` | ``--transformer-impl mtmegatron`` | TE layers (``transformer_engine``) |
|---|---|---|---|
| norms (input, pre-MLP, q/k/kv, MTP) | megatron's (``WrappedTorchNorm``) | ``FusedRMSNorm`` | ``TENorm``, fused into ``TELayerNormColumnParallelLinear`` where megatron fuses it |
| linears qkv/proj/fc1/fc2 (experts too) | ``Column/RowParallelLinear``; ``Fp8*`` with FP8 executors ``emulated``/``scaled_mm`` | same | TE's |
| dense MLP | ``MLP`` | ``FusedMLP`` | ``MLP`` (``FusedMLP`` with mtmegatron) |

TE layers: ``--transformer-impl transformer_engine`` where TransformerEngine (CUDA) or MT-TransformerEngine (MUSA)
serves the backend (``config/transformer_impl.py`` decides, bf16/fp16 and FP8 alike), or FP8 with the
``transformer_engine`` executor under any impl (``LayerChoice.transformer_engine``).
| core attention | ``attention/spec.core_attention_choice``: SDPA, fused softmax, local or TE; MLA's head-dims variant of a local/fused one |||

MLA, qk-layernorm, MoE (shared experts included) and MTP are kept under every choice. Each call returns a new
spec; nothing is edited after it is built. TransformerEngine is never imported here: where it is not installed
(tests) its classes are ``ModuleSpec``s naming them (``grouped_experts.te_module``), resolved only when built.
``describe_layer_spec(choice)`` is the start-up line that says what was chosen and why. ``choice`` is a
``LayerChoice`` (models/section.py: the layer flags, the FP8 flags, the TE-layers decision, the FP8 executor).
May assume: validated flags; megatron-core 0.16; for FP8, the executor chosen (``choice.fp8_executor``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec_for_backend
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.multi_latent_attention import MLASelfAttention, MLASelfAttentionSubmodules
from megatron.core.transformer.multi_token_prediction import get_mtp_layer_spec_for_backend
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from mtmegatron.attention.core import SDPADotProductAttention
from mtmegatron.attention.spec import core_attention_choice
from mtmegatron.fp8.spec import fp8_linears
from mtmegatron.models.fused_spec import FusedDotProductAttention, FusedMLP, FusedRMSNorm
from mtmegatron.models.grouped_experts import describe as describe_experts, expert_modules, te_module
from mtmegatron.models.mla_attention import with_head_dims
from mtmegatron.models.moe_layers import moe_layer_pattern
from mtmegatron.models.section import LayerChoice, Layers
from mtmegatron.models.zero_centered_norm import ZeroCenteredNorm

LAYER_KINDS = ("dense", "moe", "mtp")


@dataclass(frozen=True)
class LayerModules(LocalSpecProvider):
    """What goes into each slot of a layer, as megatron-core's BackendSpecProvider (so its MoE and MTP spec
    helpers take it; ``activation_func`` stays LocalSpecProvider's None: ``use_te_activation_func`` is off)."""

    norm: object
    column: object          # linear_qkv / linear_fc1 (dense, experts, shared experts)
    row: object             # linear_proj / linear_fc2
    plain_column: object    # MLA's LoRA projections, MTP's eh_proj: never FP8
    norm_column: object     # TE: norm + column linear in one module; None elsewhere
    core: object
    mlp: type
    transformer_engine: bool = False  # TE's layers (LayerChoice.transformer_engine)

    def column_parallel_linear(self):
        return self.column

    def row_parallel_linear(self):
        return self.row

    def fuse_layernorm_and_linear(self) -> bool:
        return self.norm_column is not None

    def column_parallel_layer_norm_linear(self):
        return self.norm_column

    def layer_norm(self, rms_norm: bool = False, for_qk: bool = False):
        return self.norm

    def core_attention(self):
        return self.core

    def grouped_mlp_modules(self, moe_use_grouped_gemm: bool, moe_use_legacy_grouped_gemm: bool):
        return expert_modules(self, moe_use_grouped_gemm, moe_use_legacy_grouped_gemm)  # models/grouped_experts.py


def choose_modules(choice: LayerChoice) -> LayerModules:
    """The modules of every layer of this run (see the module docstring's table)."""
    layers, te = choice.layers, choice.transformer_engine
    fused = layers.transformer_impl == "mtmegatron"
    kind, _ = core_attention_choice(layers.attention_backend, layers.transformer_impl, transformer_engine=te)
    if kind == "te":
        core = te_module("TEDotProductAttention")
    else:
        core = {"sdpa": SDPADotProductAttention, "fused_softmax": FusedDotProductAttention,
                "local": DotProductAttention}[kind]
    if layers.multi_latent_attention and kind in ("fused_softmax", "local"):
        core = with_head_dims(core)  # megatron's local attention does not take MLA's k/v channels
    mlp = FusedMLP if fused else MLP
    if te:
        return LayerModules(norm=te_module("TENorm"), column=te_module("TEColumnParallelLinear"),
                            row=te_module("TERowParallelLinear"), plain_column=te_module("TEColumnParallelLinear"),
                            norm_column=te_module("TELayerNormColumnParallelLinear"), core=core, mlp=mlp,
                            transformer_engine=True)
    column, row = (fp8_linears(choice.fp8, choice.fp8_executor, te)
                   or (ColumnParallelLinear, RowParallelLinear))
    norm = FusedRMSNorm if fused else LocalSpecProvider().layer_norm(rms_norm=layers.normalization == "RMSNorm")
    if layers.layernorm_zero_centered_gamma:  # --apply-layernorm-1p
        norm = ZeroCenteredNorm
    return LayerModules(norm=norm, column=column, row=row, plain_column=ColumnParallelLinear, norm_column=None,
                        core=core, mlp=mlp)


def _num_experts(layers: Layers, layer_kind) -> int | None:
    if layer_kind == "moe":
        if not layers.num_experts:
            raise ValueError("a MoE layer needs --num-experts")
        return layers.num_experts
    if layer_kind == "dense" or layer_kind is None:
        return None
    if not isinstance(layer_kind, int):
        raise ValueError(f"layer_kind {layer_kind!r}: expected one of {', '.join(LAYER_KINDS)} or a number of experts")
    return layer_kind or None


def build_layer_spec(choice: LayerChoice, layer_kind="dense",
                     attn_mask_type: AttnMaskType = AttnMaskType.causal) -> ModuleSpec:
    """A new TransformerLayer spec (``dense``, ``moe``, or a number of experts, None/0 = dense) or, for
    ``mtp``, a MultiTokenPredictionLayer spec around the decoder's last layer kind. ``attn_mask_type``:
    causal for decoders, ``no_mask`` for a vision encoder."""
    m, layers = choose_modules(choice), choice.layers
    if layer_kind == "mtp":
        pattern = moe_layer_pattern(layers.num_layers, layers.num_experts, layers.moe_layer_freq)
        last = "moe" if layers.num_experts and pattern[-1] else "dense"
        eh_proj = dataclasses.replace(m, column=m.plain_column)  # MTP's projection stays in high precision
        return get_mtp_layer_spec_for_backend(build_layer_spec(choice, last), eh_proj)
    num_experts = _num_experts(layers, layer_kind)
    te = m.transformer_engine
    qk_layernorm = bool(layers.qk_layernorm)

    if num_experts:
        mlp = get_moe_module_spec_for_backend(m, num_experts=num_experts, moe_grouped_gemm=layers.moe_grouped_gemm,
                                              moe_use_legacy_grouped_gemm=layers.moe_use_legacy_grouped_gemm)
    else:  # TE fuses the pre-MLP norm into fc1
        mlp = ModuleSpec(module=m.mlp, submodules=MLPSubmodules(linear_fc1=m.norm_column if te else m.column,
                                                                linear_fc2=m.row))
    pre_mlp_layernorm = IdentityOp if te and not num_experts else m.norm

    if layers.multi_latent_attention:  # TE fuses q/kv layernorm into the up projections
        up = m.norm_column if te and qk_layernorm else m.plain_column
        down = te_module("TELinear") if te else m.plain_column
        qk_norm = m.norm if qk_layernorm and not te else IdentityOp
        self_attention = ModuleSpec(
            module=MLASelfAttention,
            params={"attn_mask_type": attn_mask_type},
            submodules=MLASelfAttentionSubmodules(
                linear_q_proj=m.plain_column, linear_q_down_proj=down, linear_q_up_proj=up,
                linear_kv_down_proj=down, linear_kv_up_proj=up, core_attention=m.core, linear_proj=m.row,
                q_layernorm=qk_norm, kv_layernorm=qk_norm,
            ),
        )
        input_layernorm, keys_map = m.norm, {}
    else:  # TE fuses the input norm into linear_qkv
        qk_norm = m.norm if qk_layernorm else IdentityOp
        self_attention = ModuleSpec(
            module=SelfAttention,
            params={"attn_mask_type": attn_mask_type},
            submodules=SelfAttentionSubmodules(
                linear_qkv=m.norm_column if te else m.column, core_attention=m.core, linear_proj=m.row,
                q_layernorm=qk_norm, k_layernorm=qk_norm,
            ),
        )
        input_layernorm = IdentityOp if te else m.norm
        keys_map = {} if te else {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                                  "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=input_layernorm,
            self_attention=self_attention,
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=pre_mlp_layernorm,
            mlp=mlp,
            mlp_bda=get_bias_dropout_add,
            sharded_state_dict_keys_map=keys_map,
        ),
    )


def _name(module) -> str:
    module = module.module if isinstance(module, ModuleSpec) else module
    return module[1] if isinstance(module, tuple) else module.__name__


def describe_layer_spec(choice: LayerChoice) -> str:
    """The start-up line: which norm, core attention (and why), linears and MLP the layers run."""
    m, layers, te = choose_modules(choice), choice.layers, choice.transformer_engine
    _, why = core_attention_choice(layers.attention_backend, layers.transformer_impl, transformer_engine=te)
    executor = f" (FP8 executor {choice.fp8_executor})" if choice.fp8.fp8 else ""
    norm = f"{_name(m.norm)}{' + ' + _name(m.norm_column) if te else ''}"
    experts = describe_experts(layers.num_experts, layers.moe_grouped_gemm, layers.moe_use_legacy_grouped_gemm, m)
    return (f"mtmegatron: layers: --transformer-impl {layers.transformer_impl} | norm {norm} | attention "
            f"{_name(m.core)} ({why}) | linears {_name(m.column)}/{_name(m.row)}{executor} | MLP {_name(m.mlp)}"
            f"{experts}")
