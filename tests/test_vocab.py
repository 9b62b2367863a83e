"""Draft vocabularies: the V_d most frequent tokens, a frozen slice of the target's head; decoding stays
lossless and never drafts outside the subset; validation counts out-of-vocabulary labels as misses;
the mapping survives the spec_drafters and speculators layouts and z-lab's refuses it."""

import json
import random
from dataclasses import replace

import pytest
import torch

from conftest import tiny_drafter, tiny_target
from spec_drafters.artefacts.folders import build_drafter, read_folder, write_folder
from spec_drafters.decode.generate import greedy_generate, speculative_generate
from spec_drafters.decode.verifiers import DDTree, GreedyChain
from spec_drafters.lightning.module import DFlashModule
from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig
from spec_drafters.model.vocab import FolderVocab, FrequentTokens, count_labels, coverage
from spec_drafters.target.injection import AllButLast
from spec_drafters.target.loaders import TinyRandom


def _counts(tmp_path, counts: dict[int, int]) -> str:
    path = tmp_path / "counts.json"
    path.write_text(json.dumps({"counts": {str(k): v for k, v in counts.items()}}))
    return str(path)


def test_frequent_tokens_hand_case(tmp_path):
    path = _counts(tmp_path, {7: 5, 3: 9, 11: 5, 2: 1})
    # 3 (9), then 7 and 11 tie at 5 (smaller id first), then 2; returned sorted by id.
    assert FrequentTokens(path, size=3).token_ids(20).tolist() == [3, 7, 11]
    assert FrequentTokens(path, size=5).token_ids(20).tolist() == [0, 2, 3, 7, 11]  # 0: first zero count
    with pytest.raises(ValueError, match="outside the vocabulary"):
        FrequentTokens(path, size=3).token_ids(10)
    with pytest.raises(FileNotFoundError, match="draft-vocab"):
        FrequentTokens(str(tmp_path / "missing.json")).token_ids(10)


def test_count_labels_and_coverage():
    rec = {
        "input_ids": torch.tensor([5, 6, 6, 7]),
        "loss_mask": torch.tensor([0, 1, 1, 1]),
        "labels": torch.tensor([-1, 6, 9, 9]),
    }
    assert count_labels([rec]) == {6: 1, 9: 2}  # the cache's labels, supervised positions only
    del rec["labels"]
    counts = count_labels([rec])
    assert counts == {6: 2, 7: 1}  # the text's supervised tokens
    assert coverage(torch.tensor([6]), counts) == pytest.approx(2 / 3)
    assert coverage(None, counts) == 1.0


def test_draft_logits_are_the_head_columns_of_the_subset():
    target = tiny_target(dtype="float64")
    drafter = tiny_drafter(target)
    ids = torch.tensor([1, 4, 9, 100, 257])
    sub = DFlashDrafter(replace(drafter.config, draft_vocab_size=len(ids))).double()
    sub.load_state_dict({**drafter.state_dict(), "draft_ids": ids})
    hidden = torch.randn(3, target.hidden_size, dtype=torch.float64)
    full = target.head(hidden)
    torch.testing.assert_close(sub.logits(hidden, target.lm_head), full[:, ids])
    assert sub.to_target(torch.tensor([0, 4])).tolist() == [1, 257]
    assert sub.to_draft(torch.tensor([9, 10, 257]), target.vocab_size).tolist() == [2, -1, 4]


@pytest.mark.parametrize("verifier", [GreedyChain(), DDTree(budget=6)])
def test_decoding_over_a_draft_vocabulary_is_lossless_and_stays_inside_it(verifier, monkeypatch):
    target = tiny_target(dtype="float64", seed=1)
    base = tiny_drafter(target, block_size=4)
    ids = torch.tensor(sorted(random.Random(0).sample(range(target.vocab_size), 40)))
    drafter = DFlashDrafter(replace(base.config, draft_vocab_size=len(ids))).double().eval()
    drafter.load_state_dict({**base.state_dict(), "draft_ids": ids})
    drafted: list[int] = []
    real_propose = type(verifier).propose

    def spy(self, logits, rng=None):
        assert logits.shape[-1] == len(ids)  # the head ran over V_d columns only
        tree = real_propose(self, logits, rng)
        drafted.extend(tree.tokens)
        return tree

    monkeypatch.setattr(type(verifier), "propose", spy)
    rng = random.Random(3)
    for _ in range(3):
        prompt = [rng.randrange(256) for _ in range(rng.randint(1, 12))]
        want = greedy_generate(target, prompt, 16, eos_ids=[])
        got = speculative_generate(target, drafter, [1, 2, 3], verifier, prompt, 16, eos_ids=[])
        assert got.tokens == want.tokens
    assert drafted and all(0 <= t < len(ids) for t in drafted)  # propose saw draft indices


