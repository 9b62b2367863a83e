"""Sampling at temperature > 0 is lossless in distribution (decode/sampling.py, docs/sampling.md).

The distributional test: on a tiny float64 target and a fixed prompt, one speculative round's first two
committed tokens, over thousands of seeds, against the exact distribution of plain sampling (enumerated
from the target's own probabilities), by a chi-square test. The round is the production one
(``Verifier.propose``, ``with_context``, ``generate.sampled_path``) with the target's verify logits read
from one forward per prefix (memoised): the rule is what is tested, and a second test checks that the
real round (verify forward, caches, hybrid commit) makes exactly the same draws. Rules broken on purpose
must fail the same test, so the test can tell.
"""

import copy

import pytest
import torch

from conftest import tiny_drafter, tiny_target
from spec_drafters.decode import generate, rounds, sampling
from spec_drafters.decode.generate import (
    greedy_generate,
    sample_generate,
    speculative_generate,
    speculative_round,
)
from spec_drafters.decode.rounds import new_cache
from spec_drafters.decode.sampling import Sampling
from spec_drafters.decode.verifiers import DDTree, GreedyChain, LookupHybrid
from spec_drafters.model.drafter import ContextCache

SETTINGS = Sampling(temperature=0.5, top_p=0.7)
PROMPT = [10, 20, 30, 40, 50]
SEEDS = 3000
DEPTH = 2  # drafted slots a round: every prefix a drawn chain can reach is computed up front


class Oracle:
    """The target's next-token distribution after PROMPT + prefix (one memoised forward each)."""

    def __init__(self, target, prompt, settings):
        self.target, self.prompt, self.settings, self.memo = target, prompt, settings, {}

    @torch.no_grad()
    def logits(self, prefix) -> torch.Tensor:
        key = tuple(prefix)
        if key not in self.memo:
            out = self.target(torch.tensor([self.prompt + list(prefix)]))
            self.memo[key] = self.target.head(out.hidden[0, -1])
        return self.memo[key]

    @torch.no_grad()
    def prefetch(self, prefixes) -> None:
        """Fills the memo for many prefixes, one batched forward per prefix length."""
        by_length = {}
        for prefix in {tuple(p) for p in prefixes} - set(self.memo):
            by_length.setdefault(len(prefix), []).append(prefix)
        for group in by_length.values():
            out = self.target(torch.tensor([self.prompt + list(p) for p in group]))
            for prefix, logits in zip(group, self.target.head(out.hidden[:, -1]), strict=True):
                self.memo[prefix] = logits

    def probs(self, prefix) -> torch.Tensor:
        return self.settings.probs(self.logits(prefix))

    def pairs(self) -> dict:
        """P(x1, x2) of plain sampling, enumerated over the support."""
        p1, out = self.probs([]), {}
        self.prefetch([[x1] for x1 in p1.nonzero().flatten().tolist()])
        for x1 in p1.nonzero().flatten().tolist():
            p2 = self.probs([x1])
            for x2 in p2.nonzero().flatten().tolist():
                out[(x1, x2)] = float(p1[x1] * p2[x2])
        return out

    def draft_logits(self, depth=DEPTH, noise=0.7, seed=0) -> torch.Tensor:
        """DFlash-like slot logits: independent per slot, near the target's distribution along its
        most likely path (so that drafts are often accepted), perturbed."""
        g = torch.Generator().manual_seed(seed)
        rows, path = [], []
        for _ in range(depth):
            p = self.probs(path)
            rows.append(torch.log(p + 1e-3) + noise * torch.randn(p.shape, generator=g, dtype=p.dtype))
            path.append(int(p.argmax()))
        logits = torch.stack(rows) * self.settings.temperature  # the verifier divides by it again
        # Every prefix a chain drawn from these slots can reach (batched now, not one by one later).
        reach = [[]]
        for q in self.settings.probs(logits):
            reach += [
                [*r, x] for r in reach if len(r) == len(reach[-1]) for x in q.nonzero().flatten().tolist()
            ]
        self.prefetch(reach)
        return logits


