"""Every bad input to ``mtmegatron.pretrain`` (flags, ``--save``/``--load`` paths, ``--sft`` data) is one line on
stderr and exit status 2, before any process group starts.

The table runs in this process: ``pretrain.main([...])`` is called, its ``SystemExit`` caught and stderr read
with capsys (the backend it may have activated is deactivated after each case). Cases are built in a temporary
directory by a small setup function each. Also here: what a run that is refused leaves behind (no SFT cache
directory), the SFT cut report on data the cut only partly spoils, and the start-up line of ``--sequence-parallel``
at TP 1.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from helpers.pretrain_runner import TINY

BASE = TINY + ["--train-iters", "1", "--num-samples", "0"]
SFT = [a for a in BASE if a != "--mock-data"] + ["--sft", "--sft-tokenizer-prompt-format", "plain"]
for _flag, _value in (("--vocab-size", "320"), ("--seq-length", "64"), ("--max-position-embeddings", "64")):
    SFT[SFT.index(_flag) + 1] = _value
GOOD_RECORD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
LONG_PROMPT = {"messages": [{"role": "user", "content": "a b c d e f g h " * 40},
                            {"role": "assistant", "content": "yes"}]}


def _tokenizer(tmp: Path) -> str:
    from mtmegatron.data.tokenizer import train_bpe

    directory = tmp / "tok"
    if not directory.exists():
        train_bpe(["hi yo a b c d e f g h yes no"], 300, str(directory))
    return str(directory)


def _sft_data(tmp: Path, name: str, content: bytes) -> list[str]:
    path = tmp / name
    path.write_bytes(content)
    return SFT + ["--data-path", str(path), "--tokenizer-model", _tokenizer(tmp)]


def _jsonl(*records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _checkpoint(root: Path, *iterations: int, tracker=None) -> Path:
    """A checkpoint root whose ``iter_*`` directories look complete (metadata.json) to the layout checks."""
    for it in iterations:
        (root / f"iter_{it:07d}").mkdir(parents=True)
        (root / f"iter_{it:07d}" / "metadata.json").write_text("{}")
    root.mkdir(parents=True, exist_ok=True)
    if tracker is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(str(tracker))
    return root


def _debris(root: Path) -> Path:
    (root / "iter_0000004.partial").mkdir(parents=True)
    return root


def _file(tmp: Path) -> str:
    (tmp / "a_file").write_text("x")
    return str(tmp / "a_file")


# name -> (setup(tmp) -> argv, the message the one line holds)
CASES = {
    # backend, layout and model flags
    "musa_missing": (lambda t: BASE + ["--backend", "musa"], "musa requested but torch_musa "),
    "cuda_missing": (lambda t: BASE + ["--backend", "cuda"], "cuda requested but"),
    "unknown_backend": (lambda t: BASE + ["--backend", "tpu"], "unknown backend 'tpu' (known: cpu, cuda, musa)"),
    "tp_heads": (lambda t: BASE + ["--num-attention-heads", "6", "--num-query-groups", "6", "--hidden-size", "96",
                                   "--tensor-model-parallel-size", "4"],
                 "--tensor-model-parallel-size 4 does not divide --num-attention-heads 6"),
    "pp_layers": (lambda t: BASE + ["--num-layers", "3", "--pipeline-model-parallel-size", "2"],
                  "--pipeline-model-parallel-size 2 does not divide --num-layers 3"),
    "gbs": (lambda t: BASE + ["--global-batch-size", "7"],
            "--global-batch-size 7 is not divisible by --micro-batch-size 2 x data-parallel size 1"),
    "ep_experts": (lambda t: BASE + ["--num-experts", "3", "--expert-model-parallel-size", "2"],
                   "--expert-model-parallel-size 2 does not divide --num-experts 3"),
    "ep_layout": (lambda t: BASE + ["--num-experts", "4", "--expert-model-parallel-size", "2"],
                  "world size 1 is not divisible by EP 2 x expert-TP 1 x PP 1"),
    "unknown_model": (lambda t: BASE + ["--model", "gpt5"], "unknown --model 'gpt5'"),
    "seq_too_long": (lambda t: BASE + ["--seq-length", "64"], "--seq-length 64 exceeds --max-position-embeddings 32"),
    # flags Megatron-LM's validate_args (or torch in the first forward) refuses
    "micro_batch_0": (lambda t: BASE + ["--micro-batch-size", "0"], "--micro-batch-size must be >= 1, not 0"),
    "global_batch_0": (lambda t: BASE + ["--global-batch-size", "0"], "--global-batch-size must be >= 1, not 0"),
    "hidden_dropout_above_1": (lambda t: BASE + ["--hidden-dropout", "1.5"],
                               "--hidden-dropout 1.5 is not a probability"),
    "attention_dropout_negative": (lambda t: BASE + ["--attention-dropout", "-0.1"],
                                   "--attention-dropout -0.1 is not a probability"),
    "heads_0": (lambda t: BASE + ["--num-attention-heads", "0"], "--num-attention-heads must be >= 1, not 0"),
    "seq_length_negative": (lambda t: BASE + ["--seq-length", "-4"], "--seq-length must be >= 1, not -4"),
    "log_interval_0": (lambda t: BASE + ["--log-interval", "0"], "--log-interval must be >= 1, not 0"),
    "not_an_int": (lambda t: BASE + ["--micro-batch-size", "two"], "--micro-batch-size"),
    # --save / --load
    "save_is_a_file": (lambda t: BASE + ["--save", _file(t)], "is a file, not a directory"),
    "save_under_a_file": (lambda t: BASE + ["--save", os.path.join(_file(t), "ckpt")], "is a file"),
    "log_dir_is_a_file": (lambda t: BASE + ["--log-dir", _file(t)], "--log-dir"),
    "load_is_a_file": (lambda t: BASE + ["--load", _file(t)], "is a file, not a checkpoint directory"),
    "load_missing": (lambda t: BASE + ["--load", str(t / "typo")], "no such directory, so no checkpoint to resume"),
    "load_missing_exit_on_missing": (
        lambda t: BASE + ["--load", str(t / "c"), "--save", str(t / "c"), "--exit-on-missing-checkpoint"],
        "(--exit-on-missing-checkpoint)"),
    "load_empty_exit_on_missing": (
        lambda t: BASE + ["--load", str(_checkpoint(t / "c")), "--exit-on-missing-checkpoint"],
        "there is no complete checkpoint"),
    "load_empty_finetune": (lambda t: BASE + ["--load", str(_checkpoint(t / "c")), "--finetune"],
                            "--finetune needs one"),
    "load_debris": (lambda t: BASE + ["--load", str(_debris(t / "c"))],
                    "it holds iter_0000004.partial but no complete checkpoint"),
    "tracker_names_missing_iteration": (
        lambda t: BASE + ["--load", str(_checkpoint(t / "c", 2, 4, tracker=6))],
        "names iteration 6 but"),
    "tracker_corrupt": (lambda t: BASE + ["--load", str(_checkpoint(t / "c", 2, tracker="two"))],
                        "is corrupt (expected an iteration number, found 'two')"),
    # --sft data
    "sft_data_missing": (lambda t: SFT + ["--data-path", str(t / "none.jsonl"), "--tokenizer-model", _tokenizer(t)],
                         "none.jsonl: no such file"),
    "sft_data_directory": (lambda t: SFT + ["--data-path", str(t), "--tokenizer-model", _tokenizer(t)],
                           "is a directory: --sft reads JSONL files"),
    "sft_data_gzip": (lambda t: _sft_data(t, "chat.jsonl.gz", gzip.compress(_jsonl(GOOD_RECORD))),
                      "is gzip-compressed"),
    "sft_data_not_utf8": (lambda t: _sft_data(t, "chat.jsonl", _jsonl(GOOD_RECORD) + b'{"messages": "\xff\xfe"}\n'),
                          "record 2: not UTF-8 text"),
    "sft_bad_record": (lambda t: _sft_data(t, "chat.jsonl", _jsonl(GOOD_RECORD, {"messages": [
                           {"role": "user", "content": "no answer"}]})), "record 2: no assistant turn"),
    "sft_cache_under_a_file": (lambda t: _sft_data(t, "chat.jsonl", _jsonl(GOOD_RECORD)) + [
                                   "--data-cache-path", os.path.join(_file(t), "cache")],
                               "cannot be created (Not a directory): give a writable --data-cache-path"),
    "sft_every_answer_cut": (lambda t: _sft_data(t, "chat.jsonl", _jsonl(*[LONG_PROMPT] * 3)),
                             "3 of 3 conversations lose their answer to --seq-length 64: nothing to train on"),
}


@pytest.fixture
def in_process(monkeypatch, tmp_path, capsys):
    """Runs ``pretrain.main(argv)`` here; returns (exit status, stderr lines). No launcher variables leak in."""
    import mtmegatron
    from mtmegatron import pretrain

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MTMEGATRON_CACHE", str(tmp_path / "mtmegatron-cache"))

    def run(argv):
        capsys.readouterr()
        try:
            with pytest.raises(SystemExit) as exit_info:
                pretrain.main(["--log-dir", str(tmp_path / "log")] + argv)  # a case's own --log-dir wins
        finally:
            mtmegatron.deactivate()
        out, err = capsys.readouterr()
        return exit_info.value.code, [line for line in err.splitlines() if line.strip()], out

    return run


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_status_2(case, in_process, tmp_path):
    setup, message = CASES[case]
    status, lines, out = in_process(setup(tmp_path))
    assert status == 2, lines
    assert len(lines) == 1 and lines[0].startswith("mtmegatron.pretrain: error: ") and message in lines[0], lines
    assert "mtmegatron: backend" not in out  # no process group, no model
    if case.startswith("sft"):  # a refused preparation leaves nothing beside the data
        assert not (tmp_path / "cache").exists(), list((tmp_path / "cache").rglob("*"))


def test_unwritable_save_and_log_dir(in_process, tmp_path, monkeypatch):
    """Tests may run as root, for whom every directory is writable: the permission answer is faked."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(locked) else real_access(path, mode))
    for argv, message in ((["--save", str(locked / "ckpt")], f"--save {locked / 'ckpt'} cannot be created: {locked} "
                                                             f"is not writable"),
                          (["--save", str(locked)], f"--save {locked}: the directory is not writable"),
                          (["--log-dir", str(locked)], f"--log-dir {locked}: the directory is not writable")):
        status, lines, _ = in_process(BASE + argv)
        assert status == 2 and len(lines) == 1 and lines[0].endswith(message), lines


