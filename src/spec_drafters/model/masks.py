"""The drafter's attention masks, built from small predicates (component kind ``mask``).

Training layout (docs/method.md section 2.4): queries are the N*K block tokens, keys are
``[context positions 0..S-1 | all N*K block tokens]``. Query (j, k) of the block anchored at p_j, at
position q = p_j + k, may see
- context key t iff t < p_j: strictly before the anchor, because at inference the anchor is the bonus
  token whose target features do not exist yet (SpecForge PR #473 shipped ``<=``);
- on a sliding-window layer, additionally only context keys with q - t < window (the query's own
  position, as flash-attention's window counts it in z-lab's model; the window must hold the block);
- the keys of its own block: both directions by default (SpecForge PR #427 shipped a causal block
  by mistake), or slot <= k on layers declared causal inside the block;
- nothing of any other block.
Padded (unused) anchor slots see only their own block, so no softmax row is empty; their labels are
all invalid, so they never reach the loss.

The rule is written once, as a predicate over index tensors (:func:`block_rule`, narrowed per layer by
:meth:`LayerAttention.allows`); the dense masks, the block layout the kernels read and
flex_attention's ``mask_mod`` all evaluate it (tests/test_masks.py checks each against a brute force).

A mask component declares, per drafter layer, a :class:`LayerAttention` (window, causal block). The
drafter records them in its config like checkpoints' ``layer_types``, so serving builds the same rule
(:func:`inference_mask`) that training used (:func:`training_mask`); the parity test checks both.

Notation: b batch, N anchors, K block size, S context length, T block tokens at inference.
Masks are bool, True = may attend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spec_drafters.registry import register

# --- the block rule: one predicate, broadcastable index tensors in, bool tensor out ------------------
CONTEXT = -1
"""The block index of a context key (block keys belong to blocks 0..N-1)."""


@dataclass(frozen=True)
class Queries:
    """Block-token queries as index tensors (any broadcastable shapes, scalars included)."""

    block: torch.Tensor  # j
    slot: torch.Tensor  # k, 0 = the anchor
    anchor: torch.Tensor  # p_j; a padded block is anchored at 0, so no context precedes it
    pos: torch.Tensor  # the query's own position (p_j + k in training)


@dataclass(frozen=True)
class Keys:
    """Keys as index tensors: context positions (block == CONTEXT) or block tokens."""

    block: torch.Tensor  # CONTEXT, or the key's block
    slot: torch.Tensor  # the key's slot in its block (block keys only)
    pos: torch.Tensor  # the key's position (context keys only)


def context_before_anchor(anchor_pos: torch.Tensor, kv_pos: torch.Tensor) -> torch.Tensor:
    return kv_pos < anchor_pos


def within_window(q_pos: torch.Tensor, kv_pos: torch.Tensor, window: int) -> torch.Tensor:
    return q_pos - kv_pos < window


def causal_in_block(q_slot: torch.Tensor, kv_slot: torch.Tensor) -> torch.Tensor:
    return kv_slot <= q_slot


def block_rule(q: Queries, kv: Keys) -> torch.Tensor:
    """The DFlash block rule (docs/method.md section 2.4): a context key strictly before the query's
    anchor, or any key of the query's own block; nothing of another block.

    Plain tensor arithmetic without data-dependent branches, so the same function serves a dense mask
    (index grids) and flex_attention's ``mask_mod`` (scalar indices).
    """
    return ((kv.block == CONTEXT) & context_before_anchor(q.anchor, kv.pos)) | (kv.block == q.block)


@dataclass(frozen=True)
class LayerAttention:
    """What one drafter layer may attend to: the block rule, narrowed by a window or a causal block."""

    window: int | None = None  # None: the whole context before the anchor
    causal_block: bool = False  # True: slot k sees slots 0..k of its block only

    @property
    def layer_type(self) -> str:  # the name HF configs use in ``layer_types``
        return "full_attention" if self.window is None else "sliding_attention"

    def allows(self, q: Queries, kv: Keys) -> torch.Tensor:
        """The one predicate every mask builder and kernel evaluates: :func:`block_rule` and this
        layer's options (a window on the context keys, causality on the block keys)."""
        ok = block_rule(q, kv)
        context = kv.block == CONTEXT
        if self.window is not None:
            ok = ok & (~context | within_window(q.pos, kv.pos, self.window))
        if self.causal_block:
            ok = ok & (context | causal_in_block(q.slot, kv.slot))
        return ok


