"""torch.musa.amp stand-in: autocast on the musa device type, GradScaler, custom_fwd/custom_bwd."""

from __future__ import annotations

import functools

import torch


class autocast(torch.amp.autocast):
    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("musa", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    def __init__(self, *args, **kwargs):
        super().__init__("musa", *args, **kwargs)


custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="musa")
custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="musa")
