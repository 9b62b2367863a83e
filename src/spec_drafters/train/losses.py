"""Losses (component kind ``loss``) over the supervised block slots.

A loss sees only the M supervised (anchor, slot) pairs, flattened in (b, N, K) order, so the (M, V)
logits of unsupervised slots are never computed (:class:`SlotBatch`). It returns a dict with the
total under ``"loss"`` and its parts under other keys (logged as ``train/<part>``, ``val/<part>``).

- ``hard_ce``: cross-entropy to hard labels.
- ``soft_kl``: forward KL(target || drafter) at a temperature.
- ``ce_kl_blend``: CE + alpha * KL (the field reports' v3 and experiment-ddtree used alpha = 0.15).
- ``tv``, ``nla``, ``lk_hybrid``: the LK losses (arXiv 2602.23881), which target the acceptance rate
  alpha = sum_v min(p_v, q_v) itself: 1 - alpha, -log alpha, and a KL/TV blend moving to TV as alpha
  grows.
- ``mix``: a weighted sum of per-slot losses (0.1 CE + 0.9 TV), one head pass for all.

The objectives shaped by acceptance itself (``cap``, ``dspark_confidence``, ``tree_coverage``) are in
train/acceptance_losses.py.

Every per-slot term is weighted by w_k = exp(-(k - 1) / gamma) (or uniformly with gamma null), or by
another ``slot_weights`` component (D-PACE, train/weights.py), and normalised by the sum of the
weights (SpecForge; speculators divides by the count, a constant apart).
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
from spec_drafters.train.objective import coefficients_problem
from spec_drafters.train.weights import ExpDecay, SlotWeights


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
        if len(chunks) == 1 and (self._logits is not None or not _backward_follows(self.hidden)):
            return fn(self.logits, slice(None))
        if len(chunks) == 1:
            # Not kept on the batch: only the loss's own saved tensors outlive the forward, so the
            # (M, V) block is freed as soon as backward is done with it (docs/scale.md, "Memory options").
            logits = self.head(self.hidden)
            self._top = {None: logits.detach().argmax(-1)}
            return fn(logits, slice(None))

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
            if self._top is not None and None in self._top:
                return self._top[None]
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


def _backward_follows(hidden: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and hidden.requires_grad


def slot_weights(slots: torch.Tensor, gamma: float | None) -> torch.Tensor:
    """w_k = exp(-(k - 1) / gamma) for slot k >= 1, or uniform with ``gamma=None`` (weights.ExpDecay)."""
    return ExpDecay(gamma)(slots, None, None)


def _check_gamma(gamma: float | None) -> float | None:
    if gamma is not None and not (gamma > 0 and math.isfinite(gamma)):
        raise ValueError(f"gamma must be a positive number or null, got {gamma}")
    return gamma


def check_positive(value: float, field: str) -> float:
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


def zero_loss(batch: SlotBatch) -> dict[str, torch.Tensor]:
    # A batch without supervised slots contributes nothing, but keeps the graph connected.
    return {"loss": batch.hidden.sum() * 0.0}


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, reduction="none")  # (C,)


class SlotLoss(DraftLoss):
    """A weighted mean over the supervised slots of a per-slot value.

    Subclasses give :meth:`row_terms`: per row, the loss value and any parts to log (``parts``). The
    head is applied once per chunk of rows for all of them, and for the weights' cross-entropy when
    the weights need it (D-PACE).
    """

    parts: tuple[str, ...] = ()

    def __init__(self, gamma: float | None = 7.0, weights: SlotWeights | None = None):
        super().__init__()
        self.gamma = _check_gamma(gamma)
        self.weights = weights
        self.weighting = weights if weights is not None else ExpDecay(gamma)

    def row_terms(self, logits: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor | None):
        """(C, V) drafter logits, (C,) labels, (C, V) target logits or None -> (C, 1 + len(parts))."""
        raise NotImplementedError

    def forward(self, batch):
        if batch.empty:
            return zero_loss(batch)
        need_ce = self.weighting.needs_ce

        def columns(logits, rows):
            labels = batch.labels[rows]
            teacher = batch.teacher(rows) if self.needs_distribution else None
            cols = self.row_terms(logits, labels, teacher)
            return torch.cat([cols, _ce(logits, labels)[:, None]], dim=-1) if need_ce else cols

        terms = batch.per_row(columns)  # (M, 1 + parts [+ ce])
        w = self.weighting(batch.slots, batch.supervised, terms[:, -1].detach() if need_ce else None)
        out = {"loss": batch.mean(terms[:, 0], w)}
        for i, name in enumerate(self.parts, start=1):
            out[name] = batch.mean(terms[:, i], w).detach()
        return out


def _probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.float(), dim=-1)


def overlap(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """alpha = sum_v min(p_v, q_v) per row, the acceptance rate of speculative sampling -> (C,)."""
    return torch.minimum(_probs(student_logits), _probs(teacher_logits)).sum(-1)


@register("loss", "hard_ce")
class HardCE(SlotLoss):
    """Cross-entropy to hard labels, weighted per slot.

    Args:
        gamma: decay of the slot weights exp(-(k-1)/gamma); null for uniform weights.
        weights: other per-slot weights (``slot_weights`` kind, e.g. DPACE); null: the gamma decay.
    """

    def row_terms(self, logits, labels, teacher):
        return _ce(logits, labels)[:, None]


@register("loss", "soft_kl")
class SoftKL(SlotLoss):
    """Forward KL from the target's distribution to the drafter's, weighted per slot.

    Args:
        gamma: decay of the slot weights; null for uniform weights.
        temperature: softens both distributions; the loss is scaled by temperature^2.
        weights: other per-slot weights; null: the gamma decay.
    """

    needs_distribution = True

    def __init__(
        self, gamma: float | None = 7.0, temperature: float = 1.0, weights: SlotWeights | None = None
    ):
        super().__init__(gamma, weights)
        self.temperature = check_positive(temperature, "temperature")

    def row_terms(self, logits, labels, teacher):
        return forward_kl(logits, teacher, self.temperature)[:, None]


@register("loss", "ce_kl_blend")
class CEKLBlend(SlotLoss):
    """CE to the hard labels + alpha * KL to the target distribution, both weighted per slot.

    Args:
        gamma: decay of the slot weights; null for uniform weights.
        alpha: weight of the KL term (the seeds used 0.15).
        temperature: temperature of the KL term.
        weights: other per-slot weights; null: the gamma decay.
    """

    needs_distribution = True
    parts = ("ce", "kl")

    def __init__(
        self,
        gamma: float | None = 7.0,
        alpha: float = 0.15,
        temperature: float = 1.0,
        weights: SlotWeights | None = None,
    ):
        super().__init__(gamma, weights)
        if not (alpha >= 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.alpha = alpha
        self.temperature = check_positive(temperature, "temperature")

    def row_terms(self, logits, labels, teacher):
        ce, kl = _ce(logits, labels), forward_kl(logits, teacher, self.temperature)
        return torch.stack([ce + self.alpha * kl, ce, kl], dim=-1)


@register("loss", "tv")
class TotalVariation(SlotLoss):
    """Total variation to the target distribution, 1 - alpha with alpha = sum_v min(p_v, q_v) the
    acceptance rate (LK losses, arXiv 2602.23881): the acceptance itself, whose gradient is weak while
    the overlap is small.

    Args:
        gamma: decay of the slot weights; null for uniform weights.
        weights: other per-slot weights; null: the gamma decay.
    """

    needs_distribution = True

    def row_terms(self, logits, labels, teacher):
        return (1 - overlap(logits, teacher))[:, None]


@register("loss", "nla")
class NegativeLogAcceptance(SlotLoss):
    """-log(alpha) (LK losses, arXiv 2602.23881): TV's optimum with a 1/alpha larger gradient, so it
    also trains from a cold start.

    Args:
        gamma: decay of the slot weights; null for uniform weights.
        weights: other per-slot weights; null: the gamma decay.
    """

    needs_distribution = True

    def row_terms(self, logits, labels, teacher):
        return -torch.log(overlap(logits, teacher).clamp(min=1e-12))[:, None]


@register("loss", "lk_hybrid")
class LKHybrid(SlotLoss):
    """lambda * KL(p || q) + (1 - lambda) * TV with lambda = exp(-3 alpha), detached (LK losses, arXiv
    2602.23881): KL while the overlap is small, the acceptance itself once it grows.

    Args:
        gamma: decay of the slot weights; null for uniform weights.
        weights: other per-slot weights; null: the gamma decay.
    """

    needs_distribution = True
    parts = ("kl", "tv", "lambda")

    def row_terms(self, logits, labels, teacher):
        alpha = overlap(logits, teacher)
        lam = torch.exp(-3 * alpha.detach())
        kl, tv = forward_kl(logits, teacher, 1.0), 1 - alpha
        return torch.stack([lam * kl + (1 - lam) * tv, kl, tv, lam], dim=-1)


@register("loss", "mix")
class LossMix(SlotLoss):
    """A weighted sum of per-slot losses, e.g. 0.1 CE + 0.9 TV, from one head pass per chunk; each
    term is logged before its coefficient as ``<its registry name>`` (or ``<name>_<i>`` when repeated).

    The mix's own slot weights apply to every term (the terms' gamma and weights are not used).

    Args:
        losses: the terms (any per-slot ``loss`` component: hard_ce, soft_kl, tv, nla, lk_hybrid, ...).
        coefficients: one per term, used as given (not normalised): finite, >= 0, one at least > 0
            (a 0 switches its term off).
        gamma: decay of the slot weights; null for uniform weights.
        weights: other per-slot weights; null: the gamma decay.
    """

    def __init__(
        self,
        losses: list[DraftLoss],
        coefficients: list[float],
        gamma: float | None = 7.0,
        weights: SlotWeights | None = None,
    ):
        super().__init__(gamma, weights)
        if not losses or len(losses) != len(coefficients):
            raise ValueError(
                f"losses and coefficients must pair up, got {len(losses)} and {len(coefficients)}"
            )
        bad = [type(x).__name__ for x in losses if not isinstance(x, SlotLoss) or isinstance(x, LossMix)]
        if bad:
            raise ValueError(f"losses must be per-slot losses (not cap or mix), got {', '.join(bad)}")
        problem = coefficients_problem(coefficients)
        if problem:
            raise ValueError(problem)
        self.losses = nn.ModuleList(losses)
        self.coefficients = list(coefficients)
        names = [getattr(x, "registry_name", type(x).__name__.lower()) for x in losses]
        self.parts = tuple(n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names))

    @property
    def needs_distribution(self) -> bool:  # type: ignore[override]
        return any(x.needs_distribution for x in self.losses)

    def row_terms(self, logits, labels, teacher):
        each = [x.row_terms(logits, labels, teacher)[:, 0] for x in self.losses]  # (C,) per term
        total = sum(c * v for c, v in zip(self.coefficients, each, strict=True))
        return torch.stack([total, *each], dim=-1)
