"""Which FP8 GEMMs ``torch._scaled_mm`` runs on this rank's device: decided by rules from the device's facts, then
confirmed by tiny calls on that device.

The ``scaled_mm`` executor makes one call per GEMM in two forms (executors.py):
- tensor-wise scales (delayed / tensorwise recipes), fp32 output;
- 1x128 / 128x128 block scales (blockwise recipe, DeepSeek-V3's layout) through ``torch.nn.functional.scaled_mm``.
Rules, before any call:
- cpu: tensor-wise; no block scales (torch's CPU kernel takes tensor- and row-wise scales only).
- cuda: compute capability >= 8.9 for any FP8 GEMM. Block scales: sm90 only, cuBLAS >= 12.9 (torch's CUDA build
  tells the cuBLAS it ships) and ``torch.nn.functional.scaled_mm`` (torch >= 2.10).
- musa: MUSA arch >= 310 (S5000; capability (3, 1)) for any FP8 GEMM; no block scales (torch_musa takes tensor-
  and row-wise scales).
Row-wise scales are not used: their fp32 output is refused by cuBLAS before 12.9 on sm90 and everywhere else
(bf16 only), which is what used to turn the executor off on an H100; a blockwise GEMM without block scales runs
emulated instead (one fp32 GEMM on dequantized operands rather than one call per 128-wide K block).
Every mode the rules allow is then tried once on the running device (E4M3 x E4M3 and E5M2 x E4M3, the operand
pairs of forward and of dgrad/wgrad); a refusal is kept as the reason. ``device_facts`` reads the backend's
*current* device, so callers set the rank's device first (``fp8/spec.resolve_executor``).
May assume: torch >= 2.7; the backend's device module has CUDA's ``current_device`` and
``get_device_capability`` on accelerators.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MUSA_MIN_ARCH = 310
CUDA_MIN_CAPABILITY = (8, 9)
BLOCK_SCALED_MM_CAPABILITY_MAJOR = 9
BLOCK_SCALED_MM_MIN_CUBLAS = (12, 9)


@dataclass(frozen=True)
class DeviceFacts:
    """What the rules need to know about the running device."""

    device_type: str
    index: int | None = None                    # the current device (None on cpu)
    capability: tuple[int, int] | None = None   # CUDA compute capability / MUSA (major, minor)
    cuda_version: tuple[int, int] | None = None  # the CUDA (and cuBLAS) torch was built with
    has_block_scaled_mm: bool = False           # torch.nn.functional.scaled_mm with ScalingType.BlockWise1x128

    @property
    def name(self) -> str:
        return self.device_type if self.index is None else f"{self.device_type}:{self.index}"

    @property
    def device(self) -> torch.device:
        return torch.device(self.name)


@dataclass(frozen=True)
class ScaledMMSupport:
    """Why each form cannot run here (None: it runs)."""

    tensorwise_missing: str | None
    blockwise_missing: str | None


def _version(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def has_block_scaled_mm() -> bool:
    return hasattr(F, "scaled_mm") and hasattr(getattr(F, "ScalingType", None), "BlockWise1x128")


def device_facts(backend) -> DeviceFacts:
    """The facts of ``backend``'s current device (set the rank's device before calling this)."""
    if backend.device_type == "cpu":
        return DeviceFacts("cpu", has_block_scaled_mm=has_block_scaled_mm())
    module = backend.device_module()
    index = module.current_device()
    get_capability = getattr(module, "get_device_capability", None)
    capability = tuple(get_capability(index)) if get_capability is not None else None
    cuda = _version(torch.version.cuda) if backend.device_type == "cuda" else None
    return DeviceFacts(backend.device_type, index, capability, cuda, has_block_scaled_mm())


def rules(facts: DeviceFacts) -> ScaledMMSupport:
    """What the device's facts allow, before any call (see the module docstring)."""
    kind = facts.device_type
    if not hasattr(torch, "_scaled_mm"):
        return ScaledMMSupport("this torch has no _scaled_mm", "this torch has no _scaled_mm")
    if kind == "cpu":
        return ScaledMMSupport(None, "torch's CPU _scaled_mm takes no 1x128/128x128 block scales")
    if kind == "cuda":
        cap = facts.capability
        if cap is None or cap < CUDA_MIN_CAPABILITY:
            why = f"compute capability {cap} < 8.9: FP8 GEMMs need Ada, Hopper or newer"
            return ScaledMMSupport(why, why)
        if cap[0] != BLOCK_SCALED_MM_CAPABILITY_MAJOR:
            block = f"torch's 1x128/128x128 block-scaled GEMM runs on sm90 only (this is sm{cap[0]}{cap[1]})"
        elif facts.cuda_version is None or facts.cuda_version < BLOCK_SCALED_MM_MIN_CUBLAS:
            block = f"block scales need cuBLAS >= 12.9 (torch built with CUDA {facts.cuda_version})"
        elif not facts.has_block_scaled_mm:
            block = "block scales need torch.nn.functional.scaled_mm (torch >= 2.10)"
        else:
            block = None
        return ScaledMMSupport(None, block)
    if kind == "musa":
        if facts.capability is None:
            why = "the MUSA arch is unknown (torch.musa has no get_device_capability)"
            return ScaledMMSupport(why, why)
        arch = facts.capability[0] * 100 + facts.capability[1] * 10
        if arch < MUSA_MIN_ARCH:
            why = f"MUSA arch {arch} < {MUSA_MIN_ARCH}: torch_musa runs _scaled_mm from the S5000 (arch 310) on"
            return ScaledMMSupport(why, why)
        return ScaledMMSupport(None, "torch_musa's _scaled_mm takes tensor- and row-wise scales only")
    return ScaledMMSupport(None, f"no block-scaled GEMM known for {kind}")


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def try_tensorwise(device: torch.device) -> None:
    one = torch.ones((), device=device)
    b = torch.ones(32, 32, device=device).to(torch.float8_e4m3fn)
    for a_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        a = torch.ones(32, 32, device=device).to(a_dtype)
        torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)


def try_blockwise(device: torch.device) -> None:
    from .executors import QTensor, gemm_scaled_mm_blockwise

    m, n, k = 128, 128, 512
    for a_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        a = QTensor(torch.ones(m, k, device=device).to(a_dtype), torch.ones(m, k // 128, device=device), (1, 128))
        b = QTensor(torch.ones(n, k, device=device).to(torch.float8_e4m3fn),
                    torch.ones(n // 128, k // 128, device=device), (128, 128))
        gemm_scaled_mm_blockwise(a, b)


def probe(facts: DeviceFacts) -> ScaledMMSupport:
    """The rules, confirmed by one tiny call of each allowed form on the device of ``facts``."""
    allowed = rules(facts)
    found = {}
    for form, missing, attempt in (("tensor-wise", allowed.tensorwise_missing, try_tensorwise),
                                   ("block-scaled", allowed.blockwise_missing, try_blockwise)):
        if missing is None:
            try:
                attempt(facts.device)
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
                missing = f"torch._scaled_mm refused a {form} probe on {facts.name}: {_first_line(e)}"
        found[form] = missing
    return ScaledMMSupport(found["tensor-wise"], found["block-scaled"])


@functools.cache
def scaled_mm_support(facts: DeviceFacts) -> ScaledMMSupport:
    """``probe`` once per device (per process)."""
    return probe(facts)
