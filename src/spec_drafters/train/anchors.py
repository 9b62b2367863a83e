"""Anchors and blocks (component kind ``anchors``).

Per sequence, up to N anchor positions are drawn uniformly without replacement among eligible
positions, re-drawn every step, sorted (docs/method.md section 2.2). Block j is
``[token at p_j, MASK x (K-1)]`` at positions ``p_j .. p_j + K - 1``; slot k is trained on the label of
position ``p_j + k`` where that position exists and is supervised.

Eligible anchor p: p >= 1 (there is context), p is supervised, and p + 1 exists and is supervised
(so the block has at least one label). ``require_full_block`` additionally asks for all K - 1
labels, which validation uses so that a block's acceptance is never cut short by the data's end.

Notation: b batch, S sequence length, N anchors, K block size.
"""

from __future__ import annotations

import torch

from spec_drafters.registry import register


def eligible_anchors(loss_mask: torch.Tensor, block_size: int, require_full_block: bool) -> torch.Tensor:
    """(b, S) bool: positions that may anchor a block."""
    m = loss_mask.bool()
    s = m.shape[1]
    ok = torch.zeros_like(m)
    ok[:, 1 : s - 1] = m[:, 1 : s - 1] & m[:, 2:]
    if require_full_block:
        for k in range(2, block_size):  # every label p+1..p+K-1 must exist and be supervised
            nxt = torch.zeros_like(m)
            nxt[:, : s - k] = m[:, k:]
            ok &= nxt
    return ok


class AnchorSampler:
    """Base class of the ``anchors`` kind."""

    component_kind = "anchors"

    def __call__(self, loss_mask: torch.Tensor, block_size: int, generator: torch.Generator):
        """-> anchors (b, N) long, valid (b, N) bool; valid anchors first, sorted by position."""
        raise NotImplementedError


@register("anchors", "uniform")
class UniformAnchors(AnchorSampler):
    """Uniform sampling without replacement.

    Args:
        max_anchors: N, the most anchors per sequence (peers default to 512; up to 1024 seen).
        require_full_block: only anchors whose K-1 labels all exist.
    """

    def __init__(self, max_anchors: int = 512, require_full_block: bool = False):
        if max_anchors < 1:
            raise ValueError(f"max_anchors must be >= 1, got {max_anchors}")
        self.max_anchors = max_anchors
        self.require_full_block = require_full_block

    def __call__(self, loss_mask, block_size, generator):
        ok = eligible_anchors(loss_mask, block_size, self.require_full_block)  # (b, S)
        b, s = ok.shape
        n = min(self.max_anchors, s)
        keys = torch.rand((b, s), generator=generator, device=generator.device).to(ok.device)
        keys = torch.where(ok, keys, 2.0)  # ineligible positions lose every draw
        picked = torch.topk(keys, n, dim=1, largest=False).indices  # (b, N)
        valid = ok.gather(1, picked)  # (b, N)
        # Valid anchors first, in position order; padded slots point at position 0.
        order = torch.argsort(torch.where(valid, picked, s + picked), dim=1)
        anchors = torch.where(valid, picked, 0).gather(1, order)
        return anchors, valid.gather(1, order)


def block_labels(labels, label_valid, loss_mask, anchors, anchor_valid, block_size: int):
    """Slot k of anchor p gets the label of p + k. -> labels (b, N, K), valid (b, N, K); slot 0 invalid."""
    b, s = labels.shape
    pos = anchors[:, :, None] + torch.arange(block_size, device=anchors.device)  # (b, N, K)
    inside = pos < s
    idx = pos.clamp(max=s - 1).view(b, -1)  # (b, N*K)
    out = labels.gather(1, idx).view(pos.shape)  # (b, N, K)
    ok = (label_valid & loss_mask.bool()).gather(1, idx).view(pos.shape) & inside & anchor_valid[:, :, None]
    ok[:, :, 0] = False  # the anchor itself is given, never predicted
    return out, ok
