"""The packed-vision task (``Family.task == "qwen_vl"``: Qwen2-VL, Qwen2.5-VL on image/video conversations):
native-resolution data (data.py, packed bins: thd.py), NativeResolutionVLM's forward step and the schedule's shape
(step.py), and at the end the held-out answer accuracy (answer_eval.py). It reads what the LLaVA task reads
(tasks/llava/task.py's ``VisionTask``) and ``Packing`` (section.py).
May assume: the family reads conversations (registry.py chose this task by ``data.reads_vision_data``); see
tasks/base.py.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from mtmegatron.tasks.llava.task import VisionTask
from mtmegatron.tasks.qwen_vl.data import prepare
from mtmegatron.tasks.qwen_vl.section import Packing


@dataclass(frozen=True)
class QwenVLTask(VisionTask):
    packing: Packing                # the bins and the schedule's shape

    name = "qwen_vl"

    @staticmethod
    def prepare(args: argparse.Namespace, progress: bool):
        """Completes the run's flags from the conversations (tasks/qwen_vl/data.py: parse-time resolution)."""
        return prepare(args, progress=progress)

    @classmethod
    def sections(cls, values) -> dict:
        return {**super().sections(values), "packing": Packing.of(values)}

    def step(self, data):
        from mtmegatron.tasks.qwen_vl.step import vision_step

        return vision_step(self.packing, data.info.get("padded_rows"), self.reader())

    def finish(self, model, data, terminated: bool) -> None:
        """The loss plot and (not after a stop) the held-out answer accuracy."""
        from mtmegatron.tasks.qwen_vl.answer_eval import write_answer_eval
        from mtmegatron.training.finish import write_outputs

        write_outputs(model, self.outputs)  # the loss plot
        if not terminated:
            write_answer_eval(model, data, self.vision_outputs, self.schedule, self.reader())
