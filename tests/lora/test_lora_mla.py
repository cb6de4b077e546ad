"""LoRA on DeepSeek-V3's multi-latent attention (MLA), one rank, in this process, over the tiny HF DeepSeek-V3
(helpers/hf_models.py: q_lora_rank 32, kv_lora_rank 16, rope head dim 8) converted to our base (one shared fixture):
adapters on the four MLA projections and linear_proj, B made non-zero and saved as a LoRA run saves them;
- the default targets of a --multi-latent-attention model with --q-lora-rank are the four projections (not
  linear_q_proj, not linear_qkv) plus linear_proj, linear_fc1, linear_fc2 (config/lora_flags.py);
- ``lora.merge`` in place gives the adapted logits (1e-5);
- ``mcore-to-hf --lora-load`` (merged) loaded by HF's DeepseekV3ForCausalLM gives our adapted logits
  (helpers.hf_parity.MAX_ABS), and its weights are the base's + alpha / r * B @ A of the ``--peft-out`` adapter of
  the same call, module by module: peft's names q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj (each
  MLA projection is one HF module: kv_a_proj_with_mqa holds the shared rope rows as megatron's linear_kv_down_proj
  does, so its adapter maps whole; no part is split off);
- ``peft.PeftModel.from_pretrained`` on that adapter over the HF base gives the merged export's logits (fp32, 1e-5).
"""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from helpers.hf_parity import MAX_ABS, model_flags

MLA_TARGETS = ["linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj", "linear_proj"]
LORA = ["--lora-r", "4", "--lora-alpha", "8", "--transformer-impl", "local", "--lora-target-modules", *MLA_TARGETS]
HF_MODULES = ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "q_a_proj", "q_b_proj"]


def _mtp_layers(base) -> int:
    """The base's MTP layers (our forward runs without them, as HF's model has none: helpers.hf_parity)."""
    recorded = shlex.split((base / "model_flags.txt").read_text())
    return int(recorded[recorded.index("--mtp-num-layers") + 1])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from helpers.lora_adapted import adapted_base
    from megatron.core import parallel_state

    from mtmegatron.convert.model import parse_flags

    def base_as_converted(args, base):  # the record names the base as converted (its MTP layer: no adapter)
        args.mtp_num_layers = _mtp_layers(base)

    try:
        out = adapted_base("deepseek-v3", tmp_path_factory.mktemp("lora_mla"), LORA, before_save=base_as_converted)
    finally:
        parallel_state.destroy_model_parallel()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    out["default"] = parse_flags(model_flags(out["base"]) + ["--lora-r", "4"]).lora_target_modules
    return out


def _hf(directory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), torch_dtype=torch.float32,
                                                attn_implementation="eager").eval()


def test_default_targets_of_an_mla_model(run):
    assert run["default"] == ["linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj",
                              "linear_proj", "linear_fc1", "linear_fc2"], run["default"]


def test_every_layer_gets_its_mla_adapters_and_merging_keeps_the_output(run):
    assert len(run["adapted_names"]) == 4 * len(MLA_TARGETS), run["adapted_names"]  # 4 layers
    assert (run["merged_in_place"] - run["adapted"]).abs().max().item() < 1e-5


def test_merged_export_is_the_base_plus_the_peft_update_and_gives_our_logits(run):
    from safetensors.torch import load_file

    from mtmegatron.convert.hf_io import HFCheckpoint

    tmp = run["tmp"]
    config = json.loads((tmp / "peft" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, HF_MODULES), config
    tensors = load_file(str(tmp / "peft" / "adapter_model.safetensors"))
    original, merged = HFCheckpoint(str(tmp / "hf")), HFCheckpoint(str(tmp / "merged"))
    modules = sorted({k[:-len(".lora_A.weight")] for k in tensors if k.endswith(".lora_A.weight")})
    assert len(modules) == 4 * len(HF_MODULES), modules
    for module in modules:
        name = module[len("base_model.model."):] + ".weight"
        a, b = tensors[module + ".lora_A.weight"], tensors[module + ".lora_B.weight"]
        assert a.shape == (4, original[name].shape[1]) and b.shape == (original[name].shape[0], 4), module
        assert (original[name] + 2.0 * (b @ a) - merged[name]).abs().max().item() < 1e-6, name
    with torch.no_grad():
        theirs = _hf(tmp / "merged")(run["tokens"]).logits.float()
    diff = (theirs - run["adapted"]).abs().max().item()
    print(f"\nDeepSeek-V3 merged export vs our adapted model: max |logit diff| {diff:.3e}")
    assert diff <= MAX_ABS


def test_peft_loads_the_mla_adapter_and_gives_the_merged_logits(run):
    from peft import PeftModel

    tmp = run["tmp"]
    with torch.no_grad():
        merged = _hf(tmp / "merged")(run["tokens"]).logits.float()
        peft = PeftModel.from_pretrained(_hf(tmp / "hf"), str(tmp / "peft")).eval()(run["tokens"]).logits.float()
    diff = (peft - merged).abs().max().item()
    print(f"\nHF+peft on our MLA adapter vs the merged export: max |logit diff| {diff:.3e}")
    assert diff < 1e-5
