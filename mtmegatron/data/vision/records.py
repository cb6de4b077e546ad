"""One line of a LLaVA/ShareGPT JSONL file -> checked conversation turns and image paths.

Record: ``{"id": ..., "image": "a.jpg" | ["a.jpg", "b.jpg"] | absent, "conversations": [{"from": "human",
"value": "<image>\\n..."}, {"from": "gpt", "value": "..."}, ...]}``. Roles: ``human``/``user``,
``gpt``/``assistant``, and an optional leading ``system``; user and assistant turns alternate, starting with the
user, and there is at least one answer. ``<image>`` tags go in user turns, one per listed image, in order; a
record with images and no tag gets ``<image>\\n`` (one per image) prepended to its first user turn (as LLaVA
does).
Every problem is a ``BadSample`` whose message names the file, the line (or the record's position in a JSON
array file) and the record's id.
May assume: nothing about the record (it comes from a user's file).
"""

from __future__ import annotations

import json
import os

from mtmegatron.data.vision.template import IMAGE_TAG, Turn

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


class BadSample(ValueError):
    """A sample that cannot be trained on; the message names the sample and the file."""

    def __init__(self, path: str, line: int, sample_id, reason: str):
        self.path, self.line, self.sample_id, self.reason = path, line, sample_id, reason
        where = f"{path}:{line}" + (f" (id {sample_id!r})" if sample_id is not None else "")
        super().__init__(f"bad sample {where}: {reason}")


def parse_line(line: str, path: str, number: int, image_folder: str) -> tuple[object, list[Turn], list[str]]:
    """(sample id, turns, absolute image paths) of JSONL line ``number`` (1-based) of ``path``."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadSample(path, number, None, f"malformed JSON ({e.msg} at column {e.colno})") from None
    return parse_record(record, path, number, image_folder)


def parse_record(record, path: str, number, image_folder: str) -> tuple[object, list[Turn], list[str]]:
    """``parse_line`` for an already decoded record (``number``: its line, or "record N" in a JSON array)."""
    if not isinstance(record, dict):
        raise BadSample(path, number, None, "not a JSON object")
    sample_id = record.get("id")

    def bad(reason: str) -> BadSample:
        return BadSample(path, number, sample_id, reason)

    images = record.get("image")
    if images is None:
        images = []
    elif isinstance(images, str):
        images = [images]
    if not isinstance(images, list) or not all(isinstance(i, str) and i for i in images):
        raise bad("'image' must be a file name or a list of file names")
    turns = parse_turns(record.get("conversations"), bad)
    num_tags = sum(t.content.count(IMAGE_TAG) for t in turns)
    if any(IMAGE_TAG in t.content for t in turns if t.role != "user"):
        raise bad(f"an {IMAGE_TAG} tag outside a user turn")
    if images and num_tags == 0:
        first = next(k for k, t in enumerate(turns) if t.role == "user")
        turns[first] = Turn("user", (IMAGE_TAG + "\n") * len(images) + turns[first].content)
        num_tags = len(images)
    if num_tags != len(images):
        raise bad(f"{num_tags} {IMAGE_TAG} tag(s) but {len(images)} image(s)")
    return sample_id, turns, [os.path.join(image_folder, i) for i in images]


def parse_turns(conversations, bad) -> list[Turn]:
    """The turns of a record's 'conversations' list: an optional system turn, then user/assistant alternating from
    the user, at least one answer; ``bad(reason)`` makes the error to raise."""
    if not isinstance(conversations, list) or not conversations:
        raise bad("no 'conversations' list")
    turns = []
    for k, message in enumerate(conversations):
        if not isinstance(message, dict) or not isinstance(message.get("value"), str):
            raise bad(f"conversation turn {k} is not an object with a string 'value'")
        role = ROLES.get(message.get("from"))
        if role is None:
            raise bad(f"conversation turn {k} has role {message.get('from')!r} (expected one of "
                      f"{', '.join(ROLES)})")
        turns.append(Turn(role, message["value"]))
    _check_roles(turns, bad)
    return turns


def _check_roles(turns: list[Turn], bad) -> None:
    rest = turns[1:] if turns[0].role == "system" else turns
    for k, turn in enumerate(rest):
        expected = "user" if k % 2 == 0 else "assistant"
        if turn.role != expected:
            raise bad(f"turns must alternate user/assistant starting with the user (turn {k} is {turn.role})")
    if len(rest) < 2:
        raise bad("no assistant answer")
