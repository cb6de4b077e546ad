"""torchrun entry used by test_fused_training.py: ``mtmegatron.pretrain`` plus counters that show the fused
ops ran (``--transformer-impl mtmegatron`` turns on apply_rope_fusion, and moe_permute_fusion /
moe_router_fusion with experts, in models/gpt.py; with ``--attention-backend local`` the fused softmax too): each rank writes them at exit to
$MTM_FUSED_CALLS_DIR/calls_rank<RANK>.json.
"""
import atexit
import json
import os
import sys

from mtmegatron import pretrain
import mtmegatron.ops
from mtmegatron.ops import moe, rope, router

CALLS = {"rope": 0, "moe_permute": 0, "moe_unpermute": 0, "router_topk": 0, "causal_softmax": 0}


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
_count(mtmegatron.ops, "scaled_upper_triang_masked_softmax", "causal_softmax")


def _write_calls():
    out = os.environ.get("MTM_FUSED_CALLS_DIR")
    if out:
        with open(os.path.join(out, f"calls_rank{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump(CALLS, f)


atexit.register(_write_calls)

if __name__ == "__main__":
    sys.exit(pretrain.main(sys.argv[1:]))
