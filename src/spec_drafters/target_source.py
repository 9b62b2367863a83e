"""Target sources (component kind ``target_source``): where the training labels come from.

The label of position t is the token the target says comes at t. Block slot k of the anchor at p is
trained on the label of position p + k (dflash.md section 2.5).

- ``model_output``: the target's own next-token prediction, argmax of the real model output (last
  decoder layer, final norm, lm_head) at position t - 1. The seeds' v3/v5 took layer 61 of 64
  instead and trained on a worse target.
- ``dataset_tokens``: the text itself; right only when the text is the target's own greedy output.
"""

from __future__ import annotations

import torch

from spec_drafters.registry import register
from spec_drafters.target import FrozenTarget, TargetOutput


def chunked_argmax(head, hidden: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """argmax of head(hidden) over V without holding (b, T, V) at once: (b, T, H) -> (b, T)."""
    return torch.cat([head(h).argmax(-1) for h in hidden.split(chunk, dim=1)], dim=1)


class TargetSource:
    """Base class of the ``target_source`` kind."""

    component_kind = "target_source"

    def layer_ids(self, num_layers: int) -> list[int]:
        """Target layers this source needs tapped besides the injection's."""
        return []

    def hard_labels(self, target: FrozenTarget, out: TargetOutput, input_ids: torch.Tensor):
        """(labels (b, S), valid (b, S)): the label of each position and whether it exists."""
        raise NotImplementedError


@register("target_source", "model_output")
class ModelOutput(TargetSource):
    """Hard labels from the target's real output: argmax of lm_head(norm(last layer)) at t - 1."""

    @torch.no_grad()
    def hard_labels(self, target, out, input_ids):
        labels = torch.empty_like(input_ids)
        labels[:, 1:] = chunked_argmax(target.head, out.hidden[:, :-1])  # (b, S-1)
        labels[:, 0] = input_ids[:, 0]
        valid = torch.ones_like(input_ids, dtype=torch.bool)
        valid[:, 0] = False  # nothing predicts position 0
        return labels, valid


@register("target_source", "dataset_tokens")
class DatasetTokens(TargetSource):
    """The text's own tokens as labels (exact only for target-regenerated text)."""

    def hard_labels(self, target, out, input_ids):
        return input_ids, torch.ones_like(input_ids, dtype=torch.bool)