def one_round(oracle, verifier, draft_logits, rng, history=None) -> list[int]:
    """One production round from the prompt's last token (the root), with memoised verify logits;
    returns the first two committed tokens (a second one plainly sampled when the round committed one)."""
    tree = verifier.propose(draft_logits, rng)
    tree = verifier.with_context(tree, history or oracle.prompt, draft_logits.shape[0])
    prefixes = [[]]
    for parent, token in zip(tree.parents, tree.tokens, strict=True):
        prefixes.append(prefixes[parent + 1] + [token])
    logits = torch.stack([oracle.logits(p) for p in prefixes])  # (T, V): after the root and each node
    path, nxt = generate.sampled_path(tree, logits, verifier.sampling, rng)
    out = [tree.tokens[i - 1] for i in path[1:]] + [nxt]
    if len(out) < 2:
        out.append(sampling.draw(oracle.probs(out), rng))
    return out[:2]


def chi_square(counts: dict, exact: dict, n: int) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value); cells expected below 5 are pooled."""
    cells, pooled_o, pooled_e = [], 0, 0.0
    for key, pe in exact.items():
        if pe * n >= 5:
            cells.append((counts.get(key, 0), pe * n))
        else:
            pooled_o, pooled_e = pooled_o + counts.get(key, 0), pooled_e + pe * n
    impossible = sum(c for key, c in counts.items() if key not in exact)
    assert impossible == 0, f"{impossible} draws outside the support of plain sampling"
    cells.append((pooled_o, pooled_e))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    pvalue = torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2))
    return stat, dof, float(pvalue)


@pytest.fixture(scope="module")
def oracle():
    return Oracle(tiny_target("qwen3", dtype="float64"), PROMPT, SETTINGS)


def _pvalue(oracle, rule) -> float:
    counts = {}
    for seed in range(SEEDS):
        pair = tuple(rule(torch.Generator().manual_seed(seed)))
        counts[pair] = counts.get(pair, 0) + 1
    return chi_square(counts, oracle.pairs(), SEEDS)[2]


def _chain_on_argmax_drafts(oracle, logits):
    """The chain rule applied to drafts that were not drawn from q (the drafter's argmax, as DDTree's
    nodes are): its premise fails, so it must fail the test."""

    def rule(rng):
        verifier = GreedyChain(temperature=SETTINGS.temperature, top_p=SETTINGS.top_p)
        tree = GreedyChain().propose(logits)  # argmax drafts
        tree.draft_probs = verifier.sampling.probs(logits)  # claimed, not true
        prefixes = [[]] + [tree.tokens[: i + 1] for i in range(len(tree.tokens))]
        all_logits = torch.stack([oracle.logits(p) for p in prefixes])
        path, nxt = generate.sampled_path(tree, all_logits, verifier.sampling, rng)
        out = [*tree.tokens[: len(path) - 1], nxt]
        return ([*out, sampling.draw(oracle.probs(out), rng)])[:2]

    return rule


def _rules(oracle):
    logits = oracle.draft_logits()
    t, top_p = SETTINGS.temperature, SETTINGS.top_p
    chain = GreedyChain(temperature=t, top_p=top_p)
    tree = DDTree(8, temperature=t, top_p=top_p)
    lookup = LookupHybrid(GreedyChain(temperature=t, top_p=top_p), length=3)
    repeat = [*PROMPT, 40]  # history ending in a repeated token: the copy is [50, 40]
    return {
        "chain": lambda rng: one_round(oracle, chain, logits, rng),
        "ddtree_b8": lambda rng: one_round(oracle, tree, logits, rng),
        "lookup_hybrid": lambda rng: one_round(oracle, lookup, logits, rng, history=repeat),
    }


@pytest.mark.parametrize("rule", ["chain", "ddtree_b8", "lookup_hybrid"])
def test_speculative_sampling_matches_plain_sampling(oracle, rule):
    p = _pvalue(oracle, _rules(oracle)[rule])
    assert p > 1e-3, f"{rule}: the first two tokens are not distributed as plain sampling (p = {p:.2g})"


def test_the_test_fails_broken_rules(oracle, monkeypatch):
    """Control: a chain that redraws a rejected token from p instead of the residual, and the chain
    rule on drafts that were not drawn from q, both fail the same test."""
    logits = oracle.draft_logits()
    wrong_premise = _pvalue(oracle, _chain_on_argmax_drafts(oracle, logits))
    assert wrong_premise < 1e-6, wrong_premise
    broken = sampling.chain_accept
    monkeypatch.setattr(generate, "chain_accept", lambda *a: broken(*a, broken=True))
    residual = _pvalue(oracle, _rules(oracle)["chain"])
    assert residual < 1e-6, residual


def test_plain_sampling_control(oracle):
    """The test's own control: plain sampling through ``next_token`` passes it."""

    def plain(rng):
        x1 = generate.next_token(oracle.logits([]), SETTINGS, rng)
        return [x1, generate.next_token(oracle.logits([x1]), SETTINGS, rng)]

    p = _pvalue(oracle, plain)
    assert p > 1e-3, p


