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
