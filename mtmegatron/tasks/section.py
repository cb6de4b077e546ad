"""The values that decide the kind of run (tasks/registry.py's ``task_name``), by flag dest (issue 36's typed
sections): the family, ``--sft``, ``--mock-data`` and the data paths (a packed-vision family trains on
conversations only when its data is JSONL/JSON files: tasks/qwen_vl/data.py's ``reads_vision_data``).
Built once at parse time (config/run_config.py: ``RunKind.of(args)``) and by the vision checks.
May assume: the flags were parsed (``model`` named or None: Megatron-LM's gpt).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class RunKind(Section):
    model: str | None                       # --model: the family (None: gpt)
    sft: bool                               # --sft: a text run becomes supervised fine-tuning
    mock_data: bool
    data_path: list | str | None            # conversation files (.jsonl/.json) or indexed text
    train_data_path: list | str | None      # the same, per split
