"""What a MUSA device can do (arch, bf16, FP8 ``_scaled_mm``) and the process's TF32 rule on MUSA.

UNVERIFIED on MUSA hardware: written from Moore Threads' published facts (shared/REFERENCE.md), tested with the
device queries faked (tests/conformance/test_musa_device.py).
- Arch: ``torch.musa.get_device_capability`` (as its CUDA twin) -> (major, minor); the arch number is
  ``major * 100 + minor * 10`` (mp_21 -> 210: MTT S80 / S3000; mp_22 -> 220: S4000; mp_31 -> 310: S5000), the
  numbers ``TORCH_MUSA_ARCH_LIST`` names (21, 22, 31, ...).
- bf16 from arch 220 (the S80 has none); ``torch._scaled_mm`` (FP8) from arch 310, tensor-wise or row-wise scales.
- TF32: Megatron-LM 0.16 never sets it, so on CUDA fp32 GEMMs follow torch's default, full FP32
  (``torch.backends.cuda.matmul.allow_tf32`` False), and TF32 is the user's opt-in
  (``torch.set_float32_matmul_precision("high")``, ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``). torch_musa >= 2.9 has
  the same default (full FP32 unless ``torch.backends.musa.matmul.allow_tf32`` or
  ``TORCH_ALLOW_TF32_MUBLAS_OVERRIDE=1``); ``apply_tf32_rule`` sets MUSA's switch by the same rule on every
  torch_musa (2.7.1 too, where it exists), so a run means the same on CUDA and MUSA.
May assume: torch; the device queries run only where torch_musa is imported (``torch.musa``); only torch 2.7 APIs.
"""

from __future__ import annotations

import os

import torch

BF16_MIN_ARCH = 220
SCALED_MM_MIN_ARCH = 310
TF32_ENV = "TORCH_ALLOW_TF32_MUBLAS_OVERRIDE"
ARCH_NAMES = {210: "MTT S80/S3000, mp_21", 220: "MTT S4000, mp_22", 310: "MTT S5000, mp_31"}


def arch_number(capability: tuple[int, int]) -> int:
    major, minor = capability
    return major * 100 + minor * 10


def device_arch(index: int = 0, musa=None) -> int:
    """The arch number of MUSA device ``index`` (``musa``: the ``torch.musa`` module, injectable for tests)."""
    musa = musa if musa is not None else torch.musa
    return arch_number(tuple(musa.get_device_capability(index)))


def arch_label(arch: int) -> str:
    return f"{arch} ({ARCH_NAMES[arch]})" if arch in ARCH_NAMES else str(arch)


def supports_bf16(arch: int) -> bool:
    return arch >= BF16_MIN_ARCH


def supports_scaled_mm(arch: int) -> bool:
    return arch >= SCALED_MM_MIN_ARCH


def bf16_refusal(arch: int) -> str | None:
    """The one-line refusal of ``--bf16`` on a device without bf16, else None."""
    if supports_bf16(arch):
        return None
    return (f"--bf16: this MUSA device (arch {arch_label(arch)}) has no bf16 (needs arch >= {BF16_MIN_ARCH}, "
            f"e.g. S4000/S5000); train in fp32 (drop --bf16) or --fp16")


def check_precision_args(args, error, local_rank: int | None = None, musa=None) -> None:
    """Refuse a dtype the device this rank will use cannot run (before any process group starts)."""
    if not args.bf16:
        return
    index = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    reason = bf16_refusal(device_arch(index, musa))
    if reason:
        raise error(reason)


def tf32_wanted(environ=os.environ, precision: str | None = None) -> tuple[bool, str]:
    """(allow TF32 for fp32 GEMMs, why) by the CUDA rule above."""
    if environ.get(TF32_ENV, "") == "1":
        return True, f"{TF32_ENV}=1"
    precision = precision if precision is not None else torch.get_float32_matmul_precision()
    if precision != "highest":
        return True, f"torch.set_float32_matmul_precision({precision!r})"
    return False, "torch's default, as Megatron-LM on CUDA"


def _musa_matmul_backend(backends=None):
    """``torch.backends.musa.matmul`` where this torch_musa has it, else None."""
    backends = backends if backends is not None else torch.backends
    return getattr(getattr(backends, "musa", None), "matmul", None)


_previous: list = []


def apply_tf32_rule(environ=os.environ, backends=None, precision: str | None = None) -> str:
    """Set ``torch.backends.musa.matmul.allow_tf32`` by the CUDA rule; returns the state line (doctor, start-up).
    ``restore_tf32`` puts the earlier value back (the bridge's uninstall)."""
    matmul = _musa_matmul_backend(backends)
    allow, why = tf32_wanted(environ, precision)
    if matmul is None or not hasattr(matmul, "allow_tf32"):
        return (f"tf32: this torch_musa has no torch.backends.musa.matmul.allow_tf32 switch; "
                f"{'on' if allow else 'off'} wanted ({why}), {TF32_ENV}=1 is the runtime's own switch")
    if not _previous:
        _previous.append((matmul, matmul.allow_tf32))
    matmul.allow_tf32 = allow
    return tf32_state(environ, backends)


def restore_tf32() -> None:
    if _previous:
        matmul, value = _previous.pop()
        matmul.allow_tf32 = value


def tf32_state(environ=os.environ, backends=None) -> str:
    """What fp32 GEMMs on MUSA run in now: 'tf32: on (why)' or 'tf32: off (fp32 GEMMs in full FP32)'."""
    if environ.get(TF32_ENV, "") == "1":
        return f"tf32: on ({TF32_ENV}=1)"
    matmul = _musa_matmul_backend(backends)
    if matmul is not None and getattr(matmul, "allow_tf32", False):
        return "tf32: on (torch.backends.musa.matmul.allow_tf32)"
    return "tf32: off (fp32 GEMMs in full FP32; TORCH_ALLOW_TF32_MUBLAS_OVERRIDE=1 allows TF32)"


def capability_lines(index: int = 0, musa=None, environ=os.environ, backends=None) -> list[str]:
    """``mtmegatron doctor``'s MUSA lines: torch_musa version, arch, bf16, FP8 scaled_mm and the TF32 state."""
    musa = musa if musa is not None else torch.musa
    arch = device_arch(index, musa)
    version = getattr(musa, "torch_musa_version", None) or _torch_musa_version()
    fp8 = ("yes (tensor-wise or row-wise scales)" if supports_scaled_mm(arch)
           else f"no (needs arch >= {SCALED_MM_MIN_ARCH})")
    return [f"musa: torch_musa {version}, torch {torch.__version__}",
            f"musa device {index}: arch {arch_label(arch)}",
            f"  bf16: {'yes' if supports_bf16(arch) else f'no (needs arch >= {BF16_MIN_ARCH}): --bf16 is refused'}",
            f"  fp8 torch._scaled_mm: {fp8}",
            f"  {tf32_state(environ, backends)}; a training run sets it {_wanted_text(environ)}"]


def _wanted_text(environ) -> str:
    allow, why = tf32_wanted(environ)
    return f"{'on' if allow else 'off'} ({why})"


def _torch_musa_version() -> str:
    try:
        from importlib.metadata import version

        return version("torch_musa")
    except Exception:  # noqa: BLE001 - a wheel without metadata: say so rather than fail the report
        return "(version unknown)"
