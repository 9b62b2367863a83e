"""The drafter's input block: its anchor token, then K - 1 mask tokens, at positions anchor .. anchor + K - 1
(docs/method.md section 2). One rule for training (train/pipeline.py, many anchors a row) and for
decoding (decode/generate.py, one anchor: the last committed token)."""

from __future__ import annotations

import torch


def build_blocks(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int):
    """-> block ids (b, N*K) = [anchor token, MASK...] per block, and their positions (b, N*K)."""
    b, n = anchors.shape
    offsets = torch.arange(block_size, device=anchors.device)  # (K,)
    positions = anchors[:, :, None] + offsets  # (b, N, K)
    ids = torch.full((b, n, block_size), mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
    ids[:, :, 0] = input_ids.gather(1, anchors)  # (b, N)
    return ids.view(b, n * block_size), positions.view(b, n * block_size)
