"""Issue 21's device paths on every backend (the GPU lane runs the accelerator params: ``-m gpu``):

- the context-parallel block kernel chosen for the device (CPU flash; CUDA flash / memory-efficient; MUSA flash
  where torch_musa has it) equals the explicit math block in forward and backward, for GQA and MLA head dims;
- the FP8 ``scaled_mm`` probe agrees with its rules on the real device (a disagreement is a rules bug), and every
  form it reports as running reproduces the emulated GEMM (tensor-wise; block-scaled where the device takes it);
- GQA SDPA with a mask in fp32 (K/V repeated on CUDA) equals explicit attention.
On the cpu backend (CI) these run the CPU kernels; the CUDA/MUSA params have not run yet (no device lent).
"""

from __future__ import annotations

import pytest
import torch

from mtmegatron.attention import blocks
from mtmegatron.attention.sdpa import sdpa

CASES = {"gqa": (4, 2, 64, 64), "mla_dims": (2, 2, 96, 64)}  # hq, hk, qk dim, v dim
TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (2e-2, 3e-2)}  # (rtol, atol): bf16 differs by its rounding


def _device(backend):
    backend.set_device(0)
    return backend.device(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_block_kernel_matches_the_math_block(activated, dtype, case, monkeypatch):
    device = _device(activated)
    hq, hk, dk, dv = CASES[case]
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, h, 64, d, generator=g).to(device, dtype) for h, d in ((hq, dk), (hk, dk), (hk, dv)))
    dout = torch.randn(2, hq, 64, dv, generator=g).to(device, dtype)
    kernel = blocks.block_kernel(device.type, dtype, dk, dv)
    print(f"{device}: {dtype} {case} -> {kernel}")
    if device.type == "cuda":
        assert kernel != "math"
    out, lse = blocks.block_forward(q, k, v, True, dk ** -0.5)
    grads = blocks.block_backward(dout, q, k, v, out, lse, True, dk ** -0.5)
    monkeypatch.setattr(blocks, "USE_FUSED", False)
    want_out, want_lse = blocks.block_forward(q, k, v, True, dk ** -0.5)
    want_grads = blocks.block_backward(dout, q, k, v, want_out, want_lse, True, dk ** -0.5)
    torch.testing.assert_close(lse.float(), want_lse.float(), rtol=0, atol=1e-4)
    for got, want in zip((out, *grads), (want_out, *want_grads)):
        assert got.shape == want.shape
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


def test_scaled_mm_probe_agrees_with_its_rules_and_runs_what_it_reports(activated):
    from mtmegatron.fp8.executors import QTensor, gemm_emulated, gemm_scaled_mm, gemm_scaled_mm_blockwise
    from mtmegatron.fp8.probe import rules, scaled_mm_support
    from mtmegatron.fp8.quantize import fp8_quantize_blockwise, fp8_quantize_current

    device = _device(activated)
    facts = activated.facts()
    support = scaled_mm_support(facts)
    print(f"{facts}: {support}")
    assert support == rules(facts)
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(256, 512, generator=g).to(device), torch.randn(384, 512, generator=g).to(device)
    if support.tensorwise_missing is None:
        a = QTensor(*fp8_quantize_current(x, torch.float8_e4m3fn))
        b = QTensor(*fp8_quantize_current(w, torch.float8_e4m3fn))
        want = gemm_emulated(a, b)
        assert ((gemm_scaled_mm(a, b) - want).norm() / want.norm()).item() < 1e-4
    if support.blockwise_missing is None:
        a = QTensor(*fp8_quantize_blockwise(x, 1, 128, torch.float8_e4m3fn), (1, 128))
        for block in ((128, 128), (1, 128)):
            b = QTensor(*fp8_quantize_blockwise(w, *block, torch.float8_e4m3fn), block)
            want = gemm_emulated(a, b)
            assert ((gemm_scaled_mm_blockwise(a, b) - want).norm() / want.norm()).item() < 1e-4, block


def test_masked_gqa_sdpa_in_fp32_equals_explicit_attention(activated):
    device = _device(activated)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, h, 32, 16, generator=g).to(device) for h in (4, 2, 2))
    mask = (torch.rand(32, 32, generator=g) > 0.3).fill_diagonal_(True).to(device)
    scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) / 4.0
    want = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v.repeat_interleave(2, 1)
    torch.testing.assert_close(sdpa(q, k, v, attn_mask=mask), want, rtol=1e-5, atol=1e-5)
