"""Components a downstream project adds to spec-drafters.

Importing this module registers them; spec-drafters imports it through the entry point declared in
pyproject.toml (group ``spec_drafters.components``). Both subclass a built-in component and override
one method.
"""

from __future__ import annotations

import torch

from spec_drafters.registry import register
from spec_drafters.target.injection import AllTaps
from spec_drafters.train.noise import UniformNoise


@register("injection", "deepest_taps")
class DeepestTaps(AllTaps):
    """All taps as in ``all_taps``, but only the deepest ``keep`` of them enter fc.

    Args:
        layer_ids: explicit tap ids.
        num_taps: or z-lab's spread of this many taps.
        keep: how many of the deepest taps feed fc.
    """

    def __init__(self, layer_ids: list[int] | None = None, num_taps: int | None = None, keep: int = 2):
        super().__init__(layer_ids=layer_ids, num_taps=num_taps)
        self.keep = keep

    def fc_ids(self, card):
        return self.tap_ids(card)[-self.keep :]


@register("noise", "relative_uniform")
class RelativeUniformNoise(UniformNoise):
    """Uniform noise scaled by each position's feature RMS (targets with massive activations)."""

    def __call__(self, features, generator):
        rms = features.float().pow(2).mean(-1, keepdim=True).sqrt()  # (b, S, 1)
        return super().__call__(torch.zeros_like(features), generator) * rms.to(features.dtype) + features
