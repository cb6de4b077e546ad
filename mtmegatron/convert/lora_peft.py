"""``mcore-to-hf --load BASE --lora-load ADAPTERS --peft-out DIR``: a LoRA run's adapters as an HF PEFT adapter
(``adapter_config.json`` + ``adapter_model.safetensors``, HF's module names: q_proj ... down_proj).

Each adapter's B is split by the family's own HF map for the weight it adapts (the rows of fused q/k/v per
query group, [gate; up]), and its A into its parts' blocks (lora/adapter.py: one r-row block per part, in the HF
map's order q, k, v / gate, up): ``W_q + s * B_q @ A_q`` is exactly the q rows of our fused update, so the PEFT
adapter computes what our adapters do, and a peft-trained adapter (its own A per module) imports exactly. Keys
as peft saves them: ``base_model.model.<HF module>.lora_A.weight`` / ``lora_B.weight``.
Expert adapters (linear_fc1/linear_fc2 of MoE experts) are refused in one line (EXPERTS_REFUSAL): transformers 5
fuses a MoE layer's experts into 3-D parameters that peft's LoRA layers do not take per expert and per part.
May assume: a family whose HF map names each adapted weight (the dense decoder families).
"""

from __future__ import annotations

import json
import os

import torch

from mtmegatron.models.families import ConversionError


EXPERTS_REFUSAL = ("--peft-out: MoE expert adapters have no HF PEFT form here: transformers 5 holds a MoE layer's "
                   "experts as one 3-D gate_up_proj/down_proj parameter (no per-expert w1/w3/w2 modules for peft to "
                   "target); write the merged model with --out instead")


def peft_tensors(adapters, run, entries: dict) -> dict[str, torch.Tensor]:
    """``{peft key: tensor}`` from the adapter reader; ``entries``: the family's HF map by mcore name."""
    out = {}
    for local in sorted(adapters.chunks_of):
        if not local.endswith(".lora.lora_a"):
            continue
        stem = local[:-len("lora.lora_a")]
        if ".experts." in stem:
            raise ConversionError(EXPERTS_REFUSAL)
        entry = entries.get(stem + "weight")
        if entry is None:
            raise ConversionError(f"--peft-out: the HF map has no weight {stem}weight for its adapter")
        a, b = adapters.read(local), adapters.read(stem + "lora.lora_b")
        r, names = run.lora_r, entry.hf
        blocks = a.split(r) if a.shape[0] == r * len(names) else [a] * len(names)
        for name, block, part in zip(names, blocks, entry.to_hf(b)):
            module = "base_model.model." + name[:-len(".weight")]
            out[module + ".lora_A.weight"] = block.clone().contiguous()
            out[module + ".lora_B.weight"] = part.clone().contiguous()
    return out


