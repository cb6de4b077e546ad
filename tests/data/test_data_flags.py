"""Megatron-LM's data flags on real megatron-core GPT datasets, checked token by token (config/data_flags.py,
training/data.py), without process groups:

* ``--eod-mask-loss``: the loss mask is 0 exactly at end-of-document tokens; ``--reset-position-ids``: position
  ids restart at 0 after each EOD; ``--reset-attention-mask``: the boolean mask (True = masked) is causal and
  block-diagonal over documents; all three off: mask all ones, positions 0..s-1, no attention mask in the batch.
  These are megatron-core's GPTDataset computing them from the config Megatron-LM's ``pretrain_gpt.py`` builds
  from the same flags, so the config fields are asserted too.
* ``--num-workers 2`` reads the very same micro-batches as 0 (workers change where samples are read, not which).
* ``--train-data-path/--valid-data-path`` are separate blends (each split reads only its own corpus), a
  weighted ``--data-path`` blend draws in its weights' proportion, ``--split`` defaults to Megatron-LM's
  ``969, 30, 1``, ``--no-mmap-bin-files`` reads the same tokens without mmap; mistakes are one ConfigError.
* ``--full-validation --multiple-validation-sets`` (one pretrain launch, NullTokenizer over the two corpora): one
  validation set per ``--valid-data-path`` prefix, each read whole (every sample of its one epoch, recorded by
  the data test hook) and reported as its own loss (``val_loss_0``, ``val_loss_1``; ``val_loss`` is set 0's).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.pretrain_runner import run_pretrain

from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError
from mtmegatron.training.data import MockTokenizer, TextReader, build_gpt_datasets
from mtmegatron.data.section import GptData, Splits
from mtmegatron.data.splits import empty_splits

VOCAB, SEQ = 64, 32
EOD = VOCAB - 1  # MockTokenizer's
BASE = ["--backend", "cpu", "--model", "llama3", "--num-layers", "2", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
        "--vocab-size", str(VOCAB), "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4",
        "--num-workers", "0"]
DOCUMENT_FLAGS = ["--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask"]


def _write_corpus(prefix: str, low: int, high: int, seed: int) -> str:
    """200 documents of 3..20 tokens drawn from [low, high), each ending with EOD, as megatron-core's
    indexed dataset (the format ``mtmegatron preprocess`` writes)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for _ in range(200):
        document = np.append(rng.integers(low, high, rng.integers(3, 21)), EOD)
        builder.add_document(torch.from_numpy(document), [len(document)])
    builder.finalize(prefix + ".idx")
    return prefix


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("data_flags")
    # documents start at 1: token 0 is the pad id of most real tokenizers (megatron masks its loss)
    return {"a": _write_corpus(str(root / "a"), 1, 31, 0), "b": _write_corpus(str(root / "b"), 31, EOD, 1)}


def _datasets(flags: list[str]):
    args = parse_args(BASE + flags, world_size=1)
    train, valid = build_gpt_datasets(GptData.of(args), Splits.of(args), 64, 16, MockTokenizer(VOCAB))
    return args, train, valid


def _first_batches(dataset, args, count: int = 4) -> list[dict]:
    iterator = TextReader.of(args, args.data_parallel_size)(dataset, 0, 0)
    return [next(iterator) for _ in range(count)]


def _documents(tokens: torch.Tensor) -> torch.Tensor:
    """Document number of each position: the EODs strictly before it (an EOD ends its own document)."""
    is_eod = (tokens == EOD).long()
    return torch.cumsum(is_eod, 0) - is_eod


def test_document_flags_change_exactly_what_megatron_lm_does(corpora):
    args, train, _ = _datasets(["--data-path", corpora["a"]] + DOCUMENT_FLAGS)
    config = train.datasets[0].config if hasattr(train, "datasets") else train.config
    assert (config.eod_mask_loss, config.reset_position_ids, config.reset_attention_mask,
            config.create_attention_mask, config.mmap_bin_files) == (True, True, True, True, True)
    eods_inside = 0
    for batch in _first_batches(train, args):
        assert batch["attention_mask"].shape == (2, 1, SEQ, SEQ) and batch["attention_mask"].dtype == torch.bool
        for tokens, loss_mask, positions, mask in zip(batch["tokens"], batch["loss_mask"], batch["position_ids"],
                                                     batch["attention_mask"][:, 0]):
            assert torch.equal(loss_mask, (tokens != EOD).float())
            documents = _documents(tokens)
            starts = [0] + [i + 1 for i in range(SEQ - 1) if tokens[i] == EOD]
            expected_positions = torch.tensor([i - max(s for s in starts if s <= i) for i in range(SEQ)])
            assert torch.equal(positions, expected_positions)
            rows, cols = torch.meshgrid(torch.arange(SEQ), torch.arange(SEQ), indexing="ij")
            visible = (cols <= rows) & (documents[cols] == documents[rows])
            assert torch.equal(mask, ~visible)  # True = masked, megatron-core's convention
            eods_inside += int((tokens[:-1] == EOD).sum())
    assert eods_inside > 8  # the batches do cross document boundaries, so the checks above can fail

    args, unmasked, _ = _datasets(["--data-path", corpora["a"], "--no-create-attention-mask-in-dataloader"]
                                  + DOCUMENT_FLAGS)
    assert "attention_mask" not in _first_batches(unmasked, args, 1)[0]  # Megatron-LM's switch: no mask built

    args, plain, _ = _datasets(["--data-path", corpora["a"]])
    for batch, with_flags in zip(_first_batches(plain, args), _first_batches(train, args)):
        assert torch.equal(batch["tokens"], with_flags["tokens"])  # the flags change masks/positions only
        assert "attention_mask" not in batch  # causal mask type: nothing built or passed
        assert torch.equal(batch["loss_mask"], torch.ones(2, SEQ))
        assert torch.equal(batch["position_ids"], torch.arange(SEQ).expand(2, SEQ))


