"""Losses (component kind ``loss``) over the supervised block slots.

A loss sees only the M supervised (anchor, slot) pairs, flattened in (b, N, K) order, so the (M, V)
logits of unsupervised slots are never computed (:class:`SlotBatch`). It returns a dict with the
total under ``"loss"`` and its parts under other keys (logged as ``train/<part>``, ``val/<part>``).

- ``hard_ce``: cross-entropy to hard labels.
- ``soft_kl``: forward KL(target || drafter) at a temperature.
- ``ce_kl_blend``: CE + alpha * KL (the seeds' v3 and experiment-ddtree used alpha = 0.15).
- ``cap``: wraps any loss and adds CAP, an auxiliary confidence head (docs/method.md section 5).

Every per-slot term is weighted by w_k = exp(-(k - 1) / gamma) (or uniformly with gamma null) and
normalised by the sum of the weights (SpecForge; speculators divides by the count, a constant apart).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from spec_drafters.registry import register


@dataclass
class SlotBatch:
    """The M supervised (anchor, slot) pairs of one step.

    Losses read per-row terms through :meth:`per_row`, which applies the frozen head in chunks of
    ``chunk_rows`` rows under activation checkpointing: the (M, V) logits then never exist at once,
    in forward or backward (issue 6/7: M = N*K can reach 32k, V 248k). With ``chunk_rows=None`` the
    whole (M, V) block is computed once and kept (``logits``).
    """

    hidden: torch.Tensor  # (M, H) drafter final hidden state (after its norm)
    labels: torch.Tensor  # (M,) hard labels from the target source
    slots: torch.Tensor  # (M,) slot k in 1..K-1
    supervised: torch.Tensor  # (b, N, K) bool: where the M rows sit, row-major
    head: Callable[[torch.Tensor], torch.Tensor]  # the target's frozen lm_head, (.., H) -> (.., V)
    teacher: Callable[[slice], torch.Tensor] | None = None  # rows -> (C, V) target logits (soft losses)
    chunk_rows: int | None = None
    denominator: Callable[[torch.Tensor], torch.Tensor] | None = None
    """Maps this rank's weight sum to the normaliser (data parallel: the mean over ranks, so that the
    averaged gradients equal one process's on the whole batch). None: the local sum."""

    @classmethod
    def from_logits(cls, logits, labels, slots, hidden, supervised, target_logits=None) -> SlotBatch:
        """A batch over given (M, V) logits (tests, tools): the head is the identity."""
        teacher = None if target_logits is None else (lambda rows: target_logits[rows])
        return cls(hidden, labels, slots, supervised, head=lambda x: x, teacher=teacher, _logits=logits)

    _logits: torch.Tensor | None = None
    _top: dict | None = None  # chunk start -> (C,) argmax, noted while per_row computes the logits

    @property
    def empty(self) -> bool:
        return self.labels.numel() == 0

    @property
    def logits(self) -> torch.Tensor:
        """(M, V), all at once: for validation metrics; training losses use :meth:`per_row`."""
        if self._logits is None:
            self._logits = self.head(self.hidden)
        return self._logits

    def _chunks(self) -> list[slice]:
        m = self.labels.shape[0]
        if self.chunk_rows is None or self._logits is not None or m <= self.chunk_rows:
            return [slice(None)]
        return [slice(i, min(i + self.chunk_rows, m)) for i in range(0, m, self.chunk_rows)]

    def per_row(self, fn: Callable[[torch.Tensor, slice], torch.Tensor]) -> torch.Tensor:
        """(M,) values of ``fn(logits (C, V), rows)`` over row chunks, the head recomputed in backward."""
        chunks = self._chunks()
        if len(chunks) == 1:
            return fn(self.logits, slice(None))

        self._top = {}

        def piece(h: torch.Tensor, rows: slice) -> torch.Tensor:
            logits = self.head(h)
            self._top[rows.start] = logits.detach().argmax(-1)  # argmax() then needs no head pass
            return fn(logits, rows)

        return torch.cat(
            [
                torch.utils.checkpoint.checkpoint(piece, self.hidden[rows], rows, use_reentrant=False)
                for rows in chunks
            ]
        )

    @torch.no_grad()
    def argmax(self) -> torch.Tensor:
        """(M,) the drafter's top token per row, chunk by chunk."""
        chunks = self._chunks()
        if len(chunks) == 1:
            return self.logits.argmax(-1)
        top = self._top if self._top is not None else {}
        for rows in chunks:
            if rows.start not in top:
                top[rows.start] = self.head(self.hidden[rows]).argmax(-1)
        self._top = top
        return torch.cat([top[rows.start] for rows in chunks])

    def mean(self, values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """sum(w * v) / the normaliser of sum(w) (see ``denominator``)."""
        total = weights.sum()
        if self.denominator is not None:
            total = self.denominator(total.detach())
        return (weights * values).sum() / total


def slot_weights(slots: torch.Tensor, gamma: float | None) -> torch.Tensor:
    """w_k = exp(-(k - 1) / gamma) for slot k >= 1 (DFlash paper; gamma 7 for K=16, 4 for K=8).

    ``gamma=None`` weighs every slot equally. Slot 0, the anchor, is never trained and must not appear.
    """
    if bool((slots < 1).any()):
        raise ValueError("slot 0 (the anchor) is never trained; it must not reach the loss")
    if gamma is None:
        return torch.ones_like(slots, dtype=torch.float32)
    return torch.exp(-(slots.float() - 1.0) / gamma)


def _check_gamma(gamma: float | None) -> float | None:
    if gamma is not None and not (gamma > 0 and math.isfinite(gamma)):
        raise ValueError(f"gamma must be a positive number or null, got {gamma}")
    return gamma


def _check_positive(value: float, field: str) -> float:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{field} must be a positive number, got {value}")
    return value


def forward_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float):
    """KL(p_teacher || p_student) per row at a temperature, times T^2 (Hinton et al.) -> (M,)."""
    t = temperature
    log_q = F.log_softmax(student_logits.float() / t, dim=-1)
    log_p = F.log_softmax(teacher_logits.float() / t, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1) * t * t


