"""Text generation from a checkpoint on megatron-core's inference engine (KV cache), under TP and PP.

``mtmegatron generate`` (cli.py) and ``torchrun --nproc_per_node N -m mtmegatron.generate`` run command.py;
engine.py is megatron-core's static engine (also used for the end-of-run samples of pretraining),
recompute.py the cache-free greedy reference, model.py the checkpoint side, tokenizer.py prompts and chat.
May assume: nothing is imported from megatron-core until a command runs.
"""
