"""Unit tests of the simulated MUSA device (tests/musa_sim): a broken simulator must not pass silently.

Every check runs in a subprocess on the simulated device (the stand-in torch_musa renames PrivateUse1 for
good, so it never enters the pytest process). First run builds the extension (~30-60 s on 2 cores, cached).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.musa_sim import REPO, read_stats, run_python_in_sim, sim_env
from helpers.pretrain_runner import free_port

pytestmark = pytest.mark.musa_sim


@pytest.fixture(scope="module")
def env():
    return sim_env({"MUSA_SIM_DEVICE_COUNT": "4"})


def run(code: str, env: dict) -> str:
    return run_python_in_sim("import torch\n" + code, env=env).stdout


def test_host_and_device_tensors_do_not_mix(env):
    run("""
import pytest
d = torch.ones(3, device="musa")
assert d.device.type == "musa" and d.is_musa and not torch.ones(1).is_musa
for bad in (lambda: d + torch.ones(3), lambda: torch.mm(d.view(3, 1), torch.ones(1, 3)),
            lambda: torch.cat([d, torch.ones(3)]), lambda: d.mul_(torch.ones(3)), lambda: torch.ones(3).add_(d)):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        bad()
assert (d + torch.tensor(2.0)).tolist() == [3.0] * 3     # 0-dim host scalars are allowed, as on CUDA
assert d[torch.tensor([0, 2])].device.type == "musa"      # host index tensors are allowed, as on CUDA
assert d.type() == "torch.musa.FloatTensor", d.type()
""", env)


def test_two_musa_devices_do_not_mix(env):
    run("""
import pytest
a, b = torch.ones(2, device="musa:0"), torch.ones(2, device="musa:1")
with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
    a + b
with pytest.raises(RuntimeError, match="same device"):
    torch.stack([a, b])
assert (a + b.to("musa:0")).device == torch.device("musa:0")
with pytest.raises(RuntimeError, match="invalid device ordinal"):
    torch.ones(1, device="musa:4")
""", env)


def test_values_round_trip_between_host_and_devices(env):
    run("""
host = torch.randn(5, 7)
for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.float8_e4m3fn):
    h = host.to(dtype)
    d1 = h.to("musa:1")
    assert d1.device == torch.device("musa:1") and d1.dtype == dtype
    back = d1.to("musa:0").t().contiguous().t().cpu()
    assert back.device.type == "cpu" and torch.equal(back.float(), h.float()), dtype
assert host.musa().device == torch.device("musa:0")
t = host.to("musa:2")
assert t.sum().item() == host.sum().item() and t.tolist() == host.tolist()
t.t().copy_(torch.arange(35.0).view(7, 5))                 # host -> device into a strided view
assert torch.equal(t.cpu(), torch.arange(35.0).view(7, 5).t())
""", env)


def test_device_rng_is_per_device_and_separate_from_host(env):
    run("""
import torch.nn.functional as F
torch.musa.manual_seed(11); a = torch.randn(6, device="musa")
torch.musa.manual_seed(11); b = torch.randn(6, device="musa")
torch.musa.manual_seed(12); c = torch.randn(6, device="musa")
assert torch.equal(a.cpu(), b.cpu()) and not torch.equal(a.cpu(), c.cpu())

with torch.musa.device(1):
    torch.musa.manual_seed(7)
state1 = torch.musa.get_rng_state(1)
torch.musa.manual_seed(3)                                  # device 0 only
torch.randn(100, device="musa:0")
assert torch.equal(torch.musa.get_rng_state(1), state1)    # device 1's stream untouched
r1 = torch.randn(4, device="musa:1")
with torch.musa.device(1):
    torch.musa.manual_seed(7)
assert torch.equal(torch.randn(4, device="musa:1").cpu(), r1.cpu())

host_state = torch.get_rng_state()
x = torch.ones(64, device="musa")
F.dropout(x, 0.5, training=True); torch.rand(3, device="musa"); torch.randperm(9, device="musa")
x.bernoulli_(0.5); torch.randint(0, 5, (4,), device="musa")
assert torch.equal(torch.get_rng_state(), host_state), "device random ops drew from the host generator"

dev_state = torch.musa.get_rng_state(0)
torch.randn(10); torch.rand(10)
assert torch.equal(torch.musa.get_rng_state(0), dev_state), "host random ops moved the device generator"
g = torch.Generator("musa").manual_seed(5)
assert torch.equal(torch.randn(3, device="musa", generator=g).cpu(),
                   torch.randn(3, device="musa", generator=torch.Generator("musa").manual_seed(5)).cpu())
