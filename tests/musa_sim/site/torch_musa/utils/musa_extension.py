"""torch_musa.utils.musa_extension stand-in: the simulator has no mcc, so MUSA extensions cannot be built.

Importing works (torchada imports this module); building anything raises a clear error instead of pretending.
"""

from __future__ import annotations

MUSA_HOME = None
_NO_MCC = ("no mcc in the MUSA simulator: MUSA kernels (.mu/.cu ported) cannot be compiled or run here; "
           "test them on a MUSA machine")


def _refuse(*args, **kwargs):
    raise RuntimeError(_NO_MCC)


MUSAExtension = _refuse
load = _refuse
load_inline = _refuse


class BuildExtension:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(_NO_MCC)

    @classmethod
    def with_options(cls, **options):
        return cls
