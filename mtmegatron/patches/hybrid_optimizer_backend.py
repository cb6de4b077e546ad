"""megatron-core's optimizer CPU offload (HybridDeviceOptimizer) on every backend, with its copies counted.

Target: megatron.core.optimizer.cpu_offloading.hybrid_optimizer:HybridDeviceOptimizer
Reason: it picks what to offload with ``param.is_cuda`` and moves state with ``.to("cuda")``/``.to("cpu")``
chosen by ``isinstance(optimizer, cpu_optimizer_cls)``: on MUSA (``is_cuda`` False) and on the CPU backend it
silently offloads nothing, and with one class for both parts (mtmegatron's FusedAdam) every state would go to
the host. The replacements ask the backend layer (``compute_device()``): a parameter is "on the device" when it
lives on the compute device's type, and the host copy is a separate host tensor, so on the CPU backend (device
memory is host memory) the offload still runs its real code: separate host copies, D2H gradient and H2D
parameter copies, its side streams (the CPU bridge's streams are synchronous; offload_stats says so). Fixed
field bugs on the way: a parameter without a gradient in a step kept its previous (stale) host/fp32 gradient and
was updated with it; loading a checkpoint with fp32 parameters raised KeyError (``_update_fp32_params_by_new_state``
assumed an fp32 copy of every parameter) and never wrote the loaded master weights into the host copies; a
weights-only load (``reload_model_params`` -> ``update_fp32_param_by_new_param``) left the host copies of fp32
parameters at their old values, so training silently went on from the previous (random-init) weights.
``dummy_step`` (run by megatron before loading) no longer moves the weights. With fp32 parameters the distributed
optimizer hands the offloaded optimizer non-leaf views of them (``ValueError: can't optimize a non-leaf
Tensor``): DistributedOptimizer._build_model_and_main_param_groups now hands over detached views of the same
memory (same attributes) when offloading. Copies are counted per optimizer in
``_mtm_counters`` (read by mtmegatron.training.observability.offload_stats), and so are those made while one of the optimizer's
own non-default streams was current (what --overlap-cpu-optimizer-d2h-h2d promises).
Versions: megatron-core 0.16.x.
"""

from collections import Counter

import torch

from .base import Patch, current, set_attr, undo_in_reverse

CLASS = "megatron.core.optimizer.cpu_offloading.hybrid_optimizer:HybridDeviceOptimizer"
METHODS = ("_get_sub_optimizer_param_groups", "_set_sub_optimizer_grads", "_register_param_copy_back_gpu_hook",
           "_move_new_state_to_right_device", "_update_fp32_params_by_new_state", "update_fp32_param_by_new_param",
           "dummy_step")


def _device_type() -> str:
    from mtmegatron.backends.device import compute_device

    return compute_device().type


def _counters(self) -> Counter:
    if "_mtm_counters" not in self.__dict__:
        self._mtm_counters = Counter()
    return self._mtm_counters


def _params(self):
    return [p for group in self.param_groups for p in group["params"]]


def _get_sub_optimizer_param_groups(self, offload_fraction):
    device_type = _device_type()
    on_device = [p for p in _params(self) if p.device.type == device_type]
    threshold = sum(p.numel() for p in on_device) * offload_fraction
    offloaded = 0
    cpu_groups, gpu_groups = [], []
    to_host, host_to_device, to_fp32 = {}, {}, {}
    for group in self.param_groups:
        gpu_group, cpu_group = {**group, "params": []}, {**group, "params": []}
        for orig in group["params"]:
            inner, host = orig, orig.device.type != device_type  # params already on the host stay there
            if not host and offloaded < threshold:
                inner = torch.empty(orig.shape, dtype=orig.dtype, device="cpu", pin_memory=self.pin_cpu_params)
                inner.copy_(orig.detach())
                offloaded += orig.numel()
                host = True
            if self.param_update_in_fp32 and inner.dtype != torch.float32:
                inner = inner.detach().clone().float()
                to_fp32[orig] = inner
            if inner is not orig and orig.device.type == device_type and host:
                to_host[orig] = inner
                host_to_device[inner] = orig
            (cpu_group if host else gpu_group)["params"].append(inner)
        if gpu_group["params"]:
            gpu_groups.append(gpu_group)
        if cpu_group["params"]:
            cpu_groups.append(cpu_group)
    return cpu_groups, gpu_groups, to_host, host_to_device, to_fp32


