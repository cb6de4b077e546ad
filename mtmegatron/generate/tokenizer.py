"""The tokenizer side of generation: prompts -> token ids (optionally through the tokenizer's chat template),
generated ids -> text, and the id that ends a generation.

Wraps an HF ``tokenizers`` file (mtmegatron.data.tokenizer.load_tokenizer) in the interface megatron-core's
``TextGenerationController`` reads (``tokenize``, ``detokenize``, ``eod``, ``bos``, ``vocab_size``).
- Prompts are encoded as HF transformers encodes them by default (``add_special_tokens=True``: the
  tokenizer's post-processor adds e.g. Llama-3's ``<|begin_of_text|>``; our own byte-level BPE adds nothing).
- ``--chat``: the prompt becomes one user turn rendered by the tokenizer's ``chat_template``
  (``tokenizer_config.json``) with HF transformers' ``apply_chat_template(..., add_generation_prompt=True)``;
  the rendered text already holds its special tokens, so it is encoded without adding any (as transformers'
  chat pipeline does).
- Generation ends at the ``eos_token`` of ``tokenizer_config.json`` when it names one (a chat model's
  end-of-turn token), else at the tokenizer's end-of-document token.
May assume: a local tokenizer directory (or tokenizer.json file); transformers is imported only for ``--chat``.
"""

from __future__ import annotations

import json
import os
from typing import Iterable

from mtmegatron.data.tokenizer import TokenizerError, load_tokenizer


def _token_text(value) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as AddedToken dicts ({"content": ...})."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class GenerationTokenizer:
    """Prompt encoding, chat rendering and decoding for ``mtmegatron generate`` (see the module docstring)."""

    def __init__(self, path: str):
        self.path = path
        self.hf = load_tokenizer(path)  # TokenizerError with a one-line reason when missing or invalid
        self.tokenizer = self.hf.tokenizer
        self.vocab_size = self.hf.vocab_size
        directory = path if os.path.isdir(path) else os.path.dirname(path)
        config_file = os.path.join(directory, "tokenizer_config.json")
        self.config = {}
        if os.path.isfile(config_file):
            with open(config_file) as f:
                self.config = json.load(f)
        self.directory = directory
        eos = _token_text(self.config.get("eos_token"))
        eos_id = self.tokenizer.token_to_id(eos) if eos else None
        self.eod = eos_id if eos_id is not None else self.hf.eod
        bos = _token_text(self.config.get("bos_token"))
        self.bos = self.tokenizer.token_to_id(bos) if bos else None

    # ---- what megatron-core's controller calls ----
    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def detokenize(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ---- chat ----
    def has_chat_template(self) -> bool:
        return bool(self.config.get("chat_template"))

    def render_chat(self, prompt: str) -> str:
        """``prompt`` as one user turn followed by the assistant's generation prompt, rendered by transformers."""
        if not self.has_chat_template():
            raise TokenizerError(f"--chat: {os.path.join(self.directory, 'tokenizer_config.json')} has no "
                                 "chat_template")
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise TokenizerError("--chat renders the chat template with HF transformers, which is not installed "
                                 "(pip install transformers)") from None
        if not hasattr(self, "_hf_chat"):
            self._hf_chat = AutoTokenizer.from_pretrained(self.directory, local_files_only=True)
        return self._hf_chat.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)

    def encode_prompt(self, prompt: str, chat: bool) -> list[int]:
        if chat:
            return self.tokenizer.encode(self.render_chat(prompt), add_special_tokens=False).ids
        return self.tokenize(prompt)
