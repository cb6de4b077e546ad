"""LoRA adapters on one rank, in this process, over a tiny HF Llama converted to our base (one shared fixture):
- wrapped, the model computes what its base does (B starts at zero: the HF reference logits) and only adapter
  weights need a gradient;
- with B made non-zero and saved as a LoRA run saves (adapters only), ``mcore-to-hf --load BASE --lora-load``
  loaded by HF's LlamaForCausalLM gives our adapted model's logits (fp32, helpers.hf_parity.MAX_ABS = 1e-4): the
  fold (alpha / r), the fused q/k/v and [gate; up] rows and the adapter keys' TP axes checked against an
  implementation we did not write; ``lora.merge`` in place gives the adapted logits too (1e-5);
- ``--peft-out`` (same call): peft's file layout and names, and for every HF module the PEFT update on the
  original HF weight gives the merged export's weight (peft itself is not installed here: its loading is not
  tested); that adapter imported with ``hf-to-mcore --peft-in`` and exported again is bit-exact.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.hf_parity import MAX_ABS, model_flags, save_reference

LORA = ["--lora-r", "4", "--lora-alpha", "8", "--transformer-impl", "local"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from helpers.hf_parity import converted_model
    from megatron.core import parallel_state

    from mtmegatron.convert.commands import hf_to_mcore, mcore_to_hf
    from mtmegatron.lora.wrap import adapters, merge, wrap
    from mtmegatron.training.checkpoint import checkpointing

    tmp = tmp_path_factory.mktemp("lora")
    hf_dir, base = tmp / "hf", tmp / "base"
    save_reference("llama3", hf_dir)
    hf_to_mcore(str(hf_dir), str(base), "llama3")
    parallel_state.destroy_model_parallel()  # each step below sets up the one-rank parallel state it needs
    reference = torch.load(hf_dir / "reference.pt")
    tokens = reference["tokens"]
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    args, model = converted_model(1, "cpu", model_flags(base) + LORA, str(base))
    out = {"tmp": tmp, "tokens": tokens, "base_logits": reference["logits"]}
    try:
        (model,) = wrap([model], args)
        out["trained"] = sorted(name for name, p in model.named_parameters() if p.requires_grad)
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            out["at_init"] = model(tokens, positions, None).float()
            for _, _, lora in adapters([model]):
                lora.lora_b.normal_(0, 0.05, generator=generator)
            out["adapted"] = model(tokens, positions, None).float()
        args.no_save_optim = True  # a LoRA run's checkpoint without the optimizer state: the adapters are enough
        checkpointing.save(str(tmp / "adapters"), 1, [model], None, None, args)
        merge([model])
        with torch.no_grad():
            out["merged_in_place"] = model(tokens, positions, None).float()
        parallel_state.destroy_model_parallel()
        mcore_to_hf(str(base), str(tmp / "merged"), lora_load=str(tmp / "adapters"), peft_out=str(tmp / "peft"))
        parallel_state.destroy_model_parallel()
        hf_to_mcore(str(hf_dir), str(tmp / "imported"), "llama3", peft_in=str(tmp / "peft"))  # and back again
        mcore_to_hf(str(base), None, lora_load=str(tmp / "imported"), peft_out=str(tmp / "peft_again"))
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()
    return out


def test_wrapped_model_is_its_base_and_trains_only_adapters(run):
    assert (run["at_init"] - run["base_logits"]).abs().max().item() <= MAX_ABS
    assert len(run["trained"]) == 2 * 4 * 2, run["trained"]  # 2 layers x 4 targets x (A, B)
    assert all(name.rsplit(".", 1)[1] in ("lora_a", "lora_b") for name in run["trained"]), run["trained"]


def test_merged_weights_give_the_adapted_logits(run):
    from transformers import LlamaForCausalLM

    assert (run["adapted"] - run["base_logits"]).abs().max() > 1e-2  # the adapters change the output
    assert (run["merged_in_place"] - run["adapted"]).abs().max().item() < 1e-5
    hf = LlamaForCausalLM.from_pretrained(str(run["tmp"] / "merged"), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(run["tokens"]).logits
    diff = (theirs - run["adapted"]).abs().max().item()
    print(f"\nmerged export vs our adapted model: max |logit diff| {diff:.3e}")
    assert diff <= MAX_ABS


def test_adapter_checkpoint_holds_no_base_weight(run):
    from megatron.core.dist_checkpointing import load_tensors_metadata

    keys = list(load_tensors_metadata(str(run["tmp"] / "adapters" / "iter_0000001")))
    assert keys and all(".lora.lora_a" in k or ".lora.lora_b" in k for k in keys), keys


def test_peft_adapter_updates_the_hf_weights_to_the_merged_ones(run):
    from safetensors.torch import load_file

    from mtmegatron.convert.hf_io import HFCheckpoint

    tmp = run["tmp"]
    config = json.loads((tmp / "peft" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0)
    assert config["target_modules"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj"])
    tensors = load_file(str(tmp / "peft" / "adapter_model.safetensors"))
    original, merged_hf = HFCheckpoint(str(tmp / "hf")), HFCheckpoint(str(tmp / "merged"))
    modules = sorted({k[:-len(".lora_A.weight")] for k in tensors if k.endswith(".lora_A.weight")})
    assert len(modules) == 2 * 7 and all(m.startswith("base_model.model.model.layers.") for m in modules)
    for module in modules:
        name = module[len("base_model.model."):] + ".weight"
        a, b = tensors[module + ".lora_A.weight"], tensors[module + ".lora_B.weight"]
        assert a.shape[0] == 4 and b.shape[1] == 4, module
        updated = original[name] + (8.0 / 4) * (b @ a)
        assert (updated - merged_hf[name]).abs().max().item() < 1e-6, name


def test_peft_round_trip_is_exact(run):
    from safetensors.torch import load_file

    first, again = run["tmp"] / "peft", run["tmp"] / "peft_again"
    one, two = load_file(str(first / "adapter_model.safetensors")), load_file(str(again / "adapter_model.safetensors"))
    assert sorted(one) == sorted(two)
    assert all(torch.equal(one[k], two[k]) for k in one)
    configs = [json.loads((d / "adapter_config.json").read_text()) for d in (first, again)]
    for config in configs:
        config.pop("base_model_name_or_path")
    assert configs[0] == configs[1]
