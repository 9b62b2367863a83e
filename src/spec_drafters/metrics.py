"""Acceptance metrics (torchmetrics, so they reduce correctly across processes).

tau, the acceptance length, is tokens committed per target forward = accepted drafts + 1. Two means
are reported and labelled, because they differ (vLLM #42508): the mean over sequences of per-sequence
means (what z-lab and the DDTree paper report) and the pooled mean over all blocks.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric


class SlotAccuracy(Metric):
    """Top-1 accuracy of each block slot 1..K-1 against its label."""

    full_state_update = False

    def __init__(self, block_size: int):
        super().__init__()
        self.add_state("hits", torch.zeros(block_size - 1, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(block_size - 1, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, hit: torch.Tensor, valid: torch.Tensor) -> None:
        """hit, valid: (B, K-1) bool."""
        self.hits += (hit & valid).sum(0).double()
        self.count += valid.sum(0).double()

    def compute(self) -> torch.Tensor:
        return self.hits / self.count.clamp(min=1)  # (K-1,)


class AcceptanceLength(Metric):
    """tau from per-block accepted counts, grouped by sequence."""

    full_state_update = False

    def __init__(self):
        super().__init__()
        self.add_state("seq_mean_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_seqs", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tau_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_blocks", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, accepted: torch.Tensor, valid: torch.Tensor) -> None:
        """accepted, valid: (b, N) per anchor of each sequence; tau of a block = accepted + 1."""
        tau = (accepted.double() + 1) * valid
        blocks = valid.sum(1).double()  # (b,)
        has = blocks > 0
        self.seq_mean_sum += (tau.sum(1)[has] / blocks[has]).sum()
        self.num_seqs += has.sum()
        self.tau_sum += tau.sum()
        self.num_blocks += blocks.sum()

    def compute(self) -> dict[str, torch.Tensor]:
        return {
            "tau": self.seq_mean_sum / self.num_seqs.clamp(min=1),
            "tau_pooled": self.tau_sum / self.num_blocks.clamp(min=1),
        }
