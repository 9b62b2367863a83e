"""Target sources (component kind ``target_source``): where the training labels come from.

The label of position t is the token the target says comes at t. Block slot k of the anchor at p is
trained on the label of position p + k (docs/method.md section 2.5). A source that reads logits serves
them hard (argmax, for cross-entropy) and soft (the distribution, for KL losses); both come from the
same hidden state, so a hard and a soft loss never train on two different targets.

- ``model_output``: the target's real output, lm_head(final norm(last decoder layer)) at t - 1
  ("layer 63 of 64" for the field reports' target, which counts layers from 0).
- ``layer_logits``: an earlier layer k pushed through the same final norm and lm_head. The field reports' v3
  and v5 used layer 61 of 64 and trained the drafter on a worse target than the one that verifies it.
- ``dataset_tokens``: the text itself; right only when the text is the target's own greedy output,
  and it has no distribution for soft losses.

Sources read the target's *clean* tapped states: noise on the drafter's features is applied to a copy
afterwards (noise.py), never to these tensors (the field reports' v3 bug).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from spec_drafters.registry import register
from spec_drafters.target.frozen import FrozenTarget, TargetOutput

if TYPE_CHECKING:
    from spec_drafters.target.cards import TargetCard


def chunked_argmax(head, hidden: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """argmax of head(hidden) over V without holding (b, T, V) at once: (b, T, H) -> (b, T)."""
    return torch.cat([head(h).argmax(-1) for h in hidden.split(chunk, dim=1)], dim=1)


class TargetSource:
    """Base class of the ``target_source`` kind.

    A logit-based source implements :meth:`predictor_hidden`; hard labels and soft logits follow.
    """

    component_kind = "target_source"
    has_distribution = True
    """Whether soft losses (KL to the target distribution) can use this source."""

    def layer_ids(self, card: TargetCard) -> list[int]:
        """Target layers this source needs tapped besides the injection's."""
        return []

    def predictor_hidden(self, target: FrozenTarget, out: TargetOutput) -> torch.Tensor:
        """(b, S, H), already through the final norm: lm_head of position t predicts position t + 1."""
        raise NotImplementedError

    def hard_labels(self, target: FrozenTarget, out: TargetOutput, input_ids: torch.Tensor):
        """(labels (b, S), valid (b, S)): the label of each position and whether it exists."""
        hidden = self.predictor_hidden(target, out) if self.has_distribution else None
        return self.hard_labels_from(target, hidden, input_ids)

    @torch.no_grad()
    def hard_labels_from(self, target: FrozenTarget, hidden: torch.Tensor | None, input_ids: torch.Tensor):
        """Hard labels from the predictor hidden state (b, S, H), e.g. one read from an offline cache."""
        labels = torch.empty_like(input_ids)
        labels[:, 1:] = chunked_argmax(target.head, hidden[:, :-1])  # (b, S-1)
        labels[:, 0] = input_ids[:, 0]
        valid = torch.ones_like(input_ids, dtype=torch.bool)
        valid[:, 0] = False  # nothing predicts position 0
        return labels, valid

    def logits_at(
        self, target: FrozenTarget, out: TargetOutput, rows: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Target logits (M, V) for the labels of ``positions`` (M,) >= 1 in batch ``rows`` (M,)."""
        return self.logits_from(target, self.predictor_hidden(target, out), rows, positions)

    @torch.no_grad()
    def logits_from(self, target, hidden: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor):
        return target.head(hidden[rows, positions - 1])  # (M, V)


@register("target_source", "model_output")
class ModelOutput(TargetSource):
    """Labels from the target's real output: lm_head(final norm(last decoder layer)) at t - 1."""

    def predictor_hidden(self, target, out):
        return out.hidden  # (b, S, H): HF's last_hidden_state is already normed


@register("target_source", "layer_logits")
class LayerLogits(TargetSource):
    """Labels from an earlier decoder layer through the same final norm and lm_head.

    Args:
        layer_id: 0-based decoder layer; negative counts from the end (-1 is the last layer, whose
            labels equal ``model_output``'s; -3 is "layer 61 of 64", the field reports' v3/v5 source).
    """

    def __init__(self, layer_id: int = -3):
        self.layer_id = layer_id

    def resolved_id(self, num_layers: int) -> int:
        i = self.layer_id + num_layers if self.layer_id < 0 else self.layer_id
        if not 0 <= i < num_layers:
            raise ValueError(
                f"layer_id {self.layer_id} is outside the target's {num_layers} layers "
                f"(0..{num_layers - 1}, or -{num_layers}..-1 from the end)"
            )
        return i

    def layer_ids(self, card):
        return [self.resolved_id(card.num_layers)]

    def predictor_hidden(self, target, out):
        return target.norm(out.taps[self.resolved_id(target.num_layers)])  # (b, S, H)


@register("target_source", "dataset_tokens")
class DatasetTokens(TargetSource):
    """The text's own tokens as labels (exact only for target-regenerated text); hard labels only."""

    has_distribution = False

    def hard_labels_from(self, target, hidden, input_ids):
        return input_ids, torch.ones_like(input_ids, dtype=torch.bool)

    def logits_at(self, target, out, rows, positions):
        raise ValueError("dataset_tokens has no target distribution: soft losses need a logit-based source")

    logits_from = logits_at
