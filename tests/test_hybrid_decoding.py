"""Decoding on a hybrid target (Gated-DeltaNet + full attention, ``qwen3_5_text``) is lossless.

The tree-aware Gated-DeltaNet forward and the commit (decode/hybrid.py, docs/hybrid_targets.md) against
brute force node by node, against plain greedy steps' cache, and every decoder's output against plain
greedy on 20 prompts. Float64 tests swap transformers' GDN kernels for exact ones: the stock kernels
compute in float32 whatever the model's dtype, which would let near-ties differ between the chunked
verify and the one-token greedy steps.
"""

import json
import random

import pytest
import torch
import transformers.models.qwen3_5.modeling_qwen3_5 as mq

from conftest import tiny_drafter, tiny_target
from spec_drafters.decode import generate, hybrid, rounds
from spec_drafters.decode.cost import RoundCost
from spec_drafters.decode.generate import greedy_generate, speculative_generate
from spec_drafters.decode.rounds import new_cache
from spec_drafters.decode.verifiers import AdaptiveDDTree, DDTree, GreedyChain, LookupHybrid
from spec_drafters.errors import InputError

FC = [1, 2, 3]


def _exact_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, **_):  # fmt: skip
    """The gated delta rule token by token in the inputs' dtype (the stock kernels cast to float32)."""
    dt = query.dtype
    rep = value.shape[-2] // key.shape[-2]
    query, key = query.repeat_interleave(rep, dim=2), key.repeat_interleave(rep, dim=2)
    query, key, value, beta, g = (x.transpose(1, 2).to(dt) for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        query, key = mq.l2norm(query, dim=-1, eps=1e-6), mq.l2norm(key, dim=-1, eps=1e-6)
    query = query / query.shape[-1] ** 0.5
    b, h, t, dk = key.shape
    s = torch.zeros(b, h, dk, value.shape[-1], dtype=dt) if initial_state is None else initial_state.to(dt)
    out = torch.zeros_like(value)
    for i in range(t):  # the recurrence of transformers' torch_recurrent_gated_delta_rule
        s = s * g[:, :, i].exp()[..., None, None]
        delta = (value[:, :, i] - (s * key[:, :, i, :, None]).sum(-2)) * beta[:, :, i, None]
        s = s + key[:, :, i, :, None] * delta[:, :, None, :]
        out[:, :, i] = (s * query[:, :, i, :, None]).sum(-2)
    return out.transpose(1, 2).contiguous(), (s if output_final_state else None)


@pytest.fixture(scope="module")
def target64():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mq, "torch_chunk_gated_delta_rule", lambda *a, chunk_size=64, **k: _exact_rule(*a, **k))
        mp.setattr(mq, "torch_recurrent_gated_delta_rule", _exact_rule)
        yield tiny_target("qwen3_5", num_layers=8, dtype="float64")


def _random_tree(rng, n):
    return [rng.randrange(256) for _ in range(n)], [-1] + [rng.randrange(i) for i in range(1, n)]


def _root_path(parents, node):
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def _prefill(target, prompt):
    cache = new_cache(target)
    target(torch.tensor([prompt]), cache=cache, use_cache=True)
    return cache


def _verify(target, cache, ids, parents, start):
    depths = [len(_root_path(parents, i)) - 1 for i in range(len(ids))]
    with hybrid.tree_forward(target, parents) as record:
        out = target(
            torch.tensor([ids]),
            position_ids=torch.tensor([depths]) + start,
            attention_mask=rounds.tree_attention_mask(
                start, parents, target.embed_tokens.weight.dtype, "cpu"
            ),
            cache=cache,
            use_cache=True,
        )
    return target.head(out.hidden)[0], record


def _next_logits(target, cache, token, position):
    out = target(
        torch.tensor([[token]]), position_ids=torch.tensor([[position]]), cache=cache, use_cache=True
    )
    return target.head(out.hidden)[0, -1]


