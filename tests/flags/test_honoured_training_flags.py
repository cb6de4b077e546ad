"""Megatron-LM training flags honoured through config/training_flags.py, each checked where its effect shows:
the rank order given to megatron-core (``--use-tp-pp-dp-mapping``) and the root logger's level
(``--logging-level``) through setup.init_distributed with megatron-core's initialisation captured (in-process);
one one-rank build (setup.build, as pretrain calls it) for the DDP buckets (``--ddp-num-buckets``), the schedule's
grad-sync hook (``--no-align-grad-reduce``), the optimizer's weight-decay groups (``--no-weight-decay-cond-type``),
the param-group map (``--dump-param-to-param-group-map``), the activation (``--quick-geglu``), the dataset
builder's fields and RoPE skipped on every second layer (``--no-rope-freq 2``).
"""

from __future__ import annotations

import logging
import types

import pytest

from helpers.ranks import run_ranks
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

BASE = ["--backend", "cpu", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1",
        "--global-batch-size", "1", "--train-iters", "1", "--vocab-size", "128", "--mock-data", "--lr", "1e-4"]


def test_rank_order_and_logging_level_reach_initialisation(monkeypatch):
    """``--use-tp-pp-dp-mapping``: megatron-core gets ``tp-cp-ep-pp-dp``, whose groups at TP1 PP2 DP2 are
    Megatron-LM's (data-parallel peers 0 and 2, not 0 and 1); ``--logging-level``: the root logger's level."""
    from megatron.core.parallel_state import RankGenerator

    from mtmegatron.models import initialization
    from mtmegatron.training import setup

    captured = []
    monkeypatch.setattr(setup.torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(setup.parallel_state, "initialize_model_parallel", lambda **kw: captured.append(kw))
    monkeypatch.setattr(initialization, "rank_seed", lambda args: 0)
    monkeypatch.setattr(setup, "seed_everything", lambda seed: None)
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)  # restored afterwards
    backend = types.SimpleNamespace(set_device=lambda index: None)
    dp_groups = {}
    for mapping in ([], ["--use-tp-pp-dp-mapping"]):
        args = parse_args(BASE + ["--pipeline-model-parallel-size", "2", "--logging-level", "25",
                                  "--global-batch-size", "2"] + mapping, world_size=4)
        setup.init_distributed(args, backend)
        order = captured[-1]["order"]
        dp_groups[bool(mapping)] = RankGenerator(tp=1, ep=1, dp=2, pp=2, cp=1, order=order).get_ranks("dp")
        assert root.level == 25
    assert dp_groups == {False: [[0, 1], [2, 3]], True: [[0, 2], [1, 3]]}


@pytest.mark.parametrize("flags, says", [
    (["--ddp-num-buckets", "2", "--ddp-bucket-size", "1000", "--overlap-grad-reduce"], "exclude each other"),
    (["--ddp-num-buckets", "0"], "must be positive"),
    (["--quick-geglu", "--swiglu"], "exclude each other"),
    (["--dataloader-fast-cache-load"], "--data-cache-path"),
])
def test_contradictions_are_one_line(flags, says):
    with pytest.raises(ConfigError) as e:
        parse_args(BASE + flags, world_size=1)
    assert says in str(e.value) and "\n" not in str(e.value)


def _build_worker(rank, world_size, backend_name, tmp):
    import os

    from megatron.core.fusions.fused_bias_geglu import quick_gelu

    import mtmegatron
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.data.section import GptData
    from mtmegatron.training.data import build_mock_dataset
    from mtmegatron.training.setup import build, init_distributed

    backend = mtmegatron.activate(backend_name)
    dump = os.path.join(tmp, "param_groups")
    args = parse_args(BASE + ["--qk-layernorm", "--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm",
                              "--overlap-grad-reduce", "--ddp-num-buckets", "3", "--no-align-grad-reduce",
                              "--dump-param-to-param-group-map", dump, "--quick-geglu",
                              "--num-dataset-builder-threads", "2", "--mid-level-dataset-surplus", "0.01",
                              "--allow-ambiguous-pad-tokens", "--position-embedding-type", "rope",
                              "--no-rope-freq", "2"], world_size=1)
    init_distributed(args, backend)
    model, optimizer, _, config = build(args)
    buffer = model[0].buffers[0]
    numel = sum(p.nelement() for p in model[0].module.parameters())
    wd = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            wd[param] = group["wd_mult"]
    names = {param: name for name, param in model[0].module.named_parameters()}
    dataset = build_mock_dataset(GptData.of(args), 4)
    # --no-rope-freq 2: the second layer's attention ignores the rotary embedding, the first uses it
    import torch

    gpt = model[0].module.eval()  # no attention dropout
    rotary = gpt.rotary_pos_emb(16)
    hidden = torch.randn(16, 1, 64)
    with torch.no_grad():
        rope_changes = [not torch.equal(layer.self_attention(hidden, None, rotary_pos_emb=rotary)[0],
                                        layer.self_attention(hidden, None, rotary_pos_emb=None)[0])
                        for layer in gpt.decoder.layers]
    return {
        "rope_changes": rope_changes,
        "bucket_size": model[0].ddp_config.bucket_size, "num_buckets": len(buffer.buckets), "numel": numel,
        "grad_sync_func": config.grad_sync_func is not None, "no_sync_func": config.no_sync_func is not None,
        "wd_mult": {names[p]: m for p, m in wd.items() if "layernorm" in names[p] or "norm" in names[p]},
        "dumped": sorted(os.listdir(dump)) if os.path.isdir(dump) else [],
        "quick_geglu": config.activation_func is quick_gelu and config.gated_linear_unit,
        "dataset": [dataset.config.num_dataset_builder_threads, dataset.config.mid_level_dataset_surplus,
                    dataset.config.allow_ambiguous_pad_tokens],
    }


