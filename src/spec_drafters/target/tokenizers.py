"""The tokenizers a target comes with: HuggingFace's behind :class:`TextTokenizer` (special tokens never
parsed from plain text; chat turns rendered by the target's own template), and a byte tokenizer for the
tiny random targets of tests."""

from __future__ import annotations

import hashlib
import json

from spec_drafters.errors import InputError


class TextTokenizer:
    """The two calls this project needs from a tokenizer, with special tokens never parsed from text.

    ``split_special_tokens`` matters: the drafter's mask token is a special token, and a literal
    ``<empty_output>`` in a document must not turn into it (docs/method.md section 2, mask token).
    """

    def __init__(self, hf_tokenizer):
        self.hf = hf_tokenizer

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False, split_special_tokens=True)

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=False)

    def __len__(self) -> int:
        return len(self.hf)

    def special_ids(self) -> set[int]:
        """The ids of the special tokens (chat markup, end of turn, the mask token)."""
        return set(self.hf.all_special_ids)

    def special_strings(self) -> list[str]:
        """The text of each special token: plain text holding one was meant as chat markup."""
        return list(self.hf.all_special_tokens)

    def chat_ids(
        self, turns: list[dict], add_generation_prompt: bool, enable_thinking: bool | None
    ) -> list[int]:
        """A conversation through the tokenizer's chat template, tokenized as an engine tokenizes a chat
        request: the rendered text with its special tokens parsed (data/chat.py)."""
        if not self.hf.chat_template:
            raise InputError(
                f"chat records need the target's chat template, and its tokenizer ({type(self.hf).__name__}) "
                "has none: give plain-text records ('text', or 'prompt' and 'response') instead"
            )
        extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        if not turns:
            return []
        text = self.hf.apply_chat_template(
            turns, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )
        return self.hf.encode(text, add_special_tokens=False)  # special tokens parsed, as the engine does

    def identity(self) -> dict:
        """Class, size and a hash of every (token, id) pair: two tokenizers that could tokenize a text
        differently differ here (an offline cache records it). Not the folder: the same tokenizer may
        live anywhere."""
        vocab = json.dumps(sorted(self.hf.get_vocab().items()), ensure_ascii=False)
        return {
            "name": type(self.hf).__name__,
            "vocab_size": len(self.hf),
            "vocab_sha256": hashlib.sha256(vocab.encode()).hexdigest(),
        }


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, then BOS 256, EOS 257, MASK 258 (for the tiny test targets)."""

    bos_token_id, eos_token_id, mask_token_id = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def identity(self) -> dict:  # fixed by the class: its name and size say everything
        return {"name": type(self).__name__, "vocab_size": self.vocab_size}

    def __len__(self) -> int:
        return self.vocab_size

    def special_ids(self) -> set[int]:
        return {self.bos_token_id, self.eos_token_id, self.mask_token_id}

    def special_strings(self) -> list[str]:
        return []  # no text produces them

    def chat_ids(self, turns, add_generation_prompt, enable_thinking) -> list[int]:
        raise InputError(
            "chat records need the target's chat template, and the byte tokenizer has none: use "
            "TinyRandom(chat=chatml) or (chat=llama3), or plain-text records"
        )
