"""Context drafts (prompt lookup) grafted onto the drafter's tree: the lookup by hand, the graft
against the set of root paths it must hold, and lossless decoding that accepts copied tokens."""

import random
from dataclasses import replace

import pytest
import torch

from conftest import tiny_drafter, tiny_target
from spec_drafters.decode.generate import greedy_generate, speculative_generate
from spec_drafters.decode.lookup import graft, lookup_continuation
from spec_drafters.decode.verifiers import DDTree, GreedyChain, LookupHybrid
from spec_drafters.model.drafter import DFlashDrafter
from spec_drafters.model.tree import DraftTree, build_tree
from spec_drafters.registry import lookup


def test_lookup_by_hand():
    assert lookup_continuation([1, 2, 3, 9, 1, 2], 2, 1, 3) == [3, 9, 1]  # the bigram [1, 2] at 0
    assert lookup_continuation([1, 2, 3, 9, 1, 2], 2, 1, 10) == [3, 9, 1, 2]  # up to the end
    assert lookup_continuation([1, 4, 1, 5, 1], 1, 1, 2) == [5, 1]  # the most recent earlier [1]
    # the longest n wins: [1, 2] occurs (-> 7 ...) although [2] occurs later (-> 8 ...)
    assert lookup_continuation([1, 2, 7, 3, 2, 8, 1, 2], 2, 1, 2) == [7, 3]
    assert lookup_continuation([1, 2, 7, 3, 2, 8, 1, 2], 1, 1, 2) == [8, 1]
    assert lookup_continuation([5, 5, 5], 2, 1, 4) == [5]  # a run continues the run
    assert lookup_continuation([1, 2, 3], 2, 1, 4) == []  # nothing repeats
    assert lookup_continuation([1, 2, 3, 1], 3, 2, 4) == []  # only a unigram matches: below min_ngram
    assert lookup_continuation([7], 2, 1, 4) == [] and lookup_continuation([1, 1], 2, 1, 0) == []


def _paths(tree: DraftTree) -> set[tuple[int, ...]]:
    """Every root path of the tree, as its token sequence."""
    out = set()
    for i in range(len(tree.tokens)):
        path, node = [], i
        while node != -1:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        out.add(tuple(reversed(path)))
    return out


def test_graft_by_hand():
    chain = GreedyChain().propose(torch.eye(4)[[1, 2, 3]] * 5)  # tokens 1, 2, 3
    got = graft(chain, [1, 2, 0, 3])  # agrees for two tokens, then leaves the chain
    assert got.tokens == [1, 2, 3, 0, 3] and got.parents == [-1, 0, 1, 1, 3]
    assert got.depths == [1, 2, 3, 3, 4] and got.scores[3:] == [float("-inf")] * 2
    assert graft(chain, [1, 2]) == chain  # already inside: nothing added
    assert graft(DraftTree([], [], [], []), [4, 4]).parents == [-1, 0]


def test_graft_holds_exactly_both_sets_of_paths():
    rng = random.Random(0)
    for _ in range(200):
        logits = torch.randn(rng.randint(1, 5), 6, generator=torch.Generator().manual_seed(rng.randrange(99)))
        top = torch.log_softmax(logits, -1).topk(6)
        tree = build_tree(top.values, top.indices, rng.randint(1, 20))
        path = [rng.randrange(6) for _ in range(rng.randint(1, 6))]
        got = graft(tree, path)
        assert (
            got.tokens[: len(tree.tokens)] == tree.tokens and got.parents[: len(tree.parents)] == tree.parents
        )
        assert _paths(got) == _paths(tree) | {tuple(path[:n]) for n in range(1, len(path) + 1)}
        assert len(got.tokens) == len(_paths(got))  # no two siblings share a token
        assert all(
            p < i and got.depths[i] == (got.depths[p] if p >= 0 else 0) + 1 for i, p in enumerate(got.parents)
        )


def _repetitive_prompts(target, n, seed):
    """Prompts that hold the start of their own greedy continuation: a copy from the prompt is right."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        head = [rng.randrange(256) for _ in range(rng.randint(2, 6))]
        cont = greedy_generate(target, head, 10, eos_ids=[]).tokens
        out.append(head + cont + head)  # the model's own text, then its start again
    return out


@pytest.mark.parametrize("inner", [GreedyChain(), DDTree(budget=6)])
def test_hybrid_decoding_is_lossless_and_accepts_copies(inner):
    target = tiny_target("qwen3", dtype="float64", seed=2)
    drafter = tiny_drafter(target, block_size=6).double()
    hybrid = LookupHybrid(inner, max_ngram=3, min_ngram=1, length=5)
    plain_rounds = hybrid_rounds = 0
    for prompt in [*_repetitive_prompts(target, 4, seed=1), [3, 9, 27, 81]]:
        want = greedy_generate(target, prompt, 24, eos_ids=[])
        plain = speculative_generate(target, drafter, [1, 2, 3], inner, prompt, 24, eos_ids=[])
        got = speculative_generate(target, drafter, [1, 2, 3], hybrid, prompt, 24, eos_ids=[])
        assert got.tokens == want.tokens == plain.tokens
        plain_rounds, hybrid_rounds = plain_rounds + plain.rounds, hybrid_rounds + got.rounds
    assert hybrid_rounds < plain_rounds  # the copies were accepted: fewer verify forwards


def test_copies_are_target_ids_under_a_draft_vocabulary():
    """The drafter's tree is mapped to target ids before the copy is grafted (the copy is already in
    target ids): decoding over a 40-token draft vocabulary stays lossless and still accepts copies."""
    target = tiny_target("qwen3", dtype="float64", seed=2)
    base = tiny_drafter(target, block_size=6).double()
    ids = torch.tensor(sorted(random.Random(0).sample(range(target.vocab_size), 40)))
    drafter = DFlashDrafter(replace(base.config, draft_vocab_size=len(ids))).double().eval()
    drafter.load_state_dict({**base.state_dict(), "draft_ids": ids})
    hybrid = LookupHybrid(GreedyChain(), max_ngram=3, length=5)
    plain_rounds = hybrid_rounds = 0
    for prompt in _repetitive_prompts(target, 3, seed=5):
        want = greedy_generate(target, prompt, 20, eos_ids=[])
        plain = speculative_generate(target, drafter, [1, 2, 3], GreedyChain(), prompt, 20, eos_ids=[])
        got = speculative_generate(target, drafter, [1, 2, 3], hybrid, prompt, 20, eos_ids=[])
        assert got.tokens == want.tokens
        plain_rounds, hybrid_rounds = plain_rounds + plain.rounds, hybrid_rounds + got.rounds
    assert hybrid_rounds < plain_rounds


def test_registered_with_its_arguments_checked():
    assert lookup("verifier", "lookup_hybrid") is LookupHybrid
    assert LookupHybrid(DDTree(budget=8)).label() == "lookup_hybrid_ddtree_b8"
    assert LookupHybrid().verifier.label() == "greedy_chain"
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        LookupHybrid(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError, match="length must be >= 1"):
        LookupHybrid(length=0)
