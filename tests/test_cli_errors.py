"""Bad input to ``mtmegatron.pretrain`` under real launches (one process, torchrun): one clear message, exit 2,
no process group (the table of bad inputs, run in-process: tests/test_bad_inputs.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.pretrain_runner import TINY, free_port

BANNER = "mtmegatron: backend"  # printed only after process groups and the model exist


def _pretrain(args: list[str], nproc: int = 1, python_prefix: list[str] | None = None):
    if nproc == 1:
        cmd = [sys.executable, *(python_prefix or ["-m", "mtmegatron.pretrain"])]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               f"--master_port={free_port()}", "-m", "mtmegatron.pretrain"]
    return subprocess.run(cmd + args, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def _error_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("mtmegatron.pretrain: error:")]


def _without_backend(args):
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--backend":
            skip = True
            continue
        out.append(a)
    return out


BASE = _without_backend(TINY) + ["--train-iters", "1"]

def test_world_size_error_under_torchrun_is_printed_once():
    # 2 ranks, PP 4: the layout cannot fit; only rank 0 speaks.
    proc = _pretrain(BASE + ["--pipeline-model-parallel-size", "4"], nproc=2)
    assert proc.returncode != 0
    errors = _error_lines(proc)
    assert errors == ["mtmegatron.pretrain: error: world size 2 is not divisible by TP 1 x PP 4 x CP 1"], proc.stderr[-3000:]
    assert BANNER not in proc.stdout


def test_unsupported_megatron_version_is_refused():
    fake_old = ("import sys, runpy, megatron.core.package_info as info; info.__version__ = '0.15.0'; "
                "sys.argv[0] = 'mtmegatron.pretrain'; runpy.run_module('mtmegatron.pretrain', run_name='__main__')")
    proc = _pretrain(BASE + ["--backend", "cpu"], python_prefix=["-c", fake_old])
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = _error_lines(proc)
    assert len(errors) == 1 and "megatron-core 0.15.0 is not supported" in errors[0]
    assert "MTMEGATRON_ALLOW_UNSUPPORTED_MEGATRON=1" in errors[0]
    assert BANNER not in proc.stdout


def test_moe_with_tp_needs_sequence_parallel():
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.utils.errors import ConfigError

    flags = ["--backend", "cpu", "--model", "mixtral", "--tensor-model-parallel-size", "2", "--mock-data"]
    with pytest.raises(ConfigError, match="needs --sequence-parallel"):
        parse_args(flags, world_size=2)
    assert parse_args(flags + ["--sequence-parallel"], world_size=2).sequence_parallel


TORCHRUN_CASES = {
    "typo_flag": (["--backend", "cpu", "--trian-iters", "3"],
                  "unknown flag --trian-iters (did you mean --train-iters?)"),
    "tp_heads": (["--backend", "cpu", "--model", "llama3", "--mock-data", "--num-attention-heads", "6",
                  "--hidden-size", "96", "--num-query-groups", "6", "--tensor-model-parallel-size", "4"],
                 "--tensor-model-parallel-size 4 does not divide --num-attention-heads 6"),
    "missing_data": (["--backend", "cpu", "--data-path", "/nonexistent/corpus_text_document",
                      "--tokenizer-model", "/nonexistent/tok"],
                     "dataset /nonexistent/corpus_text_document: missing"),
}


@pytest.mark.parametrize("case", list(TORCHRUN_CASES))
def test_user_error_under_torchrun_is_status_2_and_one_line(case):
    # The whole of stderr is the one message: no per-rank copies, no usage dump, no torchrun report.
    extra, message = TORCHRUN_CASES[case]
    proc = _pretrain(extra, nproc=2)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mtmegatron.pretrain: error: ") and message in lines[0], \
        proc.stderr[-3000:]
    assert BANNER not in proc.stdout


def test_crash_under_torchrun_keeps_torchrun_report():
    # Only pretrain's user errors (status 2) are quieted: another failure keeps torchrun's status and report.
    from mtmegatron.training.resilience import torchrun_exit

    script = "import sys; sys.exit(3)"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1",
                           f"--master_port={free_port()}", "--no-python", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1 and "ChildFailedError" in proc.stderr
    assert not torchrun_exit.install(["torchrun", "--nproc_per_node", "2", "train.py"])


def test_unknown_flag_is_one_line_with_a_suggestion():
    proc = _pretrain(["--backend", "cpu", "--tensor-model-paralel-size", "2", "--lr", "1e-3"])
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("mtmegatron.pretrain: error: unknown flag --tensor-model-paralel-size "
                                   "(did you mean --tensor-model-parallel-size?) (see --help)")


def test_help_describes_every_flag_with_its_default_and_how_to_launch():
    from mtmegatron.config.arguments import build_parser

    parser = build_parser()
    undescribed = [a.option_strings[0] for a in parser._actions if not (a.help and a.help.strip())]
    assert undescribed == []
    proc = _pretrain(["--help"])
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "usage: torchrun --nproc_per_node N -m mtmegatron.pretrain" in text
    assert "torchrun --nproc_per_node 2 -m mtmegatron.pretrain" in text.split("launch", 1)[1]
    for flag, default in (("--adam-beta2", "0.999"), ("--hidden-dropout", "0.1"), ("--lr-decay-style", "linear"),
                          ("--tensor-model-parallel-size", "1"), ("--attention-backend", "auto"),
                          ("--transformer-impl", "transformer_engine")):  # Megatron-LM's defaults
        after = text.split(f" {flag} ", 1)[1]
        assert f"(default: {default})" in after.split(" --", 1)[0], after[:300]
    assert "(default: None)" not in text
    assert "a --model preset fills it when not given" in text
    assert "refused unless at its default: reinforcement-learning training is not part of mtmegatron" in text
