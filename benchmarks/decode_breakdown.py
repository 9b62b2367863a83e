"""Where a real speculative decode's time goes, with a trained drafter folder, against plain greedy.

round_profile.py times each part of a round in isolation at a fixed context; this script decodes
real HumanEval prompts end to end (``generate.greedy_generate`` and ``speculative_generate``, with the
prepacked linears they use by default, packed once before the first decode) and adds up, per
verifier, the wall time spent in the drafter's pass (``draft_logits``), the drafter's context
update (``ContextCache.append``), the verifier's proposal, the acceptance walk and the KV-cache
bookkeeping. Everything else in the decode is the target's verify forward (and the prefill both
decoders share). Every ratio is to the greedy step of the same run (greedy seconds / greedy tokens);
the decodes of each prompt run back to back, and the outputs are checked against greedy's.

    PYTHONPATH=src python benchmarks/decode_breakdown.py [--drafter registry/drafters/smollm2-reference] \\
        [--prompts 6] [--threads 1] [--verifiers chain chain:3 ddtree:8 adaptive:runs/cost_model.json]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from common import folder_drafter, record
from spec_drafters.data.prompts import HumanEvalPrompts
from spec_drafters.decode import generate
from spec_drafters.decode.verifiers import AdaptiveDDTree, DDTree, GreedyChain, Verifier
from spec_drafters.model.drafter import ContextCache
from spec_drafters.model.kernels import packed_linears
from spec_drafters.target.loaders import EmbeddedSmolLM2

PARTS = {  # label -> (owner, attribute) of the functions timed inside a speculative decode
    "drafter_pass": (generate, "draft_logits"),
    "context_update": (ContextCache, "append"),
    "accept_walk": (generate, "accept_path"),
    "cache_keep": (generate, "keep_cache"),
}


@contextlib.contextmanager
def timing(spent: dict[str, float], verifier):
    """Wraps the parts (and the verifier's propose) so their wall time adds up in ``spent``."""
    parts = [*PARTS.items(), ("propose", (verifier, "propose"))]
    originals = [(label, owner, name, getattr(owner, name)) for label, (owner, name) in parts]

    def timed(label, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

        return wrapper

    try:
        for label, owner, name, fn in originals:
            setattr(owner, name, timed(label, fn))
        yield
    finally:
        for _, owner, name, fn in originals:
            if owner is verifier:
                delattr(owner, name)  # back to the class's method
            else:
                setattr(owner, name, fn)


def verifier(spec: str) -> Verifier:
    """``chain``, ``chain:D`` (at most D drafts a round), ``ddtree:B`` or ``adaptive:COST_MODEL.json``."""
    kind, _, arg = spec.partition(":")
    if kind == "chain":
        return GreedyChain(int(arg) if arg else None)
    if kind == "ddtree" and arg:
        return DDTree(budget=int(arg))
    if kind == "adaptive" and arg:
        return AdaptiveDDTree(cost_model=arg)
    raise argparse.ArgumentTypeError(f"{spec!r}: not chain, chain:D, ddtree:B or adaptive:COST_MODEL.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="registry/drafters/smollm2-reference", help="a drafter folder")
    ap.add_argument("--prompts", type=int, default=6, help="HumanEval prompts (evenly spaced over 164)")
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument(
        "--verifiers", type=verifier, nargs="+", default=[GreedyChain(), DDTree(budget=8)],
        help="chain, chain:D, ddtree:B, adaptive:COST_MODEL.json (spec-drafters cost-model)",
    )  # fmt: skip
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = EmbeddedSmolLM2().load()
    target, drafter, fc_ids = folder_drafter(args.drafter, loaded.model)
    eos = loaded.card.eos_token_ids
    prompts = [loaded.tokenizer.encode(t) for t in HumanEvalPrompts(num_prompts=args.prompts).prompts()]
    rows = []
    with torch.no_grad(), packed_linears(target, drafter):  # pack once, before any decode
        for chosen in args.verifiers:
            spent: dict[str, float] = {}
            greedy_s = spec_s = 0.0
            tokens = rounds = committed = lossless = 0
            for prompt in prompts:
                plain = generate.greedy_generate(target, prompt, args.max_new_tokens, eos)
                with timing(spent, chosen):
                    spec = generate.speculative_generate(
                        target, drafter, fc_ids, chosen, prompt, args.max_new_tokens, eos
                    )
                greedy_s, spec_s = greedy_s + plain.seconds, spec_s + spec.seconds
                tokens, rounds, committed = (
                    tokens + len(plain.tokens),
                    rounds + spec.rounds,
                    committed + spec.committed,
                )
                lossless += spec.tokens == plain.tokens
            step = greedy_s / tokens
            row = {
                "verifier": chosen.label(),
                "tau_pooled": committed / rounds,
                "speedup": greedy_s / spec_s,
                "round_steps": spec_s / rounds / step,
                **{f"{k}_steps": v / rounds / step for k, v in sorted(spent.items())},
                "lossless": f"{lossless}/{len(prompts)}",
            }
            row["rest_steps"] = row["round_steps"] - sum(v / rounds / step for v in spent.values())
            rows.append(row)
    keys = [k for k in rows[0] if k not in ("verifier", "lossless")]
    print(
        f"{len(prompts)} HumanEval prompts x {args.max_new_tokens} tokens, {args.threads} thread(s); "
        "ratios to a greedy step"
    )
    w = [max(12, len(r["verifier"])) + 2 for r in rows]
    print(f"{'':>22}" + "".join(f"{r['verifier']:>{n}}" for r, n in zip(rows, w, strict=True)))
    for k in keys:
        print(f"{k:>22}" + "".join(f"{r[k]:>{n}.3f}" for r, n in zip(rows, w, strict=True)))
    print(f"{'lossless':>22}" + "".join(f"{r['lossless']:>{n}}" for r, n in zip(rows, w, strict=True)))
    summary = {"drafter": args.drafter, "prompts": len(prompts)}
    record(
        "decode_breakdown", rows, {**summary, "round_steps": {r["verifier"]: r["round_steps"] for r in rows}}
    )


if __name__ == "__main__":
    main()
