"""Decoding kernels: frozen ``nn.Linear`` layers on oneDNN with weights packed once (CPU, fp32/bf16).

Why (benchmarks/round_profile.py, benchmarks/README.md "round_profile"): on this project's CPU the
stock ``F.linear`` goes to MKL, whose one-row product (a matrix-vector kernel) streams the weights
at a few GB/s and whose 2-to-16-row product is a general matrix product that costs 1.5-2x the
one-row one, although both are bound by reading the same weights. A K-token verify forward
therefore cost 1.6-2 greedy steps. oneDNN's linear with the weight reordered once into its blocked
layout (what inductor's CPU "freezing" does with bf16 or dynamic shapes) costs about the same for
1 to 8 rows: the one-token step gets a little faster, and an 8-token forward costs 1.25 of it.

Exact in the sense decoding needs: the same fp32 products, summed in another order (logits differ
by ~1e-5 relative, as MKL's one-row and many-row kernels already differ from each other); greedy
and speculative decoding both run on it, so the speedup comparison stays fair.

The packed copy is made once per weight (and again only if the weight changes in place, e.g. a
drafter that keeps training between evaluations) and kept beside the module: one more copy
of the linear weights in memory. Only CPU weights in float32 or bfloat16 of at least
``MIN_WEIGHT_ELEMENTS`` are packed; anything else (CUDA, float64 or tiny test targets) keeps its
``nn.Linear``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
from torch import nn

BATCH_HINT = 8
"""Row count the packed layout is chosen for; measured on 1..33 rows, 2-64 all within noise, 1 slower."""
MIN_WEIGHT_ELEMENTS = 1 << 16
"""Smaller weights stay on ``nn.Linear``: oneDNN's per-call cost outweighs a 32-wide test model's product."""


_PACKS: weakref.WeakKeyDictionary[nn.Module, dict[str, PackedLinear]] = weakref.WeakKeyDictionary()
"""parent module -> child name -> its pack; kept outside the modules (copies, checkpoints never see it)."""


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """A frozen ``nn.Linear`` (no grad) whose product runs on oneDNN with a prepacked weight."""

    def __init__(self, linear: nn.Linear, batch_hint: int = BATCH_HINT):
        super().__init__()
        self.linear = linear  # the original: shares its weight and bias, restored on exit
        self.key = _key(linear.weight)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)

    @property
    def weight(self) -> torch.Tensor:  # readers of the head's rows (a draft vocabulary) see the original
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.linear.weight.requires_grad):
            return self.linear(x)  # oneDNN's op has no backward; never taken when decoding
        bias = None if self.linear.bias is None else self.linear.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, bias, "none", [], "")


def _key(weight: torch.Tensor) -> tuple[int, int]:
    return weight.data_ptr(), weight._version  # a new tensor or an in-place update means repack


def packable(linear: nn.Linear) -> bool:
    w = linear.weight
    return (
        w.device.type == "cpu"
        and w.dtype in (torch.float32, torch.bfloat16)
        and not w.is_meta
        and w.numel() >= MIN_WEIGHT_ELEMENTS
    )


@contextlib.contextmanager
def packed_linears(*modules: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Inside the block, every packable ``nn.Linear`` under ``modules`` runs as a :class:`PackedLinear`.

    Packs are cached per parent module (weakly, outside it) and reused by later blocks; the
    original ``nn.Linear`` objects are put back on exit, so training code never sees the swap.
    Nested or repeated use of the same module is allowed (an inner block finds nothing to swap).
    """
    if not enabled or not available():
        yield
        return
    swapped: list[tuple[nn.Module, str, nn.Linear]] = []
    try:
        for root in modules:
            for parent in list(root.modules()):
                if isinstance(parent, PackedLinear):  # already swapped (a nested block)
                    continue
                cache = _PACKS.setdefault(parent, {})
                for name, child in list(parent.named_children()):
                    if not isinstance(child, nn.Linear) or not packable(child):
                        continue
                    packed = cache.get(name)
                    if packed is None or packed.linear is not child or packed.key != _key(child.weight):
                        packed = cache[name] = PackedLinear(child)
                    setattr(parent, name, packed)
                    swapped.append((parent, name, child))
        yield
    finally:
        for parent, name, child in reversed(swapped):
            setattr(parent, name, child)
