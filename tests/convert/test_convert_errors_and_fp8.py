"""Converter input handling: DeepSeek FP8 block dequantization on read, and clear refusals.

* An FP8 (e4m3) weight with ``<name>_scale_inv`` per 128x128 block (edge blocks partial) is read back as
  ``fp8 value * its block's scale`` for every element, and close to the original fp32 weight.
* HF settings with no megatron equivalent and a ``--model`` that does not match ``model_type`` are refused with
  one message. A config.json that disagrees with the weights, and every other bad input to the converter, is one
  line and exit 2 from the command: tests/test_bad_inputs_tools.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mtmegatron.models.families import ConversionError, for_hf_config, get
from mtmegatron.convert.hf_io import HFCheckpoint

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def test_fp8_block_weights_are_dequantized_on_read(tmp_path):
    # in a subprocess: torch compute in the pytest process can hang the rank processes later tests fork
    proc = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _check_fp8_dequantization(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(200, 300, generator=gen)
    scale_inv = torch.empty(2, 3)
    fp8 = torch.empty(200, 300, dtype=torch.float8_e4m3fn)
    for i in range(2):
        for j in range(3):
            block = weight[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            scale_inv[i, j] = block.abs().max() / 448.0
            fp8[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (block / scale_inv[i, j]).to(torch.float8_e4m3fn)
    save_file({"w": fp8, "w_scale_inv": scale_inv, "norm": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    ckpt = HFCheckpoint(str(tmp_path))
    assert ckpt.names == ["norm", "w"]  # scales are folded into their weights
    read = ckpt["w"]
    assert read.dtype == torch.float32
    for i in range(2):
        for j in range(3):
            rows, cols = slice(i * 128, (i + 1) * 128), slice(j * 128, (j + 1) * 128)
            assert torch.equal(read[rows, cols], fp8[rows, cols].float() * scale_inv[i, j])
    assert (read - weight).abs().max() <= weight.abs().max() * 2 ** -3  # e4m3: 3 mantissa bits


def test_unsupported_hf_settings_are_refused_with_the_reason():
    with pytest.raises(ConversionError, match="--model mixtral does not match"):
        for_hf_config({"model_type": "llama"}, "mixtral")
    with pytest.raises(ConversionError, match="not supported"):
        for_hf_config({"model_type": "gpt2"}, "llama3")
    llama = dict(model_type="llama", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    assert "--group-query-attention" in get("llama3").flags_from_hf(llama)
    with pytest.raises(ConversionError, match="field rope_scaling \\(rope_type 'linear'\\)"):
        get("llama3").flags_from_hf({**llama, "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    with pytest.raises(ConversionError, match="field attention_bias = True"):
        get("llama3").flags_from_hf({**llama, "attention_bias": True})
    deepseek = dict(model_type="deepseek_v3", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                    num_attention_heads=4, vocab_size=128, max_position_embeddings=64, kv_lora_rank=16,
                    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
                    num_experts_per_tok=6, n_group=4, topk_group=2, moe_intermediate_size=32)
    with pytest.raises(ConversionError, match="top-2 experts"):
        get("deepseek-v3").flags_from_hf(deepseek)
    with pytest.raises(ConversionError, match="norm_topk_prob"):
        get("deepseek-v3").flags_from_hf({**deepseek, "num_experts_per_tok": 4, "norm_topk_prob": False})


if __name__ == "__main__":
    _check_fp8_dequantization(Path(sys.argv[1]))
