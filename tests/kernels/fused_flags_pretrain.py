"""torchrun entry used by test_fused_training.py: ``mtmegatron.pretrain`` with megatron-core's fusion flags
turned on for ``--transformer-impl mtmegatron`` (apply_rope_fusion; moe_permute_fusion and moe_router_fusion
with experts), i.e. what models/gpt.py::transformer_config is asked to set, plus counters that show the fused
ops ran: each rank writes them at exit to $MTM_FUSED_CALLS_DIR/calls_rank<RANK>.json.
"""
import atexit
import dataclasses
import json
import os
import sys

from mtmegatron import pretrain
from mtmegatron.ops import moe, rope, router
from mtmegatron.training import setup

CALLS = {"rope": 0, "moe_permute": 0, "moe_unpermute": 0, "router_topk": 0}


def _count(module, attr, key):
    inner = getattr(module, attr)

    def wrapper(*args, **kwargs):
        CALLS[key] += 1
        return inner(*args, **kwargs)

    setattr(module, attr, wrapper)


_count(rope, "rope_op", "rope")
_count(moe, "moe_permute_op", "moe_permute")
_count(moe, "moe_unpermute_op", "moe_unpermute")
_count(router, "topk_routing_with_score_function", "router_topk")

_transformer_config = setup.transformer_config


def transformer_config(args):
    config = _transformer_config(args)
    if args.transformer_impl != "mtmegatron":
        return config
    fields = {"apply_rope_fusion": args.position_embedding_type == "rope"}
    if args.num_experts:
        fields.update(moe_permute_fusion=True, moe_router_fusion=True)
    return dataclasses.replace(config, **fields)


setup.transformer_config = transformer_config


def _write_calls():
    out = os.environ.get("MTM_FUSED_CALLS_DIR")
    if out:
        with open(os.path.join(out, f"calls_rank{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump(CALLS, f)


atexit.register(_write_calls)

if __name__ == "__main__":
    sys.exit(pretrain.main(sys.argv[1:]))
