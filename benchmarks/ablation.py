"""Which recipe wins at equal compute: the seeds' v3, v5, v6 and experiment-ddtree, speculators' 2026
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

    python benchmarks/ablation.py [--steps 400] [--seeds 0 1] [--only v6 tree_coverage] \
        [--out runs/ablation] [--workers 2 --threads 1]
    python benchmarks/ablation.py --report [--record]  # the table so far, from the kept rows alone
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from common import RESULTS, git_sha, record

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs" / "ablation"
RECIPES = ["v3", "v5", "v6", "experiment_ddtree", "speculators_2026", "dspark", "lk_mix", "lk_hybrid"]
RECIPES += ["tree_coverage", "dpace"]
METRICS = ("val/tau", "val/tau_ddtree_b32", "val/calibration_ece", "val/acc_slot1")


def spec_drafters(*args: str, threads: int | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    subprocess.run([sys.executable, "-m", "spec_drafters.cli.main", *args], check=True, cwd=ROOT, env=env)


def cache_key(recipe: str) -> str:
    """Recipes with the same taps and label source share a cache."""
    model = yaml.safe_load((CONFIGS / f"{recipe}.yaml").read_text())["model"]
    chosen = {k: model.get(k) for k in ("injection", "target_source")}
    return hashlib.sha1(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:10]


def configs(recipe: str, base: Path) -> list[str]:
    return ["--config", str(base), "--config", str(CONFIGS / f"{recipe}.yaml")]


def build_cache(recipe: str, base: Path, out: Path, extra: list[str]) -> Path:
    folder = out / f"cache-{cache_key(recipe)}"
    if not (folder / "done").is_file():  # an interrupted build resumes shard by shard
        soft = ["--model.loss", "SoftKL"]  # so that the label hidden state is stored too
        args = ["cache", *configs(recipe, base), *extra, *soft, "--out", str(folder), "--dtype", "bfloat16"]
        with ThreadPoolExecutor(2) as pool:  # two builders sharing the folder, one from each end
            list(pool.map(lambda more: spec_drafters(*args, *more, threads=1), [[], ["--reverse"]]))
        (folder / "done").write_text("")
    return folder


def config_hash(recipe: str, base: Path, extra: list[str]) -> str:
    """What a kept row was trained with: the base, the recipe's overlay and the extra flags (a flag that
    names a file, such as the token counts, by the file's contents: checkouts differ in paths)."""
    flags = [hashlib.sha1(Path(f).read_bytes()).hexdigest() if Path(f).is_file() else f for f in extra]
    text = base.read_text() + (CONFIGS / f"{recipe}.yaml").read_text() + json.dumps(flags)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def kept(keep: Path, recipe: str, seed: int, base: Path, extra: list[str], name: str = "") -> dict | None:
    path = keep / f"{name or recipe}-s{seed}.json"
    if not path.is_file():
        return None
    row = json.loads(path.read_text())
    if row.get("config_sha1") != config_hash(recipe, base, extra):
        raise SystemExit(
            f"{path} was trained with other configs or flags than now: move it away to re-run it"
        )
    return row


