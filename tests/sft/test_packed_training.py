"""Packed SFT trains exactly like padded SFT, under every parallel layout we support, and packing never lets
a token see another conversation.

One group of real gloo ranks per world size (a module fixture) trains, layout after layout (megatron-core's
parallel state rebuilt in between), the same tiny model from the same seed on the embedded task's
conversations twice: packed THD and
``--no-sft-packing`` padded rows. Both hold the same conversations in the same global batches, so with the
per-token loss their per-iteration losses and gradient norms must agree to fp32 rounding (1e-5) for 10
iterations: TP1; TP2 + SP; PP2 with virtual stages; Mixtral-style MoE with EP2 over DP2 and the distributed
optimizer; CP2 (each conversation padded to a multiple of 4 and split per conversation across the two CP
ranks, against padded rows split by megatron-core's CP layout). On one rank the same packed data cut into 8 micro-batches of 1 instead of 4 of 2 gives the same
losses and gradient norms (per-token averaging over the whole global batch).
Boundary: in one packed row, changing conversation A (its tokens and its length) leaves conversation B's
logits unchanged, and B's logits equal those of B alone in a padded row; the same under CP2 (the logits
gathered back from both CP ranks into row order), where they also equal the one-rank logits of the same
weights, and greedy decoding (the held-out scoring's loop) gives the same tokens as on one rank.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from helpers.ranks import run_ranks
from helpers.pretrain_runner import TINY

ITERS = 10
TOL = 1e-5
BASE = [a for a in TINY if a != "--mock-data"]
for flag, value in (("--vocab-size", "320"), ("--seq-length", "64"), ("--max-position-embeddings", "64")):
    BASE[BASE.index(flag) + 1] = value
BASE += ["--sft", "--sft-tokenizer-prompt-format", "plain", "--num-samples", "0", "--eval-iters", "0",
         "--train-iters", str(ITERS)]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0",
       "--moe-token-dispatcher-type", "alltoall"]
LAYOUTS = {
    "tp1": (1, []),
    "tp2_sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "pp2_vpp2": (2, ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"]),
    "ep2_dp2_distopt": (2, ["--expert-model-parallel-size", "2", "--use-distributed-optimizer", *MOE]),
    "cp2": (2, ["--context-parallel-size", "2"]),
}


def _with_model(argv: list[str]) -> list[str]:
    argv = list(argv)
    if "--num-experts" in argv:
        argv[argv.index("--model") + 1] = "mixtral"
    return argv


def _train_worker(rank, world_size, backend_name, runs: dict, cache: str):
    """Train each of ``runs`` ((layout, mode) -> argv) from the same seed in these processes, switching
    megatron-core's parallel state when the layout changes; (loss, grad norm) per iteration."""
    os.environ["MTMEGATRON_CACHE"] = cache
    from megatron.core import parallel_state

    import mtmegatron
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.tasks.sft import SFTTask
    from mtmegatron.training.setup import build, init_distributed, seed_everything
    from mtmegatron.training.train_step import StepValues, train_step

    backend = mtmegatron.activate(backend_name)
    results, layout = {}, None
    for (name, mode), argv in runs.items():
        args = parse_args(argv, world_size=world_size)
        inputs = SFTTask.prepare(args, progress=False)  # completes args from the data, as pretrain.prepare
        task = SFTTask.of(args, embedded_corpus=False)
        if name != layout:
            if parallel_state.model_parallel_is_initialized():
                parallel_state.destroy_model_parallel()
            init_distributed(args, backend)  # the process group once, the parallel state per layout
            layout = name
        seed_everything(args.seed)
        model, optimizer, scheduler, _ = build(args)
        step = task.step(inputs)  # as pretrain.run gets it
        iterators = [step.micro_batches(inputs, parallel_state.get_data_parallel_rank(), 0) for _ in model]
        values = StepValues.of(args)
        rows = [train_step(iterators, model, optimizer, scheduler, values, i, step=step) for i in range(1, ITERS + 1)]
        results[f"{name}/{mode}"] = np.array([(r["loss"], r["grad_norm"]) for r in rows])
    return results


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("sft-cache"))


@pytest.fixture(scope="module")
def trained(cache):
    """layout -> {mode: [(loss, grad norm)] per iteration} (rank 0's view; every rank reports the same)."""
    by_world: dict[int, dict] = {}
    for layout, (world_size, extra) in LAYOUTS.items():
        argv = _with_model(BASE + extra)
        runs = by_world.setdefault(world_size, {})
        runs[(layout, "packed")] = argv
        runs[(layout, "padded")] = argv + ["--no-sft-packing"]
        if layout == "tp1":
            runs[(layout, "packed_mbs1")] = argv + ["--micro-batch-size", "1"]
    out: dict[str, dict] = {}
    for world_size, runs in by_world.items():  # one group of processes per world size
        for key, value in run_ranks(_train_worker, world_size, "cpu", runs, cache, timeout=900)[0].items():
            layout, mode = key.split("/")
            out.setdefault(layout, {})[mode] = value
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_packed_equals_padded(trained, layout):
    packed, padded = trained[layout]["packed"], trained[layout]["padded"]
    assert packed.shape == (ITERS, 2)
    assert packed[-1, 0] < packed[0, 0] - 0.5, "the loss must fall (else equal curves prove little)"
    np.testing.assert_allclose(packed[:, 0], padded[:, 0], rtol=0, atol=TOL)
    np.testing.assert_allclose(packed[:, 1], padded[:, 1], rtol=TOL, atol=0)


def test_micro_batch_count_does_not_change_loss_or_gradients(trained):
    four_of_two, eight_of_one = trained["tp1"]["packed"], trained["tp1"]["packed_mbs1"]
    np.testing.assert_allclose(four_of_two[:, 0], eight_of_one[:, 0], rtol=0, atol=TOL)
    np.testing.assert_allclose(four_of_two[:, 1], eight_of_one[:, 1], rtol=TOL, atol=0)