@pytest.mark.parametrize("architecture", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("kind", ["chain", "ddtree", "lookup_hybrid"])
def test_real_round_makes_the_tested_draws(architecture, kind):
    """The real round (verify forward with its cache, the hybrid commit) commits what the memoised
    rule above commits from the same generator state, seed after seed."""
    target = tiny_target(architecture, num_layers=8, dtype="float64")
    drafter = tiny_drafter(target)
    oracle = Oracle(target, PROMPT[:-1], SETTINGS)  # the root is the prompt's last token
    t, top_p = SETTINGS.temperature, SETTINGS.top_p
    verifier = {
        "chain": GreedyChain(temperature=t, top_p=top_p),
        "ddtree": DDTree(6, temperature=t, top_p=top_p),
        "lookup_hybrid": LookupHybrid(GreedyChain(temperature=t, top_p=top_p)),
    }[kind]
    cache = new_cache(target)
    with torch.no_grad():
        out = target(torch.tensor([PROMPT[:-1]]), cache=cache, use_cache=True)
    features = rounds.tap_features(out, [1, 2, 3], list(range(len(PROMPT) - 1)))
    history = [*PROMPT, 30]  # a repeat: lookup_hybrid grafts a copy
    for seed in range(5):
        context = ContextCache(drafter)
        context.append(features)
        real_rng, memo_rng = (torch.Generator().manual_seed(seed) for _ in range(2))
        with torch.no_grad():
            logits = rounds.draft_logits(target, drafter, context, PROMPT[-1], len(PROMPT) - 1, 3)
            _, committed = speculative_round(
                target, drafter, [1, 2, 3], verifier, copy.deepcopy(cache), context, PROMPT[-1],
                len(PROMPT) - 1, 3, history, real_rng,
            )  # fmt: skip
        tree = verifier.with_context(verifier.propose(logits, memo_rng), history, 3)
        prefixes = [[PROMPT[-1]]]
        for parent, token in zip(tree.parents, tree.tokens, strict=True):
            prefixes.append(prefixes[parent + 1] + [token])
        path, nxt = generate.sampled_path(
            tree, torch.stack([oracle.logits(p) for p in prefixes]), verifier.sampling, memo_rng
        )
        assert committed == [tree.tokens[i - 1] for i in path[1:]] + [nxt], (seed, kind)


@pytest.mark.parametrize("architecture", ["qwen3", "qwen3_5"])
def test_sampled_decoding_is_reproducible_and_greedy_at_low_temperature(architecture):
    target = tiny_target(architecture, num_layers=8, dtype="float64")
    drafter = tiny_drafter(target)
    prompt, n = [5, 9, 5, 9, 7, 5], 8
    greedy = greedy_generate(target, prompt, n, []).tokens
    for make in (
        lambda **k: GreedyChain(**k),
        lambda **k: DDTree(6, **k),
        lambda **k: LookupHybrid(GreedyChain(**k)),
    ):
        one = speculative_generate(target, drafter, [1, 2, 3], make(temperature=0.8, seed=1), prompt, n, [])
        again = speculative_generate(target, drafter, [1, 2, 3], make(temperature=0.8, seed=1), prompt, n, [])
        assert one.tokens == again.tokens  # one seed, one output
        # Near zero temperature the target's draws are its argmax: the output is the greedy one.
        cold = speculative_generate(target, drafter, [1, 2, 3], make(temperature=1e-4, seed=2), prompt, n, [])
        assert cold.tokens == greedy
    assert sample_generate(target, prompt, n, [], Sampling(1e-4)).tokens == greedy
    assert sample_generate(target, prompt, n, [], Sampling(0.8, seed=1)).tokens != greedy


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1}, "temperature must be a finite number >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
        ({"temperature": 0.5, "top_p": 0}, "top_p must be in (0, 1]"),
        ({"temperature": 0, "top_p": 0.9}, "needs temperature > 0"),
    ],
)
def test_bad_sampling_settings_are_refused(kwargs, message):
    for make in (GreedyChain, lambda **k: DDTree(4, **k)):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            make(**kwargs)


