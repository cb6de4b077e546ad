"""SFT records in the formats people have, normalised to one list of ``{"role", "content"}`` messages.

Accepted JSONL records (one JSON object a line; the format is recognised per record by its keys):
- Megatron-LM SFT / OpenAI chat: ``{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}``
- ShareGPT: ``{"conversations": [{"from": "system"|"human"|"gpt"|..., "value": str}, ...]}``
- Alpaca: ``{"instruction": str, "input": str (optional), "output": str}`` (instruction and input are joined
  by a blank line into the user turn, as in Stanford Alpaca's prompt)
A conversation must hold at least one assistant turn, only known roles, string contents, and a non-empty
assistant content. Every problem is a ``RecordError`` naming what is wrong; the caller adds file and record.
May assume: nothing (pure Python, no torch).
"""

from __future__ import annotations

import json

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}


class RecordError(ValueError):
    """One record that cannot be used; the message says why."""


def _messages(record: dict) -> list[dict]:
    messages = record["messages"]
    if not isinstance(messages, list):
        raise RecordError('"messages" is not a list')
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise RecordError(f'message {i} is not an object with "role" and "content"')
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _sharegpt(record: dict) -> list[dict]:
    turns = record["conversations"]
    if not isinstance(turns, list):
        raise RecordError('"conversations" is not a list')
    out = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict) or "from" not in t or "value" not in t:
            raise RecordError(f'turn {i} is not an object with "from" and "value"')
        role = SHAREGPT_ROLES.get(str(t["from"]).lower())
        if role is None:
            raise RecordError(f'turn {i} has an unknown "from" {t["from"]!r} (known: {", ".join(SHAREGPT_ROLES)})')
        out.append({"role": role, "content": t["value"]})
    return out


def _alpaca(record: dict) -> list[dict]:
    for key in ("instruction", "output"):
        if not isinstance(record.get(key), str):
            raise RecordError(f'"{key}" is missing or not a string')
    extra = record.get("input") or ""
    if not isinstance(extra, str):
        raise RecordError('"input" is not a string')
    prompt = f"{record['instruction']}\n\n{extra}" if extra else record["instruction"]
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": record["output"]}]


def record_format(record: dict) -> str:
    if "messages" in record:
        return "messages"
    if "conversations" in record:
        return "sharegpt"
    if "instruction" in record and "output" in record:
        return "alpaca"
    raise RecordError('not a known SFT record (expected "messages", "conversations", or "instruction" + "output")')


def to_messages(record) -> list[dict]:
    """The record's conversation as checked ``{"role", "content"}`` messages."""
    if not isinstance(record, dict):
        raise RecordError("not a JSON object")
    messages = {"messages": _messages, "sharegpt": _sharegpt, "alpaca": _alpaca}[record_format(record)](record)
    if not messages:
        raise RecordError("the conversation is empty")
    for i, m in enumerate(messages):
        if m["role"] not in ROLES:
            raise RecordError(f"message {i} has role {m['role']!r} (known: {', '.join(ROLES)})")
        if not isinstance(m["content"], str):
            raise RecordError(f"message {i} has a content that is not a string")
        if m["role"] == "assistant" and not m["content"].strip():
            raise RecordError(f"message {i} is an empty assistant turn")
    if not any(m["role"] == "assistant" for m in messages):
        raise RecordError("no assistant turn (nothing to learn from)")
    return messages


def parse_line(line: str) -> list[dict]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise RecordError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    return to_messages(record)