def test_sampled_chain_over_a_draft_vocabulary(monkeypatch):
    """At temperature > 0 a chain's drafts are drawn over the draft vocabulary and their distributions
    mapped onto the target's (zero outside the subset) before the chain rule reads them."""
    from spec_drafters.decode import generate
    from spec_drafters.decode.verifiers import GreedyChain

    target = tiny_target(dtype="float64", seed=1)
    base = tiny_drafter(target, block_size=4)
    ids = torch.tensor(sorted(random.Random(0).sample(range(target.vocab_size), 40)))
    drafter = DFlashDrafter(replace(base.config, draft_vocab_size=len(ids))).double().eval()
    drafter.load_state_dict({**base.state_dict(), "draft_ids": ids})
    seen = []
    real = generate.sampled_path

    def spy(tree, logits, sampling, rng):
        if tree.draft_probs is not None:
            seen.append(tree)
        return real(tree, logits, sampling, rng)

    monkeypatch.setattr(generate, "sampled_path", spy)
    prompt = [3, 17, 42, 3, 17]
    one = speculative_generate(
        target, drafter, [1, 2, 3], GreedyChain(temperature=0.9, seed=4), prompt, 12, []
    )
    again = speculative_generate(
        target, drafter, [1, 2, 3], GreedyChain(temperature=0.9, seed=4), prompt, 12, []
    )
    assert one.tokens == again.tokens and seen
    for tree in seen:
        assert tree.draft_probs.shape[-1] == target.vocab_size
        outside = torch.ones(target.vocab_size, dtype=torch.bool).index_fill_(0, ids, False)
        assert float(tree.draft_probs[:, outside].sum()) == 0.0
        assert torch.allclose(tree.draft_probs.sum(-1), torch.ones(len(tree.tokens), dtype=torch.float64))
        assert all(int(t) in set(ids.tolist()) for t in tree.tokens)  # target ids, inside the subset
    cold = speculative_generate(target, drafter, [1, 2, 3], GreedyChain(temperature=1e-4), prompt, 12, [])
    assert cold.tokens == greedy_generate(target, prompt, 12, eos_ids=[]).tokens


