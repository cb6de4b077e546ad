"""The memory flags' rules (config/memory_flags.py): each bad combination is one clear error while the pretrain
command parses its flags, so before any process group starts.

Checked in-process through the parser the command runs (``parse_args``: a ConfigError of one line). The command's
own handling of such an error (exit status 2, one ``mtmegatron.pretrain: error:`` line, no traceback, nothing
started) is tests/memory/test_memory_flags.py's ``test_the_command_exits_2_before_process_groups``, which runs the
real command for two rules of the same module.
"""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

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
def test_bad_combination_is_one_clear_error(case):
    extra, message = CASES[case]
    with pytest.raises(ConfigError) as raised:
        parse_args(TINY + ["--train-iters", "1", *extra])
    assert message in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
