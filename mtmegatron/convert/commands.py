"""``mtmegatron convert hf-to-mcore`` and ``mtmegatron convert mcore-to-hf``.

hf-to-mcore: HF config -> our flags (the family registry, models/families/; + convert/llava.py for LLaVA), the target layout validated with
the pretrain flag checks, then convert/streaming.py streams every tensor (mapping.mcore_sources; the model only
on the meta device) into a model-only distributed checkpoint plus ``model_flags.txt`` (the flags to pass to
pretrain next to ``--load``).
mcore-to-hf: the flags stored in the checkpoint (its ``model_flags``, else its model fingerprint, else those given
after ``--``) describe the model; convert/streaming_export.py streams the weights (resharded from whatever layout
wrote them, the vocabulary padding left out) into HF safetensors + config.json (RoPE row layout as recorded at
conversion).
LLaVA (convert/llava.py) also writes ``hf_unused_vision.safetensors`` beside the checkpoint: the CLIP layers after
HF's feature layer and ``post_layernorm``, which LLaVA never reads, kept so that the way back is bit-exact.
Qwen2-VL / Qwen2.5-VL: every vision field is a flag (models/families/qwen2_vl/flags.py); the text config's
bos/eos/pad token ids, which no flag holds, are recorded in the checkpoint (``hf_layout``) and written back.
A damaged input file is one line naming it (hf_io.py: a safetensors file; streaming_export.py: a ``.distcp`` file).
May assume: run as a plain single process (it creates a one-rank gloo group).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

import torch

from mtmegatron.config.convert_flags import add_convert_args
from mtmegatron.convert.hf_io import HFCheckpoint
from mtmegatron.models import families
from mtmegatron.models.families import ConversionError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_LAYOUT = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size")


def validate_layout(flags: list[str], tp: int, pp: int, ep: int) -> None:
    """The pretrain flag checks for the layout the checkpoint is meant for (it loads under any layout)."""
    from mtmegatron.convert.model import parse_flags
    from mtmegatron.utils.errors import ConfigError

    layout = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
              "--expert-model-parallel-size", str(ep), "--global-batch-size", str(tp * pp * ep),
              "--micro-batch-size", "1"]
    try:
        parse_flags(flags + layout, world_size=tp * pp * ep)
    except ConfigError as e:
        raise ConversionError(f"target layout TP{tp} PP{pp} EP{ep}: {e}") from None


def hf_to_mcore(hf_dir: str, out: str, model_name: str, tp: int = 1, pp: int = 1, ep: int = 1, workers: int = 1,
                dtype: torch.dtype | None = None, peft_in: str | None = None) -> list[str]:
    """Convert; returns the model flags a pretrain run needs next to ``--load out``. Streams (convert/streaming.py:
    ``workers`` processes, the source dtype kept unless ``dtype``); LLaVA's carried tower tensors are written
    beside the checkpoint before it is marked complete (convert/llava.py). ``peft_in``: convert that HF PEFT
    adapter over ``hf_dir``'s model instead, as LoRA adapters for ``--lora-load`` (convert/lora_peft.py)."""
    hf = HFCheckpoint(hf_dir)  # names and config only here (LLaVA's stored tied head: compared, then dropped)
    config = hf.config()
    family = families.for_hf_config(config, model_name).name
    rope_interleave = config.get("rope_interleave", True)
    hf_layout, extra = {"rope_interleave": rope_interleave}, {}
    try:
        if families.get(family).is_multimodal:  # the vision tower's key layout and carried layers (convert/llava.py)
            from mtmegatron.convert import llava

            flags, plan = llava.flags_from_hf(config, hf.names)
            hf_layout[family] = llava.dumps_record(plan)
            extra = {"unmapped": llava.unmapped_names(hf, plan),
                     "before_marker": lambda staging: llava.write_carried(staging, hf_dir, plan)}
        else:
            flags = families.get(family).flags_from_hf(config, names=hf.names, source=hf_dir)
        if families.get(family).vision_encoder == "packed":  # bos/eos/pad ids: written back on export
            from mtmegatron.models.families.qwen2_vl import carried_text_fields

            hf_layout[family] = carried_text_fields(config)
    except KeyError as e:
        raise ConversionError(f"{os.path.join(hf_dir, 'config.json')}: no field {e.args[0]!r}, which a "
                              f"{config.get('model_type')} config has") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, ConversionError):
            raise
        raise ConversionError(f"{os.path.join(hf_dir, 'config.json')}: a field of the wrong type or value "
                              f"({e})") from None
    validate_layout(flags, tp, pp, ep)
    if peft_in:
        from mtmegatron.convert.lora_peft import import_peft

        if families.get(family).is_multimodal:
            raise ConversionError("--peft-in: adapters of text models only")
        import_peft(hf_dir, peft_in, out, family, flags, rope_interleave)
        return flags
    from mtmegatron.convert import streaming

    streaming.convert(hf_dir, out, family, flags, rope_interleave, hf_layout, workers=workers, dtype=dtype, **extra)
    return flags