assert torch.musa.get_rng_state(0).equal(dev_state)
""", env)


def test_byte_counters_follow_allocations_per_device(env):
    run("""
base2, base3 = torch.musa.memory_allocated(2), torch.musa.memory_allocated(3)
x = torch.empty(1024, device="musa:2")
assert torch.musa.memory_allocated(2) == base2 + 4096
y = x * 2                                                   # a result the CPU kernel produced, now device memory
assert y.device == torch.device("musa:2") and torch.musa.memory_allocated(2) == base2 + 8192
assert torch.musa.memory_allocated(3) == base3
z = torch.empty(10, device="musa:3")
assert torch.musa.memory_allocated(3) == base3 + 40
peak = torch.musa.max_memory_allocated(2)
del x, y
assert torch.musa.memory_allocated(2) == base2 and peak >= base2 + 8192
assert torch.musa.max_memory_allocated(2) == peak
torch.musa.reset_peak_memory_stats(2)
assert torch.musa.max_memory_allocated(2) == base2
assert torch.musa.memory_stats(3)["allocated_bytes.all.current"] == base3 + 40
x = torch.empty(0, device="musa:2"); x.resize_(256)
assert torch.musa.memory_allocated(2) == base2 + 1024
""", env)


def test_autograd_and_model_ops_run_on_device(env):
    run("""
import torch.nn.functional as F
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
ref = [p.detach().clone() for p in model.parameters()]
inp = torch.randn(5, 8)
loss_host = model(inp).square().mean(); loss_host.backward()
grads_host = [p.grad.clone() for p in model.parameters()]
model.zero_grad(); model.to("musa")
loss = model(inp.to("musa")).square().mean(); loss.backward()
assert loss.device.type == "musa" and abs(loss.item() - loss_host.item()) < 1e-6
for p, g in zip(model.parameters(), grads_host):
    assert p.grad.device.type == "musa" and torch.allclose(p.grad.cpu(), g, atol=1e-6)
opt = torch.optim.AdamW(model.parameters(), lr=0.1); opt.step()
assert all(s["exp_avg"].device.type == "musa" for s in opt.state.values())

q = torch.randn(2, 3, 8, 16, device="musa", requires_grad=True)
o = F.scaled_dot_product_attention(q, q, q, is_causal=True); o.sum().backward()
assert torch.allclose(o.detach().cpu(), F.scaled_dot_product_attention(*(q.detach().cpu(),) * 3, is_causal=True), atol=1e-5)
v = torch.tensor([3.0, 1.0, 2.0, float("inf")], device="musa")
assert v.topk(2).indices.tolist() == [3, 0] and v.sort().values.device.type == "musa"
assert torch.isfinite(v).tolist() == [True, True, True, False]
assert v.index_select(0, torch.tensor([1], device="musa")).item() == 1.0
assert torch.zeros(3, device="musa").scatter_add_(0, torch.tensor([0, 0, 2], device="musa"), torch.ones(3, device="musa")).tolist() == [2.0, 0.0, 1.0]
with torch.autocast("musa", dtype=torch.bfloat16):
    assert (q @ q.transpose(-1, -2)).dtype == torch.bfloat16
a8 = torch.randn(16, 32).to(torch.float8_e4m3fn); b8 = torch.randn(16, 32).to(torch.float8_e4m3fn).t()
one = torch.tensor(1.0)
host_mm = torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)
dev_mm = torch._scaled_mm(a8.musa(), b8.musa(), one.musa(), one.musa(), out_dtype=torch.bfloat16)
assert torch.equal(dev_mm.cpu(), host_mm)
""", env)


def test_convolutions_run_on_device_and_match_the_host(env):
    """aten::convolution on a PrivateUse1 tensor goes to convolution_overrideable and its backward to
    convolution_backward_overrideable (no CPU kernel the fallback could borrow): the simulator's kernels must give
    the host's values and gradients, on the input's device, for every convolution parameter and output_mask."""
    run("""
import pytest
torch.manual_seed(0)

def check(make, shape, dev, input_grad=True):
    host = make()
    x = torch.randn(*shape, requires_grad=input_grad)
    out_host = host(x)
    out_host.sin().sum().backward()
    on_dev = make()
    on_dev.load_state_dict(host.state_dict())
    on_dev.to(dev)
    xd = x.detach().to(dev).requires_grad_(input_grad)
    out = on_dev(xd)
    out.sin().sum().backward()
    assert out.device == torch.device(dev) and torch.equal(out.detach().cpu(), out_host.detach()), make
    for (name, p), q in zip(host.named_parameters(), on_dev.parameters()):
        assert q.grad.device == torch.device(dev) and torch.equal(q.grad.cpu(), p.grad), name
    if input_grad:
        assert xd.grad.device == torch.device(dev) and torch.equal(xd.grad.cpu(), x.grad)
    else:
        assert xd.grad is None   # output_mask[0] false

