"""Tiny byte-level chat tokenizers for the tiny test targets (``TinyRandom(chat=...)``).

Real targets bring their own tokenizer and chat template. The tests need the same machinery without
a model hub: a byte-level BPE with no merges (one token per byte, as GPT-2's byte alphabet), the
special tokens of a chat format, and a chat template written here in the format's shape:

- ``chatml``: Qwen's format. ``<|im_start|>role\\n ... <|im_end|>\\n`` per turn; the last assistant turn
  carries a think block (``<think>\\n reasoning \\n</think>\\n\\n``, added tokens as in Qwen3's tokenizer),
  earlier assistant turns lose theirs, and with thinking off the generation prompt ends with an empty
  think block, as Qwen3's template does.
- ``llama3``: Llama 3's format. ``<|begin_of_text|>`` once, then ``<|start_header_id|>role<|end_header_id|>
  \\n\\n ... <|eot_id|>`` per turn.

Each also has ``<|mask|>`` (the drafter's mask token) and ``<|endoftext|>``.
"""

from __future__ import annotations

CHATML_TEMPLATE = (
    "{% set last_user = namespace(i=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set last_user.i = loop.index0 %}{% endif %}"
    "{% endfor %}"
    "{% for m in messages %}"
    "<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and loop.index0 > last_user.i %}"
    "<think>\n{{ m.reasoning_content or '' }}\n</think>\n\n"
    "{% endif %}"
    "{{ m.content }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)

LLAMA3_TEMPLATE = (
    "<|begin_of_text|>"
    "{% for m in messages %}"
    "<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

#: style -> (special tokens, other added tokens, end-of-turn token, chat template)
STYLES = {
    "chatml": (["<|im_start|>", "<|im_end|>"], ["<think>", "</think>"], "<|im_end|>", CHATML_TEMPLATE),
    "llama3": (
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        [],
        "<|eot_id|>",
        LLAMA3_TEMPLATE,
    ),
}


def chat_tokenizer(style: str):
    """A transformers fast tokenizer of ``style`` (see the module): 256 byte tokens, then the format's
    tokens, ``<|endoftext|>`` and ``<|mask|>``; its eos token is the format's end of turn."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if style not in STYLES:
        raise ValueError(f"chat must be one of {', '.join(STYLES)}, got {style!r}")
    special, added, end_of_turn, template = STYLES[style]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=core)
    hf.add_special_tokens({"additional_special_tokens": [*special, "<|endoftext|>", "<|mask|>"]})
    if added:
        hf.add_tokens(added)  # not special, as Qwen3's <think>: matched in any text
    hf.eos_token, hf.pad_token = end_of_turn, "<|endoftext|>"
    hf.chat_template = template
    return hf
