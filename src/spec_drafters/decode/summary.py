"""The decode summary: speculative decoding against plain greedy over a set of prompts, one rule for
every caller (``spec-drafters generate``, the validation callback, the benchmarks).

tau is reported both ways (vLLM #42508): ``tau`` the mean over prompts of each prompt's tokens per
verify forward (what z-lab and the DDTree paper report), ``tau_pooled`` all committed tokens over all
forwards. Speed is pooled: all tokens over all seconds, for each decoder.

A decoder that samples (temperature > 0) is compared with plain sampling at the same settings (its
``greedy_*`` figures are that baseline's); its output cannot equal one plain run token for token, so
``lossless`` is None: sampling is lossless in distribution, which tests/test_sampling.py checks.
"""

from __future__ import annotations

from spec_drafters.decode.generate import DecodeResult


def prompt_row(spec: DecodeResult, plain: DecodeResult | None = None, sampled: bool = False) -> dict:
    """One prompt's numbers (and, with the plain run, its speedup and, unless ``sampled``, whether it
    is lossless: the same tokens as plain greedy decoding)."""
    row = {
        "new_tokens": len(spec.tokens),
        "rounds": spec.rounds,
        "committed": spec.committed,
        "tau": spec.tau,
        "seconds": spec.seconds,
        "tokens_per_s": spec.tokens_per_s,
        "accept_lengths": spec.accept_lengths,
    }
    if plain is not None:
        row.update(
            greedy_tokens=len(plain.tokens),
            greedy_seconds=plain.seconds,
            greedy_tokens_per_s=plain.tokens_per_s,
            speedup=spec.tokens_per_s / max(plain.tokens_per_s, 1e-9),
            lossless=None if sampled else spec.tokens == plain.tokens,
        )
    return row


def summarize(rows: list[dict]) -> dict:
    """Over :func:`prompt_row` rows: prompts, tau, tau_pooled, tokens_per_s, and when the rows have
    the greedy run, greedy_tokens_per_s, speedup (of pooled speeds) and lossless (fraction; None
    for sampled rows)."""
    n = len(rows)
    if n == 0:
        raise ValueError("no prompts to summarise")
    seconds = sum(r["seconds"] for r in rows)
    out = {
        "prompts": n,
        "tau": sum(r["tau"] for r in rows) / n,
        "tau_pooled": sum(r["committed"] for r in rows) / max(1, sum(r["rounds"] for r in rows)),
        "tokens_per_s": sum(r["new_tokens"] for r in rows) / max(seconds, 1e-9),
    }
    if all("greedy_seconds" in r for r in rows):
        greedy = sum(r["greedy_tokens"] for r in rows) / max(sum(r["greedy_seconds"] for r in rows), 1e-9)
        out.update(
            greedy_tokens_per_s=greedy,
            speedup=out["tokens_per_s"] / max(greedy, 1e-9),
            lossless=None
            if any(r["lossless"] is None for r in rows)
            else sum(r["lossless"] for r in rows) / n,
        )
    return out
