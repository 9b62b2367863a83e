"""Verification on hybrid targets: Gated-DeltaNet (linear attention) layers beside full attention.

A Gated-DeltaNet layer (Yang et al., arXiv:2412.06464; Qwen3.5/3.6's ``linear_attention`` layers) keeps
no per-token keys and values: its cache is a convolution window (the last ``kernel`` pre-convolution
inputs) and one recurrent state per head. Two things of the plain verify break on it
(docs/hybrid_targets.md): the layer ignores the tree mask (a node would read its siblings), and a
rejected draft cannot be cut off (``crop`` has no per-token state to go back to). So, on a hybrid
target, each verify forward runs these layers through :func:`tree_forward` instead:

- every node of the tree (the bonus first) in ONE forward, as one chunk of the chunked gated delta
  rule with the ancestor mask in place of the causal mask and the decays summed along each node's
  path; the convolution window of a node is gathered along its path;
- nothing is written into the layers' cache during the verify; after acceptance :func:`commit` sets
  each layer's window and state to those after the accepted path (the state at the path's last node
  is a rank-|path| update of the state before the round) and compacts the attention layers' KV.

A chain is the tree whose nodes each have one child: chain and DDTree share this path.

Notation: T verified tokens (the bonus and the nodes), H value heads, dk/dv key/value head sizes,
C convolution channels, kern the convolution kernel, P the committed positions before the round.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from spec_drafters.errors import InputError
from spec_drafters.target.frozen import keep_layer

# The Gated-DeltaNet modules whose forward tree_forward replaces (same attributes, same maths).
SUPPORTED = ("Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")


def _linear_mixin():
    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin
    except ImportError:  # a transformers without linear-attention caches: no layer is one
        return None
    return LinearAttentionCacheLayerMixin


def is_hybrid(cache) -> bool:
    """Whether a target cache has linear-attention (recurrent) layers."""
    mixin = _linear_mixin()
    return mixin is not None and any(isinstance(layer, mixin) for layer in cache.layers)


def check_rollback(target, cache) -> None:
    """Refuses, in one message, a target whose cache this decoder cannot roll back: recurrent layers
    other than the supported Gated-DeltaNet ones, and attention caches other than a plain growing KV
    (a sliding window drops positions a rejected draft's crop or a tree's compaction would need)."""
    for i, layer in enumerate(getattr(cache, "layers", [])):
        kind = type(layer).__name__
        if kind not in ("DynamicLayer", "LinearAttentionLayer") and (
            _linear_mixin() is None or not isinstance(layer, _linear_mixin())
        ):
            raise InputError(
                f"speculative decoding cannot roll back this target's layer {i} (cache {kind}): it "
                "verifies drafts on full-attention layers with a growing KV cache (DynamicLayer) and on "
                f"the Gated-DeltaNet layers of {', '.join(SUPPORTED)} only; decode this target with plain "
                "greedy decoding (no drafter), or use a target of a supported architecture"
            )
    if not is_hybrid(cache):
        if gdn_modules(target):  # a transformers whose cache keeps these states elsewhere
            raise InputError(
                f"this target has Gated-DeltaNet layers, but its cache ({type(cache).__name__}) has no "
                "linear-attention layers to roll back: speculative decoding needs transformers' "
                "LinearAttentionLayer cache (tested with 5.25); upgrade transformers, or decode this "
                "target with plain greedy decoding"
            )
        return
    mixin = _linear_mixin()
    for i, layer in enumerate(cache.layers):
        if not isinstance(layer, mixin):
            continue
        module = getattr(target.base.layers[i], "linear_attn", None)
        kind = type(module).__name__ if module is not None else type(target.base.layers[i]).__name__
        if type(layer).__name__ != "LinearAttentionLayer" or kind not in SUPPORTED:
            raise InputError(
                f"speculative decoding cannot roll back this target's layer {i} ({kind}, cache "
                f"{type(layer).__name__}): it verifies drafts on attention layers and on the "
                f"Gated-DeltaNet layers of {', '.join(SUPPORTED)} only; decode this target with plain "
                "greedy decoding (no drafter), or use a target of a supported architecture"
            )


def gdn_modules(target) -> list[torch.nn.Module]:
    """The target's Gated-DeltaNet modules of a supported class, in layer order."""
    modules = (getattr(layer, "linear_attn", None) for layer in target.base.layers)
    return [m for m in modules if type(m).__name__ in SUPPORTED]


