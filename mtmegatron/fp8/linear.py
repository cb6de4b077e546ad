"""FP8 column- and row-parallel linears for megatron-core's local spec.

``Fp8ColumnParallelLinear`` / ``Fp8RowParallelLinear`` subclass megatron-core's layers and replace only
``_forward_impl`` (the matmul with its sequence-parallel all-gather / reduce-scatter and dgrad all-reduce), so
the rest of the TP/SP communication stays megatron's. The GEMMs of forward, dgrad and wgrad are quantized with
the recipe's scales and run by the chosen executor (executors.py); bias, outputs and gradients keep the
parameter dtype. Delayed-scaling state (amax histories, scales) is reduced over megatron-core's amax-reduction
group (TP x DP x CP, or TP x CP with ``--tp-only-amax-red``; the expert-TP group for expert linears) and is
the layers' ``_extra_state``, so it is saved in and restored from checkpoints. ``fp8 = None`` on a layer
(``--first-last-layers-bf16``) or a frozen weight falls back to megatron's own high-precision path.
May assume: megatron-core parallel state is initialised; no gradient-accumulation fusion.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.mappings import _gather_along_first_dim, _reduce_scatter_along_first_dim

from .executors import GEMMS
from .quantizer import Quantizer
from .recipes import DelayedScaling, Recipe
from .state import DelayedScalingState


class Fp8Runtime:
    """What one FP8 linear needs at run time: its quantizer (with delayed-scaling state) and GEMM."""

    def __init__(self, recipe: Recipe, executor: str, group, device):
        state = DelayedScalingState(recipe, group, device) if isinstance(recipe, DelayedScaling) else None
        self.quantize = Quantizer(recipe, state)
        self.state = state
        self.gemm = GEMMS[executor]
        self.executor = executor

    def record(self, amaxes: dict) -> None:
        if self.state is not None:
            self.state.record(amaxes)


class _Fp8Linear(torch.autograd.Function):
    """y = x W^T (+ b) with quantized GEMMs; optional SP all-gather of x / reduce-scatter or all-reduce of dx."""

    @staticmethod
    def forward(ctx, input, weight, bias, fp8: Fp8Runtime, sequence_parallel, allreduce_dgrad, tp_group):
        total = _gather_along_first_dim(input, tp_group) if sequence_parallel else input
        x = total.reshape(-1, total.shape[-1])
        qx, amax_x = fp8.quantize(x, "input")
        qw, amax_w = fp8.quantize(weight, "weight")
        fp8.record({"input": amax_x, "weight": amax_w})
        out = fp8.gemm(qx, qw).to(input.dtype).view(*total.shape[:-1], weight.shape[0])
        if bias is not None:
            out = out + bias
        if fp8.quantize.tensor_scaled:  # keep the FP8 copies: their transposes serve dgrad/wgrad
            ctx.saved = (qx, qw)
        else:
            ctx.saved = (x, qw if qw.block[0] == qw.block[1] else None)
            ctx.save_for_backward(weight)
        ctx.fp8, ctx.use_bias, ctx.input_shape, ctx.dtype = fp8, bias is not None, input.shape, input.dtype
        ctx.sequence_parallel, ctx.allreduce_dgrad, ctx.tp_group = sequence_parallel, allreduce_dgrad, tp_group
        return out

    @staticmethod
    def backward(ctx, grad_output):
        fp8 = ctx.fp8
        g = grad_output.reshape(-1, grad_output.shape[-1])
        qg, amax_g = fp8.quantize(g, "grad_output")
        fp8.record({"grad_output": amax_g})
        if fp8.quantize.tensor_scaled:
            qx, qw = ctx.saved
            qwt, qgt, qxt = qw.t(), qg.t(), qx.t()
        else:
            x, qw = ctx.saved
            (weight,) = ctx.saved_tensors
            qwt = qw.t() if qw is not None else fp8.quantize(weight.t().contiguous(), "weight")[0]
            qgt = fp8.quantize(g.t().contiguous(), "grad_output")[0]
            qxt = fp8.quantize(x.t().contiguous(), "input")[0]
        grad_input = fp8.gemm(qg, qwt).to(ctx.dtype)
        grad_input = grad_input.view(*grad_output.shape[:-1], grad_input.shape[-1])
        if ctx.sequence_parallel:
            grad_input = _reduce_scatter_along_first_dim(grad_input, ctx.tp_group)
        elif ctx.allreduce_dgrad:
            torch.distributed.all_reduce(grad_input, group=ctx.tp_group)
        grad_weight = fp8.gemm(qgt, qxt).to(ctx.dtype)
        grad_bias = g.sum(dim=0) if ctx.use_bias else None
        ctx.saved = None
        return grad_input, grad_weight, grad_bias, None, None, None, None


def _amax_group(is_expert: bool, tp_only_amax_red: bool):
    if is_expert:
        return parallel_state.get_expert_tensor_parallel_group()
    return parallel_state.get_amax_reduction_group(with_context_parallel=True, tp_only_amax_red=tp_only_amax_red)


class _Fp8LinearMixin:
    """The FP8 parts shared by the column- and row-parallel layers (``fp8`` is None: high precision)."""

    def _init_fp8(self, fp8_recipe: Recipe, fp8_executor: str, tp_only_amax_red: bool) -> None:
        group = _amax_group(self.is_expert, tp_only_amax_red)
        self.fp8 = Fp8Runtime(fp8_recipe, fp8_executor, group, self.weight.device)

    def _forward_impl(self, input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad, sequence_parallel,
                      grad_output_buffer=None, wgrad_deferral_limit=None, tp_group=None, **kwargs):
        if self.fp8 is None or not weight.requires_grad:
            return super()._forward_impl(input=input, weight=weight, bias=bias,
                                         gradient_accumulation_fusion=gradient_accumulation_fusion,
                                         allreduce_dgrad=allreduce_dgrad, sequence_parallel=sequence_parallel,
                                         grad_output_buffer=grad_output_buffer,
                                         wgrad_deferral_limit=wgrad_deferral_limit, tp_group=tp_group, **kwargs)
        assert not gradient_accumulation_fusion and grad_output_buffer is None, "not supported with FP8 linears"
        return _Fp8Linear.apply(input, weight, bias, self.fp8, sequence_parallel, allreduce_dgrad, tp_group)

    def _apply(self, fn, recurse=True):
        # Module.to()/cuda() move parameters and buffers; the delayed-scaling state goes with the weight
        module = super()._apply(fn, recurse)
        if self.fp8 is not None and self.fp8.state is not None:
            self.fp8.state.to(self.weight.device)
        return module

    def get_extra_state(self):
        if self.fp8 is None or self.fp8.state is None:
            return None
        return self.fp8.state.state_dict()

    def set_extra_state(self, state):
        if self.fp8 is not None and self.fp8.state is not None and state is not None:
            self.fp8.state.load_state_dict(state)


class Fp8ColumnParallelLinear(_Fp8LinearMixin, ColumnParallelLinear):
    def __init__(self, *args, fp8_recipe: Recipe, fp8_executor: str, tp_only_amax_red: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fp8(fp8_recipe, fp8_executor, tp_only_amax_red)


class Fp8RowParallelLinear(_Fp8LinearMixin, RowParallelLinear):
    def __init__(self, *args, fp8_recipe: Recipe, fp8_executor: str, tp_only_amax_red: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fp8(fp8_recipe, fp8_executor, tp_only_amax_red)