def _check_tree_and_commit(target, rng, prompt, n, tol):
    ids, parents = _random_tree(rng, n)
    p = len(prompt)
    cache = _prefill(target, prompt)
    logits, record = _verify(target, cache, ids, parents, p)
    assert torch.isfinite(logits).all()
    for node in range(n):  # brute force: the node's root path after the prompt, no cache
        path = [ids[i] for i in _root_path(parents, node)]
        want = target.head(target(torch.tensor([prompt + path])).hidden)[0, -1]
        torch.testing.assert_close(logits[node], want, atol=tol, rtol=tol)
    path = _root_path(parents, max(range(n), key=lambda i: len(_root_path(parents, i))))
    hybrid.commit(cache, record, p, path)
    ref = _prefill(target, prompt)  # plain greedy steps over the accepted path
    for j, i in enumerate(path):
        _next_logits(target, ref, ids[i], p + j)
    assert int(cache.get_seq_length()) == int(ref.get_seq_length()) == p + len(path)
    for a, b in zip(cache.layers, ref.layers, strict=True):
        pairs = (
            [(a.conv_states[0], b.conv_states[0]), (a.recurrent_states[0], b.recurrent_states[0])]
            if isinstance(a, hybrid._linear_mixin())
            else [(a.keys, b.keys), (a.values, b.values)]
        )
        for x, y in pairs:
            torch.testing.assert_close(x, y, atol=tol, rtol=tol)
    torch.testing.assert_close(
        _next_logits(target, cache, 7, p + len(path)),
        _next_logits(target, ref, 7, p + len(path)),
        atol=tol,
        rtol=tol,
    )


def test_tree_logits_equal_brute_force_and_commit_equals_greedy_steps(target64):
    rng = random.Random(0)
    for p, n in ((1, 1), (2, 5), (7, 17), (20, 9)):
        _check_tree_and_commit(target64, rng, [rng.randrange(256) for _ in range(p)], n, 1e-9)


def test_float32_deep_tree_is_finite_and_exact():
    """A deep tree with stock float32 kernels: off-path decay differences overflow exp unless masked
    first (inf * 0 = NaN)."""
    target = tiny_target("qwen3_5", num_layers=4, dtype="float32", seed=1)
    with torch.no_grad():
        for m in hybrid.gdn_modules(target):
            m.A_log.fill_(4.0)  # decays of about -50 per token: sums along 40 nodes far past float32's range
    rng = random.Random(1)
    _check_tree_and_commit(target, rng, [rng.randrange(256) for _ in range(6)], 40, 2e-4)


def _oracle(full, rng, kinds):
    """Drafter logits whose first choices are the target's own continuation (all accepted), that with
    one slot's truth ranked second or absent (some), or garbage (none): a different mix every round."""

    def draft_logits(target_, drafter_, context, bonus, start, depth):
        logits = torch.randn(
            (depth, 259), dtype=torch.float64, generator=torch.Generator().manual_seed(start)
        )
        kind = rng.choice(kinds)
        truth = full[start + 1 : start + 1 + depth]
        for d, tok in enumerate(truth):
            if kind == "right" or (kind == "some" and d != len(truth) - 1):
                logits[d, tok] = 20.0
            elif kind == "some":
                logits[d, tok] = logits[d].max() - 0.5  # second choice: a tree may still take it
        return logits

    return draft_logits


def _prompts(n):
    rng = random.Random(31)
    return [[rng.randrange(256) for _ in range(rng.choice([1, 2, 3, 5, 9, 17, 30]))] for _ in range(n)]


def test_every_decoder_is_lossless_and_meets_every_acceptance(target64, monkeypatch, tmp_path):
    cost = tmp_path / "cost.json"
    RoundCost([1, 4, 16, 64], [1.0, 1.1, 1.5, 3.0], 0.1).save(cost)
    decoders = {
        "chain": GreedyChain(),
        "ddtree_b1": DDTree(1),
        "ddtree_b4": DDTree(4),
        "ddtree_b32": DDTree(32),
        "adaptive": AdaptiveDDTree(str(cost), max_budget=32),
        "lookup_hybrid": LookupHybrid(DDTree(4)),
    }
    drafter = tiny_drafter(target64, block_size=5)
    n = 14
    rounds = {name: [] for name in decoders}
    for i, prompt in enumerate(_prompts(20)):
        truth = greedy_generate(target64, prompt, n, eos_ids=[]).tokens
        for name, verifier in decoders.items():
            rng = random.Random(i)
            monkeypatch.setattr(
                generate, "draft_logits", _oracle(prompt + truth + [0] * 8, rng, ["right", "some", "none"])
            )
            out = speculative_generate(target64, drafter, FC, verifier, prompt, n, eos_ids=[])
            assert out.tokens == truth, (name, prompt)
            rounds[name] += out.accept_lengths[:-1]  # the last round may be cut by the budget
    for name in ("chain", "ddtree_b32", "adaptive", "lookup_hybrid"):
        got = set(rounds[name])
        assert 1 in got and 5 in got and got & {2, 3, 4}, (name, sorted(got))  # none, all and some accepted