def mcore_to_hf(load: str, out: str, flags: list[str] | None = None, rope_interleave: bool | None = None,
                image_token_id: int | None = None, workers: int = 1, dtype: torch.dtype | None = None,
                max_shard_bytes: int = 5 * 2**30, lora_load: str | None = None, peft_out: str | None = None) -> dict:
    """Write the checkpoint under ``load`` as an HF checkpoint in ``out``; returns the HF config. The RoPE row
    layout is the one the checkpoint was converted from (recorded by hf-to-mcore), else DeepSeek's. Streams
    (convert/streaming_export.py: ``workers`` processes, the stored dtype kept unless ``dtype``). LLaVA: the HF
    image token id and key layout recorded at conversion (``image_token_id`` overrides), the carried tower layers
    when ``load`` has them (convert/llava.py). ``lora_load``: LoRA adapters merged into the weights (lora_merge.py);
    with ``peft_out`` written there as an HF PEFT adapter (lora_peft.py), the merged weights only when ``out`` is
    given too."""
    from mtmegatron.convert.model import checkpoint_common, hf_inputs, parse_flags

    common = checkpoint_common(load)
    if rope_interleave is None:
        rope_interleave = common.get("hf_layout", {}).get("rope_interleave", True)
    flags = flags or common.get("model_flags")
    if not flags:  # a training checkpoint: its model fingerprint gives the flags (convert/recorded_flags.py)
        from mtmegatron.convert.recorded_flags import flags_from_fingerprint
        from mtmegatron.training.checkpoint.megatron_lm_checkpoint import recorded_fingerprint

        flags = flags_from_fingerprint(recorded_fingerprint(common))
    args = parse_flags(list(flags))
    family = families.of(args)
    if not family.hf_model_type:
        raise ConversionError(f"--model {args.model}: no HF mapping")
    if image_token_id is not None and not family.is_multimodal:
        raise ConversionError("--image-token-id is only meaningful for --model llava")
    from mtmegatron.convert.streaming_export import export

    if peft_out:
        from mtmegatron.convert.lora_peft import export_peft

        if not lora_load or family.is_multimodal:
            raise ConversionError("--peft-out needs --lora-load (a LoRA run's adapters) over a text model")
        peft_config = export_peft(load, lora_load, peft_out, args.model, args, rope_interleave)
        if not out:
            return peft_config
    inputs = hf_inputs(args)  # what the family's hf_config reads (TransformerConfig, ModelBuild, its section)
    if family.is_multimodal:
        from mtmegatron.convert import llava

        config, hf_layout = llava.export_layout(inputs, common.get("hf_layout", {}).get(family.name, {}), load,
                                                image_token_id)
    elif family.vision_encoder == "packed":  # the token ids recorded at conversion (none: HF's defaults)
        config, hf_layout = family.hf_config(**inputs, record=common.get("hf_layout", {}).get(family.name)), None
    else:
        config, hf_layout = family.hf_config(**inputs, rope_interleave=rope_interleave), None
    export(load, out, args.model, list(flags), config, rope_interleave, workers=workers, dtype=dtype,
           max_shard_bytes=max_shard_bytes, hf_layout=hf_layout, lora_load=lora_load)
    return config