class DraftLoss(nn.Module):
    """Base class of the ``loss`` kind."""

    component_kind = "loss"
    needs_distribution = False
    """True when the loss reads ``SlotBatch.teacher`` (the target's logits: a soft target)."""

    def bind(self, hidden_size: int) -> None:
        """Called once with the drafter's width, before training: create auxiliary heads here."""

    def forward(self, batch: SlotBatch) -> dict[str, torch.Tensor]:
        raise NotImplementedError


def _zero(batch: SlotBatch) -> dict[str, torch.Tensor]:
    # A batch without supervised slots contributes nothing, but keeps the graph connected.
    return {"loss": batch.hidden.sum() * 0.0}


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, reduction="none")  # (C,)


@register("loss", "hard_ce")
class HardCE(DraftLoss):
    """Cross-entropy to hard labels, weighted per slot.

    Args:
        gamma: decay of the slot weights exp(-(k-1)/gamma); null for uniform weights.
    """

    def __init__(self, gamma: float | None = 7.0):
        super().__init__()
        self.gamma = _check_gamma(gamma)

    def forward(self, batch):
        if batch.empty:
            return _zero(batch)
        ce = batch.per_row(lambda logits, rows: _ce(logits, batch.labels[rows]))  # (M,)
        return {"loss": batch.mean(ce, slot_weights(batch.slots, self.gamma))}


@register("loss", "soft_kl")
class SoftKL(DraftLoss):
    """Forward KL from the target's distribution to the drafter's, weighted per slot.

    Args:
        gamma: decay of the slot weights; null for uniform weights.
        temperature: softens both distributions; the loss is scaled by temperature^2.
    """

    needs_distribution = True

    def __init__(self, gamma: float | None = 7.0, temperature: float = 1.0):
        super().__init__()
        self.gamma = _check_gamma(gamma)
        self.temperature = _check_positive(temperature, "temperature")

    def forward(self, batch):
        if batch.empty:
            return _zero(batch)
        t = self.temperature
        kl = batch.per_row(lambda logits, rows: forward_kl(logits, batch.teacher(rows), t))  # (M,)
        return {"loss": batch.mean(kl, slot_weights(batch.slots, self.gamma))}


@register("loss", "ce_kl_blend")
class CEKLBlend(DraftLoss):
    """CE to the hard labels + alpha * KL to the target distribution, both weighted per slot.

    Args:
        gamma: decay of the slot weights; null for uniform weights.
        alpha: weight of the KL term (the seeds used 0.15).
        temperature: temperature of the KL term.
    """

    needs_distribution = True

    def __init__(self, gamma: float | None = 7.0, alpha: float = 0.15, temperature: float = 1.0):
        super().__init__()
        self.gamma = _check_gamma(gamma)
        if not (alpha >= 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.alpha = alpha
        self.temperature = _check_positive(temperature, "temperature")

    def forward(self, batch):
        if batch.empty:
            return _zero(batch)
        w, t = slot_weights(batch.slots, self.gamma), self.temperature

        def both(logits, rows):  # one head application per chunk for both terms
            ce = _ce(logits, batch.labels[rows])
            return torch.stack([ce, forward_kl(logits, batch.teacher(rows), t)], dim=-1)  # (C, 2)

        terms = batch.per_row(both)  # (M, 2)
        ce, kl = batch.mean(terms[:, 0], w), batch.mean(terms[:, 1], w)
        return {"loss": ce + self.alpha * kl, "ce": ce.detach(), "kl": kl.detach()}


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
        self.weight = _check_positive(weight, "weight")
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
