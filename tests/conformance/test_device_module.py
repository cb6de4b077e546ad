"""Conformance: after ``mtmegatron.activate(backend)`` the ``torch.cuda.*`` API megatron-core 0.16.1 uses
resolves and behaves, device literals land on the backend's device, streams/events keep their semantics,
and ``deactivate()`` restores everything. Runs in-process, once per available backend.
"""

from __future__ import annotations

import operator
import pathlib
import re
import time

import pytest
import torch
import torch.distributed as dist
import torch.overrides

import mtmegatron

# Names megatron-core mentions that are not device-module calls, with the reason they are exempt.
_NOT_CALLS = {
    "memory.MemPool": "appears only inside an error-message string (inference/unified_memory.py)",
    # features mtmegatron refuses, so these names are never reached (a run that wanted them exits 2 first)
    **dict.fromkeys(("CUDAGraph", "graph", "graph_pool_handle"),
                    "CUDA graphs: --enable-cuda-graph/--cuda-graph-* are refused (config/megatron_flags.py)"),
    **dict.fromkeys(("temperature", "power_draw", "utilization", "clock_rate"),
                    "only megatron-core's StragglerDetector reads them: --log-straggler is refused"),
}


def _megatron_core_dir() -> pathlib.Path:
    import megatron.core

    return pathlib.Path(megatron.core.__file__).parent


