"""The fused layer spec (build_layer_spec with --transformer-impl mtmegatron --attention-backend local) builds a megatron-core GPTModel on the CPU backend, and with the local spec's weights its
logits, fused loss and gradients match the local spec's (fp32, tolerance 1e-5 relative / 1e-5 absolute on
logits and loss, 1e-4 on gradients). Single-rank gloo group in-process."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import mtmegatron
from helpers.ports import free_port


@pytest.fixture
def megatron_cpu():
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    mtmegatron.activate("cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1234)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        mtmegatron.deactivate()


def _model(spec):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96, normalization="RMSNorm",
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, use_cpu_initialization=True,
        hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-5,
    )
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=97, max_sequence_length=16,
                    position_embedding_type="rope")


def test_fused_spec_matches_local_spec(megatron_cpu):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from mtmegatron.models.fused_spec import FusedDotProductAttention, FusedMLP, FusedRMSNorm, install_fused_loss
    from mtmegatron.models.gpt import layer_choice
    from mtmegatron.models.layer_spec import build_layer_spec
    from mtmegatron.config.arguments import parse_args

    fused_args = parse_args(["--transformer-impl", "mtmegatron", "--attention-backend", "local", "--mock-data"])
    local = _model(get_gpt_layer_local_spec(normalization="RMSNorm"))
    fused = _model(build_layer_spec(layer_choice(fused_args), "dense"))
    fused.load_state_dict(local.state_dict(), strict=True)
    layer = fused.decoder.layers[0]
    assert isinstance(layer.input_layernorm, FusedRMSNorm) and isinstance(layer.mlp, FusedMLP)
    assert isinstance(layer.self_attention.core_attention, FusedDotProductAttention)
    install_fused_loss(fused)

    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,)).item()))
    tokens = torch.randint(0, 97, (3, 13), generator=gen)  # odd sequence length
    labels = torch.randint(0, 97, (3, 13), generator=gen)
    position_ids = torch.arange(13).unsqueeze(0).expand(3, -1)

    logits_local = local(tokens, position_ids, None)
    logits_fused = fused(tokens, position_ids, None)
    torch.testing.assert_close(logits_fused, logits_local, rtol=1e-5, atol=1e-5)

    loss_local = local(tokens, position_ids, None, labels=labels)
    loss_fused = fused(tokens, position_ids, None, labels=labels)
    torch.testing.assert_close(loss_fused, loss_local, rtol=1e-5, atol=1e-5)
    loss_local.sum().backward()
    loss_fused.sum().backward()
    grads_local = dict(local.named_parameters())
    for name, param in fused.named_parameters():
        torch.testing.assert_close(param.grad, grads_local[name].grad, rtol=1e-4, atol=1e-4, msg=name)
