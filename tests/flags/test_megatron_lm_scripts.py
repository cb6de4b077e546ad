"""Megatron-LM's own example scripts run unchanged: the flags of ``examples/llama/train_llama3_8b_h100_fp8.sh``
(mock-data branch) and ``examples/mixtral/train_mixtral_8x7b_distributed.sh`` (Megatron-LM core_v0.16.1), with
the shapes shrunk by a few overriding flags at the end, train 20 iterations on 2 CPU ranks with falling loss.
Flags the cpu backend cannot do are dropped here only after checking that they are refused with their reason.
"""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import run_pretrain
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

LLAMA3_8B_FP8 = [
    "--use-mcore-models", "--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336",
    "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8", "--kv-channels", "128",
    "--seq-length", "8192", "--max-position-embeddings", "8192", "--position-embedding-type", "rope",
    "--rotary-base", "1000000", "--rotary-percent", "1.0", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
    "--swiglu", "--init-method-std", "0.0134", "--attention-backend", "fused", "--apply-layernorm-1p",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--micro-batch-size", "1",
    "--global-batch-size", "128", "--train-samples", "1953125000", "--lr-decay-samples", "1949218748",
    "--lr-warmup-samples", "3906252", "--lr", "0.00015", "--min-lr", "0.00001", "--decoupled-lr", "5.0e-4",
    "--decoupled-min-lr", "4.5e-5", "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--bf16", "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion",
    "--calculate-per-token-loss", "--manual-gc", "--empty-unused-memory-level", "1", "--exit-duration-in-mins", "235",
    "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max",
    "--fp8-param-gather", "--tensor-model-parallel-size", "1", "--context-parallel-size", "1", "--sequence-parallel",
    "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--mock-data",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128256", "--tiktoken-pattern", "v2", "--split", "99,1,0",
    "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--num-workers", "1", "--log-interval", "1",
    "--eval-iters", "32", "--eval-interval", "100",
]
# refused on the cpu backend, with the reason checked below
LLAMA3_REFUSED = {"--fp8-param-gather": "needs TransformerEngine"}
LLAMA3_SHRINK = [
    "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
    "--num-query-groups", "2", "--kv-channels", "16", "--seq-length", "64", "--max-position-embeddings", "64",
    "--vocab-size", "512", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-samples", "160",
    "--lr-decay-samples", "160", "--lr-warmup-samples", "16", "--lr", "3e-3", "--min-lr", "3e-4",
    "--decoupled-lr", "3e-3", "--decoupled-min-lr", "3e-4", "--eval-iters", "2", "--eval-interval", "10",
    "--fp8-amax-history-len", "16",
]

MIXTRAL_8X7B = [
    "--use-mcore-models", "--disable-bias-linear", "--seq-length", "4096", "--max-position-embeddings", "32768",
    "--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336", "--num-attention-heads", "32",
    "--init-method-std", "0.01", "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--normalization",
    "RMSNorm", "--position-embedding-type", "rope", "--swiglu", "--untie-embeddings-and-output-weights",
    "--group-query-attention", "--num-query-groups", "8", "--no-masked-softmax-fusion", "--no-position-embedding",
    "--rotary-base", "1000000", "--num-experts", "8", "--moe-router-topk", "2", "--moe-router-load-balancing-type",
    "aux_loss", "--moe-aux-loss-coeff", "1e-2", "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall",
    "--overlap-param-gather", "--overlap-grad-reduce", "--split", "99990,8,2", "--micro-batch-size", "1",
    "--global-batch-size", "256", "--lr", "1e-4", "--train-iters", "500000", "--lr-decay-iters", "320000",
    "--lr-decay-style", "cosine", "--min-lr", "1.0e-5", "--weight-decay", "0.1", "--lr-warmup-iters", "500",
    "--clip-grad", "1.0", "--bf16", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "4",
    "--expert-model-parallel-size", "8", "--use-distributed-optimizer", "--sequence-parallel", "--log-interval", "1",
    "--save-interval", "10000", "--eval-interval", "1000", "--eval-iters", "10", "--no-load-optim", "--no-load-rng",
]
MIXTRAL_REFUSED = {}  # its --moe-grouped-gemm runs megatron-core's GroupedMLP (models/grouped_experts.py)
# the script reads a Llama-2 tokenizer and a real corpus; here mock data and a Null tokenizer of the same shape
MIXTRAL_SHRINK = [
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "511",
    "--seq-length", "64", "--max-position-embeddings", "64", "--num-layers", "2", "--hidden-size", "64",
    "--ffn-hidden-size", "128", "--num-attention-heads", "4", "--num-query-groups", "2", "--num-experts", "4",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "20", "--lr-decay-iters", "20",
    "--lr-warmup-iters", "2", "--lr", "3e-3", "--min-lr", "3e-4", "--pipeline-model-parallel-size", "1",
    "--expert-model-parallel-size", "2", "--eval-interval", "10", "--eval-iters", "2",
]


def _without(flags: list[str], drop: dict) -> list[str]:
    out, skip = [], False
    for i, token in enumerate(flags):
        if skip:
            skip = False
            continue
        if token in drop:
            skip = i + 1 < len(flags) and not flags[i + 1].startswith("--")
            continue
        out.append(token)
    return out


@pytest.mark.parametrize("script, refused", [(LLAMA3_8B_FP8, LLAMA3_REFUSED)], ids=["llama3_8b_fp8"])
def test_refused_flags_of_the_scripts_name_their_reason(script, refused):
    for flag, reason in refused.items():
        with pytest.raises(ConfigError) as e:
            parse_args(["--backend", "cpu"] + script + ["--num-layers", "4"], world_size=2)
        assert str(e.value).startswith(f"{flag}: ") and reason in str(e.value)
        script = _without(script, {flag: None})


@pytest.mark.parametrize("script, refused, shrink", [(LLAMA3_8B_FP8, LLAMA3_REFUSED, LLAMA3_SHRINK),
                                                     (MIXTRAL_8X7B, MIXTRAL_REFUSED, MIXTRAL_SHRINK)],
                         ids=["llama3_8b_fp8", "mixtral_8x7b"])
def test_megatron_lm_script_trains(tmp_path, script, refused, shrink):
    flags = ["--backend", "cpu"] + _without(script, refused) + shrink + ["--data-cache-path", str(tmp_path / "cache")]
    if script is MIXTRAL_8X7B:  # the script saves to and resumes from one directory (empty at the first launch)
        flags += ["--save", str(tmp_path / "ckpt"), "--load", str(tmp_path / "ckpt"), "--tensorboard-dir",
                  str(tmp_path / "ckpt" / "tensorboard")]
    proc, rows = run_pretrain(2, flags, tmp_path / "run", timeout=900)
    assert "no --model preset: every value not given is Megatron-LM's default" in proc.stdout
    if script is MIXTRAL_8X7B:
        assert "experts GroupedMLP" in proc.stdout, proc.stdout[-2000:]
    losses = [r["loss"] for r in rows]
    assert len(losses) == 20, proc.stdout[-2000:]
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - 0.2, losses
