"""The kinds of run: one ``Task`` each (base.py) — plain text pretraining (text.py), SFT (sft.py), LLaVA (llava/),
packed-vision Qwen-VL (qwen_vl/) — chosen once by ``registry.task_name(kind)`` (``config.parse``'s RunConfig.task).
A task prepares its data, builds the run's datasets, gives the training loop its ``Step`` (forward step and loss, schedule shape, micro-batch reader) and
leaves the end-of-run outputs.
May assume: the training loop (training/) below it; entry points above it choose the task.
"""
