"""Megatron-LM core_v0.16.1's custom argparse ``type=`` converters, for the table flags that use them.

Megatron-LM's ``megatron/training/arguments.py`` (its training package, not part of the megatron-core wheel)
converts a few flags before megatron-core sees them: ``tuple_type`` (``--window-size 4,0`` -> ``(4, 0)``),
``moe_freq_type`` (``--window-attn-skip-freq``, ``--moe-layer-freq``: ``2`` -> 2, ``([0]*3+[1])*2`` -> a list),
``no_rope_freq_type`` and ``la_freq_type`` (same, None allowed), ``type=bool``. Same behaviour here, except that a
malformed value is a ``ValueError`` (argparse's one-line "invalid value" error) where Megatron-LM asserts.
May assume: nothing (called by argparse).
"""

from __future__ import annotations

import re

_PATTERN = re.compile(r"[^,\d\[\]\(\)\+\*]")


def _eval_pattern(pattern: str) -> list[int]:
    """A list expression of digits, brackets, ``+`` and ``*`` only (Megatron-LM's check), e.g. ``([0]*3+[1])*2``."""
    if _PATTERN.search(pattern):
        raise ValueError(f"invalid pattern {pattern!r}: only digits, [], (), +, * and commas")
    try:
        value = eval(pattern, {"__builtins__": {}}, {})  # noqa: S307 - the characters are restricted above
    except Exception:
        raise ValueError(f"invalid pattern {pattern!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise ValueError(f"pattern {pattern!r} is not a list of integers")
    return value


def freq_type(text: str) -> int | list[int]:
    """``moe_freq_type`` / ``no_rope_freq_type`` / ``la_freq_type``: an int N, or a list expression."""
    if not isinstance(text, str):
        return text
    return _eval_pattern(text) if "[" in text else int(text)


def tuple_type(text: str) -> tuple[int, ...]:
    """``1,2,3`` or ``(1,2,3)`` -> ``(1, 2, 3)``."""
    if not isinstance(text, str):
        return text
    return tuple(int(i) for i in text.strip("()").split(","))


def bool_type(text: str) -> bool:
    """argparse's ``type=bool`` as Megatron-LM declares it (any non-empty string is True)."""
    return bool(text)


CONVERTERS = {"tuple_type": tuple_type, "moe_freq_type": freq_type, "no_rope_freq_type": freq_type,
              "la_freq_type": freq_type, "bool": bool_type}
