"""The example launchers run as documented: each trains on real data given with --data-path (the loss falls),
flags override the defaults, each writes its own run directory, threads follow the backend and cores per rank,
MUSA defaults are exported and exported values win."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers.pretrain_runner import free_port
from helpers.real_data import VOCAB, use_corpus_cache

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = [
    "examples/llama3/dist_run_pretrain_megatron_llama3_musa.sh",
    "examples/llama3/dist_run_pretrain_megatron_llama3_cuda.sh",
    "examples/mixtral/dist_run_pretrain_megatron_mixtral_musa.sh",
    "examples/mixtral/dist_run_pretrain_megatron_mixtral_cuda.sh",
    "examples/deepseekv3/dist_run_pretrain_megatron_deepseekv3_musa.sh",
    "examples/gemma3/dist_run_pretrain_megatron_gemma3_musa.sh",
    "examples/gpt_oss/dist_run_pretrain_megatron_gpt_oss_musa.sh",
]
ITERS = 6


@pytest.fixture(scope="module")
def corpus():
    use_corpus_cache()
    from mtmegatron.data import embedded

    return embedded.prepare(VOCAB, progress=False)  # (indexed-dataset prefix, tokenizer dir)


@pytest.mark.parametrize("script", LAUNCHERS)
def test_example_trains_on_real_data(script, corpus, tmp_path):
    prefix, tokenizer = corpus
    env = {k: v for k, v in os.environ.items() if k not in ("LOG_DIR", "DATA_PATH", "OMP_NUM_THREADS")}
    env["MASTER_PORT"] = str(free_port())
    proc = subprocess.run(["bash", str(ROOT / script), "--backend", "cpu", "--data-path", prefix,
                           "--tokenizer-model", tokenizer, "--vocab-size", str(VOCAB), "--train-iters", str(ITERS),
                           "--eval-iters", "0", "--num-samples", "0"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"mtmegatron: data {prefix} (split " in proc.stdout  # the real corpus, not mock data
    run_dir = tmp_path / "runs" / Path(script).stem  # its own run directory
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, ITERS + 1))  # --train-iters overrode the default 30
    for row in rows:  # the metrics contract other tools rely on
        assert {"iteration", "loss", "grad_norm", "lr", "tokens_per_sec"} <= row.keys()
    assert rows[0]["lr"] < rows[-1]["lr"]  # the examples warm the learning rate up
    losses = [r["loss"] for r in rows]
    assert (losses[-2] + losses[-1]) / 2 < losses[0] - 0.04, losses  # deterministic (seeded); tiny DeepSeek ~0.05


def _prepared(args: list[str], extra_env: dict | None = None) -> dict:
    script = (f"source {ROOT / 'examples/common.sh'}; prepare_launch musa \"$@\"; "
              "echo \"threads=$OMP_NUM_THREADS\"; echo \"backend=$BACKEND_USED\"; echo \"run=$RUN_DIR\"; "
              "echo \"data=${DATA_ARGS[*]}\"")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "DATA_PATH", "LOG_DIR", "BACKEND")}
    proc = subprocess.run(["bash", "-c", script, "dist_run_x.sh", *args], capture_output=True, text=True,
                          env={**env, "NPROC_PER_NODE": "2", **(extra_env or {})})
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


def test_threads_data_and_run_dir_choices():
    cores = os.cpu_count()
    cpu = _prepared(["--lr", "1", "--backend", "cpu"])
    assert cpu["backend"] == "cpu" and cpu["threads"] == str(max(1, cores // 2))
    assert cpu["data"] == "--mock-data" and cpu["run"] == "runs/dist_run_x"
    musa = _prepared([])
    assert musa["backend"] == "musa" and musa["threads"] == str(min(4, max(1, cores // 2)))
    assert _prepared(["--backend=cpu"], {"OMP_NUM_THREADS": "7"})["threads"] == "7"  # an exported value wins
    assert _prepared(["--data-path", "p", "--tokenizer-model", "t"])["data"] == ""  # the arguments choose
    assert _prepared([], {"DATA_PATH": "0.5 a 0.5 b", "TOKENIZER_MODEL": "t"})["data"] == \
        "--data-path 0.5 a 0.5 b --tokenizer-model t"
    assert _prepared([], {"LOG_DIR": "/x"})["run"] == "/x"


def _exported(extra_env=None):
    script = (f"source {ROOT / 'examples/common.sh'}; export_musa_defaults || exit 3; "
              "for v in MUSA_KERNEL_TIMEOUT CUDA_DEVICE_MAX_CONNECTIONS OMP_NUM_THREADS MCCL_PROTOS MCCL_IB_GID_INDEX"
              " MCCL_ALGOS; do echo \"$v=${!v:-unset}\"; done")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MUSA_", "MCCL_", "CUDA_DEVICE_MAX", "OMP_", "MTMEGATRON_MCCL"))}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**env, **(extra_env or {})})
    return proc.returncode, dict(line.split("=", 1) for line in proc.stdout.split()), proc.stderr


def test_musa_defaults_are_exported_and_user_values_win():
    rc, out, err = _exported()
    assert rc == 0, err
    assert out == {"MUSA_KERNEL_TIMEOUT": "3200000", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "OMP_NUM_THREADS": "4",
                   "MCCL_PROTOS": "unset", "MCCL_IB_GID_INDEX": "unset", "MCCL_ALGOS": "unset"}
    rc, out, err = _exported({"MTMEGATRON_MCCL_CLUSTER_PROFILE": "mt-deepseek", "MCCL_PROTOS": "0"})
    assert rc == 0, err
    assert out["MCCL_IB_GID_INDEX"] == "3" and out["MCCL_ALGOS"] == "1"  # the opt-in cluster profile
    assert out["MCCL_PROTOS"] == "0"  # an exported value wins
    rc, out, err = _exported({"MTMEGATRON_MCCL_CLUSTER_PROFILE": "nope"})
    assert rc == 3 and "'nope' is not a known MCCL cluster profile" in err and "Traceback" not in err


# the Qwen2-VL launcher on its embedded task (no --data-path): the run directory, falling loss and the held-out
# report; its CUDA twin differs only in backend and environment (checked for syntax). The LLaVA launchers share
# the same common.sh and llava_launch.sh and have no run of their own here (tests/llava trains the model: 48 s saved)
MULTIMODAL = {"examples/qwen2vl/dist_run_pretrain_qwen2vl_musa.sh": ("answer_eval.json", "answer_accuracy")}


@pytest.mark.parametrize("script", list(MULTIMODAL))
def test_vision_example_trains_on_its_embedded_task(script, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LOG_DIR", "DATA_PATH", "OMP_NUM_THREADS", "HF_DIR")}
    env["MASTER_PORT"] = str(free_port())
    proc = subprocess.run(["bash", str(ROOT / script), "--backend", "cpu", "--train-iters", str(ITERS),
                           "--num-samples", "0"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = tmp_path / "runs" / Path(script).stem
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == ITERS and (losses[-2] + losses[-1]) / 2 < losses[0] - 0.1, losses
    report, key = MULTIMODAL[script]
    assert key in json.loads((run_dir / report).read_text())
    twin = ROOT / script.replace("_musa.sh", "_cuda.sh")
    assert subprocess.run(["bash", "-n", str(twin)]).returncode == 0


# the SFT LoRA launcher out of the box (no HF_DIR, no data: the embedded conversations over the tiny model's own
# initialisation, TP2 + SP): LoRA's start-up line, the embedded SFT data, a falling loss, the adapters saved in its
# run directory; its CUDA twin differs only in backend and environment (checked for syntax)
SFT_LORA = "examples/llama3/dist_run_sft_lora_llama3_musa.sh"


def test_sft_lora_example_trains_adapters_out_of_the_box(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LOG_DIR", "DATA_PATH", "OMP_NUM_THREADS", "HF_DIR")}
    env["MASTER_PORT"] = str(free_port())
    iters = 4
    proc = subprocess.run(["bash", str(ROOT / SFT_LORA), "--backend", "cpu", "--train-iters", str(iters),
                           "--eval-iters", "0"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "mtmegatron: LoRA r 8 alpha 16 on linear_qkv, linear_proj, linear_fc1, linear_fc2 | trainable" \
        in proc.stdout, proc.stdout[-3000:]
    assert "mtmegatron: sft data " in proc.stdout and "| template plain |" in proc.stdout  # the embedded task
    run_dir = tmp_path / "runs" / Path(SFT_LORA).stem
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == iters and losses[-1] < losses[0] - 0.1, losses  # measured 7.009 -> 6.721
    assert (run_dir / "adapters" / "latest_checkpointed_iteration.txt").read_text().strip() == str(iters)
    twin = ROOT / SFT_LORA.replace("_musa.sh", "_cuda.sh")
    assert subprocess.run(["bash", "-n", str(twin)]).returncode == 0
