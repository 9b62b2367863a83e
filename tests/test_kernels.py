"""Prepacked oneDNN linears (kernels.py): the same tokens as stock nn.Linear, swapped in and out cleanly."""

import random

import pytest
import torch
from torch import nn

from conftest import tiny_drafter, tiny_target
from spec_drafters.decode.generate import greedy_generate, speculative_generate
from spec_drafters.decode.verifiers import DDTree, GreedyChain
from spec_drafters.model import kernels
from spec_drafters.model.kernels import PackedLinear, packed_linears

pytestmark = pytest.mark.skipif(not kernels.available(), reason="torch built without oneDNN")
FC = [1, 2, 3]


@pytest.fixture(autouse=True)
def pack_small_weights(monkeypatch):
    monkeypatch.setattr(kernels, "MIN_WEIGHT_ELEMENTS", 0)  # the tiny models here are 32 wide


def _linears(module):
    return [m for m in module.modules() if isinstance(m, (nn.Linear, PackedLinear))]


def test_packed_linear_matches_nn_linear_and_is_restored():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 48, bias=False))
    before = list(model)
    for rows in (1, 2, 8, 33):
        x = torch.randn(1, rows, 64)
        want = model(x)
        with packed_linears(model):
            assert isinstance(model[0], PackedLinear) and isinstance(model[2], PackedLinear)
            got = model(x)
            got_strided = model(x.transpose(0, 1)[:, 0])  # a non-contiguous view (the head's input)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_strided, want.transpose(0, 1)[:, 0], rtol=1e-5, atol=1e-6)
    assert list(model) == before  # the stock modules are back


def test_packs_are_reused_then_rebuilt_after_a_weight_update():
    model = nn.Sequential(nn.Linear(16, 16))
    with packed_linears(model):
        first = model[0]
        with packed_linears(model):  # nested: nothing left to swap
            assert model[0] is first
    with packed_linears(model):
        assert model[0] is first  # cached, not repacked
    with torch.no_grad():
        model[0].weight.mul_(2)  # an optimizer step, a loaded state dict
    x = torch.randn(3, 16)
    with packed_linears(model):
        assert model[0] is not first
        torch.testing.assert_close(model(x), model[0].linear(x))


def test_gradients_fall_back_to_the_stock_linear():
    model = nn.Linear(8, 4)
    x = torch.randn(2, 8, requires_grad=True)
    with packed_linears(model):
        model(x).sum().backward()
    assert x.grad is not None and model.weight.grad is not None


def test_float64_and_enabled_false_keep_nn_linear():
    model64 = nn.Sequential(nn.Linear(8, 8).double())
    model32 = nn.Sequential(nn.Linear(8, 8))
    with packed_linears(model64), packed_linears(model32, enabled=False):
        assert type(model64[0]) is nn.Linear and type(model32[0]) is nn.Linear


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
def test_packed_decoding_gives_the_plain_tokens_on_a_float32_target(architecture):
    target = tiny_target(architecture, dtype="float32", seed=5)
    drafter = tiny_drafter(target, block_size=4)
    rng = random.Random(1)
    for _ in range(3):
        prompt = [rng.randrange(256) for _ in range(rng.randint(1, 20))]
        plain = greedy_generate(target, prompt, 16, eos_ids=[], packed_linears=False)
        assert greedy_generate(target, prompt, 16, eos_ids=[]).tokens == plain.tokens
        for verifier in (GreedyChain(), DDTree(8)):
            spec = speculative_generate(target, drafter, FC, verifier, prompt, 16, eos_ids=[])
            assert spec.tokens == plain.tokens
    assert all(type(m) is nn.Linear for m in _linears(target) + _linears(drafter))


@pytest.mark.slow
def test_packed_decoding_on_the_embedded_target_gives_the_plain_tokens():
    from spec_drafters.data.prompts import HumanEvalPrompts
    from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig
    from spec_drafters.model.masks import DFlashBlockMask
    from spec_drafters.target.frozen import FrozenTarget
    from spec_drafters.target.loaders import EmbeddedSmolLM2

    taps = [1, 8, 14, 20, 27]
    loaded = EmbeddedSmolLM2().load()
    target = FrozenTarget(loaded.model, taps)
    cfg = DrafterConfig(num_layers=2, block_size=8).resolved(
        loaded.model.config, len(taps), loaded.card.mask_token_id, DFlashBlockMask().per_layer(2)
    )
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).eval()
    for text in HumanEvalPrompts(2).prompts():
        prompt = loaded.tokenizer.encode(text)
        plain = greedy_generate(target, prompt, 12, loaded.card.eos_token_ids, packed_linears=False)
        packed = greedy_generate(target, prompt, 12, loaded.card.eos_token_ids)
        spec = speculative_generate(
            target, drafter, taps, GreedyChain(), prompt, 12, loaded.card.eos_token_ids
        )
        assert packed.tokens == plain.tokens == spec.tokens