def test_workers_read_the_same_micro_batches(corpora):
    args, train, _ = _datasets(["--data-path", corpora["a"]] + DOCUMENT_FLAGS)
    in_process = _first_batches(train, args, 6)
    args.num_workers = 2
    with_workers = _first_batches(train, args, 6)
    for a, b in zip(in_process, with_workers):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_per_split_paths_blend_weights_split_default_and_mmap(corpora):
    a, b = corpora["a"], corpora["b"]
    args, train, valid = _datasets(["--train-data-path", a, "--valid-data-path", b])
    assert args.split is None
    train_tokens = torch.cat([m["tokens"] for m in _first_batches(train, args)])
    valid_tokens = torch.cat([m["tokens"] for m in _first_batches(valid, args)])
    assert ((train_tokens < 31) | (train_tokens == EOD)).all()  # corpus a only
    assert ((valid_tokens >= 31)).all()  # corpus b only (its tokens and EOD are >= 31)

    args, _, _ = _datasets(["--data-path", a])
    assert args.split == "969, 30, 1"  # Megatron-LM's default when --data-path comes without --split
    # a weighted blend asks samples of every split (megatron-core: no one-epoch default with weights); on 200
    # documents the default split leaves test empty, where megatron-core's GPTDataset would loop forever
    weighted = parse_args(BASE + ["--data-path", "0.75", a, "0.25", b], world_size=1)
    assert empty_splits(Splits.of(weighted), 200, 16) == ["test"] and empty_splits(Splits.of(args), 200, 16) == []
    args, blend, _ = _datasets(["--data-path", "0.75", a, "0.25", b, "--split", "90,10,0"])
    share_a = float(np.mean(blend.dataset_index == 0))
    assert abs(share_a - 0.75) < 0.05, share_a

    args, mapped, _ = _datasets(["--data-path", a, "--split", "90,5,5"])
    args_file, unmapped, _ = _datasets(["--data-path", a, "--split", "90,5,5", "--no-mmap-bin-files"])
    assert mapped.dataset.mmap and not unmapped.dataset.mmap
    for x, y in zip(_first_batches(mapped, args), _first_batches(unmapped, args_file)):
        assert torch.equal(x["tokens"], y["tokens"])


def _one_epoch_samples(prefix: str) -> int:
    """Samples in one epoch of a prefix: its tokens, less the extra label token, in sequences of SEQ."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(prefix)  # its mmap must outlive the read
    return (int(dataset.sequence_lengths.sum()) - 1) // SEQ


def test_full_validation_reads_each_valid_prefix_whole_as_its_own_set(corpora, tmp_path):
    a, b = corpora["a"], corpora["b"]
    record = tmp_path / "record"
    record.mkdir()
    flags = BASE[:BASE.index("--vocab-size")] + BASE[BASE.index("--vocab-size") + 2:] + [
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB - 1), "--lr", "1e-3",
        "--train-iters", "2", "--eval-interval", "2", "--global-batch-size", "2", "--log-interval", "1",
        "--train-data-path", a, "--valid-data-path", a, b, "--full-validation", "--multiple-validation-sets"]
    proc, rows = run_pretrain(1, flags, tmp_path / "run", env={"MTMEGATRON_TEST_TRAINED_SAMPLES": str(record)})
    sizes = [_one_epoch_samples(a), _one_epoch_samples(b)]
    for index, size in enumerate(sizes):
        read = [s for line in (record / f"valid{index}-rank0.jsonl").read_text().splitlines()
                for s in json.loads(line)["samples"]]
        assert sorted(read) == list(range(size // 2 * 2)), (index, size, len(read))  # G=2: the whole epoch
        assert f"validation-{index} set of {size} samples read as {size // 2} global batches" in proc.stdout
    evaluated = [r for r in rows if "val_loss" in r]
    assert [r["iteration"] for r in evaluated] == [2]
    row = evaluated[0]
    assert row["val_loss"] == row["val_loss_0"] and np.isfinite(row["val_loss_1"])
    assert abs(row["val_loss_0"] - row["val_loss_1"]) > 1e-3  # two corpora of disjoint tokens: two losses


@pytest.mark.parametrize("flags, message", [
    (["--data-path", "P", "--train-data-path", "P"], "mutually exclusive"),
    (["--mock-data", "--train-data-path", "P"], "mutually exclusive"),
    (["--valid-data-path", "P"], "need --train-data-path"),
    (["--train-data-path", "P", "--split", "90,5,5"], "--split divides --data-path"),
    (["--data-path", "P", "--num-workers", "-1"], "--num-workers must be >= 0"),
    (["--mock-data", "--reset-attention-mask", "--context-parallel-size", "2"], "context parallelism"),
    (["--train-data-path", "P", "--valid-data-path", "P", "--multiple-validation-sets"], "needs --full-validation"),
    (["--data-path", "P", "--full-validation", "--multiple-validation-sets"], "give --valid-data-path"),
    (["--mock-data", "--full-validation"], "mock data"),
    (["--data-path", "0.5", "P", "0.5", "Q", "--full-validation"], "weighted blend"),
])
def test_data_flag_mistakes_are_one_clear_error(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(BASE + flags, world_size=2)
