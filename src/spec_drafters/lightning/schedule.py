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


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon (``torch.optim.Muon``) for the 2-D weight matrices, AdamW for everything else (norm
    weights, biases, a confidence head's bias): Muon's orthogonalised update is defined for matrices
    only, so recipes that train with it keep AdamW for the rest. The learning rates live in the two
    param groups (0: Muon, 1: AdamW), so any scheduler scales both.

    Args:
        params: the trained parameters.
        lr: Muon's learning rate.
        momentum: Muon's momentum.
        weight_decay: Muon's weight decay.
        adamw_lr: AdamW's learning rate.
        adamw_weight_decay: AdamW's weight decay.
    """

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
        adamw_lr: float = 6e-4,
        adamw_weight_decay: float = 0.0,
    ):
        params = [p for p in params if p.requires_grad]
        matrices = {"params": [p for p in params if p.ndim == 2], "lr": lr}
        rest = {"params": [p for p in params if p.ndim != 2], "lr": adamw_lr}
        if not matrices["params"]:
            raise ValueError("MuonWithAdamW: no 2-D parameters to give Muon")
        super().__init__([g for g in (matrices, rest) if g["params"]], {})
        # The inner optimizers share these very group dicts: a scheduler's lr reaches them.
        self.muon = torch.optim.Muon(
            [self.param_groups[0]], lr=lr, momentum=momentum, weight_decay=weight_decay
        )
        self.adamw = None
        if len(self.param_groups) > 1:
            group = self.param_groups[1]
            self.adamw = torch.optim.AdamW(
                [group], lr=adamw_lr, weight_decay=adamw_weight_decay, betas=(0.9, 0.95)
            )

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        if self.adamw is not None:
            self.adamw.step()
        return loss

    def state_dict(self) -> dict:
        return {
            "muon": self.muon.state_dict(),
            "adamw": None if self.adamw is None else self.adamw.state_dict(),
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        if self.adamw is not None:
            self.adamw.load_state_dict(state_dict["adamw"])
        # load_state_dict replaces the inner optimizers' group dicts: share them again.
        self.param_groups = [self.muon.param_groups[0], *(self.adamw.param_groups if self.adamw else [])]
