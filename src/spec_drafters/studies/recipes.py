"""The recipe study (experiments/ablation.py, draft_vocab.py): every recipe of configs/ablation trains
the same drafter for the same steps from a shared feature cache, each fit a kept stage (studies/stages.py)
whose identity is a hash of its configs and flags, and the table compares the recipes' held-out metrics
over seeds (studies/stats.py). The scripts in experiments/ parse the command line; the study is here, so
that its tests need no script.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from spec_drafters.studies import runner
from spec_drafters.studies.results import CHECKOUT
from spec_drafters.studies.stages import Stages
from spec_drafters.studies.stats import METRICS, recipe_table, table_summary

CONFIGS = CHECKOUT / "configs" / "ablation"
RESULTS = CHECKOUT / "experiments" / "results"
RECIPES = ["v3", "v5", "v6", "experiment_ddtree", "speculators_2026", "dspark", "lk_mix", "lk_hybrid"]
RECIPES += ["tree_coverage", "dpace"]


def cache_key(recipe: str) -> str:
    """Recipes with the same taps and target source share a cache."""
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
            list(pool.map(lambda more: runner.run_cli(*args, *more, threads=1), [[], ["--reverse"]]))
        (folder / "done").write_text("")
    return folder


def config_hash(recipe: str, base: Path, extra: list[str]) -> str:
    """What a kept row was trained with: the base, the recipe's overlay and the extra flags (a flag that
    names a file, such as the token counts, by the file's contents: checkouts differ in paths)."""
    flags = [hashlib.sha1(Path(f).read_bytes()).hexdigest() if Path(f).is_file() else f for f in extra]
    text = base.read_text() + (CONFIGS / f"{recipe}.yaml").read_text() + json.dumps(flags)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def identity(recipe: str, base: Path, extra: list[str], steps: int) -> dict:
    """What a kept run was trained with (a run kept with another is refused, never mixed in)."""
    return {"config_sha1": config_hash(recipe, base, extra), "steps": steps}


def kept_stages(keep: Path) -> Stages:
    stages = Stages(keep)
    stages.upgrade_flat(("config_sha1", "steps"))  # rows kept before the stage scheme
    return stages


def kept(keep: Path, recipe: str, seed: int, base: Path, extra: list[str], steps: int, name: str = ""):
    """The kept row of ``recipe`` (as ``name``) at ``seed``, or None."""
    entry = kept_stages(keep).kept(f"{name or recipe}-s{seed}", identity(recipe, base, extra, steps))
    return entry and entry["result"]


def train(
    recipe: str, seed: int, base: Path, out: Path, steps: int, cache: Path, extra: list[str],
    threads: int | None = None, keep: Path | None = None, name: str = "",
) -> dict:  # fmt: skip
    """One fit of ``recipe`` (its run folder and kept stage named ``name``, the recipe by default),
    kept in ``keep`` (a kept one is read back, not trained)."""
    fit = lambda: fit_run(recipe, seed, base, out, steps, cache, extra, threads, name)  # noqa: E731
    if keep is None:
        return fit()
    entry = kept_stages(keep).run(f"{name or recipe}-s{seed}", fit, identity(recipe, base, extra, steps))
    return entry["result"]


def fit_run(
    recipe: str, seed: int, base: Path, out: Path, steps: int, cache: Path, extra: list[str],
    threads: int | None, name: str,
) -> dict:  # fmt: skip
    """The fit itself, resumed from its run folder's last checkpoint; its row."""
    run = out / f"{name or recipe}-s{seed}"
    result = run / "fit.json"
    if not result.is_file():
        t0 = time.perf_counter()
        flags = runner.fit_flags(run, steps, csv_logs=True)
        resumed = "--ckpt_path" in flags
        runner.run_cli(
            "fit", *configs(recipe, base), *flags, *extra,
            "--seed_everything", str(seed), "--model.seed", str(seed), "--data.cache", str(cache),
            "--results", str(result), threads=threads,
        )  # fmt: skip
        # the last process's wall time: a resumed fit's earlier processes are not in it
        (run / "seconds").write_text(f"{time.perf_counter() - t0:.1f} {'resumed' if resumed else ''}\n")
    metrics = json.loads(result.read_text())["metrics"]
    seconds = (run / "seconds").read_text().split() if (run / "seconds").is_file() else [None]
    row = {"recipe": recipe, "seed": seed, "fit_s": seconds[0] and float(seconds[0])}
    row.update(fit_resumed="resumed" in seconds, **{k: metrics.get(k) for k in METRICS})
    return row


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


def report(args, done: dict, keep: Path, shipped: bool, recipes: list[str], records: int, record) -> None:
    """The kept rows' table and what is not run yet; recorded (``--record``) only when whole."""
    table = recipe_table([row for row in done.values() if row is not None])
    print_table(table)
    missing = [f"{recipe}-s{seed}" for (recipe, seed), row in done.items() if row is None]
    print(f"kept in {keep}; not run yet: {' '.join(missing) or 'none'}")
    if args.record and not missing and shipped and set(recipes) == set(RECIPES):
        rows = list(done.values())
        record("ablation", rows, {**table_summary(table, args.steps, records, args.seeds), "table": table,
                                  "from_kept_rows": True})  # fmt: skip
    elif args.record:
        sys.exit("not recorded: --record needs every recipe and seed kept, on the shipped base")


def study(args, record: Callable) -> None:
    """The study from its parsed arguments (experiments/ablation.py): ``--report`` prints the kept
    rows' table; otherwise the runs not kept are trained (caches first) and the whole table recorded."""
    vocab = vocab_flags(args.counts, 8192) if args.counts.is_file() else []
    args.extra = [*vocab, *records_flags(args.base, args.steps), *args.extra]
    shipped = args.base.resolve() == (CONFIGS / "base.yaml").resolve()
    keep = keep_folder(args.keep, shipped, args.steps, args.out)
    recipes = args.only or RECIPES
    runs = [(recipe, seed) for recipe in recipes for seed in args.seeds]
    done = {run: kept(keep, *run, args.base, args.extra, args.steps) for run in runs}
    records = train_records(args.base, args.steps)
    if args.report:  # nothing trains: what the kept rows say so far (recorded only when whole)
        return report(args, done, keep, shipped, recipes, records, record)
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
        print_table(recipe_table([row for row in rows if row is not None]))
        sys.exit(f"failed: {' '.join(failed)}; the others are kept in {keep}: fix and run again")
    table = recipe_table(rows)
    print_table(table)
    summary = table_summary(table, args.steps, records, args.seeds)
    if not shipped:  # a smoke run on another base (a tiny target) is not a result
        print(f"not appended to experiments/results: --base {args.base} is not configs/ablation/base.yaml")
    elif args.only and set(recipes) != set(RECIPES):  # a partial table would read as the whole answer
        print(
            f"not appended to experiments/results: --only runs part of the table; its rows are kept in {keep}"
        )
    else:
        record("ablation", rows, {**summary, "table": table})
