"""The adaptive-budget tree verifier: its cost model by hand, its budget against brute force, and
lossless decoding whatever budget it picks."""

import json
import math
import random

import pytest
import torch

from conftest import tiny_drafter, tiny_target
from spec_drafters.decode.cost import RoundCost
from spec_drafters.decode.generate import greedy_generate, speculative_generate
from spec_drafters.decode.verifiers import AdaptiveDDTree, DraftTree
from spec_drafters.registry import entries, load_components


def _cost_file(tmp_path, tokens, verify, draft):
    path = tmp_path / "cost.json"
    RoundCost(tokens, verify, draft).save(path)
    return str(path)


def test_round_cost_interpolates_by_hand():
    cost = RoundCost([1, 2, 4], [1.0, 1.2, 2.0], 0.2)
    assert cost.round(1) == pytest.approx(1.2)
    assert cost.round(3) == pytest.approx(0.2 + 1.2 + 0.8 / 2)  # halfway between 2 and 4
    assert cost.round(6) == pytest.approx(0.2 + 2.0 + 0.4 * 2)  # the last slope, 0.4 per token
    with pytest.raises(ValueError, match="ascending from 1"):
        RoundCost([2, 4], [1.0, 1.2], 0.2)
    with pytest.raises(ValueError, match="positive"):
        RoundCost([1, 2], [1.0], 0.2)


def _tree(probs):
    """A chain whose prefix probabilities are ``probs`` (decreasing, as DDTree pops them)."""
    n = len(probs)
    return DraftTree(
        list(range(n)), list(range(-1, n - 1)), list(range(1, n + 1)), [math.log(p) for p in probs]
    )


def test_the_budget_by_hand_and_by_brute_force(tmp_path):
    # gains 1.9, 2.4, 2.5; rounds of 2, 3, 4 tokens cost 1.4, 1.8, 2.2: B = 1 (1.357 > 1.333 > 1.136)
    verifier = AdaptiveDDTree(_cost_file(tmp_path, [1, 2, 4], [1.0, 1.2, 2.0], 0.2))
    assert verifier.choose(_tree([0.9, 0.5, 0.1])) == 1
    flat = AdaptiveDDTree(_cost_file(tmp_path, [1, 64], [1.0, 1.0], 0.0))  # verifying is free: all of it
    assert flat.choose(_tree([0.9, 0.5, 0.1])) == 3
    rng = random.Random(0)
    for _ in range(50):
        probs = sorted((rng.random() for _ in range(12)), reverse=True)
        verify = sorted(1 + rng.random() * 3 for _ in range(4))
        v = AdaptiveDDTree(_cost_file(tmp_path, [1, 4, 8, 16], verify, rng.random()))
        ratio = [(1 + sum(probs[:b])) / v.cost.round(b + 1) for b in range(1, 13)]
        assert v.choose(_tree(probs)) == max(range(1, 13), key=lambda b: ratio[b - 1])


def test_the_proposed_tree_is_a_prefix_of_the_full_one(tmp_path):
    verifier = AdaptiveDDTree(_cost_file(tmp_path, [1, 2, 4, 8], [1.0, 1.1, 1.4, 2.4], 0.1), max_budget=16)
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(3))
    full, chosen = verifier.tree(logits), verifier.propose(logits)
    b = len(chosen.tokens)
    assert 1 <= b <= 16 and chosen.tokens == full.tokens[:b] and chosen.parents == full.parents[:b]
    assert all(p < i for i, p in enumerate(chosen.parents))  # parents first: a valid tree


@pytest.mark.slow  # about 80 s a case on 2 cores
@pytest.mark.parametrize("verify", [[1.0, 1.05, 1.1, 1.2], [1.0, 2.0, 4.0, 8.0]])  # wide trees, chains
def test_adaptive_decoding_is_lossless(tmp_path, verify):
    target = tiny_target("qwen3", dtype="float64", seed=2)
    drafter = tiny_drafter(target, block_size=5).double()
    verifier = AdaptiveDDTree(_cost_file(tmp_path, [1, 4, 8, 16], verify, 0.1), max_budget=16)
    rng = random.Random(4)
    for _ in range(6):
        prompt = [rng.randrange(256) for _ in range(rng.randint(1, 16))]
        want = greedy_generate(target, prompt, 20, eos_ids=[])
        got = speculative_generate(target, drafter, [1, 2, 3], verifier, prompt, 20, eos_ids=[])
        assert got.tokens == want.tokens


def test_registry_and_the_cost_command(tmp_path):
    from spec_drafters.cli.main import main

    load_components()
    assert "adaptive_ddtree" in {e.name for e in entries("verifier")}
    out = tmp_path / "costs.json"
    main(["cost-model", "--config", "tests/configs/tiny.yaml", "--out", str(out), "--tokens", "1", "2", "4",
          "--context", "24", "--repeats", "1"])  # fmt: skip
    cost = RoundCost.load(out)
    assert cost.tokens == [1, 2, 4] and all(v > 0 for v in cost.verify) and cost.draft > 0
    assert json.loads(out.read_text())["machine"]["target"]


def test_costs_are_measured_on_the_linears_decoding_uses():
    """Decoding packs its linears (generate.py); the cost model must time the same forward."""
    from spec_drafters.decode.timing import measure
    from spec_drafters.model import kernels
    from spec_drafters.target.frozen import FrozenTarget
    from spec_drafters.target.loaders import TinyRandom

    if not kernels.available():
        pytest.skip("no oneDNN packed linear in this torch build")
    target = FrozenTarget(TinyRandom(hidden_size=256).load().model, (1, 2, 3))  # 256 x 256: packable
    drafter = tiny_drafter(target, block_size=4)
    assert any(kernels.packable(m) for m in target.modules() if isinstance(m, torch.nn.Linear))
    cost = measure(target, drafter, [1, 2, 3], list(range(10)), [1, 2], repeats=1)
    assert cost.machine["packed_linears"] is True
    assert not any(isinstance(m, kernels.PackedLinear) for m in target.modules())  # put back after
    off = measure(target, drafter, [1, 2, 3], list(range(10)), [1, 2], repeats=1, packed_linears=False)
    assert off.machine["packed_linears"] is False
