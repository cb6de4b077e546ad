"""No false "wrong device" warning from every Megatron-FSDP rank on the cpu backend.

Target: megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp:logger
Reason: ``MegatronFSDP.__init__`` compares the device it is given with ``torch.device(f"cuda:{current_device}")``
and, when they differ, each rank warns "[Rank r] Megatron-FSDP is using device cpu instead of the current device
cuda:0, which may cause process-to-device mapping issues or cross-device Tensor operation errors ...". On the cpu
backend the host *is* the compute device (mtmegatron passes it, and every tensor lives there), so the warning is
wrong and alarming, once per rank. A filter on that module's logger drops exactly this record when the device it
names is the host; every other record of the logger passes.
Versions: megatron-core 0.16.x. Backends: cpu only (on cuda the comparison is meaningful).
"""

from __future__ import annotations

import logging

from .base import Patch, current

TARGET = "megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp:logger"
MESSAGE = "Megatron-FSDP is using device cpu instead of the current device"


class _HostDeviceWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return MESSAGE not in record.getMessage()


def apply():
    logger = current(TARGET)
    host_filter = _HostDeviceWarning()
    logger.addFilter(host_filter)
    return lambda: logger.removeFilter(host_filter)


PATCH = Patch(
    name="megatron_fsdp_host_device_warning",
    target=TARGET,
    reason="every Megatron-FSDP rank warned it uses device cpu 'instead of' cuda:0 on the cpu backend, where the "
    "host is the device; that one record is filtered out",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