def add_parser(sub) -> None:
    """Register ``convert hf-to-mcore|mcore-to-hf`` on the ``mtmegatron`` command's subparsers (the flags:
    config/convert_flags.py)."""
    to_mcore, to_hf = add_convert_args(sub)
    to_mcore.set_defaults(fn=_run_hf_to_mcore)
    to_hf.set_defaults(fn=_run_mcore_to_hf)


def _skip_unused_imports() -> None:
    """megatron-core imports wandb when present (inference contexts, timers: a few seconds of a conversion's
    start-up); a converter never logs to it, so it is reported absent in this process (megatron-core handles that)."""
    if "wandb" not in sys.modules:
        sys.modules["wandb"] = None


def _disk_errors(run):
    """A failure whose root is an OSError (a full disk, an unreadable file: megatron-core and torch DCP wrap it
    in their own exceptions) is raised as that OSError, which ``mtmegatron``'s error boundary says in one line."""

    def wrapped(args) -> int:
        from mtmegatron.convert.streaming import os_error_within

        try:
            return run(args)
        except (ConversionError, OSError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # torch DCP's CheckpointException is a BaseException
            os_error = os_error_within(e)
            if os_error is None:
                raise
            raise os_error from None

    return wrapped


@_disk_errors
def _run_hf_to_mcore(args) -> int:
    _skip_unused_imports()
    if args.workers < 1:
        raise ConversionError(f"--workers must be >= 1, not {args.workers}")
    flags = hf_to_mcore(args.hf_dir, args.out, args.model, *(getattr(args, k) for k in _LAYOUT),
                        workers=args.workers, dtype=_DTYPES.get(args.dtype), peft_in=args.peft_in)
    if args.peft_in:
        print(f"mtmegatron convert: wrote {args.out} (LoRA adapters of {args.peft_in}, iteration 0)")
        print(f"  train or export with: --load BASE --lora-load {args.out} (BASE: hf-to-mcore of {args.hf_dir})")
        return 0
    print(f"mtmegatron convert: wrote {args.out} (model-only, iteration 0; loads under any TP/PP/EP layout)")
    print(f"  pretrain with: --load {args.out} {shlex.join(flags)}")
    return 0


@_disk_errors
def _run_mcore_to_hf(args) -> int:
    _skip_unused_imports()
    if args.workers < 1:
        raise ConversionError(f"--workers must be >= 1, not {args.workers}")
    if args.max_shard_mb < 1:
        raise ConversionError(f"--max-shard-mb must be >= 1, not {args.max_shard_mb}")
    flags = [f for f in args.model_flags if f != "--"] or None
    if not args.out and not args.peft_out:
        raise ConversionError("mcore-to-hf needs --out (HF weights) or --peft-out (an HF PEFT adapter of --lora-load)")
    mcore_to_hf(args.load, args.out, flags, image_token_id=args.image_token_id, workers=args.workers,
                dtype=_DTYPES.get(args.dtype), max_shard_bytes=args.max_shard_mb * 2**20, lora_load=args.lora_load,
                peft_out=args.peft_out)
    for written, what in ((args.out, "HF safetensors + config.json"), (args.peft_out, "HF PEFT adapter")):
        if written:
            print(f"mtmegatron convert: wrote {written} ({what})")
    return 0


__all__ = ["ConversionError", "hf_to_mcore", "mcore_to_hf", "add_parser", "validate_layout"]
