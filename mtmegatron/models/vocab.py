"""Vocabulary padding: the embedding and output layer get ``padded_vocab_size`` rows, a multiple of
``--make-vocab-size-divisible-by`` (default 128) that TP divides, so any vocabulary works under any TP.

Megatron-LM pads to a multiple of ``divisible_by x TP``, which makes the row count depend on the layout (a
checkpoint of vocab 163 has 256 rows under TP2 and 512 under TP4, and loads under neither other TP). Here the
multiple is ``divisible_by`` alone (TP must divide it: any power of two up to 128 does by default), so one
checkpoint loads under every layout; ``--make-vocab-size-divisible-by 256`` at TP2 reproduces Megatron-LM's
row count exactly. The padding rows never affect the math: they start at zero and the output layer's logits
for padded ids are set to -inf (a forward hook), so softmax, loss, gradients and sampling see only the real
vocabulary — the loss equals the unpadded model's, the padding rows stay zero through training, and logits
over the real ids match an HF model of the real vocabulary. ``--padded-vocab-size N`` (Megatron-LM's) sets the rows
to N instead: a converted checkpoint with more rows than its tokenizer (Qwen2.5: 151,936 rows, 151,665 tokens)
keeps them; rows past the vocabulary are padding as above (their logits -inf, their loaded values untouched).
May assume: ``args`` is a pretrain namespace with vocab_size, make_vocab_size_divisible_by and TP size.
"""

from __future__ import annotations

import torch


def padded_vocab_size(vocab_size: int, divisible_by: int) -> int:
    multiple = max(int(divisible_by or 1), 1)
    return -(-vocab_size // multiple) * multiple


def padded_size_given(args) -> bool:
    """``--padded-vocab-size`` on the command line (Megatron-LM's flag: the model's rows, used as given)."""
    return "padded_vocab_size" in args.given_flags


def check_vocab_padding(args, error=ValueError) -> None:
    """Set ``args.padded_vocab_size`` (``--padded-vocab-size`` when given, as in Megatron-LM: a converted HF
    model whose embedding has more rows than its tokenizer keeps them); refuse a row count that the
    tensor-parallel size does not divide, or one below the vocabulary (ids past the rows)."""
    multiple, tp = args.make_vocab_size_divisible_by, args.tensor_model_parallel_size
    if padded_size_given(args):
        if not args.vocab_size <= args.padded_vocab_size or args.padded_vocab_size % tp:
            raise error(f"--padded-vocab-size {args.padded_vocab_size} must be at least the vocabulary "
                        f"({args.vocab_size}) and divisible by --tensor-model-parallel-size {tp}")
        return
    if multiple < 1:
        raise error(f"--make-vocab-size-divisible-by must be >= 1 (got {multiple})")
    args.padded_vocab_size = padded_vocab_size(args.vocab_size, multiple)
    if args.padded_vocab_size % tp:
        raise error(f"--vocab-size {args.vocab_size} is padded to {args.padded_vocab_size} rows "
                    f"(--make-vocab-size-divisible-by {multiple}), which --tensor-model-parallel-size {tp} does not "
                    f"divide: pass --make-vocab-size-divisible-by {multiple * tp}")


def _padded_rows(weight: torch.Tensor, vocab_size: int, partition_start: int) -> slice | None:
    first = max(vocab_size - partition_start, 0)
    return slice(first, None) if first < weight.shape[0] else None


def install_vocab_padding(model, vocab_size: int) -> None:
    """Zero the padding rows of ``model``'s (TP-sharded) embedding and output weights and mask the padded ids'
    logits to -inf. ``model`` is an unwrapped GPTModel chunk; a no-op when nothing is padded."""
    from megatron.core import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    modules = []
    if getattr(model, "pre_process", False):
        modules.append(model.embedding.word_embeddings)
    if getattr(model, "post_process", False) and getattr(model, "output_layer", None) is not None:
        modules.append(model.output_layer)
    for module in modules:
        weight = getattr(module, "weight", None)
        if weight is None:  # a tied output layer takes the embedding's weight at call time
            continue
        rows = _padded_rows(weight, vocab_size, tp_rank * weight.shape[0])
        if rows is not None:
            with torch.no_grad():
                weight[rows] = 0
    if getattr(model, "post_process", False) and getattr(model, "output_layer", None) is not None:
        per_rank = model.vocab_size // parallel_state.get_tensor_model_parallel_world_size()
        if model.vocab_size > vocab_size:
            hook = _mask_hook(vocab_size - tp_rank * per_rank, vocab_size, model.vocab_size)
            model.output_layer.register_forward_hook(hook)


def _mask_hook(first_padded_local: int, vocab_size: int, padded: int):
    def hook(module, inputs, output):
        logits, bias = output
        # gathered over TP (inference), the last dim is the whole padded vocabulary; else this rank's shard
        start = vocab_size if logits.shape[-1] == padded else max(first_padded_local, 0)
        if start < logits.shape[-1]:
            logits = logits.clone()
            logits[..., start:] = float("-inf")
        return logits, bias

    return hook


def rows_mismatch(checkpoint_rows: int, args) -> str:
    """One line for a checkpoint whose embedding has other rows than this run builds, with the flag that fixes it."""
    why = ("--padded-vocab-size" if padded_size_given(args) else
           f"vocabulary {args.vocab_size} padded to a multiple of {args.make_vocab_size_divisible_by}")
    return (f"checkpoint has {checkpoint_rows} embedding rows, this run {args.padded_vocab_size} ({why}): pass "
            f"--padded-vocab-size {checkpoint_rows}")
