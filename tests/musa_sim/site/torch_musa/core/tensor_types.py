"""Legacy tensor types ``torch.musa.FloatTensor`` & co, as torch_musa provides them.

``isinstance(t, torch.musa.FloatTensor)`` is true for a float32 musa tensor; calling the type builds a musa
tensor (from data, or uninitialized from sizes) on the current device. ``Tensor.type()`` of a musa tensor is
torch's own answer for the renamed PrivateUse1 backend ('torch.musa.FloatTensor').
"""

from __future__ import annotations

import torch

_TYPES = {
    "DoubleTensor": torch.float64, "FloatTensor": torch.float32, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "LongTensor": torch.int64, "IntTensor": torch.int32,
    "ShortTensor": torch.int16, "CharTensor": torch.int8, "ByteTensor": torch.uint8, "BoolTensor": torch.bool,
}


class _LegacyType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Tensor) and obj.device.type == "musa" and obj.dtype == cls.dtype

    def __call__(cls, *args, **kwargs):
        from .device import current_device

        device = torch.device("musa", current_device())
        if len(args) == 1 and not isinstance(args[0], int):
            return torch.as_tensor(args[0], dtype=cls.dtype).to(device)
        return torch.empty(*args, dtype=cls.dtype, device=device)


def _make(name: str, dtype: torch.dtype) -> type:
    return _LegacyType(name, (), {"dtype": dtype, "is_musa": True, "__module__": "torch.musa"})


globals().update({name: _make(name, dtype) for name, dtype in _TYPES.items()})
__all__ = list(_TYPES)