def write_peft(out: str, tensors: dict, run, base: str) -> dict:
    """``adapter_config.json`` + ``adapter_model.safetensors`` in ``out`` (which must not exist); returns the
    config."""
    from safetensors.torch import save_file

    if os.path.exists(out):
        raise ConversionError(f"--peft-out {out} already exists; remove it or choose another directory")
    targets = sorted({key.split(".")[-3] for key in tensors})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": run.lora_r, "lora_alpha": run.lora_alpha,
              "lora_dropout": 0.0, "target_modules": targets, "bias": "none", "fan_in_fan_out": False,
              "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True,
              "modules_to_save": None, "base_model_name_or_path": os.path.abspath(base)}
    staging = f"{out.rstrip('/')}.partial.{os.getpid()}"
    os.makedirs(staging)
    save_file(tensors, os.path.join(staging, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(staging, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    os.replace(staging, out)
    return config


def export_peft(load: str, lora_load: str, out: str, family: str, args, rope_interleave: bool) -> dict:
    """The PEFT adapter of ``lora_load`` (adapters over the base under ``load``) in ``out``; returns its config."""
    from mtmegatron.convert.lora_merge import adapter_reader
    from mtmegatron.convert.model import hf_inputs, init_single_rank
    from mtmegatron.convert.streaming_export import _Reader
    from mtmegatron.models import families

    from megatron.core import parallel_state

    init_single_rank(args)
    try:
        adapters, run, _ = adapter_reader(_Reader, args, lora_load)
        entries = {e.mcore: e for e in families.get(family).hf_map(**hf_inputs(args), rope_interleave=rope_interleave,
                                                                  layout=None)}
        tensors = peft_tensors(adapters, run, entries)
    finally:  # the merged export, when asked for too, sets up its own one-rank parallel state
        parallel_state.destroy_model_parallel()
    return write_peft(out, tensors, run, load)


# ---- the way in: hf-to-mcore --peft-in ----------------------------------------------------------------------
OURS_OF_HF = {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv", "o_proj": "linear_proj",
              "gate_proj": "linear_fc1", "up_proj": "linear_fc1", "down_proj": "linear_fc2"}


def _peft_config(peft_dir: str) -> dict:
    path = os.path.join(peft_dir, "adapter_config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ConversionError(f"--peft-in {peft_dir}: no readable adapter_config.json ({type(e).__name__})") from None
    if config.get("peft_type") != "LORA" or config.get("use_dora") or config.get("use_rslora") \
            or config.get("bias", "none") != "none" or config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ConversionError(f"{path}: only plain LoRA adapters (no DoRA, rsLoRA, trained biases or per-module "
                              f"rank/alpha patterns) import here")
    targets = config.get("target_modules") or []
    if isinstance(targets, str) or any(t not in OURS_OF_HF for t in targets):
        raise ConversionError(f"{path}: target_modules {targets!r}: only {', '.join(OURS_OF_HF)} import here")
    return config


def import_peft(hf_dir: str, peft_dir: str, out: str, family: str, flags: list[str], rope_interleave: bool) -> None:
    """An HF PEFT adapter over the HF model in ``hf_dir`` as a LoRA checkpoint in ``out`` (for ``--lora-load``,
    starting at iteration 0): q/k/v (and gate/up) adapters fused as the base weights are: their A's stacked as
    our fused adapter's part blocks, their B's rows fused by the family's HF map."""
    from megatron.core import dist_checkpointing, parallel_state
    from safetensors.torch import load_file

    from mtmegatron.convert.model import MODEL_ONLY_KEY, hf_inputs, init_single_rank, parse_flags
    from mtmegatron.convert.streaming import _meta_model
    from mtmegatron.lora import checkpoint as lora_checkpoint
    from mtmegatron.lora.section import Lora
    from mtmegatron.lora.wrap import adapters as adapters_of, wrap
    from mtmegatron.models import families
    from mtmegatron.models.fingerprint import fingerprint
    from mtmegatron.training.checkpoint.megatron_lm_checkpoint import OURS
    from mtmegatron.utils.checkpoint_dirs import TRACKER, checkpoint_dir

    if os.path.exists(out):
        raise ConversionError(f"--out {out} already exists; remove it or choose another directory")
    config = _peft_config(peft_dir)
    ours = sorted({OURS_OF_HF[t] for t in config["target_modules"]})
    tensors = load_file(os.path.join(peft_dir, "adapter_model.safetensors"))
    args = parse_flags(list(flags) + ["--lora-r", str(config["r"]), "--lora-alpha", str(config["lora_alpha"]),
                                      "--lora-target-modules", *ours, "--transformer-impl", "local"])
    init_single_rank(args)
    try:
        lora_section = Lora.of(args)  # what lora/ reads (lora/section.py)
        (model,) = wrap([_meta_model(args)], lora_section, args.seed)
        entries = {e.mcore: e for e in families.get(family).hf_map(**hf_inputs(args), rope_interleave=rope_interleave,
                                                                  layout=None)}
        for name, _, lora in adapters_of([model]):
            entry = entries["decoder." + name + ".weight"]
            modules = ["base_model.model." + hf[:-len(".weight")] for hf in entry.hf]
            missing = [m for m in modules if m + ".lora_A.weight" not in tensors]
            if missing:
                raise ConversionError(f"--peft-in {peft_dir}: no adapter {missing[0]} (our {name} needs "
                                      f"{', '.join(m.rsplit('.', 1)[1] for m in modules)} together)")
            a = torch.cat([tensors[m + ".lora_A.weight"] for m in modules])
            b = entry.to_mcore(*[tensors[m + ".lora_B.weight"] for m in modules])
            if a.shape != lora.lora_a.shape or b.shape != lora.lora_b.shape:
                raise ConversionError(f"--peft-in {peft_dir}: {modules[0]}'s adapter has A {tuple(a.shape)} and "
                                      f"B {tuple(b.shape)} fused; this base needs {tuple(lora.lora_a.shape)} and "
                                      f"{tuple(lora.lora_b.shape)}")
            lora.lora_a = torch.nn.Parameter(a.clone().contiguous(), requires_grad=True)
            lora.lora_b = torch.nn.Parameter(b.clone().contiguous(), requires_grad=True)
        state = {k: v for k, v in model.sharded_state_dict().items() if lora_checkpoint.is_adapter(k)}
        record = lora_checkpoint.record(lora_section, args.load, args)
        record["base"] = os.path.abspath(hf_dir)
        directory = checkpoint_dir(out, 0)
        os.makedirs(directory)
        dist_checkpointing.save({"model": state, "iteration": 0, "args": fingerprint(args), MODEL_ONLY_KEY: True,
                                 "model_flags": list(flags), OURS: {"lora": record}}, directory)
        with open(os.path.join(out, TRACKER), "w") as f:
            f.write("0")
    finally:
        parallel_state.destroy_model_parallel()