def test_unsupported_recurrent_layer_is_refused_in_one_message():
    target = tiny_target("qwen3_5", num_layers=4, dtype="float32")
    module = target.base.layers[1].linear_attn
    module.__class__ = type("MambaMixer", (type(module),), {})  # a recurrent layer this decoder does not know
    cache = new_cache(target)
    with pytest.raises(
        InputError, match=r"layer 1 \(MambaMixer, cache LinearAttentionLayer\).*greedy decoding"
    ):
        hybrid.check_rollback(target, cache)
    drafter = tiny_drafter(target, block_size=3)
    with pytest.raises(InputError, match="MambaMixer"):
        speculative_generate(target, drafter, FC, GreedyChain(), [1, 2, 3], 4, eos_ids=[])


def test_plain_targets_are_not_hybrid(qwen3_target, hybrid_target):
    assert hybrid.is_hybrid(new_cache(hybrid_target))
    assert not hybrid.is_hybrid(new_cache(qwen3_target))
    hybrid.check_rollback(qwen3_target, new_cache(qwen3_target))  # nothing to refuse


def test_generate_cli_on_the_tiny_hybrid_is_lossless(tmp_path, capsys):
    from spec_drafters.cli.main import main

    out = tmp_path / "gen.jsonl"
    main(
        ["generate", "--config", "tests/configs/tiny_hybrid.yaml", "--prompt", "def add(a, b):",
         "--prompt", "ab", "--max_new_tokens", "8", "--out", str(out),
         "--model.target.init_args.dtype", "float64", "--model.verifier", "DDTree",
         "--model.verifier.init_args.budget", "4"]
    )  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["lossless"] and r["verifier"] == "ddtree" for r in rows)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["lossless"] == 1.0


def test_validate_with_decoding_on_the_tiny_hybrid(tmp_path):
    """``validate`` with the decoding callback on the hybrid target: every greedy decoder lossless, a
    sampled DDTree reported against plain sampling (no lossless for it), a sampling chain's offline tau."""
    from spec_drafters.cli.main import main

    main(
        ["validate", "--config", "tests/configs/tiny_hybrid.yaml", "--trainer.precision", "64-true",
         "--model.target.init_args.dtype", "float64", "--trainer.default_root_dir", str(tmp_path),
         "--results", str(tmp_path / "r.json"), "--trainer.limit_val_batches", "1",
         "--trainer.callbacks+=SpeculativeDecodingEval", "--trainer.callbacks.max_new_tokens", "8",
         "--trainer.callbacks.prompts", "HumanEvalPrompts", "--trainer.callbacks.prompts.num_prompts", "2",
         "--trainer.callbacks.verifiers",
         "[{class_path: DDTree, init_args: {budget: 8}},"
         " {class_path: DDTree, init_args: {budget: 8, temperature: 0.8}}]",
         "--trainer.callbacks.prompt_lookup_tokens", "3",
         "--trainer.callbacks.output", str(tmp_path / "d.jsonl"),
         "--model.eval_verifiers", "[{class_path: GreedyChain, init_args: {temperature: 0.7}}]"]
    )  # fmt: skip
    metrics = json.loads((tmp_path / "r.json").read_text())["metrics"]
    assert metrics["decode/prompts"] == 2
    assert 1 <= metrics["val/tau_greedy_chain_t0.7"] <= 4  # the offline sampled tau (block size 4)
    for suffix in ("", "_ddtree_b8", "_prompt_lookup"):
        assert metrics[f"decode/lossless{suffix}"] == 1.0, suffix
    assert "decode/lossless_ddtree_b8_t0.8" not in metrics and metrics["decode/tau_ddtree_b8_t0.8"] >= 1
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert all(r["lossless_ddtree_b8_t0.8"] is None and r["greedy_tokens_ddtree_b8_t0.8"] > 0 for r in rows)


