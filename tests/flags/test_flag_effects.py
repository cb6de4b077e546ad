"""Every flag ``mtmegatron.pretrain`` accepts, exercised from the table ``mtmegatron/config/flag_effects.tsv``.

Each accepted (honoured, config, no-op) Megatron-LM flag has at least one row: an example non-default value, the
flags it needs beside it (``context``), the world size, and what shows its effect:
- ``config``: the field of megatron-core's TransformerConfig / OptimizerConfig / DDPConfig (as the run builds them,
  training/megatron_core_checks.config_builders) or a GPTModel argument differs from the same command line without
  the flag (in-process, no training);
- ``args``: the run value mtmegatron's code reads (the dest, or the derived value named) differs; ``note`` names the
  module that reads it (its run effect is tested by that module's tests, not here);
- ``log`` / ``file`` / ``tb``: in a tiny one-rank run batching every such row of its ``run:NAME`` context, a line
  matching the regex / a file matching the glob under the run directory / a TensorBoard scalar tag;
- ``refused-here``: a megatron-core/TE requirement that cannot be met here: one ConfigError line starting so;
- ``cpu-invisible``: the note says why the effect cannot be seen on the cpu backend (the flag must parse; a
  ``target`` regex, where given, is the start-up line saying so in the run);
- ``none``: a no-op (as in Megatron-LM), the note says why; it must parse.
A note starting ``pending:`` marks a row whose effect is not there yet (another issue): the test states it and fails
once it works, so the row is flipped. Refused flags are checked too: each with a non-default value is one line.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import glob
import re
import shlex
import warnings
from pathlib import Path

import pytest

from mtmegatron.config import megatron_flags
from mtmegatron.config.arguments import build_parser, parse_args
from mtmegatron.utils.errors import ConfigError

TABLE = Path(megatron_flags.__file__).with_name("flag_effects.tsv")
REPO = Path(__file__).resolve().parents[2]
CHECKPOINT = REPO / "tests" / "fixtures" / "megatron_lm_ckpt"  # a Megatron-LM checkpoint for the --load rows
BASE = ["--backend", "cpu", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "4",
        "--train-iters", "1", "--vocab-size", "128", "--mock-data", "--lr", "1e-4", "--attention-dropout", "0"]
IN_PROCESS = {"config", "args", "none", "cpu-invisible", "refused-here"}
RUN_EFFECTS = {"log", "file", "tb"}
KINDS = ("honoured", "config", "noop", "refused")


def rows() -> list[dict]:
    with open(TABLE, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.fixture(scope="module")
def parser():
    """One parser for all command lines; the cpu backend active, with its megatron-core patches, as
    pretrain.prepare has it when it builds the configs (megatron_core_checks.check_configs)."""
    import mtmegatron
    from mtmegatron.backends import select_backend

    mtmegatron.activate(select_backend("cpu"))
    return build_parser()


def _accepted(parser) -> dict[str, str]:
    table = (r for r in megatron_flags.table() if r.action != "HelpAction")
    return {r.flag: kind for r in table if (kind := megatron_flags.classify(r, parser.hand_registered)) != "refused"}


def test_every_accepted_flag_has_a_row(parser):
    """The "no flag left unexercised" guard: a flag accepted without a row (or a row of a flag not accepted)."""
    accepted = _accepted(parser)
    table = rows()
    flags = {row["flag"] for row in table}
    assert sorted(set(accepted) - flags) == [], "accepted flags without a row in flag_effects.tsv"
    assert sorted(flags - set(accepted)) == [], "rows of flags that are not accepted (refused or unknown)"
    for row in table:
        assert row["effect"] in IN_PROCESS | RUN_EFFECTS, row
        if row["effect"] in ("cpu-invisible", "none"):
            assert row["note"], f"{row['flag']}: say why"
        elif row["effect"] != "args":
            assert row["target"], row
        if accepted[row["flag"]] == "noop":
            assert row["effect"] == "none", row


def _norm(value):
    """Config values compared by what they are (a new partial / bound method per build is the same init)."""
    if isinstance(value, functools.partial):
        return ("partial", _norm(value.func), value.args, tuple(sorted(value.keywords.items())))
    if callable(value) and hasattr(value, "__qualname__"):
        return ("callable", getattr(value, "__module__", ""), value.__qualname__)
    return value


def _snapshot(args) -> dict:
    from mtmegatron.models.gpt import gpt_model_kwargs
    from mtmegatron.config.megatron_core_checks import config_builders

    names = {"TransformerConfig": "TransformerConfig", "OptimizerConfig": "OptimizerConfig",
             "DistributedDataParallelConfig": "DDPConfig"}
    out = {}
    for name, build in config_builders():
        config = build(args)
        out.update({f"{names[name]}.{f.name}": _norm(getattr(config, f.name)) for f in dataclasses.fields(config)})
    out.update({f"GPTModel.{k}": _norm(v) for k, v in gpt_model_kwargs(args).items()})
    return out


def _argv(text: str, tmp: Path) -> list[str]:
    """The words of a value/context; ``{file:NAME}`` is an empty file made under ``tmp`` (a path the flag checks)."""
    for name in re.findall(r"\{file:([^}]+)\}", text):
        (tmp / name).touch()
        text = text.replace(f"{{file:{name}}}", str(tmp / name))
    return shlex.split(text.replace("{tmp}", str(tmp)).replace("{run}", str(tmp)).replace("{ckpt}", str(CHECKPOINT)))


def _command_line(base: list[str], context: list[str]) -> list[str]:
    """``base`` + ``context``, where a word ``~--flag`` takes --flag (and its value) out of ``base``."""
    argv = list(base)
    for word in context:
        if word.startswith("~"):
            i = argv.index(word[1:])
            del argv[i:i + (2 if i + 1 < len(argv) and not argv[i + 1].startswith("--") else 1)]
    return argv + [w for w in context if not w.startswith("~")]


def _parse(argv, world, parser):
    from mtmegatron.config.megatron_core_checks import check_configs

    args = parse_args(argv, world_size=world, parser=parser)
    check_configs(args)  # as pretrain.prepare does after activation
    return args


def _check_in_process(row, parser, tmp, baselines) -> str | None:
    """None where the row's effect shows, else what went wrong (one line)."""
    context, world = _argv(row["context"], tmp), int(row["world"])
    argv = _command_line(BASE, context) + [row["flag"]] + _argv(row["value"], tmp)
    effect, target = row["effect"], row["target"]
    if effect == "refused-here":
        try:
            _parse(argv, world, parser)
        except ConfigError as e:
            return None if str(e).startswith(target) and "\n" not in str(e) else f"refused otherwise: {e}"
        return "not refused"
    try:
        args = _parse(argv, world, parser)
    except ConfigError as e:
        return f"ConfigError: {e}"
    if effect in ("none", "cpu-invisible"):
        return None
    key = (row["context"], world)
    if key not in baselines:
        try:
            base = _parse(_command_line(BASE, context), world, parser)
        except ConfigError:  # the context needs the row's flag (flags that go together): the plain command line
            try:
                base = _parse(_command_line(BASE, [w for w in context if w.startswith("~")]), world, parser)
            except ConfigError:
                base = _parse(BASE, world, parser)
        baselines[key] = (base, _snapshot(base))
    base, base_snapshot = baselines[key]
    if effect == "args":
        if getattr(args, target) == getattr(base, target):
            return f"args.{target} is {getattr(args, target)!r} with and without the flag"
        return None
    snapshot = _snapshot(args)
    if target not in snapshot:
        return f"{target}: no such config field / GPTModel argument"
    if snapshot[target] == base_snapshot[target]:
        return f"{target} is {snapshot[target]!r} with and without the flag"
    return None


