"""Command lines the plan tests share: Megatron-LM's Llama-3-8B example flags and a tiny Mixtral."""

from __future__ import annotations

from helpers.pretrain_runner import TINY

# Megatron-LM's Llama-3-8B example (examples/llama: 32 layers, GQA 8 groups, untied, SwiGLU, RMSNorm, RoPE)
LLAMA3_8B = ["--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336", "--num-attention-heads",
             "32", "--group-query-attention", "--num-query-groups", "8", "--vocab-size", "128256",
             "--untie-embeddings-and-output-weights", "--swiglu", "--disable-bias-linear", "--normalization", "RMSNorm",
             "--position-embedding-type", "rope", "--seq-length", "8192", "--max-position-embeddings", "8192",
             "--micro-batch-size", "1", "--global-batch-size", "512", "--bf16", "--lr", "3e-4", "--train-iters", "10",
             "--mock-data"]
MIXTRAL = TINY + ["--model", "mixtral", "--num-experts", "4", "--moe-router-topk", "2", "--train-iters", "1",
                  "--untie-embeddings-and-output-weights"]
