"""Make tests/fixtures/megatron_lm_*/: real checkpoints written by Megatron-LM core_v0.16.1's own trainer.

Runs Megatron-LM's ``pretrain_gpt.py`` (from a temporary ``git archive`` of the tag; nothing of it is kept) on
the CPU through mtmegatron's host bridge, in three launches, as a Megatron-LM user would:
1. train a tiny GPT of ``--config`` (mock data, NullTokenizer) with ``--exit-interval N``: saves ``iter_000000N``;
2. relaunch with ``--load`` and train iterations N+1..N+2: Megatron-LM's own loader resumes it; the losses it
   logs are stored (full precision, and the string its log line printed) in ``expected.json``;
3. relaunch with ``--finetune --load``: its first two losses (weights only, fresh optimizer, iteration 0).
The checkpoint of launch 1 is the fixture. Configurations (CONFIGS): ``llama-fixture`` (tests/fixtures/
megatron_lm_ckpt: Llama-style, GQA, seq 32, DP2), ``gpt-defaults`` (Megatron-LM's GPT defaults: LayerNorm, GeLU,
learned positions, biases, tied embeddings; seq 64, DP2), ``moe-ep2-distopt`` (4 experts top-2, EP2 DP2: a
dense and an expert optimizer), ``dense-pp2-cosine`` (PP2, 2-iteration warm-up then cosine); each on 2 ranks
with the distributed optimizer (--dist-ckpt-optim-fully-reshardable).
``--reader DIR`` instead resumes a checkpoint written by mtmegatron
(for the fixture's model, e.g. after mtmegatron resumed the fixture and saved at iteration 4) with Megatron-LM's
own ``load_checkpoint`` and trains on to iteration 5: its losses must equal those of the fixture's run.

Work-arounds, here and not in the product (each only inside the worker processes this script starts): those of
scripts/megatron_lm_host.py (shared with benchmarks/peer_megatron_lm.py: Triton stub, ``allow_no_cuda``, no dataset
helper compilation, no jit warm-up, spawned children import this file, the checkout's megatron/core deleted), plus:
- without TransformerEngine megatron-core's distributed optimizer wraps torch's Adam, which has no state before
  its first step, and the optimizer's load template reads that state: before ``load_checkpoint`` the state is
  filled with megatron-core's own placeholders (``_init_optimizer_states_with_dummy_values``, overwritten by the
  load), as mtmegatron's loader does.

Usage: python scripts/make_megatron_lm_fixture.py [--config NAME] [--out tests/fixtures/megatron_lm_NAME]
       [--mlm-repo PATH]
May assume: a bare clone of NVIDIA/Megatron-LM with the core_v0.16.1 tag (default /work/.mirror/...), torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_lm_host import DEFAULT_REPO, TAG, extract_megatron_lm, prepare_worker, run_pretrain_gpt  # noqa: E402
SAVE_AT = 3          # N: Megatron-LM saves iteration N ...
TRAIN_ITERS = 5      # ... and, resumed, trains N+1 .. TRAIN_ITERS
FINETUNE_ITERS = 2   # --finetune from iteration N: its first iterations

# A tiny Llama-style GPT. NullTokenizer --vocab-size 127 has 128 ids (127 is the end-of-document id);
# --make-vocab-size-divisible-by 64 keeps the embedding at exactly 128 rows under TP1 and TP2 (no padding rows).
VOCAB = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "127", "--make-vocab-size-divisible-by", "64"]
NO_DROPOUT = ["--hidden-dropout", "0", "--attention-dropout", "0", "--init-method-std", "0.02"]
LLAMA = [
    "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
    "--group-query-attention", "--num-query-groups", "2", "--seq-length", "32", "--max-position-embeddings", "32",
    "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear", *NO_DROPOUT, *VOCAB,
]
COMMON = [
    "--mock-data", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", str(TRAIN_ITERS),
    "--lr", "1e-3", "--min-lr", "1e-4", "--weight-decay", "0.1", "--adam-beta2", "0.95", "--clip-grad", "1.0",
    "--seed", "1234", "--use-distributed-optimizer", "--dist-ckpt-optim-fully-reshardable",
    "--transformer-impl", "local", "--ckpt-format", "torch_dist", "--distributed-backend", "gloo",
    "--no-rope-fusion", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-masked-softmax-fusion",
    "--no-gradient-accumulation-fusion", "--no-persist-layer-norm", "--no-bias-gelu-fusion",
    "--eval-iters", "0", "--eval-interval", "1000", "--log-interval", "1", "--save-interval", "1000",
]
TRAINING = [*COMMON, "--lr-decay-style", "cosine", "--lr-warmup-iters", "1"]
WORLD_SIZE = 2       # every configuration runs on 2 CPU ranks

# --config NAME: (Megatron-LM flags, layout written into expected.json). Each is a tiny model on 2 ranks.
CONFIGS = {
    # the Llama-style fixture: TP1 x PP1 x DP2, distributed optimizer
    "llama-fixture": (LLAMA + TRAINING, "TP1 PP1 DP2, distributed optimizer (--dist-ckpt-optim-fully-reshardable)"),
    # Megatron-LM's GPT defaults: LayerNorm, GeLU, learned absolute positions, biases, tied embeddings; seq 64
    "gpt-defaults": ([
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "64",
        "--max-position-embeddings", "64", *NO_DROPOUT, *VOCAB] + TRAINING,
        "TP1 PP1 DP2, distributed optimizer (--dist-ckpt-optim-fully-reshardable)"),
    # a Mixtral-style MoE (4 experts, top-2) with expert parallelism 2 and the distributed optimizer
    "moe-ep2-distopt": ([
        "--num-layers", "2", "--hidden-size", "32", "--ffn-hidden-size", "32", "--num-attention-heads", "4",
        "--group-query-attention", "--num-query-groups", "2", "--seq-length", "32", "--max-position-embeddings",
        "32", "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
        "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--num-experts", "4", "--moe-router-topk",
        "2", "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall", *NO_DROPOUT, *VOCAB]
        + TRAINING, "TP1 PP1 DP2 EP2, distributed optimizer (--dist-ckpt-optim-fully-reshardable)"),
    # a dense model under pipeline parallelism 2 with a 2-iteration warm-up and cosine decay
    "dense-pp2-cosine": ([
        "--num-layers", "2", "--hidden-size", "32", "--ffn-hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "48", "--max-position-embeddings", "48", "--position-embedding-type", "rope",
        "--normalization", "RMSNorm", "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
        "--pipeline-model-parallel-size", "2", *NO_DROPOUT, *VOCAB]
        + COMMON + ["--lr-decay-style", "cosine", "--lr-warmup-iters", "2"],
        "TP1 PP2 DP1, distributed optimizer (--dist-ckpt-optim-fully-reshardable)"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mlm: Path, flags: list[str], record: Path, timeout: int = 900) -> str:
    """Run Megatron-LM's pretrain_gpt.py on WORLD_SIZE CPU ranks (this file as the per-rank worker)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD_SIZE}",
           f"--master_port={_free_port()}", __file__, "--worker", str(mlm), str(record), "--", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONPATH": str(mlm)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    log = record.with_suffix(".log")
    log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        kept = Path(tempfile.gettempdir()) / f"make_megatron_lm_fixture.{record.stem}.log"
        shutil.copy(log, kept)
        raise SystemExit(f"Megatron-LM's pretrain_gpt.py failed ({proc.returncode}); its whole output: {kept}\n"
                         f"{proc.stderr[-3000:]}")
    return proc.stdout


