"""Verifiers against independent references: DDTree's tree = the B best prefixes by brute force."""

import itertools

import pytest
import torch

from spec_drafters.decode.verifiers import DDTree, DraftTree, GreedyChain, walk_tree


def brute_force_best_prefixes(logprobs: torch.Tensor, budget: int) -> set[tuple[int, ...]]:
    """Every prefix of every length, scored by the sum of its tokens' log-probabilities."""
    depth, vocab = logprobs.shape
    scored = []
    for d in range(1, depth + 1):
        for prefix in itertools.product(range(vocab), repeat=d):
            scored.append((sum(float(logprobs[i, t]) for i, t in enumerate(prefix)), prefix))
    scored.sort(reverse=True)
    return {p for _, p in scored[:budget]}


def prefixes(tree: DraftTree) -> set[tuple[int, ...]]:
    out, paths = set(), {}
    for i, (t, p) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        paths[i] = (paths[p] if p >= 0 else ()) + (t,)
        out.add(paths[i])
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [1, 4, 13, 40])
def test_tree_is_the_budget_best_prefixes(seed, budget):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((3, 5), generator=g) * 2  # depth 3, vocabulary 5: 155 prefixes in all
    tree = DDTree(budget).tree(logits)
    assert len(tree.tokens) == budget
    assert prefixes(tree) == brute_force_best_prefixes(torch.log_softmax(logits, -1), budget)
    assert all(p < i for i, p in enumerate(tree.parents))  # pop order is topological
    assert tree.scores == sorted(tree.scores, reverse=True)  # best first


def test_walk_follows_the_targets_tokens():
    # root -> 7 (0) -> 8 (2) ; root -> 9 (1) -> 4 (3) -> 5 (4)
    tree = DraftTree(
        tokens=[7, 9, 8, 4, 5], parents=[-1, -1, 0, 1, 3], depths=[1, 1, 2, 2, 3], scores=[0] * 5
    )
    assert walk_tree(tree, [9, 4, 5, 1]) == 3
    assert walk_tree(tree, [7, 8, 3]) == 2
    assert walk_tree(tree, [7, 4]) == 1  # 4 hangs under 9, not under 7
    assert walk_tree(tree, [3]) == 0


@pytest.mark.parametrize("budget", [1, 6, 30])
def test_offline_ddtree_equals_walking_the_brute_force_tree(budget):
    g = torch.Generator().manual_seed(budget)
    logits = torch.randn((40, 3, 5), generator=g) * 2
    labels = torch.randint(0, 5, (40, 3), generator=g)
    labels[:20] = logits[:20].argmax(-1)  # half the blocks greedy-correct, so deep walks happen
    valid = torch.ones_like(labels, dtype=torch.bool)
    valid[3, 1:] = False  # a block cut short by the end of the data
    got = DDTree(budget).offline_accepted(logits, labels, valid).tolist()
    for i in range(40):
        known = int(valid[i].long().cumprod(0).sum())
        best = brute_force_best_prefixes(torch.log_softmax(logits[i, :known], -1), budget)
        want = max([d for d in range(known + 1) if d == 0 or tuple(labels[i, :d].tolist()) in best])
        assert got[i] == want
    chain = GreedyChain().offline_accepted(logits, labels, valid)
    if budget == 1:  # one node: the chain's first draft only
        assert got == [min(int(c), 1) for c in chain]


@pytest.mark.parametrize("max_depth", [1, 2, 5])
def test_chain_of_max_depth_is_the_full_chain_cut_there(max_depth):
    g = torch.Generator().manual_seed(max_depth)
    logits = torch.randn((30, 4, 6), generator=g)
    labels = torch.randint(0, 6, (30, 4), generator=g)
    labels[:15] = logits[:15].argmax(-1)  # long streaks in half the blocks
    valid = torch.ones_like(labels, dtype=torch.bool)
    valid[2, 2:] = False
    chain = GreedyChain(max_depth)
    got = chain.offline_accepted(logits, labels, valid).tolist()
    for i in range(30):  # by hand: count matching slots from the first, stop at a miss or the depth
        want = 0
        while want < min(4, max_depth) and valid[i, want] and logits[i, want].argmax() == labels[i, want]:
            want += 1
        assert got[i] == want
    tree = chain.propose(logits[0])
    assert tree.tokens == logits[0, :max_depth].argmax(-1).tolist() and tree.is_chain
    assert chain.label() == f"greedy_chain_d{max_depth}" and GreedyChain().label() == "greedy_chain"
    with pytest.raises(ValueError, match="max_depth"):
        GreedyChain(0)


def test_a_short_chain_is_logged_beside_the_full_one():
    from spec_drafters.lightning.metrics import OfflineAcceptance

    metrics = OfflineAcceptance.for_verifiers(5, GreedyChain(2), [GreedyChain(3), DDTree(4)])
    assert list(metrics.verifiers) == ["chain", "greedy_chain_d2", "greedy_chain_d3", "ddtree_b4"]
    # one naming rule: the configured verifier by its label, as the extra ones and decode/* metrics
    assert list(OfflineAcceptance.for_verifiers(5, DDTree(8), None).verifiers) == ["chain", "ddtree_b8"]
    same = OfflineAcceptance.for_verifiers(5, DDTree(8), [DDTree(8), DDTree(16)])
    assert list(same.verifiers) == ["chain", "ddtree_b8", "ddtree_b16"]  # listed twice, measured once
    sampled = OfflineAcceptance.for_verifiers(5, DDTree(8, temperature=0.7), None)
    assert list(sampled.verifiers) == ["chain", "ddtree_b8"]  # a sampling tree: its greedy twin


@pytest.mark.parametrize("seed", range(5))
def test_the_three_chain_acceptance_encodings_agree_with_the_tree_walk(seed):
    """Chain acceptance is encoded three times as tensors (the verifier's offline count, CAP's accepted
    indicator, calibration's prefix events); each must count what the one tree walk accepts."""
    from spec_drafters.decode.acceptance import accepted_depth
    from spec_drafters.decode.calibration import prefix_events
    from spec_drafters.train.acceptance_losses import accepted_indicator

    g = torch.Generator().manual_seed(seed)
    a, d, v = 64, 6, 3  # a small vocabulary: every acceptance length occurs
    logits = torch.randn(a, d, v, generator=g)
    labels = torch.where(
        torch.rand(a, d, generator=g) < 0.7, logits.argmax(-1), torch.randint(0, v, (a, d), generator=g)
    )
    chain = list(range(-1, d - 1))
    walked = torch.tensor(
        [
            accepted_depth(row.tolist(), chain, lab.tolist())
            for row, lab in zip(logits.argmax(-1), labels, strict=True)
        ]
    )
    assert set(walked.tolist()) == set(range(d + 1))
    offline = GreedyChain().offline_accepted(logits, labels, torch.ones(a, d, dtype=torch.bool))
    hit = torch.zeros(a, 1, d + 1, dtype=torch.bool)  # (b, N, K): slot 0 is the anchor
    hit[:, 0, 1:] = logits.argmax(-1) == labels
    indicator, _ = accepted_indicator(hit, torch.ones_like(hit))
    _, happened = prefix_events(logits, labels)
    assert torch.equal(offline, walked)
    assert torch.equal(indicator[:, 0, 1:].sum(-1), walked)
    assert torch.equal(happened.sum(-1), walked)
