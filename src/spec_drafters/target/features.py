"""What the target gives a drafter: the fc input from the tapped layers, and the labels.

One function per rule, called by training (online), the offline feature cache and decoding, so the
three cannot drift apart: the fc input is the chosen taps concatenated in injection order
(docs/method.md section 1); the label of position t is the source's token at t (section 2, items 5-6).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_drafters.errors import ArgumentError, argument
from spec_drafters.registry import name_of
from spec_drafters.target.cards import MaskTokenError
from spec_drafters.target.frozen import FrozenTarget, TargetOutput
from spec_drafters.target.labels import TargetSource


def fc_input(out: TargetOutput, fc_ids: list[int], positions: torch.Tensor | None = None) -> torch.Tensor:
    """The drafter's fc input: the taps of ``fc_ids`` side by side -> (b, S, n*H), or (b, T, n*H) at
    ``positions`` (T,) only."""
    taps = [out.taps[i] for i in fc_ids]
    if positions is not None:
        taps = [t[:, positions] for t in taps]
    return torch.cat(taps, dim=-1)


@dataclass
class TargetFeatures:
    """One batch as the target sees it, before any noise (labels read these, never a noised copy)."""

    clean: torch.Tensor  # (b, S, n*H) the fc input
    labels: torch.Tensor  # (b, S) the label of each position (any value where not label_ok)
    label_ok: torch.Tensor  # (b, S) bool: the position has a label
    hidden: torch.Tensor | None  # (b, S, H) the source's predictor hidden state, for soft losses


@torch.no_grad()
def target_features(
    target: FrozenTarget,
    fc_ids: list[int],
    source: TargetSource,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> TargetFeatures:
    """Runs the frozen target over a batch (b, S) and returns the fc input and the labels."""
    out = target(input_ids, attention_mask=attention_mask)
    hidden = source.predictor_hidden(target, out) if source.has_distribution else None  # (b, S, H)
    labels, ok = source.hard_labels_from(target, hidden, input_ids)  # (b, S)
    return TargetFeatures(fc_input(out, fc_ids), labels, ok, hidden)


def cached_features(batch: dict[str, torch.Tensor], dtype: torch.dtype) -> TargetFeatures:
    """The same from a batch of the offline feature cache (labels stored as -1 where there is none)."""
    labels = batch["labels"]  # (b, S) int32
    return TargetFeatures(
        batch["features"].to(dtype), labels.clamp(min=0).long(), labels >= 0, batch.get("label_hidden")
    )


@dataclass
class FeatureSpec:
    """The target side of a run: what computes its fc input and labels, and what identifies them (an
    offline feature cache records ``identity`` and refuses a run whose identity differs)."""

    target: FrozenTarget
    fc_ids: list[int]
    source: TargetSource
    soft: bool  # a soft loss reads the label hidden state, not only the hard labels
    tokenizer: object  # the target's tokenizer (text -> ids)
    identity: dict  # {"target": card name, "label_source": registry name, "label_layers": [...],
    #                  "tokenizer": the tokenizer's identity}

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> TargetFeatures:
        return target_features(self.target, self.fc_ids, self.source, input_ids, attention_mask)


def plan_taps(card, vocab_size: int, injection, sources: dict, loss) -> tuple[list[int], list[int]]:
    """The fc ids and every tapped layer, after checking that the chosen components fit the target and
    each other. ``sources``: argument name -> target source (training and validation). Errors name the
    argument they concern (errors.ArgumentError); the CLI turns it into its flag."""
    if not 0 <= card.mask_token_id < vocab_size:
        with argument("target"):
            raise MaskTokenError(
                f"mask token id {card.mask_token_id} is outside the vocabulary 0..{vocab_size - 1}"
            )
    with argument("injection"):
        fc_ids = injection.fc_ids(card)
        taps = set(injection.tap_ids(card))
    for name, source in sources.items():
        with argument(name):
            taps |= set(source.layer_ids(card))
        if loss.needs_distribution and not source.has_distribution:
            raise ArgumentError(
                "loss",
                f"{name_of(loss)} needs the target's distribution, which {name} {name_of(source)} "
                "does not have",
            )
    if not set(fc_ids) <= taps:
        raise ArgumentError("injection", f"fc ids {fc_ids} are not all tapped ({sorted(taps)})")
    return fc_ids, sorted(taps)
