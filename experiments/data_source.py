"""Which training text buys a better drafter per CPU-hour: the target's own answers, or real source?

Arm ``answers``: stdlib docstring prompts answered by the target (the shipped corpus's train split by
default); its data cost is the generation (measured here on a sample of the same prompts, in this
run) plus the feature cache. Arm ``source``: the standard library's real source in windows, labels
from the target's argmax at every position (no generation); it gets as many source tokens as the
answers arm's whole data cost buys at the measured cache speed, so both arms spend the same CPU on
data. Both train the same drafter for the same steps from a bf16 cache with their own draft
vocabulary (counted from their own labels) and are validated on the same held-out answers (what the
target says on unseen prompts, the decoding situation).

The two fits run at once, one thread each, so both train under the same load. Every stage is
resumable (run again, it continues): the bulky outputs (caches, checkpoints) go to ``--out`` (default
runs/data_source, git-ignored); each finished stage's result (its measured seconds, a fit's metrics)
is also kept in ``--keep`` (default results/data_source/steps<N>, committed), so a checkout that has
lost ``--out`` keeps what was measured and rebuilds only what a stage still to run needs.

    python experiments/data_source.py [--steps 600] [--out runs/data_source] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spec_drafters.data.parts import write_part
from spec_drafters.data.records import iter_jsonl
from spec_drafters.studies.results import recorder
from spec_drafters.studies.runner import fit_flags, run_cli
from spec_drafters.studies.stages import Stages

RESULTS = Path(__file__).parent / "results"
record = recorder(RESULTS)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "reference_smollm2.yaml"
ANSWERS = ROOT / "data" / "stdlib_smollm2.jsonl.gz"


def read(path: Path) -> list[dict]:
    return [rec for _, rec in iter_jsonl(path, flag="--answers/--source")]


# Deterministic bytes (no time stamp in the gzip header; the cache checks the file's sha256), atomically.
write = write_part


def stage(keep: Path, name: str, fn) -> dict:
    """``fn()``'s result kept as a stage in ``keep`` (studies/stages.py), with its wall time."""
    stages = Stages(keep)
    stages.upgrade_flat()  # stages kept before the stage scheme
    entry = stages.run(name, fn)
    return {**entry["result"], "seconds": entry["seconds"]}


def generation_speed(records: list[dict], n: int) -> dict:
    """Seconds per generated token when the target answers ``n`` of these prompts (batch 16)."""
    import torch

    from spec_drafters.data.corpus import answer_batch
    from spec_drafters.target.loaders import EmbeddedSmolLM2

    target = EmbeddedSmolLM2().load()
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, n, 16):
        for rec in answer_batch(records[i : i + 16], target, max_new_tokens=128):
            tokens += len(target.tokenizer.encode(rec["response"])) + 1
    return {
        "tokens": tokens,
        "s_per_token": (time.perf_counter() - t0) / tokens,
        "threads": torch.get_num_threads(),
    }


def count_tokens(records: list[dict], tok) -> int:
    return sum(len(tok.encode(r.get("text") or r["prompt"] + r["response"])) for r in records)


METRICS = ("val/tau", "val/tau_pooled", "val/acc_slot1", "val/acc", "val/loss", "train/tokens_per_s")


class Arm:
    """One arm's data stages (cache, draft-vocabulary counts) and its fit, each resumable."""

    def __init__(self, out: Path, keep: Path, name: str, train: Path, val: Path, steps: int, config: Path):
        self.keep, self.name, self.steps, self.root = keep, name, steps, out / name
        self.data = ["--config", str(config), "--data.path", str(train), "--data.val_path", str(val)]
        self.cache, self.counts = self.root / "cache", self.root / "token_counts.json"

    def fitted(self) -> bool:
        return (self.keep / f"{self.name}.fit.json").is_file()

    def prepare(self) -> dict:
        """The bf16 cache (timed the first time: the arm's data cost) and the label counts. Rebuilt when
        lost and the fit is still to run (the build resumes shard by shard; a whole one is a no-op)."""
        full = [*self.data, "--model.draft_vocab", "FullVocab"]

        def build() -> None:
            run_cli("cache", *full, "--out", str(self.cache), "--dtype", "bfloat16")

        def timed_build() -> None:  # the arm's data cost: a whole build, never the rest of one
            shutil.rmtree(self.cache, ignore_errors=True)
            build()

        timed_before = (self.keep / f"{self.name}.cache.json").is_file()
        cache = stage(self.keep, f"{self.name}.cache", timed_build)
        if timed_before and not self.fitted():
            build()
        if not self.fitted() and not self.counts.is_file():
            counts = ["--data.cache", str(self.cache), "--out", str(self.counts)]
            run_cli("draft-vocab", *full, *counts)
        return cache

    def fit(self, threads: int | None) -> dict:
        def run() -> dict:
            args = [
                *self.data,
                *fit_flags(self.root, self.steps, csv_logs=False),
                "--data.cache",
                str(self.cache),
            ]
            args += ["--model.draft_vocab.counts", str(self.counts), "--results", str(self.root / "fit.json")]
            run_cli("fit", *args, threads=threads)
            metrics = json.loads((self.root / "fit.json").read_text())["metrics"]
            return {"threads": threads, "metrics": {k: metrics.get(k) for k in METRICS}}

        return stage(self.keep, f"{self.name}.fit", run)


