"""``--sft`` and its flags (Megatron-LM names where Megatron-LM has them), and their rules.

Honoured Megatron-LM flags: ``--sft``, ``--sft-tokenizer-prompt-format`` (Megatron-LM's default
``nemotron-h-aligned`` plus our built-ins and ``tokenizer``), ``--calculate-per-token-loss``. Ours:
``--no-sft-packing`` (pad one conversation per row instead of packing), ``--sft-drop-unanswered`` (leave out
the conversations that the cut to ``--seq-length`` leaves without an assistant token). ``--reset-position-ids``,
``--reset-attention-mask`` and ``--eod-mask-loss`` belong to the pretraining data path (training/data.py);
SFT packing always restarts positions and attention per conversation, and trains on the EOD token after an
assistant turn.
Packing works under ``--context-parallel-size`` too: each conversation is padded to a multiple of 2 x CP and
split per conversation across the CP ranks (docs/sft.md).
Under ``--sft`` the loss is averaged per token over the whole global batch (``calculate_per_token_loss`` is
switched on), so packing and micro-batch boundaries do not change the gradient.
May assume: nothing beyond argparse (imported before megatron-core).
"""

from __future__ import annotations

import argparse

from mtmegatron.models import families
from mtmegatron.sft.templates import PROMPT_FORMATS


def add_sft_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("supervised fine-tuning (see docs/sft.md)")
    g.add_argument("--sft", action="store_true",
                   help="fine-tune on conversations: --data-path names JSONL files (messages, ShareGPT or Alpaca "
                        "records; default: the embedded arithmetic task), loss on assistant tokens only")
    g.add_argument("--sft-tokenizer-prompt-format", type=str, default="nemotron-h-aligned",
                   help="chat template: 'tokenizer' (tokenizer_config.json's chat_template) or a built-in: "
                        "llama3, chatml (= qwen), plain, nemotron-h-aligned")
    g.add_argument("--no-sft-packing", dest="sft_packing", action="store_false",
                   help="lay each conversation out in its own padded row instead of packing them (THD)")
    g.add_argument("--sft-drop-unanswered", action="store_true",
                   help="leave out the conversations that the cut to --seq-length leaves without any assistant "
                        "token (default: keep them, warned about: they train on nothing)")
    g.add_argument("--calculate-per-token-loss", action="store_true",
                   help="average the loss over all loss tokens of the global batch, not per micro-batch")


def check_sft_args(args: argparse.Namespace, error: type[Exception]) -> None:
    if args.calculate_per_token_loss and families.of(args).is_multimodal:
        raise error("--calculate-per-token-loss is not supported with --model llava (its loss is per micro-batch)")
    if not args.sft:
        if not args.sft_packing or args.sft_drop_unanswered:
            raise error(f"{'--no-sft-packing' if not args.sft_packing else '--sft-drop-unanswered'} needs --sft")
        return
    if args.sft_tokenizer_prompt_format not in PROMPT_FORMATS:
        raise error(f"--sft-tokenizer-prompt-format {args.sft_tokenizer_prompt_format!r} is unknown "
                    f"(choose from {', '.join(PROMPT_FORMATS)})")
    if args.mock_data:
        raise error("--sft reads conversations; --mock-data has none")
    if families.of(args).is_multimodal:
        raise error("--sft is for text models; --model llava trains on its own conversations already")
    if args.sequence_parallel and args.seq_length % args.tensor_model_parallel_size:
        raise error(f"--sequence-parallel needs --seq-length {args.seq_length} divisible by "
                    f"--tensor-model-parallel-size {args.tensor_model_parallel_size}")
    args.calculate_per_token_loss = True
