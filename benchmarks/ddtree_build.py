"""Time to build one DDTree on this CPU, per node budget B, from a drafter block's logits.

The drafter's per-slot logits for one block (K-1 = 15 slots over SmolLM2's 49152-token vocabulary)
go through log-softmax and top-min(B, V) per slot, then the best-first heap construction. Reported
separately: the top-k step (tensor work) and the heap (Python). Run: ``python benchmarks/ddtree_build.py``.
"""

from __future__ import annotations

import argparse

import torch

from common import record, timed
from spec_drafters.decode.verifiers import DDTree, build_tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=int, nargs="*", default=[32, 256, 1024])
    ap.add_argument("--slots", type=int, default=15)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    logits = torch.randn((args.slots, args.vocab), generator=g) * 3
    rows = []
    print(f"{'B':>6} {'total ms':>9} {'top-k ms':>9} {'heap ms':>9} {'nodes':>6} {'max depth':>9}")
    for budget in args.budgets:
        verifier = DDTree(budget)
        top = torch.log_softmax(logits, -1).topk(min(budget, args.vocab), dim=-1)
        total = timed(lambda v=verifier: v.tree(logits), args.repeats)
        topk = timed(
            lambda b=budget: torch.log_softmax(logits, -1).topk(min(b, args.vocab), dim=-1), args.repeats
        )
        heap = timed(lambda b=budget, t=top: build_tree(t.values, t.indices, b), args.repeats)
        tree = verifier.tree(logits)
        row = {
            "budget": budget,
            "total_ms": round(total * 1e3, 3),
            "topk_ms": round(topk * 1e3, 3),
            "heap_ms": round(heap * 1e3, 3),
            "nodes": len(tree.tokens),
            "max_depth": max(tree.depths),
        }
        rows.append(row)
        print(
            f"{budget:>6} {row['total_ms']:>9.2f} {row['topk_ms']:>9.2f} {row['heap_ms']:>9.2f} "
            f"{row['nodes']:>6} {row['max_depth']:>9}"
        )
    record("ddtree_build", rows, {"ms_per_tree": {r["budget"]: r["total_ms"] for r in rows}})


if __name__ == "__main__":
    main()
