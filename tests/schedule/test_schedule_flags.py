"""The LR / weight-decay schedule Megatron-LM's flags give, on megatron-core's scheduler as our setup builds it
(``training/schedule.build_scheduler`` from ``parse_args``), stepped as the loop steps it (one global batch of
samples per iteration). Values are checked against the formulas written out here, not read back from the
scheduler:

* ``--train-samples N --lr-warmup-samples W --lr-decay-samples D`` = ``--train-iters N/G --lr-warmup-iters W/G
  --lr-decay-iters D/G`` lr for lr, for every decay style; train_iters = N // G (partial last batch dropped);
* ``--lr-warmup-fraction``, ``--lr-warmup-init``;
* WSD with each ``--lr-wsd-decay-style`` (``--lr-wsd-decay-iters`` or ``-samples``): constant, then the
  annealing formula over the last steps (it crashed before: the WSD steps never reached the scheduler);
* ``--weight-decay-incr-style linear`` from ``--start-weight-decay`` to ``--end-weight-decay``;
* flags of the other mode, or that megatron-core would assert on, are one ConfigError.
A short run (``test_sample_based_wsd_run``) trains with sample-based WSD and logs these lr values.
"""

from __future__ import annotations

import math

import pytest

from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError
from mtmegatron.training.schedule import build_scheduler

G = 8  # global batch
BASE = ["--backend", "cpu", "--model", "llama3", "--mock-data", "--micro-batch-size", "2",
        "--global-batch-size", str(G), "--lr", "1e-3", "--min-lr", "1e-4"]
MAX_LR, MIN_LR = 1e-3, 1e-4


class _Optimizer:
    """What megatron-core's OptimizerParamScheduler touches: the param groups."""

    def __init__(self):
        self.param_groups = [{}]


def lr_per_iteration(flags: list[str], iterations: int | None = None) -> tuple[list[float], list[float], object]:
    """(lr, weight decay) each iteration uses (the scheduler is stepped by G after it), and the args."""
    args = parse_args(BASE + flags, world_size=1)
    optimizer = _Optimizer()
    scheduler = build_scheduler(optimizer, args)
    lrs, wds = [], []
    for _ in range(iterations or args.train_iters):
        lrs.append(optimizer.param_groups[0]["lr"])
        wds.append(optimizer.param_groups[0]["weight_decay"])
        scheduler.step(increment=G)
    return lrs, wds, args


def expected_lr(step: float, warmup: float, decay: float, style: str, init: float = 0.0,
                wsd: float | None = None, wsd_style: str = "exponential") -> float:
    """Megatron's LR formula at ``step`` samples (Loshchilov & Hutter's cosine; WSD of Hu et al.)."""
    if warmup > 0 and step <= warmup:
        return init + (MAX_LR - init) * step / warmup
    if style == "constant":
        return MAX_LR
    if step > decay:
        return MIN_LR
    ratio = (step - warmup) / (decay - warmup)
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    else:  # WSD: stable, then anneal over the last `wsd` steps
        anneal = (step - (decay - wsd)) / wsd
        coeff = 1.0 if anneal <= 0 else {
            "linear": 1.0 - anneal, "cosine": 0.5 * (1.0 + math.cos(math.pi * anneal)),
            "exponential": 2.0 * 0.5 ** anneal - 1.0, "minus_sqrt": 1.0 - math.sqrt(anneal)}[wsd_style]
    return MIN_LR + coeff * (MAX_LR - MIN_LR)


@pytest.mark.parametrize("style", ["linear", "cosine", "constant", "inverse-square-root"])
def test_sample_flags_give_the_iteration_flags_schedule(style):
    by_samples, _, args = lr_per_iteration(["--train-samples", str(12 * G + 5), "--lr-warmup-samples", str(3 * G),
                                            "--lr-decay-samples", str(9 * G), "--lr-decay-style", style])
    assert args.train_iters == 12  # samples // global batch: the partial last batch is dropped
    by_iters, _, _ = lr_per_iteration(["--train-iters", "12", "--lr-warmup-iters", "3", "--lr-decay-iters", "9",
                                       "--lr-decay-style", style])
    assert by_samples == by_iters
    if style != "inverse-square-root":
        expected = [expected_lr(i * G, 3 * G, 9 * G, style) for i in range(12)]
        assert by_samples == pytest.approx(expected, rel=1e-12, abs=0)
    else:  # max_lr * sqrt(warmup / step) after warmup, floored at min_lr
        assert by_samples[5] == pytest.approx(MAX_LR * math.sqrt(3 / 5), rel=1e-12)
    assert by_samples[0] == 0.0 and by_samples[3] == MAX_LR  # warmup from 0 reaches max at 3 iterations


