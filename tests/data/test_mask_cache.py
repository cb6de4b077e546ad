"""A sample's loss mask does not depend on which sample the process read first (megatron-core 0.16's GPTDataset
zeroes the first sample's pad positions in its cached mask; training/data.py's datasets keep the cache clean).
The mock tokenizer has no pad id (as Megatron-LM's NullTokenizer), so the test gives it one, as a real tokenizer
with a pad id 0 has."""

from __future__ import annotations

import pytest
import torch

from mtmegatron.training import data
from mtmegatron.config.arguments import parse_args
from mtmegatron.data.section import GptData
from mtmegatron.training.data import build_mock_dataset

# vocab 64: megatron's mock documents count 1, 2, ... modulo the vocabulary, so label 0 (the pad id below) occurs
FLAGS = ["--backend", "cpu", "--model", "llama3", "--mock-data", "--vocab-size", "64", "--seq-length", "64",
         "--max-position-embeddings", "64", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--num-query-groups", "2",
         "--ffn-hidden-size", "32", "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "8"]


class _TokenizerWithPad(data.MockTokenizer):
    pad = 0


@pytest.fixture(autouse=True)
def _pad_id_0(monkeypatch):
    monkeypatch.setattr(data, "MockTokenizer", _TokenizerWithPad)


def _masks(order: list[int]) -> dict[int, torch.Tensor]:
    dataset = build_mock_dataset(GptData.of(parse_args(FLAGS, world_size=1)), 16)
    return {i: dataset[i]["loss_mask"].clone() for i in order}


def test_loss_mask_does_not_depend_on_the_read_order():
    forward, backward = _masks(list(range(8))), _masks(list(reversed(range(8))))
    assert any(m.sum() < m.numel() for m in forward.values())  # some samples do have masked (pad) labels
    for i in range(8):
        assert torch.equal(forward[i], backward[i]), i
        labels_are_pad = build_mock_dataset(GptData.of(parse_args(FLAGS, world_size=1)), 16)[i]["labels"] == 0
        assert torch.equal(forward[i] == 0, labels_are_pad), i  # masked exactly where this sample's label is pad