def row(arm: Arm, cache: dict, fit: dict, **extra) -> dict:
    return {"arm": arm.name, **extra, "cache_s": cache["seconds"], "fit_s": fit["seconds"], **fit["metrics"]}


def source_windows(path: Path, budget_tokens: int, tok) -> tuple[list[dict], int]:
    """Training windows of the source corpus, in order, until they hold ``budget_tokens``."""
    chosen, total = [], 0
    for r in read(path):
        if r["split"] != "train":
            continue
        if total >= budget_tokens:
            break
        chosen.append(r)
        total += len(tok.encode(r["text"]))
    return chosen, total


def report(rows: list[dict], steps: int, gen: dict) -> None:
    print(f"{'arm':<8} {'records':>7} {'tokens':>8} {'data s':>7} {'fit s':>7} {'val/tau':>8} {'slot1':>6}")
    for r in rows:
        print(
            f"{r['arm']:<8} {r['records']:>7} {r['tokens']:>8} {r['data_cpu_s']:>7.0f} {r['fit_s']:>7.0f} "
            f"{r['val/tau']:>8.4f} {r['val/acc_slot1']:>6.3f}"
        )
    summary = {
        "steps": steps,
        "tau_source_over_answers": rows[1]["val/tau"] / rows[0]["val/tau"],
        "generation_s_per_token": gen["s_per_token"],
    }
    record("data_source", rows, summary)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=Path, default=ANSWERS)
    ap.add_argument("--source", type=Path, default=ROOT / "runs" / "reference" / "source" / "corpus.jsonl.gz")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "data_source")
    ap.add_argument("--keep", type=Path, help="finished stages' results (default: see the docstring)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--sample", type=int, default=32, help="prompts answered to time generation")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each of the two fits")
    ap.add_argument("--config", type=Path, default=CONFIG, help="the drafter and trainer both arms use")
    args = ap.parse_args()
    shipped = args.config.resolve() == CONFIG.resolve() and args.answers.resolve() == ANSWERS.resolve()
    # a smoke run (another config or corpus) keeps its stages beside its outputs, never in results/
    out = args.out
    keep = args.keep or (RESULTS / "data_source" / f"steps{args.steps}" if shipped else out)
    out.mkdir(parents=True, exist_ok=True)
    keep.mkdir(parents=True, exist_ok=True)
    if not args.source.is_file():
        run_cli("reference-corpus", "--kind", "source", "--out", str(args.source.parent))
    records = read(args.answers)
    train = [r for r in records if r["split"] == "train"]
    write(out / "val.jsonl.gz", [r for r in records if r["split"] == "val"])
    write(out / "answers.jsonl.gz", train)
    gen = stage(keep, "generation", lambda: generation_speed(train, args.sample))
    from spec_drafters.target.loaders import EmbeddedSmolLM2

    tok = EmbeddedSmolLM2().load().tokenizer  # one tokenizer for every count below
    sizes = stage(keep, "sizes", lambda: {"answers_tokens": count_tokens(train, tok)})
    val = out / "val.jsonl.gz"
    answers = Arm(out, keep, "answers", out / "answers.jsonl.gz", val, args.steps, args.config)
    a_cache = answers.prepare()
    # Equal data CPU: the answers' generation + cache time buys this many source tokens at the
    # answers' cache speed (one target forward per token either way).
    answer_tokens = sizes["answers_tokens"]
    gen_s = gen["s_per_token"] * answer_tokens_generated(train, tok)
    budget_tokens = int(answer_tokens * (gen_s + a_cache["seconds"]) / a_cache["seconds"])
    chosen, total = source_windows(args.source, budget_tokens, tok)
    write(out / "source.jsonl.gz", chosen)  # deterministic bytes: the same file a rerun's cache checks
    source = Arm(out, keep, "source", out / "source.jsonl.gz", val, args.steps, args.config)
    s_cache = source.prepare()
    with ThreadPoolExecutor(2) as pool:  # both fits at once, under the same load
        a_fit, s_fit = pool.map(lambda arm: arm.fit(args.threads), [answers, source])
    a_data = gen_s + a_cache["seconds"]
    rows = [
        row(answers, a_cache, a_fit, records=len(train), tokens=answer_tokens, data_cpu_s=a_data),
        row(source, s_cache, s_fit, records=len(chosen), tokens=total, data_cpu_s=s_cache["seconds"]),
    ]
    if shipped:
        report(rows, args.steps, gen)
    else:  # a smoke run on another config or corpus is not a result
        print(json.dumps(rows))


def answer_tokens_generated(train: list[dict], tok) -> int:
    """Tokens the target generated for the answers arm (its responses, one end-of-text token each)."""
    return sum(len(tok.encode(r["response"])) + 1 for r in train)


if __name__ == "__main__":
    main()
