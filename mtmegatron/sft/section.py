"""The values sft/ reads, by flag dest (issue 36's typed sections): how conversations are cut, packed or padded
and cached (``--sft-*``, ``--seq-length``, the seed, the micro-batch size, context parallelism's padding), and
what the held-out report writes (``--eval-iters``, ``--log-dir``, ``--num-samples``).
Built once per call by the SFT task (tasks/sft.py: ``Sft.of(args)``) and handed down; sft/prepare.py, which
completes the run's data flags (``--data-path``, ``--tokenizer-model``) as data/resolve.py does, builds it there.
May assume: the flags were parsed and checked (config/sft_flags.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Sft(Section):
    sft_packing: bool                       # packed THD rows (else padded rows)
    sft_tokenizer_prompt_format: str        # the chat template
    sft_drop_unanswered: bool               # leave out conversations the cut leaves without an answer
    seq_length: int                         # the cut, the packed row's length, the decoding room
    seed: int                               # the packing plan's order; the static engine's sampling seed
    micro_batch_size: int                   # bins per micro-batch (a packed row holds mbs x seq_length tokens)
    context_parallel_size: int              # conversations padded to 2 x CP under CP
    eval_iters: int                         # 0: no held-out evaluation
    log_dir: str                            # sft_eval.json and samples.txt
    num_samples: int                        # answers printed (4x that many written)