def _report(failures: list[str], pending: list[tuple[str, str | None]]) -> None:
    now_working = [flag for flag, problem in pending if problem is None]
    for flag, problem in pending:
        if problem is not None:
            warnings.warn(f"{flag}: pending ({problem})")
    assert not now_working, f"pending rows whose effect now shows (flip them in flag_effects.tsv): {now_working}"
    assert not failures, "\n".join(failures)


def test_in_process_effects(parser, tmp_path):
    """Parse (+ build the configs) for every in-process row: each shows its effect, no traceback."""
    baselines, failures, pending = {}, [], []
    checked = 0
    for row in rows():
        if row["effect"] not in IN_PROCESS or row["context"].startswith("run:"):
            continue
        try:
            problem = _check_in_process(row, parser, tmp_path, baselines)
        except Exception as e:  # a traceback is a failure of the row, named
            problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        checked += 1
        if row["note"].startswith("pending:"):
            pending.append((row["flag"], problem))
        elif problem:
            failures.append(f"{row['flag']} {row['value']} [{row['context']}]: {problem}")
    assert checked > 350
    _report(failures, pending)


def _sample_value(row, action, default) -> list[str] | None:
    """A value other than the dest's default for a refused flag (None: it has none, e.g. a switch storing it)."""
    if row.action in ("StoreTrueAction", "StoreFalseAction", "BooleanOptionalAction"):
        stores = row.action == "StoreTrueAction" or (row.action == "BooleanOptionalAction"
                                                     and not row.flag.startswith("--no-"))
        return None if stores == default else []  # a switch that stores its default has no other value
    if action.choices:
        choices = [str(c) for c in action.choices if c != default and str(c) != str(default)]
        return [choices[0]] if choices else None
    if row.type in ("int", "float"):
        value = str((default or 0) + 3) if isinstance(default, (int, float)) and not isinstance(default, bool) else "3"
    elif row.type == "moe_freq_type" or row.type == "la_freq_type":
        value = "2"
    elif row.type == "tuple_type":
        value = "4,0"
    else:
        value = "x"
    count = int(row.nargs) if row.nargs.isdigit() else 1
    return [value] * count


