"""The router's expert-bias token count run eagerly on the CPU backend.

Target: megatron.core.transformer.moe.router:TopKRouter._apply_expert_bias
Reason: the method (it adds this micro-batch's routing map to ``local_tokens_per_expert``, which
finalize_model_grads turns into the aux-loss-free bias update) is decorated with ``jit_fuser``, which is
``torch.compile`` on torch >= 2.2. Under the CPU bridge the CUDA device module answers for the host, and inductor's
cache key then reads CUDA-only device properties (``gcnArchName``) and fails, so any run with
``--moe-router-enable-expert-bias`` dies on its first forward. The replacement is the undecorated method
(one in-place add: nothing to fuse).
Versions: megatron-core 0.16.x. Backends: cpu only.
"""

from .base import Patch, current, set_attr

TARGET = "megatron.core.transformer.moe.router:TopKRouter._apply_expert_bias"


def apply():
    compiled = current(TARGET)
    eager = getattr(compiled, "_torchdynamo_orig_callable", None) or getattr(compiled, "__wrapped__", compiled)
    return set_attr(TARGET, eager)


PATCH = Patch(
    name="expert_bias_without_compile",
    target=TARGET,
    reason="TopKRouter._apply_expert_bias is torch.compile'd; inductor fails under the cpu bridge "
    "(reads CUDA device properties), so the bias token count runs eagerly",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
