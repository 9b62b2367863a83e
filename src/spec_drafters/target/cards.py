"""Target cards: what the registry knows about a target (``registry/targets/<name>.yaml``: depth,
hidden size, vocabulary, mask token, default taps, HF config), checked against the weights on load."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml
from torch import nn

from spec_drafters.errors import MissingFile

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
