"""``--log-progress``: ``<--save>/progress.txt`` as Megatron-LM 0.16.1 writes it (megatron/training/utils.py
``append_to_progress_log``, training.py ``compute_throughputs_and_append_to_progress_log``).

One tab-separated line per event, appended by rank 0 after a barrier; nothing without ``--save``:
``<date time>\\tJob ID: <SLURM_JOB_ID>\\t# GPUs: <world size>\\tStarting job`` when training starts, and after
each persistent checkpoint ``...\\tSaved checkpoint\\tIteration: I\\tJob throughput: X TFLOP/s/GPU\\tCumulative
throughput: Y TFLOP/s/GPU\\tFloating-point operations: F\\tTokens (in billions): T``. F counts the model FLOPs of
every trained iteration (training/observability/throughput.py, Megatron-LM's formula) on top of the loaded checkpoint's
``num_floating_point_operations_so_far``, which each save under ``--log-progress`` records (without it mtmegatron
does not count FLOPs and a checkpoint carries the loaded value or 0); the job throughput is over this job (from
when training started), the cumulative one since the first "Starting job" line of the same world size
(Megatron-LM's reading of the file).
May assume: process groups are up; the flags validated (padded vocabulary set).
"""

from __future__ import annotations

import os
import time
from datetime import datetime

import torch

from mtmegatron.training.observability.section import Observability, Shape
from mtmegatron.training.observability.throughput import num_floating_point_operations

FILENAME = "progress.txt"


def _field(token: str, kind):
    return kind(token.split(": ")[1])


class ProgressLog:
    def __init__(self, observability: Observability, shape: Shape, flops_so_far: float):
        self.save, self.shape = observability.save, shape
        self.active = bool(observability.log_progress and observability.save)
        self.world_size = torch.distributed.get_world_size()
        self.flops_at_start = self.flops = float(flops_so_far or 0)
        self.started = time.time()
        if self.active:
            self.append("Starting job")

    @property
    def path(self) -> str:
        return os.path.join(self.save, FILENAME)

    def append(self, text: str) -> None:
        torch.distributed.barrier()
        if torch.distributed.get_rank() == 0:
            os.makedirs(self.save, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}\tJob ID: {os.getenv('SLURM_JOB_ID', '')}\t"
                        f"# GPUs: {self.world_size}\t{text}\n")

    def trained(self, global_batch_size: int) -> None:
        if self.active:
            self.flops += num_floating_point_operations(self.shape, global_batch_size)

    def count_in(self, train_state: dict) -> None:
        """Before a save: the checkpoint records the FLOPs so far (its ``num_floating_point_operations_so_far``),
        which a resumed job starts from."""
        if self.active:
            train_state["num_floating_point_operations_so_far"] = self.flops

    def saved(self, iteration: int, consumed_train_samples: int) -> None:
        if not self.active:
            return
        if torch.distributed.get_rank() != 0:  # rank 0 reads the file and writes the line
            self.append("")
            return
        job = (self.flops - self.flops_at_start) / ((time.time() - self.started) * 1e12 * self.world_size)
        start_time, start_flops = self._first_start()
        elapsed = max((datetime.now() - start_time).total_seconds(), 1e-9)
        cumulative = (self.flops - start_flops) / (elapsed * 1e12 * self.world_size)
        tokens = consumed_train_samples * self.shape.seq_length
        self.append(f"Saved checkpoint\tIteration: {iteration}\tJob throughput: {job:.1f} TFLOP/s/GPU\t"
                    f"Cumulative throughput: {cumulative:.1f} TFLOP/s/GPU\t"
                    f"Floating-point operations: {self.flops:.2e}\tTokens (in billions): {tokens / 10**9:.2f}")

    def _first_start(self) -> tuple[datetime, float]:
        """Megatron-LM's get_start_time_from_progress_log: the first "Starting job" of the latest run of jobs
        with this world size, and the FLOPs of the newest checkpoint saved before it."""
        start_time, start_flops, latest_flops = None, None, 0.0
        with open(self.path) as f:
            for line in f:
                tokens = line.strip().split("\t")
                if tokens[3] == "Saved checkpoint":
                    latest_flops = _field(tokens[7], float)
                if _field(tokens[2], int) != self.world_size:
                    start_time = start_flops = None
                    continue
                if tokens[3] == "Starting job" and start_time is None:
                    start_time, start_flops = tokens[0], latest_flops
        return datetime.strptime(start_time, "%Y-%m-%d %H:%M:%S"), start_flops
