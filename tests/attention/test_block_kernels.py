"""Kernel choice of the context-parallel block kernel (attention/blocks.py) and of GQA SDPA (attention/sdpa.py),
with the device faked, and the device wrappers checked on CPU.

- ``block_kernel``: which kernel a (device type, dtype, head dims) gets -- CPU flash, CUDA flash (fp16/bf16,
  head dim <= 256), CUDA memory-efficient (fp32, larger heads), MUSA flash (only where torch_musa registers the
  op), math otherwise;
- the CUDA/MUSA wrappers (padding to one head dim, K/V repeated for GQA and their gradients summed back, the
  efficient kernel's LSE rows padded to 32) run on CPU against stand-ins of the device ops that compute with the
  math path and reject what the real kernels reject (GQA heads for the efficient/MUSA kernels, head dims not a
  multiple of 8, an unpadded LSE); forward and backward must equal the math path;
- ``gqa_mode``: CUDA fp32 or masked batches repeat K/V (the efficient kernel then runs), bf16 unmasked keeps
  ``enable_gqa`` (flash), CPU and MUSA keep ``enable_gqa``; the repeat path equals ``enable_gqa`` on CPU.
"""

from __future__ import annotations

import pytest
import torch

from mtmegatron.attention import blocks
from mtmegatron.attention.sdpa import gqa_mode, sdpa

BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64


@pytest.mark.parametrize("device,dtype,dims,kernel", [
    ("cpu", FP32, (64, 64), "cpu_flash"),
    ("cpu", FP64, (64, 64), "cpu_flash"),
    ("cuda", BF16, (64, 64), "cuda_flash"),
    ("cuda", FP16, (192, 128), "cuda_flash"),   # MLA: padded to 192
    ("cuda", BF16, (320, 256), "cuda_efficient"),  # past flash's 256
    ("cuda", FP32, (64, 64), "cuda_efficient"),
    ("cuda", FP64, (64, 64), "math"),
    ("musa", BF16, (64, 64), "math"),  # torch_musa's flash op is not registered here
    ("xpu", BF16, (64, 64), "math"),
])
def test_block_kernel_choice(device, dtype, dims, kernel):
    assert blocks.block_kernel(device, dtype, *dims) == kernel


def test_block_kernel_choice_musa_with_the_op_and_switch(monkeypatch):
    class Ops:
        _scaled_dot_product_attention_flash_musa = object()

    monkeypatch.setattr(blocks, "_aten", Ops())
    assert blocks.block_kernel("musa", BF16, 64, 64) == "musa_flash"
    assert blocks.block_kernel("musa", FP32, 64, 64) == "math"
    monkeypatch.setattr(blocks, "USE_FUSED", False)
    assert blocks.block_kernel("cuda", BF16, 64, 64) == "math"


