"""Real decoding on HumanEval: plain greedy, the chain, DDTree at B = 8/16/32/64 and prompt lookup, one run.

Runs ``spec-drafters validate`` with ``configs/bench_humaneval.yaml`` over a drafter's config (all 164
prompts x 64 new tokens by default, batch size 1), then prints per decoder: tau as the mean of
per-prompt means and pooled, tokens/s, speedup over plain greedy decoding measured in the same run,
and how many outputs equal plain greedy's token for token. Prompt lookup runs on the same target path
as greedy and the drafters (decode/generate.py ``prompt_lookup_generate``: transformers' candidate
rule, our forward, cache and counting); its rows say ``prompt_lookup_impl: fast_path``, and the
results line says which prompt lookup its rows timed (``transformers``: rows from before issue 30,
timed through transformers' ``generate`` on stock kernels).

The prompts run in ``--parts`` pieces, each its own process writing its per-prompt rows
(``<out>/<name>/part-XX-of-PP.jsonl``, by default under ``benchmarks/results/humaneval_decoding/``,
committed; with another ``--out`` the results line goes to ``<out>/humaneval_decoding.jsonl``, not
to the committed ``benchmarks/results/``). The folder is a set of kept stages (the studies' one resume
scheme, spec_drafters/studies/stages.py): a finished piece is kept as ``part-XX-of-PP.json``; run the
same command again, on this machine or a fresh clone, and only the pieces not kept run (a single
process over all 164 prompts takes hours on 2 CPU cores, more than one session here).
``<out>/<name>/identity.json`` holds the sha256 of the drafter the pieces measured (the folder's
weights or the checkpoint) and the command's decoding settings; a rerun with another drafter or other
settings under the same name is refused rather than merged (spec_drafters/studies/decoding_runs.py).
``--workers 2`` runs two pieces at a time, one thread each: every prompt's speedup is its own decoders
against its own greedy run, timed back to back in one process, so the summary compares like with
like. With ``--cost_model`` the adaptive-budget DDTree (``adaptive_ddtree``, max budget 64) decodes
too; with ``--chain_depth D ...`` chains that verify only their first D drafts (``GreedyChain(max_depth=D)``).

    python benchmarks/humaneval_decoding.py --config configs/quickstart.yaml \\
        --ckpt_path runs/quickstart/checkpoints/last.ckpt [--num_prompts 164] [--name demo]
    python benchmarks/humaneval_decoding.py --config configs/reference_smollm2.yaml \\
        --config configs/reference_eval.yaml --name reference --workers 2 --cost_model runs/cost.json

Arguments it does not know (``--model.*``, ``--data.*``) are passed on to ``spec-drafters validate``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import RESULTS, record
from spec_drafters.studies.decoding_runs import (
    merged_rows,
    open_folder,
    overlay,
    prompt_lookup_impl,
    run_pieces,
    summaries,
)

OUT = RESULTS / "humaneval_decoding"  # the committed pieces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, action="append", help="the drafter's config (repeatable)")
    ap.add_argument("--ckpt_path", help="a Lightning checkpoint of that config")
    ap.add_argument("--init_from", help="or a drafter folder (e.g. registry/drafters/...)")
    ap.add_argument("--num_prompts", type=int, default=164)
    ap.add_argument("--parts", type=int, default=8, help="pieces the prompts run in (resumable)")
    ap.add_argument("--workers", type=int, default=1, help="pieces running at a time")
    ap.add_argument("--cost_model", help="a spec-drafters cost-model JSON: adds the adaptive DDTree")
    ap.add_argument("--chain_depth", type=int, nargs="+", help="adds chains verifying only D drafts")
    ap.add_argument("--budgets", type=int, nargs="+", help="only these of the DDTree budgets 8 16 32 64")
    ap.add_argument(
        "--lookup", action="store_true", help="adds the chain, DDTree B=8 (and adaptive) with context drafts"
    )
    ap.add_argument("--name", default="drafter", help="a label for the results line")
    ap.add_argument("--out", default=str(OUT), help="the pieces' folder; elsewhere, the results line too")
    args, args.extra = ap.parse_known_args()  # the rest (--model.*, --data.*) goes to validate
    folder = Path(args.out) / args.name
    folder.mkdir(parents=True, exist_ok=True)
    stages = open_folder(args, folder)  # refused when the folder holds another drafter's or setting's pieces
    run_pieces(
        args, folder, stages, overlay(folder, args.cost_model, args.chain_depth, args.lookup, args.budgets)
    )
    prompt_rows = merged_rows(folder, args.parts, args.num_prompts)
    rows = summaries(prompt_rows)
    impl = prompt_lookup_impl(prompt_rows)
    prompts = args.num_prompts
    greedy = sum(r["greedy_tokens_per_s"] for r in rows) / len(rows)  # the same greedy runs for all
    print(f"{prompts} HumanEval prompts; plain greedy {greedy:.2f} tokens/s")
    print(f"{'decoder':<15} {'tau':>6} {'pooled':>7} {'tok/s':>7} {'speedup':>8} {'lossless':>9}")
    for r in rows:
        print(
            f"{r['decoder']:<15} {r['tau']:>6.3f} {r['tau_pooled']:>7.3f} {r['tokens_per_s']:>7.2f} "
            f"{r['speedup']:>7.2f}x {r['lossless']:>5}/{prompts}"
        )
    if impl:
        print(f"prompt lookup: {impl}")
    best = max(rows, key=lambda r: r["speedup"])
    record(
        "humaneval_decoding",
        rows,
        {
            "name": args.name,
            "prompts": prompts,
            "parts": args.parts,
            "workers": args.workers,
            "greedy_tokens_per_s": greedy,
            "best": best["decoder"],
            "best_speedup": best["speedup"],
            "prompt_lookup_impl": impl,
        },
        # a check run with --out elsewhere keeps its line there, out of the committed results
        RESULTS if Path(args.out).resolve() == OUT.resolve() else Path(args.out),
    )


if __name__ == "__main__":
    main()
