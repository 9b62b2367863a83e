"""The target wrapper taps decoder-layer outputs under this project's id convention."""

import pytest
import torch

from conftest import tiny_target
from spec_drafters.target.cards import TargetCard
from spec_drafters.target.frozen import validate_layer_ids
from spec_drafters.target.injection import (
    AllButLast,
    AllTaps,
    CustomInjection,
    zlab_layer_ids,
)
from spec_drafters.target.labels import DatasetTokens, LayerLogits, ModelOutput


def card(num_layers: int, default_tap_ids=()) -> TargetCard:
    return TargetCard("t", num_layers, 32, 259, 258, default_tap_ids=list(default_tap_ids))


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
            AllTaps(layer_ids=ids).tap_ids(card(64))
        with pytest.raises(ValueError, match=r"^taps "):  # the argument's name, no flag (the CLI adds it)
            CustomInjection(taps=ids, fc=[1]).fc_ids(card(64))


def test_zlab_taps_that_collapse_are_an_error():
    with pytest.raises(ValueError, match="duplicate"):
        AllTaps(num_taps=3).tap_ids(card(4))


def test_injection_strategies_on_the_seeds_target():
    c = card(64, default_tap_ids=[1, 16, 31, 46, 61])
    # "5-layer" (v6): every tap into fc; the tap list from the card, the formula or explicit ids.
    for strategy in (AllTaps(), AllTaps(num_taps=5), AllTaps(layer_ids=[1, 16, 31, 46, 61])):
        assert strategy.tap_ids(c) == strategy.fc_ids(c) == [1, 16, 31, 46, 61]
    # "4-layer" (v5): layer 61 is tapped (for the labels) but kept out of fc.
    v5 = AllButLast()
    assert v5.tap_ids(c) == [1, 16, 31, 46, 61] and v5.fc_ids(c) == [1, 16, 31, 46]
    custom = CustomInjection(taps=[2, 10, 61], fc=[2, 61])
    assert custom.tap_ids(c) == [2, 10, 61] and custom.fc_ids(c) == [2, 61]
    assert AllTaps().tap_ids(card(30)) == [1, 8, 14, 20, 27]  # no card default: z-lab's 5 taps
    with pytest.raises(ValueError, match="not in taps"):
        CustomInjection(taps=[2, 10], fc=[3]).fc_ids(c)
    with pytest.raises(ValueError, match="not both"):
        AllTaps(layer_ids=[1, 2], num_taps=2)
    with pytest.raises(ValueError, match="at least 2"):
        AllButLast(layer_ids=[5]).fc_ids(c)


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
def test_label_sources_against_hf_hidden_states(architecture):
    target = tiny_target(architecture, tap_ids=(2, 5))
    ids = torch.randint(0, 256, (2, 9))
    out = target(ids)
    hf = target.model(ids, output_hidden_states=True)
    want = hf.logits.argmax(-1)  # the real output predicts position t + 1 from t
    labels, valid = ModelOutput().hard_labels(target, out, ids)
    assert torch.equal(labels[:, 1:], want[:, :-1]) and not valid[:, 0].any() and valid[:, 1:].all()
    # layer -1 through the final norm and head is the model output, bit for bit
    assert torch.equal(LayerLogits(-1).hard_labels(target, out, ids)[0], labels)
    # layer 2 (an earlier layer): lm_head(norm(HF hidden_states[3])), computed independently
    early = target.model.lm_head(target.model.model.norm(hf.hidden_states[3])).argmax(-1)
    assert torch.equal(LayerLogits(2).hard_labels(target, out, ids)[0][:, 1:], early[:, :-1])
    assert LayerLogits(-4).layer_ids(card(6)) == [2]
    rows, pos = torch.tensor([0, 1, 1]), torch.tensor([1, 4, 8])
    soft = ModelOutput().logits_at(target, out, rows, pos)
    torch.testing.assert_close(soft, hf.logits[rows, pos - 1])
    assert torch.equal(DatasetTokens().hard_labels(target, out, ids)[0], ids)
    with pytest.raises(ValueError, match="no target distribution"):
        DatasetTokens().logits_at(target, out, rows, pos)
    with pytest.raises(ValueError, match="layer_id 6"):
        LayerLogits(6).layer_ids(card(6))
