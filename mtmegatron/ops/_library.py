"""The `mtmegatron` torch.library namespace and the helper every op module uses to declare an op.

An op is declared with its schema and a Python reference implementation; the reference is registered for
CompositeExplicitAutograd, so it runs on any device that has no native kernel (and is what the native kernels
are tested against). Native kernels come from `mtmegatron._C`, which registers C++ implementations for the CPU,
CUDA and PrivateUse1 (MUSA) dispatch keys; PyTorch's dispatcher then prefers them by tensor device.
May assume: torch >= 2.7 (the MUSA floor: torch_musa 2.7.1; 2.9 and 2.11 current); nothing device specific.
"""
from __future__ import annotations

from typing import Callable

import torch

NAMESPACE = "mtmegatron"
LIB = torch.library.Library(NAMESPACE, "DEF")


def define(schema: str, reference: Callable):
    """Declare `mtmegatron::<name>` from `schema`, register `reference` as the device-generic implementation
    and return the op overload packet (`torch.ops.mtmegatron.<name>`)."""
    name = schema.split("(", 1)[0].strip()
    LIB.define(schema)
    LIB.impl(name, reference, "CompositeExplicitAutograd")
    return getattr(torch.ops.mtmegatron, name)


def qualname(name: str) -> str:
    return f"{NAMESPACE}::{name}"
