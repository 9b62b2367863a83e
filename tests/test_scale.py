"""Memory options that must not change the numbers: the chunked vocabulary loss, activation
checkpointing, and the block-sparse attention kernels against the dense eager reference."""

import pytest
import torch

from conftest import tiny_drafter, tiny_target
from spec_drafters.model.attention import eager_attention, flex_attention_kernel, split_attention
from spec_drafters.model.masks import LayerAttention, training_layout
from spec_drafters.train.acceptance_losses import CAP
from spec_drafters.train.anchors import UniformAnchors
from spec_drafters.train.losses import CEKLBlend, HardCE, SlotBatch, SoftKL
from test_masks import brute_force_mask

RULES = [LayerAttention(), LayerAttention(window=6), LayerAttention(causal_block=True)]


def _layout(rule, b=2, s=30, n=5, k=4, seed=0):
    loss_mask = torch.ones((b, s), dtype=torch.long)
    loss_mask[1, 20:] = 0  # a shorter second row: some padded anchors
    anchors, ok = UniformAnchors(n)(loss_mask, k, torch.Generator().manual_seed(seed))
    return anchors, ok, training_layout(anchors, ok, s, k, rule)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("blocks", [1, 2, 5])
def test_block_layout_chunks_equal_the_brute_force(rule, blocks):
    """What ``split`` reads per chunk of blocks: the context prefix they reach and their own keys."""
    anchors, ok, layout = _layout(rule)
    want = brute_force_mask(anchors, ok, 30, 4, rule.window, rule.causal_block)  # (b, 1, Q, S + Q)
    for j in range(0, 5, blocks):
        rows = slice(4 * j, 4 * min(j + blocks, 5))
        reach, got = layout.chunk(rows)
        assert not want[:, :, rows, reach:30].any()  # nothing visible beyond the reach
        assert reach == 1 or want[:, :, rows, reach - 1].any()  # and the reach is the tightest
        own = want[:, :, rows, 30 + rows.start : 30 + rows.stop]
        assert torch.equal(got, torch.cat([want[:, :, rows, :reach], own], dim=-1))
        assert layout.chunk(rows)[1] is got  # built once per layout


