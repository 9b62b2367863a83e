"""Injection (component kind ``injection``): which target layers are tapped and which of them feed ``fc``.

Layer ids follow this project's convention (0-based decoder-layer outputs, z-lab's; see target.py).
The seeds lost weeks to this choice (docs/method.md section 5): v5 fed ``fc`` 4 of its 5 tapped layers
(``all_but_last``, the last one kept for the labels only), v6 fed all 5 (``all_taps``) and converged
5x faster. Here the ``fc`` inputs are a named, listed, checked choice, recorded in every checkpoint.

Every strategy resolves against the target's card (depth, default taps), so a config names the
strategy and, at most, the tap count or the ids; never the target's dimensions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec_drafters.registry import register
from spec_drafters.target.frozen import validate_layer_ids

if TYPE_CHECKING:
    from spec_drafters.target.cards import TargetCard


def zlab_layer_ids(num_layers: int, num_taps: int) -> list[int]:
    """z-lab's default spread of ``num_taps`` taps over ``num_layers`` (docs/method.md section 1).

    ``round`` is Python's (ties to even), as in the reference: L=64, m=5 -> [1, 16, 31, 46, 61].
    """
    if num_taps < 1:
        raise ValueError(f"num_taps must be >= 1, got {num_taps}")
    if num_taps == 1:
        return [num_layers // 2]
    if num_layers < 4:
        raise ValueError(f"the z-lab formula needs a target with at least 4 layers, got {num_layers}")
    return [round(1 + i * (num_layers - 4) / (num_taps - 1)) for i in range(num_taps)]


class Injection:
    """Base class of the ``injection`` kind.

    Subclasses answer two questions about a target (given by its card): which layers must be tapped,
    and which of those, in order, are concatenated into ``fc``.
    """

    component_kind = "injection"

    def tap_ids(self, card: TargetCard) -> list[int]:
        """Every tapped layer (what the target must expose), sorted."""
        raise NotImplementedError

    def fc_ids(self, card: TargetCard) -> list[int]:
        """The tapped layers concatenated into ``fc``, in order. Default: all of them."""
        return self.tap_ids(card)


class _TapList(Injection):
    """Shared resolution of the tap list: explicit ids, or the z-lab formula, or the card's default.

    Args:
        layer_ids: explicit, sorted, unique, 0-based decoder-layer ids.
        num_taps: how many layers to spread by z-lab's formula over the target's depth.
    With neither, the target card's ``default_tap_ids`` apply (z-lab's 5 taps where the card has none).
    """

    def __init__(self, layer_ids: list[int] | None = None, num_taps: int | None = None):
        if layer_ids is not None and num_taps is not None:  # name both: one may come from an earlier config
            raise ValueError(
                f"set layer_ids or num_taps, not both (got layer_ids {list(layer_ids)} and num_taps "
                f"{num_taps}; switching class_path keeps the previous class's num_taps, set it to null)"
            )
        self.layer_ids = None if layer_ids is None else list(layer_ids)
        self.num_taps = num_taps

    def tap_ids(self, card):
        if self.layer_ids is not None:
            return validate_layer_ids(self.layer_ids, card.num_layers, "layer_ids")
        if self.num_taps is not None:
            ids = zlab_layer_ids(card.num_layers, self.num_taps)
            return validate_layer_ids(ids, card.num_layers, "num_taps")
        if card.default_tap_ids:
            field = f"default_tap_ids of target card {card.name!r}"
            return validate_layer_ids(card.default_tap_ids, card.num_layers, field)
        try:  # no card default: z-lab's 5 taps, which a shallow target cannot hold
            ids = zlab_layer_ids(card.num_layers, 5)
            return validate_layer_ids(ids, card.num_layers, f"z-lab's 5 taps over {card.num_layers} layers")
        except ValueError as e:  # the config set neither field: say so, and which ones to set
            raise ValueError(
                f"target card {card.name!r} has no default_tap_ids, and {e}; set layer_ids or num_taps"
            ) from None


@register("injection", "all_taps")
class AllTaps(_TapList):
    """Every tapped layer feeds ``fc`` (the "5-layer" case: z-lab's released drafters, the field
    reports' v6)."""


@register("injection", "all_but_last")
class AllButLast(_TapList):
    """Every tapped layer but the last feeds ``fc`` (the "4-layer" case, the field reports' v5).

    The last tapped layer is still captured, so a target source such as ``layer_logits`` can read it,
    but the drafter never sees it.
    """

    def fc_ids(self, card):
        taps = self.tap_ids(card)
        if len(taps) < 2:
            raise ValueError(f"all_but_last needs at least 2 tapped layers, got {taps}")
        return taps[:-1]


@register("injection", "custom")
class CustomInjection(Injection):
    """Any tap list and any ``fc`` subset of it.

    Args:
        taps: every layer to capture (sorted, unique).
        fc: the captured layers that enter ``fc`` (sorted, unique, a subset of ``taps``).
    """

    def __init__(self, taps: list[int], fc: list[int]):
        self.taps = list(taps)
        self.fc = list(fc)

    def tap_ids(self, card):
        return validate_layer_ids(self.taps, card.num_layers, "taps")

    def fc_ids(self, card):
        taps = self.tap_ids(card)
        fc = validate_layer_ids(self.fc, card.num_layers, "fc")
        extra = sorted(set(fc) - set(taps))
        if extra:
            raise ValueError(f"fc ids {extra} are not in taps {taps}")
        return fc
