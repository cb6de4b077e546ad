"""``mtmegatron plan``'s parameters and per-rank rows (mtmegatron/plan/): Megatron-LM's Llama-3-8B flags count
8,030,261,248 parameters from the model built on the meta device (seconds, no storage), and a TP x PP x EP layout's
stages add up to the single-rank model. In-process, CPU backend activated by the planner for the build only."""

from __future__ import annotations

import sys

import pytest

from plan_models import LLAMA3_8B, MIXTRAL

from mtmegatron.plan.command import plan



@pytest.fixture(scope="module")
def llama3_8b(tmp_path_factory):
    log = str(tmp_path_factory.mktemp("plan"))
    return plan(["--world-size", "64", "--device", "h100", *LLAMA3_8B, "--log-dir", log,
                 "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4", "--sequence-parallel",
                 "--use-distributed-optimizer", "--recompute-activations"])


def test_llama3_8b_parameters(llama3_8b):
    assert llama3_8b["params_total"] == 8_030_261_248
    assert llama3_8b["layout"] == {"tp": 2, "pp": 4, "vpp": None, "cp": 1, "dp": 8, "ep": 1, "expert_tp": 2}


def test_llama3_8b_rows(llama3_8b):
    rows = llama3_8b["ranks"]
    assert [r["rank"] for r in rows] == [0, 16, 32, 48]  # the first rank of each stage (tp-cp-ep-dp-pp order)
    assert [r["in_flight_microbatches"] for r in rows] == [4, 3, 2, 1]  # 1F1B warm-up, 64 micro-batches
    # first and last stage: 8 layers + one 128256 x 4096 embedding (input / output), a half per TP rank
    embedding, layer = 128256 * 4096, 218_112_000
    assert rows[0]["params"] == (8 * (layer - 2 * 4096) + embedding) // 2 + 8 * 2 * 4096
    for r in rows:
        assert r["weights_bytes"] == 2 * r["params"] and r["gradients_bytes"] == 4 * r["params"]  # bf16, fp32 grads
        assert r["optimizer_bytes"] == 12 * r["params"] // 8  # fp32 main + 2 moments, sharded over DP 8
        parts = ("weights", "gradients", "optimizer", "activations", "buffers")
        assert r["peak_bytes"] == sum(r[f"{p}_bytes"] for p in parts)
        assert r["headroom_bytes"] == 80 * 2**30 - r["peak_bytes"]
    assert llama3_8b["fits"] is True


def test_layout_stages_add_up_to_the_single_rank_model(tmp_path):
    log = ["--log-dir", str(tmp_path)]
    hook = sys.excepthook
    single = plan(["--world-size", "1", *MIXTRAL, *log])
    split = plan(["--world-size", "8", *MIXTRAL, *log, "--tensor-model-parallel-size", "2",
                  "--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2", "--sequence-parallel"])
    assert split["params_total"] == single["params_total"] > 0
    assert len(split["ranks"]) == 2 and single["ranks"][0]["params"] == single["params_total"]
    pp_only = plan(["--world-size", "2", *MIXTRAL, *log, "--pipeline-model-parallel-size", "2"])
    assert sum(r["params"] for r in pp_only["ranks"]) == single["params_total"]  # untied: no parameter twice
    # each call's process group is gone with its "[rank0]: " traceback prefixer (torch wraps sys.excepthook)
    assert sys.excepthook is hook


def test_mla_mtp_moe_stages_add_up(tmp_path):
    """DeepSeek-V3's tiny preset (MLA, MoE after a dense layer, an MTP layer on the last stage that keeps a copy of
    the embedding): PP2 x EP2 counts the single-rank model, the copy once."""
    argv = ["--model", "deepseek-v3", "--model-size", "tiny", "--mock-data", "--train-iters", "1",
            "--log-dir", str(tmp_path)]
    single = plan(["--world-size", "1", *argv])
    split = plan(["--world-size", "4", *argv, "--pipeline-model-parallel-size", "2",
                  "--expert-model-parallel-size", "2"])
    assert split["params_total"] == single["params_total"] > 0
    assert sum(r["params"] for r in split["ranks"]) < single["params_total"]  # experts halved over EP
