"""The target wrapper taps decoder-layer outputs under this project's id convention."""

import pytest
import torch

from conftest import tiny_target
from spec_drafters.injection import ExplicitTaps, ZLabTaps, zlab_layer_ids
from spec_drafters.target import validate_layer_ids


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
def test_taps_are_hf_hidden_states_id_plus_one(architecture):
    target = tiny_target(architecture, tap_ids=(0, 2, 4, 5))
    ids = torch.randint(0, 256, (2, 9))
    out = target(ids)
    hf = target.model(ids, output_hidden_states=True).hidden_states
    for i in (0, 2, 4):
        torch.testing.assert_close(out.taps[i], hf[i + 1])
    # HF's last entry is the *normed* final state; our id 5 is the raw output of the last layer.
    torch.testing.assert_close(target.norm(out.taps[5]), hf[6])
    torch.testing.assert_close(out.hidden, hf[6])
    torch.testing.assert_close(target.head(out.hidden), target.model(ids).logits)


def test_target_is_frozen_and_stays_in_eval(qwen3_target):
    qwen3_target.train()
    assert not qwen3_target.training and not qwen3_target.model.training
    assert not any(p.requires_grad for p in qwen3_target.parameters())


def test_zlab_formula_matches_the_reference_values():
    assert zlab_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert zlab_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert zlab_layer_ids(30, 5) == [1, 8, 14, 20, 27]  # the embedded SmolLM2 (round half to even)
    assert zlab_layer_ids(64, 1) == [32]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([1, 64], "outside the target's 0..63"),
        ([3, 3], "duplicate"),
        ([5, 2], "sorted"),
        ([], "at least one"),
    ],
)
def test_bad_layer_ids_name_the_field(ids, message):
    with pytest.raises(ValueError, match=message):
        validate_layer_ids(ids, 64, "--model.injection.init_args.layer_ids")
    if ids:
        with pytest.raises(ValueError, match="layer_ids"):
            ExplicitTaps(ids).tap_ids(64)


def test_zlab_taps_that_collapse_are_an_error():
    with pytest.raises(ValueError, match="duplicate"):
        ZLabTaps(num_taps=3).tap_ids(4)