@dataclass
class BlockLayout:
    """The training mask of one layer kept as its rule and the anchors, never stored whole.

    Keys are ``[S context | N blocks of K]``, queries the N*K block tokens. :meth:`allows` maps
    flat indices (batch row, query, key) to the rule, elementwise (flex_attention's :attr:`mask_mod`)
    or on broadcast index grids: :meth:`mask` builds any (query rows x key columns) part of the mask,
    the ``split`` kernel only the parts a chunk of blocks can use, :meth:`dense` all of it (cached).
    """

    anchors: torch.Tensor  # (b, N) anchor positions, 0 for padded (unused) anchor slots
    seq_len: int  # S, the context keys
    block_size: int  # K
    layer: LayerAttention = LayerAttention()
    _dense: torch.Tensor | None = None
    _chunks: dict = field(default_factory=dict)  # (first, last query) -> chunk(), per layout

    @property
    def num_blocks(self) -> int:
        return self.anchors.shape[1]

    def allows(self, b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        """May query ``q_idx`` of batch row ``b`` see key ``kv_idx``? Broadcastable flat indices in."""
        k, s = self.block_size, self.seq_len
        block, slot = q_idx // k, q_idx % k
        anchor = self.anchors[b, block]
        q = Queries(block=block, slot=slot, anchor=anchor, pos=anchor + slot)
        in_ctx = kv_idx < s
        kv = Keys(block=torch.where(in_ctx, CONTEXT, (kv_idx - s) // k), slot=(kv_idx - s) % k, pos=kv_idx)
        return self.layer.allows(q, kv)

    @property
    def mask_mod(self):
        """:meth:`allows` with flex_attention's ``mask_mod(b, h, q_idx, kv_idx)`` signature (a plain
        function: flex_attention tells a mask_mod from a score_mod by counting its arguments)."""

        def mask_mod(b, h, q_idx, kv_idx):
            return self.allows(b, q_idx, kv_idx)

        return mask_mod

    def mask(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """(b, 1, R, C): the mask at query indices ``rows`` (R,) and key indices ``cols`` (C,)."""
        batch = torch.arange(self.anchors.shape[0], device=self.anchors.device)
        return self.allows(batch[:, None, None, None], rows[:, None], cols[None])  # (b, 1, R, C)

    def chunk(self, rows: slice) -> tuple[int, torch.Tensor]:
        """For the queries ``rows`` (whole blocks): how many context keys they can reach (at least 1,
        so shapes never vanish), and their mask over [those keys | their own blocks' keys], of shape
        (b, 1, R, reach + R). Built once per layout: every layer with this rule, and the backward of
        each, reuse it (the ``split`` kernel's parts)."""
        key = (rows.start, rows.stop)
        if key not in self._chunks:
            device, s = self.anchors.device, self.seq_len
            queries = torch.arange(rows.start, rows.stop, device=device)  # (R,)
            context = self.mask(queries, torch.arange(s, device=device))  # (b, 1, R, S)
            seen = context.flatten(0, 2).any(dim=0)  # (S,)
            reach = max(int(torch.where(seen, torch.arange(1, s + 1, device=device), 0).amax()), 1)
            own = self.mask(queries, s + queries)  # (b, 1, R, R)
            self._chunks[key] = reach, torch.cat([context[..., :reach], own], dim=-1)  # (b, 1, R, reach + R)
        return self._chunks[key]

    def dense(self) -> torch.Tensor:
        """(b, 1, N*K, S + N*K): the mask as one tensor, as :func:`training_mask` returns it."""
        if self._dense is None:
            q = self.num_blocks * self.block_size
            device = self.anchors.device
            self._dense = self.mask(
                torch.arange(q, device=device), torch.arange(self.seq_len + q, device=device)
            )
        return self._dense


def as_dense(mask) -> torch.Tensor | None:
    """A kernel's mask argument (tensor, :class:`BlockLayout` or None) as a dense tensor or None."""
    return mask.dense() if isinstance(mask, BlockLayout) else mask


def training_layout(
    anchors: torch.Tensor,  # (b, N) anchor positions
    anchor_valid: torch.Tensor,  # (b, N) bool
    seq_len: int,
    block_size: int,
    layer: LayerAttention = LayerAttention(),
) -> BlockLayout:
    """The training mask of one layer kind in block form (:func:`training_mask` is its ``.dense()``).

    A padded anchor slot is anchored at position 0: no context lies strictly before it, so it sees
    its own block only and no softmax row is empty.
    """
    return BlockLayout(torch.where(anchor_valid, anchors, 0), seq_len, block_size, layer)


def training_mask(
    anchors: torch.Tensor,  # (b, N) anchor positions
    anchor_valid: torch.Tensor,  # (b, N) bool
    seq_len: int,
    block_size: int,
    layer: LayerAttention = LayerAttention(),
) -> torch.Tensor:
    """The dense (b, 1, N*K, S + N*K) training mask of one layer kind."""
    return training_layout(anchors, anchor_valid, seq_len, block_size, layer).dense()


def inference_mask(ctx_len: int, block_positions: torch.Tensor, layer: LayerAttention) -> torch.Tensor | None:
    """The serving mask (b, 1, T, S + T) for one block after S committed context positions.

    ``None`` when the layer may see everything (full attention, bidirectional block): the kernels'
    fast path. Otherwise the training layout of a single block anchored at its first position (the
    bonus token, at S when decoding; ``block_positions`` run on from it, as in training).
    """
    if layer.window is None and not layer.causal_block:
        return None
    return BlockLayout(block_positions[:, :1], ctx_len, block_positions.shape[1], layer).dense()


class DrafterMask:
    """Base class of the ``mask`` kind: the attention rule of every drafter layer."""

    component_kind = "mask"

    def per_layer(self, num_layers: int) -> list[LayerAttention]:
        raise NotImplementedError

    def training_mask(self, anchors, anchor_valid, seq_len: int, block_size: int, layer: LayerAttention):
        """The dense training mask of one layer rule (b, 1, N*K, S + N*K); see :func:`training_mask`."""
        return training_mask(anchors, anchor_valid, seq_len, block_size, layer)

    def training_layout(
        self, anchors, anchor_valid, seq_len: int, block_size: int, layer: LayerAttention
    ) -> BlockLayout:
        """The same mask in block form (what training passes to the kernels); see :class:`BlockLayout`."""
        return training_layout(anchors, anchor_valid, seq_len, block_size, layer)


@register("mask", "dflash_block")
class DFlashBlockMask(DrafterMask):
    """The DFlash mask on every layer: context strictly before the anchor, own block bidirectional."""

    def per_layer(self, num_layers):
        return [LayerAttention()] * num_layers


@register("mask", "causal_block")
class CausalBlockMask(DrafterMask):
    """Causal inside the block on every layer (an ablation: the paper's block is bidirectional)."""

    def per_layer(self, num_layers):
        return [LayerAttention(causal_block=True)] * num_layers


@register("mask", "sliding_window")
class SlidingWindowMask(DrafterMask):
    """Sliding-window attention over the context on chosen drafter layers, full on the others.

    z-lab's Qwen3.6-27B drafter: layers 0-3 of 5 sliding with window 2048, the last one full; the
    seeds' experiment-ddtree copied that.

    Args:
        window: context positions within reach of a query (q - t < window); at least the block size.
        layers: drafter layer indices that slide; negative counts from the end.
        causal_block: make the sliding layers causal inside the block (newer checkpoints' ``is_causal``).
    """

    def __init__(self, window: int = 2048, layers: list[int] | None = None, causal_block: bool = False):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.layers = None if layers is None else list(layers)
        self.causal_block = causal_block

    def per_layer(self, num_layers):
        chosen = self.layers if self.layers is not None else list(range(num_layers - 1))
        resolved = [i + num_layers if i < 0 else i for i in chosen]
        bad = [i for i, r in zip(chosen, resolved, strict=True) if not 0 <= r < num_layers]
        if bad:
            raise ValueError(f"layers has {bad}, outside the drafter's {num_layers} layers")
        slide = LayerAttention(window=self.window, causal_block=self.causal_block)
        return [slide if i in resolved else LayerAttention() for i in range(num_layers)]
