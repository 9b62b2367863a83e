"""How much harder HumanEval is than the held-out set, teacher-forced: the same drafter, the same measure.

The reference drafter is selected on held-out stdlib answers (teacher-forced val/tau 2.75) and decodes
HumanEval with a chain tau of 1.93. Two things change between those numbers: the text (HumanEval's
function stubs instead of stdlib docstrings) and the measure (teacher-forced blocks at uniform anchors
instead of real decoding's rounds, 64 new tokens instead of 128). This script holds the measure fixed
and changes only the text: it answers HumanEval's 164 prompts with the target (batched greedy, KV
cache, the corpus's 128 new tokens, as ``make reference`` stage 1 answers stdlib prompts) and validates
the drafter teacher-forced on

- ``stdlib``: the first 164 held-out stdlib answers (the split checkpoints are selected on, held out by
  content: none shares text with a training record, docs/data.md),
- ``humaneval-128``: the target's answers to the 164 HumanEval prompts,
- ``humaneval-64``: the same answers cut at 64 tokens (the decoding benchmark's length; cut by
  re-encoding the answer text, so a token at the cut may differ from the generated one),

reporting chain tau (val/tau), DDTree tau at B = 32 and slot-1 accuracy. HumanEval stays an exam:
nothing is selected or trained on it. The answers are kept in ``--out`` (git-ignored) and reused.

    python experiments/exam_gap.py [--config configs/reference_smollm2.yaml \\
        --config configs/reference_eval.yaml] [--out runs/exam_gap]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

from spec_drafters.studies.results import recorder

RESULTS = Path(__file__).parent / "results"
record = recorder(RESULTS)

ROOT = Path(__file__).resolve().parent.parent
METRICS = ("val/tau", "val/tau_ddtree_b32", "val/acc_slot1")
RECORDS = 164  # HumanEval's size; the stdlib side takes as many held-out answers


def answer_humaneval(path: Path, max_new_tokens: int, batch_size: int) -> None:
    """The target's greedy answers to every HumanEval prompt, all in the validation split."""
    from spec_drafters.data.corpus import answer
    from spec_drafters.data.prompts import HumanEvalPrompts
    from spec_drafters.target.loaders import EmbeddedSmolLM2

    target = EmbeddedSmolLM2().load()
    prompts = HumanEvalPrompts(RECORDS).prompts()
    items = [{"id": f"HumanEval/{i}", "prompt": p, "split": "val"} for i, p in enumerate(prompts)]
    t0, rows = time.time(), []
    for rec in answer(items, target, max_new_tokens, batch_size):
        rows.append(rec)
        if len(rows) % batch_size == 0:
            print(f"answered {len(rows)}/{len(items)} ({time.time() - t0:.0f}s)", flush=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    tmp.rename(path)  # only a complete file is ever reused


def cut(source: Path, path: Path, tokens: int) -> None:
    """The answers in ``source`` cut to their first ``tokens`` tokens (by re-encoding the text)."""
    from spec_drafters.target.loaders import EmbeddedSmolLM2

    tok = EmbeddedSmolLM2().load().tokenizer
    with gzip.open(source, "rt") as fh:
        rows = [json.loads(line) for line in fh]
    for r in rows:
        r["response"] = tok.decode(tok.encode(r["response"])[:tokens])
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def validate(configs: list[str], results: Path, val_path: Path | None) -> dict:
    """Teacher-forced validation of the configs' drafter on ``val_path`` (None: the held-out stdlib)."""
    if not results.is_file():
        data = ["--data.val_path", str(val_path)] if val_path else []
        args = [
            sys.executable, "-m", "spec_drafters.cli.main", "validate", *configs,
            "--trainer.callbacks", "[]", "--trainer.limit_val_batches", "1.0",
            "--trainer.default_root_dir", str(results.parent), "--data.max_train_records", "8",
            "--data.max_val_records", str(RECORDS), *data, "--results", str(results),
        ]  # fmt: skip
        subprocess.run(args, check=True, cwd=ROOT)
    return json.loads(results.read_text())["metrics"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--config",
        action="append",
        help="the drafter's configs (default: the shipped reference drafter's, as make demo validates it)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "exam_gap")
    ap.add_argument("--max_new_tokens", type=int, default=128, help="the stdlib corpus's answer length")
    ap.add_argument("--cut", type=int, default=64, help="the decoding benchmark's length")
    ap.add_argument("--batch_size", type=int, default=16)
    args = ap.parse_args()
    configs_ = args.config or ["configs/reference_smollm2.yaml", "configs/reference_eval.yaml"]
    configs = [flag for c in configs_ for flag in ("--config", str(Path(c).resolve()))]
    args.out.mkdir(parents=True, exist_ok=True)
    full = args.out / f"humaneval-{args.max_new_tokens}.jsonl.gz"
    if not full.is_file():
        answer_humaneval(full, args.max_new_tokens, args.batch_size)
    short = args.out / f"humaneval-{args.cut}.jsonl.gz"
    if not short.is_file():
        cut(full, short, args.cut)
    texts = {"stdlib": None, full.name.split(".")[0]: full, short.name.split(".")[0]: short}
    rows = []
    for name, val_path in texts.items():
        metrics = validate(configs, args.out / name / "results.json", val_path)
        rows.append({"text": name, "records": RECORDS, **{k: metrics.get(k) for k in METRICS}})
    print(f"{'text':<15} {'chain tau':>10} {'DDTree-32':>10} {'slot 1':>7}")
    for r in rows:
        cells = " ".join(f"{r[k]:>10.4f}" if r[k] is not None else f"{'-':>10}" for k in METRICS)
        print(f"{r['text']:<15} {cells}")
    stdlib, exam = rows[0]["val/tau"], rows[1]["val/tau"]
    record("exam_gap", rows, {"configs": configs_, "humaneval_over_stdlib_tau": exam / stdlib})


if __name__ == "__main__":
    main()