def test_greedy_default_is_unchanged():
    """Greedy verifiers keep their labels and never take a generator: temperature 0 is today's path."""
    assert GreedyChain().label() == "greedy_chain" and DDTree(8).label() == "ddtree_b8"
    assert GreedyChain(temperature=0.7, top_p=0.9).label() == "greedy_chain_t0.7_p0.9"
    logits = torch.randn(3, 11)
    assert GreedyChain().propose(logits, torch.Generator()).tokens == logits.argmax(-1).tolist()


# --- the offline analogue of tau (docs/sampling.md, "Offline metrics") ---------------------------


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_offline_chain_reach_is_the_real_rules_frequency(draft_vocab):
    """chain_reach(chain_acceptance(p, q)) against the rule itself (``chain_accept``) drawing drafts from
    q, many times, with each slot's target distribution fixed (teacher-forced); over a draft
    vocabulary q is 0 outside it and p is restricted, not renormalised."""
    gen = torch.Generator().manual_seed(3)
    vocab, depth, trials = 7, 3, 20000
    settings = Sampling(temperature=0.9, top_p=0.8)
    p = settings.probs(torch.randn(depth, vocab, generator=gen, dtype=torch.float64) * 2)
    ids = torch.tensor([0, 2, 3, 5]) if draft_vocab else torch.arange(vocab)
    q_d = settings.probs(torch.randn(depth, len(ids), generator=gen, dtype=torch.float64) * 2)
    q = torch.zeros(depth, vocab, dtype=torch.float64).index_copy_(1, ids, q_d)  # q in target ids
    want = sampling.chain_reach(sampling.chain_acceptance(p[:, ids], q_d))  # (D,)
    rng = torch.Generator().manual_seed(4)
    hits = torch.zeros(depth, dtype=torch.float64)
    for _ in range(trials):
        drafts = torch.multinomial(q, 1, generator=rng)[:, 0].tolist()
        accepted, _ = sampling.chain_accept(drafts, q, lambda k: p[min(k, depth - 1)], rng)
        hits[:accepted] += 1
    got = hits / trials
    assert torch.allclose(got, want, atol=4 * 0.5 / trials**0.5), (got, want)  # 4 standard errors
    assert not torch.allclose(want, torch.ones(depth, dtype=torch.float64))  # not a trivial case


