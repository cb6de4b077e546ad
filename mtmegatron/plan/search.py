"""``mtmegatron plan --search``: the layouts of a pretrain command line that fit a device, fastest first.

Enumerates TP (within a node, dividing the attention heads and query groups), PP (dividing the layers), VPP (2, 4
or 8 virtual stages dividing the layers, micro-batches a multiple of PP), CP (1-8, the sequence divisible by 2 CP),
EP (dividing the experts), DP (the rest of the world), the micro-batch size (1-8, dividing the global batch per DP
rank), the distributed optimizer, recompute (none / selective ``core_attn`` / full uniform 1 layer), and optimizer
CPU offload (fraction 1, with the distributed optimizer, only where the same layout without it does not fit:
the host's Adam step is not timed); SP is on whenever TP > 1. Each layout's first and last
pipeline stages (the middle ones hold no more than the first) are predicted by plan/memory.py from
plan/layer_table.py (one meta build per TP x EP size, not per layout), and a layout is kept when its peak is within
``1 - MARGIN`` of the device (the margin stands for the allocator and the planner's measured shortfall, up to 17%
low on one VPP stage: docs/memory.md). The kept layouts are ranked by plan/step_time.py; from the fastest on each is
re-planned by the full path (``mtmegatron plan`` with its own command line: parse, every stage built) until five
fit there too, so every printed command line is one ``plan`` (and so ``pretrain``) accepts.
The search owns the layout flags (``OWNED``): any of them in the given command line is replaced.
May assume: the planner flags passed config/plan_flags.check_plan_args with ``--search`` and ``--device``.
"""

from __future__ import annotations

import dataclasses
import itertools
import shlex
import time
import types

from mtmegatron.utils.errors import ConfigError

MARGIN = 0.10
TOP = 5
OWNED = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
         "--num-virtual-stages-per-pipeline-rank", "--context-parallel-size", "--expert-model-parallel-size",
         "--expert-tensor-parallel-size", "--micro-batch-size", "--sequence-parallel", "--use-distributed-optimizer",
         "--recompute-activations", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
         "--recompute-modules", "--optimizer-cpu-offload", "--optimizer-offload-fraction",
         "--use-precision-aware-optimizer", "--decoder-first-pipeline-num-layers",
         "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
         "--account-for-loss-in-pipeline-split", "--pipeline-model-parallel-layout")


@dataclasses.dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    dp: int
    mbs: int
    distributed_optimizer: bool
    recompute: str  # none | selective | full
    offload: bool

    def flags(self) -> list[str]:
        f = ["--tensor-model-parallel-size", str(self.tp), "--pipeline-model-parallel-size", str(self.pp)]
        if self.vpp:
            f += ["--num-virtual-stages-per-pipeline-rank", str(self.vpp)]
        f += ["--context-parallel-size", str(self.cp), "--expert-model-parallel-size", str(self.ep),
              "--micro-batch-size", str(self.mbs)]
        f += ["--sequence-parallel"] if self.tp > 1 else []
        f += ["--use-distributed-optimizer"] if self.distributed_optimizer else []
        f += {"none": [], "selective": ["--recompute-activations"],
              "full": ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers",
                       "1"]}[self.recompute]
        f += ["--use-precision-aware-optimizer", "--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"] \
            if self.offload else []
        return f

    def describe(self) -> str:
        return (f"TP {self.tp} x PP {self.pp}{f' (VPP {self.vpp})' if self.vpp else ''} x CP {self.cp} x DP {self.dp}"
                f", EP {self.ep} | micro-batch {self.mbs} | "
                + ", ".join(x for x in ("distributed optimizer" if self.distributed_optimizer else "",
                                        f"{self.recompute} recompute" if self.recompute != "none" else "no recompute",
                                        "optimizer CPU offload" if self.offload else "") if x))


def strip_owned(argv: list[str]) -> list[str]:
    """``argv`` without the layout flags (and their values) the search sets itself."""
    from mtmegatron.config.arguments import build_parser

    actions = build_parser()._option_string_actions
    out, i = [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        action = actions.get(name)
        if name not in OWNED or action is None:
            out.append(argv[i])
            i += 1
            continue
        i += 1
        if "=" in argv[i - 1] or action.nargs == 0:
            continue
        if action.nargs in ("+", "*"):
            while i < len(argv) and not argv[i].startswith("--"):
                i += 1
        else:
            i += 1
    return out


def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (limit is None or d <= limit)]


