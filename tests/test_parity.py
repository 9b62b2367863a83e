"""Train/serve parity and attention kernels against the eager reference.

The logits of one block inside a multi-anchor training forward must equal those of the inference
path (context KV cache + a single unmasked block) for the same context. This is the test that catches
a wrong mask (``<=`` vs ``<``, a causal block, blocks seeing each other) and wrong positions.
"""

import pytest
import torch

from conftest import tiny_drafter, tiny_target
from spec_drafters.model.attention import eager_attention, sdpa_attention
from spec_drafters.model.blocks import build_blocks
from spec_drafters.model.drafter import ContextCache
from spec_drafters.model.masks import CausalBlockMask, DFlashBlockMask, SlidingWindowMask, training_mask


def layer_masks(drafter, anchors, valid, s, k):
    return [training_mask(anchors, valid, s, k, rule) for rule in drafter.layer_rules()]


MASKS = {
    "dflash_block": DFlashBlockMask(),
    "causal_block": CausalBlockMask(),
    "sliding_window": SlidingWindowMask(window=6, layers=[0]),  # layer 0 slides, layer 1 full
    "sliding_causal": SlidingWindowMask(window=5, layers=[1], causal_block=True),
}


@pytest.mark.parametrize(
    ("architecture", "attention", "mask"),
    [
        ("qwen3", "eager", "dflash_block"),
        ("qwen3", "sdpa", "dflash_block"),
        ("llama", "eager", "dflash_block"),
        ("llama", "sdpa", "dflash_block"),
        ("qwen3", "sdpa", "causal_block"),
        ("qwen3", "eager", "sliding_window"),
        ("llama", "sdpa", "sliding_causal"),
    ],
)
def test_training_block_equals_inference_block(architecture, attention, mask):
    target = tiny_target(architecture, dtype="float64")
    drafter = tiny_drafter(target, block_size=4, attention=attention, mask=MASKS[mask])
    k, s = 4, 30
    ids = torch.randint(0, 256, (1, s), generator=torch.Generator().manual_seed(1))
    out = target(ids)
    taps = torch.cat([out.taps[i] for i in (1, 2, 3)], dim=-1)  # (1, S, 3H)
    anchors = torch.tensor([[1, 7, 8, 19, 28]])  # adjacent anchors and one near the end
    valid = torch.ones_like(anchors, dtype=torch.bool)
    block_ids, block_pos = build_blocks(ids, anchors, k, 258)
    masks = layer_masks(drafter, anchors, valid, s, k)
    with torch.no_grad():
        ctx_kv = drafter.encode_context(taps, torch.arange(s)[None])
        train_logits = target.head(drafter(target.embed(block_ids), block_pos, ctx_kv, masks))  # (1, N*K, V)
        for j, p in enumerate(anchors[0].tolist()):
            cache = ContextCache(drafter)
            cache.append(taps[:, : p // 2])  # grown in two steps, as decoding does
            cache.append(taps[:, p // 2 : p])
            block = torch.full((1, k), 258)
            block[0, 0] = ids[0, p]
            pos = torch.arange(p, p + k)[None]
            serve_logits = target.head(drafter(target.embed(block), pos, cache.kv))  # (1, K, V)
            torch.testing.assert_close(
                train_logits[:, j * k : (j + 1) * k], serve_logits, rtol=1e-9, atol=1e-9
            )


def test_parity_fails_with_a_leaky_mask():
    """The parity check can fail: letting each block see its anchor's own features breaks it."""
    target = tiny_target(dtype="float64")
    drafter = tiny_drafter(target)
    s, k = 20, 4
    ids = torch.randint(0, 256, (1, s), generator=torch.Generator().manual_seed(2))
    taps = torch.cat([target(ids).taps[i] for i in (1, 2, 3)], dim=-1)
    anchors, valid = torch.tensor([[9]]), torch.tensor([[True]])
    block_ids, block_pos = build_blocks(ids, anchors, k, 258)
    mask = training_mask(anchors, valid, s, k)
    mask[..., 9] = True  # the SpecForge #473 bug: t <= anchor
    with torch.no_grad():
        leaky = drafter(
            target.embed(block_ids),
            block_pos,
            drafter.encode_context(taps, torch.arange(s)[None]),
            [mask] * 2,
        )
        cache = ContextCache(drafter)
        cache.append(taps[:, :9])
        serve = drafter(target.embed(block_ids), block_pos, cache.kv)
    assert not torch.allclose(leaky, serve)


@pytest.mark.parametrize("seed", range(3))
def test_attention_kernels_match_eager_forward_and_backward(seed):
    g = torch.Generator().manual_seed(seed)
    b, h, hk, tq, tk, d = 2, 4, 2, 6, 11, 8
    q = torch.randn((b, h, tq, d), generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn((b, hk, tk, d), generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn((b, hk, tk, d), generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand((b, 1, tq, tk), generator=g) > 0.4
    mask[..., 0] = True  # no empty rows
    grads = []
    outs = []
    for fn in (eager_attention, sdpa_attention):
        out = fn(q, k, v, mask, d**-0.5)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    torch.testing.assert_close(outs[0], outs[1])
    for a, bgrad in zip(*grads, strict=True):
        torch.testing.assert_close(a, bgrad)
