"""Verifiers (component kind ``verifier``): the acceptance rule for drafts.

Each verifier works offline (teacher-forced: the labels are what the target would have said) and in
real decoding (the target's argmax over the verified block). DDTree joins in issue 4.
"""

from __future__ import annotations

import torch

from spec_drafters.registry import register


class Verifier:
    """Base class of the ``verifier`` kind."""

    component_kind = "verifier"

    def offline_accepted(
        self, draft_logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Accepted drafts per block, teacher-forced: logits (B, K-1, V), labels/valid (B, K-1) -> (B,)."""
        raise NotImplementedError

    def accepted(self, drafts: torch.Tensor, posterior: torch.Tensor) -> int:
        """Accepted drafts in real decoding: drafts (K-1,), target argmax at the block's K positions (K,)."""
        raise NotImplementedError


@register("verifier", "greedy_chain")
class GreedyChain(Verifier):
    """The "vanilla streak": the longest prefix of drafts equal to the target's greedy tokens."""

    def offline_accepted(self, draft_logits, labels, valid):
        hit = (draft_logits.argmax(-1) == labels) & valid  # (B, K-1)
        return hit.long().cumprod(dim=1).sum(dim=1)  # (B,)

    def accepted(self, drafts, posterior):
        # posterior[i] is the target's token for the position after block token i.
        hit = drafts == posterior[: drafts.shape[0]]
        return int(hit.long().cumprod(0).sum())