def test_offline_sampled_tau_at_low_temperature_is_greedy_tau():
    """Near temperature 0 each alpha is 1 where the drafter's argmax is the target's and 0 elsewhere:
    the sampled chain's offline tau and curve equal the greedy chain's, block by block; at 0.8 they
    differ and stay within [1, K]."""
    from spec_drafters.lightning.metrics import OfflineAcceptance

    gen = torch.Generator().manual_seed(0)
    blocks, k, vocab = 40, 5, 11
    target = torch.randn(blocks, k - 1, vocab, generator=gen, dtype=torch.float64) * 3
    labels = target.argmax(-1)
    draft = torch.randn(blocks, k - 1, vocab, generator=gen, dtype=torch.float64) * 3
    right = torch.rand(blocks, k - 1, generator=gen) < 0.7  # the drafter agrees on 70% of slots
    draft[right] = target[right] * 2
    anchor_ok = torch.ones(4, blocks // 4, dtype=torch.bool)
    cold, warm = GreedyChain(temperature=1e-6), GreedyChain(temperature=0.8)
    metrics = OfflineAcceptance.for_verifiers(k, GreedyChain(), [cold, warm])
    assert metrics.needs_distribution
    metrics.update(draft, labels, anchor_ok, lambda sel: target[sel])
    out, curves, _ = metrics.compute()
    assert 1.5 < out["tau"] < k - 0.5  # some blocks accept, some do not
    assert out["tau_greedy_chain_t1e-06"] == pytest.approx(out["tau"], abs=1e-6)
    assert curves["greedy_chain_t1e-06"] == pytest.approx(curves["chain"], abs=1e-6)
    assert out["tau_greedy_chain_t0.8"] != pytest.approx(out["tau"], abs=1e-3)
    assert 1 <= out["tau_greedy_chain_t0.8"] <= k


def test_validation_reads_the_target_distribution_at_the_labelled_slots():
    """The module's sampled tau reads the target's logits at exactly the slots the labels come from:
    their argmax is the label wherever the label is the target's output."""
    from spec_drafters.data.records import TextRecords, collate
    from spec_drafters.lightning.module import DFlashModule
    from spec_drafters.model.drafter import DrafterConfig
    from spec_drafters.target.injection import AllButLast
    from spec_drafters.target.loaders import TinyRandom

    torch.manual_seed(0)
    module = DFlashModule(
        target=TinyRandom(num_layers=6), drafter=DrafterConfig(num_layers=1, block_size=4),
        injection=AllButLast(num_taps=3), val_anchors=8,
        eval_verifiers=[GreedyChain(temperature=0.7, top_p=0.9)],
    )  # fmt: skip
    _, val = TextRecords(path="tests/data/tiny.jsonl", max_length=64).examples(module.tokenizer)
    with torch.no_grad():
        _, per_block, labels, anchor_ok, target_logits = module.held_out_blocks(collate(val[:2]), 0)
        assert target_logits is not None and per_block.shape[0] == int(anchor_ok.sum()) > 2
        logits = torch.cat([target_logits(slice(i, i + 2)) for i in range(0, per_block.shape[0], 2)])
        assert torch.equal(logits.argmax(-1), labels)
        module.offline.update(per_block, labels, anchor_ok, target_logits)
    out, _, _ = module.offline.compute()
    assert 1 <= out["tau_greedy_chain_t0.7_p0.9"] <= 4


def test_offline_sampled_tau_refusals():
    from spec_drafters.errors import ArgumentError
    from spec_drafters.lightning.module import DFlashModule
    from spec_drafters.model.drafter import DrafterConfig
    from spec_drafters.target.injection import AllButLast
    from spec_drafters.target.labels import DatasetTokens
    from spec_drafters.target.loaders import TinyRandom

    common = dict(
        target=TinyRandom(num_layers=6), drafter=DrafterConfig(num_layers=1, block_size=4),
        injection=AllButLast(num_taps=3),
    )  # fmt: skip
    with pytest.raises(ArgumentError, match=r"ddtree_b8_t0\.7 samples.*no offline tau") as bad:
        DFlashModule(**common, eval_verifiers=[DDTree(8, temperature=0.7)])
    assert bad.value.argument == "eval_verifiers"
    with pytest.raises(ArgumentError, match="dataset_tokens does not have") as bad:
        DFlashModule(
            **common, val_target_source=DatasetTokens(), eval_verifiers=[GreedyChain(temperature=0.7)]
        )
    assert bad.value.argument == "val_target_source"
    # A configured sampling tree is measured greedy, under its greedy label.
    module = DFlashModule(**common, verifier=DDTree(8, temperature=0.7))
    assert "ddtree_b8" in module.offline.verifiers and not module.offline.needs_distribution
