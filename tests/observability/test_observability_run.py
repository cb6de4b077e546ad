"""Two short 2-rank runs with the observability flags, shared by every test here (one module fixture):

- ``dp``: DP 2 with --log-throughput, --log-params-norm, --log-num-zeros-in-grad, every timer (level 2) and
  --log-timers-to-tensorboard, --log-memory-to-tensorboard, --log-world-size-to-tensorboard,
  --log-validation-ppl-to-tensorboard, --tensorboard-log-interval 2, the torch profiler on iteration 2,
  --manual-gc every 2 iterations, wandb offline (WANDB_MODE=offline, no network), a final save,
  --check-weight-hash-across-dp-replicas-interval 1 (megatron-core's cross-check of the two replicas) and
  --distributed-timeout-seconds-after-init.
- ``tp``: the same model and data under TP 2 with the parameter norm and zero count, timers of every rank
  (--timing-log-option all), and --profile without --use-pytorch-profiler on rank 1 for iterations 3..4 of a
  4-iteration run (the trace is written when the run ends inside the window).

And one single-rank run of its own (``moe_fp16``): a tiny MoE with --fp16, --moe-z-loss-coeff and
--no-log-loss-scale-to-tensorboard, for what Megatron-LM's training log shows there (loss scale, z-loss).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import math
import re

import pytest

from helpers.pretrain_runner import TINY, run_pretrain
from helpers.real_data import REAL, use_corpus_cache

ITERS = 4
COMMON = REAL + ["--train-iters", str(ITERS), "--log-interval", "2", "--eval-interval", "2", "--eval-iters", "1",
                 "--log-throughput", "--log-params-norm", "--log-num-zeros-in-grad"]
DP = ["--log-timers-to-tensorboard", "--timing-log-level", "2", "--log-memory-to-tensorboard",
      "--log-world-size-to-tensorboard", "--log-validation-ppl-to-tensorboard", "--tensorboard-log-interval", "2",
      "--profile", "--use-pytorch-profiler", "--profile-step-start", "2", "--profile-step-end", "3",
      "--manual-gc", "--manual-gc-interval", "2",
      "--check-weight-hash-across-dp-replicas-interval", "1", "--distributed-timeout-seconds-after-init", "77"]
WANDB = ["--wandb-project", "obs-test", "--wandb-exp-name", "dp-run"]
TP = ["--tensor-model-parallel-size", "2", "--timing-log-level", "1", "--timing-log-option", "all",
      "--profile", "--profile-ranks", "1", "--profile-step-start", "3", "--profile-step-end", "5"]


def _value(args: list[str], flag: str) -> int:
    return int(args[args.index(flag) + 1])


def expected_flops_per_iteration() -> float:
    """The run's model FLOPs per global batch, GEMM by GEMM (6 per weight element and token) + causal attention."""
    layers, h, heads, groups = (_value(REAL, f) for f in ("--num-layers", "--hidden-size", "--num-attention-heads",
                                                          "--num-query-groups"))
    ffn, s, vocab, batch = (_value(REAL, f) for f in ("--ffn-hidden-size", "--seq-length", "--vocab-size",
                                                       "--global-batch-size"))
    d = h // heads
    layer = 6 * (h * heads * d + 2 * h * groups * d + heads * d * h  # q, k, v, output projections
                 + 3 * h * ffn  # SwiGLU: gate, up, down
                 + heads * d * s)  # QK^T and PV over the causal half of the s x s scores
    return batch * s * (layers * layer + 6 * h * vocab)  # + the logits (vocabulary already a multiple of 128)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    use_corpus_cache()
    base = tmp_path_factory.mktemp("observability")
    out = {}
    wandb = WANDB if importlib.util.find_spec("wandb") else []  # the [wandb] extra (installed for the tests)
    for name, extra in (("dp", DP + wandb + ["--save", str(base / "dp_ckpt")]), ("tp", TP)):
        proc, rows = run_pretrain(2, COMMON + extra, base / name, timeout=600, env={"WANDB_MODE": "offline"})
        out[name] = {"proc": proc, "rows": rows, "log": base / name, "save": base / f"{name}_ckpt"}
    return out


def test_printed_and_logged_tflops_equal_megatron_lms_formula_from_the_step_time(runs):
    flops = expected_flops_per_iteration()
    for run in runs.values():
        printed = {int(m.group(1)): m.group(2) for m in re.finditer(
            r"iteration\s+(\d+)/\s*\d+ \|.*?throughput per GPU \(TFLOP/s/GPU\): ([0-9.e+-]+)", run["proc"].stdout)}
        assert sorted(printed) == [2, 4], run["proc"].stdout[-3000:]
        for row in run["rows"]:
            expected = flops / (row["step_time_ms"] / 1000.0 * 1e12 * 2)  # 2 devices
            assert row["throughput"] == pytest.approx(expected, rel=1e-9)
            assert "mfu" not in row  # no MFU on the cpu backend
            if row["iteration"] in printed:
                assert float(printed[row["iteration"]]) == pytest.approx(float(f"{expected:.4g}"), rel=1e-6)
    assert f"{flops / 1e12:.6g} TFLOP per iteration" in runs["dp"]["proc"].stdout
    assert "no MFU on the cpu backend" in runs["dp"]["proc"].stdout


