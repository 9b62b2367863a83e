"""What a draft vocabulary costs in acceptance: held-out coverage and held-out tau for a few V_d.

The same drafter is trained once per V_d at equal steps and seed: the ablation's v6 recipe
(configs/ablation/base.yaml + v6.yaml: 2 layers, K 8, 32 anchors, CE, the first steps x 8 records of
the reference corpus) from the offline cache experiments/ablation.py builds, over the V_d most frequent
labels of ``make reference``'s stage-4 counts, or the whole 49,152-token vocabulary (size 0). V_d =
8,192 is exactly the ablation's v6 run (same flags): the two share it, its cache and its kept row.
Coverage is the share of the held-out labels (stdlib answers the run validates on) inside the V_d;
a label outside it is never drafted, so validation counts it as a miss. What the head costs per V_d
is benchmarks/round_profile.py's (a ratio to a greedy step).

Resumable like the ablation: outputs under --out (runs/ablation), finished rows kept in
results/ablation/steps<N> (committed).

    python experiments/draft_vocab.py [--steps 400] [--sizes 2048 8192 0] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spec_drafters.studies.recipes import (
    CONFIGS,
    build_cache,
    configs,
    keep_folder,
    kept,
    records_flags,
    train,
    vocab_flags,
)
from spec_drafters.studies.results import CHECKOUT as ROOT
from spec_drafters.studies.results import recorder

RESULTS = Path(__file__).parent / "results"
record = recorder(RESULTS)

METRICS = ("val/tau", "val/tau_ddtree_b32", "val/acc_slot1", "val/calibration_ece")


def held_out_coverage(base: Path, extra: list[str], counts: Path, sizes: list[int]) -> dict[int, float]:
    """Share of the validation labels inside each size's draft vocabulary (1.0 for the whole one)."""
    from spec_drafters.cli.setup_args import load_setup
    from spec_drafters.data.records import collate
    from spec_drafters.model.vocab import FrequentTokens, count_labels, coverage

    with contextlib.chdir(ROOT):  # the configs' paths are the repository root's, as for the fits
        module, data = load_setup([*configs("v6", base), *extra], quiet=True, with_data=True)
        _, val = data.examples(module.tokenizer)
    held_out = count_labels(collate([ex]) for ex in val)
    vocab = module.target.vocab_size
    return {
        size: coverage(FrequentTokens(str(counts), size).token_ids(vocab) if size else None, held_out)
        for size in sizes
    }


def name(size: int) -> str:
    return "v6" if size == 8192 else f"v6-vd{size or 'full'}"  # 8,192: the ablation's own v6 run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument(
        "--sizes", type=int, nargs="+", default=[2048, 8192, 0], help="V_d; 0: the whole vocabulary"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base", type=Path, default=CONFIGS / "base.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "ablation")
    ap.add_argument("--keep", type=Path, help="finished runs' rows (default: the ablation's)")
    ap.add_argument("--counts", type=Path, default=ROOT / "runs" / "reference" / "token_counts.json")
    ap.add_argument("--workers", type=int, default=2, help="fits running at once")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each fit")
    args = ap.parse_args()
    if not args.counts.is_file():
        sys.exit(f"no label counts at {args.counts}: run `make reference-data` first (or pass --counts)")
    shipped = args.base.resolve() == (CONFIGS / "base.yaml").resolve()
    keep = keep_folder(args.keep, shipped, args.steps, args.out)
    records = records_flags(args.base, args.steps)
    extra = {size: [*vocab_flags(args.counts, size or None), *records] for size in args.sizes}
    todo = [
        s for s in args.sizes if kept(keep, "v6", args.seed, args.base, extra[s], args.steps, name(s)) is None
    ]
    cache = build_cache("v6", args.base, args.out, extra[todo[0]]) if todo else Path()

    def one(size: int) -> dict:
        return train(
            "v6",
            args.seed,
            args.base,
            args.out,
            args.steps,
            cache,
            extra[size],
            args.threads,
            keep,
            name(size),
        )

    with ThreadPoolExecutor(args.workers) as pool:
        fits = dict(zip(args.sizes, pool.map(one, args.sizes), strict=True))
    shares = held_out_coverage(args.base, records, args.counts, args.sizes)
    rows = [
        {"V_d": size or "full", "coverage": shares[size], **{k: fits[size].get(k) for k in METRICS}}
        for size in args.sizes
    ]
    print(f"{'V_d':>6} {'coverage':>9} {'chain tau':>10} {'DDTree-32':>10} {'slot 1':>7} {'ECE':>7}")
    for r in rows:
        cells = " ".join(f"{r[k]:>10.4f}" if r[k] is not None else f"{'-':>10}" for k in METRICS)
        print(f"{r['V_d']:>6} {r['coverage']:>9.4f} {cells}")
    summary = {"steps": args.steps, "seed": args.seed, "recipe": "v6"}
    if shipped:
        record("draft_vocab", rows, summary)
    else:  # a smoke run on another base is not a result
        print(f"not appended to experiments/results: --base {args.base} is not configs/ablation/base.yaml")


if __name__ == "__main__":
    main()
