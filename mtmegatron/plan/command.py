"""``mtmegatron plan --world-size N [--device NAME | --device-memory SIZE] [--json] [pretrain flags]``.

Parses the pretrain command line exactly as training does (``mtmegatron.config.parse`` with the world size, then
megatron-core's config assertions, as ``pretrain.prepare``), builds each pipeline stage on the meta device
(plan/params.py), and prints one row per distinct rank (the first rank of each pipeline stage: every TP, CP, DP and
EP rank of a stage holds the same bytes) with weights, gradients, optimizer state, activations, buffers, the peak and
the headroom to the device, then Megatron-LM's formula for the same flags. ``--search`` (plan/search.py) instead
lists the five fastest layouts that fit, each with its command line. ``--json``: one object,
``{"params_total": int, "ranks": [{"rank": int, "peak_bytes": int, ...}], ...}``. A bad input (a layout that does
not divide, an unknown device, a command pretrain refuses) is one line ``mtmegatron plan: error: <pretrain's
message>`` and exit status 2. A layout that does not fit is reported (negative headroom, "does not fit"), status 0.
May assume: run as a console command (one process, no launcher).
"""

from __future__ import annotations

import argparse
import json
import sys

from mtmegatron.config.flag_help import Parser
from mtmegatron.config.plan_flags import add_plan_args, check_plan_args
from mtmegatron.utils.errors import ConfigError

GIB = 2**30
PROG = "mtmegatron plan"


def build_parser() -> argparse.ArgumentParser:
    """The planner's own flags; a mistake in them is a ConfigError (one line, the pretrain parser's rule)."""
    return add_plan_args(Parser(prog=PROG, description="Per-rank device memory of a pretrain command line, "
                                "predicted from its model built on the meta device (docs/memory.md)."))


def plan(argv: list[str]) -> dict:
    """The plan of ``argv`` (planner flags + pretrain flags) as the JSON-ready dict; ConfigError on bad input.
    With ``--search``: the layouts that fit, fastest first (plan/search.py), each re-planned here."""
    own, rest = build_parser().parse_known_args(argv)
    check_plan_args(own)
    if own.search:
        from mtmegatron.plan.search import search

        return search(own, rest, plan_layout)
    return plan_layout(own, rest)


def plan_layout(own, rest: list[str]) -> dict:
    """The plan of one layout: ``own`` the planner's parsed flags, ``rest`` the pretrain command line."""
    from mtmegatron.config import megatron_core_checks
    from mtmegatron.config import parse as parse_run_config
    from mtmegatron.plan.devices import device_memory
    from mtmegatron.plan.memory import megatron_lm_formula, not_modelled, rank_memory
    from mtmegatron.plan.params import all_stages, cpu_backend_unless_active
    from mtmegatron.plan.rank_state import Layout

    memory, device = device_memory(own)
    cfg = parse_run_config(rest, world_size=own.world_size)
    args = cfg.args
    with cpu_backend_unless_active():
        megatron_core_checks.check_configs(args)
        stages = all_stages(args)
    layout = Layout.of(args)
    ranks_per_stage = layout.tp * layout.cp * (1 if args.use_tp_pp_dp_mapping else layout.dp)
    rows = []
    for stage in stages:
        mem = rank_memory(args, stage, layout)
        rows.append({"rank": stage.stage * ranks_per_stage, "stage": stage.stage, "params": mem.params,
                     "weights_bytes": mem.weights, "gradients_bytes": mem.gradients,
                     "optimizer_bytes": mem.optimizer, "optimizer_host_bytes": mem.optimizer_host,
                     "activations_bytes": mem.activations, "buffers_bytes": mem.buffers, "peak_bytes": mem.peak,
                     "in_flight_microbatches": mem.in_flight,
                     "headroom_bytes": None if memory is None else memory - mem.peak})
    return {"params_total": sum(s.model_share(layout) for s in stages), "world_size": layout.world,
            "model": args.model,
            "layout": {"tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp, "dp": layout.dp,
                       "ep": layout.ep, "expert_tp": layout.etp},
            "micro_batches": args.num_microbatches, "micro_batch_size": args.micro_batch_size,
            "device": device, "device_memory_bytes": memory, "ranks": rows,
            "fits": None if memory is None else all(r["headroom_bytes"] >= 0 for r in rows),
            "megatron_lm_formula_bytes": {k: int(v) for k, v in megatron_lm_formula(args, layout).items()},
            "not_modelled": not_modelled(args)}


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def render(result: dict) -> str:
    lay = result["layout"]
    head = (f"mtmegatron plan: {result['model']} {result['params_total']:,} params | world {result['world_size']} = "
            f"TP {lay['tp']} x PP {lay['pp']}{' (VPP ' + str(lay['vpp']) + ')' if lay['vpp'] else ''} x CP "
            f"{lay['cp']} x DP {lay['dp']}, EP {lay['ep']} | {result['micro_batches']} micro-batches of "
            f"{result['micro_batch_size']}")
    if result["device"]:
        head += f" | {result['device']}: {_gib(result['device_memory_bytes'])} GiB"
    cols = ("rank", "stage", "params", "weights", "gradients", "optimizer", "activations", "buffers", "peak",
            "headroom")
    lines = [head, "GiB per rank (every TP/CP/DP/EP rank of a stage alike; activations: in-flight micro-batches):",
             "  ".join(f"{c:>11s}" for c in cols)]
    for r in result["ranks"]:
        values = (str(r["rank"]), str(r["stage"]), f"{r['params'] / 1e6:.2f}M", _gib(r["weights_bytes"]),
                  _gib(r["gradients_bytes"]), _gib(r["optimizer_bytes"]),
                  f"{_gib(r['activations_bytes'])} x{r['in_flight_microbatches']}", _gib(r["buffers_bytes"]),
                  _gib(r["peak_bytes"]), _gib(r["headroom_bytes"]))
        lines.append("  ".join(f"{v:>11s}" for v in values))
        if r["optimizer_host_bytes"]:
            lines.append(f"{'':>11s}  optimizer on the host (--optimizer-cpu-offload): "
                         f"{_gib(r['optimizer_host_bytes'])} GiB")
    f = result["megatron_lm_formula_bytes"]
    lines.append(f"Megatron-LM's formula (most loaded rank): weights+optimizer {_gib(f['weights_and_optimizer'])}, "
                 f"activations {_gib(f['activations'])}, total {_gib(f['total'])} GiB")
    if result["fits"] is not None:
        worst = min(result["ranks"], key=lambda r: r["headroom_bytes"])
        lines.append("fits: every rank's peak is below the device memory" if result["fits"] else
                     f"does not fit: rank {worst['rank']} needs {_gib(worst['peak_bytes'])} GiB")
    lines.append("not modelled: " + "; ".join(result["not_modelled"]))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from mtmegatron.backends import BackendUnavailableError

    try:
        result = plan(argv)
    except (ConfigError, BackendUnavailableError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return 2
    as_json = build_parser().parse_known_args(argv)[0].json
    if result.get("search"):
        from mtmegatron.plan.search import render as render_search

        print(json.dumps(result) if as_json else render_search(result), flush=True)
        return 0
    print(json.dumps(result) if as_json else render(result), flush=True)
    return 0
