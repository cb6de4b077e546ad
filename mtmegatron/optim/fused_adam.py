"""``FusedAdam``: AdamW over the fused multi-tensor ``mtmegatron::adam_step`` kernel, shaped like
TransformerEngine's FusedAdam so megatron-core can use it where it would use TE's.

megatron-core 0.16 picks TE's FusedAdam, else apex's, else a plain per-tensor ``torch.optim.AdamW``. This class
takes the constructor arguments megatron passes to TE's (``adam_w_mode``, ``bias_correction``, and for
``--use-precision-aware-optimizer`` ``master_weights``, ``master_weight_dtype``, ``exp_avg_dtype``,
``exp_avg_sq_dtype``, ``use_decoupled_grad``) and offers TE's state hooks (``initialize_state``,
``get_unscaled_state``, ``set_scaled_state``). Its state follows torch's AdamW (a per-parameter ``step`` tensor,
``exp_avg``, ``exp_avg_sq``; ``master_param`` with master weights) and it subclasses ``torch.optim.AdamW``, so
megatron's checkpoint code for torch optimizers (no apex/TE) handles it unchanged.

One step: parameters with a gradient are grouped by (device, step count, gradient dtype) and each group is one
``adam_step`` call. The kernel wants fp32 contiguous params/moments and fp32 or bf16 grads; other dtypes (bf16
params without master weights, bf16/fp16 moments, fp16 grads) go through fp32 temporaries written back after
the call. ``adam_w_mode=False`` (L2 Adam) folds ``weight_decay * p`` into the gradient.
Parameters may be DTensors (Megatron-FSDP's main weights, torch FSDP2's parameters): the update runs on each
one's local shard (the kernel is elementwise; the op has no DTensor sharding rule).
May assume: torch >= 2.7; the params of one optimizer may live on different devices (host and device in the
offloaded optimizer).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.distributed.tensor import DTensor

from mtmegatron.ops.adam import adam_step

_MOMENT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# every adam_step call made by any FusedAdam in this process (tests and offload_stats read it)
KERNEL_CALLS = 0


class FusedAdam(torch.optim.AdamW):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, adam_w_mode=True, master_weights=False, master_weight_dtype=torch.float32,
                 exp_avg_dtype=torch.float32, exp_avg_sq_dtype=torch.float32, use_decoupled_grad=False,
                 store_param_remainders=False, capturable=False, fused=True, set_grad_none=True):
        if amsgrad or capturable or store_param_remainders or not bias_correction:
            raise ValueError("FusedAdam (mtmegatron::adam_step) supports AdamW/Adam with bias correction only: "
                             "not amsgrad, capturable, store_param_remainders or bias_correction=False")
        if master_weight_dtype != torch.float32:
            raise ValueError(f"FusedAdam keeps fp32 master weights only, not {master_weight_dtype}")
        for name, dtype in (("exp_avg_dtype", exp_avg_dtype), ("exp_avg_sq_dtype", exp_avg_sq_dtype)):
            if dtype not in _MOMENT_DTYPES:
                raise ValueError(f"FusedAdam {name} must be one of {_MOMENT_DTYPES}, not {dtype}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, bias_correction=True,
                        adam_w_mode=adam_w_mode, amsgrad=False, maximize=False, foreach=None, capturable=False,
                        differentiable=False, fused=None, decoupled_weight_decay=adam_w_mode)
        torch.optim.Optimizer.__init__(self, params, defaults)
        self.master_weights = master_weights
        self.exp_avg_dtype = exp_avg_dtype
        self.exp_avg_sq_dtype = exp_avg_sq_dtype
        self.use_decoupled_grad = use_decoupled_grad
        self.num_kernel_calls = 0
        self.num_tensor_updates = 0

    # ---- TransformerEngine FusedAdam's state interface (used by megatron's precision-aware paths) ----------
    def initialize_state(self, param, store_param_remainders=False):
        state = self.state[param]
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(param, dtype=self.exp_avg_dtype, memory_format=torch.contiguous_format)
        state["exp_avg_sq"] = torch.zeros_like(param, dtype=self.exp_avg_sq_dtype,
                                               memory_format=torch.contiguous_format)
        if self.master_weights:
            state["master_param"] = param.detach().clone(memory_format=torch.contiguous_format).float()

    def get_unscaled_state(self, param, state_name):
        return self.state[param][state_name].float()

    def set_scaled_state(self, param, state_name, unscaled_state):
        if not self.state[param]:
            self.initialize_state(param)
        self.state[param][state_name].copy_(unscaled_state)

    @staticmethod
    def _process_value_according_to_param_policy(param, value, param_id, param_groups, key=None):
        # torch casts loaded floating state to the param's dtype; moments and master weights keep their own
        # (precision-aware: bf16 params, fp32 state); only the device follows the param.
        return value if key == "step" else value.to(device=param.device)

    # ---- the update ---------------------------------------------------------------------------------------
    def _grad(self, p):
        return getattr(p, "decoupled_grad", None) if self.use_decoupled_grad else p.grad

    @torch.no_grad()
    def step(self, closure=None):
        global KERNEL_CALLS
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            decoupled = group.get("adam_w_mode", True)
            wd = group["weight_decay"]
            calls = defaultdict(lambda: ([], [], [], []))  # (device, step, grad dtype) -> kernel lists
            write_back = []  # (destination, fp32 temporary)
            for p in group["params"]:
                grad = self._grad(p)
                if grad is None:
                    continue
                state = self.state[p]
                if not state:
                    self.initialize_state(p)
                state["step"] += 1
                step = int(state["step"])
                target = state["master_param"] if self.master_weights else p
                target = self._fp32(target, write_back)
                moments = [self._fp32(state[k], write_back) for k in ("exp_avg", "exp_avg_sq")]
                if grad.dtype not in (torch.float32, torch.bfloat16) or not decoupled:
                    grad = grad.float()
                    if not decoupled and wd != 0.0:
                        grad = grad.add(target, alpha=wd)
                lists = calls[(target.device, step, grad.dtype)]
                for lst, t in zip(lists, (target, grad.contiguous(), *moments)):
                    lst.append(t.to_local() if isinstance(t, DTensor) else t)  # the elementwise kernel: the shard
            for (_, step, _), (targets, grads, exp_avgs, exp_avg_sqs) in calls.items():
                adam_step(targets, grads, exp_avgs, exp_avg_sqs, lr=group["lr"], betas=(beta1, beta2),
                          eps=group["eps"], weight_decay=wd if decoupled else 0.0, step=step)
                self.num_kernel_calls += 1
                self.num_tensor_updates += len(targets)
                KERNEL_CALLS += 1
            for dest, tmp in write_back:
                dest.copy_(tmp)
            if self.master_weights:
                for p in group["params"]:
                    if self._grad(p) is not None:
                        p.copy_(self.state[p]["master_param"])
        return loss

    @staticmethod
    def _fp32(t, write_back):
        if t.dtype == torch.float32 and t.is_contiguous():
            return t
        tmp = t.float().contiguous()
        write_back.append((t, tmp))
        return tmp