def _on_side_stream(self, streams, side) -> bool:
    """Whether the copies now go to ``side`` (one of the optimizer's streams) and it is not the device's default
    stream: with --overlap-cpu-optimizer-d2h-h2d megatron made separate streams, else both are the current one."""
    if not self.overlap_cpu_optimizer_d2h_h2d or streams is torch.cpu:  # cpu backend: no device streams
        return False
    current = streams.current_stream()
    return (current == side
            and current.stream_id != streams.default_stream().stream_id)


def _set_sub_optimizer_grads(self):
    counters = _counters(self)
    # megatron calls this inside its d2h stream context (the backend's stream via the bridge)
    side = _on_side_stream(self, torch.get_device_module(_device_type()), self._d2h_stream)
    if self.param_update_in_fp32:
        for orig, fp32 in self.param_to_fp32_param.items():
            if orig in self.gpu_params_map_cpu_copy:
                continue
            grad = getattr(orig, "decoupled_grad", orig.grad)
            fp32.grad = None if grad is None else grad.to(fp32.dtype)  # None: no stale gradient from a past step
    if self.gpu_optimizer is not None:
        # fp32 parameters updated on the device without a copy: the precision-aware distributed optimizer hands
        # their gradients over as .decoupled_grad, which megatron's device optimizer (built without
        # use_decoupled_grad) would never read: those parameters silently stayed at their initial values
        for inner in (p for group in self.gpu_optimizer.param_groups for p in group["params"]):
            if inner not in self.fp32_param_to_orig_param and hasattr(inner, "decoupled_grad"):
                inner.grad = inner.decoupled_grad
    for optimizer in self.cpu_optimizers:
        for inner in (p for group in optimizer.param_groups for p in group["params"]):
            grad = getattr(self.cpu_copys_map_gpu_param[inner], "decoupled_grad",
                           self.cpu_copys_map_gpu_param[inner].grad)
            inner.requires_grad = False
            if grad is None:
                inner.grad = None  # no gradient this step: the host update must skip it
                continue
            if inner not in self.cpu_copy_map_grad:
                self.cpu_copy_map_grad[inner] = torch.empty(inner.shape, dtype=inner.dtype, device="cpu",
                                                            pin_memory=self.pin_cpu_grads)
            inner.grad = self.cpu_copy_map_grad[inner]
            inner.grad.copy_(grad, non_blocking=True)
            counters["d2h_bytes"] += grad.numel() * grad.element_size()
            counters["d2h_copies"] += 1
            counters["d2h_side_stream_copies"] += side
        self._cpu_optimizer_map_data_event[optimizer] = self._d2h_stream.record_event()


def _register_param_copy_back_gpu_hook(self):
    # the backend's stream API (torch.cpu on the cpu backend: streams are synchronous there, as are the
    # bridge's streams megatron created in _init_sub_optimizers)
    streams = torch.get_device_module(_device_type())

    def copy_back(optimizer, args, kwargs):
        counters = _counters(self)
        self._h2d_stream.wait_stream(streams.current_stream())
        with streams.stream(self._h2d_stream):
            side = _on_side_stream(self, streams, self._h2d_stream)
            for inner in (p for group in optimizer.param_groups for p in group["params"]):
                orig = self.cpu_copys_map_gpu_param[inner]
                orig.data.copy_(inner.data, non_blocking=True)
                counters["h2d_bytes"] += inner.numel() * inner.element_size()
                counters["h2d_copies"] += 1
                counters["h2d_side_stream_copies"] += side
        self._h2d_stream.record_event().wait(streams.current_stream())

    def fp32_copy_back(optimizer, args, kwargs):
        for orig, fp32 in self.param_to_fp32_param.items():
            if orig not in self.gpu_params_map_cpu_copy:
                orig.data.copy_(fp32.data)

    for optimizer in self.sub_optimizers:
        if optimizer is not self.gpu_optimizer:
            optimizer.register_step_post_hook(copy_back)
        elif self.param_update_in_fp32:
            optimizer.register_step_post_hook(fp32_copy_back)


