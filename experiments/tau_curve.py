"""Held-out tau against training tokens seen, from a run's validations (the reference run by default).

Reads every ``metrics.csv`` under the run folder (a resumed stage writes a new logger version; a step
validated twice keeps its last value), and the offline cache's index for the mean tokens per training
record. A validation logged at step s (0-based) follows s + 1 optimizer steps, so the tokens seen are
(s + 1) x batch size x that mean (ThroughputMonitor's counts restart with every resumed process, so
they cannot give it). ``--validated`` adds validations rerun from the run's checkpoints by
``spec-drafters validate --ckpt_path ... --results FILE`` (for example the last one, when a stage was
stopped during its final validation): each counts after its checkpoint's ``global_step`` steps.
Prints the table, writes the figure, appends the rows to results/tau_curve.jsonl and ends with one
JSON line.

    python experiments/tau_curve.py [--run runs/reference] [--cache runs/reference/cache] [--batch_size 8] \\
        [--validated runs/reference/last_val.json]
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from spec_drafters.studies.curves import chained, rerun_validations, tokens_per_record
from spec_drafters.studies.results import recorder

RESULTS = Path(__file__).parent / "results"
record = recorder(RESULTS)
ROOT = Path(__file__).resolve().parent.parent


def plot(rows: list[dict], keys: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in keys:
        ax.plot([r["tokens_seen"] / 1e6 for r in rows], [r[key] for r in rows], marker="o", label=key)
    for before, after in itertools.pairwise(rows):
        if after["stage"] != before["stage"]:  # a new stage: a new learning-rate schedule from here
            ax.axvline(before["tokens_seen"] / 1e6, color="grey", linestyle="--", linewidth=1)
            ax.text(before["tokens_seen"] / 1e6, ax.get_ylim()[0], f" stage {after['stage']}", color="grey")
    ax.set_xlabel("training tokens seen (millions)")
    ax.set_ylabel("held-out teacher-forced tau")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--run", type=Path, action="append", help="a stage's run folder; again for the next stage"
    )
    ap.add_argument("--cache", type=Path, default=ROOT / "runs" / "reference" / "cache")
    ap.add_argument("--batch_size", type=int, default=8, help="the run's --data.batch_size")
    ap.add_argument("--out", type=Path, default=RESULTS / "tau_curve.png")
    ap.add_argument(
        "--validated",
        type=Path,
        action="append",
        default=[],
        help="a validate --results JSON of a run checkpoint",
    )
    args = ap.parse_args()
    runs = args.run or [ROOT / "runs" / "reference"]
    per_record = tokens_per_record(args.cache)
    validated = chained(runs, rerun_validations(args.validated))
    keys = sorted({k for v in validated for k in v if k.startswith("val/tau") and "pooled" not in k})
    rows = [
        {"stage": v["stage"], "stage_step": v["stage_step"], "step": v["step"],
         "tokens_seen": v["step"] * args.batch_size * per_record, **{k: v.get(k) for k in keys}}
        for v in validated
    ]  # fmt: skip
    print(f"{'stage':>5} {'step':>7} {'tokens':>10} " + " ".join(f"{k:>18}" for k in keys))
    for r in rows:
        cells = " ".join(f"{r[k]:>18.4f}" if r[k] is not None else f"{'-':>18}" for k in keys)
        print(f"{r['stage']:>5} {r['step']:>7} {r['tokens_seen']:>10.0f} {cells}")
    plot([r for r in rows if all(r[k] is not None for k in keys)], keys, args.out)
    print(f"figure: {args.out}")
    record(
        "tau_curve",
        rows,
        {"run": [str(r) for r in runs], "tokens_per_record": per_record, "figure": str(args.out)},
    )


if __name__ == "__main__":
    main()