@pytest.mark.parametrize("budget", [None, 1], ids=["one_chunk", "chunk_per_block"])
@pytest.mark.parametrize("rule", RULES)
def test_split_kernel_equals_eager_forward_and_backward(rule, budget, monkeypatch):
    if budget is not None:  # every block its own chunk, each with its own context prefix
        monkeypatch.setattr("spec_drafters.model.attention.SPLIT_CHUNK_QUERIES", budget)
    _, _, layout = _layout(rule)
    g = torch.Generator().manual_seed(1)
    q = torch.randn((2, 4, 20, 8), generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn((2, 2, 50, 8), generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn((2, 2, 50, 8), generator=g, dtype=torch.float64, requires_grad=True)
    want = eager_attention(q, k, v, layout.dense(), 8**-0.5)
    got = split_attention(q, k, v, layout, 8**-0.5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    gw = torch.autograd.grad(want.square().sum(), (q, k, v))
    gg = torch.autograd.grad(got.square().sum(), (q, k, v))
    for a, b in zip(gg, gw, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


@pytest.mark.parametrize("rule", RULES)
def test_flex_kernel_forward_equals_eager(rule):
    # flex_attention has no backward on CPU in torch 2.13; its GPU path is only checked in forward here.
    _, _, layout = _layout(rule)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(shape, generator=g) for shape in [(2, 4, 20, 8), (2, 2, 50, 8), (2, 2, 50, 8)])
    with torch.no_grad():
        torch.testing.assert_close(
            flex_attention_kernel(q, k, v, layout, 8**-0.5), eager_attention(q, k, v, layout.dense(), 8**-0.5)
        )


def _drafter_grads(drafter, target, layouts, checkpoint=False):
    drafter.checkpoint_layers = checkpoint
    drafter.zero_grad()
    g = torch.Generator().manual_seed(3)
    taps = torch.randn((2, 30, 3 * target.hidden_size), generator=g, dtype=torch.float64)
    embeds = torch.randn((2, 20, target.hidden_size), generator=g, dtype=torch.float64)
    pos = torch.arange(20).expand(2, 20) + 1
    out = drafter(embeds, pos, masks=layouts, taps=taps)
    out.square().sum().backward()
    return out.detach(), [p.grad.clone() for p in drafter.parameters()]


@pytest.mark.parametrize("attention", ["sdpa", "split"])
def test_split_and_checkpointed_drafter_equal_the_eager_one(attention):
    target = tiny_target(dtype="float64")
    _, _, layout = _layout(LayerAttention())
    ref = tiny_drafter(target, attention="eager").double().train()
    out_ref, g_ref = _drafter_grads(ref, target, [layout] * 2)
    other = tiny_drafter(target, attention=attention).double().train()
    for checkpoint in (False, True):
        out, grads = _drafter_grads(other, target, [layout] * 2, checkpoint)
        torch.testing.assert_close(out, out_ref, rtol=0, atol=1e-10)
        for a, b in zip(grads, g_ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def _loss_and_grad(loss, chunk_rows):
    g = torch.Generator().manual_seed(4)
    m, h, v = 23, 6, 50
    hidden = torch.randn((m, h), generator=g, dtype=torch.float64, requires_grad=True)
    head = torch.randn((v, h), generator=g, dtype=torch.float64)
    teacher_h = torch.randn((m, h), generator=g, dtype=torch.float64)
    labels = torch.randint(0, v, (m,), generator=g)
    slots = torch.arange(m) % 7 + 1
    supervised = torch.zeros((1, 4, 8), dtype=torch.bool)  # 3 full blocks of 7 slots, then 2 slots
    supervised[0, :3, 1:] = True
    supervised[0, 3, 1:3] = True
    calls = []

    def lm_head(x):
        calls.append(x.shape[0])
        return x @ head.T

    batch = SlotBatch(hidden, labels, slots, supervised, head=lm_head,
                      teacher=lambda rows: teacher_h[rows] @ head.T, chunk_rows=chunk_rows)  # fmt: skip
    out = loss(batch)["loss"]
    (grad,) = torch.autograd.grad(out, hidden)
    return out.detach(), grad, calls


@pytest.mark.parametrize("loss", [HardCE(), SoftKL(temperature=2.0), CEKLBlend(alpha=0.3)], ids=str)
def test_chunked_loss_equals_the_whole_one(loss):
    whole, g_whole, calls_whole = _loss_and_grad(loss, None)
    chunked, g_chunked, calls = _loss_and_grad(loss, 5)
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=0)
    torch.testing.assert_close(g_chunked, g_whole, rtol=1e-10, atol=1e-12)
    assert calls_whole == [23] and max(calls) == 5  # never all 23 rows through the head at once


def test_chunked_cap_equals_the_whole_one():
    cap = CAP(HardCE())
    cap.bind(6)
    cap.double()
    torch.nn.init.normal_(cap.head.weight, generator=torch.Generator().manual_seed(5))
    whole = _loss_and_grad(cap, None)
    chunked = _loss_and_grad(cap, 4)
    torch.testing.assert_close(chunked[0], whole[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(chunked[1], whole[1], rtol=1e-10, atol=1e-12)


def test_compiled_flex_recompiles_once_per_length_bucket_not_per_length(monkeypatch):
    """Batches padded to their own maximum vary in length every step; the compiled flex kernel sees
    lengths padded to power-of-two buckets (flex_bucket), so a run over 12 lengths compiles once per
    bucket pair and still equals eager. Counted with a backend that records each compile (CPU)."""
    import torch._dynamo

    from spec_drafters.model import attention

    compiles = []

    def counting(gm, example_inputs):
        compiles.append(tuple(t.shape for t in example_inputs if isinstance(t, torch.Tensor))[:3])
        return gm.forward

    torch._dynamo.reset()
    monkeypatch.setattr(attention, "FLEX_COMPILE", {"cpu": counting})
    monkeypatch.setattr(attention, "_flex_compiled", {})
    g = torch.Generator().manual_seed(4)
    buckets = set()
    for n_blocks, context in [(2, 10), (3, 17), (4, 30), (5, 41), (6, 60), (7, 64), (9, 70), (12, 80),
                              (15, 99), (20, 120), (30, 150), (33, 190)]:  # fmt: skip
        loss_mask = torch.ones((1, context), dtype=torch.long)
        anchors, ok = UniformAnchors(n_blocks)(loss_mask, 4, g)
        layout = training_layout(anchors, ok, context, 4, RULES[1])
        nq, nk = 4 * n_blocks, context + 4 * n_blocks
        q = torch.randn((1, 4, nq, 8), generator=g)
        k, v = (torch.randn((1, 2, nk, 8), generator=g) for _ in range(2))
        with torch.no_grad():
            got = flex_attention_kernel(q, k, v, layout, 8**-0.5)
        torch.testing.assert_close(got, eager_attention(q, k, v, layout.dense(), 8**-0.5))
        buckets.add((attention.flex_bucket(nq), attention.flex_bucket(nk)))
    torch._dynamo.reset()
    assert 1 <= len(compiles) <= len(buckets) < 12, (compiles, buckets)
