"""Per-slot weights of a loss (component kind ``slot_weights``).

A loss is a weighted mean over the M supervised slots, normalised by the sum of the weights
(train/losses.py). Which slots matter more is a choice:

- ``exp_decay``: w_k = exp(-(k - 1) / gamma) for slot k (the DFlash paper; gamma 7 for K = 16, 4 for
  K = 8), or uniform with gamma null.
- ``dpace``: D-PACE (arXiv 2605.18810): a slot weighs as much as the acceptance it can still add. With
  q_i = (1 - alpha) * exp(-CE_i) + alpha the chance-like score of slot i, slot j gets
  w_j = sum over supervised m >= j of prod over i <= m of q_i, computed without gradient. A slot
  behind an unlikely one weighs little; alpha keeps every weight away from zero.
"""

from __future__ import annotations

import math

import torch

from spec_drafters.registry import register


class SlotWeights:
    """Base class of the ``slot_weights`` kind."""

    component_kind = "slot_weights"
    needs_ce = False
    """True when the weights read each slot's cross-entropy to its hard label."""

    def __call__(
        self, slots: torch.Tensor, supervised: torch.Tensor, ce: torch.Tensor | None
    ) -> torch.Tensor:
        """slots (M,) in 1..K-1, supervised (b, N, K) bool (where the M rows sit, row-major), ce (M,)
        or None -> weights (M,), no gradient."""
        raise NotImplementedError


def _check_slots(slots: torch.Tensor) -> None:
    if bool((slots < 1).any()):
        raise ValueError("slot 0 (the anchor) is never trained; it must not reach the loss")


@register("slot_weights", "exp_decay")
class ExpDecay(SlotWeights):
    """w_k = exp(-(k - 1) / gamma).

    Args:
        gamma: the decay; null weighs every slot equally.
    """

    def __init__(self, gamma: float | None = 7.0):
        if gamma is not None and not (gamma > 0 and math.isfinite(gamma)):
            raise ValueError(f"gamma must be a positive number or null, got {gamma}")
        self.gamma = gamma

    def __call__(self, slots, supervised, ce):
        _check_slots(slots)
        if self.gamma is None:
            return torch.ones_like(slots, dtype=torch.float32)
        return torch.exp(-(slots.float() - 1.0) / self.gamma)


@register("slot_weights", "dpace")
class DPACE(SlotWeights):
    """D-PACE position weights (arXiv 2605.18810), from each slot's cross-entropy, without gradient.

    Args:
        alpha: the floor mixed into every slot's score q_i = (1 - alpha) exp(-CE_i) + alpha (0..1).
    """

    needs_ce = True

    def __init__(self, alpha: float = 0.5):
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha

    @torch.no_grad()
    def __call__(self, slots, supervised, ce):
        _check_slots(slots)
        if ce is None:
            raise ValueError("dpace weights need each slot's cross-entropy")
        # A slot in the middle of a block that is not supervised (its label is outside a draft
        # vocabulary: never accepted) scores alpha; slots past the end of the text end the block.
        q = torch.full(supervised.shape, self.alpha, dtype=torch.float32, device=ce.device)  # (b, N, K)
        q[supervised] = (1 - self.alpha) * torch.exp(-ce.detach().float()) + self.alpha
        q[..., 0] = 1.0  # the anchor is given
        prefix = q.cumprod(dim=-1) * supervised  # P_m, kept only where slot m is supervised
        w = prefix.flip(-1).cumsum(-1).flip(-1)  # w_j = sum over m >= j of P_m
        return w[supervised]
