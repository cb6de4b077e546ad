"""Attention without TransformerEngine: SDPA core attention and context parallelism on every backend.

- core.py: ``SDPADotProductAttention``, a drop-in for megatron-core's local ``DotProductAttention``
- ring.py / all_gather.py: context-parallel attention (``--cp-comm-type p2p|all_gather``)
- blocks.py: per-block attention with log-sum-exp and its backward (the ring's kernel)
- window_sink.py: sliding windows and attention sinks (megatron-core's ``window_size``, ``softmax_type``)
- spec.py: ``core_attention_choice`` (which core attention a layer gets, and why); config/attention_flags.py: the pretrain flags and checks
- cp_batch.py: the data/loss side of CP (batch split per CP rank, loss combined over the CP group)
Submodules are imported on use: config/attention_flags.py must stay importable before megatron-core is.
"""
