"""Losses (component kind ``loss``) over the supervised block slots.

Inputs are flattened over the M supervised (anchor, slot) pairs so that the (M, V) logits of
unsupervised slots are never computed: logits (M, V), labels (M,), slots (M,) with slot k in 1..K-1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from spec_drafters.registry import register


def slot_weights(slots: torch.Tensor, gamma: float | None) -> torch.Tensor:
    """w_k = exp(-(k - 1) / gamma) for slot k >= 1 (DFlash paper; gamma 7 for K=16, 4 for K=8).

    ``gamma=None`` weighs every slot equally. Slot 0, the anchor, is never trained and must not appear.
    """
    if bool((slots < 1).any()):
        raise ValueError("slot 0 (the anchor) is never trained; it must not reach the loss")
    if gamma is None:
        return torch.ones_like(slots, dtype=torch.float32)
    return torch.exp(-(slots.float() - 1.0) / gamma)


class DraftLoss(nn.Module):
    """Base class of the ``loss`` kind."""

    component_kind = "loss"

    def forward(self, logits: torch.Tensor, labels: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@register("loss", "hard_ce")
class HardCE(DraftLoss):
    """Cross-entropy to hard labels, weighted per slot, normalised by the sum of weights (SpecForge).

    Args:
        gamma: decay of the slot weights exp(-(k-1)/gamma); null for uniform weights.
    """

    def __init__(self, gamma: float | None = 7.0):
        super().__init__()
        if gamma is not None and not (gamma > 0 and math.isfinite(gamma)):
            raise ValueError(f"--model.loss.init_args.gamma must be a positive number or null, got {gamma}")
        self.gamma = gamma

    def forward(self, logits, labels, slots):
        if labels.numel() == 0:
            return logits.sum() * 0.0  # a batch without supervised slots contributes nothing
        w = slot_weights(slots, self.gamma)  # (M,)
        ce = F.cross_entropy(logits.float(), labels, reduction="none")  # (M,)
        return (w * ce).sum() / w.sum()
