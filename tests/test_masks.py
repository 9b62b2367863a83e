"""The training mask against a dense brute force built directly from the rules (docs/method.md 2.4)."""

import pytest
import torch

from spec_drafters.model.masks import (
    CausalBlockMask,
    DFlashBlockMask,
    LayerAttention,
    SlidingWindowMask,
    inference_mask,
    training_layout,
    training_mask,
)
from spec_drafters.train.anchors import UniformAnchors, eligible_anchors


def brute_force_mask(anchors, valid, seq_len, block_size, window=None, causal_block=False):
    """The rules of docs/method.md 2.4, one entry at a time."""
    b, n = anchors.shape
    q_len = n * block_size
    out = torch.zeros((b, 1, q_len, seq_len + q_len), dtype=torch.bool)
    for bi in range(b):
        for j in range(n):
            p = int(anchors[bi, j])
            for k in range(block_size):
                q = j * block_size + k
                for t in range(seq_len):  # context: strictly before the anchor, valid anchors only
                    seen = bool(valid[bi, j]) and t < p
                    if window is not None:  # the query at position p + k reaches back window - 1
                        seen = seen and (p + k) - t < window
                    out[bi, 0, q, t] = seen
                for j2 in range(n):  # blocks: own block only, both directions unless causal
                    for k2 in range(block_size):
                        out[bi, 0, q, seq_len + j2 * block_size + k2] = j2 == j and (
                            not causal_block or k2 <= k
                        )
    return out


def _anchors(seed, block_size, b=2, s=24):
    g = torch.Generator().manual_seed(seed)
    loss_mask = (torch.rand((b, s), generator=g) > 0.2).long()
    loss_mask[:, -3:] = 1  # anchors near the sequence end are possible
    anchors, valid = UniformAnchors(max_anchors=6)(loss_mask, block_size, g)
    valid[0, -1] = False  # an unused (padded) anchor slot
    anchors[0, -1] = 0
    return anchors, valid


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_size", [2, 4])
@pytest.mark.parametrize(
    "component",
    [DFlashBlockMask(), CausalBlockMask(), SlidingWindowMask(window=5, layers=[0, 2], causal_block=True)],
    ids=["dflash_block", "causal_block", "sliding_window"],
)
def test_every_mask_component_equals_brute_force(seed, block_size, component):
    anchors, valid = _anchors(seed, block_size)
    for rule in component.per_layer(3):
        got = training_mask(anchors, valid, 24, block_size, rule)
        want = brute_force_mask(anchors, valid, 24, block_size, rule.window, rule.causal_block)
        assert torch.equal(got, want)


