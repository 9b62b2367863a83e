"""Drafts copied from the context (prompt lookup), and grafting them onto a drafter's draft tree.

Prompt-lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``) drafts without a
model: find an earlier place in the sequence where its last few tokens occurred, and propose what
followed there. Code repeats itself (names, signatures, idioms), so the copy is often right exactly
where a small drafter is unsure, and it costs no forward pass. docs/verifiers.md, "Context drafts",
says how ``lookup_hybrid`` (decode/verifiers.py) adds it to a drafter's tree.
"""

from __future__ import annotations

from spec_drafters.decode.acceptance import child_index
from spec_drafters.model.tree import DraftTree


def lookup_continuation(
    history: list[int], max_ngram: int, min_ngram: int, length: int, earliest: bool = False
) -> list[int]:
    """Up to ``length`` tokens that followed an earlier occurrence of the sequence's last n tokens, for n
    from ``max_ngram`` down to ``min_ngram`` (the longest n that occurs wins); [] when none occurs. The
    occurrence is the most recent one, or with ``earliest`` the first from the left (transformers'
    ``PromptLookupCandidateGenerator``: prompt lookup's own rule, decode/generate.py). It must start
    before the suffix itself, so the copy is never the suffix reading itself; it may overlap it (a run
    of repeats continues the run)."""
    if length < 1:
        return []
    end = len(history)
    for n in range(min(max_ngram, end - 1), min_ngram - 1, -1):
        suffix = history[end - n :]
        starts = range(end - n) if earliest else range(end - n - 1, -1, -1)
        for start in starts:
            if history[start : start + n] == suffix:
                return history[start + n : start + n + length]
    return []


def graft(tree: DraftTree, path: list[int]) -> DraftTree:
    """``tree`` with the token path ``path`` (from the root's child down) added as a branch: it follows
    the tree's nodes while their tokens agree, then hangs the rest below the last common node. New
    nodes come after the old ones (parents stay before children) and carry score -inf: they are not
    the drafter's. The tree's own nodes and their order are unchanged."""
    tokens, parents = list(tree.tokens), list(tree.parents)
    depths, scores = list(tree.depths), list(tree.scores)
    children = child_index(tokens, parents)  # the walk's own rule for which child a token follows
    node = -1
    for d, t in enumerate(path, start=1):
        nxt = children.get(node, {}).get(t)
        if nxt is None:
            nxt = len(tokens)
            tokens.append(t)
            parents.append(node)
            depths.append(d)
            scores.append(float("-inf"))
            children.setdefault(node, {})[t] = nxt
        node = nxt
    return DraftTree(tokens, parents, depths, scores)