def worker(mlm: str, record: str, flags: list[str]) -> None:
    """One rank of Megatron-LM's trainer, on the CPU bridge, with the start-up work-arounds."""
    training = prepare_worker(mlm, "cpu", __file__)
    real_log = training.training_log
    losses = {}

    def training_log(loss_dict, total_loss_dict, learning_rate, iteration, *rest, **kw):
        if "lm loss" in loss_dict:  # the last pipeline stage holds it
            losses[iteration] = {"lm_loss": float(loss_dict["lm loss"]), "lr": learning_rate}
        return real_log(loss_dict, total_loss_dict, learning_rate, iteration, *rest, **kw)

    training.training_log = training_log
    real_load = training.load_checkpoint

    def load_checkpoint(model, optimizer, *args, **kwargs):
        for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
            if hasattr(inner, "_init_optimizer_states_with_dummy_values") and not inner.optimizer.state:
                inner._init_optimizer_states_with_dummy_values()
        return real_load(model, optimizer, *args, **kwargs)

    training.load_checkpoint = load_checkpoint
    try:
        run_pretrain_gpt(mlm, flags)
    finally:
        if losses:
            Path(record).write_text(json.dumps(losses))


def generate(out: Path, repo: str, config: str = "llama-fixture") -> None:
    flags, layout = CONFIGS[config]
    with tempfile.TemporaryDirectory(prefix="mlm-") as tmp:
        tmp = Path(tmp)
        (tmp / "mlm").mkdir()
        mlm = extract_megatron_lm(repo, tmp / "mlm")
        ckpt = tmp / "ckpt"
        print(f"[1/3] Megatron-LM {TAG} ({config}): train {SAVE_AT} iterations, save {ckpt}", flush=True)
        launch(mlm, flags + ["--exit-interval", str(SAVE_AT), "--save", str(ckpt)], tmp / "first.json")
        print(f"[2/3] Megatron-LM {TAG}: --load and train iterations {SAVE_AT + 1}..{TRAIN_ITERS}", flush=True)
        second = launch(mlm, flags + ["--load", str(ckpt)], tmp / "second.json")
        print(f"[3/3] Megatron-LM {TAG}: --finetune --load, train iterations 1..{FINETUNE_ITERS}", flush=True)
        launch(mlm, flags + ["--load", str(ckpt), "--finetune", "--exit-interval", str(FINETUNE_ITERS)],
               tmp / "finetune.json")
        before = json.loads((tmp / "first.json").read_text())
        after = json.loads((tmp / "second.json").read_text())
        finetuned = json.loads((tmp / "finetune.json").read_text())
        if sorted(map(int, after)) != list(range(SAVE_AT + 1, TRAIN_ITERS + 1)):
            raise SystemExit(f"the resumed run logged iterations {sorted(after)}, expected {SAVE_AT + 1}.."
                             f"{TRAIN_ITERS}:\n{second[-3000:]}")
        logged = [line.strip() for line in second.splitlines() if "lm loss:" in line]
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(ckpt, out)
        expected = {
            "megatron_lm": TAG, "config": config, "world_size": WORLD_SIZE, "layout": layout,
            "saved_iteration": SAVE_AT, "flags": flags,
            "losses_before_save": {int(k): v for k, v in before.items()},
            "losses_after_resume": {int(k): v for k, v in after.items()},
            "losses_finetune": {int(k): v for k, v in finetuned.items()},
            "logged_after_resume": logged,
            "note": "losses_* are loss_dict['lm loss'] of each iteration as training_log received it (full "
                    "precision); the printed 'lm loss' of the second logged iteration of a launch is the mean "
                    "of the first two (Megatron-LM does not reset its loss accumulator after its first log line); "
                    "losses_finetune: --finetune --load of the checkpoint (iteration 0, fresh optimizer)",
        }
        (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        print(f"wrote {out} ({size / 1e6:.2f} MB); losses after resume: "
              f"{ {k: v['lm_loss'] for k, v in after.items()} }; fine-tune: "
              f"{ {k: v['lm_loss'] for k, v in finetuned.items()} }")


def read_back(checkpoint: Path, repo: str, fixture: Path, step: int) -> dict:
    """Megatron-LM's own ``load_checkpoint`` on a checkpoint mtmegatron wrote (for the fixture's model): resume
    it with pretrain_gpt.py and train to TRAIN_ITERS; returns {iteration: loss} and compares each with the loss
    Megatron-LM logged at that iteration in the fixture's run."""
    expected = json.loads((fixture / "expected.json").read_text())
    logged = {**expected["losses_before_save"], **expected["losses_after_resume"]}
    with tempfile.TemporaryDirectory(prefix="mlm-") as tmp:
        tmp = Path(tmp)
        (tmp / "mlm").mkdir()
        mlm = extract_megatron_lm(repo, tmp / "mlm")
        print(f"Megatron-LM {TAG}: --load {checkpoint} --ckpt-step {step} and train to iteration {TRAIN_ITERS}",
              flush=True)
        flags = CONFIGS[expected.get("config", "llama-fixture")][0]
        output = launch(mlm, flags + ["--load", str(checkpoint), "--ckpt-step", str(step)], tmp / "reader.json")
        losses = {int(k): v["lm_loss"] for k, v in json.loads((tmp / "reader.json").read_text()).items()}
    loaded = [line.strip() for line in output.splitlines() if "successfully loaded checkpoint" in line]
    print("\n".join(loaded))
    for iteration, loss in sorted(losses.items()):
        reference = logged[str(iteration)]["lm_loss"]
        print(f"iteration {iteration}: Megatron-LM resumed from mtmegatron's checkpoint {loss:.9f} | Megatron-LM's "
              f"own run {reference:.9f} | difference {abs(loss - reference):.2e}")
    return losses


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        split = sys.argv.index("--")
        worker(sys.argv[2], sys.argv[3], sys.argv[split + 1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="default tests/fixtures/megatron_lm_ckpt (llama-fixture), "
                                                    "tests/fixtures/megatron_lm_<config> (the others)")
    parser.add_argument("--mlm-repo", default=DEFAULT_REPO, help=f"a git clone of Megatron-LM with tag {TAG}")
    parser.add_argument("--reader", default=None, metavar="CKPT",
                        help="instead: resume CKPT (written by mtmegatron for the fixture's model) with Megatron-LM's "
                             "own loader and compare its losses with the fixture's (--out names the fixture)")
    parser.add_argument("--config", default="llama-fixture", choices=sorted(CONFIGS),
                        help="the model and layout Megatron-LM trains (see CONFIGS)")
    parser.add_argument("--reader-step", type=int, default=SAVE_AT + 1, help="the iteration of CKPT to resume")
    args = parser.parse_args()
    if args.out is None:
        name = "ckpt" if args.config == "llama-fixture" else args.config.replace("-", "_")
        args.out = str(Path(__file__).resolve().parents[1] / "tests" / "fixtures" / f"megatron_lm_{name}")
    if args.reader:
        read_back(Path(args.reader), args.mlm_repo, Path(args.out), args.reader_step)
    else:
        generate(Path(args.out), args.mlm_repo, args.config)


if __name__ == "__main__":
    main()
