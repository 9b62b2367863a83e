"""The one decode summary (decode/summary.py) against numbers worked out by hand."""

import pytest

from spec_drafters.decode.generate import DecodeResult
from spec_drafters.decode.summary import prompt_row, summarize


def test_summary_by_hand():
    # prompt A: 6 tokens in 2 s, rounds committing 3 and 2 (the first token comes from the prefill);
    # prompt B: 4 tokens in 1 s, rounds committing 1, 1, 1. Plain greedy: 6 tokens in 3 s, 4 in 2 s.
    a = DecodeResult([1, 2, 3, 4, 5, 6], 2.0, [3, 2])
    b = DecodeResult([7, 8, 9, 10], 1.0, [1, 1, 1])
    rows = [
        prompt_row(a, DecodeResult([1, 2, 3, 4, 5, 6], 3.0, [1] * 5)),
        prompt_row(b, DecodeResult([7, 8, 9, 11], 2.0, [1] * 3)),  # differs: not lossless
    ]
    assert rows[0]["tau"] == 2.5 and rows[1]["tau"] == 1.0 and rows[0]["speedup"] == pytest.approx(1.5)
    got = summarize(rows)
    assert got["prompts"] == 2
    assert got["tau"] == pytest.approx((2.5 + 1.0) / 2)  # mean of per-prompt means
    assert got["tau_pooled"] == pytest.approx((3 + 2 + 1 + 1 + 1) / 5)  # all committed over all rounds
    assert got["tokens_per_s"] == pytest.approx(10 / 3)
    assert got["greedy_tokens_per_s"] == pytest.approx(10 / 5)
    assert got["speedup"] == pytest.approx((10 / 3) / 2)
    assert got["lossless"] == 0.5


def test_summary_without_greedy_has_no_speedup():
    got = summarize([prompt_row(DecodeResult([1, 2], 1.0, [1]))])
    assert "speedup" not in got and "lossless" not in got and got["tau"] == 1.0
    with pytest.raises(ValueError, match="no prompts"):
        summarize([])


def test_decode_prompt_runs_each_baseline_once_before_the_decoders():
    from spec_drafters.decode.sampling import GREEDY, Sampling
    from spec_drafters.decode.summary import decode_prompt

    calls = []
    hot = Sampling(temperature=0.7, top_p=1.0, seed=1)

    def plain(prompt, sampling):
        calls.append(("plain", sampling.greedy))
        return DecodeResult([1, 2, 3], 1.0, [1, 1, 1])

    def decoder(name, tokens):
        def decode(prompt):
            calls.append((name, None))
            return DecodeResult(tokens, 0.5, [len(tokens)])

        return decode

    decoders = {"": (decoder("a", [1, 2, 3]), GREEDY), "_b": (decoder("b", [1, 2]), GREEDY)}
    decoders["_c"] = (decoder("c", [1, 2, 3]), hot)
    rows = decode_prompt([5, 6], decoders, plain)
    assert calls == [("plain", True), ("plain", False), ("a", None), ("b", None), ("c", None)]
    assert rows[""][0]["lossless"] is True and rows["_b"][0]["lossless"] is False
    assert rows["_c"][0]["lossless"] is None  # sampled: lossless in distribution only
    assert rows[""][0] == prompt_row(rows[""][1], DecodeResult([1, 2, 3], 1.0, [1, 1, 1]))
    assert "speedup" not in decode_prompt([5], {"": decoders[""]}, None)[""][0]  # no baseline


def test_generate_and_the_decoding_callback_decode_a_prompt_alike(capsys):
    """The per-prompt rule of `spec-drafters generate` and of SpeculativeDecodingEval is one function:
    on the same setup and prompt both give the same tokens, rounds and lossless flags."""
    import argparse
    from types import SimpleNamespace

    from spec_drafters.cli.generate import _decode
    from spec_drafters.cli.setup_args import load_setup
    from spec_drafters.decode.generate import sample_generate
    from spec_drafters.decode.summary import decode_prompt
    from spec_drafters.lightning.callbacks import SpeculativeDecodingEval

    setup = load_setup(["--config", "tests/configs/tiny.yaml"], quiet=True)
    prompt = setup.tokenizer.encode("def add(a, b):")
    cli = _decode(setup, 0, prompt, "greedy_chain", argparse.Namespace(max_new_tokens=12, no_greedy=False))
    callback = SpeculativeDecodingEval(max_new_tokens=12)
    eos = setup.card.eos_token_ids
    rows = decode_prompt(
        prompt,
        callback._decoders(SimpleNamespace(built=setup)),
        lambda p, s: sample_generate(setup.target, p, 12, eos, s),
    )
    row, result = rows[""]
    assert cli["output"] == setup.tokenizer.decode(result.tokens)
    for key in ("new_tokens", "rounds", "committed", "accept_lengths", "lossless", "greedy_tokens"):
        assert cli[key] == row[key], key
    assert cli["lossless"] is True
