"""LoRA adapters on one rank, in this process, over a tiny HF Llama converted to our base (one shared fixture):
- wrapped, the model computes what its base does (B starts at zero: the HF reference logits) and only adapter
  weights need a gradient;
- with B made non-zero and saved as a LoRA run saves (adapters only), ``mcore-to-hf --load BASE --lora-load``
  loaded by HF's LlamaForCausalLM gives our adapted model's logits (fp32, helpers.hf_parity.MAX_ABS = 1e-4): the
  fold (alpha / r), the fused q/k/v and [gate; up] rows and the adapter keys' TP axes checked against an
  implementation we did not write; ``lora.merge`` in place gives the adapted logits too (1e-5);
- ``--peft-out`` (same call): peft's file layout and names, and for every HF module the PEFT update on the
  original HF weight gives the merged export's weight; ``peft.PeftModel.from_pretrained`` on it gives our adapted
  logits, merged (``merge_and_unload``) or not; imported with ``hf-to-mcore --peft-in`` and exported again it is
  bit-exact;
- HF peft parity: an adapter made by peft itself (LoraConfig over q/k/v/o/gate/up/down, random non-zero A and B:
  its q/k/v and gate/up A's differ), saved by ``save_pretrained`` and imported with ``--peft-in``, gives HF+peft's
  loss on the same tokens, and the same losses after 3 Adam steps over the adapters on both sides (fp32, 1e-5);
- ``mtmegatron generate --load BASE --lora-load ADAPTERS`` (in process): its greedy tokens are HF's greedy tokens
  on the merged export (and not the base's); ``--lora-load`` of a directory without adapters, or of none: one
  line and exit status 2, before any process group.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.hf_parity import MAX_ABS, model_flags

LORA = ["--lora-r", "4", "--lora-alpha", "8", "--transformer-impl", "local"]
HF_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STEPS = 3


def _losses(forward, params, tokens) -> list[float]:
    """The next-token loss before and after each of STEPS Adam steps (lr 1e-2, no weight decay, no clipping)."""
    optimizer = torch.optim.Adam(params, lr=1e-2)
    losses = []
    for step in range(STEPS + 1):
        logits = forward(tokens).float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))
        losses.append(loss.item())
        if step < STEPS:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return losses


def _peft_made_adapter(hf_dir, out) -> list[float]:
    """An HF peft LoRA adapter made by peft (random A and B) saved in ``out``; returns HF+peft's losses."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(3)
    hf = LlamaForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32).eval()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=HF_TARGETS, lora_dropout=0.0, init_lora_weights=False)
    peft_model = get_peft_model(hf, config)
    peft_model.save_pretrained(str(out))
    trained = [p for p in peft_model.parameters() if p.requires_grad]
    return _losses(lambda t: peft_model(t).logits, trained, _tokens(hf_dir))


def _tokens(hf_dir):
    return torch.load(hf_dir / "reference.pt")["tokens"]


def _generate(tmp, base) -> list[dict]:
    """``mtmegatron generate --lora-load`` (in process, greedy): its --output rows."""
    from helpers.char_tokenizer import save_char_tokenizer

    from mtmegatron.generate.__main__ import main

    save_char_tokenizer(str(tmp / "tokenizer"))
    argv = ["--backend", "cpu", "--load", str(base), "--lora-load", str(tmp / "adapters"), "--tokenizer-model",
            str(tmp / "tokenizer"), "--prompt", "Hello, world", "--prompt", "Hi", "--max-new-tokens", "12",
            "--output", str(tmp / "generated.jsonl")]
    assert main(argv) == 0
    return [json.loads(line) for line in (tmp / "generated.jsonl").read_text().splitlines()]


