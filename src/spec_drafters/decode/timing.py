"""Measuring a round's parts on this machine (``spec-drafters cost-model``) into a RoundCost."""

from __future__ import annotations

import torch

from spec_drafters.clock import median_seconds
from spec_drafters.decode import generate, rounds
from spec_drafters.decode.cost import RoundCost
from spec_drafters.decode.verifiers import DDTree
from spec_drafters.model.drafter import ContextCache
from spec_drafters.model.kernels import PackedLinear
from spec_drafters.model.kernels import packed_linears as _packed
from spec_drafters.target.frozen import crop_cache


@torch.no_grad()
def measure(
    target,
    drafter,
    fc_ids: list[int],
    context: list[int],
    tokens: list[int],
    repeats: int = 5,
    packed_linears: bool = True,
):
    """Times a greedy step, the verify forward over each tree size in ``tokens`` (a DDTree over an
    untrained drafter's pass, the mask and positions decoding uses) and one drafter pass, after
    ``context`` tokens; returns a :class:`RoundCost`. ``packed_linears`` as in decoding (generate.py),
    whose costs these are: prepacked weights change the ratios (a K-token forward gains most)."""
    with _packed(target, drafter, enabled=packed_linears):  # packs once, before the first timing
        return _measure(target, drafter, fc_ids, context, tokens, repeats)


def _measure(target, drafter, fc_ids: list[int], context: list[int], tokens: list[int], repeats: int):
    cache, c = rounds.new_cache(target), len(context)
    out, features = rounds.prefill(target, context, cache, fc_ids)
    kv = ContextCache(drafter)
    kv.append(features)
    bonus = int(target.head(out.hidden[:, -1]).argmax(-1))
    k = drafter.config.block_size

    def step():
        generate.greedy_step(target, cache, bonus, c)
        crop_cache(cache, c)

    def draft():
        return rounds.draft_logits(target, drafter, kv, bonus, c, k - 1)

    logits = draft()
    greedy = median_seconds(step, repeats)
    verify = []
    for t in tokens:
        batch = rounds.VerifyBatch.of(bonus, DDTree(max(1, t - 1)).propose(logits) if t > 1 else None)

        def fwd(batch=batch):
            target.head(batch.forward(target, cache, c).hidden).argmax(-1)
            crop_cache(cache, c)

        verify.append(median_seconds(fwd, repeats) / greedy)
    machine = {"threads": torch.get_num_threads(), "torch": torch.__version__, "context": c}
    machine["packed_linears"] = any(isinstance(m, PackedLinear) for m in target.modules())
    return RoundCost(list(tokens), verify, median_seconds(draft, repeats) / greedy, machine)
