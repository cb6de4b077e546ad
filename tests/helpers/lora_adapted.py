"""The shared opening of the in-process LoRA tests (tests/lora/): a tiny HF model converted to our base, wrapped with
LoRA adapters whose B is made non-zero, saved as a LoRA run saves them (adapters only), merged in place, and
exported by ``mcore-to-hf --lora-load`` both as merged HF weights (``merged/``) and as an HF PEFT adapter
(``peft/``). The caller owns the process group: it ends it (or goes on with it) in its own ``finally``.
May assume: one rank on the cpu backend, fp32 (helpers.hf_parity.converted_model).
"""

from __future__ import annotations

import torch

from helpers.hf_parity import converted_model, model_flags, save_reference


def adapted_base(family: str, tmp, lora_flags: list[str], record_init: bool = False, before_save=None) -> dict:
    """The run above in ``tmp`` (``hf/``, ``base/``, ``adapters/``, ``merged/``, ``peft/``); returns the tokens, the
    HF reference, the adapted names and trainable names, and the logits ``adapted`` (B non-zero) and
    ``merged_in_place`` (after ``lora.merge``), plus ``at_init`` (B still zero) when ``record_init``.
    ``before_save(args, base)``: a last change to the run's values before the adapters are saved."""
    from megatron.core import parallel_state

    from mtmegatron.convert.commands import hf_to_mcore, mcore_to_hf
    from mtmegatron.lora.section import Lora
    from mtmegatron.lora.wrap import adapters, merge, wrap
    from mtmegatron.training.checkpoint import checkpointing

    hf_dir, base = tmp / "hf", tmp / "base"
    save_reference(family, hf_dir)
    hf_to_mcore(str(hf_dir), str(base), family)
    parallel_state.destroy_model_parallel()  # each step below sets up the one-rank parallel state it needs
    reference = torch.load(hf_dir / "reference.pt")
    tokens = reference["tokens"]
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    out = {"tmp": tmp, "hf_dir": hf_dir, "base": base, "tokens": tokens, "reference": reference}
    args, model = converted_model(1, "cpu", model_flags(base) + lora_flags, str(base))
    (model,) = wrap([model], Lora.of(args), args.seed)
    out["trained"] = sorted(name for name, p in model.named_parameters() if p.requires_grad)
    out["adapted_names"] = sorted(name for name, _, _ in adapters([model]))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        if record_init:
            out["at_init"] = model(tokens, positions, None).float()
        for _, _, lora in adapters([model]):
            lora.lora_b.normal_(0, 0.05, generator=generator)
        out["adapted"] = model(tokens, positions, None).float()
    args.no_save_optim = True  # a LoRA run's checkpoint without the optimizer state: the adapters are enough
    if before_save is not None:
        before_save(args, base)
    checkpointing.save(str(tmp / "adapters"), 1, [model], None, None, args)
    merge([model])
    with torch.no_grad():
        out["merged_in_place"] = model(tokens, positions, None).float()
    parallel_state.destroy_model_parallel()
    mcore_to_hf(str(base), str(tmp / "merged"), lora_load=str(tmp / "adapters"), peft_out=str(tmp / "peft"))
    parallel_state.destroy_model_parallel()
    return out