nn = torch.nn
# not the current device (musa:0): results follow the input's device
check(lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 9, 9), "musa:1")
check(lambda: nn.Conv2d(3, 8, (2, 3), stride=(1, 2), padding=(2, 0), dilation=(2, 1), bias=False), (2, 3, 8, 10),
      "musa:2")
check(lambda: nn.Conv2d(3, 16, 4, stride=4), (2, 3, 16, 16), "musa:1", input_grad=False)  # a ViT patch embedding
check(lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), (2, 4, 5, 5), "musa:3")
check(lambda: nn.Conv1d(4, 4, 3, padding=1), (2, 4, 7), "musa:0")
check(lambda: nn.Conv2d(2, 4, 3), (2, 5, 5), "musa:1")                                    # unbatched input

# weight frozen: only the input's gradient (output_mask [True, False, False])
conv = nn.Conv2d(2, 4, 3).to("musa:1").requires_grad_(False)
xd = torch.randn(1, 2, 6, 6, device="musa:1", requires_grad=True)
conv(xd).sum().backward()
assert xd.grad.device == torch.device("musa:1") and conv.weight.grad is None

conv2d, w = torch.nn.functional.conv2d, torch.randn(4, 2, 3, 3, device="musa:1")
x1 = torch.randn(1, 2, 6, 6, device="musa:1")
for bad in (lambda: conv2d(x1.to("musa:2"), w), lambda: conv2d(x1, w, torch.zeros(4, device="musa:0")),
            lambda: conv2d(x1, w.cpu()), lambda: conv2d(x1, w, torch.zeros(4)), lambda: conv2d(x1.cpu(), w)):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        bad()
""", env)


def test_mccl_on_two_ranks_gives_values_counts_and_refuses_host_tensors(tmp_path):
    env = sim_env({"MUSA_SIM_STATS_DIR": str(tmp_path), "MUSA_SIM_DEVICE_COUNT": "2"})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(REPO / "tests/musa_sim/mccl_worker.py")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    stats = {k: s for k, s in read_stats(tmp_path).items() if s["rank"] is not None}  # not the torchrun agent
    assert sorted(s["rank"] for s in stats.values()) == ["0", "1"], stats.keys()
    for s in stats.values():
        c = s["collectives"]
        assert c["all_reduce"] == {"calls": 3, "bytes": 16 + 8 + 4}, c   # the refused call is not counted
        assert c["all_gather_into_tensor"] == {"calls": 1, "bytes": 8}
        assert c["reduce_scatter_tensor"] == {"calls": 1, "bytes": 16}
        assert c["all_to_all_single"] == {"calls": 1, "bytes": 12}
        assert c["send"]["calls"] + c["recv"]["calls"] == 3 and c["barrier"]["calls"] == 1
        assert c["all_gather"]["calls"] >= 1                                # all_gather_object on device tensors
        assert s["refusals"] == {"all_reduce": 1}
        assert s["memory"][s["rank"]]["num_allocs"] > 0


def test_torchada_runs_on_top(env):
    run("""
import torch.distributed as dist
import torchada  # noqa: F401
assert torchada.is_musa_platform()
assert torch.cuda.is_available() is False                  # torchada keeps this False on MUSA on purpose
assert torch.cuda.current_device() == 0 and torch.cuda.device_count() == 4
assert torch.ones(2).cuda().device == torch.device("musa:0")
assert torch.zeros(2, device="cuda").device.type == "musa"
assert torch.device("cuda:1").type == "musa" and torch.ones(1).cuda().is_cuda
torch.cuda.set_device(1)
assert torch.ones(1).cuda().device == torch.device("musa:1")
assert next(torch.nn.Linear(2, 2).cuda().parameters()).device.type == "musa"
torch.cuda.manual_seed(4); a = torch.randn(3, device="cuda")
torch.cuda.manual_seed(4); assert torch.equal(a.cpu(), torch.randn(3, device="cuda").cpu())
assert torch.cuda.FloatTensor is torch.musa.FloatTensor
dist.init_process_group("nccl", store=dist.HashStore(), world_size=1, rank=0)
assert dist.get_backend() == "mccl"
t = torch.ones(3).cuda(); dist.all_reduce(t)

import torch_musa
assert torch_musa.sim.collective_counts()["all_reduce"]["calls"] == 1
assert dist.Backend.default_device_backend_map["musa"] == "mccl"
dist.destroy_process_group()
""", env)
