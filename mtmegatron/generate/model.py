"""The model to generate with: its flags read from the checkpoint, built for the requested TP/PP/EP layout,
weights loaded from the torch_dist checkpoint (resharded from whatever layout wrote it).

Where the flags come from, first that applies: flags given after ``--``; the ``model_flags`` the HF converter
records (what ``mcore-to-hf`` reads); for a pretrain checkpoint, its model fingerprint (models/fingerprint.py:
every field that changes shapes or the forward math, convert/recorded_flags.py), its embedding rows given as
``--padded-vocab-size`` (so a model trained with ``--padded-vocab-size`` or another
``--make-vocab-size-divisible-by`` is rebuilt with its rows). The fingerprint is
compared with the rebuilt model before loading, as ``pretrain --load`` does. A multi-token-prediction block
(DeepSeek-V3) is not built: generation reads the main output head, and its weights are simply not loaded.
With ``--lora-load ADAPTERS`` the base is wrapped as a LoRA run wraps it (rank, alpha and targets from the
adapters' record, refused in one line when they were made for another base) and the adapters are loaded over it:
generation runs the adapted model (lora/).
May assume: called on every rank; ``prepare`` before any process group, ``build_and_load`` after
``init_distributed``.
"""

from __future__ import annotations

from mtmegatron.convert.recorded_flags import flags_from_fingerprint
from mtmegatron.config.generate_flags import GenerateError
from mtmegatron.models import families


def checkpoint_common(load: str) -> dict:
    """The latest complete checkpoint's non-tensor state (convert/model.py's reader), or a one-line GenerateError."""
    from mtmegatron.convert import model as checkpoint
    from mtmegatron.utils.checkpoint_dirs import CheckpointError

    try:
        return checkpoint.checkpoint_common(load)
    except CheckpointError as e:
        raise GenerateError(str(e)) from None


def model_args(load: str, given_flags: list[str], layout: list[str], backend: str | None, world_size: int):
    """(validated pretrain namespace for the model, the checkpoint's common state)."""
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.utils.errors import ConfigError

    from mtmegatron.training.checkpoint.megatron_lm_checkpoint import recorded_fingerprint

    common = checkpoint_common(load)
    saved = recorded_fingerprint(common)  # whichever layout wrote it (a pretrain checkpoint: Megatron-LM's)
    flags = list(given_flags) or list(common.get("model_flags") or [])
    if not flags and saved:
        flags = flags_from_fingerprint(saved)
    if not flags:
        raise GenerateError(f"--load {load} does not record its model flags: pass them after '--', e.g. "
                            "-- --model llama3 --model-size tiny")
    try:
        extra = ["--mock-data", "--micro-batch-size", "1", "--global-batch-size", str(world_size)]
        if backend:
            extra += ["--backend", backend]
        args = parse_args(flags + layout + extra, world_size=world_size, for_training=False)
    except ConfigError as e:
        raise GenerateError(str(e)) from None
    except SystemExit:  # argparse already printed its one line about a flag it does not know
        raise GenerateError(f"the model flags {' '.join(flags)} are not valid pretrain flags") from None
    if families.of(args).is_multimodal:
        raise GenerateError("--load holds a LLaVA model: mtmegatron generate decodes text-only GPT models")
    if args.context_parallel_size > 1:
        raise GenerateError("context parallelism is not supported for generation (the KV cache is not split "
                            "over CP ranks)")
    args.sequence_parallel = False  # megatron-core's static inference path refuses SP for dense models
    from mtmegatron.models.fingerprint import describe_mismatches, mismatches

    found = mismatches(saved, args)
    if found:
        raise GenerateError(f"checkpoint {common['directory']} was written for a different model than the flags "
                            f"describe ({describe_mismatches(found)})")
    args.mtp_num_layers = None  # DeepSeek-V3's MTP head only trains; the next token comes from the main head
    return args, common


def lora_args(args, lora_load: str) -> str:
    """Set the LoRA values of the adapters under ``lora_load`` on ``args`` (checked against the base's flags by
    lora/checkpoint.check); returns the adapters' checkpoint directory."""
    import os

    from mtmegatron.lora import checkpoint as lora_checkpoint
    from mtmegatron.lora.section import Lora
    from mtmegatron.training.checkpoint.megatron_lm_checkpoint import OURS
    from mtmegatron.utils.checkpoint_dirs import CheckpointError

    if not os.path.isdir(lora_load):
        raise GenerateError(f"--lora-load {lora_load}: not a directory")
    common = checkpoint_common(lora_load)
    saved = (common.get(OURS) or {}).get("lora")
    lora_checkpoint.adopt(args, saved, lora_load)
    try:
        lora_checkpoint.check(saved, "adapters", common["directory"], Lora.of(args), args)
    except CheckpointError as e:
        raise GenerateError(str(e)) from None
    return common["directory"]


def _with_adapters(model, args, directory: str, metadata: dict):
    """``model`` wrapped with LoRA adapters (lora/wrap.py), the adapters loaded from ``directory``."""
    import torch
    from megatron.core import dist_checkpointing

    from mtmegatron import lora
    from mtmegatron.lora import checkpoint as lora_checkpoint
    from mtmegatron.lora.section import Lora
    from mtmegatron.utils.errors import ConfigError

    try:
        (model,) = lora.wrap([model], Lora.of(args), args.seed)
    except ConfigError as e:
        raise GenerateError(str(e)) from None
    state = {k: v for k, v in model.sharded_state_dict(metadata=metadata).items() if lora_checkpoint.is_adapter(k)}
    try:
        loaded = dist_checkpointing.load({"model": state}, directory)
    except (Exception, torch.distributed.checkpoint.api.CheckpointException) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise GenerateError(f"--lora-load: adapters {directory} cannot be loaded into this model: {first}") from e
    model.load_state_dict(loaded["model"], strict=False)
    return model


def build_and_load(args, directory: str, lora_directory: str | None = None):
    """This rank's model chunk (eval mode, on the compute device, Float16Module for --bf16) with the weights (and
    the LoRA adapters of ``lora_directory`` over them, when given)."""
    import torch
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.transformer.module import Float16Module

    from mtmegatron.models.gpt import build_model_chunks, transformer_config
    from mtmegatron.backends.device import compute_device, move_module

    config = transformer_config(args)
    (model,) = build_model_chunks(args, config)
    metadata = {"dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    try:
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict(metadata=metadata)}, directory)
    except (Exception, torch.distributed.checkpoint.api.CheckpointException) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise GenerateError(f"checkpoint {directory} cannot be loaded into the model its flags describe: "
                            f"{first}") from e
    model.load_state_dict(loaded["model"])
    if lora_directory:
        model = _with_adapters(model, args, lora_directory, metadata)
    move_module(model, compute_device())
    if args.bf16 or args.fp16:
        model = Float16Module(config, model)
    model.eval()
    return model