def test_one_build_honours_the_flags(tmp_path):
    (result,) = run_ranks(_build_worker, 1, "cpu", str(tmp_path), timeout=300)
    # --ddp-num-buckets 3: bucket size = parameters // 3 (Megatron-LM's get_model), so about 3 buckets
    assert result["bucket_size"] == result["numel"] // 3
    assert 3 <= result["num_buckets"] <= 4, result
    # --no-align-grad-reduce: gradients reduce without the schedule's per-chunk hook; no_sync still installed
    assert result["no_sync_func"] and not result["grad_sync_func"]
    # --no-weight-decay-cond-type apply_wd_to_qk_layernorm: q/k layer norms keep weight decay, other norms not
    qk = {n: m for n, m in result["wd_mult"].items() if "q_layernorm" in n or "k_layernorm" in n}
    others = {n: m for n, m in result["wd_mult"].items() if n not in qk}
    assert qk and set(qk.values()) == {1.0}, result["wd_mult"]
    assert others and set(others.values()) == {0.0}, result["wd_mult"]
    assert ".metadata" in result["dumped"], result["dumped"]  # megatron-core's param -> group map
    assert result["quick_geglu"]
    assert result["dataset"] == [2, 0.01, True]
    assert result["rope_changes"] == [True, False]  # --no-rope-freq 2 honoured by our (megatron-core) attention


def test_log_progress_memory_interval_and_skip_train(tmp_path):
    """``--log-progress``: ``<--save>/progress.txt`` with Megatron-LM's lines (a start, then one per saved
    checkpoint with its iteration, FLOPs and tokens), appended to by a resumed job. ``--skip-train`` on the
    resumed job's checkpoint: no step and no save, the validation loss that job reported at that iteration.
    ``--log-memory-interval``: Megatron-LM's memory line in the resumed job."""
    from helpers.pretrain_runner import TINY, run_pretrain

    from mtmegatron.training.observability import throughput

    save = tmp_path / "ckpt"
    common = TINY + ["--save", str(save), "--save-interval", "2", "--log-progress", "--num-workers", "0",
              "--lr-decay-iters", "4", "--eval-interval", "2", "--eval-iters", "2"]
    run_pretrain(1, common + ["--train-iters", "2"], tmp_path / "a")
    resumed, rows = run_pretrain(1, common + ["--train-iters", "4", "--load", str(save), "--log-memory-interval",
                                              "2", "--log-device-memory-used"], tmp_path / "b")
    # --log-memory-interval 2: Megatron-LM's line after iteration 4 (resident memory on the cpu backend)
    memory = [line for line in resumed.stdout.splitlines() if " iterations) memory (MB) | " in line]
    assert [line.split(" memory")[0] for line in memory] == ["[Rank 0] (after 4 iterations)"], memory
    lines = [line.split("\t") for line in (save / "progress.txt").read_text().splitlines()]
    assert [fields[3] for fields in lines] == ["Starting job", "Saved checkpoint", "Starting job", "Saved checkpoint"]
    assert all(fields[1] == "Job ID: " and fields[2] == "# GPUs: 1" for fields in lines)
    saved = [dict(field.split(": ", 1) for field in fields[4:]) for fields in lines if len(fields) > 4]
    assert [s["Iteration"] for s in saved] == ["2", "4"]
    args = parse_args(TINY + ["--train-iters", "4"], world_size=1)
    per_iteration = throughput.num_floating_point_operations(args, 8)  # global batch 8
    assert [float(s["Floating-point operations"]) for s in saved] == pytest.approx(
        [2 * per_iteration, 4 * per_iteration], rel=1e-2)  # the file keeps 3 significant digits
    assert [s["Tokens (in billions)"] for s in saved] == ["0.00", "0.00"]  # 16 and 32 samples of 32 tokens
    assert all(s["Job throughput"].endswith(" TFLOP/s/GPU") for s in saved)

    saved_dirs = sorted(p.name for p in save.iterdir())
    proc, skip_rows = run_pretrain(1, common + ["--train-iters", "4", "--load", str(save), "--skip-train"],
                                   tmp_path / "c")
    assert skip_rows == [] and sorted(p.name for p in save.iterdir()) == saved_dirs
    line = next(line for line in proc.stdout.splitlines() if "--skip-train: validation loss" in line)
    assert "at iteration 4 " in line
    value = float(line.split("lm loss value: ")[1].split(" ")[0])
    assert value == pytest.approx(rows[-1]["val_loss"], rel=1e-5, abs=0), (line, rows[-1])


