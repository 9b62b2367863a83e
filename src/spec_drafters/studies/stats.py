"""The statistics the studies' tables quote: an exact permutation test over seeds, a percentile
bootstrap over prompts, and two decoding-run folders paired prompt by prompt (docs/experiments.md
"Statistics")."""

from __future__ import annotations

import itertools
import random

from spec_drafters.studies.decoding_runs import DECODERS

# The recipe study's metrics (experiments/ablation.py): chain tau, DDTree tau at B = 32, calibration, slot 1.
METRICS = ("val/tau", "val/tau_ddtree_b32", "val/calibration_ece", "val/acc_slot1")


def permutation_p(a: list[float], b: list[float]) -> float:
    """One-sided exact permutation test: the share of the ways to split ``a + b`` into groups of
    ``len(a)`` and ``len(b)`` whose difference of means is at least ``mean(a) - mean(b)`` (the observed
    split included). Seeds are exchangeable under "the recipes are the same", so this is the test the
    seeds alone allow; with 2 against 2 there are 6 splits and p >= 1/6."""
    pooled, observed = [*a, *b], sum(a) / len(a) - sum(b) / len(b)
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    hits = 0
    for pick in splits:
        mine = [pooled[i] for i in pick]
        rest = [pooled[i] for i in range(len(pooled)) if i not in pick]
        hits += sum(mine) / len(mine) - sum(rest) / len(rest) >= observed - 1e-12
    return hits / len(splits)


def bootstrap_interval(diffs: list[float], resamples: int, seed: int) -> tuple[float, float]:
    """2.5th and 97.5th percentiles of the mean of ``diffs`` resampled with replacement."""
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * (resamples - 1))], means[int(0.975 * (resamples - 1))]


def paired(rows_a: list[dict], rows_b: list[dict], resamples: int = 2000, seed: int = 0) -> list[dict]:
    """One row per decoder both folders ran: mean taus, mean difference A - B, its interval, wins."""

    def prompts(rows):
        return [(r["piece"], r["prompt"], r["prompt_tokens"]) for r in rows]

    if prompts(rows_a) != prompts(rows_b):  # other pieces, or other prompts (their lengths differ)
        raise ValueError("the two folders decoded different prompts (or cut them into other pieces)")
    out = []
    for suffix, label in DECODERS.items():
        key = f"tau{suffix}"
        if key not in rows_a[0] or key not in rows_b[0]:
            continue
        diffs = [a[key] - b[key] for a, b in zip(rows_a, rows_b, strict=True)]
        low, high = bootstrap_interval(diffs, resamples, seed)
        n = len(diffs)
        out.append(
            {
                "decoder": label,
                "prompts": n,
                "tau_a": sum(a[key] for a in rows_a) / n,
                "tau_b": sum(b[key] for b in rows_b) / n,
                "diff": sum(diffs) / n,
                "low": low,
                "high": high,
                "a_wins": sum(d > 0 for d in diffs),
                "ties": sum(d == 0 for d in diffs),
                "b_wins": sum(d < 0 for d in diffs),
            }
        )
    if not out:
        raise ValueError("the two folders share no decoder")
    return out


def speed_against(rows: list[dict], baseline: str = "_prompt_lookup", resamples: int = 2000, seed: int = 0):
    """Per decoder of one run: pooled tokens/s over the ``baseline`` decoder's on the same prompts, its
    95% bootstrap interval over prompts, and the prompts where it was faster (higher tokens/s)."""
    if f"seconds{baseline}" not in rows[0]:
        raise ValueError(f"the folder has no {DECODERS.get(baseline, baseline)} rows to compare with")

    def ratio(sample: list[dict], suffix: str) -> float:
        ours = sum(r[f"new_tokens{suffix}"] for r in sample) / sum(r[f"seconds{suffix}"] for r in sample)
        base = sum(r[f"new_tokens{baseline}"] for r in sample) / sum(r[f"seconds{baseline}"] for r in sample)
        return ours / base

    rng, n, out = random.Random(seed), len(rows), []
    draws = [[rows[rng.randrange(n)] for _ in range(n)] for _ in range(resamples)]
    for suffix, label in DECODERS.items():
        if suffix == baseline or f"seconds{suffix}" not in rows[0]:
            continue
        ratios = sorted(ratio(d, suffix) for d in draws)
        faster = sum(r[f"tokens_per_s{suffix}"] > r[f"tokens_per_s{baseline}"] for r in rows)
        out.append(
            {
                "decoder": label,
                "prompts": n,
                "ratio": ratio(rows, suffix),
                "low": ratios[int(0.025 * (resamples - 1))],
                "high": ratios[int(0.975 * (resamples - 1))],
                "faster_on": faster,
            }
        )
    return out


def recipe_table(rows: list[dict], metrics: tuple[str, ...] = METRICS) -> list[dict]:
    """Per recipe: the mean over seeds and the spread (max - min) of every metric, and the permutation
    p of its DDTree-32 tau against v6's seeds (None for v6 itself, or without v6 rows)."""
    tree = "val/tau_ddtree_b32"
    baseline = [r[tree] for r in rows if r["recipe"] == "v6" and r[tree] is not None]
    out = []
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        mine = [r for r in rows if r["recipe"] == recipe]
        row = {"recipe": recipe, "seeds": len(mine)}
        for key in metrics:
            values = [r[key] for r in mine if r[key] is not None]
            row[key] = sum(values) / len(values) if values else None
            row[f"{key} spread"] = max(values) - min(values) if values else None
        values = [r[tree] for r in mine if r[tree] is not None]
        row["p_vs_v6"] = permutation_p(values, baseline) if recipe != "v6" and values and baseline else None
        out.append(row)
    return sorted(out, key=lambda r: -(r[tree] or 0))


def table_summary(table: list[dict], steps: int, records: int, seeds: list[int]) -> dict:
    """The results line's summary: the best recipe, its DDTree-32 margin over v6 and what the seeds can
    say of it (the permutation p; ``separated_from_v6`` only at p <= 0.05)."""
    summary = {
        "steps": steps,
        "records": records,
        "seeds": seeds,
        "best": table[0]["recipe"] if table else None,
    }
    v6 = next((r for r in table if r["recipe"] == "v6"), None)
    best = table[0] if table else None
    if v6 and best and best is not v6 and best["val/tau_ddtree_b32"] is not None:
        summary.update(
            best_minus_v6_ddtree_tau=best["val/tau_ddtree_b32"] - v6["val/tau_ddtree_b32"],
            best_vs_v6_seed_p=best["p_vs_v6"],
            separated_from_v6=best["p_vs_v6"] is not None and best["p_vs_v6"] <= 0.05,
        )
    return summary
