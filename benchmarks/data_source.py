"""Which training text buys a better drafter per CPU-hour: the target's own answers, or real source?

Arm ``answers``: stdlib docstring prompts answered by the target (the shipped corpus's train split by
default); its data cost is the generation (measured here on a sample of the same prompts, in this
run) plus the feature cache. Arm ``source``: the standard library's real source in windows, labels
from the target's argmax at every position (no generation); it gets as many source tokens as the
answers arm's whole data cost buys at the measured cache speed, so both arms spend the same CPU on
data. Both train the same drafter for the same steps from a bf16 cache with their own draft
vocabulary (counted from their own labels) and are validated on the same held-out answers (what the
target says on unseen prompts, the decoding situation).

Every stage is resumable (run again, it continues): outputs go to ``--out`` (default runs/data_source).

    python benchmarks/data_source.py [--steps 600] [--out runs/data_source]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

from common import record

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "reference_smollm2.yaml"


def spec_drafters(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "spec_drafters.cli.main", *args], check=True, cwd=ROOT)


def read(path: Path) -> list[dict]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write(path: Path, records: list[dict]) -> None:
    """Deterministic bytes (no time stamp in the gzip header): the cache checks the file's sha256."""
    with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in records).encode())


def stage(out: Path, name: str, fn) -> dict:
    """Runs ``fn`` once; its result (with its wall time) is kept in ``out/name.json``."""
    done = out / f"{name}.json"
    if done.is_file():
        return json.loads(done.read_text())
    t0 = time.perf_counter()
    result = fn() or {}
    result["seconds"] = time.perf_counter() - t0
    done.write_text(json.dumps(result) + "\n")
    return result


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


def trainer_config(root: Path, steps: int) -> dict:
    """This arm's own folders and budget over the reference config's trainer."""
    checkpoints = {"dirpath": str(root / "checkpoints"), "save_last": True, "save_top_k": 0}
    return {
        "trainer": {
            "max_steps": steps,
            "val_check_interval": steps,
            "default_root_dir": str(root),
            "logger": False,
            "callbacks": [
                {"class_path": "ModelCheckpoint", "init_args": {**checkpoints, "every_n_train_steps": 50}},
                {"class_path": "TrainingThroughput"},  # train/tokens_per_s in fit.json
            ],
        }
    }


METRICS = ("val/tau", "val/tau_pooled", "val/acc_slot1", "val/acc", "val/loss", "train/tokens_per_s")


def arm(out: Path, name: str, train: Path, val: Path, steps: int, common: list[str]) -> dict:
    root = out / name
    data = ["--data.path", str(train), "--data.val_path", str(val)]
    full = [*common, *data, "--model.draft_vocab", "FullVocab"]
    cache = stage(
        out,
        f"{name}.cache",
        lambda: spec_drafters("cache", *full, "--out", str(root / "cache"), "--dtype", "bfloat16"),
    )
    counts = root / "token_counts.json"
    stage(
        out,
        f"{name}.counts",
        lambda: spec_drafters(
            "draft-vocab", *full, "--data.cache", str(root / "cache"), "--out", str(counts)
        ),
    )
    last = root / "checkpoints" / "last.ckpt"
    (root / "trainer.yaml").write_text(json.dumps(trainer_config(root, steps)))  # JSON is YAML
    run = [*common, "--config", str(root / "trainer.yaml"), *data]
    run += ["--model.draft_vocab.counts", str(counts), "--data.cache", str(root / "cache")]
    resume = ["--ckpt_path", str(last)] if last.is_file() else []
    fit = stage(
        out,
        f"{name}.fit",
        lambda: spec_drafters("fit", *run, *resume, "--results", str(root / "fit.json")),
    )
    metrics = json.loads((root / "fit.json").read_text())["metrics"]
    return {"cache_s": cache["seconds"], "fit_s": fit["seconds"], **{k: metrics.get(k) for k in METRICS}}


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
    ap.add_argument("--answers", type=Path, default=ROOT / "data" / "stdlib_smollm2.jsonl.gz")
    ap.add_argument("--source", type=Path, default=ROOT / "runs" / "reference" / "source" / "corpus.jsonl.gz")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "data_source")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--sample", type=int, default=32, help="prompts answered to time generation")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if not args.source.is_file():
        spec_drafters("reference-corpus", "--kind", "source", "--out", str(args.source.parent))
    records = read(args.answers)
    train = [r for r in records if r["split"] == "train"]
    write(out / "val.jsonl.gz", [r for r in records if r["split"] == "val"])
    write(out / "answers.jsonl.gz", train)
    gen = stage(out, "generation", lambda: generation_speed(train, args.sample))
    from spec_drafters.target.loaders import EmbeddedSmolLM2

    tok = EmbeddedSmolLM2().load().tokenizer  # one tokenizer for every count below
    sizes = stage(out, "sizes", lambda: {"answers_tokens": count_tokens(train, tok)})
    common = ["--config", str(CONFIG)]
    a = arm(out, "answers", out / "answers.jsonl.gz", out / "val.jsonl.gz", args.steps, common)
    # Equal data CPU: the answers' generation + cache time buys this many source tokens at the
    # answers' cache speed (one target forward per token either way).
    answer_tokens = sizes["answers_tokens"]
    gen_s = gen["s_per_token"] * answer_tokens_generated(train, tok)
    budget_tokens = int(answer_tokens * (gen_s + a["cache_s"]) / a["cache_s"])
    chosen, total = source_windows(args.source, budget_tokens, tok)
    if not (out / "source.jsonl.gz").is_file():
        write(out / "source.jsonl.gz", chosen)
    b = arm(out, "source", out / "source.jsonl.gz", out / "val.jsonl.gz", args.steps, common)
    rows = [
        {
            "arm": "answers",
            "records": len(train),
            "tokens": answer_tokens,
            "data_cpu_s": gen_s + a["cache_s"],
            **a,
        },
        {"arm": "source", "records": len(chosen), "tokens": total, "data_cpu_s": b["cache_s"], **b},
    ]
    report(rows, args.steps, gen)


def answer_tokens_generated(train: list[dict], tok) -> int:
    """Tokens the target generated for the answers arm (its responses, one end-of-text token each)."""
    return sum(len(tok.encode(r["response"])) + 1 for r in train)


if __name__ == "__main__":
    main()