def test_params_norm_and_zero_count_do_not_depend_on_the_layout(runs):
    dp, tp = runs["dp"]["rows"], runs["tp"]["rows"]
    assert [r["iteration"] for r in dp] == [r["iteration"] for r in tp] == list(range(1, ITERS + 1))
    for a, b in zip(dp, tp):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["params_norm"] == pytest.approx(b["params_norm"], rel=1e-5)  # TP shards summed, duplicates once
        assert a["num_zeros_in_grad"] == b["num_zeros_in_grad"]
        assert isinstance(a["num_zeros_in_grad"], int) and a["num_zeros_in_grad"] > 0  # unused vocabulary rows
    norms = [r["params_norm"] for r in dp]
    assert len(set(norms)) == ITERS and all(n > 1 for n in norms)  # the weights move every step
    assert re.search(r"params norm: [0-9.]+", runs["dp"]["proc"].stdout)
    assert re.search(r"num zeros: \d+", runs["dp"]["proc"].stdout)


def test_timers_are_printed_and_logged_at_the_log_interval(runs):
    dp_out, tp_out = runs["dp"]["proc"].stdout, runs["tp"]["proc"].stdout
    assert dp_out.count("(min, max) time across ranks (ms):") >= 2
    for name in ("forward-backward", "all-grads-sync", "optimizer", "batch-generator", "forward-compute",
                 "backward-compute", "save-checkpoint"):
        assert re.search(rf"\n\s+{name} \.+: \([0-9.]+, [0-9.]+\)", dp_out), name
    assert "times across ranks (ms):" in tp_out and re.search(r"rank\s+1: [0-9.]+", tp_out)  # --timing-log-option all
    assert "batch-generator" not in tp_out  # a level-2 timer, not on at level 1
    for row in runs["dp"]["rows"]:
        timer_keys = {k for k in row if k.endswith("-time")}
        if row["iteration"] % 2 == 0:
            assert {"forward-backward-time", "optimizer-time", "batch-generator-time"} <= timer_keys
            assert all(row[k] > 0 for k in timer_keys)
        else:
            assert not timer_keys
    assert not any(k.endswith("-time") for r in runs["tp"]["rows"] for k in r)  # no --log-timers-to-tensorboard


