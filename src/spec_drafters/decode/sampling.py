"""Sampling at temperature > 0: the target's distribution, and the exact acceptance rules for drafts.

Speculative decoding at temperature > 0 is lossless in distribution: the committed tokens are
distributed exactly as plain sampling from the target would make them (with the same temperature and
top-p), whatever the drafts. Two rules are used (docs/sampling.md):

- **chain rule** (Leviathan et al., arXiv:2211.17192; Chen et al., arXiv:2302.01318): each draft x_k
  was drawn from the drafter's q_k; it is accepted with probability min(1, p_k(x_k) / q_k(x_k)),
  where p_k is the target's distribution after the accepted prefix; on the first rejection the next
  token is drawn from the residual max(0, p_k - q_k) (normalised) and the round ends; when every
  draft is accepted the next token is drawn from the target after the last one.
- **tree rule** for a tree whose nodes were not drawn from q (DDTree's top-B prefixes, a prompt-lookup
  copy): at the root draw x ~ p(. | root); when a child of the node has token x, move to it and draw
  again; otherwise x is the round's next token. Every committed token is then a draw from the target
  given exactly the committed prefix (the "naive" rule of SpecInfer, arXiv:2305.09781, section 4.2).

Greedy decoding (temperature 0) never comes here: its rule is acceptance.py's walk, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How the target's next token is chosen: ``temperature`` 0 is greedy (argmax); above 0 the target's
    logits are divided by it, then the smallest set of tokens whose probability reaches ``top_p`` is
    kept (1: all). ``seed`` seeds each decode's random generator, so one prompt with one seed always
    gives the same output."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature == 0 and self.top_p != 1:
            raise ValueError(f"top_p {self.top_p} needs temperature > 0 (temperature 0 is greedy)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def label(self) -> str:
        """The suffix that names a sampled decoder in metrics ('' when greedy)."""
        if self.greedy:
            return ""
        return f"_t{self.temperature:g}" + (f"_p{self.top_p:g}" if self.top_p < 1 else "")

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution (float64, same shape) a token is drawn from, given logits (..., V)."""
        if self.greedy:
            raise ValueError("greedy decoding has no sampling distribution")
        p = torch.softmax(logits.double() / self.temperature, dim=-1)
        if self.top_p >= 1:
            return p
        sorted_p, order = p.sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < self.top_p  # the smallest set reaching top_p
        kept = torch.zeros_like(p).scatter(-1, order, sorted_p * keep)
        return kept / kept.sum(-1, keepdim=True)

    def generator(self, device) -> torch.Generator:
        """A fresh generator for one decode, seeded with ``seed``."""
        return torch.Generator(device=device).manual_seed(self.seed)


GREEDY = Sampling()


def draw(p: torch.Tensor, rng: torch.Generator) -> int:
    """One token from the distribution ``p`` (V,)."""
    return int(torch.multinomial(p, 1, generator=rng))


def uniform(rng: torch.Generator) -> float:
    return float(torch.rand((), generator=rng, dtype=torch.float64, device=rng.device))


def chain_accept(
    drafts: list[int],
    draft_probs: torch.Tensor,
    target_probs,
    rng: torch.Generator,
    broken: bool = False,
) -> tuple[int, int]:
    """The chain rule: (accepted drafts, next token).

    ``drafts[k]`` was drawn from ``draft_probs[k]`` (D, V); ``target_probs(i)`` is the target's
    distribution after the bonus and the first i drafts (i = 0..D). ``broken`` redraws a rejected
    token from the target's distribution instead of the residual: wrong on purpose, for the test that
    must see it fail (tests/test_sampling.py)."""
    for k, x in enumerate(drafts):
        p, q = target_probs(k), draft_probs[k]
        if uniform(rng) < min(1.0, float(p[x] / q[x])):
            continue
        residual = p if broken else torch.clamp(p - q, min=0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: a rejection had probability ~0
            residual = p
        return k, draw(residual / residual.sum(), rng)
    return len(drafts), draw(target_probs(len(drafts)), rng)


def tree_accept(
    tokens: list[int], parents: list[int], target_probs, rng: torch.Generator
) -> tuple[list[int], int]:
    """The tree rule: (accepted nodes, root's child first; next token).

    ``tokens``/``parents``: the drafted nodes (parents -1 for the root's children, parents before
    children); ``target_probs(i)`` is the target's distribution after node i (-1: the root)."""
    from spec_drafters.decode.acceptance import child_index

    children = child_index(tokens, parents)
    path, node = [], -1
    while True:
        x = draw(target_probs(node), rng)
        nxt = children.get(node, {}).get(x)
        if nxt is None:
            return path, x
        path.append(nxt)
        node = nxt


def chain_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The chance the chain rule accepts a draft drawn from ``q`` where the target's distribution is
    ``p``: sum_x min(p(x), q(x)) over the last dimension (Leviathan et al., arXiv:2211.17192, section
    3.3, their beta). ``q`` may cover fewer tokens than ``p`` (a draft vocabulary): give ``p``
    restricted to the same ids, not renormalised (q is 0 elsewhere)."""
    return torch.minimum(p, q).sum(-1)


def chain_reach(alpha: torch.Tensor) -> torch.Tensor:
    """Per-slot acceptance chances (..., D) -> (..., D): the chance the chain accepts at least d drafts,
    prod_{j <= d} alpha_j, when each slot's draft is drawn on its own (a block drafter's slots are) and
    each slot's target distribution is fixed (teacher-forced). Its sum is the expected accepted drafts."""
    return alpha.cumprod(-1)
