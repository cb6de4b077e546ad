"""The group-limited top-k of DeepSeek-style sigmoid routers (DeepSeek-V3, GLM-4.5) from an HF config.json:
``n_group`` groups of experts, the best ``topk_group`` chosen, then ``num_experts_per_tok`` experts among them.
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import mtmegatron.models.families.gpt as gpt


def group_limited_flags(config: dict) -> list[str]:
    """``--moe-router-num-groups/--moe-router-group-topk`` (0 = off, explicit so no preset leaks in); a
    ConversionError where megatron would choose the groups differently from HF."""
    topk = config["num_experts_per_tok"]
    groups, group_topk = config.get("n_group") or 1, config.get("topk_group") or 1
    if groups == 1:
        return ["--moe-router-num-groups", "0", "--moe-router-group-topk", "0"]
    gpt.require(topk % group_topk == 0 and topk // group_topk == 2,
                f"config.json fields n_group/topk_group = {groups}/{group_topk}: HF scores a group by its top-2 "
                f"experts, megatron by its top num_experts_per_tok/topk_group = {topk}/{group_topk}; these differ")
    return ["--moe-router-num-groups", str(groups), "--moe-router-group-topk", str(group_topk)]