@pytest.fixture(scope="module")
def vocab_module(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vocab")
    # Byte tokenizer: frequent ASCII letters only; every other label is outside the vocabulary.
    counts = {ord(c): 10 for c in "etaoinshrdlu "}
    path = _counts(tmp, counts)
    torch.manual_seed(0)
    module = DFlashModule(
        target=TinyRandom(num_layers=6),
        drafter=DrafterConfig(num_layers=1, block_size=4),
        injection=AllButLast(num_taps=3),
        draft_vocab=FrequentTokens(path, size=len(counts)),
        val_anchors=8,
    )
    return module, tmp


def test_training_skips_and_validation_counts_out_of_vocabulary_labels(vocab_module):
    from spec_drafters.data.records import TextRecords, collate
    from spec_drafters.train.anchors import UniformAnchors

    module, _ = vocab_module
    train, _ = TextRecords(path="tests/data/tiny.jsonl", max_length=64).examples(module.tokenizer)
    batch = collate(train[:4])
    sampler = UniformAnchors(max_anchors=8, require_full_block=True)
    inp = module.step_builder(batch, sampler, module.target_source, 1, range(4), noisy=False)
    inside = inp.labels >= 0
    assert inp.scored.any() and (inp.scored & ~inside).any()  # some labelled slots are out of vocabulary
    assert torch.equal(inp.supervised, inp.scored & inside)  # trained: only those it can draft
    sb = module.step_builder.slot_batch(module.step_builder.draft_hidden(inp), inp)
    assert sb.logits.shape[-1] == 13 and bool((sb.labels >= 0).all())
    assert torch.isfinite(module.loss_fn(sb)["loss"])


def test_spec_drafters_and_speculators_layouts_keep_the_mapping_zlab_refuses(vocab_module, tmp_path):
    module, _ = vocab_module
    folder = module.built.folder()
    ids = module.drafter.draft_ids.clone()
    for layout in ("spec_drafters", "speculators"):
        back = read_folder(write_folder(folder, tmp_path / layout, layout), num_target_layers=6)
        assert back.config.draft_vocab_size == len(ids)
        assert torch.equal(back.state["draft_ids"], ids)
    weights = __import__("safetensors.torch").torch.load_file(str(tmp_path / "speculators/model.safetensors"))
    assert torch.equal(weights["d2t"] + torch.arange(len(ids)), ids)  # target id = draft id + d2t
    assert int(weights["t2d"].sum()) == len(ids) and bool(weights["t2d"][ids].all())
    with pytest.raises(ValueError, match="z-lab layout has no draft vocabulary"):
        write_folder(folder, tmp_path / "zlab", "zlab")


def test_build_drafter_reads_a_bf16_folder_with_a_draft_vocabulary(vocab_module, tmp_path):
    """A shipped folder (bf16, as `export --dtype bfloat16` writes) holds the int64 draft_ids beside the
    weights: the drafter keeps the weights' precision and the mapping (it once took draft_ids' dtype)."""
    module, _ = vocab_module
    folder = module.built.folder()
    folder.state = {k: v.bfloat16() if v.is_floating_point() else v for k, v in folder.state.items()}
    drafter = build_drafter(read_folder(write_folder(folder, tmp_path / "bf16"), num_target_layers=6))
    assert drafter.fc.weight.dtype == torch.bfloat16 and drafter.draft_ids.dtype == torch.long
    assert torch.equal(drafter.draft_ids, module.drafter.draft_ids)
    for key, value in module.drafter.state_dict().items():
        assert torch.equal(
            drafter.state_dict()[key], value.bfloat16() if value.is_floating_point() else value
        ), key


def test_a_folder_vocabulary_is_the_one_it_was_trained_with(vocab_module, tmp_path):
    module, _ = vocab_module
    folder = module.built.folder()
    ids = module.drafter.draft_ids.clone()
    for layout in ("spec_drafters", "speculators"):
        path = write_folder(folder, tmp_path / layout, layout)
        assert torch.equal(FolderVocab(str(path)).token_ids(module.vocab_size), ids)
    with pytest.raises(ValueError, match=r"not sorted distinct ids of 0\.\.9"):
        FolderVocab(str(tmp_path / "speculators")).token_ids(10)
    whole = write_folder(tiny_module_without_vocab().built.folder(), tmp_path / "whole", "spec_drafters")
    with pytest.raises(ValueError, match="drafts over the whole vocabulary"):
        FolderVocab(str(whole)).token_ids(module.vocab_size)
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors"):
        FolderVocab(str(tmp_path / "nowhere")).token_ids(module.vocab_size)


def tiny_module_without_vocab():
    return DFlashModule(
        target=TinyRandom(num_layers=6), drafter=DrafterConfig(num_layers=1, block_size=4),
        injection=AllButLast(num_taps=3),
    )  # fmt: skip


def test_a_draft_vocabulary_reads_the_head_rows_through_a_packed_head():
    """Decoding packs the target's linears (kernels.py): the draft head must still find the rows; its
    own slice runs packed without gradients and on the plain product (with gradients) in training."""
    from spec_drafters.model.kernels import PackedLinear

    head = torch.nn.Linear(64, 2048, bias=False).requires_grad_(False)  # 131k elements: packable
    cfg = replace(tiny_drafter(tiny_target()).config, hidden_size=64, draft_vocab_size=1024)
    drafter = DFlashDrafter(cfg)
    ids = torch.arange(0, 2048, 2)  # 1024 x 64 = 65,536 elements: the slice is packable too
    drafter.draft_ids.copy_(ids)
    hidden = torch.randn(4, 64, requires_grad=True)
    want = head(hidden)[:, ids]
    with torch.no_grad():
        torch.testing.assert_close(drafter.logits(hidden, PackedLinear(head)), want, rtol=1e-4, atol=1e-5)
    assert drafter._head_rows[2] is not None  # the packed copy served it
    got = drafter.logits(hidden, head)  # training: the plain product, gradients reach the hidden state
    torch.testing.assert_close(got, want)
    got.sum().backward()
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()


def test_draft_head_rows_built_during_validation_serve_the_training_steps_after_it():
    """Lightning validates under inference_mode: the cached slice of the head must not be an inference
    tensor, or the next training step fails (a fit with a validation every N steps)."""
    head = torch.nn.Linear(64, 2048, bias=False).requires_grad_(False)
    drafter = DFlashDrafter(
        replace(tiny_drafter(tiny_target()).config, hidden_size=64, draft_vocab_size=1024)
    )
    ids = torch.arange(0, 2048, 2)
    drafter.draft_ids.copy_(ids)
    hidden = torch.randn(4, 64, requires_grad=True)
    with torch.inference_mode():
        first = drafter.logits(hidden.detach(), head)
    got = drafter.logits(hidden, head)  # the same cached slice, now with gradients
    got.square().sum().backward()
    torch.testing.assert_close(got.detach(), first)
    torch.testing.assert_close(got.detach(), head(hidden.detach())[:, ids])
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()
