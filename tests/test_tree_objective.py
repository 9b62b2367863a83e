"""The tree-aware objective (tree_coverage) on cases small enough to enumerate every prefix."""

import itertools
import math

import pytest
import torch

from spec_drafters.decode.verifiers import DDTree, walk_tree
from spec_drafters.train.acceptance_losses import TreeCoverage, prefix_threshold
from spec_drafters.train.losses import SlotBatch


def _enumerated_depth(logp: torch.Tensor, labels: list[int], budget: int) -> int:
    """Accepted depth by brute force: every prefix of every depth scored, the best ``budget`` kept."""
    depth, v = logp.shape
    prefixes = [p for d in range(1, depth + 1) for p in itertools.product(range(v), repeat=d)]
    score = {p: sum(float(logp[i, t]) for i, t in enumerate(p)) for p in prefixes}
    kept = set(sorted(prefixes, key=lambda p: -score[p])[:budget])
    return max([d for d in range(1, depth + 1) if tuple(labels[:d]) in kept], default=0)


@pytest.mark.parametrize("budget", [1, 2, 3, 5, 8, 13, 39])
def test_the_threshold_count_is_the_trees_accepted_depth(budget):
    g = torch.Generator().manual_seed(budget)
    for _ in range(20):
        logp = torch.log_softmax(torch.randn(3, 3, generator=g) * 2, dim=-1)  # D 3, V 3: 39 prefixes
        labels = torch.randint(0, 3, (3,), generator=g).tolist()
        tau = prefix_threshold(logp.sort(-1, descending=True).values, budget)
        s = logp.gather(1, torch.tensor(labels)[:, None]).squeeze(1).cumsum(0)
        count = int((s >= tau - 1e-9).sum())
        assert count == _enumerated_depth(logp, labels, budget)
        assert count == walk_tree(DDTree(budget).tree(logp), labels)


def _block(logits, labels):
    m = len(labels)
    supervised = torch.zeros((1, 1, m + 1), dtype=torch.bool)
    supervised[0, 0, 1:] = True
    hidden = logits.clone().requires_grad_(True)
    return SlotBatch(hidden, torch.tensor(labels), torch.arange(1, m + 1), supervised, head=lambda x: x)


def test_the_cold_limit_reports_the_accepted_depth_and_the_gradient_raises_the_labels():
    g = torch.Generator().manual_seed(7)
    logits, labels = torch.randn(4, 6, generator=g), [1, 4, 0, 2]
    loss = TreeCoverage(budget=8, temperature=1e-4, ce_weight=0.0)
    out = loss(_block(logits, labels))
    want = walk_tree(DDTree(8).tree(torch.log_softmax(logits, -1)), labels)
    assert out["tree_depth"].item() == want
    batch = _block(logits, labels)
    TreeCoverage(budget=8, temperature=1.0)(batch)["loss"].backward()
    grad = batch.hidden.grad
    assert all(grad[i, y] < 0 for i, y in enumerate(labels))  # descending raises every label's logit


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="budget"):
        TreeCoverage(budget=0)
    with pytest.raises(ValueError, match="temperature"):
        TreeCoverage(temperature=0.0)


def test_tree_coverage_trains_from_the_command_line(tmp_path):
    import json

    from spec_drafters.cli.main import main

    run = ["--trainer.max_steps", "3", "--trainer.default_root_dir", str(tmp_path)]
    loss = ["--model.loss", "TreeCoverage", "--model.loss.init_args.budget", "8"]
    main(["fit", "--config", "tests/configs/tiny.yaml", *run, *loss, "--results", str(tmp_path / "fit.json")])
    metrics = json.loads((tmp_path / "fit.json").read_text())["metrics"]
    assert math.isfinite(metrics["train/loss"]) and metrics["train/tree_depth"] >= 0
