"""Draft trees: DDTree's best-first construction over a drafter's per-slot distributions.

Decoding verifies these trees (decode/verifiers.py); training can aim at them (train/acceptance_losses.py,
tree_coverage). A tree is listed in pop order: parents before children, prefix scores descending.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """A draft tree in pop (topological) order; the root, the bonus token, is implicit (index -1)."""

    tokens: list[int]  # token of node i
    parents: list[int]  # parent node index, -1 for children of the root
    depths: list[int]  # 1 for children of the root
    scores: list[float]  # sum of the drafter's log-probabilities along the path
    # A chain whose tokens were drawn at temperature > 0: row k is the distribution draft k was drawn
    # from, which the chain rule of decode/sampling.py needs. None for every other tree.
    draft_probs: torch.Tensor | None = None

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.parents) - 1))


def build_tree(top_logprobs: torch.Tensor, top_tokens: torch.Tensor, budget: int) -> DraftTree:
    """DDTree's best-first construction (Ringel and Romano, arXiv:2604.12989), O(B log B).

    top_logprobs, top_tokens (D, R): per depth, the drafter's R = min(B, V) best tokens, sorted
    descending. A node is a prefix of rank choices; its score is the sum of its log-probabilities.
    Popping the best prefix and pushing its next sibling and its first child yields the B most
    probable prefixes, parents before children.
    """
    depth_max, ranks = top_logprobs.shape
    lp = top_logprobs.tolist()
    tok = top_tokens.tolist()
    tree = DraftTree([], [], [], [])
    if depth_max == 0 or ranks == 0:
        return tree
    heap = [(-lp[0][0], 0, 0, -1, 0.0)]  # (-score, depth - 1, rank, parent node, parent score)
    while heap and len(tree.tokens) < budget:
        neg, d, r, parent, parent_score = heapq.heappop(heap)
        node = len(tree.tokens)
        tree.tokens.append(tok[d][r])
        tree.parents.append(parent)
        tree.depths.append(d + 1)
        tree.scores.append(-neg)
        if r + 1 < ranks:  # next sibling: same parent, next rank at this depth
            heapq.heappush(heap, (-(parent_score + lp[d][r + 1]), d, r + 1, parent, parent_score))
        if d + 1 < depth_max:  # first child: best rank at the next depth
            heapq.heappush(heap, (neg - lp[d + 1][0], d + 1, 0, node, -neg))
    return tree