def test_refusals_say_why():
    """At most 30 table flags keep the plain "not implemented" reason (those not built yet); the training-user
    flags named in Megatron-LM parity work are honoured, no-ops as in Megatron-LM, or refused with their reason."""
    from mtmegatron.config import megatron_flags
    from mtmegatron.config.arguments import build_parser

    parser = build_parser()
    rows = {row.flag: row for row in megatron_flags.table() if row.action != "HelpAction"}

    def plain(row):
        return (megatron_flags.classify(row, parser.hand_registered) == "refused"
                and megatron_flags.refusal_reason(row) == megatron_flags._NOT_YET)

    unexplained = sorted(flag for flag, row in rows.items() if plain(row))
    assert len(unexplained) <= 30, unexplained
    named = ["--dataloader-type", "--skip-train", "--log-progress", "--logging-level", "--head-lr-mult",
             "--no-weight-decay-cond-type", "--decoder-num-layers", "--ddp-num-buckets", "--use-tp-pp-dp-mapping",
             "--fim-data", "--fim-rate", "--mask-prob", "--vision-pretraining", "--enable-chunked-prefill",
             "--use-sharp", "--log-energy", "--perform-rl-step"]
    assert [flag for flag in named if plain(rows[flag])] == []


OFFLOAD = ["--fine-grained-activation-offloading", "--offload-modules", "core_attn", "attn_norm"]


@pytest.mark.parametrize("flags, says", [
    (["--offload-modules", "core_attn"], "--offload-modules / --min-offloaded-tensor-size need --fine-grained"),
    (["--min-offloaded-tensor-size", "4"], "--offload-modules / --min-offloaded-tensor-size need --fine-grained"),
    (["--fine-grained-activation-offloading", "--offload-modules", "mlp"], "--offload-modules: choose from"),
    (["--fine-grained-activation-offloading", "--offload-modules", "attn_proj"], ("--fine-grained-activation-"
                                                                                "offloading needs --offload-modules")),
    (["--cpu-offloading-num-layers", "1", "--pipeline-model-parallel-size", "2", "--global-batch-size", "2"],
     "--cpu-offloading-num-layers 1: megatron-core offloads 1 to num-layers - 1 layers"),
    (["--cpu-offloading-num-layers", "1"] + OFFLOAD, "--cpu-offloading-num-layers 1: megatron-core offloads"),
])
def test_activation_offloading_contradictions_are_one_line(flags, says):
    with pytest.raises(ConfigError) as e:
        parse_args(BASE + flags, world_size=2 if "--pipeline-model-parallel-size" in flags else 1)
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)


def test_activation_offloading_on_the_host_is_off_with_a_startup_line():
    from mtmegatron.config.run_plan import startup_lines

    for flags, flag in ((OFFLOAD, "--fine-grained-activation-offloading"),
                        (["--cpu-offloading-num-layers", "1"], "--cpu-offloading-num-layers")):
        args = parse_args(BASE + flags, world_size=1)
        assert not args.fine_grained_activation_offloading and args.cpu_offloading_num_layers == 0
        line = f"mtmegatron: {flag}: nothing to do on the cpu backend (its device is the host memory activations " \
               "would go to): off"
        assert line in startup_lines(args)


@pytest.mark.parametrize("te_missing", [None, "TransformerEngine is not installed"])
def test_activation_offloading_on_a_device(monkeypatch, te_missing):
    """On a device backend: fine-grained offloading with or without TE (megatron-core's manager needs only a flag
    of TE's, patches/activation_offload_without_te.py; run on the simulated device in tests/musa_sim/test_lane.py),
    a start-up line saying what moves; --cpu-offloading-num-layers runs in TE's cpu_offload: refused without TE."""
    from mtmegatron.config import memory_flags

    device = types.SimpleNamespace(name="musa", device_is_host=False, transformer_engine_missing=lambda: te_missing)
    monkeypatch.setattr(memory_flags, "select_backend", lambda name, warn: device)
    args = parse_args(BASE + OFFLOAD, world_size=1)
    assert args.fine_grained_activation_offloading and args.activation_offload_note == (
        "--fine-grained-activation-offloading: saved activations of core_attn, attn_norm (tensors of at least "
        "1048576 elements) go to host memory in forward and return in backward (megatron-core; the device peak "
        "shows with --log-memory-interval)")
    if te_missing:
        with pytest.raises(ConfigError) as e:
            parse_args(BASE + ["--cpu-offloading-num-layers", "1"], world_size=1)
        assert str(e.value) == ("--cpu-offloading-num-layers: megatron-core runs this activation offloading in "
                                "TransformerEngine's cpu_offload: TransformerEngine is not installed "
                                "(--fine-grained-activation-offloading does not need TE)")
        return
    args = parse_args(BASE + ["--cpu-offloading-num-layers", "1"], world_size=1)
    assert args.cpu_offloading and "1 of the 2 layers go to host memory" in args.activation_offload_note
