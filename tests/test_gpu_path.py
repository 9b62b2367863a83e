"""The GPU path, made ready and checked here as far as a CPU can (issue 33, item 3; docs/scale.md#gpu):
the target's attention kernel as an argument, refused where it would misread a tree's mask; the
drafter's flash-attn kernel, its packing checked on any machine and the kernel itself on CUDA."""

import importlib.util

import pytest
import torch

from conftest import tiny_target
from spec_drafters.model import attention
from spec_drafters.target.loaders import HFPretrained, TinyRandom
from test_scale import RULES, _layout


def test_the_targets_attention_kernel_is_an_argument(tmp_path):
    TinyRandom(num_layers=4).load().model.save_pretrained(tmp_path / "t")
    for kernel in ("eager", "sdpa"):
        loaded = HFPretrained(str(tmp_path / "t"), mask_token_id=258, attn_implementation=kernel).load()
        assert loaded.model.config._attn_implementation == kernel
    with pytest.raises(ValueError, match="attn_implementation must be one of sdpa, eager"):
        HFPretrained(str(tmp_path / "t"), mask_token_id=258, attn_implementation="flash2")


def test_a_flash_target_refuses_a_trees_mask_instead_of_reading_it_as_causal(monkeypatch):
    target = tiny_target()
    ids = torch.randint(0, 256, (1, 6))
    tree = torch.zeros((1, 1, 6, 6))  # additive 4D mask, as tree verification passes it
    target(ids, attention_mask=tree)  # sdpa: fine
    # as a flash-attn target reports it (setting it for real would look for the kernel)
    flash = property(lambda _: "flash_attention_2")
    monkeypatch.setattr(type(target.model.config), "_attn_implementation", flash)
    with pytest.raises(ValueError, match="takes no 4D mask: tree verification"):
        target(ids, attention_mask=tree)


def flash_varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, window_size):
    """flash_attn_varlen_func's documented semantics in plain torch: sequence i is
    q[cu_q[i]:cu_q[i+1]] over k[cu_k[i]:cu_k[i+1]]; its query a sees keys j with
    a + Lk - Lq - left <= j <= a + Lk - Lq + right (-1: unbounded; causal: right = 0); GQA by groups."""
    left, right = window_size
    right = 0 if causal else right
    groups = q.shape[1] // k.shape[1]
    outs = []
    for i in range(len(cu_q) - 1):
        qi, ki, vi = q[cu_q[i] : cu_q[i + 1]], k[cu_k[i] : cu_k[i + 1]], v[cu_k[i] : cu_k[i + 1]]
        assert len(qi) <= max_q and len(ki) <= max_k
        a = torch.arange(len(qi))[:, None] + len(ki) - len(qi)
        j = torch.arange(len(ki))[None]
        ok = torch.ones((len(qi), len(ki)), dtype=torch.bool)
        if left >= 0:
            ok &= j >= a - left
        if right >= 0:
            ok &= j <= a + right
        ki, vi = ki.repeat_interleave(groups, dim=1), vi.repeat_interleave(groups, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qi, ki) * softmax_scale
        probs = torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, vi))
    return torch.cat(outs)


@pytest.mark.parametrize("rule", RULES, ids=["full", "window6", "causal_block"])
def test_the_flash_kernels_packing_equals_eager(rule, monkeypatch):
    """The flash kernel's part that runs anywhere: blocks packed as variable-length sequences and the
    layer's rule as flash-attn's window, through a reference of flash-attn's documented semantics
    (float64, CPU), against the eager kernel on the dense mask; padded anchors included."""
    monkeypatch.setattr(attention, "FLASH_VARLEN", flash_varlen_reference)
    monkeypatch.setattr(attention, "FLASH_DEVICES", ("cpu",))
    _, _, layout = _layout(rule)
    g = torch.Generator().manual_seed(5)
    q = torch.randn((2, 4, 20, 8), generator=g, dtype=torch.float64)
    k, v = (torch.randn((2, 2, 50, 8), generator=g, dtype=torch.float64) for _ in range(2))
    want = attention.eager_attention(q, k, v, layout.dense(), 8**-0.5)
    torch.testing.assert_close(
        attention.flash_attention_kernel(q, k, v, layout, 8**-0.5), want, rtol=0, atol=1e-12
    )


@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None,
    reason="flash-attn on CUDA only (pip install '.[gpu]'); its packing is checked above on any machine",
)
@pytest.mark.parametrize("rule", RULES, ids=["full", "window6", "causal_block"])
def test_the_flash_kernel_equals_eager_on_cuda(rule):
    _, _, layout = _layout(rule)
    layout.anchors = layout.anchors.cuda()
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn((2, 4, 20, 64), generator=g, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn((2, 2, 50, 64), generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    want = attention.eager_attention(q.float(), k.float(), v.float(), layout.dense(), 64**-0.5)
    got = attention.flash_attention_kernel(q, k, v, layout, 64**-0.5)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
