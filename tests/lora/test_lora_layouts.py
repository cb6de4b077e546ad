"""LoRA through ``mtmegatron.pretrain`` as users launch it, one shared set of three runs (module fixture): a base
checkpoint (one iteration of full training, hidden 128, fp32); LoRA (rank 8) over it at TP2 + sequence
parallelism for 16 iterations, saving at 8, whose loss falls; its checkpoint is under 20% of the base
checkpoint's bytes (measured: 494 KB vs 4.5 MB at 6 iterations); the iteration-8 adapters resumed at PP2
(TP1: another layout, through megatron-core's resharding) give the uninterrupted run's losses for iterations
9-16 within 1e-5; both runs' start-up line counts the same trainable parameters, exactly the adapters' (per-part
A blocks for the fused q/k/v and gate/up). Two more spawns, neither layout shared with TP2 + SP: torch FSDP2 at DP2
(frozen base and adapters in the same fully_shard units) gives the TP2 + SP run's iterations 1-4 within 1e-5 and
saves adapters only (their Adam moments beside them); its iteration-2 adapters resumed under Megatron-FSDP at one
rank (``optim``: patches/megatron_fsdp_frozen_params.py) give iterations 3-4, and those adapters resumed at TP1 x DP2
x CP2 (4 ranks: data and context parallelism at once) with the distributed optimizer offloaded to the host
(``--optimizer-cpu-offload``, fraction 0.5) give 5-8, each within 1e-5 of the TP2 + SP run (each measured by hand
against one rank: DP2 1.2e-7, TP2 + SP 2.4e-7, CP2 3.6e-7; offload vs the same DP2 run without it: equal)."""

from __future__ import annotations

import pytest
import torch.distributed.checkpoint as dcp

from helpers.pretrain_runner import TINY, run_pretrain

ITERS, RESUME_AT, FSDP2_ITERS, FSDP2_SAVE, MFSDP_SAVE, DP_CP_ITERS = 16, 8, 4, 2, 4, 4
OFFLOAD = ["--use-distributed-optimizer", "--use-precision-aware-optimizer", "--optimizer-cpu-offload",
           "--optimizer-offload-fraction", "0.5"]


def _argv(*extra: str) -> list[str]:
    argv = list(TINY)
    for flag, value in (("--hidden-size", "128"), ("--ffn-hidden-size", "256"), ("--num-layers", "2")):
        argv[argv.index(flag) + 1] = value
    return argv + ["--transformer-impl", "local", "--log-interval", "1", *extra]


def _bytes(directory) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    base, adapters, fsdp2, mfsdp = tmp / "base", tmp / "adapters", tmp / "fsdp2", tmp / "mfsdp"
    run_pretrain(1, _argv("--train-iters", "1", "--save", str(base)), tmp / "log_base")
    lora = ["--load", str(base), "--lora-r", "8", "--lora-alpha", "16", "--train-iters", str(ITERS), "--lr", "5e-3"]
    tp2, rows = run_pretrain(2, _argv(*lora, "--tensor-model-parallel-size", "2", "--sequence-parallel", "--save",
                                      str(adapters), "--save-interval", str(RESUME_AT)), tmp / "log_tp2sp")
    whole = [r["loss"] for r in rows if "loss" in r]
    (adapters / "latest_checkpointed_iteration.txt").write_text(str(RESUME_AT))  # resume from iteration 8
    pp2, rows = run_pretrain(2, _argv(*lora, "--lora-load", str(adapters), "--pipeline-model-parallel-size", "2"),
                             tmp / "log_pp2")
    resumed = [r["loss"] for r in rows if "loss" in r]
    lora[lora.index("--train-iters") + 1] = str(FSDP2_ITERS)  # constant lr: the first iterations of the same run
    _, rows = run_pretrain(2, _argv(*lora, "--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--save",
                                    str(fsdp2), "--save-interval", str(FSDP2_SAVE)), tmp / "log_fsdp2")
    fsdp2_losses = [r["loss"] for r in rows if "loss" in r]
    (fsdp2 / "latest_checkpointed_iteration.txt").write_text(str(FSDP2_SAVE))
    lora[lora.index("--train-iters") + 1] = str(MFSDP_SAVE)
    _, rows = run_pretrain(1, _argv(*lora, "--lora-load", str(fsdp2), "--override-opt_param-scheduler",
                                    "--use-megatron-fsdp", "--use-distributed-optimizer", "--data-parallel-sharding-"
                                    "strategy", "optim", "--no-gradient-accumulation-fusion", "--save", str(mfsdp)),
                           tmp / "log_mfsdp")
    mfsdp_losses = [r["loss"] for r in rows if "loss" in r]
    lora[lora.index("--train-iters") + 1] = str(MFSDP_SAVE + DP_CP_ITERS)  # the schedule's length differs: constant
    offload, rows = run_pretrain(4, _argv(*lora, "--lora-load", str(mfsdp), "--override-opt_param-scheduler",
                                          "--context-parallel-size", "2", *OFFLOAD), tmp / "log_dp2cp2")
    dp_cp = [r["loss"] for r in rows if "loss" in r]
    startup = [[ln for ln in proc.stdout.splitlines() if ln.startswith("mtmegatron: LoRA r")] for proc in (tp2, pp2)]
    resume_line = [ln for ln in pp2.stdout.splitlines() if "continuing at iteration" in ln]
    expected_resume = f"mtmegatron: loaded {base} with the adapters of {adapters} (continuing at iteration {RESUME_AT})"
    fsdp2_keys = sorted(dcp.FileSystemReader(str(fsdp2 / f"iter_{FSDP2_SAVE:07d}")).read_metadata().state_dict_metadata)
    return {"whole": whole, "resumed": resumed, "base_bytes": _bytes(base / "iter_0000001"),
            "adapter_bytes": _bytes(adapters / f"iter_{RESUME_AT:07d}"), "startup": startup, "dp_cp": dp_cp,
            "fsdp2": fsdp2_losses, "mfsdp": mfsdp_losses, "fsdp2_keys": fsdp2_keys, "offload_stdout": offload.stdout,
            "resume_line": resume_line, "expected_resume": expected_resume}