def train(
    recipe: str, seed: int, base: Path, out: Path, steps: int, cache: Path, extra: list[str],
    threads: int | None = None, keep: Path | None = None, name: str = "",
) -> dict:  # fmt: skip
    """One fit of ``recipe`` (its run folder and kept row named ``name``, the recipe by default)."""
    if keep is not None and (row := kept(keep, recipe, seed, base, extra, name)) is not None:
        return row
    run = out / f"{name or recipe}-s{seed}"
    result = run / "fit.json"
    if not result.is_file():
        last = run / "checkpoints" / "last.ckpt"
        resumed = last.is_file()
        t0 = time.perf_counter()
        trainer = {  # this run's own folders (JSON is YAML)
            "trainer": {
                "default_root_dir": str(run),
                "max_steps": steps,
                "val_check_interval": steps,
                "logger": [{"class_path": "CSVLogger", "init_args": {"save_dir": str(run), "name": "logs"}}],
                "callbacks": [
                    {
                        "class_path": "ModelCheckpoint",
                        "init_args": {"dirpath": str(run / "checkpoints"), "save_last": True, "save_top_k": 0,
                                      "every_n_train_steps": 50},
                    },
                    {"class_path": "TrainingThroughput"},
                ],
            }
        }  # fmt: skip
        run.mkdir(parents=True, exist_ok=True)
        (run / "trainer.yaml").write_text(json.dumps(trainer))
        spec_drafters(
            "fit", *configs(recipe, base), "--config", str(run / "trainer.yaml"), *extra,
            "--seed_everything", str(seed), "--model.seed", str(seed), "--data.cache", str(cache),
            "--results", str(result), *(["--ckpt_path", str(last)] if resumed else []),
            threads=threads,
        )  # fmt: skip
        # the last process's wall time: a resumed fit's earlier processes are not in it
        (run / "seconds").write_text(f"{time.perf_counter() - t0:.1f} {'resumed' if resumed else ''}\n")
    metrics = json.loads(result.read_text())["metrics"]
    seconds = (run / "seconds").read_text().split() if (run / "seconds").is_file() else [None]
    row = {"recipe": recipe, "seed": seed, "fit_s": seconds[0] and float(seconds[0])}
    row.update(fit_resumed="resumed" in seconds, **{k: metrics.get(k) for k in METRICS})
    if keep is not None:
        meta = {"steps": steps, "git_sha": git_sha(), "config_sha1": config_hash(recipe, base, extra)}
        (keep / f"{name or recipe}-s{seed}.json").write_text(json.dumps({**row, **meta}) + "\n")
    return row


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


def summarize(rows: list[dict]) -> list[dict]:
    """Per recipe: the mean over seeds and the spread (max - min) of every metric, and the permutation
    p of its DDTree-32 tau against v6's seeds (None for v6 itself, or without v6 rows)."""
    tree = "val/tau_ddtree_b32"
    baseline = [r[tree] for r in rows if r["recipe"] == "v6" and r[tree] is not None]
    out = []
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        mine = [r for r in rows if r["recipe"] == recipe]
        row = {"recipe": recipe, "seeds": len(mine)}
        for key in METRICS:
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


def print_table(table: list[dict]) -> None:
    head = f"{'recipe':<18} {'seeds':>5} {'chain tau':>15} {'DDTree-32 tau':>15} {'ECE':>13} {'slot 1':>13}"
    print(f"{head} {'p vs v6':>8}")
    for r in table:
        cells = " ".join(
            f"{r[k]:>7.4f} ±{r[f'{k} spread']:<6.4f}" if r[k] is not None else f"{'-':>15}" for k in METRICS
        )
        p = f"{r['p_vs_v6']:>8.3f}" if r.get("p_vs_v6") is not None else f"{'-':>8}"
        print(f"{r['recipe']:<18} {r['seeds']:>5} {cells} {p}")
    print(
        "p vs v6: one-sided exact permutation test of DDTree-32 tau over seeds (>= 1/6 with 2 seeds a side)"
    )


def vocab_flags(counts: Path, size: int | None) -> list[str]:
    """A draft vocabulary of the ``size`` most frequent labels in ``counts``; None: the whole vocabulary."""
    if size is None:
        return ["--model.draft_vocab", "FullVocab"]
    flags = ["--model.draft_vocab", "FrequentTokens", "--model.draft_vocab.counts", str(counts)]
    return [*flags, "--model.draft_vocab.size", str(size)]


def train_records(base: Path, steps: int) -> int:
    """One epoch: ``steps x batch`` records, the same first ones for every run."""
    return steps * yaml.safe_load(base.read_text())["data"]["batch_size"]


