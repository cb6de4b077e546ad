"""The flags of the Megatron-LM checkpoint fixtures (tests/fixtures/megatron_lm_ckpt and the per-config ones that
scripts/make_megatron_lm_fixture.py writes), as mtmegatron flags: ``TRAINING_FLAGS`` are the training flags every
fixture shares (the script's COMMON), ``FIXTURE_FLAGS`` the whole command of tests/fixtures/megatron_lm_ckpt."""

from __future__ import annotations

TRAINING_FLAGS = [
    "--backend", "cpu", "--vocab-size", "128", "--hidden-dropout", "0", "--attention-dropout", "0", "--mock-data",
    "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "5", "--lr", "1e-3", "--min-lr", "1e-4",
    "--lr-decay-style", "cosine", "--weight-decay", "0.1", "--adam-beta2", "0.95", "--clip-grad", "1.0",
    "--seed", "1234", "--transformer-impl", "local", "--use-distributed-optimizer", "--log-interval", "1",
]
FIXTURE_FLAGS = [
    "--backend", "cpu", "--model", "llama3", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2", "--seq-length", "32",
    "--max-position-embeddings", "32", "--vocab-size", "128", "--rotary-base", "10000", "--normalization", "RMSNorm",
    "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--mock-data", "--micro-batch-size", "2", "--global-batch-size", "4",
    "--train-iters", "5", "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1",
    "--weight-decay", "0.1", "--adam-beta2", "0.95", "--clip-grad", "1.0", "--seed", "1234",
    "--transformer-impl", "local", "--use-distributed-optimizer", "--log-interval", "1",
]
