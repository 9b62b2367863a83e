"""Losses shaped by what a verifier accepts (component kind ``loss``), over the same slots as
train/losses.py:

- ``cap``: wraps any loss and adds CAP, an auxiliary confidence head (docs/method.md section 5).
- ``dspark_confidence``: the same head trained on DSpark's soft target, each slot's acceptance
  probability sum_v min(p_d, p_t).
- ``tree_coverage``: the mass of the labels inside the draft tree a DDTree budget would build.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from spec_drafters.model.tree import build_tree
from spec_drafters.registry import register
from spec_drafters.train.losses import DraftLoss, check_positive, overlap, zero_loss


def accepted_indicator(hit: torch.Tensor, supervised: torch.Tensor):
    """Teacher-forced acceptance per slot: slot k is accepted iff slots 1..k all match.

    hit, supervised (b, N, K) bool (slot 0 ignored) -> (accepted (b, N, K), known (b, N, K)); ``known``
    marks slots whose slots 1..k are all supervised, the only ones where acceptance is defined.
    """
    known = supervised.clone()
    known[..., 0] = True
    known = known.long().cumprod(-1).bool()
    known[..., 0] = False
    acc = (hit | ~supervised).clone()
    acc[..., 0] = True
    acc = acc.long().cumprod(-1).bool() & known
    return acc, known


@register("loss", "cap")
class CAP(DraftLoss):
    """CAP: a main loss plus an auxiliary confidence head and its BCE (docs/method.md section 5).

    The head reads the drafter's final hidden state of each slot and predicts the probability that
    the slot is accepted in the teacher-forced chain (all slots 1..k match the labels). Its target is
    computed from the drafter's own argmax and detached. At serving time ``confidence`` can stop a
    chain early or rescore tree nodes. The head's weights live in this loss (``loss_fn.head.*``).

    Args:
        main: the loss this one wraps (any ``loss`` component).
        weight: multiplier of the confidence BCE.
        detach_hidden: train the head on a detached hidden state, so the BCE never shapes the drafter.
    """

    def __init__(self, main: DraftLoss, weight: float = 0.1, detach_hidden: bool = False):
        super().__init__()
        if isinstance(main, CAP):
            raise ValueError("main cannot itself be cap")
        self.main = main
        self.weight = check_positive(weight, "weight")
        self.detach_hidden = detach_hidden
        self.head: nn.Linear | None = None

    @property
    def needs_distribution(self) -> bool:  # type: ignore[override]
        return self.main.needs_distribution

    def bind(self, hidden_size: int) -> None:
        self.main.bind(hidden_size)
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)  # starts at p = 0.5 everywhere

    def confidence(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) drafter final hidden -> (...) probability that the slot is accepted."""
        return torch.sigmoid(self.head(hidden).squeeze(-1))

    def forward(self, batch):
        if self.head is None:
            raise RuntimeError("cap: bind(hidden_size) was not called")
        out = self.main(batch)
        if batch.empty:
            return {**out, "loss": out["loss"] + self.head.weight.sum() * 0.0}
        sup = batch.supervised
        hit = torch.zeros_like(sup)
        hit[sup] = batch.argmax() == batch.labels
        accepted, known = accepted_indicator(hit, sup)
        rows = known[sup]  # (M,) which of the M rows have a defined acceptance
        hidden = batch.hidden.detach() if self.detach_hidden else batch.hidden
        logit = self.head(hidden[rows]).squeeze(-1).float()  # (M',)
        target = accepted[sup][rows].float()  # (M',), detached by construction (argmax)
        bce = F.binary_cross_entropy_with_logits(logit, target, reduction="none")  # (M',)
        bce = batch.mean(bce, torch.ones_like(bce)) if rows.any() else logit.sum() * 0.0
        main = out.pop("loss")
        return {"loss": main + self.weight * bce, **out, "main": main.detach(), "cap_bce": bce.detach()}


def prefix_threshold(top_logprobs: torch.Tensor, budget: int) -> float:
    """The score of the B-th best prefix of a block: (D, R) per-depth top log-probabilities, sorted
    descending -> the smallest prefix score in the best-first tree of ``budget`` nodes (decode's
    DDTree builds exactly that tree)."""
    tokens = torch.zeros_like(top_logprobs, dtype=torch.long)  # the tree's shape needs no tokens
    return min(build_tree(top_logprobs, tokens, budget).scores)


