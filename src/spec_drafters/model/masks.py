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

A mask component declares, per drafter layer, a :class:`LayerAttention` (window, causal block). The
drafter records them in its config like checkpoints' ``layer_types``, so serving builds the same rule
(:func:`inference_mask`) that training used (:func:`training_mask`); the parity test checks both.

Notation: b batch, N anchors, K block size, S context length, T block tokens at inference.
Masks are bool, True = may attend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_drafters.registry import register


# --- predicates: broadcastable index tensors in, bool tensor out ------------------------------------
def context_before_anchor(anchor_pos: torch.Tensor, kv_pos: torch.Tensor) -> torch.Tensor:
    return kv_pos < anchor_pos


def within_window(q_pos: torch.Tensor, kv_pos: torch.Tensor, window: int) -> torch.Tensor:
    return q_pos - kv_pos < window


def same_block(q_block: torch.Tensor, kv_block: torch.Tensor) -> torch.Tensor:
    return q_block == kv_block


def causal_in_block(q_slot: torch.Tensor, kv_slot: torch.Tensor) -> torch.Tensor:
    return kv_slot <= q_slot


@dataclass(frozen=True)
class LayerAttention:
    """What one drafter layer may attend to, beyond the always-applied DFlash rules."""

    window: int | None = None  # None: the whole context before the anchor
    causal_block: bool = False  # True: slot k sees slots 0..k of its block only

    @property
    def layer_type(self) -> str:  # the name HF configs use in ``layer_types``
        return "full_attention" if self.window is None else "sliding_attention"


def training_mask(
    anchors: torch.Tensor,  # (b, N) anchor positions
    anchor_valid: torch.Tensor,  # (b, N) bool
    seq_len: int,
    block_size: int,
    layer: LayerAttention = LayerAttention(),
) -> torch.Tensor:
    """The dense (b, 1, N*K, S + N*K) training mask of one layer kind (the block layout, spelled out)."""
    return training_layout(anchors, anchor_valid, seq_len, block_size, layer).dense()


@dataclass
class BlockLayout:
    """The training mask of one layer kept in its two parts, so kernels need not build the dense one.

    Keys are ``[S context | N blocks of K]``. A query may see context keys where ``context`` says so,
    keys of its own block where ``in_block`` says so, and nothing of other blocks. Stored that way the
    mask costs N*K*S + K*K instead of N*K*(S + N*K): the block-sparse kernels (``split``, ``flex``)
    read the parts, the dense kernels call :meth:`dense` (built once, then cached).
    """

    context: torch.Tensor  # (b, 1, N*K, S) bool
    in_block: torch.Tensor  # (K, K) bool, the same for every block
    block_size: int
    _dense: torch.Tensor | None = None

    @property
    def num_blocks(self) -> int:
        return self.context.shape[2] // self.block_size

    def dense(self) -> torch.Tensor:
        """(b, 1, N*K, S + N*K): the mask as one tensor, as :func:`training_mask` returns it."""
        if self._dense is None:
            b, _, q, _ = self.context.shape
            n = self.num_blocks
            same = torch.eye(n, dtype=torch.bool, device=self.context.device)  # (N, N)
            blk = (same[:, None, :, None] & self.in_block[None, :, None, :]).reshape(q, q)  # (Q, Q)
            self._dense = torch.cat([self.context, blk[None, None].expand(b, 1, q, q)], dim=-1)
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
    """The training mask of one layer kind in block form (:func:`training_mask` is its ``.dense()``)."""
    n = anchors.shape[1]
    device = anchors.device
    q_block = torch.arange(n, device=device).repeat_interleave(block_size)  # (Q,)
    q_slot = torch.arange(block_size, device=device).repeat(n)  # (Q,)
    q_anchor = anchors[:, q_block]  # (b, Q)
    kv_pos = torch.arange(seq_len, device=device)  # (S,)
    ctx = context_before_anchor(q_anchor[:, :, None], kv_pos[None, None, :])  # (b, Q, S)
    if layer.window is not None:
        ctx = ctx & within_window((q_anchor + q_slot)[:, :, None], kv_pos[None, None, :], layer.window)
    ctx = ctx & anchor_valid[:, q_block][:, :, None]
    slot = torch.arange(block_size, device=device)
    in_block = torch.ones((block_size, block_size), dtype=torch.bool, device=device)
    if layer.causal_block:
        in_block = causal_in_block(slot[:, None], slot[None, :])  # (K, K)
    return BlockLayout(ctx[:, None], in_block, block_size)


def inference_mask(ctx_len: int, block_positions: torch.Tensor, layer: LayerAttention) -> torch.Tensor | None:
    """The serving mask (b, 1, T, S + T) for one block after S committed context positions.

    ``None`` when the layer may see everything (full attention, bidirectional block): the kernels'
    fast path. The block's first token is the anchor (the bonus), at position S.
    """
    if layer.window is None and not layer.causal_block:
        return None
    b, t = block_positions.shape
    device = block_positions.device
    kv_pos = torch.arange(ctx_len, device=device)  # (S,)
    ctx = torch.ones((b, t, ctx_len), dtype=torch.bool, device=device)
    if layer.window is not None:
        ctx = within_window(block_positions[:, :, None], kv_pos[None, None, :], layer.window)  # (b, T, S)
    slot = torch.arange(t, device=device)
    blk = torch.ones((t, t), dtype=torch.bool, device=device)
    if layer.causal_block:
        blk = causal_in_block(slot[:, None], slot[None, :])  # (T, T)
    return torch.cat([ctx, blk[None].expand(b, -1, -1)], dim=-1)[:, None]  # (b, 1, T, S + T)


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
            raise ValueError(f"--model.mask.init_args.window must be >= 1, got {window}")
        self.window = window
        self.layers = None if layers is None else list(layers)
        self.causal_block = causal_block

    def per_layer(self, num_layers):
        chosen = self.layers if self.layers is not None else list(range(num_layers - 1))
        resolved = [i + num_layers if i < 0 else i for i in chosen]
        bad = [i for i, r in zip(chosen, resolved, strict=True) if not 0 <= r < num_layers]
        if bad:
            raise ValueError(
                f"--model.mask.init_args.layers has {bad}, outside the drafter's {num_layers} layers"
            )
        slide = LayerAttention(window=self.window, causal_block=self.causal_block)
        return [slide if i in resolved else LayerAttention() for i in range(num_layers)]
