"""``--reset-attention-mask`` reaches the model: with the dataset's block-diagonal mask, the forward step
(training/train_step.forward_step, as training calls it) gives the second document of a packed sequence exactly
the per-token losses it has alone at the start of a sequence; without the mask it does not (the check can
fail). Run for mtmegatron's SDPA attention and megatron-core's local attention (one rank, tiny Llama-3).
"""

from __future__ import annotations


from helpers.ranks import run_ranks

SEQ, VOCAB, EOD = 32, 256, 255
FLAGS = ["--backend", "cpu", "--model", "llama3", "--num-layers", "2", "--hidden-size", "64",
         "--num-attention-heads", "4", "--num-query-groups", "2", "--ffn-hidden-size", "128", "--seq-length",
         str(SEQ), "--max-position-embeddings", str(SEQ), "--vocab-size", str(VOCAB), "--micro-batch-size", "1",
         "--global-batch-size", "1", "--train-iters", "1", "--mock-data", "--hidden-dropout", "0",
         "--attention-dropout", "0", "--reset-attention-mask", "--reset-position-ids"]


def _worker(rank, world_size, backend_name):
    import os

    import torch
    from megatron.core import parallel_state
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

    import mtmegatron
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.training.setup import build, init_distributed
    from mtmegatron.training.train_step import forward_step

    backend = mtmegatron.activate(backend_name)
    results = {}
    g = torch.Generator().manual_seed(3)
    first = torch.cat([torch.randint(1, EOD, (9,), generator=g), torch.tensor([EOD])])  # 10 tokens, ends in EOD
    second = torch.randint(1, EOD, (SEQ - 10,), generator=g)
    labels = torch.randint(1, EOD, (SEQ,), generator=g)
    packed = torch.cat([first, second])
    alone = torch.cat([second, torch.randint(1, EOD, (10,), generator=g)])
    alone_labels = torch.cat([labels[10:], labels[:10]])
    for attention in ("auto", "local"):
        for variable in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
            os.environ.pop(variable, None)  # megatron-core sets them per attention backend, once per process
        args = parse_args(FLAGS + ["--attention-backend", attention], world_size=1)
        init_distributed(args, backend)
        model, _, _, _ = build(args)
        model[0].eval()

        def losses(tokens, targets, with_mask: bool):
            mask, loss_mask, positions = _get_ltor_masks_and_position_ids(tokens, EOD, True, True, False, True)
            batch = {"tokens": tokens[None], "labels": targets[None], "loss_mask": loss_mask[None],
                     "position_ids": positions[None]}
            if with_mask:
                batch["attention_mask"] = mask[None]
            with torch.no_grad():
                output, _ = forward_step(iter([batch]), model[0])
            return output[0].float()

        in_pack = losses(packed, labels, True)[10:]
        by_itself = losses(alone, alone_labels, False)[: SEQ - 10]
        unmasked = losses(packed, labels, False)[10:]
        results[attention] = ((in_pack - by_itself).abs().max().item(), (unmasked - by_itself).abs().max().item())
        parallel_state.destroy_model_parallel()
    return results


def test_reset_attention_mask_isolates_documents_in_the_model():
    (results,) = run_ranks(_worker, 1, "cpu", timeout=300)
    for attention, (masked_error, unmasked_error) in results.items():
        print(f"{attention}: packed-vs-alone max |diff| {masked_error:.2e} with the mask, {unmasked_error:.2e} "
              "without")
        assert masked_error < 1e-5, attention
        assert unmasked_error > 1e-3, attention  # the first document leaks in without the mask