class TreeRecord:
    """The verified tree's shape, and per layer what :func:`commit` needs (filled by the forward)."""

    def __init__(self, parents: list[int]):
        t = len(parents)
        sees = torch.zeros((t, t), dtype=torch.bool)  # sees[i, j]: j is i or an ancestor of i
        for i, p in enumerate(parents):  # parents come before children
            if p >= 0:
                sees[i] = sees[p]
            sees[i, i] = True
        self.parents, self.ancestors = parents, sees
        self.layers: dict[int, tuple] = {}  # layer index -> (pre-conv inputs (1, C, T), delta-rule record)


@contextlib.contextmanager
def tree_forward(target, parents: list[int]) -> Iterator[TreeRecord]:
    """Inside the block, the target's Gated-DeltaNet layers verify the tree ``parents`` (root first,
    its parent -1) without touching their cache; the record is for :func:`commit`."""
    record = TreeRecord(parents)
    modules = gdn_modules(target)
    for m in modules:  # an instance attribute shadows the class's forward; removed on exit
        m.forward = types.MethodType(_tree_gdn_forward, m)
        m._tree_record = record
    try:
        yield record
    finally:
        for m in modules:
            del m.forward, m._tree_record


def _conv_along_paths(module, window: torch.Tensor, mixed: torch.Tensor, parents: list[int]) -> torch.Tensor:
    """The causal depthwise convolution of each node over its own path.
    window (1, C, kern): the committed inputs; mixed (1, C, T) -> activated outputs (T, C)."""
    kern = module.conv_kernel_size
    seq = torch.cat([window[..., 1:], mixed], dim=-1)[0]  # (C, kern-1+T): context tail, then nodes
    taps: list[list[int]] = []  # taps[n]: indices into seq feeding node n, oldest first
    for n, p in enumerate(parents):
        taps.append((list(range(kern - 1)) if p < 0 else taps[p][1:]) + [kern - 1 + n])
    gathered = seq[:, torch.tensor(taps, device=seq.device)]  # (C, T, kern)
    out = (gathered * module.conv1d.weight.squeeze(1)[:, None, :]).sum(-1)  # (C, T)
    if module.conv1d.bias is not None:
        out = out + module.conv1d.bias[:, None]
    return F.silu(out).T  # Qwen3.5's GDN activation (hidden_act "silu")


