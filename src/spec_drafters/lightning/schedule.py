"""The default optimizer and learning-rate schedule: AdamW, linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math

import torch


class WarmupCosine(torch.optim.lr_scheduler.LambdaLR):
    """Linear warmup over ``warmup_fraction`` of ``total_steps``, then a cosine from the peak down to
    ``min_lr_ratio`` x the peak at the last step (the released DFlash drafters' recipe).

    Args:
        optimizer: its learning rates are the peaks.
        total_steps: the run's optimizer steps (Lightning's ``estimated_stepping_batches``).
        warmup_fraction: fraction of the steps spent warming up (at least one step).
        min_lr_ratio: the floor, as a fraction of the peak.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        warmup_fraction: float = 0.04,
        min_lr_ratio: float = 0.1,
    ):
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        self.total_steps = total_steps
        self.warmup = max(1, int(total_steps * warmup_fraction))
        self.min_lr_ratio = min_lr_ratio
        super().__init__(optimizer, self.factor)

    def factor(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total_steps - self.warmup))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def default_optimizer(params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with betas (0.9, 0.95), the released drafters' optimizer (docs/method.md section 2.9)."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
