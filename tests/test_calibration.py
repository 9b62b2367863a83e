"""Slot temperatures for DDTree's ranking: fitted where the right answer is known, used by the tree,
lossless in decoding, and the command that writes them."""

import json
import math

import pytest
import torch

from conftest import tiny_drafter, tiny_target
from spec_drafters.decode.calibration import fit_temperatures, load, prefix_ece, prefix_events, save
from spec_drafters.decode.generate import greedy_generate, speculative_generate
from spec_drafters.decode.verifiers import DDTree


def _overconfident(n, depth, v, scale, seed):
    """Blocks whose labels are drawn from softmax(base) while the drafter says softmax(scale * base):
    the calibrating temperature of every slot is ``scale``."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, depth, v, generator=g)
    labels = torch.multinomial(torch.softmax(base, -1).view(-1, v), 1, generator=g).view(n, depth)
    return base * scale, labels


def test_fitted_temperatures_undo_a_known_overconfidence():
    logits, labels = _overconfident(6000, 3, 5, scale=3.0, seed=0)
    temps = fit_temperatures(logits, labels)
    assert temps == pytest.approx([3.0, 3.0, 3.0], rel=0.15)
    test_logits, test_labels = _overconfident(3000, 3, 5, scale=3.0, seed=1)
    assert prefix_ece(test_logits, test_labels, temps) < 0.5 * prefix_ece(test_logits, test_labels)


def test_the_product_over_slots_is_calibrated_after_fitting():
    logits, labels = _overconfident(6000, 3, 5, scale=2.0, seed=2)
    temps = fit_temperatures(logits, labels)
    predicted, happened = prefix_events(logits, labels, temps)
    for d in range(3):  # mean predicted probability of the top-1 prefix through d = its frequency
        assert predicted[:, d].mean().item() == pytest.approx(happened[:, d].float().mean().item(), abs=0.02)


def test_ddtree_ranks_with_the_temperatures(tmp_path):
    path = tmp_path / "calibration.json"
    save(path, [2.0, 0.5], {})
    logits = torch.randn(2, 7, generator=torch.Generator().manual_seed(0))
    tree = DDTree(5, calibration=str(path)).tree(logits)
    lp = torch.log_softmax(logits / torch.tensor([2.0, 0.5])[:, None], -1)
    for node, score in enumerate(tree.scores):  # each node's score: its path's calibrated log-probs
        path_lp, i = 0.0, node
        while i >= 0:
            path_lp += float(lp[tree.depths[i] - 1, tree.tokens[i]])
            i = tree.parents[i]
        assert score == pytest.approx(path_lp, abs=1e-5)
    with pytest.raises(ValueError, match="2 slot temperatures for 3 slots"):
        DDTree(5, calibration=str(path)).tree(torch.randn(3, 7))


def test_calibrated_tree_decoding_is_lossless(tmp_path):
    save(tmp_path / "c.json", [0.3, 3.0, 1.0, 0.7], {})
    target = tiny_target("llama", dtype="float64", seed=3)
    drafter = tiny_drafter(target, block_size=5).double()
    verifier = DDTree(16, calibration=str(tmp_path / "c.json"))
    for prompt in ([5, 9, 200], [17] * 12, list(range(30, 50))):
        want = greedy_generate(target, prompt, 20, eos_ids=[])
        assert (
            speculative_generate(target, drafter, [1, 2, 3], verifier, prompt, 20, eos_ids=[]).tokens
            == want.tokens
        )


def test_bad_calibration_files_are_refused(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"slot_temperatures": [1.0, -2.0]}))
    with pytest.raises(ValueError, match="positive"):
        load(tmp_path / "c.json")
    (tmp_path / "folder").mkdir()
    save(tmp_path / "folder" / "calibration.json", [1.5], {})
    assert load(tmp_path / "folder") == [1.5]  # a drafter folder holding calibration.json


def test_the_calibrate_command_writes_temperatures_and_ece(tmp_path, capsys):
    from spec_drafters.cli.main import main

    out = tmp_path / "drafter"
    out.mkdir()
    main(["calibrate", "--config", "tests/configs/tiny.yaml", "--ckpt_path",
          "tests/fixtures/main_b8dab2d/tiny.ckpt", "--out", str(out)])  # fmt: skip
    written = json.loads((out / "calibration.json").read_text())
    assert len(written["slot_temperatures"]) == 3 and all(t > 0 for t in written["slot_temperatures"])
    assert math.isfinite(written["ece_before"]) and math.isfinite(written["ece_after"])
    assert "prefix ECE" in capsys.readouterr().out
