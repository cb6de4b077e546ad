"""The memory flags' rules (config/memory_flags.py): each bad combination is one clear error from the pretrain
command before any process group starts."""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY, run_pretrain

CASES = {
    "offload without precision-aware": (["--use-distributed-optimizer", "--optimizer-cpu-offload"],
                                        "--optimizer-cpu-offload needs --use-precision-aware-optimizer"),
    "precision-aware without distopt": (["--use-precision-aware-optimizer"],
                                        "--use-precision-aware-optimizer needs --use-distributed-optimizer"),
    "fraction out of range": (["--use-distributed-optimizer", "--use-precision-aware-optimizer",
                               "--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.5"],
                              "--optimizer-offload-fraction must be between 0 and 1"),
    "overlap d2h without offload": (["--overlap-cpu-optimizer-d2h-h2d"], "need --optimizer-cpu-offload"),
    "torch host optimizer without offload": (["--use-torch-optimizer-for-cpu-offload"],
                                             "need --optimizer-cpu-offload"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_combination_is_one_clear_error(case, tmp_path):
    extra, message = CASES[case]
    proc, rows = run_pretrain(1, TINY + ["--train-iters", "1", *extra], tmp_path, expect_ok=False, timeout=120)
    assert proc.returncode != 0 and not rows
    output = proc.stdout + proc.stderr
    assert message in output, output[-2000:]
    assert "Traceback" not in output and "process group" not in output.lower(), output[-2000:]
