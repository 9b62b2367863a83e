"""Noise reaches the drafter's fc input only: the labels are bit-identical with and without it.

The field reports' v3 added noise in place to the hidden states that the labels were computed from, so the
drafter was trained on corrupted targets (docs/method.md section 5). Here the target source even reads a
layer that also feeds fc (v3's "61 also feeding the labels"), and the labels must not move.
"""

import pytest
import torch

from spec_drafters.data.records import collate, tokenize
from spec_drafters.lightning.module import DFlashModule
from spec_drafters.model.drafter import DrafterConfig
from spec_drafters.target.injection import AllTaps
from spec_drafters.target.labels import LayerLogits
from spec_drafters.target.loaders import TinyRandom
from spec_drafters.target.tokenizers import ByteTokenizer
from spec_drafters.train.losses import CEKLBlend
from spec_drafters.train.noise import FeatureNoise, GaussianNoise, NoNoise, UniformNoise


class InPlaceNoise(FeatureNoise):
    """A careless plugin that mutates its input, as the field reports' v3 code did."""

    def __call__(self, features, generator):
        return features.add_(torch.rand(features.shape, generator=generator))


def module(noise: FeatureNoise) -> DFlashModule:
    return DFlashModule(
        target=TinyRandom(num_layers=6),
        drafter=DrafterConfig(num_layers=1, block_size=4),
        injection=AllTaps(layer_ids=[1, 3, 4]),
        target_source=LayerLogits(4),  # labels from a layer that also feeds fc
        noise=noise,
        loss=CEKLBlend(alpha=0.15),  # a soft loss, so the target distribution is produced too
    )


def batch():
    tok = ByteTokenizer()
    texts = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i * i)\n"]
    return collate([tokenize({"text": t}, tok, max_length=48) for t in texts])


def prepare(m, batch, sampler, seed, noisy):
    """One step's inputs as training (noisy) or validation builds them, rows 0..b-1."""
    return m.step_builder(
        batch, sampler, m.target_source, seed, range(batch["input_ids"].shape[0]), noisy=noisy
    )


@pytest.mark.parametrize("noise", [UniformNoise(0.05), GaussianNoise(0.5), InPlaceNoise()])
def test_labels_are_bit_identical_with_and_without_noise(noise):
    b = batch()
    clean = prepare(module(NoNoise()), b, UniformAnchors_(), 3, True)
    noisy = prepare(module(noise), b, UniformAnchors_(), 3, True)
    assert torch.equal(noisy.labels, clean.labels)
    assert torch.equal(noisy.supervised, clean.supervised)
    assert torch.equal(noisy.teacher(slice(None)), clean.teacher(slice(None)))
    assert not torch.equal(noisy.features, clean.features)  # the drafter's input did change
    if not isinstance(noise, InPlaceNoise):
        assert torch.equal(noisy.clean_features, clean.features)


def test_noise_is_training_only_and_reproducible():
    b = batch()
    m = module(UniformNoise(0.05))
    val = prepare(m, b, UniformAnchors_(), 3, False)
    assert torch.equal(val.features, val.clean_features)
    one = prepare(m, b, UniformAnchors_(), 3, True)
    two = prepare(m, b, UniformAnchors_(), 3, True)
    assert torch.equal(one.features, two.features)
    delta = one.features - one.clean_features
    assert delta.abs().max() <= 0.05 + 1e-6 and delta.abs().max() > 0.04


@pytest.mark.parametrize(("cls", "field"), [(UniformNoise, "amplitude"), (GaussianNoise, "sigma")])
def test_bad_noise_names_its_argument_not_a_flag(cls, field):
    with pytest.raises(ValueError, match=f"^{field} must be a positive number, got -1.0$"):
        cls(-1.0)


def UniformAnchors_():
    from spec_drafters.train.anchors import UniformAnchors

    return UniformAnchors(max_anchors=8)
