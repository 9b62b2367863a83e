"""Acceptance metrics (torchmetrics, so they reduce correctly across processes).

tau, the acceptance length, is tokens committed per target forward = accepted drafts + 1. Two means
are reported and labelled, because they differ (vLLM #42508): the mean over sequences of per-sequence
means (what z-lab and the DDTree paper report) and the pooled mean over all blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torchmetrics import Metric

from spec_drafters.decode.verifiers import Verifier


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


class AcceptanceCurve(Metric):
    """Per-depth acceptance: the fraction of blocks whose accepted drafts reach depth d, d = 1..D (at
    temperature > 0 the mean chance of reaching it)."""

    full_state_update = False

    def __init__(self, max_depth: int):
        super().__init__()
        self.add_state("reach", torch.zeros(max_depth, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("blocks", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, reach: torch.Tensor) -> None:
        """reach: (A, D) per block, 1/0 (or the chance) that its accepted drafts reach depth d."""
        self.reach += reach.double().sum(0)
        self.blocks += reach.shape[0]

    def compute(self) -> torch.Tensor:
        return self.reach / self.blocks.clamp(min=1)  # (D,)


def reach_of(accepted: torch.Tensor, depth: int) -> torch.Tensor:
    """Accepted drafts per block (A,) -> (A, D) 1.0 where they reach depth d = 1..D."""
    return (accepted[:, None] >= torch.arange(1, depth + 1, device=accepted.device)).double()


class Calibration(Metric):
    """The drafter's stated probability against the empirical hit rate, per (depth, rank).

    For block slot d and rank r, the mean softmax probability of the drafter's r-th most likely token
    and how often that token is the label. DDTree scores prefixes by products of these marginals, so
    a miscalibrated (depth, rank) cell misranks tree nodes.
    """

    full_state_update = False

    def __init__(self, max_depth: int, ranks: int):
        super().__init__()
        shape = (max_depth, ranks)
        self.add_state("prob", torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("hits", torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(max_depth, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, draft_logits: torch.Tensor, labels: torch.Tensor) -> None:
        """draft_logits (A, D, V), labels (A, D): full blocks."""
        top = torch.softmax(draft_logits.float(), dim=-1).topk(self.prob.shape[1], dim=-1)  # (A, D, R)
        self.prob += top.values.sum(0).double()
        self.hits += (top.indices == labels[..., None]).sum(0).double()
        self.count += labels.shape[0]

    def compute(self) -> dict[str, torch.Tensor]:
        n = self.count.clamp(min=1)[:, None]
        stated, empirical = self.prob / n, self.hits / n  # (D, R)
        # Expected calibration error over the cells, weighted by their stated mass.
        ece = ((stated - empirical).abs() * stated).sum() / stated.sum().clamp(min=1e-12)
        return {"stated": stated, "empirical": empirical, "ece": ece}


class OfflineAcceptance(nn.Module):
    """One validation's teacher-forced numbers: slot accuracy, tau and the acceptance curve of each
    verifier, and the calibration table.

    Keys: ``acc_slot<d>``, ``acc``, ``tau``/``tau_pooled``/``accept_ge<d>`` for the greedy chain and
    the same with ``_<label>`` for every other verifier (``_ddtree_b32``), ``calibration_ece``.
    """

    def __init__(self, block_size: int, verifiers: dict[str, Verifier]):
        super().__init__()
        self.verifiers = verifiers  # label -> verifier; "chain" is the greedy chain, logged unsuffixed
        self.depth = depth = block_size - 1
        self.acc = SlotAccuracy(block_size)
        # Lists in the order of ``verifiers`` (a label may hold a '.', which a ModuleDict key may not).
        self.tau = nn.ModuleList([AcceptanceLength() for _ in verifiers])
        self.curve = nn.ModuleList([AcceptanceCurve(depth) for _ in verifiers])
        self.calibration = Calibration(depth, ranks=4)

    @property
    def needs_distribution(self) -> bool:
        """Whether a verifier samples: its offline tau reads the target's distribution at each slot."""
        return any(not v.sampling.greedy for v in self.verifiers.values())

    @classmethod
    def for_verifiers(cls, block_size: int, verifier: Verifier, extra: list[Verifier] | None):
        """The greedy chain always (val/tau), then the configured verifier and the extra ones, each
        named by one rule, its ``label()`` (val/tau_ddtree_b32, as decode/* names them; before issue 34
        the configured one was val/tau_ddtree: docs/verifiers.md, "Metric names"). A sampling chain is
        measured at its temperature (val/tau_greedy_chain_t0.7: the expected accepted length,
        docs/sampling.md); a sampling tree has no offline tau: as the configured verifier it is
        measured greedy (under its greedy label), and as an extra one it is refused."""
        from spec_drafters.decode.verifiers import GreedyChain

        verifiers: dict[str, Verifier] = {"chain": GreedyChain()}
        if isinstance(verifier, GreedyChain):  # (the default is a lazy subclass instance)
            if getattr(verifier, "max_depth", None) is not None or not verifier.sampling.greedy:
                verifiers[verifier.label()] = verifier  # a cut or a sampling chain, beside the full one
        else:
            measured = verifier if verifier.sampling.greedy else _greedy_twin(verifier)
            verifiers[measured.label()] = measured
        for v in extra or []:
            if not v.sampling.greedy and not isinstance(v, GreedyChain):
                raise ValueError(
                    f"{v.label()} samples, and a sampling tree has no offline tau "
                    "(only a chain's is defined, docs/sampling.md); measure it with real decoding "
                    "(the SpeculativeDecodingEval callback) or give it temperature 0"
                )
            label = v.label()
            if label in verifiers and _same(verifiers[label], v):
                continue  # the configured verifier listed again: measured once
            verifiers[f"{label}_{len(verifiers)}" if label in verifiers else label] = v
        return cls(block_size, verifiers)

    def update(
        self,
        per_block: torch.Tensor,
        labels: torch.Tensor,
        anchor_ok: torch.Tensor,
        target_logits: Callable[[slice], torch.Tensor] | None = None,
        draft_ids: torch.Tensor | None = None,
    ) -> None:
        """per_block (A, K-1, V) drafter logits of the A valid anchors (full blocks, in order of
        ``anchor_ok`` (b, N)), labels (A, K-1). For a sampling chain: ``target_logits(blocks)`` the
        target's logits (a, K-1, V_target) of a slice of the A blocks, and the draft vocabulary's
        target ids when the drafter has one."""
        everywhere = torch.ones_like(labels, dtype=torch.bool)
        self.acc.update(per_block.argmax(-1) == labels, everywhere)
        for i, (label, verifier) in enumerate(self.verifiers.items()):
            if verifier.sampling.greedy:
                accepted = verifier.offline_accepted(per_block, labels, everywhere)  # (A,)
                reach = reach_of(accepted, self.depth)
            else:
                if target_logits is None:
                    raise ValueError(f"{label}: a sampling chain's offline tau needs the target's logits")
                reach = sampled_chain_reach(verifier, per_block, target_logits, draft_ids)
            per_anchor = torch.zeros(anchor_ok.shape, dtype=torch.float64, device=labels.device)
            per_anchor[anchor_ok] = reach.sum(1).to(per_anchor.device)
            self.tau[i].update(per_anchor, anchor_ok)
            self.curve[i].update(reach)
        self.calibration.update(per_block, labels)

    def compute(self) -> tuple[dict[str, float], dict[str, list[float]], dict]:
        """-> (metrics, per-verifier acceptance curves, calibration table); then resets."""
        acc = self.acc.compute().tolist()
        metrics = {f"acc_slot{i}": a for i, a in enumerate(acc, start=1)}
        metrics["acc"] = sum(acc) / len(acc)
        curves = {}
        for i, label in enumerate(self.verifiers):
            suffix = "" if label == "chain" else f"_{label}"
            metrics.update({f"{k}{suffix}": v.item() for k, v in self.tau[i].compute().items()})
            curves[label] = self.curve[i].compute().tolist()
            metrics.update({f"accept_ge{d}{suffix}": f for d, f in enumerate(curves[label], start=1)})
        cal = self.calibration.compute()
        metrics["calibration_ece"] = cal["ece"].item()
        table = {
            "rows": "block slot (depth) 1..K-1",
            "columns": "drafter rank 1..4",
            "stated": cal["stated"].tolist(),
            "empirical": cal["empirical"].tolist(),
            "ece": cal["ece"].item(),
        }
        for metric in (self.acc, *self.tau, *self.curve, self.calibration):
            metric.reset()
        return metrics, curves, table


