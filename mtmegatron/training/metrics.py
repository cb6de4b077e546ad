"""The metrics contract and console progress.

Rank 0 appends one JSON object per training iteration to ``<log-dir>/metrics.jsonl`` with at least
``iteration``, ``loss`` (LM loss averaged over the global batch), ``grad_norm``, ``lr``, ``tokens_per_sec``;
and prints a Megatron-style progress line every ``--log-interval`` iterations.
May assume: called on every rank; only rank 0 writes.
"""

from __future__ import annotations

import json
import math
import os
import sys


class MetricsWriter:
    def __init__(self, log_dir: str, rank: int, train_iters: int, log_interval: int, resume: bool):
        self.rank = rank
        self.train_iters = train_iters
        self.log_interval = max(1, log_interval)
        self._file = None
        if rank == 0:
            os.makedirs(log_dir, exist_ok=True)
            self.path = os.path.join(log_dir, "metrics.jsonl")
            self._file = open(self.path, "a" if resume else "w", buffering=1)

    def log(self, row: dict) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(row) + "\n")
        it = row["iteration"]
        if it % self.log_interval == 0 or it == self.train_iters:
            grad_norm = row["grad_norm"]
            norm = "   n/a" if grad_norm is None or math.isnan(grad_norm) else f"{grad_norm:7.3f}"
            extra = "".join(f" | {k} {row[k]:.4f}" for k in ("moe_aux_loss", "mtp_loss") if k in row)
            if row.get("skipped"):
                extra += " | step skipped (inf/nan gradients, loss scale lowered)"
            print(f" iteration {it:6d}/{self.train_iters:6d} | loss {row['loss']:.5f} | grad norm {norm}"
                  f" | lr {row['lr']:.3e} | {row['tokens_per_sec']:9.1f} tokens/s"
                  f" | {row['step_time_ms']:8.1f} ms/it{extra}", flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def print_rank0(rank: int, *message) -> None:
    if rank == 0:
        print(*message, flush=True, file=sys.stdout)
