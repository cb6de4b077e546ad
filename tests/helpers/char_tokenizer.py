"""A character-level HF tokenizer that fits the tiny converted Llama's 128-token vocabulary, with a chat template.

ids: 0 ``<unk>``, 1 ``<s>``, 2 ``</s>`` (LlamaConfig's default bos/eos ids), 3-5 the chat markers ``<|user|>``,
``<|assistant|>``, ``<|end|>``, then the printable ASCII characters (space to ``~``): 101 tokens in all.
Saved as ``tokenizer.json`` + ``tokenizer_config.json`` (eos ``</s>``, a small Jinja chat template), which both
``tokenizers`` and transformers' ``AutoTokenizer`` load offline.
"""

from __future__ import annotations

import json
import os

SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def save_char_tokenizer(directory: str) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for code in range(32, 127):
        vocab[chr(code)] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE}, f)
