"""``task_name(kind)``: the kind of run, decided once (config.parse puts it in the RunConfig) from the family's
``task`` and the flags; ``TASKS[name]`` is its Task class (pretrain.prepare calls its ``prepare``, then ``of``).

A family names its task (``Family.task``: "text", "llava", "qwen_vl"). ``--sft`` turns a text run into "sft". A
packed-vision family ("qwen_vl") trains on image/video conversations only when its data is conversations
(``qwen_vl/data.py``'s ``reads_vision_data``: JSONL/JSON files, not ``--mock-data``, ``--sft`` or indexed text);
otherwise its language model trains alone, as a text (or ``--sft``) run. ``--balance-micro-batches`` and
``--vision-packing`` without such data are one ``ConfigError`` at parse time (config/arguments.py CHECKS).
``kind`` is tasks/section.py's ``RunKind`` (the family, ``--sft``, ``--mock-data``, the data paths).
May assume: flags parsed and checked (config/arguments.py).
"""

from __future__ import annotations

from mtmegatron.models import families
from mtmegatron.tasks.base import Task
from mtmegatron.tasks.llava.task import LlavaTask
from mtmegatron.tasks.qwen_vl.data import reads_vision_data
from mtmegatron.tasks.qwen_vl.task import QwenVLTask
from mtmegatron.tasks.section import RunKind
from mtmegatron.tasks.sft import SFTTask
from mtmegatron.tasks.text import TextTask

TASKS: dict[str, type[Task]] = {t.name: t for t in (TextTask, SFTTask, LlavaTask, QwenVLTask)}


def task_name(kind: RunKind) -> str:
    """The kind of run (module docstring)."""
    name = families.of(kind).task
    if name == "qwen_vl" and not reads_vision_data(kind):  # mock data or indexed text: the language model alone
        name = "text"
    return "sft" if name == "text" and kind.sft else name
