"""Attention kernels (component kind ``attention``): one signature, chosen by name, eager is the reference.

Signature: ``fn(q, k, v, mask, scale) -> out`` with
    q (b, h, Tq, d), k and v (b, hk, Tk, d) where h is a multiple of hk (GQA),
    mask (b, 1, Tq, Tk) bool, True = may attend, or None (every key allowed), or a
    :class:`~spec_drafters.model.masks.BlockLayout` (training: the mask as its rule and the anchors),
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
    one fused ``scaled_dot_product_attention`` call with the chunk's part of the mask, evaluated from
    the layout's rule, so scores are never stored (the fused kernels recompute them in backward).
    Against the dense kernels, which score N*K*(S + N*K) pairs, this scores about N*K*(S/2 + C). Any
    other mask (serving: one block) goes to ``sdpa`` directly.
    """
    if not isinstance(mask, BlockLayout):
        return sdpa_attention(q, k, v, mask, scale)
    kk, n, s = mask.block_size, mask.num_blocks, mask.seq_len
    groups = q.shape[1] // k.shape[1]
    per_chunk = max(1, SPLIT_CHUNK_QUERIES // kk)
    outs = []
    for j in range(0, n, per_chunk):
        rows = slice(j * kk, min(j + per_chunk, n) * kk)  # the chunk's queries
        own = slice(s + rows.start, s + rows.stop)  # and their blocks' keys
        reach, chunk_mask = mask.chunk(rows)  # (b, 1, cK, reach + cK)
        kc = torch.cat([k[:, :, :reach], k[:, :, own]], dim=2)  # (b, hk, reach + cK, d)
        vc = torch.cat([v[:, :, :reach], v[:, :, own]], dim=2)
        kc, vc = repeat_kv(kc, groups), repeat_kv(vc, groups)  # (b, h, reach + cK, d)
        outs.append(F.scaled_dot_product_attention(q[:, :, rows], kc, vc, attn_mask=chunk_mask, scale=scale))
    return torch.cat(outs, dim=2)  # (b, h, Q, d)


#: How flex_attention is compiled per device type: a ``torch.compile`` backend name (or callable), or
#: None to run it uncompiled (CPU: torch 2.13 has no CPU backward anyway). Tests set a counting backend.
FLEX_COMPILE: dict[str, object] = {"cuda": "inductor", "cpu": None}
_flex_compiled: dict = {}


def flex_bucket(n: int) -> int:
    """The padded length a compiled flex call sees: the next power of two, at least one 128-tile.

    The compiled kernel is specialised to its shapes (``dynamic=False``: flex_attention's fast path),
    and training batches are padded to each batch's own maximum, so without buckets every new length
    recompiles until dynamo's recompile limit makes it fall back to the slow path. Powers of two bound
    the compiles at about log2(longest / 128) + 1 per dimension; the padding is masked out, and whole
    padded tiles are skipped by the block mask, so it costs little.
    """
    return max(128, 1 << (n - 1).bit_length())


def _rule(mask):
    """The mask as a flex ``mask_mod``, at the lengths it was built for."""
    if isinstance(mask, BlockLayout):
        return mask.mask_mod
    if mask is not None:  # a dense mask: read it directly
        dense = mask

        def read(bi, hi, qi, ki):
            return dense[bi, 0, qi, ki]

        return read

    def every(bi, hi, qi, ki):
        return qi >= 0

    return every


def _bucketed(mask, nq: int, nk: int, q_len: int, k_len: int, device):
    """The mask as a ``mask_mod`` on lengths padded to ``(q_len, k_len)``, built from tensors whose
    shapes depend on the buckets only: the compiled kernel guards on the mask_mod's closure, so a
    Python int or an anchors tensor of the batch's own size there would recompile it every step.
    Padded keys are never attended; a padded query (sliced off afterwards) attends to key 0 only."""
    n_q, n_k = torch.tensor(nq, device=device), torch.tensor(nk, device=device)
    if isinstance(mask, BlockLayout):
        blocks = -(-q_len // mask.block_size)
        anchors = F.pad(mask.anchors, (0, blocks - mask.num_blocks))  # (b, blocks), padding blocks 0
        seq_len = torch.tensor(mask.seq_len, device=device)
        view = BlockLayout(anchors=anchors, seq_len=seq_len, block_size=mask.block_size, layer=mask.layer)
        rule = view.mask_mod
    elif mask is not None:
        dense = torch.zeros((mask.shape[0], 1, q_len, k_len), dtype=torch.bool, device=device)
        dense[:, :, :nq, :nk] = mask
        rule = _rule(dense)
    else:
        rule = _rule(None)

    def padded(bi, hi, qi, ki):
        inside = (qi < n_q) & (ki < n_k)
        return (inside & rule(bi, hi, qi, ki)) | ((qi >= n_q) & (ki == 0))

    return padded


@register("attention", "flex")
def flex_attention_kernel(q, k, v, mask, scale):
    """torch's flex_attention with a block mask built from the layout's rule (GPU training).

    The mask_mod is the layout's own (:meth:`BlockLayout.mask_mod`, the block rule on indices), so
    tiles with no allowed pair are skipped. Compiled where ``FLEX_COMPILE`` says (CUDA: inductor,
    flex_attention's fast path), with lengths padded to :func:`flex_bucket` so the compiles stay
    bounded; on CPU it runs uncompiled and forward only in torch 2.13.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, h, nq, _ = q.shape
    nk = k.shape[2]
    backend = FLEX_COMPILE.get(q.device.type)
    fn, mask_mod = flex_attention, _rule(mask)
    if backend is not None:
        if backend not in _flex_compiled:
            _flex_compiled[backend] = torch.compile(flex_attention, backend=backend, dynamic=False)
        fn = _flex_compiled[backend]
        q_len, k_len = flex_bucket(nq), flex_bucket(nk)
        mask_mod = _bucketed(mask, nq, nk, q_len, k_len, q.device)
        q = F.pad(q, (0, 0, 0, q_len - nq))  # (b, h, Q, d)
        k, v = F.pad(k, (0, 0, 0, k_len - nk)), F.pad(v, (0, 0, 0, k_len - nk))  # (b, hk, Kp, d)
    block = create_block_mask(mask_mod, b, None, q.shape[2], k.shape[2], device=q.device)
    groups = h // k.shape[1]
    out = fn(q, k, v, block_mask=block, scale=scale, enable_gqa=groups > 1)  # (b, h, Q, d)
    return out[:, :, :nq]


#: The flash-attn function the ``flash`` kernel calls and where: ``flash_attn.flash_attn_varlen_func``
#: on CUDA where it is installed; tests put a reference of its documented semantics here, on a CPU.
FLASH_VARLEN = None
FLASH_DEVICES = ("cuda",)
_flash_fallback_said = False


def _flash_varlen():
    if FLASH_VARLEN is not None:
        return FLASH_VARLEN
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def _block_keys(layout: BlockLayout, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each block of batch row ``row``: the keys it may see, packed one block after another
    (its context prefix ``[0, anchor)``, then its own K keys at ``S + n*K``), as flat key indices of
    the row, and the cumulative key counts (flash-attn's ``cu_seqlens_k``)."""
    kk, s = layout.block_size, layout.seq_len
    anchors = layout.anchors[row]  # (N,)
    lengths = anchors + kk  # (N,)
    cu = F.pad(torch.cumsum(lengths, 0), (1, 0))  # (N + 1,)
    seq = torch.repeat_interleave(torch.arange(len(anchors), device=anchors.device), lengths)  # (T,)
    p = torch.arange(int(cu[-1]), device=anchors.device) - cu[seq]  # position inside its block's keys
    own = s + seq * kk + (p - anchors[seq])
    return torch.where(p < anchors[seq], p, own), cu.to(torch.int32)


@register("attention", "flash")
def flash_attention_kernel(q, k, v, mask, scale):
    """flash-attn's variable-length kernel (CUDA, fp16/bf16): each block a sequence of its K queries
    over the keys it may see, so no score of a masked pair is computed or stored.

    A block's keys are its context prefix then its own block (``_block_keys``), and flash-attn aligns
    query i of a sequence with key ``i + len_k - len_q`` (bottom-right; flash_attn_varlen_func's
    docstring), i.e. slot s with the context position ``anchor + s``, so the layer's rule is its
    ``window_size``: a window W keeps keys down to ``anchor + s - (W - 1)`` (left = W - 1; W >= K), a
    causal block none after slot s (right = 0), else all K (right = K - 1). Masks that are not a
    training layout (serving's one block) and machines without flash-attn or CUDA use ``split``
    (said once); the GPU extra installs flash-attn (docs/scale.md#gpu). On CUDA the inputs go in as
    bf16 unless already half precision, and the output comes back in the input's dtype.
    """
    global _flash_fallback_said
    varlen = _flash_varlen()
    usable = varlen is not None and q.device.type in FLASH_DEVICES
    if not isinstance(mask, BlockLayout) or not usable:
        if not usable and not _flash_fallback_said:
            print("note: attention 'flash' needs flash-attn on CUDA; using 'split' here")
            _flash_fallback_said = True
        return split_attention(q, k, v, mask, scale)
    kk, layer = mask.block_size, mask.layer
    left = -1 if layer.window is None else layer.window - 1
    right = 0 if layer.causal_block else kk - 1
    half = q.dtype in (torch.float16, torch.bfloat16) or q.device.type != "cuda"
    dtype = q.dtype if half else torch.bfloat16
    cu_q = torch.arange(0, (mask.num_blocks + 1) * kk, kk, device=q.device, dtype=torch.int32)  # (N+1,)
    outs = []
    for row in range(q.shape[0]):
        keys, cu_k = _block_keys(mask, row)
        out = varlen(
            q[row].transpose(0, 1).to(dtype),  # (N*K, h, d)
            k[row][:, keys].transpose(0, 1).to(dtype),  # (T, hk, d)
            v[row][:, keys].transpose(0, 1).to(dtype),
            cu_q, cu_k, kk, int((cu_k[1:] - cu_k[:-1]).max()),
            softmax_scale=scale, causal=False, window_size=(left, right),
        )  # fmt: skip
        outs.append(out.transpose(0, 1).to(q.dtype))  # (h, N*K, d)
    return torch.stack(outs)  # (b, h, Q, d)


def get_attention(name: str):
    return lookup("attention", name)
