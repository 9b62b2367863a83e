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

from collections.abc import Callable

from spec_drafters.decode.generate import DecodeResult
from spec_drafters.decode.rounds import check_fits
from spec_drafters.decode.sampling import Sampling
from spec_drafters.target.frozen import FrozenTarget


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


#: A decoder to compare: a function prompt -> DecodeResult, and how it chooses tokens (its baseline
#: is plain decoding that chooses them the same way).
Decoder = tuple[Callable[[list[int]], DecodeResult], Sampling]


def check_prompts(target: FrozenTarget, prompts: list[list[int]], max_new_tokens: int, who: str) -> None:
    """Every prompt is checked before any is decoded: a refusal at prompt 9 would lose prompts 0-8."""
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"{who}: prompt {i} is empty (0 tokens); decoding needs a prompt")
        check_fits(target, len(prompt), max_new_tokens, f"{who}: prompt {i}")


def decode_prompt(
    prompt: list[int],
    decoders: dict[str, Decoder],
    plain: Callable[[list[int], Sampling], DecodeResult] | None,
) -> dict[str, tuple[dict, DecodeResult]]:
    """One prompt through every decoder: name -> (its :func:`prompt_row`, its result). The plain baselines run
    first, once per distinct sampling (every greedy decoder shares the greedy run); ``plain`` None:
    no baseline (no speedup, no lossless)."""
    baselines = {}
    if plain is not None:
        for sampling in dict.fromkeys(s for _, s in decoders.values()):
            baselines[sampling] = plain(prompt, sampling)
    out = {}
    for name, (decode, sampling) in decoders.items():
        result = decode(prompt)
        out[name] = prompt_row(result, baselines.get(sampling), sampled=not sampling.greedy), result
    return out