def _our_losses(base, adapters_dir, tokens) -> list[float]:
    """Our model over ``base`` with the LoRA checkpoint in ``adapters_dir`` loaded; its losses."""
    from helpers.hf_parity import converted_model
    from megatron.core import dist_checkpointing

    from mtmegatron.lora import checkpoint as lora_checkpoint
    from mtmegatron.lora.section import Lora
    from mtmegatron.lora.wrap import wrap

    args, model = converted_model(1, "cpu", model_flags(base) + LORA, str(base))
    (model,) = wrap([model], Lora.of(args), args.seed)
    state = {k: v for k, v in model.sharded_state_dict().items() if lora_checkpoint.is_adapter(k)}
    loaded = dist_checkpointing.load({"model": state}, str(adapters_dir / "iter_0000000"))
    missing, _ = model.load_state_dict(loaded["model"], strict=False)
    assert not [k for k in missing if lora_checkpoint.is_adapter("." + k)], missing
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    trained = [p for p in model.parameters() if p.requires_grad]
    return _losses(lambda t: model(t, positions, None), trained, tokens)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from helpers.lora_adapted import adapted_base
    from megatron.core import parallel_state

    from mtmegatron.convert.commands import hf_to_mcore, mcore_to_hf

    try:
        out = adapted_base("llama3", tmp_path_factory.mktemp("lora"), LORA, record_init=True)
        tmp, hf_dir, base = out["tmp"], out["hf_dir"], out["base"]
        out["base_logits"] = out["reference"]["logits"]
        hf_to_mcore(str(hf_dir), str(tmp / "imported"), "llama3", peft_in=str(tmp / "peft"))  # and back again
        mcore_to_hf(str(base), None, lora_load=str(tmp / "imported"), peft_out=str(tmp / "peft_again"))
        parallel_state.destroy_model_parallel()
        out["hf_peft_losses"] = _peft_made_adapter(hf_dir, tmp / "peft_trained")
        hf_to_mcore(str(hf_dir), str(tmp / "peft_imported"), "llama3", peft_in=str(tmp / "peft_trained"))
        parallel_state.destroy_model_parallel()
        out["our_losses"] = _our_losses(base, tmp / "peft_imported", out["tokens"])
        parallel_state.destroy_model_parallel()
        out["generated"] = _generate(tmp, base)  # last: generate ends its process group
    finally:
        parallel_state.destroy_model_parallel()
        if torch.distributed.is_initialized():
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


def test_peft_loads_our_adapter_and_gives_our_logits(run):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(str(run["tmp"] / "hf"), torch_dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(hf, str(run["tmp"] / "peft")).eval()
    with torch.no_grad():
        unmerged = model(run["tokens"]).logits
        merged = model.merge_and_unload()(run["tokens"]).logits
    diffs = [(unmerged - run["adapted"]).abs().max().item(), (merged - unmerged).abs().max().item()]
    print(f"\npeft on our --peft-out vs our adapted logits: {diffs[0]:.3e}; peft merged vs unmerged: {diffs[1]:.3e}")
    assert diffs[0] <= MAX_ABS and diffs[1] <= MAX_ABS


def test_peft_trained_adapter_gives_hf_peft_losses(run):
    from safetensors.torch import load_file

    tensors = load_file(str(run["tmp"] / "peft_trained" / "adapter_model.safetensors"))
    layer = "base_model.model.model.layers.0."
    a_q, a_k = (tensors[f"{layer}self_attn.{m}.lora_A.weight"] for m in ("q_proj", "k_proj"))
    b_q = tensors[f"{layer}self_attn.q_proj.lora_B.weight"]
    assert not torch.equal(a_q, a_k) and b_q.abs().max() > 0  # peft's own: separate A's, a non-zero B
    theirs, ours = run["hf_peft_losses"], run["our_losses"]
    print(f"\nHF+peft losses {theirs}\nour losses     {ours}")
    assert theirs[-1] < theirs[0]  # the steps train
    assert max(abs(a - b) for a, b in zip(theirs, ours)) < 1e-5


def test_generate_with_adapters_equals_hf_on_the_merged_export(run):
    from transformers import LlamaForCausalLM

    merged, base = (LlamaForCausalLM.from_pretrained(str(run["tmp"] / d), torch_dtype=torch.float32).eval()
                    for d in ("merged", "hf"))
    differs = False
    for row in run["generated"]:
        prompt = torch.tensor([row["prompt_tokens"]])
        with torch.no_grad():
            theirs, plain = (hf.generate(prompt, max_new_tokens=len(row["tokens"]), do_sample=False, min_new_tokens=1,
                                         pad_token_id=0)[0, prompt.shape[1]:].tolist() for hf in (merged, base))
        assert len(row["tokens"]) >= 4 and row["tokens"] == theirs[:len(row["tokens"])], (row, theirs)
        differs |= row["tokens"] != plain[:len(row["tokens"])]
    assert differs  # the adapters change what is generated: the base alone decodes otherwise


def test_generate_refuses_a_lora_load_without_adapters(run, capsys):
    from mtmegatron.generate.__main__ import main

    tmp = run["tmp"]
    argv = ["--backend", "cpu", "--load", str(tmp / "base"), "--tokenizer-model", str(tmp / "tokenizer"),
            "--prompt", "Hi", "--lora-load"]
    assert main(argv + [str(tmp / "base")]) == 2
    assert main(argv + [str(tmp / "nowhere")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "holds no LoRA adapters" in lines[0] and "not a directory" in lines[1], lines