def test_warmup_fraction_and_init():
    lrs, _, _ = lr_per_iteration(["--train-samples", str(10 * G), "--lr-warmup-fraction", "0.25",
                                  "--lr-warmup-init", "2e-4", "--lr-decay-style", "linear"])
    warmup = 0.25 * 10 * G  # a fraction of the decay steps (default --train-samples)
    assert lrs == pytest.approx([expected_lr(i * G, warmup, 10 * G, "linear", init=2e-4) for i in range(10)],
                                rel=1e-12, abs=0)
    assert lrs[0] == 2e-4 and lrs[1] == pytest.approx(2e-4 + 8e-4 * G / warmup)


@pytest.mark.parametrize("wsd_style", ["exponential", "linear", "cosine", "minus_sqrt"])
def test_wsd_follows_its_formula(wsd_style):
    lrs, _, _ = lr_per_iteration(["--train-iters", "12", "--lr-warmup-iters", "2", "--lr-decay-style", "WSD",
                                  "--lr-wsd-decay-iters", "4", "--lr-wsd-decay-style", wsd_style])
    expected = [expected_lr(i * G, 2 * G, 12 * G, "WSD", wsd=4 * G, wsd_style=wsd_style) for i in range(12)]
    assert lrs == pytest.approx(expected, rel=1e-12, abs=1e-18)
    assert lrs[2:9] == [MAX_LR] * 7  # stable until the last 4 iterations of the 12-iteration decay
    assert MIN_LR < lrs[9] < MAX_LR and lrs[11] < lrs[10] < lrs[9]
    by_samples, _, _ = lr_per_iteration(["--train-samples", str(12 * G), "--lr-warmup-samples", str(2 * G),
                                         "--lr-decay-style", "WSD", "--lr-wsd-decay-samples", str(4 * G),
                                         "--lr-wsd-decay-style", wsd_style])
    assert by_samples == lrs


def test_weight_decay_increment():
    _, wds, _ = lr_per_iteration(["--train-iters", "5", "--weight-decay-incr-style", "linear",
                                  "--start-weight-decay", "0.0", "--end-weight-decay", "0.1"])
    assert wds == pytest.approx([0.0, 0.02, 0.04, 0.06, 0.08], abs=1e-15)
    _, constant, _ = lr_per_iteration(["--train-iters", "3", "--weight-decay", "0.05"])
    assert constant == [0.05] * 3


@pytest.mark.parametrize("flags, message", [
    (["--train-iters", "5", "--train-samples", "80"], "--train-iters and --train-samples are mutually exclusive"),
    (["--train-samples", "80", "--lr-decay-iters", "4"], "with --train-samples use --lr-decay-samples"),
    (["--train-samples", "80", "--lr-warmup-iters", "2"], "with --train-samples use --lr-warmup-samples"),
    (["--train-iters", "10", "--lr-warmup-samples", "16"], "with --train-iters use --lr-warmup-iters"),
    (["--train-iters", "10", "--lr-decay-samples", "16"], "with --train-iters use --lr-decay-iters"),
    (["--train-iters", "10", "--lr-decay-style", "WSD"], "WSD needs --lr-wsd-decay-iters"),
    (["--train-samples", "80", "--lr-decay-style", "WSD"], "WSD needs --lr-wsd-decay-samples"),
    (["--train-iters", "10", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "11"],
     "--lr-wsd-decay-iters must be between 1 and the LR decay length"),
    (["--train-iters", "10", "--lr-warmup-iters", "10"], "warmup .* must be shorter than the LR decay"),
    (["--train-iters", "10", "--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "1"], "mutually exclusive"),
    (["--train-iters", "10", "--start-weight-decay", "0.1"], "need --weight-decay-incr-style linear or cosine"),
    (["--train-iters", "10", "--weight-decay-incr-style", "cosine"], "needs --start-weight-decay and"),
    (["--train-iters", "10", "--lr-warmup-init", "0.1"], "--lr-warmup-init 0.1 exceeds --lr"),
])
def test_schedule_mistakes_are_one_clear_error(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(BASE + flags, world_size=1)


def test_sample_based_wsd_run(tmp_path):
    """A real run: 8 iterations from --train-samples 69 (G 8), warmup 16 samples, WSD annealing (linear) over
    the last 24 samples; metrics.jsonl's lr per iteration is the formula's, and the model learns. The same run
    reads the mock documents with Megatron-LM's document flags (the attention mask through the data-loader
    workers into the model: the whole path of tests/data/test_data_flags.py and test_document_attention.py)."""
    flags = [a if a != "constant" else "WSD" for a in TINY] + [
        "--min-lr", str(MIN_LR), "--lr", str(MAX_LR), "--train-samples", "69", "--lr-warmup-samples", "16",
        "--lr-wsd-decay-samples", "24", "--lr-wsd-decay-style", "linear",
        "--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask"]
    _, rows = run_pretrain(1, flags, tmp_path / "run")
    assert [r["iteration"] for r in rows] == list(range(1, 9))
    expected = [expected_lr((i - 1) * G, 16, 69, "WSD", wsd=24, wsd_style="linear") for i in range(1, 9)]
    assert [r["lr"] for r in rows] == pytest.approx(expected, rel=1e-12, abs=0)
    assert rows[-1]["loss"] < rows[0]["loss"]
