"""Verifiers (component kind ``verifier``): the acceptance rule for drafts.

Each verifier works offline (teacher-forced: the labels are what the target would have said) and in
real decoding, where it turns one drafter pass into a draft tree (``propose``) that the target checks
in one forward (generate.py). The greedy chain is the tree whose nodes each have one child.

Every verifier decodes greedily by default; ``temperature`` > 0 (with ``top_p`` and ``seed``) makes it
sample, losslessly in distribution (decode/sampling.py, docs/sampling.md): the chain then draws its
drafts from the drafter's distribution and verifies them with the speculative-sampling rule; trees
keep their drafter-ranked nodes and follow the target's own draws through them.
"""

from __future__ import annotations

import torch

from spec_drafters.decode.acceptance import accepted_depth
from spec_drafters.decode.lookup import graft, lookup_continuation
from spec_drafters.decode.sampling import GREEDY, Sampling
from spec_drafters.model.tree import DraftTree, build_tree
from spec_drafters.registry import name_of, register


class Verifier:
    """Base class of the ``verifier`` kind."""

    component_kind = "verifier"
    sampling: Sampling = GREEDY  # how the target's tokens are chosen in real decoding

    def _sample_with(self, temperature: float, top_p: float, seed: int) -> None:
        self.sampling = Sampling(temperature, top_p, seed)

    def offline_accepted(
        self, draft_logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Accepted drafts per block, teacher-forced: logits (B, K-1, V), labels/valid (B, K-1) -> (B,)."""
        raise NotImplementedError

    def propose(self, draft_logits: torch.Tensor, rng: torch.Generator | None = None) -> DraftTree:
        """The draft tree of one drafter pass, from its per-slot logits (D, V), D = K-1 or fewer.
        ``rng``: the decode's generator, when the verifier samples (real decoding at temperature > 0)."""
        raise NotImplementedError

    def with_context(self, tree: DraftTree, history: list[int], depth: int) -> DraftTree:
        """The round's tree once its tokens are target token ids (after a draft vocabulary's mapping):
        a verifier may add drafts read from ``history`` (the prompt and every committed token, the
        round's bonus token last), at most ``depth`` deep. By default the tree stays as proposed."""
        return tree

    def label(self) -> str:
        """How metrics and results name this verifier: its registry name, what sets its size and, when
        it samples, its temperature (and top_p)."""
        return name_of(self) + self.sampling.label()


@register("verifier", "greedy_chain")
class GreedyChain(Verifier):
    """The "vanilla streak": the longest prefix of drafts equal to the target's greedy tokens.

    Args:
        max_depth: verify at most this many drafts a round (default: all K-1 the drafter proposes).
            The target's verify forward costs more the more tokens it reads, on a CPU from the second
            token on (benchmarks/round_profile.py), while a drafter rarely gets a long streak right:
            slots it seldom wins cost more than they commit. Lossless at any depth.
        temperature: 0 (greedy) or, above 0, sample: each draft is drawn from the drafter's
            distribution at that temperature (and top_p) and verified by the speculative-sampling rule.
        top_p: nucleus sampling for the target and the drafts (1: off).
        seed: each decode's random seed.
    """

    def __init__(
        self, max_depth: int | None = None, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0
    ):
        if max_depth is not None and max_depth < 1:
            raise ValueError(f"max_depth must be >= 1 (or None for every slot), got {max_depth}")
        self.max_depth = max_depth
        self._sample_with(temperature, top_p, seed)

    def label(self) -> str:
        return name_of(self) + (f"_d{self.max_depth}" if self.max_depth else "") + self.sampling.label()

    def offline_accepted(self, draft_logits, labels, valid):
        # The tree walk on a chain, batched: the longest prefix of slots whose draft is the label.
        hit = (draft_logits.argmax(-1) == labels) & valid  # (B, K-1)
        return hit[:, : self.max_depth].long().cumprod(dim=1).sum(dim=1)  # (B,)

    def propose(self, draft_logits, rng=None):
        logits = draft_logits[: self.max_depth]
        d = logits.shape[0]
        chain = DraftTree([], list(range(-1, d - 1)), list(range(1, d + 1)), [0.0] * d)
        if self.sampling.greedy or rng is None or d == 0:  # offline metrics stay greedy
            chain.tokens = logits.argmax(-1).tolist()
        else:  # each slot's draft drawn from its own distribution (the slots are independent)
            chain.draft_probs = self.sampling.probs(logits)
            chain.tokens = torch.multinomial(chain.draft_probs, 1, generator=rng)[:, 0].tolist()
        return chain


def walk_tree(tree: DraftTree, targets: list[int]) -> int:
    """Accepted depth of a tree when the target's tokens by depth are ``targets`` (acceptance.py)."""
    return accepted_depth(tree.tokens, tree.parents, targets)


@register("verifier", "ddtree")
class DDTree(Verifier):
    """DDTree: the B most probable prefixes of the drafter's per-slot marginals, verified as a tree.

    Args:
        budget: B, the number of tree nodes besides the root (the bonus token).
        calibration: a drafter folder or calibration.json with slot temperatures
            (``spec-drafters calibrate``); prefixes are then ranked with calibrated probabilities.
        temperature: 0 (greedy) or, above 0, sample: the target draws its tokens and the walk follows
            them through the tree (decode/sampling.py, the tree rule); prefixes are ranked with the
            drafter's probabilities at that temperature.
        top_p: nucleus sampling for the target (1: off).
        seed: each decode's random seed.
    """

    def __init__(
        self,
        budget: int = 256,
        calibration: str | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ):
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        self.budget = budget
        self._sample_with(temperature, top_p, seed)
        self.calibration = calibration
        self._temperatures = None
        if calibration is not None:  # read now: a wrong file is refused before any decoding round
            from spec_drafters.decode.calibration import load

            self._temperatures = torch.tensor(load(calibration))

    def temperatures(self, depth: int) -> torch.Tensor | None:
        """The first ``depth`` slot temperatures (decode/calibration.py), or None without a calibration."""
        if self._temperatures is None:
            return None
        if depth > len(self._temperatures):
            raise ValueError(
                f"{self.calibration}: {len(self._temperatures)} slot temperatures for {depth} slots"
            )
        return self._temperatures[:depth]

    def label(self) -> str:
        return f"{name_of(self)}_b{self.budget}{self.sampling.label()}"

    def tree(self, draft_logits: torch.Tensor) -> DraftTree:
        """One block's tree from its drafter logits (K-1, V), ranked with calibrated probabilities when
        a calibration is given."""
        logits = draft_logits.float()
        temps = self.temperatures(logits.shape[0])
        if temps is not None:
            logits = logits / temps.to(logits.device)[:, None]
        if not self.sampling.greedy:  # the drafter's guess of what the target will draw
            logits = logits / self.sampling.temperature
        ranks = min(self.budget, logits.shape[-1])
        top = torch.log_softmax(logits, dim=-1).topk(ranks, dim=-1)  # (K-1, R)
        return build_tree(top.values.cpu(), top.indices.cpu(), self.budget)

    def offline_accepted(self, draft_logits, labels, valid):
        out = []
        for logits, lab, ok in zip(draft_logits, labels, valid, strict=True):
            known = int(ok.long().cumprod(0).sum())  # walk only through existing labels
            out.append(walk_tree(self.propose(logits[:known]), lab[:known].tolist()) if known else 0)
        return torch.tensor(out, device=labels.device)

    def propose(self, draft_logits, rng=None):
        return self.tree(draft_logits)


@register("verifier", "adaptive_ddtree")
class AdaptiveDDTree(DDTree):
    """DDTree with a budget chosen every round: the B that maximises expected committed tokens per unit
    of round cost, from the drafter's own probabilities and the machine's measured costs.

    The best-first tree of ``max_budget`` nodes lists its nodes by decreasing prefix probability, and
    a prefix of that order is itself the best tree of its size. Scoring a prefix by the product of its
    tokens' probabilities (the drafter's marginals, calibrated or not), a tree of B nodes is expected to
    commit 1 + (the sum of their prefix probabilities) tokens; the round costs ``cost.round(B + 1)``
    greedy steps. Verification is DDTree's, so decoding stays lossless whatever B is chosen.

    Args:
        cost_model: a JSON file written by ``spec-drafters cost-model`` on this machine and target.
        max_budget: the largest tree considered.
        calibration: slot temperatures (``spec-drafters calibrate``) for the ranking and the budget.
        temperature, top_p, seed: as for DDTree.
    """

    def __init__(
        self,
        cost_model: str,
        max_budget: int = 64,
        calibration: str | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ):
        super().__init__(max_budget, calibration, temperature, top_p, seed)
        self.cost_model = cost_model
        self.max_budget = max_budget
        from spec_drafters.decode.cost import RoundCost

        self.cost = RoundCost.load(cost_model)  # read now: a wrong file is refused before decoding

    def choose(self, tree: DraftTree) -> int:
        """The budget (1..len(tree)) that maximises expected committed tokens per round cost."""
        gains = torch.tensor(tree.scores, dtype=torch.float64).exp().cumsum(0) + 1  # B = 1..n
        costs = torch.tensor(
            [self.cost.round(b + 1) for b in range(1, len(tree.tokens) + 1)], dtype=torch.float64
        )
        return int((gains / costs).argmax()) + 1

    def propose(self, draft_logits, rng=None):
        tree = self.tree(draft_logits)
        if not tree.tokens:
            return tree
        b = self.choose(tree)
        return DraftTree(tree.tokens[:b], tree.parents[:b], tree.depths[:b], tree.scores[:b])


@register("verifier", "lookup_hybrid")
class LookupHybrid(Verifier):
    """Another verifier's draft tree plus one branch copied from the context (prompt lookup).

    Every round the tree of ``verifier`` gets the tokens that followed the most recent earlier
    occurrence of the sequence's last n tokens (n from ``max_ngram`` down to ``min_ngram``), at most
    ``length`` of them, grafted on where they leave the tree (decode/lookup.py). One verify forward
    checks both: the drafter's guesses and the copy. Verification is unchanged, so decoding stays
    lossless; the copy costs no model pass, only the verify forward's extra tokens
    (docs/verifiers.md, "Context drafts").

    Offline (teacher-forced) metrics are the inner verifier's: a block there has no context to copy
    from.

    Args:
        verifier: the drafter's verifier (default: the greedy chain).
        max_ngram: the longest suffix matched against the context.
        min_ngram: the shortest (1: a single repeated token is enough).
        length: at most this many copied tokens a round (never deeper than the round's drafts).

    It samples as ``verifier`` does (its temperature, top_p and seed); a round with a copy is then
    verified by the tree rule (decode/sampling.py), a copy being no draw from the drafter.
    """

    def __init__(
        self, verifier: Verifier | None = None, max_ngram: int = 2, min_ngram: int = 1, length: int = 7
    ):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        self.verifier = verifier if verifier is not None else GreedyChain()
        self.max_ngram, self.min_ngram, self.length = max_ngram, min_ngram, length

    @property
    def sampling(self) -> Sampling:  # type: ignore[override]
        return self.verifier.sampling

    def label(self) -> str:
        return f"{name_of(self)}_{self.verifier.label()}"

    def offline_accepted(self, draft_logits, labels, valid):
        return self.verifier.offline_accepted(draft_logits, labels, valid)

    def propose(self, draft_logits, rng=None):
        return self.verifier.propose(draft_logits, rng)

    def with_context(self, tree, history, depth):
        tree = self.verifier.with_context(tree, history, depth)
        copy = lookup_continuation(history, self.max_ngram, self.min_ngram, min(self.length, depth))
        return graft(tree, copy) if copy else tree
