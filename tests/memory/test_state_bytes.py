"""benchmarks/state_bytes.py counts each storage once, for the first component that reaches it: a gradient that is
a view into a DDP-style buffer is the buffer's bytes, optimizer state its own, a Megatron-FSDP parameter outside
its weight buffers a gathered weight."""

from __future__ import annotations

import importlib.util
import pathlib
from types import SimpleNamespace

import torch

_PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks/state_bytes.py"
_spec = importlib.util.spec_from_file_location("state_bytes", _PATH)
state_bytes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(state_bytes)


def test_ddp_style_views_count_once_and_optimizer_state_is_its_own():
    model = torch.nn.Linear(8, 4, bias=False)  # 32 fp32 = 128 bytes
    grad_buffer = torch.zeros(64)  # 256 bytes, the weight's main_grad a view into it
    model.weight.main_grad = grad_buffer[:32].view(4, 8)
    model.buffers = [SimpleNamespace(grad_data=grad_buffer, param_data=None)]  # megatron DDP's list attribute
    optimizer = torch.optim.Adam(model.parameters())
    model.weight.grad = torch.ones(4, 8)
    optimizer.step()
    counted = state_bytes.state_bytes([model], SimpleNamespace(optimizer=optimizer))
    # the grad (128) counts as well: it is a storage of its own, held between steps
    assert counted == {"parameters": 128, "gathered": 0, "gradients": 256 + 128, "optimizer": 2 * 128 + 4}


def test_megatron_fsdp_weights_outside_its_buffers_are_gathered():
    model = torch.nn.Linear(8, 4, bias=False)
    shard = torch.zeros(16)  # this rank's model-weight shard: 64 bytes
    main = torch.zeros(16)  # the fp32 main-weight shard: optimizer state
    group = SimpleNamespace(model_weight_buffer=SimpleNamespace(data=shard), main_weight_buffer=SimpleNamespace(
        data=main), main_grad_buffer=SimpleNamespace(data=torch.zeros(16)))
    model.param_and_grad_buffer = SimpleNamespace(parameter_groups=[group])
    counted = state_bytes.state_bytes([model], SimpleNamespace(optimizer=None))
    assert counted == {"parameters": 64, "gathered": 128, "gradients": 64, "optimizer": 64}