def test_refused_flags_are_one_line(parser):
    """Every refused flag, given a non-default value: one ConfigError line naming it and why."""
    failures, checked = [], 0
    for row in megatron_flags.table():
        if row.action == "HelpAction" or megatron_flags.classify(row, parser.hand_registered) != "refused":
            continue
        value = _sample_value(row, parser._option_string_actions[row.flag], parser.get_default(row.dest))
        if value is None:
            continue
        checked += 1
        try:
            _parse(BASE + [row.flag] + value, 1, parser)
            failures.append(f"{row.flag} {' '.join(value)}: accepted")
        except ConfigError as e:
            message = str(e)
            if "\n" in message or row.flag not in message:
                failures.append(f"{row.flag}: {message!r}")
        except Exception as e:
            failures.append(f"{row.flag}: {type(e).__name__}: {e}")
    assert checked > 250
    assert not failures, "\n".join(failures)


RUN_BASE = ["--backend", "cpu", "--num-layers", "2", "--hidden-size", "64",  # Megatron-LM's defaults otherwise
            "--num-attention-heads", "4", "--ffn-hidden-size", "128", "--seq-length", "32",
            "--max-position-embeddings", "32", "--vocab-size", "256", "--micro-batch-size", "2",
            "--global-batch-size", "4", "--lr", "3e-3", "--lr-decay-style", "constant", "--mock-data",
            "--train-iters", "4", "--num-workers", "0"]


def _tb_tags(run: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for path in glob.glob(str(run / "**" / "events.out.tfevents.*"), recursive=True):
        events = EventAccumulator(path)
        events.Reload()
        tags.update(events.Tags()["scalars"])
    return tags


@pytest.mark.parametrize("batch", sorted({r["context"] for r in rows() if r["context"].startswith("run:")}))
def test_run_effects(batch, tmp_path):
    """One tiny run per ``run:NAME`` batch with all its rows' flags: each row's line / file / tag is there."""
    from helpers.pretrain_runner import run_pretrain

    batch_rows = [r for r in rows() if r["context"] == batch]
    pending = [(r["flag"], "not run") for r in batch_rows if r["note"].startswith("pending:")]
    batch_rows = [r for r in batch_rows if not r["note"].startswith("pending:")]  # a pending flag may hang the run
    if not batch_rows:
        _report([], pending)
        return
    words = []
    for row in batch_rows:
        words += [row["flag"]] + _argv(row["value"], tmp_path)
    proc, metrics = run_pretrain(1, _command_line(RUN_BASE, words), tmp_path / "logs", timeout=240)
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output[-3000:]
    assert len(metrics) == 4
    tags = _tb_tags(tmp_path) if any(r["effect"] == "tb" for r in batch_rows) else set()
    failures = []
    for row in batch_rows:
        effect, target = row["effect"], row["target"]
        if effect in ("log", "cpu-invisible"):
            shown = not target or re.search(target, output, re.MULTILINE) is not None
        elif effect == "file":
            shown = bool(glob.glob(str(tmp_path / target)))
        elif effect == "tb":
            shown = target in tags
        else:
            shown = False
        if not shown:
            failures.append(f"{row['flag']}: {effect} {target!r} not seen")
    _report(failures, pending)
