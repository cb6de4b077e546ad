"""The packed-vision task (``Family.task == "qwen_vl"``: Qwen2-VL, Qwen2.5-VL on image/video conversations):
native-resolution data (data.py, packed bins: thd.py), NativeResolutionVLM's forward step and the schedule's shape
(step.py), and at the end the held-out answer accuracy (answer_eval.py).
May assume: the family reads conversations (registry.py chose this task by ``data.reads_vision_data``); see
tasks/base.py.
"""

from __future__ import annotations

import argparse

from mtmegatron.tasks.base import Task
from mtmegatron.tasks.llava.task import vision_splits
from mtmegatron.tasks.qwen_vl.data import prepare


class QwenVLTask(Task):
    name = "qwen_vl"

    def prepare(self, args: argparse.Namespace, progress: bool):
        return prepare(args, progress=progress)

    def datasets(self, args: argparse.Namespace, rank: int, plan, num_samples: int, data) -> tuple:
        return vision_splits(args, rank, plan, data)

    def step(self, args: argparse.Namespace, data):
        from mtmegatron.tasks.qwen_vl.section import Packing
        from mtmegatron.tasks.qwen_vl.step import vision_step

        return vision_step(Packing.of(args), data.info.get("padded_rows"))

    def finish(self, model, args: argparse.Namespace, data, terminated: bool) -> None:
        """The loss plot and (not after a stop) the held-out answer accuracy."""
        from mtmegatron.tasks.qwen_vl.answer_eval import write_answer_eval
        from mtmegatron.training.finish import write_outputs

        write_outputs(model, None, args)
        if not terminated:
            write_answer_eval(model, data, args)
