"""The values the packed-vision task's packing and schedule shape read, by flag dest (issue 36's typed sections):
``--vision-packing``, the row length and micro-batch size, the plan's seed and context parallelism's padding.
Built per call by the task from the run's args (``Packing.of(args)``: the Task interface still hands args) and
handed to tasks/qwen_vl/thd.py's ``binned`` and step.py's ``vision_step``.
May assume: the flags were parsed and checked (the family's flags.py, config/arguments.py CHECKS).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Packing(Section):
    vision_packing: str | None              # "thd", "padded" or None (each conversation padded to --seq-length)
    seq_length: int                         # a bin's length; the padded row's
    micro_batch_size: int                   # bins per micro-batch
    seed: int                               # the packing plan's order
    context_parallel_size: int              # conversations padded to 2 x CP under CP
