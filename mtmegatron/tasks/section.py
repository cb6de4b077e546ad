"""The tasks' typed sections (issue 36), by flag dest:
- ``RunKind``: the values that decide the kind of run (tasks/registry.py's ``task_name``): the family, ``--sft``,
  ``--mock-data`` and the data paths (a packed-vision family trains on conversations only when its data is
  JSONL/JSON files: tasks/qwen_vl/data.py's ``reads_vision_data``). Built once at parse time
  (config/run_config.py: ``RunKind.of(args)``) and by the vision checks; the text task reads ``mock_data``.
- ``VisionReading``: what the vision tasks' reader reads beside the batch sizes (tasks/llava/data.py).
- ``VisionOutputs``: what the vision tasks' end-of-run outputs read beside the ``Schedule`` (tasks/llava/finish.py,
  tasks/qwen_vl/answer_eval.py).
A Task builds its sections once (``Task.of``, tasks/base.py).
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


@dataclass(frozen=True)
class VisionReading(Section):
    seed: int                               # the training order's permutation per epoch
    balance_micro_batches: bool             # micro-batches balanced by load instead of contiguous slices


@dataclass(frozen=True)
class VisionOutputs(Section):
    log_dir: str                            # image_eval.json, answer_eval.json, samples.txt
    num_samples: int                        # held-out answers decoded (0: none)
    sample_tokens: int                      # new tokens per answer
    decoder_seq_length: int | None          # LLaVA's combined sequence: a longer prompt stops decoding
    sequence_parallel: bool                 # the decoded sequence padded to a multiple of TP
    context_parallel_size: int              # the answer accuracy is not scored under CP
