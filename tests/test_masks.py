"""The training mask against a dense brute force built directly from the rules (dflash.md 2.4)."""

import pytest
import torch

from spec_drafters.anchors import UniformAnchors, eligible_anchors
from spec_drafters.masks import DFlashBlockMask


def brute_force_mask(anchors, valid, seq_len, block_size):
    b, n = anchors.shape
    q_len = n * block_size
    out = torch.zeros((b, 1, q_len, seq_len + q_len), dtype=torch.bool)
    for bi in range(b):
        for j in range(n):
            for k in range(block_size):
                q = j * block_size + k
                for t in range(seq_len):  # context: strictly before the anchor, valid anchors only
                    out[bi, 0, q, t] = bool(valid[bi, j]) and t < int(anchors[bi, j])
                for j2 in range(n):  # blocks: own block only, both directions
                    for k2 in range(block_size):
                        out[bi, 0, q, seq_len + j2 * block_size + k2] = j2 == j
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("block_size", [2, 4])
def test_dense_mask_equals_brute_force(seed, block_size):
    g = torch.Generator().manual_seed(seed)
    b, s = 2, 24
    loss_mask = (torch.rand((b, s), generator=g) > 0.2).long()
    loss_mask[:, -3:] = 1  # anchors near the sequence end are possible
    anchors, valid = UniformAnchors(max_anchors=6)(loss_mask, block_size, g)
    valid[0, -1] = False  # an unused (padded) anchor slot
    anchors[0, -1] = 0
    got = DFlashBlockMask().dense(anchors, valid, s, block_size)
    assert torch.equal(got, brute_force_mask(anchors, valid, s, block_size))


def test_anchor_never_sees_itself_and_rows_never_empty():
    anchors = torch.tensor([[1, 5, 22]])
    valid = torch.tensor([[True, True, False]])
    m = DFlashBlockMask().dense(anchors, valid, 23, 3)[0, 0]
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