RULES = [
    LayerAttention(),
    LayerAttention(window=5),
    LayerAttention(causal_block=True),
    LayerAttention(4, True),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("rule", RULES, ids=["full", "window", "causal", "window_causal"])
def test_every_mask_builder_evaluates_the_one_rule(seed, rule):
    """The dense mask, the block layout's parts (what ``split`` reads), its mask_mod called on scalar
    indices and vmapped by flex_attention's ``create_mask``: all equal the brute force."""
    from torch.nn.attention.flex_attention import create_mask

    s, k = 24, 3
    anchors, valid = _anchors(seed, k)
    want = brute_force_mask(anchors, valid, s, k, rule.window, rule.causal_block)  # (b, 1, Q, S + Q)
    b, _, nq, nk = want.shape
    layout = training_layout(anchors, valid, s, k, rule)
    assert torch.equal(training_mask(anchors, valid, s, k, rule), want)
    g = torch.Generator().manual_seed(seed)
    rows, cols = torch.randperm(nq, generator=g)[:7], torch.randperm(nk, generator=g)[:11]
    assert torch.equal(layout.mask(rows, cols), want[:, :, rows][..., cols])
    for _ in range(60):
        bi, qi, ki = (int(torch.randint(n, (), generator=g)) for n in (b, nq, nk))
        got = layout.mask_mod(torch.tensor(bi), torch.tensor(0), torch.tensor(qi), torch.tensor(ki))
        assert bool(got) == bool(want[bi, 0, qi, ki]), (bi, qi, ki)
    assert torch.equal(create_mask(layout.mask_mod, b, 1, nq, nk, device="cpu"), want)


def test_mask_components_declare_their_layers():
    assert DFlashBlockMask().per_layer(2) == [LayerAttention(), LayerAttention()]
    assert CausalBlockMask().per_layer(1) == [LayerAttention(causal_block=True)]
    swa = SlidingWindowMask(window=64).per_layer(5)  # default: every layer but the last slides (z-lab)
    assert [r.layer_type for r in swa] == ["sliding_attention"] * 4 + ["full_attention"]
    assert [r.window for r in SlidingWindowMask(window=8, layers=[-1]).per_layer(2)] == [None, 8]
    with pytest.raises(ValueError, match=r"layers has \[2\], outside the drafter's 2 layers"):
        SlidingWindowMask(window=8, layers=[2]).per_layer(2)
    with pytest.raises(ValueError, match=r"^window must be >= 1, got 0$"):  # no flag: the caller adds it
        SlidingWindowMask(window=0)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("causal_block", [False, True])
def test_inference_mask_is_the_training_rule_for_one_block(window, causal_block):
    """Serving one block after S context positions = training with a single anchor at S."""
    s, k = 13, 4
    rule = LayerAttention(window, causal_block)
    got = inference_mask(s, torch.arange(s, s + k)[None], rule)
    want = brute_force_mask(torch.tensor([[s]]), torch.tensor([[True]]), s, k, window, causal_block)
    if got is None:
        assert want.all()  # full attention, bidirectional block: nothing to mask
    else:
        assert torch.equal(got, want)


def test_anchor_never_sees_itself_and_rows_never_empty():
    anchors = torch.tensor([[1, 5, 22]])
    valid = torch.tensor([[True, True, False]])
    m = training_mask(anchors, valid, 23, 3)[0, 0]
    assert not m[3, 5] and m[3, 4]  # block 1 (anchor 5): context 4 visible, 5 (the anchor's own features) not
    assert m.any(dim=-1).all()  # padded block 2 still sees its own block, so no softmax row is empty
    assert not m[6:, :23].any()  # and no context at all


def test_anchor_sampling_rules():
    g = torch.Generator().manual_seed(0)
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1, 1, 0], [1] * 10])
    ok = eligible_anchors(loss_mask, block_size=3, require_full_block=False)
    # p >= 1, p supervised and p + 1 supervised; the last position never anchors
    assert ok[0].nonzero().flatten().tolist() == [2, 3, 4, 7]
    assert ok[1].nonzero().flatten().tolist() == list(range(1, 9))
    full = eligible_anchors(loss_mask, block_size=3, require_full_block=True)
    assert full[0].nonzero().flatten().tolist() == [2, 3]
    anchors, valid = UniformAnchors(max_anchors=6)(loss_mask, 3, g)
    assert valid.sum(1).tolist() == [4, 6]
    for row, v in zip(anchors, valid, strict=True):
        picked = row[v].tolist()
        assert picked == sorted(set(picked))  # sorted, without replacement
        assert not v[len(picked) :].any()  # valid anchors first


def test_drafter_records_the_mask_per_layer_and_checks_the_window():
    from conftest import tiny_drafter, tiny_target

    target = tiny_target()
    drafter = tiny_drafter(
        target, block_size=4, num_layers=3, mask=SlidingWindowMask(window=8, layers=[0, 1])
    )
    cfg = drafter.config
    assert cfg.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]
    assert cfg.sliding_window == 8 and cfg.causal_block_layers == []
    assert tiny_drafter(target, mask=CausalBlockMask()).config.causal_block_layers == [0, 1]
    with pytest.raises(ValueError, match=r"window must be >= block_size \(4\)"):
        tiny_drafter(target, block_size=4, mask=SlidingWindowMask(window=3, layers=[0]))