def test_memory_world_size_and_validation_perplexity_in_rows_and_tensorboard(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = runs["dp"]["rows"]
    for row in rows:
        assert row["world_size"] == 2 and row["mem_rss_bytes"] > 50e6
        if row["iteration"] % 2 == 0:
            assert row["val_ppl"] == pytest.approx(math.exp(min(20.0, row["val_loss"])))
    assert "resident memory (mem_rss_bytes)" in runs["dp"]["proc"].stdout
    events = EventAccumulator(str(runs["dp"]["log"] / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"throughput", "params_norm", "num_zeros_in_grad", "world_size", "mem_rss_bytes", "val_ppl",
            "forward-backward-time", "optimizer-time"} <= tags
    assert [e.step for e in events.Scalars("loss")] == [2, 4]  # --tensorboard-log-interval 2
    assert [e.value for e in events.Scalars("params_norm")] == pytest.approx(
        [r["params_norm"] for r in rows if r["iteration"] % 2 == 0], rel=1e-6)


def _trace_steps(path: str) -> set[str]:
    """The profiler-step ranges of a chrome trace (a regex: the traces hold megabytes of stacks)."""
    with open(path) as f:
        text = f.read()
    assert text.lstrip().startswith("{") and '"traceEvents"' in text
    return set(re.findall(r'"name": "(ProfilerStep#\d+)"', text))


def test_profiler_traces_the_window_on_the_chosen_ranks(runs):
    dp = glob.glob(str(runs["dp"]["log"] / "tensorboard" / "*.pt.trace.json"))
    assert len(dp) == 1 and "rank0." in dp[0]  # --profile-ranks defaults to [0]
    assert _trace_steps(dp[0]) == {"ProfilerStep#2"}  # iterations start .. end-1
    tp = glob.glob(str(runs["tp"]["log"] / "tensorboard" / "*.pt.trace.json"))
    assert len(tp) == 1 and "rank1." in tp[0]
    assert _trace_steps(tp[0]) == {"ProfilerStep#3", "ProfilerStep#4"}  # the run ended inside the window
    assert "--profile without --use-pytorch-profiler: the cpu backend has no nsys range" in runs["tp"]["proc"].stdout


def test_wandb_offline_run_holds_the_metrics_rows(runs):
    pytest.importorskip("wandb")  # the [wandb] extra; scripts/install.sh installs it for the tests
    run_dirs = glob.glob(str(runs["dp"]["save"] / "wandb" / "wandb" / "offline-run-*"))  # default: <save>/wandb
    assert len(run_dirs) == 1, run_dirs
    (log,) = glob.glob(f"{run_dirs[0]}/run-*.wandb")
    with open(log, "rb") as f:
        data = f.read()
    assert b"dp-run" in data and b"obs-test" in data
    for row in runs["dp"]["rows"]:  # each row's global values (the same on every rank), JSON-encoded
        for key in ("loss", "params_norm", "num_zeros_in_grad", "val_ppl"):
            if key in row:
                assert json.dumps(row[key]).encode() in data, (row["iteration"], key)
    for key in ("throughput", "step_time_ms", "mem_rss_bytes", "forward-backward-time"):  # the last rank's own
        assert key.encode() in data, key
    assert "wandb run 'dp-run' of project obs-test (offline)" in runs["dp"]["proc"].stdout


def test_loss_scale_is_logged_as_megatron_lm_does(runs):
    """Megatron-LM's iteration line has "loss scale: 1.0" without --fp16; tensorboard gets it by default."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert all(row["loss_scale"] == 1.0 for run in runs.values() for row in run["rows"])
    printed = re.findall(r"iteration\s+\d+/\s*\d+ \|.*\| loss scale: 1\.0 \|", runs["dp"]["proc"].stdout)
    assert len(printed) == 2, runs["dp"]["proc"].stdout[-3000:]  # --log-interval 2 of 4
    events = EventAccumulator(str(runs["dp"]["log"] / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("loss_scale")] == [1.0, 1.0]
    assert not any("moe_z_loss" in row for run in runs.values() for row in run["rows"])  # dense: no MoE


MOE_FP16 = TINY + ["--num-layers", "2", "--train-iters", "2", "--log-interval", "1", "--num-experts", "4",
                   "--moe-router-topk", "2", "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--fp16",
                   "--no-log-loss-scale-to-tensorboard"]


@pytest.fixture(scope="module")
def moe_fp16(tmp_path_factory):
    log = tmp_path_factory.mktemp("moe_fp16")
    proc, rows = run_pretrain(1, MOE_FP16 + ["--tensorboard-dir", str(log / "tb")], log, timeout=300)
    return proc.stdout, rows, log / "tb"


def test_moe_z_loss_and_fp16_loss_scale_in_line_rows_and_tensorboard(moe_fp16):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    stdout, rows, tensorboard = moe_fp16
    printed = re.findall(r"iteration\s+(\d+)/\s*\d+ \|.*\| moe_aux_loss ([0-9.]+) \| moe_z_loss ([0-9.]+) \|"
                         r" loss scale: ([0-9.]+)", stdout)
    assert [int(p[0]) for p in printed] == [1, 2], stdout[-3000:]
    for (_, aux, z, scale), row in zip(printed, rows):
        assert float(z) == pytest.approx(row["moe_z_loss"], abs=1e-4) and row["moe_z_loss"] > 0
        assert float(aux) == pytest.approx(row["moe_aux_loss"], abs=1e-4)
        assert float(scale) == row["loss_scale"]
    # --fp16's dynamic scale starts at --initial-loss-scale (2**32); both steps overflow there, and with Megatron-LM's
    # --hysteresis 2 the second overflow halves it: the line shows the scale after the step, as Megatron-LM's does
    assert [(r["skipped"], r["loss_scale"]) for r in rows] == [(True, 2.0**32), (True, 2.0**31)]
    events = EventAccumulator(str(tensorboard))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"moe_z_loss", "moe_aux_loss", "loss"} <= tags
    assert "loss_scale" not in tags  # --no-log-loss-scale-to-tensorboard


def test_manual_gc_is_announced(runs):
    assert ("--manual-gc: automatic garbage collection off; collecting every 2 iterations and before and after "
            "validation") in runs["dp"]["proc"].stdout


def test_weight_hashes_are_compared_across_replicas_and_the_timeout_changes_after_init(runs):
    """megatron-core's cross-check before the first iteration and after each one, with Megatron-LM's line; the
    data-parallel group's timeout read back from its backend after the first iteration."""
    out = runs["dp"]["proc"].stdout
    lines = [line for line in out.splitlines() if line.startswith(">>> Weight hashes match")]
    assert lines == [f">>> Weight hashes match after {i} iterations..." for i in range(ITERS + 1)], out[-2000:]
    assert "--distributed-timeout-seconds-after-init: process-group timeout now 0:01:17" in out, out[-2000:]
