"""``cost-model``: what a speculative round costs on this machine, stored for the adaptive verifier.

spec-drafters cost-model --config CONFIG [--ckpt_path CKPT] --out costs.json [--tokens 1 2 4 ...]
"""

from __future__ import annotations

import argparse
import json

from spec_drafters.cli.checks import out_file
from spec_drafters.cli.setup_args import load_setup
from spec_drafters.errors import InputError


def cost_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="spec-drafters cost-model",
        description="Time a greedy step, the target's verify forward over trees of each size, and one "
        "drafter pass, on this machine; write them in greedy steps for --model.verifier AdaptiveDDTree "
        "(init_args.cost_model). Other arguments (--config, --ckpt_path, --model.*) are LightningCLI's.",
        allow_abbrev=False,
    )
    ap.add_argument("--out", required=True, help="the cost file (JSON)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--context", type=int, default=200, help="tokens of context before the round")
    ap.add_argument("--repeats", type=int, default=5, help="median of this many timings each")
    return ap


def cost_model(argv: list[str]) -> None:
    from spec_drafters.data.prompts import HumanEvalPrompts
    from spec_drafters.decode.generate import greedy_generate
    from spec_drafters.decode.timing import measure

    ap = cost_parser()
    args, rest = ap.parse_known_args(argv)
    _check_args(args)
    setup = load_setup(rest)
    limit = setup.target.context_length
    if limit is not None and args.context + args.tokens[-1] > limit:  # before any timing
        raise InputError(
            f"--context {args.context}: with the largest tree of --tokens ({args.tokens[-1]}) that is "
            f"{args.context + args.tokens[-1]} positions, more than the target's context of {limit}"
        )
    prompt = setup.tokenizer.encode(HumanEvalPrompts(1).prompts()[0])[: args.context]
    more = args.context - len(prompt)  # the target's own continuation fills the rest of the context
    context = prompt + (greedy_generate(setup.target, prompt, more, []).tokens if more > 0 else [])
    cost = measure(
        setup.target, setup.drafter, setup.fc_ids, context[: args.context], args.tokens, args.repeats
    )
    cost.machine["target"] = setup.card.name
    cost.save(args.out)
    print(f"{'tokens':>7} {'verify (greedy steps)':>22}")
    for t, v in zip(cost.tokens, cost.verify, strict=True):
        print(f"{t:>7} {v:>22.3f}")
    print(f"drafter pass: {cost.draft:.3f} greedy steps; written to {args.out}")
    verify = dict(zip(cost.tokens, cost.verify, strict=True))
    print(json.dumps({"out": args.out, "draft": cost.draft, "verify": verify}))


def _check_args(args: argparse.Namespace) -> None:
    """The flags that need no model, checked before it is loaded: a cost file measured at some other
    context than the one asked for (a negative one once cut the prompt instead) would look valid."""
    if sorted(set(args.tokens)) != args.tokens or args.tokens[0] != 1:
        raise InputError(f"--tokens must be ascending from 1, got {args.tokens}")
    if args.context < 1:
        raise InputError(f"--context must be >= 1 token, got {args.context}")
    if args.repeats < 1:
        raise InputError(f"--repeats must be >= 1 (the median of that many timings), got {args.repeats}")
    out_file(args.out)
