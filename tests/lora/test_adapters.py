"""LoRA adapters on one rank, in-process (mtmegatron/lora/): a wrapped tiny Llama computes what its base does
(B starts at zero), only adapter weights need a gradient, and a merged model computes what the adapters do (fp32)."""

from __future__ import annotations

import pytest
import torch

from mtmegatron.config.arguments import parse_args

FLAGS = ["--backend", "cpu", "--model", "llama3", "--num-layers", "2", "--hidden-size", "64",
         "--num-attention-heads", "4", "--num-query-groups", "2", "--ffn-hidden-size", "128", "--seq-length", "16",
         "--max-position-embeddings", "16", "--vocab-size", "128", "--micro-batch-size", "1",
         "--global-batch-size", "1", "--train-iters", "1", "--mock-data", "--transformer-impl", "local",
         "--lora-r", "4", "--lora-alpha", "8"]


@pytest.fixture(scope="module")
def model():
    from helpers.hf_parity import converted_model

    from mtmegatron.lora.wrap import wrap

    args, base = converted_model(1, "cpu", FLAGS, None)
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(16).expand_as(tokens)
    with torch.no_grad():
        before = base(tokens, positions, None)
    (wrapped,) = wrap([base], args)
    yield args, wrapped, tokens, positions, before
    from megatron.core import parallel_state
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def test_wrapped_model_equals_its_base_at_init(model):
    _, wrapped, tokens, positions, before = model
    with torch.no_grad():
        assert torch.equal(wrapped(tokens, positions, None), before)


def test_only_adapters_need_gradients(model):
    _, wrapped, _, _, _ = model
    trained = sorted(name for name, p in wrapped.named_parameters() if p.requires_grad)
    assert len(trained) == 2 * 2 * 4  # 2 layers x 4 targets x (A, B)
    assert all(name.rsplit(".", 1)[1] in ("lora_a", "lora_b") for name in trained), trained


def test_merged_weights_compute_what_the_adapters_do(model):
    from mtmegatron.lora.wrap import adapters, merge

    _, wrapped, tokens, positions, before = model
    with torch.no_grad():
        for _, _, lora in adapters([wrapped]):
            lora.lora_b.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
        adapted = wrapped(tokens, positions, None)
        assert (adapted - before).abs().max() > 1e-3  # the adapters now change the output
        merge([wrapped])
        merged = wrapped(tokens, positions, None)
    assert (merged - adapted).abs().max() < 1e-5
