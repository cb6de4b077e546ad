"""The native CPU library is built and serves every op on CPU (otherwise the other tests would only compare
the references with themselves)."""
import torch

import mtmegatron.ops as ops


def test_native_cpu_kernels_registered_for_every_op():
    assert ops.native.NATIVE_LOADED, ops.native.LOAD_ERROR
    missing = [name for name in ops.OPS if not ops.native_available("cpu", f"mtmegatron::{name}")]
    assert missing == []


def test_meta_device_uses_fake_kernels_not_native():
    assert not ops.native_available("meta")
    x = torch.empty(3, 8, device="meta")
    y, rstd = torch.ops.mtmegatron.rms_norm(x, torch.empty(8, device="meta"), 1e-5)
    assert y.shape == (3, 8) and rstd.shape == (3,)
