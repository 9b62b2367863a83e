"""Which recipe wins at equal compute: the field reports' v3, v5, v6 and experiment-ddtree, speculators' 2026
defaults, DSpark's, the LK losses, the tree-aware objective and D-PACE alone (speculators' defaults
without the window), two seeds each.

Every recipe (configs/ablation/<recipe>.yaml over configs/ablation/base.yaml) trains the same drafter
for the same steps on the same records (the reference corpus, ``make reference`` stage 3) from an
offline feature cache, and is validated on the same held-out stdlib answers: chain tau (val/tau),
DDTree tau at B = 32 (val/tau_ddtree_b32) and the calibration ECE. Recipes that tap the same layers
and read the same labels share one cache (built with the label hidden state, so soft losses can use
it too). Every stage is resumable: run again, it continues (outputs under --out, git-ignored). A
finished run's row (its metrics, the commit, a hash of its two config files) is also kept in --keep
(default results/ablation/steps<N>, committed; a smoke run on another base keeps them under --out),
so a checkout that lost --out re-runs, and rebuilds caches for, only the runs not kept. Only the whole
table (every recipe, the shipped base) is appended to results/ablation.jsonl. The table gives
each recipe's mean over seeds, its spread (max - min) and an exact permutation test over seeds against
v6 (the one-sided p of its DDTree-32 tau being higher by chance): with two seeds a side the smallest p
there is, 1/6, so two seeds rank recipes but cannot separate them; a paired test over prompts
(paired_decoding.py) or more seeds can.

Equal compute, cheaply: every run trains one epoch over the same first ``steps x batch_size``
training records, and the caches hold those records only. Caches are built by two 1-thread
builders from both ends, and ``--workers`` fits run at once with ``--threads`` each (two 1-thread
processes keep 2 cores busier than one 2-thread process here: benchmarks/README.md, "Reference
drafter"); a fit's wall time then depends on its neighbour, so ``fit_s`` is not a speed comparison
(and a resumed fit's ``fit_s`` is its last process's only: ``fit_resumed`` marks those rows).

    python experiments/ablation.py [--steps 400] [--seeds 0 1] [--only v6 tree_coverage] \
        [--out runs/ablation] [--workers 2 --threads 1]
    python experiments/ablation.py --report [--record]  # the table so far, from the kept rows alone
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spec_drafters.studies.recipes import CONFIGS, RECIPES, study
from spec_drafters.studies.results import CHECKOUT, recorder

RESULTS = Path(__file__).parent / "results"
record = recorder(RESULTS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--only", nargs="+", choices=RECIPES, help="run these recipes only")
    ap.add_argument("--base", type=Path, default=CONFIGS / "base.yaml")
    ap.add_argument("--out", type=Path, default=CHECKOUT / "runs" / "ablation")
    ap.add_argument("--keep", type=Path, help="finished runs' rows (default: see the docstring)")
    ap.add_argument(
        "--counts",
        type=Path,
        default=CHECKOUT / "runs" / "reference" / "token_counts.json",
        help="label counts for an 8,192-token draft vocabulary (make reference's); ignored when absent",
    )
    ap.add_argument("--workers", type=int, default=2, help="fits running at once")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each fit")
    ap.add_argument("--report", action="store_true", help="print the kept rows' table; train nothing")
    ap.add_argument(
        "--record", action="store_true", help="with --report and every run kept: append the table's line"
    )
    ap.add_argument("extra", nargs="*", help="more LightningCLI flags for every run (after --)")
    args = ap.parse_args()
    study(args, record)


if __name__ == "__main__":
    main()