def _boundary_worker(rank, world_size, backend_name, cache: str):
    os.environ["MTMEGATRON_CACHE"] = cache
    import torch

    import mtmegatron
    from mtmegatron.sft.packing import packed_batch, padded_batch
    from mtmegatron.training.sft_step import packed_seq_params
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.training.setup import build, init_distributed

    backend = mtmegatron.activate(backend_name)
    args = parse_args(BASE, world_size=1)
    init_distributed(args, backend)
    model = build(args)[0][0]
    model.eval()
    rng = np.random.RandomState(0)

    def conversation(n):
        return rng.randint(1, 300, n + 1), np.ones(n + 1, bool)

    a, a_changed, b = conversation(20), conversation(13), conversation(25)

    def logits(batch):
        with torch.no_grad():
            out = model(batch["tokens"], batch["position_ids"], None, packed_seq_params=packed_seq_params(batch))
        return out[..., : args.vocab_size]  # the padded vocabulary's logits are -inf by design

    first = logits(packed_batch([[a, b]], 64, 0))[0]
    second = logits(packed_batch([[a_changed, b]], 64, 0))[0]
    alone = logits(padded_batch([[b]], 64, 0))[0]
    return {"b": first[20:45], "b_after_a_changed": second[13:38], "b_alone": alone[:25],
            "a": first[:13], "a_changed": second[:13], "greedy": _greedy(model, b[0][:21])}


def _greedy(model, prompt):
    """Greedy continuation of a 21-token prompt (not a multiple of 2 x CP: the CP path pads it)."""
    from mtmegatron.inference.recompute import greedy_tokens

    return greedy_tokens(model, [int(t) for t in prompt], 12, eod=0)


@pytest.fixture(scope="module")
def boundary(cache):
    """Logits (and a greedy decode) of the same model on one rank and under CP2."""
    return (run_ranks(_boundary_worker, 1, "cpu", cache, timeout=300)[0],
            run_ranks(_boundary_cp_worker, 2, "cpu", cache, timeout=300)[0])


def test_attention_never_crosses_a_conversation_boundary(boundary):
    out = boundary[0]
    assert np.abs(out["a"] - out["a_changed"]).max() > 1e-2  # the change reaches A's own logits
    np.testing.assert_allclose(out["b_after_a_changed"], out["b"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(out["b_alone"], out["b"], rtol=0, atol=1e-5)


def _boundary_cp_worker(rank, world_size, backend_name, cache: str):
    """The boundary check under CP2: logits of each rank's share, gathered back into packed-row order."""
    os.environ["MTMEGATRON_CACHE"] = cache
    import torch
    from megatron.core import parallel_state

    import mtmegatron
    from mtmegatron.attention.cp_batch import batch_on_this_cp_rank, thd_partition_index
    from mtmegatron.sft.packing import packed_batch, padded_batch
    from mtmegatron.training.sft_step import packed_seq_params
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.training.setup import build, init_distributed

    backend = mtmegatron.activate(backend_name)
    args = parse_args(BASE + ["--context-parallel-size", "2"], world_size=2)
    init_distributed(args, backend)
    model = build(args)[0][0]
    model.eval()
    group = parallel_state.get_context_parallel_group()
    rng = np.random.RandomState(0)

    def conversation(n):
        return rng.randint(1, 300, n + 1), np.ones(n + 1, bool)

    a, a_changed, b = conversation(20), conversation(13), conversation(25)

    def logits(batch):
        cu = batch.get("cu_seqlens_padded", torch.tensor([0, 64]))
        local = batch_on_this_cp_rank(batch)
        with torch.no_grad():
            out = model(local["tokens"], local["position_ids"], None, packed_seq_params=packed_seq_params(local))
        shares = [torch.empty_like(out) for _ in range(2)]
        torch.distributed.all_gather(shares, out.contiguous(), group=group)
        held = torch.cat([thd_partition_index(cu, 2, r) for r in range(2)])
        row = torch.empty(out.shape[0], len(held), out.shape[2], dtype=out.dtype)
        row[:, held] = torch.cat(shares, dim=1)
        return row[..., : args.vocab_size]

    first = logits(packed_batch([[a, b]], 64, 0, multiple=4))[0]  # A: 20 positions, B starts at 20
    second = logits(packed_batch([[a_changed, b]], 64, 0, multiple=4))[0]  # A: 13 -> 16, B starts at 16
    alone = logits(padded_batch([[b]], 64, 0))[0]
    return {"b": first[20:45], "b_after_a_changed": second[16:41], "b_alone": alone[:25],
            "a": first[:13], "a_changed": second[:13], "greedy": _greedy(model, b[0][:21])}


def test_attention_never_crosses_a_conversation_boundary_under_cp(boundary):
    one_rank, out = boundary
    assert np.abs(out["a"] - out["a_changed"]).max() > 1e-2
    np.testing.assert_allclose(out["b_after_a_changed"], out["b"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(out["b_alone"], out["b"], rtol=0, atol=1e-5)
    # the same weights (same seed), so the CP2 packed logits equal the one-rank ones
    np.testing.assert_allclose(out["b"], one_rank["b"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(out["a_changed"], one_rank["a_changed"], rtol=0, atol=1e-5)


def test_greedy_decoding_under_cp_equals_one_rank(boundary):
    """The held-out scoring's decode loop (inference/recompute.py) pads, splits and gathers under CP."""
    one_rank, cp2 = boundary
    assert len(one_rank["greedy"]) >= 4, one_rank["greedy"]  # else equal lists would prove little
    assert cp2["greedy"] == one_rank["greedy"]