def _torch_cuda_names_in_megatron() -> set[str]:
    names = set()
    pattern = re.compile(r"torch\.cuda\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
    for path in _megatron_core_dir().rglob("*.py"):
        names.update(pattern.findall(path.read_text(encoding="utf-8", errors="replace")))
    return names


def test_every_torch_cuda_name_megatron_uses_resolves(activated):
    names = _torch_cuda_names_in_megatron()
    assert len(names) > 30, f"grep of megatron-core found too few torch.cuda names: {sorted(names)}"
    unresolved = {}
    for name in sorted(names - set(_NOT_CALLS)):
        try:
            operator.attrgetter(name)(torch.cuda)
        except Exception as e:  # noqa: BLE001 - collected and reported together
            unresolved[name] = repr(e)
    assert not unresolved, f"torch.cuda names megatron-core uses that do not resolve on {activated.name}: {unresolved}"


def test_device_queries(activated):
    count = torch.cuda.device_count()
    assert isinstance(count, int) and count >= 1
    current = torch.cuda.current_device()
    assert isinstance(current, int) and 0 <= current < count
    torch.cuda.set_device(current)
    assert torch.cuda.current_device() == current
    props = torch.cuda.get_device_properties(current)
    assert isinstance(props.total_memory, int) and props.total_memory > 2**20
    assert isinstance(props.name, str) and props.name
    major, minor = torch.cuda.get_device_capability()
    assert isinstance(major, int) and isinstance(minor, int)
    assert torch.cuda.synchronize() is None
    assert torch.cuda.empty_cache() is None


def test_nvtx_ranges(activated):
    torch.cuda.nvtx.range_push("mtmegatron-conformance")
    torch.cuda.nvtx.range_pop()
    with torch.cuda.nvtx.range("mtmegatron-conformance"):
        pass


def test_memory_statistics(activated):
    stats = torch.cuda.memory_stats()
    assert isinstance(stats, dict)
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current"):
        assert isinstance(stats[key], int) and stats[key] >= 0, key
    before = torch.cuda.memory_allocated()
    # 64 MiB: above glibc's largest mmap threshold, so on the host this is fresh, resident memory.
    big = torch.ones(16 * 2**20, device="cuda")
    grown = torch.cuda.memory_allocated() - before
    assert grown >= 0.9 * big.numel() * big.element_size(), f"memory_allocated grew by {grown} for 64 MiB"
    # A peak is never below the current value (the new allocation is the new peak).
    current, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    assert peak >= current, f"max_memory_allocated {peak} < memory_allocated {current}"
    stats = torch.cuda.memory_stats()
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"], stats
    assert torch.cuda.memory_reserved() >= 0
    del big


def test_rng_state_api(activated):
    state = torch.cuda.get_rng_state()
    assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8
    assert torch.equal(torch.cuda.random.get_rng_state(), state)
    first = torch.rand(8, device="cuda")
    torch.cuda.set_rng_state(state)
    assert torch.equal(torch.rand(8, device="cuda"), first), "set_rng_state did not rewind the device RNG"

    torch.cuda.manual_seed(1234)
    seeded = torch.rand(8, device="cuda")
    torch.cuda.manual_seed(1234)
    assert torch.equal(torch.rand(8, device="cuda"), seeded)
    torch.cuda.manual_seed(4321)
    assert not torch.equal(torch.rand(8, device="cuda"), seeded)

    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    assert isinstance(generator, torch.Generator)
    torch.cuda.manual_seed(99)
    assert torch.equal(generator.get_state(), torch.cuda.get_rng_state())
    saved = generator.get_state()
    expected = torch.rand(4, device="cuda")
    generator.set_state(saved)  # megatron's _set_cuda_rng_state path
    assert torch.equal(torch.rand(4, device="cuda"), expected)


def test_megatron_lazy_call_bindings_run(activated):
    """Modules that did ``from torch.cuda import _lazy_call`` must run the callback now: megatron's
    ``_set_cuda_rng_state`` goes through it, and a queued callback means the RNG state is never set."""
    import importlib

    torch.empty(1, device="cuda")  # initialise the device, as any training step has by then
    pattern = re.compile(r"^from torch\.cuda import .*\b_lazy_call\b", re.M)
    root = _megatron_core_dir()
    modules = sorted(
        "megatron.core." + ".".join(p.relative_to(root).with_suffix("").parts)
        for p in root.rglob("*.py")
        if pattern.search(p.read_text(encoding="utf-8", errors="replace"))
    )
    assert "megatron.core.tensor_parallel.random" in modules
    not_run = []
    for name in modules:
        module = importlib.import_module(name)
        state = torch.cuda.get_rng_state()
        expected = torch.rand(4, device="cuda")
        module._set_cuda_rng_state(state)
        if not torch.equal(torch.rand(4, device="cuda"), expected):
            not_run.append(name)
    assert not not_run, f"_set_cuda_rng_state is a silent no-op (queued _lazy_call) in: {not_run}"


def test_device_literals_land_on_backend_device(activated):
    device_type = activated.device_type
    made = {
        "torch.empty(device='cuda')": torch.empty(2, device="cuda"),
        "torch.zeros(device=torch.device('cuda'))": torch.zeros(2, device=torch.device("cuda")),
        "torch.ones(device=current_device())": torch.ones(2, device=torch.cuda.current_device()),
        "torch.tensor([0], device='cuda')": torch.tensor([0], device="cuda"),
        "torch.arange(device='cuda:0')": torch.arange(3, device=f"cuda:{torch.cuda.current_device()}"),
        "t.cuda()": torch.ones(2).cuda(),
        "t.cuda(non_blocking=True)": torch.ones(2).cuda(non_blocking=True),
        "t.to('cuda')": torch.ones(2).to("cuda"),
        "t.to('cuda', non_blocking=True)": torch.ones(2).to("cuda", non_blocking=True),
        "t.to(device='cuda')": torch.ones(2).to(device="cuda"),
        "t.to(current_device())": torch.ones(2).to(torch.cuda.current_device()),
        "empty(pin_memory=True).cuda()": torch.empty(2, pin_memory=True).cuda(),
    }
    wrong = {k: str(t.device) for k, t in made.items() if t.device.type != device_type}
    assert not wrong, f"expected tensors on '{device_type}', got {wrong}"
    # dtype-only .to() keeps the tensor where it is and changes the dtype
    half = made["t.cuda()"].to(torch.float16)
    assert half.dtype == torch.float16 and half.device.type == device_type
    assert torch.equal(made["torch.tensor([0], device='cuda')"].cpu(), torch.tensor([0]))


def test_tensor_type_strings(activated):
    t = torch.zeros(2, device="cuda")
    assert t.type() == "torch.cuda.FloatTensor"
    assert t.half().type() == "torch.cuda.HalfTensor"
    assert t.bfloat16().type() == "torch.cuda.BFloat16Tensor"
    assert t.long().type() == "torch.cuda.LongTensor"
    # the legacy type objects megatron keeps in transformer/module.py still resolve
    assert torch.cuda.FloatTensor is not None and torch.cuda.HalfTensor is not None


# ---- streams and events -----------------------------------------------------------------------------------
def test_side_stream_work_waited_on_is_correct(activated):
    x = torch.arange(256 * 256, dtype=torch.float32, device="cuda").reshape(256, 256) / 65536
    expected = (x @ x + 1).sum().item()
    main = torch.cuda.current_stream()
    assert main == torch.cuda.default_stream()
    side = torch.cuda.Stream()
    assert isinstance(side, torch.cuda.Stream)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        assert torch.cuda.current_stream() == side
        y = x @ x
        y += 1
        done = torch.cuda.Event()
        done.record(side)
    assert torch.cuda.current_stream() == main
    main.wait_event(done)
    y.record_stream(main)
    assert y.sum().item() == pytest.approx(expected, rel=1e-5)

    # record_event / wait_stream / synchronize / query, as megatron's DDP and offloading use them
    with torch.cuda.stream(side):
        z = x * 2
    event = side.record_event()
    event.synchronize()
    assert event.query()
    torch.cuda.current_stream().wait_stream(side)
    side.synchronize()
    assert torch.equal(z.cpu(), (x * 2).cpu())

    # ExternalStream wraps an existing stream handle (CUDA: cuda_stream pointer)
    external = torch.cuda.ExternalStream(getattr(side, "cuda_stream", 0))
    with torch.cuda.stream(external):
        w = x + 3
    external.synchronize()
    assert torch.equal(w.cpu(), (x + 3).cpu())

    torch.cuda.set_stream(side)
    assert torch.cuda.current_stream() == side
    torch.cuda.set_stream(torch.cuda.default_stream())
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


def test_event_timing(activated):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    assert isinstance(elapsed, float)
    assert 40.0 <= elapsed <= 1000.0, f"elapsed_time {elapsed} ms for a 50 ms sleep"

    a, b = torch.cuda.Event(), torch.cuda.Event()
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises((RuntimeError, ValueError)):  # torch 2.11's CUDA events raise ValueError
        a.elapsed_time(b)


class _AllocatesInBackward(torch.autograd.Function):
    """megatron-core's custom Functions allocate with device='cuda' in backward (e.g. its fused cross-entropy)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2 + torch.zeros(grad.shape, device="cuda")


@pytest.mark.parametrize("redispatch", [True, False], ids=["redispatch_function", "engine_entry"])
def test_custom_backward_allocates_on_the_backend_device(backend, redispatch, monkeypatch):
    """Both routes that keep the remap alive inside the autograd engine: torch.overrides.redispatch_function
    (torch 2.13) and the wrapped engine entry of older torch (2.7-2.12, which lack it: the lent H200's 2.11)."""
    from mtmegatron.bridge import device_remap

    if redispatch and device_remap._REDISPATCH is None:
        pytest.skip(f"torch {torch.__version__} has no redispatch_function; the engine_entry case covers it")
    if not redispatch:
        monkeypatch.setattr(device_remap, "_REDISPATCH", None)
    mtmegatron.activate(backend)
    try:
        for run in (lambda y: y.backward(), lambda y: torch.autograd.backward([y]),
                    lambda y: torch.autograd.grad([y], [x])):
            x = torch.ones(3, device="cuda", requires_grad=True)
            y = _AllocatesInBackward.apply(x).sum()
            grads = run(y)
            g = grads[0] if grads else x.grad
            assert g.device.type == backend.device_type and torch.equal(g.cpu(), torch.full((3,), 2.0))
    finally:
        mtmegatron.deactivate()
    assert torch.autograd._engine_run_backward is torch.autograd.graph._engine_run_backward


# ---- activation lifecycle ------------------------------------------------------------------------------------
def _mode_depth() -> int:
    return len(torch.overrides._get_current_function_mode_stack())


def test_activate_is_idempotent_and_deactivate_restores(backend):
    import megatron.core.tensor_parallel.random as mcore_random

    from mtmegatron import patches

    before = dict(
        cuda=torch.cuda, init=dist.init_process_group, new_group=dist.new_group, depth=_mode_depth(),
        lazy_call=mcore_random._lazy_call, lazy_init=mcore_random._lazy_init,
    )
    assert mtmegatron.active_backend() is None
    try:
        assert mtmegatron.activate(backend.name) == backend
        assert mtmegatron.active_backend() == backend
        state = dict(cuda=torch.cuda, new_group=dist.new_group, depth=_mode_depth(), applied=patches.applied())
        assert mtmegatron.activate(backend.name) == backend
        assert mtmegatron.activate(backend) == backend
        assert torch.cuda is state["cuda"], "second activate() replaced torch.cuda again"
        assert dist.new_group is state["new_group"], "second activate() re-wrapped new_group"
        assert getattr(dist.new_group, "__mtmegatron_wrapped__", before["new_group"]) is before["new_group"]
        assert _mode_depth() == state["depth"], "second activate() pushed another TorchFunctionMode"
        assert [p.name for p in patches.applied()] == [p.name for p in state["applied"]]
    finally:
        mtmegatron.deactivate()
    assert mtmegatron.active_backend() is None
    assert torch.cuda is before["cuda"], "deactivate() did not restore the torch.cuda module object"
    assert dist.init_process_group is before["init"] and dist.new_group is before["new_group"]
    assert _mode_depth() == before["depth"]
    assert mcore_random._lazy_call is before["lazy_call"] and mcore_random._lazy_init is before["lazy_init"]
    assert patches.applied() == []
    # on musa, torchada's translation of device="cuda" is process-wide from its import and has no undo: it stays
    if not before["cuda"].is_available() and backend.name != "musa":
        with pytest.raises((AssertionError, RuntimeError)):  # 'cuda' means CUDA again, which is absent here
            torch.empty(1, device="cuda")
    mtmegatron.deactivate()  # a second deactivate is a no-op


def test_switching_backends_uninstalls_the_previous_bridge(backend, monkeypatch):
    """activate(other) must remove the current bridge first; a fake backend with a recording bridge shows it."""
    import sys
    import types

    from mtmegatron.backends import Backend

    calls = []
    fake_bridge = types.ModuleType("_mtmegatron_fake_bridge")
    fake_bridge.install = lambda b: calls.append(("install", b.name))
    fake_bridge.uninstall = lambda: calls.append(("uninstall",))
    monkeypatch.setitem(sys.modules, fake_bridge.__name__, fake_bridge)
    fake = Backend(name="fakeacc", device_type="fakeacc", visible_devices_env=None,
                   kernel_dispatch_key="PrivateUse1", bridge_module=fake_bridge.__name__)
    real_cuda, depth = torch.cuda, _mode_depth()
    try:
        mtmegatron.activate(backend)
        mtmegatron.activate(fake)
        assert mtmegatron.active_backend() == fake
        assert torch.cuda is real_cuda, f"{backend.name} bridge still installed after switching to another backend"
        assert _mode_depth() == depth
        mtmegatron.activate(backend)
        assert calls == [("install", "fakeacc"), ("uninstall",)]
    finally:
        mtmegatron.deactivate()
    assert torch.cuda is real_cuda
