"""Attention kernels (component kind ``attention``): one signature, chosen by name, eager is the reference.

Signature: ``fn(q, k, v, mask, scale) -> out`` with
    q (b, h, Tq, d), k and v (b, hk, Tk, d) where h is a multiple of hk (GQA),
    mask (b, 1, Tq, Tk) bool, True = may attend, or None (every key allowed), or a
    :class:`~spec_drafters.model.masks.BlockLayout` (training: the mask in its context and in-block parts),
    out (b, h, Tq, d).
Every row of a mask must allow at least one key (the DFlash mask always allows a query's own block).

Cost in DFlash training (N blocks of K queries, S context keys): the dense kernels (``eager``, ``sdpa``)
score N*K*(S + N*K) pairs although only N*K*(S + K) can be allowed (issue 7: about 9x at N=1024, K=32,
S=4096); ``split`` (the default) runs chunks of blocks against the context prefix they can reach and
their own keys only, about N*K*(S/2 + 256) pairs, each chunk one fused SDPA call; ``flex`` hands the
block layout to flex_attention, which skips empty tiles on GPU (in torch 2.13 no backward on CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from spec_drafters.model.masks import BlockLayout, as_dense
from spec_drafters.registry import lookup, register


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return x
    b, hk, t, d = x.shape
    return x[:, :, None].expand(b, hk, groups, t, d).reshape(b, hk * groups, t, d)  # (b, h, T, d)


@register("attention", "eager")
def eager_attention(q, k, v, mask, scale):
    """The reference: explicit scores, softmax in at least fp32, masked entries at -inf."""
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (b, h, Tk, d)
    wide = torch.promote_types(q.dtype, torch.float32)  # fp32 softmax, fp64 stays fp64
    scores = torch.matmul(q, k.transpose(-1, -2)).to(wide) * scale  # (b, h, Tq, Tk)
    mask = as_dense(mask)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v)  # (b, h, Tq, d)


@register("attention", "sdpa")
def sdpa_attention(q, k, v, mask, scale):
    """PyTorch's fused scaled-dot-product attention (math or memory-efficient kernel on CPU)."""
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (b, h, Tk, d)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=as_dense(mask), scale=scale)  # (b, h, Tq, d)


#: Queries per chunk of the ``split`` kernel: a chunk of c = this // K blocks attends to the context
#: its blocks can reach plus the c*K keys of its own blocks (c - 1 of them masked per query).
SPLIT_CHUNK_QUERIES = 256


@register("attention", "split")
def split_attention(q, k, v, mask, scale):
    """Exact DFlash attention over only the keys a chunk of blocks can use: O(N*K*(S + C)), C = 256.

    For a :class:`BlockLayout`, blocks go in chunks of consecutive blocks (about SPLIT_CHUNK_QUERIES
    queries). A chunk attends to the context prefix its blocks can reach (anchors are sorted, so
    early blocks reach few keys: about half the context on average) and to its own blocks' keys; the
    keys of every other block are always masked, so leaving them out changes nothing. Each chunk is
    one fused ``scaled_dot_product_attention`` call with the chunk's part of the mask, so scores are
    never stored (the fused kernels recompute them in backward). Against the dense kernels, which
    score N*K*(S + N*K) pairs, this scores about N*K*(S/2 + C). Any other mask (serving: one block)
    goes to ``sdpa`` directly.
    """
    if not isinstance(mask, BlockLayout):
        return sdpa_attention(q, k, v, mask, scale)
    b, h, nq, _ = q.shape
    kk, n = mask.block_size, mask.num_blocks
    s = k.shape[2] - nq
    groups = h // k.shape[1]
    # Context keys block j can reach: 1 + its last allowed key, over the batch (0: none).
    allowed = mask.context.view(b, n, kk, s).any(dim=2).any(dim=0)  # (N, S)
    last = torch.where(allowed, torch.arange(1, s + 1, device=q.device), 0).amax(dim=1)  # (N,)
    per_chunk = max(1, SPLIT_CHUNK_QUERIES // kk)
    same = torch.eye(per_chunk, dtype=torch.bool, device=q.device)  # (c, c) block-diagonal pattern
    own = (same[:, None, :, None] & mask.in_block[None, :, None, :]).reshape(per_chunk * kk, per_chunk * kk)
    outs = []
    for j in range(0, n, per_chunk):
        c = min(per_chunk, n - j)
        reach = max(int(last[j : j + c].max()), 1)  # keep one (masked) context key: shapes never vanish
        rows = slice(j * kk, (j + c) * kk)
        keys = slice(s + j * kk, s + (j + c) * kk)
        kc = torch.cat([k[:, :, :reach], k[:, :, keys]], dim=2)  # (b, hk, reach + cK, d)
        vc = torch.cat([v[:, :, :reach], v[:, :, keys]], dim=2)
        blk = own[: c * kk, : c * kk].expand(b, 1, c * kk, c * kk)
        chunk_mask = torch.cat([mask.context[:, :, rows, :reach], blk], dim=-1)  # (b, 1, cK, reach + cK)
        kc, vc = repeat_kv(kc, groups), repeat_kv(vc, groups)  # (b, h, reach + cK, d)
        outs.append(F.scaled_dot_product_attention(q[:, :, rows], kc, vc, attn_mask=chunk_mask, scale=scale))
    return torch.cat(outs, dim=2)  # (b, h, Q, d)


_flex_compiled = None


@register("attention", "flex")
def flex_attention_kernel(q, k, v, mask, scale):
    """torch's flex_attention with a block mask built from the layout's predicate (GPU training).

    The mask_mod reads the layout: context keys through its (b, Q, S) table, block keys by
    same-block and the (K, K) in-block rule, so tiles with no allowed pair are skipped. Compiled on
    CUDA (flex_attention's fast path); on CPU it runs uncompiled and forward only in torch 2.13.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    global _flex_compiled
    b, h, nq, _ = q.shape
    nk = k.shape[2]
    layout = mask
    if layout is not None and not isinstance(layout, BlockLayout):  # a dense mask: read it directly
        dense = layout

        def mask_mod(bi, hi, qi, ki):
            return dense[bi, 0, qi, ki]
    elif layout is None:

        def mask_mod(bi, hi, qi, ki):
            return qi >= 0
    else:
        ctx, in_block, kk = layout.context, layout.in_block, layout.block_size
        s = nk - nq

        def mask_mod(bi, hi, qi, ki):
            in_ctx = ki < s
            kc = torch.clamp(ki, max=s - 1)
            kb = torch.clamp(ki - s, min=0)
            see_ctx = in_ctx & ctx[bi, 0, qi, kc]
            see_own = ~in_ctx & (qi // kk == kb // kk) & in_block[qi % kk, kb % kk]
            return see_ctx | see_own

    device = q.device
    block = create_block_mask(mask_mod, b, None, nq, nk, device=device)
    fn = flex_attention
    if device.type == "cuda":
        if _flex_compiled is None:
            _flex_compiled = torch.compile(flex_attention, dynamic=False)
        fn = _flex_compiled
    groups = h // k.shape[1]
    return fn(q, k, v, block_mask=block, scale=scale, enable_gqa=groups > 1)  # (b, h, Q, d)


def get_attention(name: str):
    return lookup("attention", name)