def _move_new_state_to_right_device(self):
    from mtmegatron.backends.device import compute_device

    device = compute_device()
    for optimizer in self.sub_optimizers:
        target = "cpu" if optimizer is not self.gpu_optimizer else device
        for inner, state in optimizer.state.items():
            orig = self.inner_param_to_orig_param.get(inner, inner)
            for key, value in state.items():
                if torch.is_tensor(value) and key != "master_param":
                    self.state[orig][key] = state[key] = value.to(target)


def _update_fp32_params_by_new_state(self):
    # the loaded master weights go into the tensors the sub-optimizers update (fp32 copies, host copies, or the
    # parameter itself), which stay the state's "master_param"
    if not self.param_update_in_fp32:
        return
    for orig, state in self.state.items():
        inner = self.param_to_inner_param[orig]
        master = state.get("master_param")
        if master is not None and master is not inner:
            inner.data.copy_(master)
        state["master_param"] = inner


def update_fp32_param_by_new_param(self):
    """The parameters were replaced (weights-only load): every fp32 and host copy follows them."""
    counters = _counters(self)
    for orig, inner in self.param_to_inner_param.items():
        if inner is not orig:
            inner.data.copy_(orig.data)
            if orig in self.gpu_params_map_cpu_copy:
                counters["d2h_bytes"] += orig.numel() * orig.element_size()
                counters["d2h_copies"] += 1


def make_dummy_step(original):
    def dummy_step(self):
        # megatron steps with random gradients only to create state before a load; the weights (and their
        # host/fp32 copies) must not move
        saved = [p.detach().clone() for p in _params(self)]
        original(self)
        for p, value in zip(_params(self), saved):
            p.data.copy_(value)
        update_fp32_param_by_new_param(self)

    return dummy_step


BUILD_GROUPS = "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer._build_model_and_main_param_groups"


def make_build_groups(original):
    def build(cls, gbuf_ranges, param_gbuf_map, opt_group_ranges, config):
        groups = original(cls, gbuf_ranges, param_gbuf_map, opt_group_ranges, config)
        if not config.optimizer_cpu_offload:
            return groups
        detached = {}
        for shard_group in groups[3]:  # shard_fp32_groups: views of fp32 model params, still attached
            for i, view in enumerate(shard_group):
                leaf = view.detach()
                leaf.__dict__.update(view.__dict__)  # tensor-parallel attributes, 'shared'
                detached[id(view)] = shard_group[i] = leaf
        for group_range in opt_group_ranges:
            params = group_range["orig_group"]["params"]
            group_range["orig_group"]["params"] = [detached.get(id(p), p) for p in params]
        return groups

    return classmethod(build)


def apply():
    cls = current(CLASS)
    for name in METHODS:
        current(f"{CLASS}.{name}")
    replacements = {
        "_get_sub_optimizer_param_groups": _get_sub_optimizer_param_groups,
        "_set_sub_optimizer_grads": _set_sub_optimizer_grads,
        "_register_param_copy_back_gpu_hook": _register_param_copy_back_gpu_hook,
        "_move_new_state_to_right_device": _move_new_state_to_right_device,
        "_update_fp32_params_by_new_state": _update_fp32_params_by_new_state,
        "update_fp32_param_by_new_param": update_fp32_param_by_new_param,
        "dummy_step": make_dummy_step(cls.dummy_step),
    }
    undo = [set_attr(f"{CLASS}.{name}", fn) for name, fn in replacements.items()]
    undo.append(set_attr(BUILD_GROUPS, make_build_groups(current(BUILD_GROUPS).__func__)))
    return undo_in_reverse(undo)


PATCH = Patch(
    name="hybrid_optimizer_backend",
    target=CLASS,
    reason="optimizer CPU offload picks params with is_cuda and moves state to 'cuda' (offloads nothing on "
    "musa/cpu); stale grads for params without one; fp32 load KeyError; weights-only load left host copies stale",
    versions=">=0.16,<0.17",
    apply=apply,
)
