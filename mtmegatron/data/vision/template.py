"""Conversation templates: a LLaVA/ShareGPT conversation -> token ids with image placeholders and a flag per
token saying whether it is trained on (part of an assistant answer, its end-of-turn token included).

Templates, chosen by name (``--prompt-format``):
- ``llama3`` (default): ``<|begin_of_text|>`` then per turn
  ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``; trained: assistant content + ``<|eot_id|>``.
- ``plain`` (LLaVA stage 1, captioning): the user turns' images only (their text is dropped), then each
  assistant answer followed by the end-of-document token; trained: the answers and that token.
- ``vicuna_v1``: ``{system} USER: {q} ASSISTANT: {a}</s>USER: ...`` (LLaVA-1.5's format; ``</s>`` is the
  tokenizer's end-of-document token); trained: `` {a}`` and the end token.

Each ``<image>`` in a turn becomes ONE ``IMAGE_TOKEN_INDEX`` (-200), never a vocabulary id: the model expands it.
Special tokens are looked up by name in the tokenizer's vocabulary (so they are always one token); a tokenizer
that lacks one is refused with a message naming the token and the template.
May assume: the tokenizer is ``mtmegatron.data.tokenizer.HFTokenizer`` (``.tokenizer`` is an HF ``tokenizers``
object); conversations were checked by ``conversations.parse_record`` (roles normalized, alternating).
"""

from __future__ import annotations

from dataclasses import dataclass

IMAGE_TAG = "<image>"
IMAGE_TOKEN_INDEX = -200  # megatron-core's DEFAULT_IMAGE_TOKEN_INDEX
IGNORE_INDEX = -100  # megatron-core's IGNORE_INDEX

LLAMA3_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
# the tokens a BPE trained for multimodal data gets as whole tokens
MULTIMODAL_SPECIAL_TOKENS = (*LLAMA3_SPECIAL_TOKENS, IMAGE_TAG)

VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's questions.")


class TemplateError(ValueError):
    """A template that cannot be used with this tokenizer, or an unknown template name."""


@dataclass(frozen=True)
class Turn:
    role: str  # "system", "user" or "assistant"
    content: str


class _Encoder:
    """Appends text (split at ``<image>`` tags) and special ids, remembering which tokens are trained."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.trained: list[bool] = []

    def text(self, text: str, trained: bool = False) -> None:
        for k, part in enumerate(text.split(IMAGE_TAG)):
            if k:
                self.ids.append(IMAGE_TOKEN_INDEX)
                self.trained.append(False)
            if part:
                ids = self.tokenizer.tokenize(part)
                self.ids += ids
                self.trained += [trained] * len(ids)

    def token(self, token_id: int, trained: bool = False) -> None:
        self.ids.append(token_id)
        self.trained.append(trained)


def special_id(tokenizer, token: str, template: str) -> int:
    token_id = tokenizer.tokenizer.token_to_id(token)
    if token_id is None:
        raise TemplateError(f"--prompt-format {template} needs the special token {token} but the tokenizer "
                            f"{tokenizer.source} has none; use a tokenizer that has it or another --prompt-format "
                            f"({', '.join(TEMPLATES)})")
    return token_id


def _opened_with_bos(tokenizer) -> _Encoder:
    """An encoder that starts with the tokenizer's beginning-of-text token, if it has one."""
    enc = _Encoder(tokenizer)
    for token in ("<|begin_of_text|>", "<s>"):
        token_id = tokenizer.tokenizer.token_to_id(token)
        if token_id is not None:
            enc.token(token_id)
            break
    return enc


def _llama3(turns: list[Turn], tokenizer) -> _Encoder:
    bos, start, end, eot = (special_id(tokenizer, t, "llama3") for t in LLAMA3_SPECIAL_TOKENS)
    enc = _Encoder(tokenizer)
    enc.token(bos)
    for turn in turns:
        enc.token(start)
        enc.text(turn.role)
        enc.token(end)
        answer = turn.role == "assistant"
        if answer:  # the header's "\n\n" is prompt, the content is trained: tokenized apart
            enc.text("\n\n")
            enc.text(turn.content.strip(), trained=True)
        else:
            enc.text("\n\n" + turn.content.strip())
        enc.token(eot, trained=answer)
    return enc


def _plain(turns: list[Turn], tokenizer) -> _Encoder:
    enc = _opened_with_bos(tokenizer)
    for turn in turns:
        if turn.role == "user":
            for _ in range(turn.content.count(IMAGE_TAG)):
                enc.token(IMAGE_TOKEN_INDEX)
        elif turn.role == "assistant":
            enc.text(turn.content.strip(), trained=True)
            enc.token(tokenizer.eod, trained=True)
    return enc


def _vicuna_v1(turns: list[Turn], tokenizer) -> _Encoder:
    enc = _opened_with_bos(tokenizer)
    system = VICUNA_SYSTEM
    if turns and turns[0].role == "system":
        system, turns = turns[0].content.strip(), turns[1:]
    prompt = system + " "
    for turn in turns:
        if turn.role == "user":
            prompt += f"USER: {turn.content.strip()} ASSISTANT:"
        else:
            enc.text(prompt)
            enc.text(" " + turn.content.strip(), trained=True)
            enc.token(tokenizer.eod, trained=True)
            prompt = ""
    if prompt.strip():
        enc.text(prompt)
    return enc


TEMPLATES = {"llama3": _llama3, "plain": _plain, "vicuna_v1": _vicuna_v1}


def check_template(name: str, tokenizer) -> None:
    """One clear error now (unknown name, missing special token) instead of one per sample later."""
    if name not in TEMPLATES:
        raise TemplateError(f"unknown --prompt-format {name!r} (choose from {', '.join(TEMPLATES)})")
    if name == "llama3":
        for token in LLAMA3_SPECIAL_TOKENS:
            special_id(tokenizer, token, name)


def render(name: str, turns: list[Turn], tokenizer) -> tuple[list[int], list[bool]]:
    """(token ids with ``IMAGE_TOKEN_INDEX`` per image, trained flag per id) of a conversation."""
    enc = TEMPLATES[name](turns, tokenizer)
    return enc.ids, enc.trained
