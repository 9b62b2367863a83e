"""The verifier (target) an exported drafter names, read from its folder without loading the model.

An engine needs two things of the target in a speculators-layout folder (docs/serving.md):

- ``speculators_config.verifier``: ``name_or_path`` and ``architectures`` (vLLM refuses the folder
  without the block; ``vllm serve DRAFTER`` loads the verifier from ``name_or_path``);
- for a draft vocabulary, ``lm_head.weight`` with the target head's rows of the draft ids, in draft-id
  order: vLLM's drafter keeps a head of ``draft_vocab_size`` rows, and shares the target's whole head
  only when the checkpoint has none, which cannot fit a smaller vocabulary.

The head is read as one tensor from the folder's safetensors (``model.safetensors`` or the shards an
``model.safetensors.index.json`` names), so a 27B target costs one ``vocab x hidden`` read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from spec_drafters.errors import InputError, read_json

#: The head's key, then the embedding's (a tied target stores its head once, as the embedding;
#: Qwen3.5's multimodal layout nests both once more).
_HEAD_KEYS = ("lm_head.weight", "language_model.lm_head.weight")
_EMBED_KEYS = (
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
    "embed_tokens.weight",
)


@dataclass
class Verifier:
    """A target model folder (config.json + safetensors) as an engine will load it."""

    folder: Path
    name_or_path: str  # what the export records: the folder, or the name the user gave
    architectures: list[str]
    num_layers: int
    hidden_size: int
    vocab_size: int

    def block(self) -> dict:
        """speculators' ``VerifierConfig`` fields."""
        return {"name_or_path": self.name_or_path, "architectures": list(self.architectures)}

    def check(self, num_target_layers: int, hidden_size: int, vocab_size: int) -> None:
        """A drafter made for another target is refused, naming each disagreement."""
        wrong = [
            f"{what} {theirs} (the drafter's {ours})"
            for what, theirs, ours in (
                ("num_hidden_layers", self.num_layers, num_target_layers),
                ("hidden_size", self.hidden_size, hidden_size),
                ("vocab_size", self.vocab_size, vocab_size),
            )
            if theirs != ours
        ]
        if wrong:
            raise InputError(f"--verifier {self.folder}: not this drafter's target: {', '.join(wrong)}")

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The target head's rows ``ids`` (a copy), from the one tensor that holds the head."""
        stored = self._files()
        for key in (*_HEAD_KEYS, *_EMBED_KEYS):  # a tied head is stored once, as the embedding
            file = stored.get(key)
            if file is not None:
                with safe_open(str(file), framework="pt") as f:
                    head = f.get_slice(key)
                    rows, cols = head.get_shape()
                    if (rows, cols) != (self.vocab_size, self.hidden_size):
                        raise InputError(
                            f"{file}: {key} is {rows} x {cols}, the config says "
                            f"{self.vocab_size} x {self.hidden_size}"
                        )
                    return f.get_tensor(key)[ids].clone()
        raise InputError(
            f"{self.folder}: no head weight found (looked for {', '.join((*_HEAD_KEYS, *_EMBED_KEYS))})"
        )

    def _files(self) -> dict[str, Path]:
        """Which file holds each weight: the shard index, or the single file's own key list."""
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            return {k: self.folder / v for k, v in (read_json(index).get("weight_map") or {}).items()}
        single = self.folder / "model.safetensors"
        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), single)


def read_verifier(folder: str | Path, name: str | None = None) -> Verifier:
    """The target folder ``folder``; ``name`` is recorded instead of the folder's absolute path (e.g.
    the hub id users will serve it by)."""
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise InputError(f"--verifier {path}: not a model folder (no config.json)")
    if not ((path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()):
        raise InputError(f"--verifier {path}: no model.safetensors or model.safetensors.index.json")
    config = read_json(path / "config.json")
    text = config.get("text_config") or config  # Qwen3.5/3.6 keep the language model's shape there
    try:
        return Verifier(
            folder=path,
            name_or_path=name or str(path.resolve()),
            architectures=list(config.get("architectures") or _architectures(config)),
            num_layers=int(text["num_hidden_layers"]),
            hidden_size=int(text["hidden_size"]),
            vocab_size=int(text["vocab_size"]),
        )
    except KeyError as e:
        raise InputError(f"{path / 'config.json'}: no field {e}") from None


def _architectures(config: dict) -> list[str]:
    """A config without ``architectures`` (as a GGUF conversion writes): transformers' causal-LM class
    for its ``model_type``, which is what engines resolve it to."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type", ""))
    return [name] if name else []