@register("loss", "tree_coverage")
class TreeCoverage(DraftLoss):
    """A loss whose optimum maximises the acceptance of a DDTree of budget B rather than of a chain
    (docs/method.md section 7).

    Teacher-forced, a DDTree of B nodes holds the label prefix y_1..y_d exactly when its score
    s_d = sum over i <= d of log q_i(y_i) is among the B best prefix scores: s_d >= tau_B, the B-th
    best. s_d falls with d, so the accepted depth is the count of depths with s_d >= tau_B. The loss
    replaces that count by a smooth one, -sum_d log sigmoid((s_d - tau_B) / temperature), with tau_B
    from the drafter's own distribution, detached; plus ``ce_weight`` x CE, which keeps every slot
    learning while the threshold moves.

    Args:
        budget: B, the DDTree budget to train for.
        temperature: the smoothing of the count (its limit at 0 is the accepted depth itself).
        ce_weight: weight of a plain CE term on every supervised slot.
    """

    def __init__(self, budget: int = 32, temperature: float = 1.0, ce_weight: float = 0.1):
        super().__init__()
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        self.budget = budget
        self.temperature = check_positive(temperature, "temperature")
        if not (ce_weight >= 0 and math.isfinite(ce_weight)):
            raise ValueError(f"ce_weight must be >= 0, got {ce_weight}")
        self.ce_weight = ce_weight

    def forward(self, batch):
        if batch.empty:
            return zero_loss(batch)

        def columns(logits, rows):  # per row: log q(label), then the top-R log-probabilities (detached)
            lp = torch.log_softmax(logits.float(), dim=-1)
            top = lp.detach().topk(min(self.budget, lp.shape[-1]), dim=-1).values
            return torch.cat([lp.gather(-1, batch.labels[rows, None]), top], dim=-1)

        cols = batch.per_row(columns)  # (M, 1 + R)
        sup = batch.supervised  # (b, N, K)
        label_lp = torch.zeros(sup.shape, dtype=cols.dtype, device=cols.device)
        label_lp[sup] = cols[:, 0]
        top = torch.zeros((*sup.shape, cols.shape[1] - 1), dtype=cols.dtype, device=cols.device)
        top[sup] = cols[:, 1:].detach()
        _, known = accepted_indicator(torch.ones_like(sup), sup)  # slots 1..d all supervised
        depth = known.sum(-1)  # (b, N) label prefix length of each block
        scores = label_lp.cumsum(-1)  # s_d at slot d (slot 0 contributes 0)
        tau = torch.zeros(depth.shape, dtype=cols.dtype, device=cols.device)
        for b, n in depth.nonzero().tolist():
            d = int(depth[b, n])
            tau[b, n] = prefix_threshold(top[b, n, 1 : d + 1].cpu(), self.budget)
        margin = (scores - tau[..., None]) / self.temperature  # (b, N, K)
        cover = -F.logsigmoid(margin[known])  # the smooth count's terms, known slots only
        ones = torch.ones_like(cover)
        coverage = batch.mean(cover, ones)
        ce = batch.mean(-cols[:, 0], torch.ones_like(cols[:, 0]))
        tree_depth = ((margin >= 0) & known).sum(-1)[depth > 0].float().mean()
        loss = coverage + self.ce_weight * ce
        return {"loss": loss, "coverage": coverage.detach(), "ce": ce.detach(), "tree_depth": tree_depth}


@register("loss", "dspark_confidence")
class DSparkConfidence(CAP):
    """A main loss plus a confidence head trained to predict each slot's acceptance in DSpark's form
    (arXiv 2607.05147): BCE to c* = 1 - 0.5 ||p_d - p_t||_1 = sum_v min(p_d, p_t), the probability
    that speculative sampling accepts the slot's draft, per supervised slot. The target distribution
    is the teacher's (a soft target source is needed); c* is computed without gradient.

    Args:
        main: the loss this one wraps (any ``loss`` component).
        weight: multiplier of the confidence BCE.
        detach_hidden: train the head on a detached hidden state, so the BCE never shapes the drafter.
    """

    needs_distribution = True

    def forward(self, batch):
        if self.head is None:
            raise RuntimeError("dspark_confidence: bind(hidden_size) was not called")
        out = self.main(batch)
        if batch.empty:
            return {**out, "loss": out["loss"] + self.head.weight.sum() * 0.0}
        with torch.no_grad():
            target = batch.per_row(lambda logits, rows: overlap(logits, batch.teacher(rows)))  # (M,)
        hidden = batch.hidden.detach() if self.detach_hidden else batch.hidden
        logit = self.head(hidden).squeeze(-1).float()  # (M,)
        bce = F.binary_cross_entropy_with_logits(logit, target.float(), reduction="none")
        bce = batch.mean(bce, torch.ones_like(bce))
        main = out.pop("loss")
        return {
            "loss": main + self.weight * bce,
            **out,
            "main": main.detach(),
            "confidence_bce": bce.detach(),
        }