def _tree_gdn_forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    """Qwen3_5GatedDeltaNet.forward for a tree (b = 1): same projections, norm and output as the stock
    forward; the convolution and the delta rule follow each node's path. The attention mask is not
    needed: the ancestor mask is the record's."""
    record: TreeRecord = self._tree_record
    _, t, _ = hidden_states.shape
    layer = cache.layers[self.layer_idx]
    mixed = self.in_proj_qkv(hidden_states).transpose(1, 2)  # (1, C, T) pre-conv
    z = self.in_proj_z(hidden_states).reshape(t, -1, self.head_v_dim)  # (T, H, dv)
    conv = _conv_along_paths(self, layer.conv_states[0], mixed, record.parents)  # (T, C)
    q, k, v = torch.split(conv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    rep = self.num_v_heads // self.num_k_heads  # each key head serves rep value heads
    # The state's dtype is what the stock kernels compute in (float32 for any model dtype).
    sd = layer.recurrent_states[0].dtype
    q = q.reshape(t, -1, self.head_k_dim).repeat_interleave(rep, 1).to(sd)  # (T, H, dk)
    k = k.reshape(t, -1, self.head_k_dim).repeat_interleave(rep, 1).to(sd)
    v = v.reshape(t, -1, self.head_v_dim).to(sd)  # (T, H, dv)
    q, k = _l2norm(q) / self.head_k_dim**0.5, _l2norm(k)
    beta = self.in_proj_b(hidden_states)[0].sigmoid().to(sd)  # (T, H)
    a = self.in_proj_a(hidden_states)[0].float()  # (T, H)
    g = (-self.A_log.float().exp() * F.softplus(a + self.dt_bias)).to(sd)  # log decay, as the stock forward
    out, rule = tree_delta_rule(q, k, v, g, beta, record.ancestors, layer.recurrent_states[0][0])
    record.layers[self.layer_idx] = (mixed, rule)
    core = self.norm(out.to(hidden_states.dtype).reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(1, t, -1))


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # as FLA's and transformers' l2norm


def tree_delta_rule(q, k, v, g, beta, ancestors, s0):
    """The gated delta rule over a tree, as one chunk of the chunked algorithm (Yang et al.,
    arXiv:2412.06464, section 3; transformers' ``torch_chunk_gated_delta_rule``) with the causal mask
    replaced by the ancestor mask: each row of the triangular system involves only the node's
    ancestors, so every node gets what the chunked rule gives on its own root path.

    q, k (T, H, dk) l2-normed, q scaled; v (T, H, dv); g, beta (T, H); ancestors (T, T) bool; s0 (H, dk, dv).
    Returns the outputs (T, H, dv) and the record :func:`state_at` needs.
    """
    m = ancestors.to(q.device)
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # (H, T, .)
    g, beta = g.T, beta.T  # (H, T)
    cum = (g[:, None, :] * m[None].to(g.dtype)).sum(-1)  # (H, T): decay summed along the path, node included
    # Mask before exp: an off-path difference can be large and positive (inf * 0 = NaN in float32).
    pair = (cum[:, :, None] - cum[:, None, :]).masked_fill(~m, float("-inf")).exp()  # (H, T, T)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    # The WY form's I + L: the solve reads the strict lower part (ancestors only), its diagonal as 1.
    ut = (k_beta @ k.transpose(-1, -2)) * pair  # (H, T, T)

    def solve(rhs: torch.Tensor) -> torch.Tensor:
        return torch.linalg.solve_triangular(ut, rhs, upper=False, unitriangular=True)

    v_new = solve(v_beta) - solve(k_beta * cum.exp()[..., None]) @ s0  # (H, T, dv): corrected values
    out = (q * cum.exp()[..., None]) @ s0 + ((q @ k.transpose(-1, -2)) * pair) @ v_new  # (H, T, dv)
    return out.transpose(0, 1), (cum, v_new, k, m)


def state_at(node: int, s0: torch.Tensor, rule) -> torch.Tensor:
    """The recurrent state after ``node`` (H, dk, dv): s0 decayed along the path, plus one rank-1 term
    per node of the path, S_n = exp(c_n) S_0 + sum_{j in path(n)} exp(c_n - c_j) k_j v_new_j^T."""
    cum, v_new, k, m = rule
    w = (cum[:, node : node + 1] - cum).masked_fill(~m[node], float("-inf")).exp()  # (H, T), off-path 0
    return cum[:, node].exp()[:, None, None] * s0 + (k * w[..., None]).transpose(-1, -2) @ v_new


def commit(cache, record: TreeRecord, start: int, path: list[int]) -> None:
    """The cache after the accepted ``path`` (indices of the verified tokens, the root 0 first):
    recurrent layers get the path's window and state, attention layers keep positions 0..start-1 and
    the path's (as generate.keep_cache does for a plain target)."""
    mixin = _linear_mixin()
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, mixin):
            mixed, rule = record.layers[i]
            kern = layer.conv_kernel_size[0]
            idx = torch.tensor(path, device=mixed.device)
            window = torch.cat([layer.conv_states[0], mixed.index_select(-1, idx)], dim=-1)[..., -kern:]
            layer.conv_states[0].copy_(window)  # in place: the cache keeps its tensors' addresses
            layer.recurrent_states[0].copy_(state_at(path[-1], layer.recurrent_states[0][0], rule)[None])
            layer.cumulative_length_linear.add_(len(path))
        else:
            keep_layer(layer, start, path)
