"""mcore-to-hf of a training checkpoint needs no flags: the model fingerprint it records gives them back
(convert/recorded_flags.py). For every family preset, the flags rebuilt from a run's fingerprint parse into the
same fingerprint, and the family read from the fields is the one that maps the same network."""

from __future__ import annotations

import pytest

from mtmegatron.convert.recorded_flags import family_of_fingerprint, flags_from_fingerprint
from mtmegatron.models.fingerprint import fingerprint

CASES = [("llama3", "tiny", "llama3"), ("llama3", "3.2-1b", "llama3"), ("qwen2.5", "tiny", "qwen2.5"),
         ("qwen3", "tiny", "qwen3"), ("qwen3-moe", "tiny", "qwen3-moe"), ("mixtral", "tiny", "mixtral"),
         ("deepseek-v3", "tiny", "deepseek-v3"), ("mistral", "tiny", "llama3")]


def _parse(flags):
    from mtmegatron.convert.model import parse_flags

    return parse_flags(flags)


@pytest.mark.parametrize("model,size,family", CASES, ids=[f"{m}-{s}" for m, s, _ in CASES])
def test_fingerprint_gives_back_the_same_model(model, size, family):
    saved = fingerprint(_parse(["--model", model, "--model-size", size]))
    flags = flags_from_fingerprint(saved)
    assert family_of_fingerprint(saved) == family and flags[:2] == ["--model", family]
    assert fingerprint(_parse(flags)) == saved


@pytest.mark.parametrize("rows_flags", [["--make-vocab-size-divisible-by", "64"], ["--padded-vocab-size", "192"]])
def test_the_rows_come_back_whatever_made_them(rows_flags):
    """A run whose embedding rows are not the default padding of its vocabulary (another divisor, or
    --padded-vocab-size) is rebuilt with exactly those rows, so its checkpoint loads for mcore-to-hf."""
    saved = fingerprint(_parse(["--model", "llama3", "--model-size", "tiny", "--vocab-size", "50"] + rows_flags))
    assert saved["padded_vocab_size"] in (64, 192)
    assert fingerprint(_parse(flags_from_fingerprint(saved))) == saved


def test_a_checkpoint_without_a_fingerprint_asks_for_flags():
    from mtmegatron.models.families import ConversionError

    with pytest.raises(ConversionError, match="after '--'"):
        flags_from_fingerprint({})