def test_the_loss_falls(runs):
    whole = runs["whole"]
    assert len(whole) == ITERS
    assert sum(whole[-4:]) / 4 < sum(whole[:4]) / 4 - 0.2, whole  # measured: 4.94 -> 4.54 at one rank


def test_adapter_checkpoint_is_small(runs):
    base_bytes, adapter_bytes = runs["base_bytes"], runs["adapter_bytes"]
    assert adapter_bytes < 0.2 * base_bytes, (adapter_bytes, base_bytes)


def test_resume_at_another_layout_reproduces_the_losses(runs):
    whole, resumed = runs["whole"], runs["resumed"]
    assert len(resumed) == ITERS - RESUME_AT
    assert max(abs(a - b) for a, b in zip(resumed, whole[RESUME_AT:])) < 1e-5, (whole, resumed)


def test_resume_line_names_the_base_and_the_adapters(runs):
    assert runs["resume_line"] == [runs["expected_resume"]]  # the iteration comes from the adapters, not the base


def test_startup_line_counts_the_adapters(runs):
    # per layer, hidden 128, 4 heads in 2 query groups (q/k/v rows 256), ffn 256 (SwiGLU fc1 rows 512), r 8:
    # qkv 3*8*128 + 256*8, proj 8*128 + 128*8, fc1 2*8*128 + 512*8, fc2 8*256 + 128*8 = 16,384; 2 layers
    startup = runs["startup"]
    for lines in startup:
        assert len(lines) == 1, lines  # rank 0 only
        assert lines[0].startswith("mtmegatron: LoRA r 8 alpha 16 on linear_qkv, linear_proj, linear_fc1, "
                                   "linear_fc2 | trainable 32,768 of "), lines
        assert lines[0].endswith("| base frozen: no gradient buffer, no optimizer state"), lines
    assert startup[0] == startup[1]  # TP2 + SP and PP2 count the same model


def test_fsdp2_equals_tensor_parallel(runs):
    whole, fsdp2 = runs["whole"], runs["fsdp2"]
    assert len(fsdp2) == FSDP2_ITERS
    assert max(abs(a - b) for a, b in zip(fsdp2, whole)) < 1e-5, (whole[:FSDP2_ITERS], fsdp2)


def test_fsdp2_saves_adapters_only(runs):
    keys = [k for k in runs["fsdp2_keys"] if not k.startswith("rng_state")]
    assert keys and all(".lora.lora_" in k for k in keys), keys  # no base weight, no base optimizer state
    assert "optimizer.state.exp_avg.decoder.layers.self_attention.linear_qkv.lora.lora_a" in keys, keys


def test_megatron_fsdp_resumes_fsdp2(runs):
    whole, mfsdp = runs["whole"], runs["mfsdp"]
    assert len(mfsdp) == MFSDP_SAVE - FSDP2_SAVE
    expected = whole[FSDP2_SAVE:MFSDP_SAVE]
    assert max(abs(a - b) for a, b in zip(mfsdp, expected)) < 1e-5, (expected, mfsdp)


def test_data_and_context_parallel_with_optimizer_offload_resume_megatron_fsdp(runs):
    whole, dp_cp = runs["whole"], runs["dp_cp"]
    assert len(dp_cp) == DP_CP_ITERS
    expected = whole[MFSDP_SAVE:MFSDP_SAVE + DP_CP_ITERS]
    assert max(abs(a - b) for a, b in zip(dp_cp, expected)) < 1e-5, (expected, dp_cp)
    offloaded = [ln for ln in runs["offload_stdout"].splitlines() if "optimizer offload: " in ln]
    assert len(offloaded) == 1 and "fraction 0.5" in offloaded[0], offloaded  # rank 0's line: the offload ran
