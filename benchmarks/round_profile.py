"""One speculative round against one plain greedy step on the embedded target, part by part.

Every cost is a ratio to one greedy step as ``greedy_generate`` takes it (the target's forward of one
token with its KV cache, the head, the argmax), measured in the same run, with the alternatives
interleaved and medians taken. Two kernel settings are compared side by side: ``plain`` (stock
``nn.Linear``, MKL) and ``packed`` (oneDNN with prepacked weights, ``generate.packed_linears``, the
default); each ratio is to the greedy step of its own setting, and the ``packed`` column's
``greedy_step_vs_plain`` says how much faster the step itself became.

Rows: the target's forward over T new tokens (head included); the drafter's pass split into its
layers and the head over the K-1 draft slots (argmax; a full softmax for comparison; a simulated
draft vocabulary of V_d rows); the drafter context update; the DDTree build and the verify of its
B-node tree; whole rounds (``generate.speculative_round``, the loop body of ``speculative_generate``;
the greedy step is ``generate.greedy_step``, greedy_generate's), and the Python overhead (round
minus its parts). The drafter is untrained (cost does not depend on its weights) and shaped like
configs/quickstart.yaml's (2 layers, K = 8, 5 taps [1, 8, 14, 20, 27]); ``--ckpt`` takes an exported
drafter folder instead.

Run: ``PYTHONPATH=src python benchmarks/round_profile.py [--threads 1] [--repeats 9]``; parts are timed
each right after a greedy step of the same setting (median of the pairs' ratios: load drift cancels).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time

import torch

from common import folder_drafter, record
from spec_drafters.data.prompts import HumanEvalPrompts
from spec_drafters.decode import generate, rounds
from spec_drafters.decode.verifiers import DDTree, GreedyChain
from spec_drafters.model.drafter import ContextCache, DFlashDrafter, DrafterConfig
from spec_drafters.model.kernels import PackedLinear, packed_linears
from spec_drafters.model.masks import DFlashBlockMask
from spec_drafters.target.frozen import FrozenTarget, crop_cache
from spec_drafters.target.loaders import EmbeddedSmolLM2

TAPS = [1, 8, 14, 20, 27]
SETTINGS = ("plain", "packed")


def build(args):
    loaded = EmbeddedSmolLM2().load()
    if args.ckpt:
        target, drafter, fc_ids = folder_drafter(args.ckpt, loaded.model)
    else:
        target = FrozenTarget(loaded.model, TAPS)
        cfg = DrafterConfig(num_layers=2, block_size=args.block_size, attention="split").resolved(
            loaded.model.config, len(TAPS), loaded.card.mask_token_id, DFlashBlockMask().per_layer(2)
        )
        torch.manual_seed(0)
        drafter, fc_ids = DFlashDrafter(cfg).eval(), TAPS
    # ~200 tokens of context: a HumanEval prompt followed by the target's own greedy continuation.
    prompt = loaded.tokenizer.encode(HumanEvalPrompts(1).prompts()[0])
    more = generate.greedy_generate(target, prompt, max(1, args.context - len(prompt)), eos_ids=[])
    context = (prompt + more.tokens)[: args.context]
    return target, drafter, fc_ids, context


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--budget", type=int, default=32, help="DDTree B")
    ap.add_argument("--ckpt", default=None, help="an exported drafter folder (default: untrained)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with torch.no_grad():
        run(args)


def run(args) -> None:
    target, drafter, fc_ids, ctx = build(args)
    k, c = drafter.config.block_size, len(ctx)
    depth = k - 1
    vocab = target.vocab_size
    cache = rounds.new_cache(target)
    out, features = rounds.prefill(target, ctx, cache, fc_ids)
    context = ContextCache(drafter)
    context.append(features)
    bonus = int(target.head(out.hidden[:, -1]).argmax(-1))
    weight = target.lm_head.weight.detach()
    subsets = {vd: torch.nn.Linear(576, vd, bias=False) for vd in (4096, 8192, 16384)}
    for vd, lin in subsets.items():
        lin.weight.data = weight[:vd].clone()  # a frozen slice of the head (a draft vocabulary)
    packed_subsets = {vd: PackedLinear(lin) for vd, lin in subsets.items()}
    ddtree = DDTree(args.budget)

    def fwd(tokens, **kw):
        o = target(torch.tensor([tokens]), cache=cache, use_cache=True, **kw)
        r = target.head(o.hidden).argmax(-1)[0].tolist()
        crop_cache(cache, c)
        return o, r

    def greedy_step():  # greedy_generate's loop body
        generate.greedy_step(target, cache, bonus, c)
        crop_cache(cache, c)

    def round_of(verifier):  # speculative_generate's loop body; only the round itself is timed
        def go():
            saved = (context.kv, context.length)
            t0 = time.perf_counter()
            generate.speculative_round(target, drafter, fc_ids, verifier, cache, context, bonus, c, depth)
            dt = time.perf_counter() - t0
            crop_cache(cache, c)
            context.kv, context.length = saved
            return dt

        return go

    def forward_t(t):
        return lambda: fwd(ctx[:t], position_ids=rounds.positions(c, t, "cpu"))

    def block_embeds():
        block = torch.full((1, k), drafter.config.mask_token_id)
        block[0, 0] = bonus
        return target.embed(block)

    def drafter_layers():
        return drafter(block_embeds(), rounds.positions(c, k, "cpu"), context.kv)

    hidden = drafter_layers()[0, 1:]  # (K-1, H)
    logits = target.head(hidden)
    batch = rounds.VerifyBatch.of(bonus, ddtree.propose(logits))

    def tree_verify():  # the verify forward of speculative_round, as decoding runs it
        target.head(batch.forward(target, cache, c).hidden).argmax(-1)[0].tolist()
        crop_cache(cache, c)

    def context_append():  # one committed position (an untrained drafter's rounds accept nothing)
        saved = (context.kv, context.length)
        o, _ = fwd([bonus], position_ids=rounds.positions(c, 1, "cpu"))
        t0 = time.perf_counter()
        context.append(rounds.tap_features(o, fc_ids, [0]))
        context.kv, context.length = saved
        return time.perf_counter() - t0

    def topk_lse():  # DDTree's top-k without materialising a log-softmax over the vocabulary
        top = logits.float().topk(min(args.budget, vocab), dim=-1)
        return top.values - torch.logsumexp(logits.float(), -1, keepdim=True), top.indices

    parts = {
        "greedy_step": greedy_step,
        **{f"target_forward_T{t}": forward_t(t) for t in (1, 2, 4, 8, 16, 32)},
        f"drafter_layers_K{k}": drafter_layers,
        f"drafter_head_argmax_{depth}x{vocab}": lambda: target.head(hidden).argmax(-1).tolist(),
        f"drafter_head_softmax_{depth}x{vocab}": lambda: (
            torch.softmax(target.head(hidden), -1).argmax(-1).tolist()
        ),
        "greedy_chain_propose": lambda: GreedyChain().propose(logits),
        f"ddtree_build_B{args.budget}": lambda: ddtree.propose(logits),
        f"ddtree_topk_logsoftmax_B{args.budget}": lambda: torch.log_softmax(logits, -1).topk(args.budget, -1),
        f"ddtree_topk_minus_logsumexp_B{args.budget}": topk_lse,
        f"tree_verify_B{args.budget}": tree_verify,
        "context_append_1": context_append,
        "chain_round": round_of(GreedyChain()),
        f"ddtree_round_B{args.budget}": round_of(DDTree(args.budget)),
    }
    for vd in subsets:
        parts[f"drafter_head_argmax_{depth}x{vd}"] = lambda vd=vd: (
            (packed_subsets[vd] if setting == "packed" else subsets[vd])(hidden).argmax(-1).tolist()
        )

    # Paired ratios: every part is timed right after a greedy step of the same setting and reported
    # as the median of (part / that step), so that the machine's load drifting cancels out.
    ratios: dict[tuple[str, str], list[float]] = {}
    steps: dict[str, list[float]] = {s: [] for s in SETTINGS}
    cross: list[float] = []
    setting = "plain"
    order = random.Random(0)
    for rep in range(args.repeats + 1):  # the first repetition warms up (and packs)
        for setting in SETTINGS:
            with packed_linears(target, drafter) if setting == "packed" else contextlib.nullcontext():
                names = list(parts)
                order.shuffle(names)
                for name in names:
                    t0 = time.perf_counter()
                    greedy_step()
                    t1 = time.perf_counter()
                    inner = parts[name]()
                    t2 = time.perf_counter()
                    dt = inner if isinstance(inner, float) else t2 - t1
                    if rep:
                        ratios.setdefault((setting, name), []).append(dt / (t1 - t0))
                        steps[setting].append(t1 - t0)
        for _ in range(4):  # the packed step over the plain one, in adjacent pairs
            pair = []
            for setting in SETTINGS:
                with packed_linears(target, drafter) if setting == "packed" else contextlib.nullcontext():
                    t0 = time.perf_counter()
                    greedy_step()
                    pair.append(time.perf_counter() - t0)
            if rep:
                cross.append(pair[1] / pair[0])

    def median(v):
        return sorted(v)[len(v) // 2]

    med = {key: median(v) for key, v in ratios.items()}
    base = {s: median(steps[s]) for s in SETTINGS}
    packed_vs_plain = median(cross)
    for setting in SETTINGS:
        head = med[(setting, f"drafter_head_argmax_{depth}x{vocab}")]
        med[(setting, "drafter_pass")] = med[(setting, f"drafter_layers_K{k}")] + head
        append = med[(setting, "context_append_1")]
        chain_parts = (
            med[(setting, "drafter_pass")]
            + med[(setting, "greedy_chain_propose")]
            + med[(setting, f"target_forward_T{k}")]
            + append
        )
        tree_parts = (
            med[(setting, "drafter_pass")]
            + med[(setting, f"ddtree_build_B{args.budget}")]
            + med[(setting, f"tree_verify_B{args.budget}")]
            + append
        )
        med[(setting, "chain_round_python_overhead")] = med[(setting, "chain_round")] - chain_parts
        overhead = med[(setting, f"ddtree_round_B{args.budget}")] - tree_parts
        med[(setting, f"ddtree_round_python_overhead_B{args.budget}")] = overhead
    names = sorted(
        {n for _, n in med}, key=lambda n: (n not in parts, list(parts).index(n) if n in parts else 0)
    )
    rows = []
    print(f"threads {torch.get_num_threads()}, context {c}, K {k}, V {vocab}, repeats {args.repeats}")
    print(
        f"greedy step (part-timed medians): plain {base['plain'] * 1e3:.1f} ms, packed "
        f"{base['packed'] * 1e3:.1f} ms; packed step / plain step, paired: {packed_vs_plain:.3f}"
    )
    print(f"{'part (ratio to the same setting' + chr(39) + 's greedy step)':>52} {'plain':>8} {'packed':>8}")
    for name in names:
        row = {"part": name}
        for s in SETTINGS:
            row[f"{s}_ratio"] = round(med[(s, name)], 4)
        rows.append(row)
        print(f"{name:>52} {row['plain_ratio']:>8.3f} {row['packed_ratio']:>8.3f}")
    summary = {
        "benchmark": "round_profile",
        "threads": torch.get_num_threads(),
        "context": c,
        "block_size": k,
        "greedy_step_ms": {s: round(base[s] * 1e3, 2) for s in SETTINGS},
        "packed_greedy_step_vs_plain": round(packed_vs_plain, 4),
        "chain_round_per_greedy_step": {s: round(med[(s, "chain_round")], 3) for s in SETTINGS},
        "ddtree_round_per_greedy_step": {
            s: round(med[(s, f"ddtree_round_B{args.budget}")], 3) for s in SETTINGS
        },
        "chain_round_per_plain_greedy_step": round(med[("packed", "chain_round")] * packed_vs_plain, 3),
        "verify_forward_per_greedy_step": {s: round(med[(s, f"target_forward_T{k}")], 3) for s in SETTINGS},
        "drafter_pass_per_greedy_step": {s: round(med[(s, "drafter_pass")], 3) for s in SETTINGS},
    }
    record("round_profile", rows, summary)


if __name__ == "__main__":
    main()