def _same(a: Verifier, b: Verifier) -> bool:
    """Two verifiers that accept alike: the same class and settings."""
    from spec_drafters.registry import as_config

    return as_config(a) == as_config(b)


def _greedy_twin(verifier: Verifier) -> Verifier:
    """The same verifier at temperature 0 (a sampling tree's offline stand-in)."""
    import copy

    from spec_drafters.decode.sampling import GREEDY

    twin = copy.copy(verifier)
    twin.sampling = GREEDY
    return twin


def sampled_chain_reach(
    chain: Verifier,
    per_block: torch.Tensor,
    target_logits: Callable[[slice], torch.Tensor],
    draft_ids: torch.Tensor | None,
    blocks_at_once: int = 16,
) -> torch.Tensor:
    """(A, K-1) the chance a sampling chain's accepted drafts reach each depth, teacher-forced: each
    slot's draft drawn from the drafter's distribution at the chain's temperature and top_p, accepted
    with chance sum_x min(p, q) against the target's distribution there (decode/sampling.py)."""
    from spec_drafters.decode.sampling import chain_acceptance, chain_reach

    sampling, depth = chain.sampling, per_block.shape[1]
    cut = getattr(chain, "max_depth", None) or depth
    out = torch.zeros(per_block.shape[:2], dtype=torch.float64, device=per_block.device)
    for start in range(0, per_block.shape[0], blocks_at_once):
        sel = slice(start, start + blocks_at_once)
        p = sampling.probs(target_logits(sel)[:, :cut])  # (a, cut, V): top_p over the whole vocabulary
        if draft_ids is not None:
            p = p.index_select(-1, draft_ids.to(p.device))
        q = sampling.probs(per_block[sel, :cut])
        out[sel, :cut] = chain_reach(chain_acceptance(p, q.to(p.device)))
    return out