def records_flags(base: Path, steps: int) -> list[str]:
    """The flag for train_records (a later --data.max_train_records among the extra flags wins)."""
    return ["--data.max_train_records", str(train_records(base, steps))]


def keep_folder(keep: Path | None, shipped: bool, steps: int, out: Path) -> Path:
    """Where finished runs' rows are kept: results/ablation/steps<N> for the shipped base (committed), a
    smoke run's beside its outputs."""
    folder = keep or (RESULTS / "ablation" / f"steps{steps}" if shipped else out / "kept")
    out.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--only", nargs="+", choices=RECIPES, help="run these recipes only")
    ap.add_argument("--base", type=Path, default=CONFIGS / "base.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "ablation")
    ap.add_argument("--keep", type=Path, help="finished runs' rows (default: see the docstring)")
    ap.add_argument(
        "--counts",
        type=Path,
        default=ROOT / "runs" / "reference" / "token_counts.json",
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
    vocab = vocab_flags(args.counts, 8192) if args.counts.is_file() else []
    args.extra = [*vocab, *records_flags(args.base, args.steps), *args.extra]
    shipped = args.base.resolve() == (CONFIGS / "base.yaml").resolve()
    keep = keep_folder(args.keep, shipped, args.steps, args.out)
    recipes = args.only or RECIPES
    runs = [(recipe, seed) for recipe in recipes for seed in args.seeds]
    done = {run: kept(keep, *run, args.base, args.extra) for run in runs}
    records = train_records(args.base, args.steps)
    if args.report:  # nothing trains: what the kept rows say so far (recorded only when whole)
        table = summarize([row for row in done.values() if row is not None])
        print_table(table)
        missing = [f"{recipe}-s{seed}" for (recipe, seed), row in done.items() if row is None]
        print(f"kept in {keep}; not run yet: {' '.join(missing) or 'none'}")
        if args.record and not missing and shipped and set(recipes) == set(RECIPES):
            rows = list(done.values())
            record("ablation", rows, {**table_summary(table, args.steps, records, args.seeds), "table": table,
                                      "from_kept_rows": True})  # fmt: skip
        elif args.record:
            sys.exit("not recorded: --record needs every recipe and seed kept, on the shipped base")
        return
    todo = {recipe for (recipe, _), row in done.items() if row is None}
    caches = {
        recipe: build_cache(recipe, args.base, args.out, args.extra) for recipe in recipes if recipe in todo
    }

    def one(run: tuple[str, int]) -> dict | None:
        recipe, seed = run
        cache = caches.get(recipe, Path())  # a kept run needs no cache
        try:
            return train(recipe, seed, args.base, args.out, args.steps, cache, args.extra, args.threads, keep)
        except subprocess.CalledProcessError as e:  # the other runs go on (pool.map would cancel them)
            print(f"{recipe}-s{seed} failed (exit {e.returncode}); its log is above", file=sys.stderr)
            return None

    with ThreadPoolExecutor(args.workers) as pool:
        rows = list(pool.map(one, runs))
    failed = [f"{recipe}-s{seed}" for (recipe, seed), row in zip(runs, rows, strict=True) if row is None]
    if failed:  # the finished runs are kept; a table without these would read as the whole answer
        print_table(summarize([row for row in rows if row is not None]))
        sys.exit(f"failed: {' '.join(failed)}; the others are kept in {keep}: fix and run again")
    table = summarize(rows)
    print_table(table)
    summary = table_summary(table, args.steps, records, args.seeds)
    if not shipped:  # a smoke run on another base (a tiny target) is not a result
        print(f"not appended to benchmarks/results: --base {args.base} is not configs/ablation/base.yaml")
    elif args.only and set(recipes) != set(RECIPES):  # a partial table would read as the whole answer
        print(
            f"not appended to benchmarks/results: --only runs part of the table; its rows are kept in {keep}"
        )
    else:
        record("ablation", rows, {**summary, "table": table})


if __name__ == "__main__":
    main()