class StandIns:
    """CPU stand-ins of the device ops with the real schemas' argument order, computing with the math path."""

    @staticmethod
    def _check(q, k, v, same_heads):
        assert q.shape[-1] % 8 == 0 and q.shape[-1] == k.shape[-1] == v.shape[-1], "not padded to one head dim"
        if same_heads:
            assert k.shape[1] == q.shape[1], "this kernel takes no GQA"

    def _scaled_dot_product_flash_attention(self, q, k, v, dropout_p, is_causal, return_debug_mask, *, scale):
        self._check(q, k, v, same_heads=False)
        out, lse = blocks._math_forward(q, k, v, is_causal, scale)
        return out, lse, None, None, q.shape[2], k.shape[2], None, None, None

    def _scaled_dot_product_flash_attention_backward(self, dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k,
                                                     dropout_p, is_causal, seed, offset, *, scale):
        self._check(q, k, v, same_heads=False)
        assert cum_q is None and cum_k is None and (max_q, max_k) == (q.shape[2], k.shape[2])
        return blocks._math_backward(dout, q, k, v, out, lse, is_causal, scale)

    def _scaled_dot_product_efficient_attention(self, q, k, v, bias, compute_lse, dropout_p, is_causal, *, scale):
        self._check(q, k, v, same_heads=True)
        assert bias is None and compute_lse
        out, lse = blocks._math_forward(q, k, v, is_causal, scale)
        rows = -(-q.shape[2] // 32) * 32
        return out, torch.nn.functional.pad(lse, (0, rows - q.shape[2]), value=float("nan")), None, None

    def _scaled_dot_product_efficient_attention_backward(self, dout, q, k, v, bias, out, lse, seed, offset,
                                                         dropout_p, grad_input_mask, is_causal, *, scale):
        self._check(q, k, v, same_heads=True)
        assert lse.shape[-1] == -(-q.shape[2] // 32) * 32 and list(grad_input_mask) == [True, True, True, False]
        return (*blocks._math_backward(dout, q, k, v, out, lse[..., : q.shape[2]], is_causal, scale), None)

    def _scaled_dot_product_attention_flash_musa(self, q, k, v, *, dropout_p, is_causal, scale):
        self._check(q, k, v, same_heads=True)
        out, lse = blocks._math_forward(q, k, v, is_causal, scale)
        return out, lse, torch.empty(0)

    def _scaled_dot_product_attention_flash_musa_backward(self, dout, q, k, v, out, lse, dropout_mask, is_causal,
                                                          attn_mask, *, scale):
        self._check(q, k, v, same_heads=True)
        return (*blocks._math_backward(dout, q, k, v, out, lse, is_causal, scale), None)


@pytest.mark.parametrize("kernel", ["cuda_flash", "cuda_efficient", "musa_flash"])
@pytest.mark.parametrize("hq,hk,dk,dv,causal", [(4, 2, 12, 8, True), (4, 1, 16, 16, False), (2, 2, 8, 8, True)])
def test_device_wrappers_equal_the_math_path(monkeypatch, kernel, hq, hk, dk, dv, causal):
    monkeypatch.setattr(blocks, "_aten", StandIns())
    monkeypatch.setattr(blocks, "_kernel", lambda q, v: kernel)
    g = torch.Generator().manual_seed(3)
    sq, sk, scale = 40, 40, dk ** -0.5  # 40 rows: the efficient kernel's LSE is padded to 64
    q, k, v = (torch.randn(2, h, s, d, generator=g, dtype=FP64) for h, s, d in ((hq, sq, dk), (hk, sk, dk),
                                                                             (hk, sk, dv)))
    dout = torch.randn(2, hq, sq, dv, generator=g, dtype=FP64)
    out, lse = blocks.block_forward(q, k, v, causal, scale)
    want_out, want_lse = blocks._math_forward(q, k, v, causal, scale)
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-12)
    got = blocks.block_backward(dout, q, k, v, out, lse, causal, scale)
    want = blocks._math_backward(dout, q, k, v, want_out, want_lse, causal, scale)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("device,dtype,masked,heads,mode", [
    ("cuda", BF16, False, (8, 2), "enable_gqa"),
    ("cuda", BF16, True, (8, 2), "repeat_kv"),
    ("cuda", FP32, False, (8, 2), "repeat_kv"),
    ("cuda", FP32, False, (8, 8), "none"),
    ("cpu", FP32, True, (8, 2), "enable_gqa"),
    ("musa", FP32, False, (8, 2), "enable_gqa"),
])
def test_gqa_mode(device, dtype, masked, heads, mode):
    assert gqa_mode(device, dtype, masked, *heads, 64) == mode


def test_repeat_kv_equals_enable_gqa_on_cpu(monkeypatch):
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(1, 4, 16, 8, generator=g), torch.randn(1, 2, 16, 8, generator=g), \
        torch.randn(1, 2, 16, 8, generator=g)
    mask = torch.rand(16, 16, generator=g) > 0.3
    mask.fill_diagonal_(True)
    want = sdpa(q, k, v, attn_mask=mask)
    monkeypatch.setattr("mtmegatron.attention.sdpa.gqa_mode", lambda *a: "repeat_kv")
    torch.testing.assert_close(sdpa(q, k, v, attn_mask=mask), want, rtol=1e-6, atol=1e-6)
