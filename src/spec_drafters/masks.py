"""The drafter's training attention mask, built from small predicates (component kind ``mask``).

Training layout (dflash.md section 2.4): queries are the N*K block tokens, keys are
``[context positions 0..S-1 | all N*K block tokens]``. Query (j, k) of the block anchored at p_j may see
- context key t iff t < p_j: strictly before the anchor, because at inference the anchor is the bonus
  token whose target features do not exist yet (SpecForge PR #473 shipped ``<=``);
- the keys of its own block, in both directions (SpecForge PR #427 shipped a causal block);
- nothing of any other block.
Padded (unused) anchor slots see only their own block, so no softmax row is empty; their labels are
all invalid, so they never reach the loss.

Notation: b batch, N anchors, K block size, S context length. Masks are bool, True = may attend.
"""

from __future__ import annotations

import torch

from spec_drafters.registry import register


# --- predicates: broadcastable index tensors in, bool tensor out ------------------------------------
def context_before_anchor(anchor_pos: torch.Tensor, kv_pos: torch.Tensor) -> torch.Tensor:
    return kv_pos < anchor_pos


def same_block(q_block: torch.Tensor, kv_block: torch.Tensor) -> torch.Tensor:
    return q_block == kv_block


class DrafterMask:
    """Base class of the ``mask`` kind: builds the dense (b, 1, N*K, S + N*K) training mask."""

    component_kind = "mask"

    def dense(
        self, anchors: torch.Tensor, anchor_valid: torch.Tensor, seq_len: int, block_size: int
    ) -> torch.Tensor:
        raise NotImplementedError


@register("mask", "dflash_block")
class DFlashBlockMask(DrafterMask):
    """The DFlash mask: context strictly before the anchor, own block bidirectional, no other block."""

    def dense(self, anchors, anchor_valid, seq_len, block_size):
        b, n = anchors.shape
        device = anchors.device
        q_block = torch.arange(n, device=device).repeat_interleave(block_size)  # (N*K,)
        q_anchor = anchors[:, q_block]  # (b, N*K)
        q_valid = anchor_valid[:, q_block]  # (b, N*K)
        kv_pos = torch.arange(seq_len, device=device)  # (S,)
        ctx = context_before_anchor(q_anchor[:, :, None], kv_pos[None, None, :])  # (b, N*K, S)
        ctx = ctx & q_valid[:, :, None]
        blk = same_block(q_block[:, None], q_block[None, :])  # (N*K, N*K)
        blk = blk[None].expand(b, -1, -1)  # (b, N*K, N*K)
        return torch.cat([ctx, blk], dim=-1)[:, None]  # (b, 1, N*K, S + N*K)
