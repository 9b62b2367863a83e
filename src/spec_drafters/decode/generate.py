"""Real decoding: plain greedy, greedy speculative decoding with a DFlash drafter, and prompt lookup
(batch size 1).

One round of speculative decoding (docs/method.md sections 3 and 4):
  1. the drafter reads the committed context (its cache) and the block [bonus, MASK x (K-1)] at
     positions start..start+K-1 and gives per-slot logits; the verifier turns them into a draft tree
     (the greedy chain is a tree whose nodes each have one child; DDTree keeps the B most probable
     prefixes);
  2. the target verifies [bonus, nodes] in one forward with its KV cache: a chain with the usual
     causal mask, a tree with the tree mask (each node sees the context, its ancestors and itself)
     and position ids start + depth;
  3. from the bonus, follow the child whose token is the target's greedy token; the target's token
     after the last accepted node is the next bonus; the target cache keeps the accepted path and
     the drafter's context grows by the path's tapped features.
The output equals the target's own greedy decoding token for token: every committed token is one
the target chose given exactly the committed prefix. At temperature > 0 (the verifier's ``sampling``)
step 3 follows the target's own draws instead of its argmax, and the output is distributed exactly as
plain sampling from the target (decode/sampling.py, docs/sampling.md); ``sample_generate`` is that
plain sampling, the baseline of a sampled decoder.
On a hybrid target (Gated-DeltaNet layers beside attention) step 2 runs the recurrent layers along
each node's path and step 3 sets their state to the accepted path's (decode/hybrid.py,
docs/hybrid_targets.md); prefill and plain greedy steps are the model's own.

Prompt lookup (``prompt_lookup_generate``) is the same loop with no drafter: step 1's tree is the
chain of tokens copied from the context (decode/lookup.py), so it shares every rule above (the
target forward, the cache handling, the round and tau counting) with the drafters it is compared to.

All decoders run the target's (and the drafter's) linear layers on prepacked oneDNN weights when
``packed_linears`` is set (the default; model/kernels.py): on CPU this makes a K-token verify forward cost
little more than a one-token step. Packing happens once, before the clock starts, and every decoder
gets it, so their speedup ratios compare like with like.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from spec_drafters.decode import hybrid
from spec_drafters.decode.lookup import graft, lookup_continuation
from spec_drafters.decode.rounds import (
    VerifyBatch,
    accept_path,
    check_fits,
    draft_logits,
    keep_cache,
    new_cache,
    positions,
    prefill,
    tap_features,
)
from spec_drafters.decode.sampling import GREEDY, Sampling, chain_accept, draw, tree_accept
from spec_drafters.decode.verifiers import Verifier
from spec_drafters.model.drafter import ContextCache, DFlashDrafter
from spec_drafters.model.kernels import packed_linears as _packed
from spec_drafters.model.tree import DraftTree
from spec_drafters.target.frozen import FrozenTarget


@dataclass
class DecodeResult:
    tokens: list[int]  # generated tokens (EOS included when it was produced)
    seconds: float  # wall time, prefill included
    accept_lengths: list[int] = field(default_factory=list)  # tokens committed per verification round
    verify_forwards: int | None = None  # rounds, for decoders that do not report accept lengths

    @property
    def rounds(self) -> int:
        return self.verify_forwards if self.verify_forwards is not None else len(self.accept_lengths)

    @property
    def committed(self) -> int:
        """Tokens committed by verification rounds (all but the prefill's first token)."""
        return sum(self.accept_lengths) if self.accept_lengths else max(0, len(self.tokens) - 1)

    @property
    def tau(self) -> float:
        """Mean tokens committed per target verification forward."""
        return self.committed / max(1, self.rounds)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / max(self.seconds, 1e-9)


def _finish(tokens: list[int], max_new_tokens: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cuts after the first EOS or at the budget; says whether decoding is over."""
    for i, t in enumerate(tokens[:max_new_tokens]):
        if t in eos:
            return tokens[: i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


@torch.no_grad()
def greedy_generate(
    target: FrozenTarget,
    prompt: list[int],
    max_new_tokens: int,
    eos_ids: list[int],
    packed_linears: bool = True,
) -> DecodeResult:
    check_fits(target, len(prompt), max_new_tokens)
    with _packed(target, enabled=packed_linears):  # packs once per target, outside the timing
        return _plain(target, prompt, max_new_tokens, eos_ids, GREEDY)


@torch.no_grad()
def sample_generate(
    target: FrozenTarget,
    prompt: list[int],
    max_new_tokens: int,
    eos_ids: list[int],
    sampling: Sampling,
    packed_linears: bool = True,
) -> DecodeResult:
    """Plain decoding with ``sampling``: greedy at temperature 0, else a draw from the target each step
    (the generator seeded with ``sampling.seed``)."""
    check_fits(target, len(prompt), max_new_tokens)
    with _packed(target, enabled=packed_linears):
        return _plain(target, prompt, max_new_tokens, eos_ids, sampling)


def _plain(
    target: FrozenTarget, prompt: list[int], max_new_tokens: int, eos_ids: list[int], sampling: Sampling
) -> DecodeResult:
    t0 = time.perf_counter()
    device = target.embed_tokens.weight.device
    rng = None if sampling.greedy else sampling.generator(device)
    cache = new_cache(target)
    out, _ = prefill(target, prompt, cache)
    tokens = [next_token(target.head(out.hidden[0, -1]), sampling, rng)]
    tokens, done = _finish(tokens, max_new_tokens, set(eos_ids))
    while not done:
        tokens.append(greedy_step(target, cache, tokens[-1], len(prompt) + len(tokens) - 1, sampling, rng))
        tokens, done = _finish(tokens, max_new_tokens, set(eos_ids))
    return DecodeResult(tokens, time.perf_counter() - t0, [1] * len(tokens))


def next_token(logits: torch.Tensor, sampling: Sampling = GREEDY, rng: torch.Generator | None = None) -> int:
    """The target's next token from its logits (V,): the argmax, or a draw at temperature > 0."""
    if sampling.greedy:
        return int(logits.argmax(-1))
    return draw(sampling.probs(logits), rng)


def greedy_step(
    target: FrozenTarget,
    cache,
    token: int,
    position: int,
    sampling: Sampling = GREEDY,
    rng: torch.Generator | None = None,
) -> int:
    """One plain decoding step: the target reads ``token`` at ``position`` and gives its next token
    (its argmax, or a draw with ``sampling`` at temperature > 0)."""
    device = target.embed_tokens.weight.device
    out = target(
        torch.tensor([[token]], device=device),
        position_ids=positions(position, 1, device),
        cache=cache,
        use_cache=True,
    )
    return next_token(target.head(out.hidden[0, -1]), sampling, rng)


class PromptLookup(Verifier):
    """Prompt lookup as a drafter-free draft source (``speculative_generate`` with ``drafter=None``):
    each round's drafts are the tokens that followed the first occurrence, from the left, of the
    sequence's last n tokens (n from ``max_ngram`` down to 1), at most ``num_tokens`` of them,
    verified as a greedy chain.

    The rule is transformers' ``PromptLookupCandidateGenerator`` (``generate(prompt_lookup_num_tokens=
    ...)``, whose ``max_matching_ngram_size`` defaults to 2), so that tau compares with the baseline
    users know; ``lookup_hybrid`` copies from the most recent occurrence instead. One schedule differs:
    transformers also checks a copy inside its prefill forward, where this loop commits the target's
    first token only, as for greedy and the drafters (docs/verifiers.md, "Prompt lookup").
    Not registered: beside a drafter it would only add a drafter pass that nothing reads.
    """

    def __init__(
        self,
        num_tokens: int = 10,
        max_ngram: int = 2,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ):
        if num_tokens < 1 or max_ngram < 1:
            raise ValueError(f"num_tokens and max_ngram must be >= 1, got {num_tokens} and {max_ngram}")
        self.num_tokens, self.max_ngram = num_tokens, max_ngram
        self._sample_with(
            temperature, top_p, seed
        )  # at temperature > 0 the copy is verified by the tree rule

    @property
    def block_size(self) -> int:
        """The bonus token and at most ``num_tokens`` drafts: a drafter's block size, for the loop."""
        return self.num_tokens + 1

    def label(self) -> str:
        return "prompt_lookup" + self.sampling.label()

    def with_context(self, tree, history, depth):
        copy = lookup_continuation(history, self.max_ngram, 1, min(self.num_tokens, depth), earliest=True)
        return graft(tree, copy)  # onto the empty tree: the chain of the copy


@torch.no_grad()
def prompt_lookup_generate(
    target: FrozenTarget,
    prompt: list[int],
    max_new_tokens: int,
    eos_ids: list[int],
    num_tokens: int,
    max_ngram: int = 2,
    packed_linears: bool = True,
    sampling: Sampling = GREEDY,
) -> DecodeResult:
    """Prompt-lookup decoding (no drafter) on the same path as ``greedy_generate`` and the drafters."""
    source = PromptLookup(num_tokens, max_ngram, sampling.temperature, sampling.top_p, sampling.seed)
    return speculative_generate(target, None, [], source, prompt, max_new_tokens, eos_ids, packed_linears)


@torch.no_grad()
def speculative_generate(
    target: FrozenTarget,
    drafter: DFlashDrafter | None,
    fc_ids: list[int],
    verifier: Verifier,
    prompt: list[int],
    max_new_tokens: int,
    eos_ids: list[int],
    packed_linears: bool = True,
) -> DecodeResult:
    """``drafter`` None: the drafts come from ``verifier`` alone (a :class:`PromptLookup`).
    ``packed_linears``: run the linear layers on prepacked oneDNN weights (CPU; see model/kernels.py)."""
    if (drafter is None) != isinstance(verifier, PromptLookup):
        raise ValueError("PromptLookup is the draft source of a decode without a drafter, and only that")
    models = [target] if drafter is None else [target, drafter]
    with _packed(*models, enabled=packed_linears):  # packs once, outside the timing
        return _speculative(target, drafter, fc_ids, verifier, prompt, max_new_tokens, eos_ids)


def _speculative(
    target: FrozenTarget,
    drafter: DFlashDrafter | None,
    fc_ids: list[int],
    verifier: Verifier,
    prompt: list[int],
    max_new_tokens: int,
    eos_ids: list[int],
) -> DecodeResult:
    check_fits(target, len(prompt), max_new_tokens)
    t0 = time.perf_counter()
    block_size = verifier.block_size if drafter is None else drafter.config.block_size
    device = target.embed_tokens.weight.device
    eos = set(eos_ids)
    rng = None if verifier.sampling.greedy else verifier.sampling.generator(device)
    cache = new_cache(target)
    hybrid.check_rollback(target, cache)  # one message, before any forward, for a cache we cannot roll back
    out, features = prefill(target, prompt, cache, None if drafter is None else fc_ids)
    context = None if drafter is None else ContextCache(drafter)
    if context is not None:
        context.append(features)  # positions 0..P-1
    bonus = next_token(target.head(out.hidden[0, -1]), verifier.sampling, rng)
    tokens, done = _finish([bonus], max_new_tokens, eos)
    history = [*prompt, bonus]  # what a verifier may copy from; grows by each round's commit
    accept_lengths: list[int] = []
    start = len(prompt)  # position of the bonus token
    while not done:
        # A round commits at most depth + 1 tokens; never draft past the budget.
        depth = min(block_size, max_new_tokens - len(tokens)) - 1
        path, committed = speculative_round(
            target, drafter, fc_ids, verifier, cache, context, bonus, start, depth, history, rng
        )
        history += committed
        before = len(tokens)
        tokens, done = _finish(tokens + committed, max_new_tokens, eos)
        # What the round adds to the output: accepted drafts past an EOS are not committed (as in
        # transformers' assisted decoding, which stops its candidates at an EOS).
        accept_lengths.append(len(tokens) - before)
        start += len(path)
        bonus = committed[-1]
    return DecodeResult(tokens, time.perf_counter() - t0, accept_lengths)


def speculative_round(
    target: FrozenTarget,
    drafter: DFlashDrafter | None,
    fc_ids: list[int],
    verifier: Verifier,
    cache,
    context: ContextCache | None,
    bonus: int,
    start: int,
    depth: int,
    history: list[int] | None = None,
    rng: torch.Generator | None = None,
) -> tuple[list[int], list[int]]:
    """One round from the bonus token at ``start``: draft ``depth`` slots, verify, commit.
    ``history`` (the prompt and the committed tokens, ``bonus`` last) is what a verifier may copy
    drafts from (``Verifier.with_context``); ``rng`` is the decode's generator when the verifier samples
    (temperature > 0). Without a drafter (and its ``context``) the tree starts
    empty and holds only what the verifier copies (:class:`PromptLookup`).

    Returns the accepted path (node indices, the root first) and the committed tokens (accepted
    drafts, then the next bonus); the target cache and the drafter context grow by the path.
    """
    tree = _draft_tree(target, drafter, verifier, context, bonus, start, depth, rng)
    tree = verifier.with_context(tree, history if history is not None else [bonus], depth)
    batch = VerifyBatch.of(bonus, tree)
    # A hybrid target's recurrent layers verify along each node's path and are set by the commit
    # (decode/hybrid.py); a plain target's forward and cache handling are untouched.
    recurrent = hybrid.is_hybrid(cache)
    with hybrid.tree_forward(target, batch.parents) if recurrent else contextlib.nullcontext() as record:
        out = batch.forward(target, cache, start)
    logits = target.head(out.hidden)[0]  # (T, V): the target after each node
    if verifier.sampling.greedy:
        posterior = logits.argmax(-1).tolist()  # target's token after each node
        path = accept_path(batch.ids, batch.parents, posterior)  # [0, ...]: the root and the accepted nodes
        nxt = posterior[path[-1]]
    else:
        path, nxt = sampled_path(tree, logits, verifier.sampling, rng)
    committed = [*(batch.ids[i] for i in path[1:]), nxt]  # accepted drafts + next bonus
    if recurrent:
        hybrid.commit(cache, record, start, path)
    else:
        keep_cache(cache, start, path)  # the target cache holds the committed path only
    if context is not None:
        context.append(tap_features(out, fc_ids, path))  # their tapped features join the drafter's context
    return path, committed


def _draft_tree(target, drafter, verifier, context, bonus: int, start: int, depth: int, rng) -> DraftTree:
    """The verifier's tree from one drafter pass, in target token ids (empty without a drafter)."""
    if drafter is None:
        return DraftTree([], [], [], [])
    tree = verifier.propose(draft_logits(target, drafter, context, bonus, start, depth), rng)
    if drafter.draft_ids is not None:  # draft-vocabulary indices -> target token ids
        tree.tokens = drafter.draft_ids[tree.tokens].tolist()
        if tree.draft_probs is not None:  # the drafts' distributions, over the target's vocabulary
            full = tree.draft_probs.new_zeros((tree.draft_probs.shape[0], target.vocab_size))
            tree.draft_probs = full.index_copy_(1, drafter.draft_ids.to(full.device), tree.draft_probs)
    return tree


def sampled_path(
    tree: DraftTree, logits: torch.Tensor, sampling: Sampling, rng: torch.Generator
) -> tuple[list[int], int]:
    """At temperature > 0: the accepted path (node indices, the root 0 first, as ``accept_path``) and
    the next token. ``logits`` (T, V): the target after the root and each of the tree's nodes. A chain
    drawn from the drafter (``draft_probs``) takes the chain rule, any other tree the tree rule."""

    def target_probs(node: int) -> torch.Tensor:  # node: 0 the root, i the tree's node i - 1
        return sampling.probs(logits[node])

    if tree.draft_probs is not None and tree.is_chain and len(tree.draft_probs) == len(tree.tokens):
        k, nxt = chain_accept(tree.tokens, tree.draft_probs, target_probs, rng)
        return list(range(k + 1)), nxt
    nodes, nxt = tree_accept(tree.tokens, tree.parents, lambda n: target_probs(n + 1), rng)
    return [0, *(n + 1 for n in nodes)], nxt
