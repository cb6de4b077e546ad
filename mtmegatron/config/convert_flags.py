"""The command line of ``mtmegatron convert hf-to-mcore`` and ``mtmegatron convert mcore-to-hf``: the two direction
subcommands and their flags. What each runs is convert/commands.py's (it sets ``fn`` on the parsers returned here).
May assume: argparse only; the family registry names the families with an HF mapping.
"""

from __future__ import annotations

import argparse

from mtmegatron.models import families

DTYPES = ("bf16", "fp16", "fp32")  # --dtype's choices (convert/commands.py maps them to torch dtypes)


def add_convert_args(sub) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """Register ``convert hf-to-mcore|mcore-to-hf`` on the ``mtmegatron`` command's subparsers; returns the two
    direction parsers (convert/commands.py sets what each runs)."""
    names = families.with_hf_mapping()
    convert = sub.add_parser("convert", help=f"HF <-> megatron-core checkpoints ({', '.join(names)})")
    kinds = convert.add_subparsers(dest="direction", required=True)
    a = kinds.add_parser("hf-to-mcore", help="HF safetensors -> model-only megatron-core dist checkpoint")
    a.add_argument("--model", required=True, choices=names)
    a.add_argument("--hf-dir", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--peft-in", default=None,
                   help="an HF PEFT LoRA adapter over --hf-dir's model: write it as LoRA adapters (for --lora-load) "
                        "instead of the base")
    a.add_argument("--tensor-model-parallel-size", type=int, default=1)
    a.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    a.add_argument("--expert-model-parallel-size", type=int, default=1)
    a.add_argument("--workers", type=int, default=1,
                   help="worker processes that read, transform and write tensors in parallel (default 1)")
    a.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="dtype of the written weights (default: each tensor's dtype in the HF files; FP8 -> bf16)")
    b = kinds.add_parser("mcore-to-hf", help="megatron-core dist checkpoint -> HF safetensors")
    b.add_argument("--load", required=True)
    b.add_argument("--out", default=None, help="the HF checkpoint to write (required unless --peft-out)")
    b.add_argument("--lora-load", default=None,
                   help="a LoRA run's checkpoint (its --save): write the base with these adapters merged in")
    b.add_argument("--peft-out", default=None,
                   help="with --lora-load: write its adapters as an HF PEFT adapter (adapter_config.json + "
                        "adapter_model.safetensors) here; the merged weights too only when --out is given")
    b.add_argument("--workers", type=int, default=1,
                   help="worker processes that read, transform and write tensors in parallel (default 1)")
    b.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="dtype of the written weights (default: each tensor's dtype in the checkpoint)")
    b.add_argument("--max-shard-mb", type=int, default=5120,
                   help="largest safetensors file to write, in MiB (default 5120, HF's 5 GB; one tensor larger "
                        "than that gets a file of its own)")
    b.add_argument("--image-token-id", type=int, default=None,
                   help="llava: the HF image token id to write (default: the one recorded at conversion; required "
                        "for a checkpoint trained from scratch)")
    b.add_argument("model_flags", nargs=argparse.REMAINDER,
                   help="model flags after '--' for a checkpoint that does not record them")
    return a, b
