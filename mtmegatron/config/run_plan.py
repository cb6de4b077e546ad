"""What this run will do (family, layer implementation, TE layers, FP8 executor, attention kernel, fusions, init
placement), decided once from the validated flags and the active backend; ``lines`` are the start-up lines saying so.
May assume: for ``plan_run``, pretrain.prepare activated the backend and resolved the FP8 executor (it stores the plan
as ``args.run_plan``, then freezes args)."""

from __future__ import annotations

import dataclasses

from mtmegatron.attention.spec import core_attention_choice
from mtmegatron.backends.active import active_backend
from mtmegatron.models import families, fusions, initialization
from mtmegatron.models.families.qwen2_vl import stage_balance as vision_stage_balance
from mtmegatron.models.section import Initialization


@dataclasses.dataclass(frozen=True)
class RunPlan:
    family: str
    transformer_impl: str
    transformer_engine_layers: bool
    fp8_executor: str | None
    attention_kernel: str  # attention/spec.KINDS
    fusions: tuple[str, ...]  # the fusions that run (models/fusions.py)
    host_initialization: bool
    lines: tuple[str, ...]


def startup_lines(args) -> list[str]:
    """The preset (or the demo), each value differing from Megatron-LM's default and its source, the layers used."""
    if args.preset_name is None:
        lines = ["mtmegatron: no --model preset: every value not given is Megatron-LM's default"]
    elif "model" in args.given_flags or "model_size" in args.given_flags:
        lines = [f"mtmegatron: preset --model {args.model} --model-size {args.model_size} fills every value not given"]
    else:
        lines = [f"mtmegatron: no model flags: the demo (--model {args.model} --model-size {args.model_size})"]
    if args.megatron_differences:
        lines.append("mtmegatron: differs from Megatron-LM's defaults: " + ", ".join(args.megatron_differences))
    lines += [f"mtmegatron: {note}" for note in (args.impl_note, args.activation_offload_note,
                                                      args.fsdp_offload_note) if note]
    if args.sequence_parallel_at_tp1:
        lines.append("mtmegatron: --sequence-parallel has no effect at TP 1 (sequence parallelism splits the "
                     "tensor-parallel group's activations): off, as Megatron-LM turns it off")
    from mtmegatron.models.gpt import p2p_overlap_runs  # megatron-core: lazy

    if args.overlap_p2p_comm and not p2p_overlap_runs(args):
        lines.append("mtmegatron: p2p overlap of the interleaved schedule (Megatron-LM's default) is off over gloo: "
                     "it corrupts the gradients there; --no-overlap-p2p-communication is implied")
    split = vision_stage_balance.describe(args) if families.of(args).vision_encoder == "packed" else None
    if split:
        lines.append(f"mtmegatron: {split}")
    return lines + [fusions.describe(args), initialization.describe(Initialization.of(args))]


def plan_run(args) -> RunPlan:
    from mtmegatron.fp8 import spec as fp8_spec
    from mtmegatron.models.gpt import layer_choice  # megatron-core's spec modules: lazy
    from mtmegatron.models.layer_spec import describe_layer_spec
    from mtmegatron.ops import native

    choice = layer_choice(args)
    fp8_line = [fp8_spec.describe(choice.fp8, choice.fp8_executor, args.fp8_executor_note)] if args.fp8_format else []
    lines = ([f"mtmegatron: {native.status(active_backend().device_type)}"] + startup_lines(args)
             + [describe_layer_spec(choice)] + fp8_line)
    return RunPlan(family=args.model, transformer_impl=args.transformer_impl,
                   transformer_engine_layers=args.transformer_engine_layers,
                   fp8_executor=choice.fp8_executor,
                   attention_kernel=core_attention_choice(args.attention_backend, args.transformer_impl,
                                                          args.transformer_engine_layers)[0],
                   fusions=tuple(name for name, (on, _) in fusions.decide(args).items() if on),
                   host_initialization=initialization.host_initialization(Initialization.of(args)),
                   lines=tuple(lines))
