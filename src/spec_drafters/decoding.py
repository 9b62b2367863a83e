"""Real decoding: plain greedy, and greedy speculative decoding with a DFlash drafter (batch size 1).

One round of speculative decoding (dflash.md section 3):
  1. the drafter reads the committed context (its cache) and the block [bonus, MASK x (K-1)] at
     positions start..start+K-1, and proposes K-1 tokens (argmax);
  2. the target verifies [bonus, drafts] in one forward with its KV cache;
  3. the verifier accepts a drafts; the target's token after them is the next bonus; a + 1 tokens
     are committed; the target cache is cropped to them and the drafter's context grows by their
     tapped features.
The output equals the target's own greedy decoding token for token: every committed token is one
the target chose given exactly the committed prefix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from spec_drafters.drafter import ContextCache, DFlashDrafter
from spec_drafters.target import FrozenTarget, crop_cache
from spec_drafters.verifiers import Verifier


@dataclass
class DecodeResult:
    tokens: list[int]  # generated tokens (EOS included when it was produced)
    seconds: float  # wall time, prefill included
    accept_lengths: list[int] = field(default_factory=list)  # tokens committed per verification round

    @property
    def rounds(self) -> int:
        return len(self.accept_lengths)

    @property
    def tau(self) -> float:
        """Mean tokens committed per target verification forward."""
        return sum(self.accept_lengths) / max(1, len(self.accept_lengths))

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / max(self.seconds, 1e-9)


def new_cache(target: FrozenTarget):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=target.model.config)
    except TypeError:  # transformers 4.x
        return DynamicCache()


def _positions(start: int, length: int, device) -> torch.Tensor:
    return torch.arange(start, start + length, device=device)[None]  # (1, T)


def _finish(tokens: list[int], max_new_tokens: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cuts after the first EOS or at the budget; says whether decoding is over."""
    for i, t in enumerate(tokens[:max_new_tokens]):
        if t in eos:
            return tokens[: i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


@torch.no_grad()
def greedy_generate(
    target: FrozenTarget, prompt: list[int], max_new_tokens: int, eos_ids: list[int]
) -> DecodeResult:
    t0 = time.perf_counter()
    device = target.embed_tokens.weight.device
    ids = torch.tensor([prompt], device=device)
    cache = new_cache(target)
    out = target(ids, position_ids=_positions(0, len(prompt), device), cache=cache, use_cache=True)
    tokens = [int(target.head(out.hidden[:, -1]).argmax(-1))]
    tokens, done = _finish(tokens, max_new_tokens, set(eos_ids))
    while not done:
        pos = len(prompt) + len(tokens) - 1
        out = target(
            ids.new_tensor([[tokens[-1]]]),
            position_ids=_positions(pos, 1, device),
            cache=cache,
            use_cache=True,
        )
        tokens.append(int(target.head(out.hidden[:, -1]).argmax(-1)))
        tokens, done = _finish(tokens, max_new_tokens, set(eos_ids))
    return DecodeResult(tokens, time.perf_counter() - t0, [1] * len(tokens))


@torch.no_grad()
def speculative_generate(
    target: FrozenTarget,
    drafter: DFlashDrafter,
    fc_ids: list[int],
    verifier: Verifier,
    prompt: list[int],
    max_new_tokens: int,
    eos_ids: list[int],
) -> DecodeResult:
    t0 = time.perf_counter()
    cfg = drafter.config
    device = target.embed_tokens.weight.device
    eos = set(eos_ids)

    def features(out, upto: int) -> torch.Tensor:
        return torch.cat([out.taps[i][:, :upto] for i in fc_ids], dim=-1)  # (1, T, n*H)

    cache = new_cache(target)
    out = target(
        torch.tensor([prompt], device=device),
        position_ids=_positions(0, len(prompt), device),
        cache=cache,
        use_cache=True,
    )
    context = ContextCache(drafter)
    context.append(features(out, len(prompt)))  # positions 0..P-1
    bonus = int(target.head(out.hidden[:, -1]).argmax(-1))
    tokens, done = _finish([bonus], max_new_tokens, eos)
    accept_lengths: list[int] = []
    start = len(prompt)  # position of the bonus token
    while not done:
        size = min(cfg.block_size, max_new_tokens - len(tokens))  # a round commits <= size tokens
        block = torch.full((1, size), cfg.mask_token_id, device=device)
        block[0, 0] = bonus
        if size > 1:
            block[0, 1:] = _draft(target, drafter, context, block, start)
        out = target(block, position_ids=_positions(start, size, device), cache=cache, use_cache=True)
        posterior = target.head(out.hidden).argmax(-1)[0]  # (size,) target's token after each block token
        a = verifier.accepted(block[0, 1:], posterior)
        committed = [*block[0, 1 : 1 + a].tolist(), int(posterior[a])]  # a drafts + the next bonus
        crop_cache(cache, start + a + 1)  # keep the bonus and the accepted drafts
        context.append(features(out, a + 1))  # their tapped features join the drafter's context
        accept_lengths.append(a + 1)
        tokens, done = _finish(tokens + committed, max_new_tokens, eos)
        start += a + 1
        bonus = committed[-1]
    return DecodeResult(tokens, time.perf_counter() - t0, accept_lengths)


def _draft(
    target: FrozenTarget, drafter: DFlashDrafter, context: ContextCache, block: torch.Tensor, start: int
):
    """One drafter pass over [bonus, MASK...] at positions start.. -> the argmax drafts (size-1,)."""
    size = block.shape[1]
    hidden = drafter(target.embed(block), _positions(start, size, block.device), context.kv)  # (1, size, H)
    return target.head(hidden[:, 1:]).argmax(-1)[0]  # (size-1,)
