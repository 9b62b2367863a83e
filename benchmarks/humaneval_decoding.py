"""Real decoding on HumanEval: plain greedy, the chain, DDTree at B = 8/16/32/64 and prompt lookup, one run.

Runs ``spec-drafters validate`` with ``configs/bench_humaneval.yaml`` over a drafter's config (all 164
prompts x 64 new tokens by default, batch size 1), then prints per decoder: tau as the mean of
per-prompt means and pooled, tokens/s, speedup over plain greedy decoding measured in the same run,
and how many outputs equal plain greedy's token for token.

    python benchmarks/humaneval_decoding.py --config configs/quickstart.yaml \\
        --ckpt_path runs/quickstart/checkpoints/last.ckpt [--num_prompts 164] [--name demo]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common import record

ROOT = Path(__file__).resolve().parent.parent
DECODERS = {
    "": "chain",
    "_ddtree_b8": "ddtree B=8",
    "_ddtree_b16": "ddtree B=16",
    "_ddtree_b32": "ddtree B=32",
    "_ddtree_b64": "ddtree B=64",
    "_prompt_lookup": "prompt lookup",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the drafter's config")
    ap.add_argument("--ckpt_path", help="a Lightning checkpoint of that config")
    ap.add_argument("--init_from", help="or a drafter folder (e.g. registry/drafters/...)")
    ap.add_argument("--num_prompts", type=int, default=164)
    ap.add_argument("--name", default="drafter", help="a label for the results line")
    ap.add_argument("--out", default=str(ROOT / "runs" / "humaneval_decoding"))
    args = ap.parse_args()
    out = Path(args.out) / f"{args.name}.json"
    cmd = [
        sys.executable,
        "-m",
        "spec_drafters.cli.main",
        "validate",
        "--config",
        args.config,
        "--config",
        str(ROOT / "configs" / "bench_humaneval.yaml"),
        "--trainer.callbacks.prompts.init_args.num_prompts",
        str(args.num_prompts),
        "--results",
        str(out),
    ]
    if args.ckpt_path:
        cmd += ["--ckpt_path", args.ckpt_path]
    if args.init_from:
        cmd += ["--model.init_from", args.init_from]
    subprocess.run(cmd, check=True, cwd=ROOT)
    m = json.loads(out.read_text())["metrics"]
    prompts = int(m["decode/prompts"])
    rows = []
    for suffix, label in DECODERS.items():
        if f"decode/tau{suffix}" not in m:
            continue
        rows.append(
            {
                "decoder": label,
                "tau": m[f"decode/tau{suffix}"],
                "tau_pooled": m.get(f"decode/tau_pooled{suffix}"),
                "tokens_per_s": m[f"decode/tokens_per_s{suffix}"],
                "speedup": m[f"decode/speedup{suffix}"],
                "lossless": round(m[f"decode/lossless{suffix}"] * prompts),
            }
        )
    greedy = m["decode/greedy_tokens_per_s"]
    print(f"{prompts} HumanEval prompts; plain greedy {greedy:.2f} tokens/s")
    print(f"{'decoder':<14} {'tau':>6} {'pooled':>7} {'tok/s':>7} {'speedup':>8} {'lossless':>9}")
    for r in rows:
        pooled = f"{r['tau_pooled']:>7.3f}" if r["tau_pooled"] is not None else f"{'-':>7}"
        print(
            f"{r['decoder']:<14} {r['tau']:>6.3f} {pooled} {r['tokens_per_s']:>7.2f} {r['speedup']:>7.2f}x "
            f"{r['lossless']:>5}/{prompts}"
        )
    best = max(rows, key=lambda r: r["speedup"])
    record(
        "humaneval_decoding",
        rows,
        {
            "name": args.name,
            "prompts": prompts,
            "greedy_tokens_per_s": greedy,
            "best": best["decoder"],
            "best_speedup": best["speedup"],
        },
    )


if __name__ == "__main__":
    main()