def layouts(args, world: int, per_node: int):
    """Every layout of ``world`` devices the model's shape allows (before memory)."""
    L, heads, B = args.num_layers, args.num_attention_heads, args.global_batch_size
    groups = args.num_query_groups if args.group_query_attention else heads
    experts = args.num_experts or 0
    for tp in _divisors(world, per_node):
        if heads % tp or groups % tp:
            continue
        for pp in _divisors(world // tp):
            if L % pp:
                continue
            for cp in (1, 2, 4, 8):  # CP's ring attention has no dropout (config/attention_flags.py's rule)
                if (world // tp // pp) % cp or (cp > 1 and (args.seq_length % (2 * cp) or args.attention_dropout)):
                    continue
                dp = world // (tp * pp * cp)
                for ep in (_divisors(experts) if experts else [1]):
                    if world % (ep * tp * pp):
                        continue
                    for vpp in [None] + [v for v in (2, 4, 8) if pp > 1 and L % (pp * v) == 0]:
                        for mbs in (1, 2, 4, 8):
                            if B % (mbs * dp) or (vpp and (B // (mbs * dp)) % pp):
                                continue
                            for dist, recompute, offload in itertools.product(
                                    (True, False), ("none", "selective", "full"), (False, True)):
                                if offload and not dist:
                                    continue
                                yield Layout(tp, pp, vpp, cp, ep, dp, mbs, dist, recompute, offload)


def layout_args(base, layout: Layout, world: int, global_batch: int):
    """A copy of the TP x EP table's arguments with ``layout``'s sizes (what config.parse would resolve)."""
    a = types.SimpleNamespace(**vars(base))  # a plain namespace: thousands of layouts, cheap to copy
    a.world_size, a.global_batch_size = world, global_batch
    a.pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size = layout.pp, layout.vpp
    a.num_layers_per_virtual_pipeline_stage = base.num_layers // (layout.pp * layout.vpp) if layout.vpp else None
    a.context_parallel_size, a.data_parallel_size, a.micro_batch_size = layout.cp, layout.dp, layout.mbs
    a.num_microbatches = global_batch // (layout.mbs * layout.dp)
    a.sequence_parallel = layout.tp > 1
    a.use_distributed_optimizer = layout.distributed_optimizer
    a.recompute_granularity = None if layout.recompute == "none" else layout.recompute
    a.recompute_method, a.recompute_num_layers = ("uniform", 1) if layout.recompute == "full" else (None, None)
    a.recompute_modules = None
    a.optimizer_cpu_offload = a.use_precision_aware_optimizer = layout.offload
    a.optimizer_offload_fraction = 1.0
    return a


def _table_args(argv: list[str], tp: int, ep: int):
    from mtmegatron.config import parse

    flags = ["--tensor-model-parallel-size", str(tp), "--expert-model-parallel-size", str(ep), "--micro-batch-size",
             "1", "--global-batch-size", str(ep)] + (["--sequence-parallel"] if tp > 1 else [])
    return parse([*argv, *flags], world_size=tp * ep).args


def search(own, argv: list[str], plan_one) -> dict:
    """The search's result: the top layouts, each re-planned by ``plan_one(own, pretrain argv)`` (command.plan_layout)."""
    from mtmegatron.config import parse
    from mtmegatron.plan.devices import known_devices, known_links
    from mtmegatron.plan.layer_table import layer_table
    from mtmegatron.plan.memory import rank_memory
    from mtmegatron.plan.params import cpu_backend_unless_active
    from mtmegatron.plan.rank_state import Layout as RankLayout
    from mtmegatron.plan.step_time import step_seconds

    start = time.perf_counter()
    device = known_devices()[own.device.lower()]
    links = known_links()
    memory = device.memory_bytes
    if own.device_memory:
        from mtmegatron.config.plan_flags import memory_bytes

        memory = memory_bytes(own.device_memory)
    world, rest = own.world_size, strip_owned(argv)
    base = parse([*rest, "--micro-batch-size", "1"], world_size=1).args  # the model and batch as given (refused
    # here as pretrain refuses them)
    tables: dict[tuple[int, int], tuple] = {}
    kept, enumerated, smallest, fits_on_device = [], 0, None, set()
    with cpu_backend_unless_active():
        for layout in layouts(base, world, device.per_node):
            enumerated += 1
            if layout.offload and dataclasses.replace(layout, offload=False) in fits_on_device:
                continue  # offload only where the optimizer state must leave the device (the host step is not timed)
            key = (layout.tp, layout.ep)
            if key not in tables:
                targs = _table_args(rest, *key)
                tables[key] = (targs, layer_table(targs))
            targs, table = tables[key]
            a = layout_args(targs, layout, world, base.global_batch_size)
            rl = RankLayout.of(a)
            stages = {table.stage(layout.pp, layout.vpp, p) for p in (0, layout.pp - 1)}
            peak = max(rank_memory(a, s, rl).peak for s in stages)
            smallest = peak if smallest is None else min(smallest, peak)
            if peak <= (1 - MARGIN) * memory:
                fits_on_device.add(layout)
                first = table.stage(layout.pp, layout.vpp, 0)
                kept.append((step_seconds(a, table, first, device, links), peak, layout))
    searched = time.perf_counter() - start
    if not kept:
        low = "-" if smallest is None else f"{smallest / 2**30:.2f} GiB"
        raise ConfigError(f"--world-size {world}: no layout fits {memory / 2**30:.2f} GiB per device within "
                          f"{MARGIN:.0%} ({enumerated} layouts of TP, PP, VPP, CP, EP, micro-batch, distributed "
                          f"optimizer, recompute and optimizer offload searched; the smallest peak is {low})")
    kept.sort(key=lambda k: (k[0]["total"], k[1]))
    top = []
    for times, peak, layout in kept:
        pretrain_argv = [*rest, *layout.flags()]
        try:
            exact = plan_one(own, pretrain_argv)
        except ConfigError:
            continue  # a rule the enumeration does not know: the next layout
        if exact["fits"] and max(r["peak_bytes"] for r in exact["ranks"]) <= (1 - MARGIN) * memory:
            nodes = max(world // device.per_node, 1)
            top.append({"layout": dataclasses.asdict(layout), "describe": layout.describe(),
                        "step_seconds": times, "tokens_per_s": base.global_batch_size * base.seq_length
                        / times["total"], "peak_bytes": max(r["peak_bytes"] for r in exact["ranks"]),
                        "argv": pretrain_argv,
                        "command": f"torchrun --nnodes {nodes} --nproc-per-node {min(world, device.per_node)} "
                                   f"-m mtmegatron.pretrain {shlex.join(pretrain_argv)}",
                        "plan": exact})
        if len(top) == TOP:
            break
    return {"search": True, "world_size": world, "model": base.model, "device": device.description,
            "device_memory_bytes": memory, "margin": MARGIN, "enumerated": enumerated, "fit": len(kept),
            "search_seconds": searched, "seconds": time.perf_counter() - start, "layouts": top,
            "assumptions": f"model FLOPs at {device.efficiency:.0%} of {device.bf16_flops / 1e12:.0f} TFLOPS "
                           f"(plan/devices.tsv); links {device.intra_link} within a node of {device.per_node}, "
                           f"{device.inter_link} between nodes, {device.host_link} to the host (plan/links.tsv); "
                           "no overlap, no latency"}


def render(result: dict) -> str:
    lines = [f"mtmegatron plan --search: {result['model']} | world {result['world_size']} x {result['device']} "
             f"({result['device_memory_bytes'] / 2**30:.2f} GiB) | {result['enumerated']} layouts, {result['fit']} "
             f"within {result['margin']:.0%} of the memory ({result['search_seconds']:.1f} s), ranked by step time: "
             f"{result['assumptions']}"]
    for i, top in enumerate(result["layouts"], 1):
        t = top["step_seconds"]
        parts = ", ".join(f"{k} {v:.3g}" for k, v in t.items() if k != "total" and v)
        lines.append(f"{i}. {top['describe']}: step {t['total']:.3g} s ({parts}), "
                     f"{top['tokens_per_s']:,.0f} tokens/s, peak {top['peak_bytes'] / 2**30:.2f} GiB")
        lines.append(f"   {top['command']}")
    return "\n".join(lines)
