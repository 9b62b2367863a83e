"""Attention kernels (component kind ``attention``): one signature, chosen by name, eager is the reference.

Signature: ``fn(q, k, v, mask, scale) -> out`` with
    q (b, h, Tq, d), k and v (b, hk, Tk, d) where h is a multiple of hk (GQA),
    mask (b, 1, Tq, Tk) bool, True = may attend, or None (every key allowed),
    out (b, h, Tq, d).
Every row of a mask must allow at least one key (the DFlash mask always allows a query's own block).

flex_attention is deliberately absent here: in torch 2.13 it has no backward on CPU, and CPU training
must work. Its GPU path belongs with the block-sparse backends (issue 7).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v)  # (b, h, Tq, d)


@register("attention", "sdpa")
def sdpa_attention(q, k, v, mask, scale):
    """PyTorch's fused scaled-dot-product attention (math or memory-efficient kernel on CPU)."""
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (b, h, Tk, d)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # (b, h, Tq, d)


def get_attention(name: str):
    return lookup("attention", name)
