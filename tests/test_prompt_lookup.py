"""Prompt lookup on the project's own decode path (decode/generate.py ``prompt_lookup_generate``) against
transformers' ``generate(prompt_lookup_num_tokens=...)``, kept here only as the reference: the same
candidate for every history, output equal to plain greedy, and the same rounds and tau wherever the
two schedules agree (transformers also verifies a copy inside its prefill forward; we do not, like
greedy and the drafters)."""

import random
import time

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from conftest import tiny_drafter, tiny_target
from spec_drafters.decode.generate import (
    DecodeResult,
    PromptLookup,
    greedy_generate,
    prompt_lookup_generate,
    speculative_generate,
)
from spec_drafters.decode.lookup import graft, lookup_continuation
from spec_drafters.decode.verifiers import GreedyChain


@torch.no_grad()
def transformers_prompt_lookup(target, prompt, max_new_tokens, eos_ids, num_tokens) -> DecodeResult:
    """transformers' prompt-lookup decoding, greedy, on stock kernels (what the benchmarks timed before
    the in-project decoder): tau counted like ours, tokens after the first per forward after the first."""
    model = target.model
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    ids = torch.tensor([prompt], device=target.embed_tokens.weight.device)
    t0 = time.perf_counter()
    try:
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            prompt_lookup_num_tokens=num_tokens,
            eos_token_id=eos_ids or None,
            pad_token_id=eos_ids[0] if eos_ids else 0,
        )
    finally:
        hook.remove()
    tokens = out[0, len(prompt) :].tolist()
    return DecodeResult(tokens, time.perf_counter() - t0, verify_forwards=len(calls) - 1)


def transformers_candidate(history, num_tokens, max_ngram) -> list[int]:
    generator = PromptLookupCandidateGenerator(
        num_output_tokens=num_tokens, max_matching_ngram_size=max_ngram, max_length=len(history) + 100
    )
    got, _ = generator.get_candidates(torch.tensor([history]))
    return got[0, len(history) :].tolist()


def test_the_candidate_is_transformers_for_every_history():
    rng = random.Random(0)
    for _ in range(3000):
        vocab = rng.choice([2, 3, 5, 12])  # small vocabularies: many matches, overlaps and runs
        history = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        k, n = rng.randint(1, 8), rng.randint(1, 4)
        want = transformers_candidate(history, k, n)
        assert lookup_continuation(history, n, 1, k, earliest=True) == want, (history, k, n)
        assert PromptLookup(k, n).with_context(_empty(), history, k).tokens == want


def test_earliest_and_most_recent_by_hand():
    history = [1, 2, 7, 3, 1, 2, 8, 4, 1, 2]
    assert lookup_continuation(history, 2, 1, 2, earliest=True) == [7, 3]  # transformers': the first
    assert lookup_continuation(history, 2, 1, 2) == [8, 4]  # lookup_hybrid's: the most recent
    assert lookup_continuation([5, 5, 5], 2, 1, 4, earliest=True) == [5]  # never the suffix itself


def _empty():
    return GreedyChain().propose(torch.zeros(0, 4))


def _self_text_prompts(target, n, seed):
    """Prompts that are the target's own greedy text: where that text loops, so does its continuation,
    and copies are right (a random tiny target seldom repeats a prompt it did not write)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        head = [rng.randrange(256) for _ in range(4)]
        out.append(head + greedy_generate(target, head, 40, eos_ids=[]).tokens)
    return out


def prefill_matches(prompt, want, num_tokens, eos_ids) -> int:
    """How many of transformers' first copy (read from the prompt alone and checked inside its prefill
    forward) equal the target's first tokens: transformers commits them in that forward, where greedy,
    the drafters and our prompt lookup commit the target's first token only."""
    eos = torch.tensor(eos_ids) if eos_ids else None
    generator = PromptLookupCandidateGenerator(eos, num_tokens, 2, len(prompt) + len(want))
    copy = generator.get_candidates(torch.tensor([prompt]))[0][0, len(prompt) :].tolist()
    m = 0
    while m < min(len(copy), len(want) - 1) and copy[m] == want[m]:
        m += 1
    return m


def check_against_transformers(
    target, prompt, max_new_tokens, eos_ids, num_tokens
) -> tuple[DecodeResult, int]:
    """Ours equals plain greedy, and transformers' rounds after its first forward are exactly ours
    from where that forward left off (the prompt + the m copied tokens it accepted there): the same
    copy (offset, n-gram, length), the same acceptance and the same budget and EOS cut every round."""
    want = greedy_generate(target, prompt, max_new_tokens, eos_ids).tokens
    ref = transformers_prompt_lookup(target, prompt, max_new_tokens, eos_ids, num_tokens)
    got = prompt_lookup_generate(target, prompt, max_new_tokens, eos_ids, num_tokens=num_tokens)
    assert got.tokens == want == ref.tokens
    assert got.committed == len(got.tokens) - 1
    m = prefill_matches(prompt, want, num_tokens, eos_ids)
    rest = prompt_lookup_generate(target, prompt + want[:m], max_new_tokens - m, eos_ids, num_tokens)
    assert rest.tokens == want[m:]
    ours, theirs = (rest.rounds, rest.committed + m), (ref.rounds, ref.committed)
    assert ours == theirs, f"rounds, committed differ from transformers': {ours} {theirs} ({prompt}, m {m})"
    if m == 0:  # the same schedule from the start: the same tau
        assert (got.rounds, got.tau) == (ref.rounds, ref.tau)
    return got, m


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
def test_lossless_and_round_for_round_transformers(architecture):
    target = tiny_target(architecture, dtype="float64", seed=4)
    taus, shifted = [], 0
    for num_tokens in (3, 7):
        for prompt in _self_text_prompts(target, 3, seed=1):
            got, m = check_against_transformers(target, prompt, 24, [], num_tokens)
            taus.append(got.tau)
            shifted += m > 0
    assert sum(taus) / len(taus) > 1.3  # copies were accepted: the equality is not greedy's 1 = 1
    assert shifted  # and transformers' prefill copy was right somewhere: the shift was exercised


