"""One-rank CPU worker of tests/checkpoint_interop (run as a script; prints one JSON line).

``finetune FIXTURE``: our ``--finetune --load FIXTURE`` in-process: the iteration it returns, the largest
difference between every loaded weight and the tensor stored in the fixture (read plainly with megatron-core's
``load_plain_tensors``), and whether any optimizer state was loaded.

``megatron-lm-reader CKPT ITERATION``: read a checkpoint mtmegatron wrote the way Megatron-LM core_v0.16.1's
``load_checkpoint`` (torch_dist branch) reads it — tracker or ``--ckpt-step``; common state; its Namespace checks
(``check_checkpoint_args``, the TP/PP sizes, ``no_save_optim``/``no_save_rng``, ``consumed_train_samples``);
the content metadata; a state-dict template built as its ``generate_state_dict`` builds it (model, optimizer
with the loaded metadata and ``is_loading``, the RNG object only when TP/PP match); ``dist_checkpointing.load``;
then model, optimizer and ``opt_param_scheduler`` restored — and takes one training step on the next global
batch, returning its loss.

May assume: tests/ on the PYTHONPATH (the test starts it with helpers.child_path) for ``helpers``.
"""

from __future__ import annotations

import argparse
import json
import sys

from helpers.megatron_lm_fixture import FIXTURE_FLAGS


def _setup(extra: list[str]):
    from mtmegatron.convert.model import init_single_rank
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.training.setup import build

    args = parse_args(FIXTURE_FLAGS + extra, world_size=1)
    init_single_rank(args)
    model, optimizer, scheduler, _ = build(args)
    return args, model, optimizer, scheduler


def finetune(fixture: str) -> dict:
    from megatron.core import dist_checkpointing

    from mtmegatron.training.checkpoint import checkpointing
    from mtmegatron.utils import checkpoint_dirs

    args, model, optimizer, scheduler = _setup(["--finetune", "--load", fixture])
    iteration = checkpointing.load(fixture, model, optimizer, scheduler, args)
    stored = dist_checkpointing.load_plain_tensors(checkpoint_dirs.checkpoint_dir(fixture, 3))
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    differences = {}
    for sharded in nested_values(checkpointing._unwrap(model[0]).sharded_state_dict()):
        if isinstance(sharded, ShardedTensor):  # one rank holds every shard: compare it with its global slice
            saved = stored[sharded.key][sharded.global_slice()]
            differences[f"{sharded.key}{sharded.global_offset}"] = float((saved - sharded.data).abs().max())
    state = optimizer.chained_optimizers[0].optimizer.state if hasattr(optimizer, "chained_optimizers") else {}
    return {"iteration": iteration, "max_weight_difference": max(differences.values()), "weights": len(differences),
            "optimizer_state_entries": len(state), "scheduler_steps": scheduler.num_steps}


def megatron_lm_reader(checkpoint: str, ckpt_step: int) -> dict:
    import argparse as ap
    import os

    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    from mtmegatron.data.section import GptData
    from mtmegatron.training.data import TextReader, build_mock_dataset
    from mtmegatron.training.train_step import StepValues, train_step

    args, model, optimizer, scheduler = _setup([])
    # the tracker names the newest save; --ckpt-step picks another (Megatron-LM's _load_base_checkpoint)
    with open(os.path.join(checkpoint, "latest_checkpointed_iteration.txt")) as f:
        tracked = int(f.read().strip())
    directory = os.path.join(checkpoint, f"iter_{ckpt_step:07d}")
    common = dist_checkpointing.load_common_state_dict(directory)
    ckpt_args = common["args"]
    assert isinstance(ckpt_args, ap.Namespace), type(ckpt_args)
    assert common["checkpoint_version"] >= 3.0 and common["iteration"] == ckpt_step
    # check_checkpoint_args against the Megatron-LM args of the fixture's model (its unconditional comparisons;
    # the vocabulary ones need --vocab-file, TP/PP ones are skipped for dist checkpoints) + the embedding rows
    fixture_ns = dist_checkpointing.load_common_state_dict(
        os.path.join(os.path.dirname(__file__), "..", "fixtures", "megatron_lm_ckpt", "iter_0000003"))["args"]
    for name in ("num_layers", "hidden_size", "num_attention_heads", "add_position_embedding", "padded_vocab_size"):
        assert getattr(ckpt_args, name) == getattr(fixture_ns, name), (name, getattr(ckpt_args, name))
    ckpt_tp_pp = (ckpt_args.tensor_model_parallel_size, ckpt_args.pipeline_model_parallel_size)
    run_tp_pp = (parallel_state.get_tensor_model_parallel_world_size(),
                 parallel_state.get_pipeline_model_parallel_world_size())
    load_rng = ckpt_tp_pp == run_tp_pp and not getattr(ckpt_args, "no_save_rng", False)
    assert not getattr(ckpt_args, "no_save_optim", False)
    metadata = dist_checkpointing.load_content_metadata(preloaded_state_dict=common)
    assert metadata["distrib_optim_sharding_type"] == "fully_reshardable", metadata  # loads under TP/PP changes
    metadata = {**metadata, "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    gpt = model[0].module
    template = {"model": gpt.sharded_state_dict(metadata=metadata)}
    for inner in optimizer.chained_optimizers:  # torch Adam has no state before its first step (see fixture script)
        if not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()
    template["optimizer"] = optimizer.sharded_state_dict(template, is_loading=True, metadata=metadata)
    if load_rng:
        template["rng_state"] = ShardedObject("rng_state", [{}], ckpt_tp_pp, (0, 0), replica_id=0)
    loaded = dist_checkpointing.load(template, directory, None, strict="assume_ok_unexpected")
    gpt.load_state_dict(loaded["model"], strict=True)
    optimizer.load_state_dict(loaded["optimizer"])
    scheduler.load_state_dict(loaded["opt_param_scheduler"])
    rng_keys = sorted(loaded["rng_state"][0]) if load_rng else []
    consumed = ckpt_args.consumed_train_samples  # Megatron-LM's sampler resumes at this sample
    assert consumed == ckpt_step * args.global_batch_size, consumed
    dataset = build_mock_dataset(GptData.of(args), (args.train_iters + 1) * args.global_batch_size)
    iterators = [TextReader.of(args, 1)(dataset, 0, consumed // args.global_batch_size)]
    stats = train_step(iterators, model, optimizer, scheduler, StepValues.of(args), ckpt_step + 1)
    return {"tracked": tracked, "loss": stats["loss"], "ckpt_tp_pp": list(ckpt_tp_pp), "rng_loaded": load_rng,
            "rng_keys": rng_keys, "scheduler_steps": scheduler.num_steps, "world_size": ckpt_args.world_size}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["finetune", "megatron-lm-reader"])
    parser.add_argument("path")
    parser.add_argument("iteration", type=int, nargs="?")
    options = parser.parse_args()
    result = finetune(options.path) if options.mode == "finetune" else megatron_lm_reader(options.path,
                                                                                          options.iteration)
    print("RESULT " + json.dumps(result), flush=True)
    sys.exit(0)
