"""SFT records and chat templates, checked against HF transformers token by token.

For every record format (Megatron-LM/OpenAI messages, ShareGPT, Alpaca) and every template (the built-ins
and a tokenizer's own ``tokenizer_config.json`` chat_template), our token ids equal
``apply_chat_template(tokenize=True)`` and our assistant mask equals its ``assistant_masks``
(``return_assistant_tokens_mask``, driven by the templates' ``{% generation %}`` tags). For the built-ins our
spans come from prefix renders of the template with its tags removed, HF's from the tags, so the two are
independent; the tokenizer's template (tags around the content and ``<|im_end|>`` only) checks that tagged
templates keep exactly the tagged span. Also: bad records fail with the file and
record number; a template that rewrites earlier turns is refused; the packing plan holds every conversation
once and never overfills a bin.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from mtmegatron.data.tokenizer import load_tokenizer, train_bpe  # noqa: E402
from mtmegatron.sft.dataset import SFTDataError, read_conversations  # noqa: E402
from mtmegatron.sft.formats import to_messages  # noqa: E402
from mtmegatron.sft.packing import first_fit_decreasing, packed_batch, padded_batch  # noqa: E402
from mtmegatron.sft.templates import BUILTIN, GENERATION_TAG, SPECIAL_TOKENS, ChatTemplate, TemplateError  # noqa: E402

# A Qwen2-style template (its own text, with generation tags) as a tokenizer would ship it.
TOKENIZER_TEMPLATE = (
    "{%- for message in messages %}{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
RECORDS = {
    "messages": {"messages": [{"role": "system", "content": "Answer briefly."},
                              {"role": "user", "content": "What is 2+2?"},
                              {"role": "assistant", "content": "4, of course."},
                              {"role": "user", "content": "And in words, please?"},
                              {"role": "assistant", "content": "Four.\nThat is all."}]},
    "sharegpt": {"conversations": [{"from": "human", "value": "Name a colour."},
                                   {"from": "gpt", "value": " Blue "},
                                   {"from": "human", "value": "Another one"},
                                   {"from": "gpt", "value": "Green!"}]},
    "alpaca": {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
}
TEMPLATES = [*BUILTIN, "tokenizer"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """(our tokenizer, HF fast tokenizer) over one tokenizer.json with every template's special tokens."""
    specials = tuple(dict.fromkeys(t for ts in SPECIAL_TOKENS.values() for t in ts))
    texts = [json.dumps(r) for r in RECORDS.values()] * 20
    directory = tmp_path_factory.mktemp("tok")
    train_bpe(texts, 400, str(directory), specials)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = TOKENIZER_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    ours = load_tokenizer(str(directory))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
    return ours, hf


@pytest.mark.parametrize("prompt_format", TEMPLATES)
@pytest.mark.parametrize("record_format", RECORDS)
def test_assistant_mask_equals_hf(tokenizers, prompt_format, record_format):
    ours, hf = tokenizers
    messages = to_messages(RECORDS[record_format])
    template = ChatTemplate(ours, prompt_format)
    out = hf.apply_chat_template(messages, chat_template=template.template, tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True)
    if prompt_format in BUILTIN:  # ours from prefix renders (tags removed), HF's from the tags
        template.template = GENERATION_TAG.sub("", template.template).replace("{% endgeneration %}", "")
        assert not GENERATION_TAG.search(template.template)
    ids, mask = template.encode(messages)
    assert ids == list(out["input_ids"])
    assert [int(m) for m in mask] == list(out["assistant_masks"])
    assert sum(mask) > 0 and not all(mask)
    # every assistant answer's text is inside the masked tokens, no user text is
    masked_text = ours.detokenize([i for i, m in zip(ids, mask) if m])
    for m in messages:
        if m["role"] == "assistant":
            assert m["content"].strip() in masked_text
        else:
            assert m["content"].strip() not in masked_text


def test_formats_normalise_to_the_same_messages():
    assert to_messages(RECORDS["alpaca"]) == [
        {"role": "user", "content": "Translate to French.\n\nGood morning"}, {"role": "assistant", "content": "Bonjour"}]
    assert [m["role"] for m in to_messages(RECORDS["sharegpt"])] == ["user", "assistant"] * 2