def _most_recent(self, tree, history, depth):  # lookup_hybrid's occurrence
    return graft(tree, lookup_continuation(history, self.max_ngram, 1, min(self.num_tokens, depth)))


def _one_off(self, tree, history, depth):  # the first occurrence, copied from one token too far
    copy = lookup_continuation(history, self.max_ngram, 1, min(self.num_tokens, depth) + 1, earliest=True)
    return graft(tree, copy[1:])


@pytest.mark.parametrize("wrong", [_most_recent, _one_off])
def test_a_wrong_rule_is_caught(wrong):
    """Another occurrence or a copy one token off: still lossless, but the comparison with transformers
    fails. (A prompt found by search where both rules' rounds differ from transformers'.)"""
    target = tiny_target("qwen3", dtype="float64", seed=4)
    prompt = [107, 197, 169, 181, 82, 192, 139, 70, 12, 211, 12, 12, 7]
    prompt += [11, 42, 114, 16, 181, 66, 179, 40, 107, 197, 169, 181]
    check_against_transformers(target, prompt, 12, [], 4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PromptLookup, "with_context", wrong)
        with pytest.raises(AssertionError, match="differ from transformers"):
            check_against_transformers(target, prompt, 12, [], 4)
        want = greedy_generate(target, prompt, 12, [])
        assert prompt_lookup_generate(target, prompt, 12, [], 4).tokens == want.tokens


def test_eos_and_budget_counted_as_transformers():
    """A copy that runs past an EOS commits up to the EOS (transformers cuts its candidates there), and
    the last rounds never draft past the budget."""
    target = tiny_target("qwen3", dtype="float64", seed=4)
    for prompt in _self_text_prompts(target, 2, seed=1):
        full = greedy_generate(target, prompt, 16, eos_ids=[]).tokens
        eos = [full[9]]  # a token the continuation reaches, maybe inside a copied stretch
        for budget in (1, 2, 5, 16):
            check_against_transformers(target, prompt, budget, eos, 7)


def test_lossless_on_random_prompts_and_no_drafter_pass():
    target = tiny_target("llama", dtype="float64", seed=7)
    rng = random.Random(2)
    for _ in range(4):
        prompt = [rng.randrange(256) for _ in range(rng.randint(1, 20))]
        got = prompt_lookup_generate(target, prompt, 24, eos_ids=[], num_tokens=5)
        assert got.tokens == greedy_generate(target, prompt, 24, eos_ids=[]).tokens


def test_prompt_lookup_goes_without_a_drafter_only():
    target = tiny_target("qwen3")
    with pytest.raises(ValueError, match="PromptLookup"):
        speculative_generate(target, tiny_drafter(target), [1, 2, 3], PromptLookup(3), [1, 2], 4, [])
    with pytest.raises(ValueError, match="PromptLookup"):
        speculative_generate(target, None, [], GreedyChain(), [1, 2], 4, [])
    with pytest.raises(ValueError, match="num_tokens"):
        PromptLookup(0)


def test_benchmark_rows_say_which_prompt_lookup_ran(tmp_path):
    """A decoding-run folder (benchmarks/humaneval_decoding.py): the results line names the prompt lookup
    its rows timed, and pieces that timed transformers' (a folder from before, without the key) are not
    merged with new ones."""
    import argparse
    import json

    from spec_drafters.studies import decoding_runs as bench

    new, old = {"tau_prompt_lookup": 2.0, "prompt_lookup_impl": "fast_path"}, {"tau_prompt_lookup": 2.0}
    assert bench.prompt_lookup_impl([new, new]) == "fast_path"
    assert bench.prompt_lookup_impl([old]) == "transformers"
    assert bench.prompt_lookup_impl([{"tau": 1.0}]) is None
    setting = argparse.Namespace(
        config=[], extra=[], ckpt_path=None, init_from=None, num_prompts=8, parts=1,
        cost_model=None, chain_depth=None, lookup=False, budgets=None,
    )  # fmt: skip
    folder = tmp_path / "pieces"
    folder.mkdir()
    bench.open_folder(setting, folder)
    before = json.loads((folder / "identity.json").read_text())
    assert before["prompt_lookup_impl"] == "fast_path"
    del before["prompt_lookup_impl"]
    (folder / "identity.json").write_text(json.dumps(before))
    with pytest.raises(SystemExit, match="differs in prompt_lookup_impl"):
        bench.open_folder(setting, folder)
