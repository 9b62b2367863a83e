"""Two drafters on the same HumanEval prompts, prompt by prompt: is the tau difference more than noise?

``humaneval_decoding.py`` gives each drafter a mean tau over 164 prompts; two means 0.05 apart say
nothing until the per-prompt differences are looked at. This script pairs the prompt rows of two of its
result folders (the same prompts, the same decoders) and, per decoder, prints A's and B's mean tau, the
mean of the per-prompt differences (A - B), a 95% percentile-bootstrap interval of that mean (prompts
resampled with replacement) and how many prompts A wins, ties and loses. Tau only: decoding is
deterministic, so the tokens a round commits do not depend on the machine, while the two folders'
times come from different runs (possibly on a loaded machine) and are not compared here.

    python benchmarks/paired_decoding.py benchmarks/results/humaneval_decoding/ablation-speculators_2026-s0 \\
        benchmarks/results/humaneval_decoding/ablation-v6-s0 [--resamples 2000] [--seed 0]

With ``--speed``, each folder's decoders against prompt lookup *within that run* (times from one run
compare like with like: every prompt's decoders ran back to back in one process): per decoder, its
pooled tokens/s over prompt lookup's on the same prompts, a 95% bootstrap interval of that ratio
(prompts resampled), and on how many prompts it was the faster:

    python benchmarks/paired_decoding.py --speed FOLDER [FOLDER ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import record
from spec_drafters.studies.decoding_runs import folder_rows
from spec_drafters.studies.stats import paired, speed_against


def speed_main(folders: list[Path], resamples: int, seed: int) -> None:
    for folder in folders:
        rows = speed_against(folder_rows(folder), resamples=resamples, seed=seed)
        print(f"{folder.name}: tokens/s over prompt lookup's, same run, 95% bootstrap interval over prompts")
        for r in rows:
            interval, faster = f"[{r['low']:.3f}, {r['high']:.3f}]", f"{r['faster_on']}/{r['prompts']}"
            print(f"{r['decoder']:<22}{r['ratio']:>7.3f}{interval:>18}  faster on {faster}")
        record("paired_decoding", rows, {"speed": folder.name, "resamples": resamples, "seed": seed})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="a humaneval_decoding result folder")
    ap.add_argument("b", type=Path, nargs="?", help="another, on the same prompts")
    ap.add_argument("more", type=Path, nargs="*", help="with --speed: more folders")
    ap.add_argument("--speed", action="store_true", help="each folder's decoders against its prompt lookup")
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.speed:
        return speed_main([f for f in (args.a, args.b, *args.more) if f], args.resamples, args.seed)
    if args.b is None or args.more:
        ap.error("give two folders to pair (or --speed and any number of folders)")
    rows = paired(folder_rows(args.a), folder_rows(args.b), args.resamples, args.seed)
    print(f"A = {args.a.name}, B = {args.b.name}; per-prompt tau, A - B with a 95% bootstrap interval")
    print(f"{'decoder':<16}{'tau A':>8}{'tau B':>8}{'A - B':>9}{'95% interval':>20}  A wins/ties/B wins")
    for r in rows:
        interval = f"[{r['low']:+.3f}, {r['high']:+.3f}]"
        wins = f"{r['a_wins']}/{r['ties']}/{r['b_wins']}"
        print(
            f"{r['decoder']:<16}{r['tau_a']:>8.3f}{r['tau_b']:>8.3f}{r['diff']:>+9.3f}{interval:>20}  {wins}"
        )
    record(
        "paired_decoding",
        rows,
        {"a": args.a.name, "b": args.b.name, "resamples": args.resamples, "seed": args.seed},
    )


if __name__ == "__main__":
    main()
