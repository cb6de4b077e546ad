"""The ``scaled_mm`` executor's probe and resolution (fp8/probe.py, fp8/spec.choose_executor) with the device faked.

- arch rules: CUDA needs capability >= 8.9, block scales sm90 + cuBLAS >= 12.9 + torch.nn.functional.scaled_mm;
  MUSA needs arch >= 310 (S5000), no block scales; the CPU runs tensor-wise only;
- dtype rules: the tensor-wise probe and GEMM ask fp32 output with scalar scales, over the operand pairs the
  linear uses (E4M3 x E4M3 forward, E5M2 x E4M3 dgrad/wgrad); no row-wise scales are asked for;
- a refusal at probe time becomes the reason, not a crash;
- device order: the rank's device is set before the probe, which runs on the backend's *current* device;
- the block-scaled GEMM lays its scales out as torch's cuBLAS path wants them, checked by a CPU stand-in of
  ``F.scaled_mm`` that applies the scales from that layout and must reproduce the emulated GEMM;
- resolution on the real CPU: tensor recipes run ``scaled_mm``; blockwise/mxfp8 run ``emulated`` and the start-up
  line says why; a faked MUSA arch 220 refuses an explicit ``--fp8-executor scaled_mm`` in one line.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from mtmegatron.fp8 import executors, probe, spec
from mtmegatron.fp8.executors import QTensor, gemm_emulated, gemm_scaled_mm, gemm_scaled_mm_blockwise
from mtmegatron.backends.base import Backend, DeviceFacts, has_block_scaled_mm
from mtmegatron.fp8.probe import rules
from mtmegatron.fp8.quantize import fp8_quantize_blockwise
from mtmegatron.fp8.section import Fp8


def cuda(cap, cuda_version=(12, 9), block_api=True):
    return DeviceFacts("cuda", 1, cap, cuda_version, block_api)


@pytest.mark.parametrize("facts,tensorwise,blockwise", [
    (DeviceFacts("cpu"), None, "CPU _scaled_mm takes no 1x128/128x128 block scales"),
    (cuda((8, 0)), "compute capability (8, 0) < 8.9", "compute capability (8, 0) < 8.9"),
    (cuda((8, 9)), None, "runs on sm90 only (this is sm89)"),
    (cuda((9, 0), (12, 8)), None, "block scales need cuBLAS >= 12.9 (torch built with CUDA (12, 8))"),
    (cuda((9, 0), (12, 9), block_api=False), None, "block scales need torch.nn.functional.scaled_mm"),
    (cuda((9, 0), (13, 0)), None, None),
    (cuda((10, 0)), None, "runs on sm90 only (this is sm100)"),
    (DeviceFacts("musa", 0, (2, 2)), "MUSA arch 220 < 310", "MUSA arch 220 < 310"),
    (DeviceFacts("musa", 0, (3, 1)), None, "tensor- and row-wise scales only"),
    (DeviceFacts("musa", 0, None), "MUSA arch is unknown", "MUSA arch is unknown"),
], ids=["cpu", "sm80", "sm89", "sm90-cu128", "sm90-no-v2-api", "sm90-cu130", "sm100", "musa220", "musa310",
        "musa-unknown"])
def test_arch_rules(facts, tensorwise, blockwise):
    allowed = rules(facts)
    for got, want in ((allowed.tensorwise_missing, tensorwise), (allowed.blockwise_missing, blockwise)):
        assert (got is None) == (want is None), got
        if want:
            assert want in got


def test_probe_asks_fp32_tensorwise_on_the_given_device_and_keeps_refusals(monkeypatch):
    calls = []

    def fake_scaled_mm(a, b, scale_a, scale_b, out_dtype):
        calls.append((a.dtype, b.dtype, scale_a.shape, scale_b.shape, out_dtype, a.device))
        return torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    support = probe.probe(DeviceFacts("cpu"))
    assert support.tensorwise_missing is None
    assert calls == [(torch.float8_e4m3fn, torch.float8_e4m3fn, (), (), torch.float32, torch.device("cpu")),
                     (torch.float8_e5m2, torch.float8_e4m3fn, (), (), torch.float32, torch.device("cpu"))]

    def refusing(*args, **kwargs):
        raise RuntimeError("Only bf16 high precision output types are supported for row-wise scaling.\nmore")

    monkeypatch.setattr(torch, "_scaled_mm", refusing)
    support = probe.probe(DeviceFacts("cpu"))
    assert support.tensorwise_missing == ("torch._scaled_mm refused a tensor-wise probe on cpu: Only bf16 high "
                                          "precision output types are supported for row-wise scaling.")


def test_probe_tries_block_scales_only_where_the_rules_allow(monkeypatch):
    tried = []
    monkeypatch.setattr(probe, "try_tensorwise", lambda device: tried.append(("tensor", device)))
    monkeypatch.setattr(probe, "try_blockwise", lambda device: tried.append(("block", device)))
    probe.probe(cuda((9, 0), (12, 8)))
    assert tried == [("tensor", torch.device("cuda", 1))]
    tried.clear()
    support = probe.probe(cuda((9, 0), (12, 9)))
    assert tried == [("tensor", torch.device("cuda", 1)), ("block", torch.device("cuda", 1))]
    assert support.blockwise_missing is None


class FakeModule:
    def __init__(self, log):
        self.log, self.index = log, 0

    def set_device(self, index):
        self.log.append(("set_device", index))
        self.index = index

    def current_device(self):
        return self.index

    def get_device_capability(self, index):
        return (9, 0)


class FakeBackend:
    name, device_type, fp8_executors, device_is_host = "cuda", "cuda", ("scaled_mm", "emulated"), False
    facts = Backend.facts

    def __init__(self):
        self.log = []
        self.module = FakeModule(self.log)

    def device_module(self):
        return self.module

    def set_device(self, local_rank):
        self.module.set_device(local_rank)


def fp8_args(recipe="tensorwise", executor="auto"):
    return Fp8(fp8="hybrid", fp8_recipe=recipe, fp8_executor=executor, fp8_margin=0, fp8_amax_history_len=1,
               fp8_amax_compute_algo="most_recent", tp_only_amax_red=False, first_last_layers_bf16=False,
               num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=1)


def choose(fp8, local_rank):
    """pretrain.prepare's choice; the layers are not TransformerEngine's (what parse decides without TE)."""
    return spec.choose_executor(fp8, False, local_rank=local_rank)


def test_device_is_set_before_the_probe_which_runs_on_the_current_device(monkeypatch):
    backend = FakeBackend()
    monkeypatch.setattr("mtmegatron.backends.active._active", backend)

    def fake_probe(facts):
        backend.log.append(("probe", str(facts.device), facts.capability))
        return probe.ScaledMMSupport(None, None)

    monkeypatch.setattr(probe, "scaled_mm_support", fake_probe)
    assert choose(fp8_args(), local_rank=3)[0] == "scaled_mm"
    assert backend.log == [("set_device", 3), ("probe", "cuda:3", (9, 0))]


def _block_scaled_reference(mat_a, mat_b, scale_a, recipe_a, scale_b, recipe_b, output_dtype):
    """CPU stand-in of F.scaled_mm's block-scaled path: reads the scales from torch's cuBLAS layouts."""
    ScalingType = torch.nn.functional.ScalingType
    m, k = mat_a.shape
    n = mat_b.shape[1]
    kb = -(-k // 128)
    assert recipe_a == ScalingType.BlockWise1x128
    assert scale_a.shape == (m, kb) and scale_a.stride() == (1, m)
    a = mat_a.float() * scale_a.repeat_interleave(128, 1)[:, :k]
    if recipe_b == ScalingType.BlockWise128x128:
        padded = -(-kb // 4) * 4
        assert scale_b.shape == (padded, -(-n // 128)) and scale_b.stride() == (1, padded)
        grid = scale_b[:kb]  # [K/128, N/128]
        b = mat_b.float() * grid.repeat_interleave(128, 0).repeat_interleave(128, 1)[:k, :n]
    else:
        assert recipe_b == ScalingType.BlockWise1x128
        assert scale_b.shape == (n, kb) and scale_b.stride() == (1, n)
        b = mat_b.float() * scale_b.t().repeat_interleave(128, 0)[:k]
    return (a @ b).to(output_dtype)


@pytest.mark.parametrize("weight_block", [(128, 128), (1, 128)])
def test_block_scaled_gemm_layout_reproduces_the_emulated_gemm(monkeypatch, weight_block):
    if not has_block_scaled_mm():
        pytest.fail("this torch has no torch.nn.functional.scaled_mm: the CI torch (2.13) has it")
    monkeypatch.setattr(torch.nn.functional, "scaled_mm", _block_scaled_reference)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(32, 384, generator=g), torch.randn(256, 384, generator=g)
    a = QTensor(*fp8_quantize_blockwise(x, 1, 128, torch.float8_e4m3fn), (1, 128))
    b = QTensor(*fp8_quantize_blockwise(w, *weight_block, torch.float8_e4m3fn), weight_block)
    assert executors.block_scaled_shape_fits(a, b)
    torch.testing.assert_close(gemm_scaled_mm_blockwise(a, b), gemm_emulated(a, b), rtol=1e-5, atol=1e-4)
    assert torch.equal(gemm_scaled_mm(a, b), gemm_emulated(a, b))  # host tensors: never the block-scaled call
    odd = QTensor(*fp8_quantize_blockwise(x[:, :200], 1, 128, torch.float8_e4m3fn), (1, 128))  # K % 128 != 0
    odd_w = QTensor(*fp8_quantize_blockwise(w[:, :200], *weight_block, torch.float8_e4m3fn), weight_block)
    assert not executors.block_scaled_shape_fits(odd, odd_w)
    grad = QTensor(*fp8_quantize_blockwise(x, 1, 128, torch.float8_e5m2), (1, 128))  # the hybrid format's E5M2
    assert not executors.block_scaled_shape_fits(grad, b)  # refused by the device's cuBLAS: runs emulated
    assert torch.equal(gemm_scaled_mm(odd, odd_w), gemm_emulated(odd, odd_w))  # falls back for that GEMM


@pytest.fixture
def cpu_backend(monkeypatch):
    from mtmegatron.backends import get_backend

    backend = get_backend("cpu")
    monkeypatch.setattr("mtmegatron.backends.active._active", backend)
    return backend


@pytest.mark.parametrize("recipe,executor,note", [
    ("tensorwise", "scaled_mm", None),
    ("delayed", "scaled_mm", None),
    ("blockwise", "emulated", "scaled_mm runs no blockwise GEMM here (torch's CPU _scaled_mm takes no "
                              "1x128/128x128 block scales): its GEMMs are emulated"),
    ("mxfp8", "emulated", "scaled_mm runs no mxfp8 GEMM here (mtmegatron passes no MX (E8M0, swizzled) scales "
                          "to torch._scaled_mm): its GEMMs are emulated"),
])
def test_cpu_resolution_per_recipe(cpu_backend, recipe, executor, note):
    fp8 = fp8_args(recipe, "auto")
    assert choose(fp8, local_rank=0) == (executor, note)
    line = spec.describe(fp8, executor, note)
    assert f"executor {executor}" in line and (note is None or f"({note})" in line)


def test_old_musa_arch_refuses_an_explicit_scaled_mm_and_auto_says_why(monkeypatch):
    backend = FakeBackend()
    backend.name = backend.device_type = "musa"
    backend.module.get_device_capability = lambda index: (2, 2)
    monkeypatch.setattr("mtmegatron.backends.active._active", backend)
    with pytest.raises(ValueError, match=r"^--fp8-executor scaled_mm: MUSA arch 220 < 310: torch_musa runs "
                                         r"_scaled_mm from the S5000 \(arch 310\) on$"):
        choose(fp8_args(executor="scaled_mm"), local_rank=1)
    executor, note = choose(fp8_args(executor="auto"), local_rank=1)
    assert executor == "emulated"
    assert note.startswith("scaled_mm does not run here: MUSA arch 220 < 310")


def test_musa_offers_scaled_mm():
    from mtmegatron.backends.musa import MUSA

    assert MUSA.fp8_executors == ("transformer_engine", "scaled_mm", "emulated")
