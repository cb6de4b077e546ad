"""``mtmegatron plan --search`` (plan/search.py): on Megatron-LM's Llama-3-8B flags, 64 H100s and a global batch of
512 it finds five layouts that fit, fastest first, each with a command line ``plan`` accepts (the first, re-planned
here, gives the same peak); a world no layout fits is one line and exit 2; the per-layer table the search uses
assembles the same stages as building each layout (tied and untied, VPP, MoE with EP, MLA + MTP); the step time's
FLOPs are 2 x the non-embedding parameters a token meets. In-process; the 8B search is one module-scoped run."""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY
from plan_models import LLAMA3_8B, MIXTRAL

from mtmegatron import cli
from mtmegatron.plan.command import plan

GIB = 2**30


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    log = str(tmp_path_factory.mktemp("search"))
    return plan(["--world-size", "64", "--device", "h100", "--search", *LLAMA3_8B, "--log-dir", log,
                 "--tensor-model-parallel-size", "8"])  # a layout flag given is replaced by the search's


def test_five_layouts_that_fit_fastest_first(searched):
    tops = searched["layouts"]
    assert len(tops) == 5 and searched["fit"] >= 5 and searched["enumerated"] > searched["fit"]
    totals = [t["step_seconds"]["total"] for t in tops]
    assert totals == sorted(totals) and all(t > 0 for t in totals)
    for t in tops:
        assert t["plan"]["params_total"] == 8_030_261_248 and t["plan"]["fits"]
        assert t["peak_bytes"] == max(r["peak_bytes"] for r in t["plan"]["ranks"]) <= 0.9 * 80 * GIB
        lay = t["layout"]
        assert lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] == 64
        assert t["argv"].count("--tensor-model-parallel-size") == 1
        assert t["command"].startswith("torchrun --nnodes 8 --nproc-per-node 8 -m mtmegatron.pretrain ")
    assert len({tuple(t["argv"]) for t in tops}) == 5


def test_the_first_command_line_plans_alike(searched, tmp_path):
    first = searched["layouts"][0]
    again = plan(["--world-size", "64", "--device", "h100", *first["argv"]])
    assert again["ranks"] == first["plan"]["ranks"] and again["fits"]


def test_render_prints_each_layout_and_its_command(searched):
    from mtmegatron.plan.search import render

    lines = render(searched).splitlines()
    assert len(lines) == 11 and lines[0].startswith("mtmegatron plan --search: ")
    assert [line.split(".")[0] for line in lines[1::2]] == ["1", "2", "3", "4", "5"]
    assert all(line.startswith("   torchrun ") for line in lines[2::2])


def test_a_world_no_layout_fits(capsys, tmp_path):
    """8B on one 48 GB S4000: weights and fp32 gradients alone are 48 GB."""
    assert cli.main(["plan", "--world-size", "1", "--device", "s4000", "--search", *LLAMA3_8B,
                     "--log-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtmegatron plan: error: --world-size 1: no layout fits 48.00 GiB"), err


def test_flops_are_twice_the_parameters_a_token_meets():
    from types import SimpleNamespace

    from mtmegatron.plan.layer_table import LayerTable, Part
    from mtmegatron.plan.step_time import model_flops

    # per layer on one of TP 2 ranks: 50 sharded (100 in the model) + 10 replicated; the output layer 30 (60)
    table = LayerTable(layers=(Part(dense=60, sharded=50),) * 2, moe=(False, False), embedding=Part(),
                       head=Part(dense=30, sharded=30), mtp=Part(), mtp_layers=0, tied=False, word_embedding=30)
    args = SimpleNamespace(tensor_model_parallel_size=2, expert_model_parallel_size=1, expert_tensor_parallel_size=None,
                           num_experts=None, moe_router_topk=2, num_attention_heads=4, kv_channels=None,
                           hidden_size=8, seq_length=16)
    layers, head, attention = model_flops(args, table)
    assert layers == 2 * 2 * (50 * 2 + 10) and head == 2 * 30 * 2 and attention == 2 * 2 * 16 * 8


@pytest.mark.parametrize("argv, world, tp, pp, vpp, ep", [
    (MIXTRAL, 8, 2, 2, None, 2),  # MoE, untied, TP + SP
    ([a for a in MIXTRAL if a != "--untie-embeddings-and-output-weights"], 8, 1, 2, 2, 2),  # tied, VPP
    (["--model", "deepseek-v3", "--model-size", "tiny", "--mock-data", "--train-iters", "1"], 4, 1, 2, None, 2),
    (TINY + ["--train-iters", "1", "--lora-r", "4", "--transformer-impl", "local"], 4, 2, 2, None, 1),  # LoRA, TP 2
])
def test_layer_table_assembles_the_built_stages(argv, world, tp, pp, vpp, ep, tmp_path):
    from mtmegatron.config import parse
    from mtmegatron.plan.layer_table import layer_table
    from mtmegatron.plan.params import cpu_backend_unless_active, stage_params
    from mtmegatron.plan.search import _table_args, strip_owned

    argv = [a for a in argv if a not in ("--backend", "cpu")] + ["--log-dir", str(tmp_path)]
    layout = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
              "--expert-model-parallel-size", str(ep), "--micro-batch-size", "1", "--global-batch-size", "16"]
    layout += (["--sequence-parallel"] if tp > 1 else []) + (["--num-virtual-stages-per-pipeline-rank", str(vpp)]
                                                            if vpp else [])
    built = parse([*argv, *layout], world_size=world).args
    with cpu_backend_unless_active():
        table = layer_table(_table_args(strip_owned(argv), tp, ep))
        for p in range(pp):
            assert table.stage(pp, vpp, p) == stage_params(built, p)


def test_strip_owned_drops_layout_flags_and_their_values():
    from mtmegatron.plan.search import strip_owned

    argv = ["--num-layers", "4", "--tensor-model-parallel-size=4", "--recompute-modules", "core_attn", "mlp",
            "--sequence-parallel", "--micro-batch-size", "2", "--lr", "1e-3", "--use-distributed-optimizer"]
    assert strip_owned(argv) == ["--num-layers", "4", "--lr", "1e-3"]