@pytest.mark.parametrize("line, reason", [
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant turn"),
    ('{"messages": [{"role": "robot", "content": "hi"}]}', "role 'robot'"),
    ('{"conversations": [{"from": "alien", "value": "x"}]}', "unknown \"from\""),
    ('{"instruction": "x"}', "not a known SFT record"),
    ('{"messages": [', "not valid JSON"),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]}', "empty assistant"),
])
def test_bad_record_names_file_and_record(tmp_path, line, reason):
    path = tmp_path / "data.jsonl"
    good = json.dumps(RECORDS["messages"])
    path.write_text(f"{good}\n\n{good}\n{line}\n{good}\n")
    with pytest.raises(SFTDataError) as e:
        read_conversations(str(path))
    message = str(e.value)
    assert message.startswith(f"{path}: record 4: ") and reason in message and "\n" not in message


def test_template_that_rewrites_history_is_refused(tokenizers):
    ours, _ = tokenizers
    template = ChatTemplate(ours, "plain")
    # renders earlier assistant turns differently once a later turn exists (like reasoning-stripping templates)
    template.template = ("{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}[old]"
                         "{% else %}{{ m['content'] }}{% endif %}{% endfor %}")
    with pytest.raises(TemplateError, match="rewrites earlier turns"):
        template.encode(to_messages(RECORDS["messages"]))


def test_first_fit_decreasing_plan():
    lengths = np.random.RandomState(0).randint(1, 33, size=200)
    bins = first_fit_decreasing(lengths, 32, seed=3)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(lengths[b].sum() <= 32 for b in bins)
    assert len(bins) <= int(np.ceil(lengths.sum() / 32 * 11 / 9)) + 1  # FFD's bound
    assert bins == first_fit_decreasing(lengths, 32, seed=3)


def test_packed_and_padded_batches_hold_the_same_positions():
    rng = np.random.RandomState(1)
    bins = [[(rng.randint(5, 50, n + 1), rng.rand(n + 1) > 0.5) for n in (7, 12)], [(rng.randint(5, 50, 20),
                                                                                  rng.rand(20) > 0.5)]]
    packed = packed_batch(bins, 24, pad_id=0)
    assert packed["tokens"].shape == (1, 48)
    assert packed["cu_seqlens"].tolist() == [0, 7, 19, 24, 43, 48]
    assert packed["position_ids"][0, 19:24].tolist() == [0, 1, 2, 3, 4]
    assert packed["position_ids"][0, 7:19].tolist() == list(range(12))
    padded = padded_batch(bins, 24, pad_id=0)
    assert padded["tokens"].shape == (3, 24)
    for key in ("tokens", "labels", "loss_mask"):
        rows = [padded[key][r, :n] for r, n in enumerate((7, 12, 19))]
        assert (packed[key][0, :7] == rows[0]).all() and (packed[key][0, 7:19] == rows[1]).all()
        assert (packed[key][0, 24:43] == rows[2]).all()
    assert packed["loss_mask"][0, 19:24].sum() == 0 and padded["loss_mask"][:, 19:].sum() == 0


@pytest.mark.parametrize("extra, message", [
    (["--context-parallel-size", "2", "--seq-length", "66"], "not divisible by 2 x --context-parallel-size"),
    (["--mock-data"], "--mock-data has none"),
    (["--sft-tokenizer-prompt-format", "vicuna"], "is unknown"),
])
def test_sft_flag_mistakes_are_config_errors(extra, message):
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.utils.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        parse_args(["--model", "llama3", "--seq-length", "64", "--sft", *extra], world_size=2)


def test_sft_packing_under_cp_is_accepted():
    from mtmegatron.config.arguments import parse_args

    args = parse_args(["--model", "llama3", "--seq-length", "64", "--sft", "--context-parallel-size", "2"],
                      world_size=2)
    assert args.sft_packing and args.context_parallel_size == 2


def test_sft_switches_on_per_token_loss():
    from mtmegatron.config.arguments import parse_args

    args = parse_args(["--model", "llama3", "--sft"], world_size=1)
    assert args.calculate_per_token_loss and args.sft_packing
    assert not parse_args(["--model", "llama3", "--mock-data"], world_size=1).calculate_per_token_loss
