"""Moore Threads' MT-MegatronLM launch scripts train here unchanged (on the cpu backend, with mock data).

The flag lists below are the facts of MooreThreads/MT-MegatronLM at commit
e53585ccb7a4476c688f70f0da432dc03f175795: ``examples/llama3/8B/run_pretrain_llama3_musa.sh`` and
``examples/mixtral/8x7b/run_pretrain_mixtral_musa.sh``, with the values their launchers
(``examples/llama3/dist_run_pretrain_megatron_llama3_musa.sh``: TP 1, PP 2, micro-batch 1, 128 micro-batches;
``examples/mixtral/dist_run_pretrain_megatron_mixtral_musa.sh``: TP 2, PP 1, EP 4, micro-batch 1) pass in.
Only sizes are shrunk (layers, hidden, heads, ffn, sequence, vocabulary, samples, batch, experts, and the
parallel sizes to 2 ranks); every other flag (recompute, fusions, optimizer, precision, flash attention, loss
scale, distributed optimizer, sequence parallelism, the nccl backend name, local transformer implementation,
save/load directory, ...) is passed exactly. The scripts' ``--data-path`` with a HuggingFace/SentencePiece
tokenizer becomes ``--mock-data`` with a NullTokenizer (no corpus or tokenizer files here); ``--split 1`` stays.
Each runs 3 iterations on 2 ranks (a warm-up of 2 of them, the scripts' 2000 steps shrunk) and must exit 0 with
finite losses and the scripts' final checkpoint.
"""

from __future__ import annotations

import math

import pytest

from helpers.pretrain_runner import run_pretrain

GBS, ITERS = 4, 3
WARMUP_STEPS = 2  # the scripts' 2000, shrunk with the run: megatron-core's scheduler needs warm-up < decay
MOCK_DATA = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "255", "--split", "1"]


def llama3_8b(save: str) -> list[str]:
    model = ["--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
             "--group-query-attention", "--num-query-groups", "2", "--seq-length", "64",
             "--max-position-embeddings", "64", "--norm-epsilon", "1e-5", "--attention-dropout", "0.0",
             "--hidden-dropout", "0.0", "--disable-bias-linear", "--position-embedding-type", "rope",
             "--no-position-embedding", "--swiglu", "--normalization", "RMSNorm",
             "--untie-embeddings-and-output-weights"]
    training = ["--seed", "42", "--micro-batch-size", "1", "--global-batch-size", str(GBS),
                "--train-samples", str(ITERS * GBS), "--init-method-std", "0.008", "--use-mcore-models",
                "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion", "--use-distributed-optimizer",
                "--use-flash-attn", "--sequence-parallel", "--recompute-granularity", "full",
                "--recompute-method", "block", "--recompute-num-layers", "0", "--distributed-backend", "nccl",
                "--transformer-impl", "local"]
    regularization = ["--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--clip-grad", "1.0"]
    learning_rate = ["--lr", "1.5e-5", "--lr-decay-style", "cosine", "--lr-warmup-samples", str(WARMUP_STEPS * GBS),
                     "--min-lr", "1.5e-6", "--initial-loss-scale", "65536", "--min-loss-scale", "1.0"]
    parallel = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
                "--decoder-last-pipeline-num-layers", "2"]  # 14 of 32 in the script
    precision = ["--bf16", "--attention-softmax-in-fp32", "--no-masked-softmax-fusion",
                 "--accumulate-allreduce-grads-in-fp32"]
    logging = ["--log-interval", "1", "--save-interval", "200000", "--eval-interval", "1000", "--save", save,
               "--load", save, "--eval-iters", "0", "--tensorboard-dir", save + "/tboard"]
    return model + training + regularization + learning_rate + parallel + precision + MOCK_DATA + logging


def mixtral_8x7b(save: str) -> list[str]:
    model = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--group-query-attention",
             "--num-query-groups", "2", "--seq-length", "64", "--max-position-embeddings", "64",
             "--norm-epsilon", "1e-5", "--init-method-std", "0.01", "--attention-dropout", "0.0",
             "--hidden-dropout", "0.0", "--disable-bias-linear", "--ffn-hidden-size", "128",
             "--position-embedding-type", "rope", "--no-position-embedding", "--swiglu", "--normalization",
             "RMSNorm", "--untie-embeddings-and-output-weights"]
    training = ["--seed", "42", "--micro-batch-size", "1", "--global-batch-size", str(GBS),
                "--train-samples", str(ITERS * GBS), "--init-method-std", "0.0165", "--use-mcore-models",
                "--no-gradient-accumulation-fusion", "--use-distributed-optimizer", "--use-flash-attn",
                "--sequence-parallel", "--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", "0", "--distributed-backend", "nccl", "--transformer-impl", "local"]
    regularization = ["--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--clip-grad", "1.0"]
    learning_rate = ["--lr", "1.5e-5", "--lr-decay-style", "cosine", "--lr-warmup-samples", str(WARMUP_STEPS * GBS),
                     "--min-lr", "1.5e-6", "--initial-loss-scale", "65536", "--min-loss-scale", "1.0"]
    parallel = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1"]
    precision = ["--bf16", "--attention-softmax-in-fp32", "--no-masked-softmax-fusion",
                 "--accumulate-allreduce-grads-in-fp32"]
    logging = ["--log-interval", "1", "--save-interval", "100000", "--eval-interval", "1", "--save", save,
               "--load", save, "--eval-iters", "0", "--tensorboard-dir", save + "/tboard"]
    moe = ["--num-experts", "4", "--expert-model-parallel-size", "1",  # EP 4 x TP 2 of 8 devices: TP 2 x EP 1 of 2
           "--moe-token-dispatcher-type", "alltoall", "--moe-router-load-balancing-type", "aux_loss",
           "--moe-router-topk", "2", "--moe-aux-loss-coeff", "1e-2"]
    return model + training + regularization + learning_rate + parallel + precision + MOCK_DATA + moe + logging


# what the cpu backend says at start-up about the scripts' device-dependent flags (--use-flash-attn, layouts,
# --sequence-parallel at TP 1, which Megatron-LM turns off too; --distributed-backend nccl becomes gloo on cpu)
STARTUP = {
    "llama3_8b": ["world 2 = TP 1 x PP 2 x DP 1", "--sequence-parallel has no effect at TP 1",
                  "attention SDPADotProductAttention (--attention-backend flash)"],
    "mixtral_8x7b": ["world 2 = TP 2 x PP 1 x DP 1", "backend cpu (gloo)",
                     "attention SDPADotProductAttention (--attention-backend flash)", "experts SequentialMLP"],
}


@pytest.mark.parametrize("script", [llama3_8b, mixtral_8x7b], ids=["llama3_8b_musa", "mixtral_8x7b_musa"])
def test_mt_megatronlm_script_trains(tmp_path, script):
    proc, rows = run_pretrain(2, ["--backend", "cpu"] + script(str(tmp_path / "ckpt")), tmp_path / "run", timeout=300)
    for line in STARTUP[script.__name__]:
        assert line in proc.stdout, (line, proc.stdout[-3000:])
    losses = [r["loss"] for r in rows]
    assert len(losses) == ITERS and all(math.isfinite(x) for x in losses), proc.stdout[-3000:]
    assert (tmp_path / "ckpt" / f"iter_{ITERS:07d}").is_dir()  # the script's --save directory, final save
