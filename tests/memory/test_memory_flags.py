"""Invalid combinations of the memory/overlap flags: each is one message, exit status 2, before any process group.

Every rule is checked through the parser itself (in-process: the message); two cases go through the real
command (exit status 2, one error line, nothing started).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.pretrain_runner import TINY
from mtmegatron.training.arguments import parse_args
from mtmegatron.training.errors import ConfigError

BANNER = "mtmegatron: backend"  # printed only after process groups and the model exist
BASE = TINY + ["--train-iters", "1"]
DISTOPT = ["--use-distributed-optimizer"]
FULL = ["--recompute-granularity", "full"]

CASES = {
    "param_gather_without_distopt": (["--overlap-grad-reduce", "--overlap-param-gather"],
                                     "--overlap-param-gather needs --use-distributed-optimizer"),
    "param_gather_without_grad_reduce": (DISTOPT + ["--overlap-param-gather"],
                                         "--overlap-param-gather needs --overlap-grad-reduce"),
    "bucket_size_without_overlap": (["--ddp-bucket-size", "1000"], "--ddp-bucket-size needs --overlap-grad-reduce"),
    "bucket_size_not_positive": (["--overlap-grad-reduce", "--ddp-bucket-size", "0"],
                                 "--ddp-bucket-size must be a positive number of elements, not 0"),
    "precision_aware_without_distopt": (["--use-precision-aware-optimizer"],
                                        "--use-precision-aware-optimizer needs --use-distributed-optimizer"),
    "offload_without_precision_aware": (DISTOPT + ["--optimizer-cpu-offload"],
                                        "--optimizer-cpu-offload needs --use-precision-aware-optimizer"),
    "offload_side_flags_without_offload": (["--overlap-cpu-optimizer-d2h-h2d"],
                                           "need --optimizer-cpu-offload"),
    "offload_fraction_range": (["--optimizer-offload-fraction", "1.5"],
                               "--optimizer-offload-fraction must be between 0 and 1, not 1.5"),
    "method_without_granularity": (["--recompute-method", "uniform"],
                                   "--recompute-method/--recompute-num-layers/--recompute-modules need "
                                   "--recompute-granularity"),
    "selective_with_method": (["--recompute-granularity", "selective", "--recompute-method", "block"],
                              "--recompute-granularity selective takes --recompute-modules"),
    "mla_up_proj_without_mla": (["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"],
                                "--recompute-modules mla_up_proj needs --multi-latent-attention"),
    "moe_act": (["--recompute-granularity", "selective", "--recompute-modules", "moe_act"],
                "--recompute-modules moe_act needs megatron-core's grouped GEMM experts"),
    "moe_without_experts": (["--recompute-granularity", "selective", "--recompute-modules", "moe"],
                            "--recompute-modules moe/shared_experts need an MoE model"),
    "modules_with_full": (FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "1",
                                  "--recompute-modules", "mlp"],
                          "--recompute-modules applies to --recompute-granularity selective only"),
    "full_without_method": (FULL, "--recompute-granularity full needs --recompute-method uniform|block and "
                                  "--recompute-num-layers"),
    "full_too_many_layers": (FULL + ["--recompute-method", "block", "--recompute-num-layers", "5"],
                             "--recompute-num-layers 5 must be between 1 and the 4 layers of a model chunk"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_invalid_memory_flags_are_one_error(case):
    extra, message = CASES[case]
    with pytest.raises(ConfigError) as raised:
        parse_args(BASE + extra)
    assert message in str(raised.value)


@pytest.mark.parametrize("case", ["param_gather_without_grad_reduce", "full_without_method"])
def test_the_command_exits_2_before_process_groups(case):
    extra, message = CASES[case]
    proc = subprocess.run([sys.executable, "-m", "mtmegatron.pretrain", *BASE, *extra], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mtmegatron.pretrain: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert BANNER not in proc.stdout and "Traceback" not in proc.stderr
