"""Injection (component kind ``injection``): which target layers are tapped and which feed ``fc``.

Layer ids follow this project's convention (0-based decoder-layer outputs, z-lab's; see target.py).
The seeds' v5 lost weeks because ``fc`` took 4 of the 5 tapped layers; here the ``fc`` inputs are a
named, listed, checked choice.
"""

from __future__ import annotations

from spec_drafters.registry import register
from spec_drafters.target import validate_layer_ids


def zlab_layer_ids(num_layers: int, num_taps: int) -> list[int]:
    """z-lab's default spread of ``num_taps`` taps over ``num_layers`` (dflash.md section 1).

    ``round`` is Python's (ties to even), as in the reference: L=64, m=5 -> [1, 16, 31, 46, 61].
    """
    if num_taps < 1:
        raise ValueError(f"--model.injection.init_args.num_taps must be >= 1, got {num_taps}")
    if num_taps == 1:
        return [num_layers // 2]
    if num_layers < 4:
        raise ValueError(f"the z-lab formula needs a target with at least 4 layers, got {num_layers}")
    return [round(1 + i * (num_layers - 4) / (num_taps - 1)) for i in range(num_taps)]


class Injection:
    """Base class of the ``injection`` kind."""

    component_kind = "injection"

    def tap_ids(self, num_layers: int) -> list[int]:
        """Every tapped layer (what the target must expose)."""
        raise NotImplementedError

    def fc_ids(self, num_layers: int) -> list[int]:
        """The tapped layers concatenated into ``fc``, in order. Default: all of them."""
        return self.tap_ids(num_layers)


@register("injection", "zlab_taps")
class ZLabTaps(Injection):
    """``num_taps`` layers spread by z-lab's formula, all of them into ``fc``.

    Args:
        num_taps: how many target layers to tap (5 for the released drafters).
    """

    def __init__(self, num_taps: int = 5):
        self.num_taps = num_taps

    def tap_ids(self, num_layers: int) -> list[int]:
        ids = zlab_layer_ids(num_layers, self.num_taps)
        return validate_layer_ids(ids, num_layers, "--model.injection.init_args.num_taps")


@register("injection", "explicit_taps")
class ExplicitTaps(Injection):
    """An explicit list of layer ids, all of them into ``fc``.

    Args:
        layer_ids: sorted, unique, 0-based decoder-layer ids.
    """

    def __init__(self, layer_ids: list[int]):
        self.layer_ids = list(layer_ids)

    def tap_ids(self, num_layers: int) -> list[int]:
        return validate_layer_ids(self.layer_ids, num_layers, "--model.injection.init_args.layer_ids")