def test_sft_cut_report_and_drop(in_process, tmp_path, capsys):
    """A cut that spoils some conversations: the summary gives the share of assistant tokens kept, a warning
    names the conversations without an answer and --sft-drop-unanswered; with it they are left out."""
    from mtmegatron.sft.prepare import prepare
    from mtmegatron.config.arguments import parse_args

    argv = _sft_data(tmp_path, "chat.jsonl", _jsonl(*[GOOD_RECORD] * 8, LONG_PROMPT))
    args = parse_args(argv + ["--global-batch-size", "2"])
    capsys.readouterr()
    data = prepare(args, progress=True)
    out = capsys.readouterr().out
    assert "1 of 9 conversations lose their whole answer and train on nothing" in out
    assert "drop them with --sft-drop-unanswered" in out
    before, after = data.data.targets
    assert 0 < after < before and f"assistant tokens kept {after / before:.1%}" in data.summary
    assert len(data.data) == 9
    args = parse_args(argv + ["--global-batch-size", "2", "--sft-drop-unanswered"])
    data = prepare(args, progress=True)
    assert len(data.data) == 8 and data.data.num_dropped == 1
    assert "1 dropped without an answer" in data.summary
    assert "1 conversations without an answer left out (--sft-drop-unanswered)" in capsys.readouterr().out


def test_sequence_parallel_at_tp1_is_said_not_listed():
    from mtmegatron.config.run_plan import startup_lines
    from mtmegatron.config.arguments import parse_args

    args = parse_args(BASE + ["--sequence-parallel"], world_size=1)
    lines = startup_lines(args)
    assert not args.sequence_parallel
    assert not any("--sequence-parallel (flag)" in line for line in lines), lines
    assert any("--sequence-parallel has no effect at TP 1" in line for line in lines), lines
    args = parse_args(BASE + ["--sequence-parallel", "--tensor-model-parallel-size", "2"], world_size=2)
    assert args.sequence_parallel and not any("no effect at TP 1" in line for line in startup_lines(args))


def test_args_are_read_only_once_frozen():
    import copy

    from mtmegatron.config.arguments import parse_args

    args = parse_args(BASE, world_size=1).freeze()  # as pretrain.prepare returns them
    with pytest.raises(AttributeError, match="args.lr is read-only after start-up"):
        args.lr = 1.0
    mine = copy.copy(args)  # a copy is its taker's own (e.g. upcycling's dense twin)
    mine.lr = 1.0
    assert args.lr != 1.0