def test_generate_cli_samples_on_the_tiny_hybrid(tmp_path, capsys):
    from spec_drafters.cli.main import main

    out = tmp_path / "gen.jsonl"
    args = ["generate", "--config", "tests/configs/tiny_hybrid.yaml", "--prompt", "def add(a, b):",
            "--max_new_tokens", "8", "--model.verifier", "GreedyChain",
            "--model.verifier.init_args.temperature", "0.9",
            "--model.verifier.init_args.seed", "3"]  # fmt: skip
    main([*args, "--out", str(out)])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["lossless"] is None and row["new_tokens"] == 8 and row["greedy_tokens"] == 8
    main([*args, "--out", str(tmp_path / "again.jsonl")])
    (again,) = [json.loads(line) for line in (tmp_path / "again.jsonl").read_text().splitlines()]
    assert again["output"] == row["output"]  # one seed, one output


def test_sliding_window_cache_is_refused_and_linted():
    """A cache layer the decoder cannot cut back (a sliding window) is refused before any forward, and
    ``lint`` says so from the config alone (warning decoding-unsupported)."""
    from transformers import DynamicCache, Qwen3Config

    from spec_drafters.artefacts import lint

    sliding = {"sliding_window": 8, "layer_types": ["sliding_attention"] * 2, "use_sliding_window": True}
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, **sliding)  # fmt: skip
    cache = DynamicCache(config=cfg)
    refusal = r"layer 0 \(cache DynamicSlidingWindowLayer\).*greedy decoding"
    with pytest.raises(InputError, match=refusal):
        hybrid.check_rollback(None, cache)

    class Module:  # what lint's decoding check reads
        target = tiny_target("qwen3", num_layers=4)

    assert lint._decoding(Module()) == []
    Module.target.model.config.layer_types = ["sliding_attention"] * 4
    Module.target.model.config.sliding_window = 8
    (found,) = lint._decoding(Module())
    assert found.code == "decoding-unsupported" and found.severity == "warning"
    assert "DynamicSlidingWindowLayer" in found.message


def test_lint_decoding_unsupported_is_an_error_when_the_config_decodes(tmp_path, monkeypatch):
    from spec_drafters.cli.tools import lint_config

    def refuse(target, cache):
        raise InputError("speculative decoding cannot roll back this target's layer 0 (cache Other)")

    monkeypatch.setattr(hybrid, "check_rollback", refuse)
    tiny = ["--config", "tests/configs/tiny.yaml"]
    (found,) = [f for f in lint_config(tiny) if f.code == "decoding-unsupported"]
    assert found.severity == "warning"  # a config that only trains
    decodes = tmp_path / "decodes.yaml"
    decodes.write_text("trainer:\n  callbacks:\n    - class_path: SpeculativeDecodingEval\n")
    (found,) = [f for f in lint_config([*tiny, "--config", str(decodes)]) if f.code == "decoding-unsupported"]
    assert found.severity == "error" and "SpeculativeDecodingEval" in found.message


@pytest.mark.parametrize("path", [[0], [0, 1, 2], [0, 2, 5], [0, 3, 4, 7]])
def test_keep_layer_moves_only_the_path(path):
    """The KV after a round against the plain rule (keep 0..start-1 and the path's entries, gathered);
    a chain prefix is a slice of the same storage (nothing copied)."""
    from transformers.cache_utils import DynamicLayer

    from spec_drafters.target.frozen import keep_layer

    start, verified = 5, 8
    keys = torch.randn(1, 2, start + verified, 4)
    values = torch.randn(1, 2, start + verified, 4)
    layer = DynamicLayer()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys.clone(), values.clone()
    keep = torch.cat([torch.arange(start), start + torch.tensor(path)])
    storage = layer.keys.data_ptr()
    keep_layer(layer, start, path)
    assert torch.equal(layer.keys, keys.index_select(-2, keep))
    assert torch.equal(layer.values, values.index_select(-2, keep))
    assert layer.get_seq_length() == start + len(path) and layer.keys.data_ptr() == storage
