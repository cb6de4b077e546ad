"""The metrics contract and console progress.

Rank 0 appends one JSON object per training iteration to ``<log-dir>/metrics.jsonl`` with at least
``iteration``, ``loss`` (LM loss averaged over the global batch), ``grad_norm``, ``lr``, ``tokens_per_sec``
(``--model llava``: also ``image_tokens``, the image embeddings in the step's global batch);
and prints a Megatron-style progress line every ``--log-interval`` iterations (with what the --log-* flags
added to the row: TFLOP/s per device, MFU, parameter norm, zeros in the gradients; training/observability/run_hooks.py).
Optionally: the same scalars as tensorboard events every ``--tensorboard-log-interval`` iterations (at most
``--tensorboard-queue-size`` events held before a write), and a tqdm progress bar (loss, tokens/s) when the
console is a terminal. A resumed
run drops rows past its checkpoint before appending, so the file stays one row per iteration.
May assume: called on every rank; only rank 0 writes.
"""

from __future__ import annotations

import json
import math
import os
import sys


class MetricsWriter:
    def __init__(self, log_dir: str, rank: int, train_iters: int, log_interval: int, resume: bool,
                 start: int | None = None, tensorboard_dir: str | None = None, progress: bool = False,
                 tensorboard_log_interval: int = 1, tensorboard_queue_size: int = 1000):
        self.rank = rank
        self.tensorboard_log_interval = tensorboard_log_interval
        self.train_iters = train_iters
        self.log_interval = max(1, log_interval)
        self._file = None
        self._tb = None
        self._bar = None
        self.tensorboard_skip: set = set()  # row keys not written as tensorboard events (--no-log-loss-scale-...)
        if rank == 0:
            os.makedirs(log_dir, exist_ok=True)
            self.path = os.path.join(log_dir, "metrics.jsonl")
            if resume and start is not None and os.path.isfile(self.path):
                with open(self.path) as f:
                    kept = [line for line in f if json.loads(line)["iteration"] <= start]
                with open(self.path, "w") as f:
                    f.writelines(kept)
            self._file = open(self.path, "a" if resume else "w", buffering=1)
            if tensorboard_dir:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(tensorboard_dir, max_queue=tensorboard_queue_size)
            if progress:
                from tqdm import tqdm

                # disable=None: shown only when the console is a terminal (not in logs or CI)
                self._bar = tqdm(total=train_iters, initial=start or 0, unit="it", dynamic_ncols=True,
                                 disable=None, file=sys.stderr)

    def log(self, row: dict) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(row) + "\n")
        it = row["iteration"]
        if self._tb is not None and it % self.tensorboard_log_interval == 0:
            for key, value in row.items():
                if (key != "iteration" and key not in self.tensorboard_skip and isinstance(value, (int, float))
                        and value is not None):
                    self._tb.add_scalar(key, float(value), it)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{row['tokens_per_sec']:.0f}", refresh=False)
        if it % self.log_interval == 0 or it == self.train_iters:
            grad_norm = row["grad_norm"]
            norm = "   n/a" if grad_norm is None or math.isnan(grad_norm) else f"{grad_norm:7.3f}"
            extra = "".join(f" | {k} {row[k]:.4f}" for k in ("moe_aux_loss", "moe_z_loss", "mtp_loss",
                                                              "val_loss") if row.get(k) is not None)
            if row.get("loss_scale") is not None:  # Megatron-LM's wording (1.0 without --fp16)
                extra += f" | loss scale: {row['loss_scale']:.1f}"
            extra += _observability_fields(row)
            if row.get("image_tokens") is not None:  # --model llava
                extra += f" | image tokens {row['image_tokens']}"
            if row.get("skipped"):
                extra += (f" | step skipped (inf/nan loss or gradients; with fp16 the loss scale is lowered)"
                          f" | {row.get('skipped_steps', 1)} skipped so far")
            self._print(f" iteration {it:6d}/{self.train_iters:6d} | loss {row['loss']:.5f} | grad norm {norm}"
                  f" | lr {row['lr']:.3e} | {row['tokens_per_sec']:9.1f} tokens/s"
                  f" | {row['step_time_ms']:8.1f} ms/it{extra}")

    def _print(self, line: str) -> None:
        if self._bar is not None and not self._bar.disable:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._file is not None:
            self._file.close()
            self._file = None


def _observability_fields(row: dict) -> str:
    """The log-line fields of --log-throughput, --log-num-zeros-in-grad and --log-params-norm (when in the row)."""
    text = ""
    if row.get("throughput") is not None:  # Megatron-LM's wording; 4 significant digits (cpu runs are tiny)
        text += f" | throughput per GPU (TFLOP/s/GPU): {row['throughput']:.4g}"
    if row.get("mfu") is not None:
        text += f" | MFU {100 * row['mfu']:.1f}%"
    if row.get("num_zeros_in_grad") is not None:
        text += f" | num zeros: {row['num_zeros_in_grad']}"
    if row.get("params_norm") is not None:
        text += f" | params norm: {row['params_norm']:.3f}"
    return text


def print_rank0(rank: int, *message) -> None:
    if rank == 0:
        print(*message, flush=True, file=sys.stdout)
