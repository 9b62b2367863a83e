"""The pieces of a decoding round every decoder, the cost model and the round profile share: the target
cache and positions, the prefill, one drafter pass, the verify batch of a draft tree (its ids,
parents, depths and the target forward that verifies it), the accepted path and the cache's commit
(docs/method.md sections 3 and 4; decode/generate.py runs them as a loop).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_drafters.decode.acceptance import accepted_nodes
from spec_drafters.model.blocks import build_blocks
from spec_drafters.model.drafter import ContextCache, DFlashDrafter
from spec_drafters.model.tree import DraftTree
from spec_drafters.target.features import fc_input
from spec_drafters.target.frozen import FrozenTarget, crop_cache, keep_layer


def new_cache(target: FrozenTarget):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=target.model.config)
    except TypeError:  # transformers 4.x
        return DynamicCache()


def positions(start: int, length: int, device) -> torch.Tensor:
    return torch.arange(start, start + length, device=device)[None]  # (1, T)


def check_fits(
    target: FrozenTarget, prompt_tokens: int, max_new_tokens: int, what: str = "the prompt"
) -> None:
    """Refuses a decode that would run past the target's context: it would compute for minutes over
    positions the target was never built for, and say nothing until it ends."""
    limit = target.context_length
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise ValueError(
            f"{what} has {prompt_tokens} tokens, + max_new_tokens {max_new_tokens} = "
            f"{prompt_tokens + max_new_tokens}, more than the target's context of {limit} tokens "
            "(max_position_embeddings): shorten the prompt or lower max_new_tokens"
        )


def prefill(target: FrozenTarget, tokens: list[int], cache, fc_ids: list[int] | None = None):
    """The target reads ``tokens`` at positions 0.. into ``cache``: its output, and the drafter's
    input features of every position (1, T, n*H) when ``fc_ids`` are given (else None)."""
    device = target.embed_tokens.weight.device
    ids = torch.tensor([tokens], device=device)
    out = target(ids, position_ids=positions(0, len(tokens), device), cache=cache, use_cache=True)
    features = None if fc_ids is None else tap_features(out, fc_ids, list(range(len(tokens))))
    return out, features


@dataclass
class VerifyBatch:
    """What the target verifies in one forward: the bonus token (node 0, the root) and a draft tree's
    nodes, each node's parent (-1 for the root) and depth (0 for the root)."""

    ids: list[int]
    parents: list[int]
    depths: list[int]

    @classmethod
    def of(cls, bonus: int, tree: DraftTree | None) -> VerifyBatch:
        if tree is None:
            return cls([bonus], [-1], [0])
        return cls([bonus, *tree.tokens], [-1, *(p + 1 for p in tree.parents)], [0, *tree.depths])

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.parents) - 1))

    def forward(self, target: FrozenTarget, cache, start: int):
        """The target over the batch at positions ``start`` + depth: a chain with the cache's causal
        mask, a tree with the tree mask (each node sees the context, its ancestors and itself)."""
        device = target.embed_tokens.weight.device
        block = torch.tensor([self.ids], device=device)
        if self.is_chain:
            pos = positions(start, len(self.ids), device)
            return target(block, position_ids=pos, cache=cache, use_cache=True)
        mask = tree_attention_mask(start, self.parents, target.embed_tokens.weight.dtype, device)
        pos = torch.tensor([self.depths], device=device) + start
        return target(block, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True)


def tap_features(out, fc_ids: list[int], nodes: list[int]) -> torch.Tensor:
    """The drafter's input features of the given positions of a target output -> (1, T, n*H)."""
    return fc_input(out, fc_ids, torch.tensor(nodes, device=out.hidden.device))


def draft_logits(
    target: FrozenTarget, drafter: DFlashDrafter, context: ContextCache, bonus: int, start: int, depth: int
) -> torch.Tensor:
    """One drafter pass over [bonus, MASK x depth] at positions start.. -> logits of the drafts (depth, V)
    (V_d columns, draft-vocabulary indices, when the drafter has a draft vocabulary)."""
    device = target.embed_tokens.weight.device
    if depth == 0:
        return torch.empty((0, drafter.config.draft_vocab_size or target.vocab_size), device=device)
    # One block anchored at the bonus, built as in training: [bonus, MASK x depth] at start.. .
    anchor = torch.zeros((1, 1), dtype=torch.long, device=device)
    block, offsets = build_blocks(
        torch.tensor([[bonus]], device=device), anchor, depth + 1, drafter.config.mask_token_id
    )
    hidden = drafter(target.embed(block), offsets + start, context.kv)  # (1, D+1, H)
    return drafter.logits(hidden[0, 1:], target.lm_head)  # (D, V), or (D, V_d) over a draft vocabulary


def accept_path(ids: list[int], parents: list[int], posterior: list[int]) -> list[int]:
    """The accepted path of a verified tree, the root (node 0, the bonus) first (acceptance.py).

    ``ids``/``parents``: the verified nodes, root first (its parent -1, the others' parents index this
    list); ``posterior[i]`` is the target's greedy token after node i.
    """
    nodes = accepted_nodes(ids[1:], [p - 1 for p in parents[1:]], lambda node, _depth: posterior[node + 1])
    return [0, *(n + 1 for n in nodes)]


def tree_attention_mask(ctx_len: int, parents: list[int], dtype: torch.dtype, device) -> torch.Tensor:
    """Additive (1, 1, T, ctx + T) mask: node i sees the committed context, its ancestors and itself."""
    t = len(parents)
    sees = torch.zeros((t, t), dtype=torch.bool)
    for i, p in enumerate(parents):  # parents come before children (pop order)
        if p >= 0:
            sees[i] = sees[p]
        sees[i, i] = True
    allowed = torch.cat([torch.ones((t, ctx_len), dtype=torch.bool), sees], dim=1).to(device)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def keep_cache(cache, start: int, path: list[int]) -> None:
    """Keeps the first ``start`` positions and the path's nodes (indices from ``start``) in a KV cache."""
    if path == list(range(len(path))):  # a chain prefix: cropping is enough
        crop_cache(cache, start + len(path))
        return
    for layer in cache.layers:
        if not (hasattr(layer, "keys") and type(layer).__name__ == "DynamicLayer"):
            raise TypeError(
                f"tree verification compacts a plain attention KV cache; this target's cache has "
                f"{type(layer).__name__} layers (recurrent or sliding-window state cannot branch)"
            )
        keep_layer(layer, start, path)
