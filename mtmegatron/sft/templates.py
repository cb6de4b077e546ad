"""Chat templates: a conversation -> token ids and, per token, whether it belongs to an assistant turn.

Templates are Jinja, rendered by HF transformers' own ``render_jinja_template`` (so a tokenizer's
``tokenizer_config.json`` ``chat_template`` renders exactly as ``apply_chat_template`` renders it). The
``--sft-tokenizer-prompt-format`` choices:
- ``tokenizer``: the ``chat_template`` of the tokenizer's ``tokenizer_config.json`` (its special tokens passed
  to the template as ``apply_chat_template`` passes them);
- built-ins written here: ``llama3``, ``chatml`` (= ``qwen``), ``plain`` and Megatron-LM's default
  ``nemotron-h-aligned``. Each marks its assistant spans with ``{% generation %}`` so HF's
  ``return_assistant_tokens_mask`` can check ours.
Assistant spans are found for any template, tagged or not, by rendering prefixes: assistant turn ``i`` is the
text that ``messages[:i+1]`` adds after ``messages[:i]`` with the generation prompt. Tokens are then those of
the whole rendered text (no special tokens added), and a token is an assistant token when its character
offsets overlap an assistant span (HF's rule for ``assistant_masks``).
May assume: ``transformers`` and ``jinja2`` importable (``--sft`` checks); the tokenizer is ``HFTokenizer``.
"""

from __future__ import annotations

import json
import os
import re

LLAMA3 = (
    "{{ '<|begin_of_text|>' }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ m['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
    "{% else %}{{ m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The answer starts on a new line: a byte-level pre-tokenizer would glue "Assistant: " to the answer's first word.
PLAIN = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + '\\n\\n' }}"
    "{% elif m['role'] == 'user' %}{{ 'User: ' + m['content'] + '\\nAssistant:\\n' }}"
    "{% else %}{% generation %}{{ m['content'] + '\\n' }}{% endgeneration %}{% endif %}{% endfor %}"
)
# Megatron-LM's default SFT prompt format (the user turn ends with the assistant header; no generation prompt).
NEMOTRON_H_ALIGNED = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ '<SPECIAL_10>System\\n' + m['content'] | trim + '\\n' }}"
    "{% elif m['role'] == 'user' %}{{ '<SPECIAL_11>User\\n' + m['content'] | trim + '\\n<SPECIAL_11>Assistant\\n' }}"
    "{% else %}{% generation %}{{ m['content'] | trim + '\\n' }}{% endgeneration %}{% endif %}{% endfor %}"
)
BUILTIN = {"llama3": LLAMA3, "chatml": CHATML, "qwen": CHATML, "plain": PLAIN, "nemotron-h-aligned": NEMOTRON_H_ALIGNED}
PROMPT_FORMATS = ("tokenizer", *BUILTIN)
# special tokens a built-in template writes; a tokenizer trained for SFT keeps each as one token
SPECIAL_TOKENS = {"llama3": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                  "chatml": ("<|im_start|>", "<|im_end|>"), "qwen": ("<|im_start|>", "<|im_end|>"), "plain": (),
                  "nemotron-h-aligned": ("<SPECIAL_10>", "<SPECIAL_11>")}


GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


class TemplateError(ValueError):
    """A template that cannot be used for this conversation or tokenizer; the message says why."""


def _token_text(value):
    return value.get("content") if isinstance(value, dict) else value


def tokenizer_template(tokenizer_file: str) -> tuple[str, dict]:
    """(chat_template, special-token kwargs) from the ``tokenizer_config.json`` beside ``tokenizer_file``."""
    config_file = os.path.join(os.path.dirname(tokenizer_file), "tokenizer_config.json")
    if not os.path.isfile(config_file):
        raise TemplateError(f"--sft-tokenizer-prompt-format tokenizer: no {config_file}")
    with open(config_file) as f:
        config = json.load(f)
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not template:
        chat_file = os.path.join(os.path.dirname(tokenizer_file), "chat_template.jinja")
        if os.path.isfile(chat_file):
            with open(chat_file) as f:
                template = f.read()
    if not template:
        raise TemplateError(f"--sft-tokenizer-prompt-format tokenizer: {config_file} has no chat_template; "
                            f"name a built-in instead ({', '.join(BUILTIN)})")
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    kwargs = {n: _token_text(config[n]) for n in names if config.get(n) is not None}
    return template, kwargs


class ChatTemplate:
    """Renders conversations with one template and tokenizes them with one tokenizer."""

    def __init__(self, tokenizer, prompt_format: str):
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format
        if prompt_format == "tokenizer":
            self.template, self.kwargs = tokenizer_template(tokenizer.source)
        elif prompt_format in BUILTIN:
            self.template, self.kwargs = BUILTIN[prompt_format], {}
        else:
            raise TemplateError(f"--sft-tokenizer-prompt-format {prompt_format!r} is unknown "
                                f"(choose from {', '.join(PROMPT_FORMATS)})")
        try:
            from transformers.utils.chat_template_utils import render_jinja_template
        except ImportError:
            raise TemplateError("--sft needs HF transformers to render chat templates (pip install transformers)") \
                from None
        self._render_jinja = render_jinja_template

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        try:
            rendered, _ = self._render_jinja(conversations=[messages], chat_template=self.template,
                                             add_generation_prompt=add_generation_prompt, **self.kwargs)
        except Exception as e:  # jinja2 raises TemplateError/UndefinedError, templates raise_exception(...)
            raise TemplateError(f"the {self.prompt_format} chat template failed: {e}") from None
        return rendered[0]

    def assistant_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """(rendered conversation, character spans of its assistant turns): the template's own
        ``{% generation %}`` spans when it has them (as HF's ``return_assistant_tokens_mask``), else the text
        each assistant turn adds after the conversation so far with the generation prompt."""
        if GENERATION_TAG.search(self.template):
            try:
                rendered, spans = self._render_jinja(conversations=[messages], chat_template=self.template,
                                                     return_assistant_tokens_mask=True, **self.kwargs)
            except Exception as e:
                raise TemplateError(f"the {self.prompt_format} chat template failed: {e}") from None
            return rendered[0], [tuple(span) for span in spans[0]]
        return self.prefix_spans(messages)

    def prefix_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        text = self.render(messages)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True) if i else ""
            upto = self.render(messages[: i + 1])
            if not (upto.startswith(before) and text.startswith(upto)):
                raise TemplateError(f"the {self.prompt_format} chat template does not render a conversation's "
                                    "beginning as a prefix of the whole (it rewrites earlier turns), so its "
                                    "assistant turns cannot be located")
            spans.append((len(before), len(upto)))
        return text, spans

    def encode(self, messages: list[dict]) -> tuple[list[int], list[bool]]:
        """Token ids of the rendered conversation and, per token, whether it is an assistant token."""
        text, spans = self.assistant_spans(messages)
        encoding = self.tokenizer.tokenizer.encode(text, add_special_tokens=False)
        assistant, span = [], 0
        for start, end in encoding.offsets:
            while span < len(spans) and start >= spans[span][1]:
                span += 1
            assistant.append(span < len(spans) and end > spans[span][0])
        return encoding.ids, assistant

    def prompt(self, messages: list[dict]) -> list[int]:
        """Token ids that ask the model for the next assistant turn (the generation prompt appended)."""
        return self.tokenizer.tokenize(self.render(messages, add_generation_prompt=True))
