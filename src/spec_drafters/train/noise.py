"""Feature noise (component kind ``noise``): perturbs the drafter's ``fc`` input during training only.

speculators adds U(-0.05, 0.05) to the concatenated tapped hidden states; z-lab and SpecForge add
none (docs/method.md section 2.8). The field reports' v3 added it in place to the tensors the labels
were computed from as well, so the drafter learned noisy targets. Here a noise component only ever
returns a new tensor from the ``fc`` input, and the label tensors are computed from the target's
untouched outputs (a test checks they are bit-identical with and without noise).

Signature: ``noise(features (b, S, n*H), generator) -> (b, S, n*H)``, a new tensor.
"""

from __future__ import annotations

import math

import torch

from spec_drafters.registry import register


class FeatureNoise:
    """Base class of the ``noise`` kind."""

    component_kind = "noise"

    def __call__(self, features: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError


def _positive(value: float, field: str) -> float:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{field} must be a positive number, got {value}")
    return value


def _draw(features: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """U[0, 1) in fp32 on the generator's device, moved to the features' (b, S, n*H)."""
    u = torch.rand(features.shape, generator=generator, device=generator.device, dtype=torch.float32)
    return u.to(features.device)


@register("noise", "none")
class NoNoise(FeatureNoise):
    """No noise (z-lab, SpecForge)."""

    def __call__(self, features, generator):
        return features


@register("noise", "uniform")
class UniformNoise(FeatureNoise):
    """Adds U(-amplitude, +amplitude) to every feature (speculators: 0.05).

    Args:
        amplitude: half-width of the uniform distribution.
    """

    def __init__(self, amplitude: float = 0.05):
        self.amplitude = _positive(amplitude, "amplitude")

    def __call__(self, features, generator):
        noise = (_draw(features, generator) * 2 - 1) * self.amplitude
        return features + noise.to(features.dtype)


@register("noise", "gaussian")
class GaussianNoise(FeatureNoise):
    """Adds N(0, sigma^2) to every feature.

    Args:
        sigma: standard deviation.
    """

    def __init__(self, sigma: float = 0.05):
        self.sigma = _positive(sigma, "sigma")

    def __call__(self, features, generator):
        g = torch.randn(features.shape, generator=generator, device=generator.device, dtype=torch.float32)
        return features + (g.to(features.device) * self.sigma).to(features.dtype)
